"""The sealing pipeline (issue 16): the store hashes, seals and signs each job event as it
writes it and stores exactly the bytes it hashed; verify hashes those stored bytes and,
with a keyring, holds every event to its writer's signature.

Tampering is done as an attacker with database access would: SQL on the real store's
events table (``RawEvents``), never on objects in memory."""

from __future__ import annotations

import base64
import hashlib
import io
import json
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from jobledger.adapters.clock import FakeClock
from jobledger.adapters.mapper import UnsealedEventError
from jobledger.adapters.signing import Ed25519Signer, Keyring, SigningKey, Window
from jobledger.audit import export as exporting
from jobledger.audit import tamper, verifier
from jobledger.domain import chain
from jobledger.domain.identity import job_uuid
from jobledger.domain.job import Job
from jobledger.engine.engine import Engine
from jobledger.orchestration.ports import Append
from jobledger.projections.outbox import decode_event, encode_event
from tests import test_stored_formats as stored_formats
from tests.support.audit import RawEvents
from tests.support.engines import EngineFactory, store_of
from tests.support.notifiers import Inbox

T = "acme"
SINCE = datetime(2025, 1, 1, tzinfo=UTC)
PREFIX = b'{"chain_hash":"'


@pytest.fixture
def key() -> Ed25519Signer:
    return signer("k-2026-01")


@pytest.fixture
def signed(make_engine: EngineFactory, key: Ed25519Signer) -> Engine:
    """Three jobs run to the end by an engine that signs every event it writes."""
    engine = make_engine(signer=key)
    for job in ("j1", "j2", "j3"):
        engine.submit(T, job, "agent3", input={"n": job, "amount": 1.5})
    engine.run_until_idle()
    return engine


def signer(
    key_id: str, *, not_after: datetime | None = None, private: Ed25519PrivateKey | None = None
) -> Ed25519Signer:
    """A writer's signing key (a real Ed25519 key, made here)."""
    private = private if private is not None else Ed25519PrivateKey.generate()
    return Ed25519Signer([SigningKey(key_id, private, Window(SINCE, not_after))])


def keyring(*signers: Ed25519Signer) -> tamper.Signatures:
    """The published public keys of ``signers``, as verify holds events to them."""
    return tamper.Signatures(Keyring(k for s in signers for k in s.public_keys()))


def body_of(state: bytes) -> tuple[str, bytes]:
    """What any reader of the documented format does: the chain hash and the event's
    bytes as they sit in the row."""
    row = json.loads(state)
    start = state.index(b'"event":') + len(b'"event":')
    end = state.index(b',"signature":') if "signature" in row else len(state) - 1
    return row["chain_hash"], state[start:end]


def test_a_rows_stored_body_is_exactly_the_bytes_hashed(signed: Engine, store_url: str) -> None:
    raw = RawEvents(store_url)
    for job in ("j1", "j2", "j3"):
        uuid = job_uuid(T, job)
        rows, events = raw.rows(uuid), signed.store.events(uuid)
        assert len(rows) == len(events) >= 5
        previous = ""
        for row, event in zip(rows, events, strict=True):
            assert row.state.startswith(PREFIX)
            stored_hash, body = body_of(row.state)
            assert hashlib.sha256(previous.encode() + body).hexdigest() == stored_hash
            assert stored_hash == event.chain_hash
            # The body is the canonical form of the event as the chain defines it.
            assert body == chain.canonical_bytes(
                type(event).__qualname__, chain.event_fields(event)
            )
            assert json.loads(row.state)["signer"] == "k-2026-01"
            previous = stored_hash
        assert store_of(signed).load(uuid).chain_head == previous  # type: ignore[union-attr]


def test_a_signed_store_verifies_and_an_unsigned_one_fails_with_a_keyring(
    signed: Engine, make_engine: EngineFactory, key: Ed25519Signer
) -> None:
    report = tamper.verify_store(store_of(signed), signatures=keyring(key))
    assert report.intact and report.signatures_checked and report.events >= 15
    assert not tamper.verify_store(store_of(signed)).signatures_checked

    unsigned = make_engine()  # the same store, a writer without a key
    unsigned.submit(T, "late", "agent3", input={})
    report = tamper.verify_store(store_of(unsigned), signatures=keyring(key))
    assert [check.label for check in report.broken] == [f"{T}/late"]
    broken = report.broken[0].broken
    assert broken is not None and (broken.version, broken.kind) == (1, "unsigned")
    assert tamper.verify_store(store_of(unsigned)).intact  # the chain itself holds
    # A store that predates signing: unsigned events before the cut-off pass.
    cutoff = FakeClock().now() + timedelta(days=1)
    accepted = tamper.Signatures(Keyring(key.public_keys()), unsigned_before=cutoff)
    assert tamper.verify_store(store_of(unsigned), signatures=accepted).intact


