"""Hostile input at the library's doors: definitions, payloads, tokens, store URLs, free
text and broken histories. Each is refused with a one-line error naming what was wrong
(never a traceback, a hang or a leaked secret), and nothing is written.

The CLI's side of the same doors is in tests/test_cli_hostile.py.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any

import jwt
import pytest

from jobledger import ConfigError, Engine, InvalidPayloadError, JobStatus
from jobledger.adapters.clock import FakeClock
from jobledger.adapters.jwt_tokens import JwtResumeTokens
from jobledger.adapters.store_url import parse_store_url
from jobledger.domain.errors import BrokenHistoryError, InvalidTokenError
from jobledger.domain.identity import job_uuid
from jobledger.domain.payloads import MAX_DEPTH, json_object
from jobledger.workflows import DefinitionError, load_definitions, parse_definition
from tests.support.audit import RawEvents
from tests.support.engines import TOKEN_SECRET, EngineFactory, writes
from tests.test_waits_and_gates import approval_workflow

HEAD = (
    "type: bomb\nversion: 1\nstart: s\nsteps:\n  e: {kind: complete}\n  s:\n"
    "    kind: run_interaction_task\n    next: e\n"
)


def alias_bomb(levels: int, fanout: int = 9) -> str:
    """The billion-laughs shape: each level is a list of ``fanout`` aliases of the one
    before, so ``levels`` levels expand to fanout**levels leaves from ~600 bytes."""
    lines = ["    params:", '      l0: &l0 ["lol"]']
    for level in range(1, levels + 1):
        refs = ", ".join([f"*l{level - 1}"] * fanout)
        lines.append(f"      l{level}: &l{level} [{refs}]")
    return HEAD + "\n".join(lines) + "\n"


# ---- definitions ---------------------------------------------------------------------------


def test_a_yaml_alias_bomb_is_refused_without_expanding_it(tmp_path: Any) -> None:
    (tmp_path / "bomb.yaml").write_text(alias_bomb(7))  # 9**7 = 4.8M nodes: 17 s before
    assert len(alias_bomb(7)) < 700

    with pytest.raises(DefinitionError) as raised:
        load_definitions(tmp_path)

    assert raised.value.problems == [
        "bomb.yaml: malformed YAML at line 15, column 11: the document expands to more than "
        "100000 nodes (aliases repeated too often)"
    ]


def test_a_deeper_alias_bomb_is_refused_as_fast(tmp_path: Any) -> None:
    (tmp_path / "bomb.yaml").write_text(alias_bomb(9))  # over a minute before
    with pytest.raises(DefinitionError, match="expands to more than 100000 nodes"):
        load_definitions(tmp_path)


def test_aliases_within_the_limit_still_work() -> None:
    definition = parse_definition(alias_bomb(3), "small.yaml")  # 9**3 = 729 leaves
    assert len(definition.steps["s"].params["l3"]) == 9


@pytest.mark.parametrize("depth", [50_000, 100_000])
def test_a_deeply_nested_yaml_definition_is_refused(depth: int) -> None:
    text = HEAD + "    params: {deep: " + "[" * depth + "]" * depth + "}\n"
    with pytest.raises(DefinitionError, match=f"nested deeper than {MAX_DEPTH} levels"):
        parse_definition(text, "deep.yaml")


@pytest.mark.parametrize("depth", [50_000, 100_000])
def test_a_deeply_nested_json_definition_is_refused(depth: int) -> None:
    text = '{"type": "x", "version": 1, "start": "s", "deep": ' + "[" * depth + "]" * depth + "}"
    with pytest.raises(DefinitionError) as raised:
        parse_definition(text, "deep.json")
    assert raised.value.problems == [
        f"deep.json: malformed JSON: nested deeper than {MAX_DEPTH} levels"
    ]


@pytest.mark.parametrize(
    ("source", "text"),
    [
        ("big.yaml", HEAD + "    params: {n: " + "7" * 5000 + "}\n"),
        ("big.json", '{"type": "x", "version": 1, "n": ' + "7" * 5000 + "}"),
    ],
)
def test_a_5000_digit_integer_in_a_definition_is_refused(source: str, text: str) -> None:
    with pytest.raises(DefinitionError) as raised:
        parse_definition(text, source)
    [message] = raised.value.problems
    assert message.startswith(f"{source}: ")
    assert "an integer of 5000 digits is over the limit of 4300" in message
    assert "set_int_max_str_digits" not in message


def test_an_oversized_definition_file_is_refused(tmp_path: Any) -> None:
    text = HEAD + "# " + "x" * 2_000_000 + "\n"
    (tmp_path / "huge.yaml").write_text(text)
    with pytest.raises(DefinitionError) as raised:
        load_definitions(tmp_path)
    assert raised.value.problems == [
        f"huge.yaml: the file is {len(text)} bytes, over the limit of 1048576"
    ]


# ---- payloads ------------------------------------------------------------------------------


def nested(depth: int) -> dict[str, Any]:
    """{"a": {"a": ... {}}} ``depth`` deep, built without recursion."""
    value: dict[str, Any] = {}
    for _ in range(depth - 1):
        value = {"a": value}
    return value


@pytest.mark.parametrize("depth", [MAX_DEPTH + 1, 100_000])
def test_a_payload_nested_too_deep_is_refused(depth: int) -> None:
    with pytest.raises(InvalidPayloadError) as raised:
        json_object(nested(depth), what="job input", max_bytes=10**9)
    assert str(raised.value) == f"job input is nested deeper than {MAX_DEPTH} levels"


def test_a_payload_at_the_depth_limit_is_accepted() -> None:
    assert json_object(nested(MAX_DEPTH), what="job input", max_bytes=10**9)


def test_a_5000_digit_integer_payload_is_refused() -> None:
    with pytest.raises(InvalidPayloadError) as raised:
        json_object({"n": 7 * 10**4999}, what="job input", max_bytes=10**9)
    assert str(raised.value) == "job input holds an integer of 5000 digits, over the limit of 4300"


@pytest.mark.parametrize(
    "value",
    [{"a": "\ud800"}, {"\udc00": 1}, {"a": ["ok", {"b": "x\udfffy"}]}],
    ids=["value", "key", "nested"],
)
def test_a_lone_surrogate_in_a_payload_is_refused(value: dict[str, Any]) -> None:
    """What JSON's \\ud800 escape decodes to: not text, it cannot be stored as UTF-8 (the
    chain's canonical bytes failed on it: a 500 over HTTP)."""
    with pytest.raises(InvalidPayloadError) as raised:
        json_object(value, what="job input", max_bytes=10**9)
    assert str(raised.value).startswith("job input holds a lone surrogate (U+D")
    assert "not text: a string must be valid Unicode" in str(raised.value)