def test_a_tail_rewritten_and_rehashed_without_the_key_fails_verify_with_a_keyring(
    signed: Engine, store_url: str, key: Ed25519Signer
) -> None:
    store, raw, uuid = store_of(signed), RawEvents(store_url), job_uuid(T, "j2")

    def free(event: Job.Event, fields: dict[str, Any]) -> None:
        if isinstance(event, Job.StepRecorded):
            fields["cost_usd"] = Decimal("0")

    raw.rehash_tail(store.events(uuid), 3, free)
    assert tamper.verify_store(store).intact  # no anchor, no keyring: consistent
    report = tamper.verify_store(store, signatures=keyring(key))
    assert [check.label for check in report.broken] == [f"{T}/j2"]
    broken = report.broken[0].broken
    assert broken is not None
    assert (broken.version, broken.kind, broken.reason) == (
        4,
        "unsigned",
        "the event is not signed",
    )

    # Each rewritten event signed again, by a key of the attacker's own, even under the
    # real key's id: the signatures do not hold by the published key.
    mallory = signer("k-2026-01")
    for event in store.events(uuid)[3:]:
        row = raw.rows(uuid)[event.originator_version - 1]
        key_id, signature = mallory.sign(event.chain_hash, event.timestamp)
        tail = f',"signature":"{signature}","signer":"{key_id}"}}'.encode()
        raw.set_state(uuid, row.version, row.topic, row.state.removesuffix(b"}") + tail)
    assert tamper.verify_store(store).intact
    report = tamper.verify_store(store, signatures=keyring(key))
    broken = report.broken[0].broken
    assert broken is not None and (broken.version, broken.kind) == (4, "signature")
    assert broken.reason.startswith("bad signature by key 'k-2026-01'")


def test_a_key_outside_its_window_or_unknown_is_named(signed: Engine, key: Ed25519Signer) -> None:
    store = store_of(signed)
    retired = signer(
        "k-2026-01", not_after=SINCE + timedelta(days=1), private=key.keys[0].private_key
    )
    report = tamper.verify_store(store, signatures=keyring(retired))
    assert len(report.broken) == 3
    broken = report.broken[0].broken
    assert broken is not None and (broken.version, broken.kind) == (1, "signature")
    assert "was not valid at 2026-01-01" in broken.reason
    other = tamper.verify_store(store, signatures=keyring(signer("k-other")))
    first = other.broken[0].broken
    assert first is not None and first.reason == (
        "signed by key 'k-2026-01', which is not in the keyring"
    )


def test_an_edited_body_of_a_signed_row_is_reported_as_edited(
    signed: Engine, store_url: str, key: Ed25519Signer
) -> None:
    RawEvents(store_url).replace_in_state(
        job_uuid(T, "j1"), 3, '"cost_usd":"0.10"', '"cost_usd":"0"'
    )
    for signatures in (None, keyring(key)):
        report = tamper.verify_store(store_of(signed), signatures=signatures)
        broken = report.broken[0].broken
        assert broken is not None and (broken.version, broken.kind) == (3, "edited")


def test_export_and_import_keep_the_bytes_hashes_and_signatures(
    signed: Engine, make_engine: EngineFactory, fresh_store_url: str, store_url: str,
    key: Ed25519Signer, tmp_path: Path,
) -> None:  # fmt: skip
    out = io.StringIO()
    exporting.export_jobs(store_of(signed), out, exporting.Selection(), FakeClock().now())
    text = out.getvalue()
    lines = [json.loads(line) for line in text.splitlines()]
    assert lines[-1]["format"] == "jobledger.export/2"
    assert all(line["signer"] == "k-2026-01" for line in lines[:-1])
    assert all(Keyring(key.public_keys()).check(
        line["signer"], line["signature"], line["chain_hash"],
        datetime.fromisoformat(line["timestamp"]),
    ) is None for line in lines[:-1])  # fmt: skip
    path = tmp_path / "export.jsonl"
    path.write_text(text)
    # The target writes without a key (or with another): nothing is signed again.
    target = make_engine(store_url=fresh_store_url, signer=signer("k-import"))
    exporting.import_file(store_of(target), path)
    source_rows, target_rows = RawEvents(store_url), RawEvents(fresh_store_url)
    for job in ("j1", "j2", "j3"):
        uuid = job_uuid(T, job)
        assert [r.state for r in target_rows.rows(uuid)] == [
            r.state for r in source_rows.rows(uuid)
        ]
    assert tamper.verify_store(store_of(target), signatures=keyring(key)).intact
    again = io.StringIO()
    exporting.export_jobs(store_of(target), again, exporting.Selection(), FakeClock().now())
    assert again.getvalue() == text