def test_a_surrogate_pair_is_text_and_accepted() -> None:
    assert json_object({"a": "\U0001f600"}, what="job input", max_bytes=100) == {"a": "\U0001f600"}


LIMIT = {"max_payload_bytes": 1024}
TOO_LONG = "x" * 1025


@pytest.mark.parametrize(
    ("config", "job", "refused", "match"),
    [
        pytest.param(
            {},
            "other",
            lambda engine: engine.submit("t", "j", "agent3", input={"a": "\ud800"}),
            "job input holds a lone surrogate",
            id="a-lone-surrogate-in-input",
        ),
        pytest.param(
            {},
            "other",
            lambda engine: engine.cancel("t", "other", "why\ud800", by="ops"),
            "cancel reason holds a lone surrogate",
            id="a-lone-surrogate-in-free-text",
        ),
        pytest.param(
            {},
            "other",
            lambda engine: engine.submit("t", "deep", "agent3", input=nested(100_000)),
            "nested deeper",
            id="a-deep-input",
        ),
        pytest.param(
            {},
            "other",
            lambda engine: engine.submit("t", "big", "agent3", input={"n": 10**4999}),
            "integer of 5000 digits",
            id="a-huge-input",
        ),
        pytest.param(
            LIMIT,
            "j",
            lambda engine: engine.raise_budget(
                "t", "j", raised_by="ops", reason=TOO_LONG, max_steps=50
            ),
            "budget raise reason is 1025 bytes",
            id="a-budget-raise-reason-over-the-payload-limit",
        ),
        pytest.param(
            LIMIT,
            "j",
            lambda engine: engine.migrate("t", "j", 1, by="ops", reason=TOO_LONG, force=True),
            "migration reason is 1025 bytes",
            id="a-migration-reason-over-the-payload-limit",
        ),
    ],
)
def test_hostile_or_oversized_input_is_refused_and_writes_nothing(
    make_engine: EngineFactory,
    config: dict[str, int],
    job: str,
    refused: Callable[[Engine], object],
    match: str,
) -> None:
    engine = make_engine(config=config)
    engine.submit("t", job, "agent3")
    before = writes(engine)
    with pytest.raises(InvalidPayloadError, match=match):
        refused(engine)
    assert writes(engine) == before


# ---- resume tokens whose claims have the wrong types --------------------------------------