def test_an_export_of_the_format_before_imports_as_it_was(
    make_engine: EngineFactory, fresh_store_url: str
) -> None:
    """/1 files (unsigned, written before issue 16) still import, their hashes unchanged."""
    fixture = Path(__file__).parent / "fixtures" / "export-before-key-scopes.jsonl"
    target = make_engine(store_url=fresh_store_url)
    summary = exporting.import_file(store_of(target), fixture)
    assert summary.events == 6
    heads = json.loads(fixture.read_text().splitlines()[-1])["heads"]
    (head,) = heads.values()
    events = target.store.events(job_uuid(head["tenant"], head["job"]))
    assert events[-1].chain_hash == head["chain_hash"]
    assert tamper.verify_store(store_of(target)).intact


def test_group_commit_writes_each_jobs_chain_from_its_own_head(
    make_engine: EngineFactory, key: Ed25519Signer
) -> None:
    engine = make_engine(signer=key)
    for n in range(6):
        engine.submit(T, f"g{n}", "agent3", input={"n": n})
    engine.run_until_idle()  # their steps committed in groups
    store = store_of(engine)
    assert tamper.verify_store(store, signatures=keyring(key)).intact
    # One group whose first append is stale: it is refused, the rest is written with the
    # events it had already sealed, each job's chain from its own head.
    engine.submit(T, "a", "agent3", input={})
    engine.submit(T, "b", "agent3", input={})
    a_stale = store.load(job_uuid(T, "a"))
    a_fresh = store.load(job_uuid(T, "a"))
    b = store.load(job_uuid(T, "b"))
    assert a_stale is not None and a_fresh is not None and b is not None
    now = FakeClock().now()
    a_fresh.raise_budget(raised_by="ops", reason="first", budget=a_fresh.budget.to_dict(), now=now)
    store.append(a_fresh)
    a_stale.raise_budget(raised_by="ops", reason="stale", budget=a_stale.budget.to_dict(), now=now)
    b.raise_budget(raised_by="ops", reason="b", budget=b.budget.to_dict(), now=now)
    results = store.append_many([Append(a_stale), Append(b)])
    assert results[0] is not None and results[1] is None
    report = tamper.verify_store(store, signatures=keyring(key))
    assert report.intact and len(report.jobs) == 8
    assert store.events(job_uuid(T, "b"))[-1].chain_hash == b.chain_head


def test_a_job_event_is_never_written_around_the_pipeline(make_engine: EngineFactory) -> None:
    engine = make_engine()
    engine.submit(T, "j", "agent3", input={})
    store = store_of(engine)
    job = store.load(job_uuid(T, "j"))
    assert job is not None
    job.raise_budget(
        raised_by="ops", reason="r", budget=job.budget.to_dict(), now=FakeClock().now()
    )
    with pytest.raises(UnsealedEventError, match="was not sealed"):
        store.partition(job.id).events.put(list(job.collect_events()))
    assert len(store.events(job.id)) == 1


class ReversibleSealer:
    """A stand-in for part E's sealer (no cryptography: it only has to be visible): the
    job's ``secret`` input is replaced in every stored ``state`` by a sealed object."""

    def seal(self, job: Job, event_type: str, fields: dict[str, Any]) -> dict[str, Any]:
        state = fields.get("state")
        if not isinstance(state, dict) or "secret" not in state:
            return fields
        hidden = base64.urlsafe_b64encode(json.dumps(state["secret"]).encode()).decode()
        sealed = {"$sealed": "test/1", "key": "k", "nonce": "", "ct": hidden}
        return {**fields, "state": {**state, "secret": sealed}}

    def open(self, fields: dict[str, Any]) -> dict[str, Any]:
        state = fields.get("state")
        if not isinstance(state, dict) or not isinstance(state.get("secret"), dict):
            return fields
        plain = json.loads(base64.urlsafe_b64decode(state["secret"]["ct"]))
        return {**fields, "state": {**state, "secret": plain}}


def test_sealed_values_are_stored_hashed_exported_and_published_sealed(
    make_engine: EngineFactory, store_url: str, key: Ed25519Signer
) -> None:
    engine = make_engine(sealer=ReversibleSealer(), signer=key)
    engine.submit(T, "p", "agent3", input={"secret": "Ann Example", "n": 1})
    engine.run_until_idle()
    uuid = job_uuid(T, "p")
    rows = RawEvents(store_url).rows(uuid)
    assert all(b"Ann Example" not in row.state for row in rows)
    assert b'"$sealed":"test/1"' in rows[0].state
    assert engine.job(T, "p").state["secret"] == "Ann Example"  # read back opened
    assert tamper.verify_store(store_of(engine), signatures=keyring(key)).intact
    out = io.StringIO()
    exporting.export_jobs(store_of(engine), out, exporting.Selection(), FakeClock().now())
    assert "Ann Example" not in out.getvalue() and '"$sealed"' in out.getvalue()
    events = engine.store.events(uuid)
    values = [encode_event(event) for event in events]
    assert all(b"Ann Example" not in value for value in values)
    decoded = [decode_event(value) for value in values]
    assert chain.verify(decoded) is None  # the topic's chain holds over the sealed form
    assert json.loads(values[0])["signer"] == "k-2026-01"


def test_a_history_of_rows_in_both_formats_verifies_exports_and_imports(
    store_url: str, fresh_store_url: str, tmp_path: Path
) -> None:
    """A store written before issue 16 goes on being written: its jobs' old rows and new
    rows verify as one chain, and export and import carry both."""
    clock, inbox = FakeClock(), Inbox()
    with stored_formats.open_engine(store_url, clock, inbox) as engine:
        stored_formats.insert(engine, stored_formats.golden(stored_formats.BEFORE_SEALING))
        engine.resume(stored_formats.inbox_token(engine, "waiting"), {})
        engine.decide("t", "gated", "gated:step:3:approval", "reject", "bob", "no")
        for job in ("waiting", "gated"):
            rows = RawEvents(store_url).rows(job_uuid("t", job))
            assert rows[0].state.startswith(b'{"timestamp":') and rows[-1].state.startswith(PREFIX)
        store = store_of(engine)
        assert tamper.verify_store(store).intact
        out = io.StringIO()
        exporting.export_jobs(store, out, exporting.Selection(), clock.now())
        path = tmp_path / "export.jsonl"
        path.write_text(out.getvalue())
        with stored_formats.open_engine(fresh_store_url, FakeClock(), Inbox()) as target:
            exporting.import_file(store_of(target), path)
            assert tamper.verify_store(store_of(target)).intact
            for job in stored_formats.JOBS:
                uuid = job_uuid("t", job)
                before, after = store.events(uuid), target.store.events(uuid)
                assert [e.chain_hash for e in after] == [e.chain_hash for e in before]
                assert [chain.event_fields(e) for e in after] == [
                    chain.event_fields(e) for e in before
                ]
                assert all(
                    r.state.startswith(PREFIX) for r in RawEvents(fresh_store_url).rows(uuid)
                )
        # An old row edited is found as it always was.
        RawEvents(store_url).replace_in_state(
            job_uuid("t", "done"), 1, '"submit_key":"done"', '"submit_key":"evil"'
        )
        broken = tamper.verify_store(store).broken
        assert [(c.job_id, c.broken and c.broken.kind) for c in broken] == [("done", "edited")]


def test_an_append_that_cannot_be_sealed_leaves_the_rest_of_its_group_written(
    make_engine: EngineFactory,
) -> None:
    """A value the canonical form refuses (a lone surrogate: no UTF-8 has it) fails its
    own append, as it would alone, and not the group it was committed with."""
    engine = make_engine()
    for job in ("bad", "good"):
        engine.submit(T, job, "agent3", input={})
    store, now = store_of(engine), FakeClock().now()
    bad, good = (store.load(job_uuid(T, job)) for job in ("bad", "good"))
    assert bad is not None and good is not None
    bad.raise_budget(raised_by="ops", reason="\ud800", budget=bad.budget.to_dict(), now=now)
    good.raise_budget(raised_by="ops", reason="fine", budget=good.budget.to_dict(), now=now)
    results = store.append_many([Append(bad), Append(good)])
    assert isinstance(results[0], UnicodeEncodeError) and results[1] is None
    assert [len(store.events(job_uuid(T, job))) for job in ("bad", "good")] == [1, 2]
    assert tamper.verify_store(store).intact


def test_integers_beyond_64_bits_come_back_whole_from_rows_and_exports(
    make_engine: EngineFactory, key: Ed25519Signer, tmp_path: Path
) -> None:
    """JSON allows any integer and the payload check admits up to 4,300 digits; a fast
    parser that turns one past 64 bits into a float would change the state a job folds
    and make its export fail every verifier but ours."""
    big = {"u64": 2**64 - 1, "past": 2**70, "negative": -(2**100), "long": 10**300}
    engine = make_engine(signer=key)
    engine.submit(T, "big", "agent3", input=dict(big))
    engine.run_until_idle()
    uncached = make_engine()
    state = uncached.job(T, "big").state
    assert {name: state[name] for name in big} == big
    assert all(type(state[name]) is int for name in big)
    out = io.StringIO()
    exporting.export_jobs(store_of(engine), out, exporting.Selection(), FakeClock().now())
    submitted = json.loads(out.getvalue().splitlines()[0])
    assert {name: submitted["data"]["state"][name] for name in big} == big
    path = tmp_path / "export.jsonl"
    path.write_text(out.getvalue())
    keyring_file = tmp_path / "keyring.json"
    keyring_file.write_text(json.dumps(Keyring(key.public_keys()).document()))
    assert verifier.main([str(path), "--keyring", str(keyring_file)]) == 0