def signed(**changes: Any) -> str:
    claims: dict[str, Any] = {
        "iss": "jobledger",
        "aud": "jobledger.resume",
        "exp": 2_000_000_000,
        "iat": 1_700_000_000,
        "jti": "n1",
        "tid": "t",
        "job": "j",
        "step": 2,
        "evt": "invoice.paid",
        "wfv": 1,
        **changes,
    }
    return jwt.encode(claims, TOKEN_SECRET, algorithm="HS256", headers={"kid": "k1"})


def tokens() -> JwtResumeTokens:
    return JwtResumeTokens(
        secret=TOKEN_SECRET,
        key_id="k1",
        ttl_seconds=60,
        issuer="jobledger",
        audience="jobledger.resume",
    )


@pytest.mark.parametrize(
    ("changes", "says"),
    [
        ({"step": "abc"}, "step: must be an integer"),
        ({"step": 2.5}, "step: must be an integer"),
        ({"step": True}, "step: must be an integer"),
        ({"wfv": "1"}, "wfv: must be an integer"),
        ({"exp": "abc"}, "exp: must be an integer"),
        ({"exp": 1e30}, "exp: must be an integer"),
        ({"exp": 10**30}, "exp: must be at most 253402300799"),
        ({"tid": 7}, "tid: must be a string"),
        ({"evt": ["x"]}, "evt: must be a string"),
        ({"job": {"a": 1}}, "job: must be a string"),
    ],
)
def test_a_signed_token_whose_claims_have_the_wrong_types_is_invalid(
    changes: dict[str, Any], says: str
) -> None:
    with pytest.raises(InvalidTokenError) as raised:
        tokens().verify(signed(**changes), now=FakeClock().now())
    assert str(raised.value).startswith("resume token claims are invalid: ")
    assert says in str(raised.value)


def test_a_genuine_token_still_verifies() -> None:
    claims = tokens().verify(signed(), now=FakeClock().now())
    assert (claims.tenant_id, claims.job_id, claims.step_number) == ("t", "j", 2)


def test_a_token_with_a_deeply_nested_header_is_invalid() -> None:
    # 1400 deep is past the JSON parser's recursion limit, and still a short token.
    header = jwt.utils.base64url_encode(('{"a":' + "[" * 1400 + "]" * 1400 + "}").encode())
    with pytest.raises(InvalidTokenError, match="resume token is malformed"):
        tokens().verify(header.decode() + ".e30.c2ln", now=FakeClock().now())


def test_an_oversized_token_is_invalid() -> None:
    with pytest.raises(InvalidTokenError, match="resume token is 100000 characters"):
        tokens().verify("x" * 100_000, now=FakeClock().now())


# ---- store URLs ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "says"),
    [
        (
            "postgresql://u:SECRET@db.example:99999/jobs",
            "PostgreSQL URL 'postgresql://u:***@db.example:99999/jobs': port must be a number "
            "from 1 to 65535",
        ),
        (
            "postgresql://u:SECRET@db.example:0/jobs",
            "port must be a number from 1 to 65535",
        ),
        (
            "postgresql://u:SECRET@db.example/jobs?schema=Audit",
            "PostgreSQL URL 'postgresql://u:***@db.example/jobs?schema=Audit': schema 'Audit' is "
            "not allowed: use a lower-case identifier (a letter or _, then letters, digits or _; "
            "at most 63 characters)",
        ),
        ("postgresql://u@h/jobs?schema=a-b", "schema 'a-b' is not allowed"),
        ("postgresql://u@h/jobs?schema=1a", "schema '1a' is not allowed"),
        ("postgresql://u@h/jobs?schema=" + "a" * 64, "is not allowed"),
        ("postgresql://u@h/jobs?schema=", "schema '' is not allowed"),
        ("postgresql://u@h/jobs?pool_size=many", "pool_size must be a whole number"),
        ("postgresql://u@h/jobs?connect_timeout=soon", "connect_timeout must be a whole number"),
        (
            "postgresql://u:SECRET@/jobs",
            "PostgreSQL URL 'postgresql://u:***@/jobs' needs a host and a database name",
        ),
    ],
)
def test_a_bad_postgres_url_is_a_config_error_that_hides_the_password(url: str, says: str) -> None:
    with pytest.raises(ConfigError) as raised:
        parse_store_url(url)
    assert says in str(raised.value)
    assert "SECRET" not in str(raised.value)


def test_a_lower_case_schema_of_63_characters_is_allowed() -> None:
    location = parse_store_url("postgresql://u@h/jobs?schema=" + "a_1" * 21)
    assert location.env["POSTGRES_SCHEMA"] == "a_1" * 21


# ---- free text over the payload limit ------------------------------------------------------


def test_a_cancel_reason_over_the_payload_limit_is_refused(make_engine: EngineFactory) -> None:
    engine = make_engine(config=LIMIT)
    engine.submit("t", "j", "agent3")
    before = writes(engine)
    with pytest.raises(InvalidPayloadError) as raised:
        engine.cancel("t", "j", reason=TOO_LONG, by="ops")
    assert str(raised.value) == "cancel reason is 1025 bytes, over the limit of 1024"
    assert writes(engine) == before
    assert engine.cancel("t", "j", reason="x" * 1024, by="ops").status is JobStatus.CANCELLED


def test_an_approval_comment_over_the_payload_limit_is_refused(make_engine: EngineFactory) -> None:
    engine = make_engine(config=LIMIT, registry=approval_workflow(approvers=["lead"]))
    engine.submit("t", "j", "gate")
    engine.run_until_idle()
    view = engine.job("t", "j")
    assert view.status is JobStatus.AWAITING_APPROVAL and view.pending_approval_id
    before = writes(engine)
    with pytest.raises(InvalidPayloadError, match="approval comment is 1025 bytes"):
        engine.decide("t", "j", view.pending_approval_id, "approve", "lead", TOO_LONG)
    assert writes(engine) == before
    assert engine.job("t", "j").status is JobStatus.AWAITING_APPROVAL


def test_free_text_must_be_text(make_engine: EngineFactory) -> None:
    engine = make_engine()
    engine.submit("t", "j", "agent3")
    with pytest.raises(InvalidPayloadError, match="cancel reason must be a string, got int"):
        engine.cancel("t", "j", reason=7, by="ops")  # type: ignore[arg-type]


# ---- a broken history ----------------------------------------------------------------------


@pytest.fixture
def finished(make_engine: EngineFactory, clock: FakeClock) -> Engine:
    """Two finished agent3 jobs (9 events each), a fresh engine (an empty cache)."""
    engine = make_engine()
    for job in ("gap", "garbled"):
        engine.submit("t", job, "agent3")
    engine.run_until_idle()
    clock.advance(timedelta(seconds=1))
    return engine


READS: list[tuple[str, Callable[[Engine, str], object]]] = [
    ("job", lambda engine, job: engine.job("t", job)),
    ("history", lambda engine, job: engine.history("t", job)),
    ("verify", lambda engine, job: engine.verify("t", job)),
    ("cancel", lambda engine, job: engine.cancel("t", job, reason="r", by="ops")),
    ("replay", lambda engine, job: engine.replay("t", job)),
    ("job_at", lambda engine, job: engine.job_at("t", job, version=9)),
]


@pytest.mark.parametrize(("name", "read"), READS, ids=[name for name, _ in READS])
def test_a_missing_event_is_a_broken_history_not_a_crash(
    finished: Engine,
    make_engine: EngineFactory,
    store_url: str,
    name: str,
    read: Callable[[Engine, str], object],
) -> None:
    assert RawEvents(store_url).delete(job_uuid("t", "gap"), 5) == 1
    engine = make_engine()  # nothing cached: the load reads the store
    with pytest.raises(BrokenHistoryError) as raised:
        read(engine, "gap")
    assert str(raised.value) == "history of t/gap is broken at v5 (run jobledger verify)"
    assert (raised.value.tenant_id, raised.value.job_id, raised.value.version) == ("t", "gap", 5)


@pytest.mark.parametrize(("name", "read"), READS, ids=[name for name, _ in READS])
def test_an_event_edited_past_decoding_is_a_broken_history(
    finished: Engine,
    make_engine: EngineFactory,
    store_url: str,
    name: str,
    read: Callable[[Engine, str], object],
) -> None:
    raw = RawEvents(store_url)
    stored = raw.rows(job_uuid("t", "garbled"))[2]
    raw.set_state(job_uuid("t", "garbled"), 3, stored.topic, b"{not json")
    engine = make_engine()
    with pytest.raises(BrokenHistoryError) as raised:
        read(engine, "garbled")
    assert str(raised.value) == "history of t/garbled is broken at v3 (run jobledger verify)"


def test_a_broken_first_event_is_still_named_as_the_caller_knows_the_job(
    finished: Engine, make_engine: EngineFactory, store_url: str
) -> None:
    raw = RawEvents(store_url)
    uuid = job_uuid("t", "gap")
    raw.set_state(uuid, 1, raw.rows(uuid)[0].topic, b"[1, 2")
    with pytest.raises(BrokenHistoryError) as raised:
        make_engine().job("t", "gap")
    assert str(raised.value) == "history of t/gap is broken at v1 (run jobledger verify)"
