"""Erasure that keeps the chain verifiable, on SQLite and PostgreSQL: a workflow's
``personal_data`` is sealed with the data subject's key in every event that carries it
(never in plaintext in the store's rows or an export), and ``erase`` records ``Erased`` on
each of the subject's jobs, then destroys the key: the values read as ``[erased]``
everywhere, every chain still verifies, the rest of each job is intact, replay names what
it could not read. A crash between the events and the key deletion is finished by a rerun."""

from __future__ import annotations

import io
import sqlite3
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit, urlunsplit
from uuid import UUID

import psycopg
import pytest

from jobledger import Engine, EngineConfig
from jobledger.adapters.subject_keys import ERASURES, KEYS, SubjectKeyTable, job_sha256
from jobledger.audit.export import Selection, export_jobs, import_file
from jobledger.audit.tamper import verify_store
from jobledger.domain.erasure import ERASED
from jobledger.domain.errors import (
    InvalidPayloadError,
    JobErasedError,
    NoPersonalDataError,
    SubjectErasedError,
    SubjectKeyError,
    UnknownJobError,
    UnknownSubjectError,
)
from jobledger.workflows import DefinitionRegistry
from jobledger.workflows.definition import DefinitionError
from jobledger.workflows.loader import parse_definition
from tests.support.engines import TOKEN_SECRET, store_of
from tests.support.erasure import ADA, GRACE, ONBOARDING, PLAINTEXT, Greeter, run_onboarding

PLAIN = """
type: plain
version: 1
start: done
steps:
  done: {kind: complete}
"""


@pytest.fixture
def open_engine(store_url: str) -> Iterator[Any]:
    opened: list[Engine] = []

    def make() -> Engine:
        registry = DefinitionRegistry(
            [parse_definition(ONBOARDING, "onboarding.yaml"), parse_definition(PLAIN, "p.yaml")]
        )
        config = EngineConfig(
            store_url=store_url, token_secret=TOKEN_SECRET, worker_id=f"w{len(opened)}"
        )
        engine = Engine.open(registry=registry, executor=Greeter(), config=config)
        opened.append(engine)
        return engine

    yield make
    for engine in opened:
        engine.close()


def stored_bytes(store_url: str, engine: Engine) -> bytes:
    """Every byte of the store's event rows, as the database holds them."""
    table = store_of(engine).partitions[0].events_table
    with _cursor(store_url) as (curs, schema):
        curs.execute(f"SELECT state FROM {schema}{table}")
        return b"\n".join(bytes(row[0]) for row in curs.fetchall())


def exported(engine: Engine) -> str:
    out = io.StringIO()
    export_jobs(store_of(engine), out, Selection(tenant_id="acme"), datetime.now(UTC))
    return out.getvalue()


def erasure_rows(store_url: str) -> list[tuple[Any, ...]]:
    with _cursor(store_url) as (curs, schema):
        curs.execute(f"SELECT key_id, tenant_id, subject_sha256 FROM {schema}{ERASURES}")
        return list(curs.fetchall())


def key_rows(store_url: str) -> list[tuple[Any, ...]]:
    with _cursor(store_url) as (curs, schema):
        curs.execute(f"SELECT key_id, tenant_id, subject, key_bytes FROM {schema}{KEYS}")
        return list(curs.fetchall())


def test_personal_values_are_sealed_then_erased_and_the_chains_still_verify(
    open_engine: Any, store_url: str
) -> None:
    engine = open_engine()
    run_onboarding(engine, "j1", "ada", ADA)
    run_onboarding(engine, "j2", "ada", ADA)
    run_onboarding(engine, "j3", "grace", GRACE)

    # Before: the engine reads them back, the rows and the export hold ciphertext only.
    job = engine.job("acme", "j1")
    assert job.status == "completed" and job.state["customer"]["email"] == "ada.l@example.org"
    assert job.state["customer"]["name"] == "Ada Lovelace" and job.state["confirmed"] is True
    submitted = engine.history("acme", "j1")[0].data
    assert submitted["state"] == ADA and submitted["personal_data_key"]
    # An opaque id, not the subject: a random UUID (version 4). Not "'ada' is absent": the
    # subject is also three hex digits, which a random id holds about once in 130 runs.
    key = str(submitted["personal_data_key"])
    assert str(UUID(key)) == key and UUID(key).version == 4
    raw = stored_bytes(store_url, engine)
    export = exported(engine)
    for plaintext in PLAINTEXT:
        assert plaintext not in raw and plaintext.decode() not in export
    assert raw.count(b'"$sealed":"aes-256-gcm/1"') >= 2 * 6  # input, output, patch, signal
    assert b"gold" in raw  # not a personal path: stored as it is
    (ada_key,) = [row for row in key_rows(store_url) if row[2] == "ada"]

    report = engine.erase("acme", "ada", by="dpo@acme", reason="GDPR art. 17 request #42")
    assert set(report.erased) == {"j1", "j2"} and report.already == ()
    assert report.key_ids == (ada_key[0],)

    # After, in this engine (its cached jobs too) and in a fresh one: erased everywhere.
    fresh = open_engine()
    for reader in (engine, fresh):
        erased = reader.job("acme", "j1")
        assert erased.state["customer"] == {"email": ERASED, "name": ERASED, "plan": "gold"}
        assert erased.state["confirmed"] is True and erased.erased == (
            "customer.email",
            "customer.name",
        )
    history = fresh.history("acme", "j1")
    assert history[0].data["state"]["customer"]["email"] == ERASED
    step = next(e for e in history if e.event_type == "StepRecorded")
    assert step.data["output"] == {"greeted": True, "customer": {"email": ERASED}}
    last = history[-1]
    assert last.event_type == "Erased"
    assert last.data == {
        "key_id": ada_key[0],
        "paths": ["customer.email", "customer.name"],
        "erased_by": "dpo@acme",
        "reason": "GDPR art. 17 request #42",
    }
    # The other subject's job is untouched; the chains of all three verify.
    assert fresh.job("acme", "j3").state["customer"]["email"] == "ada.l@example.org"
    report_ = verify_store(store_of(fresh))
    assert report_.intact and len(report_.jobs) == 3
    assert "ada.l@example.org" not in exported(fresh).split("grace")[0]
    assert [row for row in key_rows(store_url) if row[2] == "ada"] == []

    replay = fresh.replay("acme", "j1")
    assert "v1 state.customer.email" in replay.unreadable
    assert "v2 output.customer.email" not in replay.unreadable  # v2 is the Claimed
    assert any(name.endswith("state_patch.customer.name") for name in replay.unreadable)
    assert any(name.endswith("payload.customer.email") for name in replay.unreadable)
    then = fresh.job_at("acme", "j1", version=1)
    assert then.state["customer"]["email"] == ERASED and then.erased

    with pytest.raises(SubjectErasedError, match="already erased"):
        fresh.erase("acme", "ada", by="dpo@acme", reason="again")


def test_erased_key_leaves_no_trace_in_the_sqlite_file(tmp_path: Path) -> None:
    """secure_delete zeroes the row in its page; the checkpoint empties the WAL."""
    url = f"sqlite:///{tmp_path}/jobs.db"
    registry = DefinitionRegistry([parse_definition(ONBOARDING, "onboarding.yaml")])
    config = EngineConfig(store_url=url, token_secret=TOKEN_SECRET)
    with Engine.open(registry=registry, executor=Greeter(), config=config) as engine:
        run_onboarding(engine, "j1", "ada", ADA)
        (row,) = key_rows(url)
        key_text = row[3].encode()
        files = b"".join(p.read_bytes() for p in tmp_path.glob("jobs.db*"))
        assert key_text in files
        engine.erase("acme", "ada", by="dpo", reason="asked")
    files = b"".join(p.read_bytes() for p in tmp_path.glob("jobs.db*"))
    assert key_text not in files
    assert b"Ada Lovelace" not in files


def test_a_crash_between_the_events_and_the_key_deletion_is_finished_by_a_rerun(
    open_engine: Any, store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine = open_engine()
    run_onboarding(engine, "j1", "ada", ADA)
    run_onboarding(engine, "j2", "ada", ADA)

    def crash(*_: object) -> None:
        raise RuntimeError("killed between the Erased events and the key deletion")

    with monkeypatch.context() as patched:
        patched.setattr(SubjectKeyTable, "destroy", crash)
        with pytest.raises(RuntimeError, match="killed"):
            engine.erase("acme", "ada", by="dpo", reason="asked")
    # The events are written, the key is not yet gone: the values still open.
    assert [e.event_type for e in engine.history("acme", "j1")][-1] == "Erased"
    assert [row[2] for row in key_rows(store_url)] == ["ada"]
    rerun = open_engine().erase("acme", "ada", by="dpo", reason="asked")
    assert rerun.erased == () and set(rerun.already) == {"j1", "j2"}
    assert key_rows(store_url) == []
    events = [e.event_type for e in engine.history("acme", "j1")]
    assert events.count("Erased") == 1
    assert verify_store(store_of(engine)).intact


def test_a_job_submitted_for_the_subject_during_its_erasure_is_erased_too(
    open_engine: Any, store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The erasure lists the subject's jobs, erases them, then destroys the key: a job
    submitted in between takes the same key, and must not be left without its Erased."""
    engine = open_engine()
    other = open_engine()
    run_onboarding(engine, "j1", "ada", ADA)
    destroy = SubjectKeyTable.destroy

    def submit_then_destroy(self: SubjectKeyTable, *args: Any) -> None:
        other.submit("acme", "late", "onboarding", input=ADA, data_subject="ada")
        destroy(self, *args)

    with monkeypatch.context() as patched:
        patched.setattr(SubjectKeyTable, "destroy", submit_then_destroy)
        report = engine.erase("acme", "ada", by="dpo", reason="asked")
    assert set(report.erased) == {"j1", "late"}
    late = open_engine().job("acme", "late")
    assert late.state["customer"]["email"] == ERASED and late.erased
    assert [e.event_type for e in engine.history("acme", "late")][-1] == "Erased"
    assert b"Ada Lovelace" not in stored_bytes(store_url, engine)
    assert verify_store(store_of(engine)).intact


def test_bad_erasures_and_subjects_are_refused_with_nothing_written(
    open_engine: Any, store_url: str
) -> None:
    engine = open_engine()
    run_onboarding(engine, "j1", "ada", ADA)
    before = stored_bytes(store_url, engine)
    with pytest.raises(UnknownSubjectError, match="no such data subject"):
        engine.erase("acme", "nobody", by="dpo", reason="asked")
    with pytest.raises(UnknownSubjectError):
        engine.erase("other-tenant", "ada", by="dpo", reason="asked")
    with pytest.raises(InvalidPayloadError, match="data subject must be a non-empty"):
        engine.erase("acme", " ", by="dpo", reason="asked")
    assert stored_bytes(store_url, engine) == before
    # A subject for a workflow without personal data means nothing: refused.
    with pytest.raises(InvalidPayloadError, match="declares no personal_data"):
        engine.submit("acme", "x", "plain", data_subject="ada")


def test_a_job_without_a_subject_gets_a_key_of_its_own(open_engine: Any, store_url: str) -> None:
    engine = open_engine()
    engine.submit("acme", "anon", "onboarding", input=ADA)
    assert engine.job("acme", "anon").state == ADA
    rows = key_rows(store_url)
    assert len(rows) == 1 and rows[0][2] is None
    assert b"Ada Lovelace" not in stored_bytes(store_url, engine)


# ---- erasing one job, sealed with a key of its own -----------------------------------------


def test_a_job_without_a_subject_is_erased_alone_and_the_chains_still_verify(
    open_engine: Any, store_url: str
) -> None:
    engine = open_engine()
    run_onboarding(engine, "anon", None, ADA)
    run_onboarding(engine, "other", None, GRACE)
    run_onboarding(engine, "j1", "ada", ADA)
    anon_key = engine.history("acme", "anon")[0].data["personal_data_key"]
    assert len(key_rows(store_url)) == 3

    report = engine.erase_job("acme", "anon", by="dpo@acme", reason="art. 17 request #7")
    assert (report.tenant_id, report.key_ids) == ("acme", (anon_key,))
    assert (report.erased, report.already) == (("anon",), ())

    fresh = open_engine()
    for reader in (engine, fresh):
        erased = reader.job("acme", "anon")
        assert erased.state["customer"] == {"email": ERASED, "name": ERASED, "plan": "gold"}
        assert erased.state["confirmed"] is True and erased.status == "completed"
    history = fresh.history("acme", "anon")
    assert history[0].data["state"]["customer"]["name"] == ERASED
    assert history[-1].event_type == "Erased"
    assert history[-1].data == {
        "key_id": anon_key,
        "paths": ["customer.email", "customer.name"],
        "erased_by": "dpo@acme",
        "reason": "art. 17 request #7",
    }
    # Only its key is gone: the other job without a subject and the subject's job still open.
    assert anon_key not in [row[0] for row in key_rows(store_url)]
    assert len(key_rows(store_url)) == 2
    assert fresh.job("acme", "other").state["customer"]["name"] == "Grace Hopper"
    assert fresh.job("acme", "j1").state["customer"]["name"] == "Ada Lovelace"
    assert erasure_rows(store_url) == [(anon_key, "acme", job_sha256("acme", "anon"))]
    verdict = verify_store(store_of(fresh))
    assert verdict.intact and len(verdict.jobs) == 3

    with pytest.raises(JobErasedError, match=r"job 'anon' of tenant 'acme' was already erased at"):
        fresh.erase_job("acme", "anon", by="dpo@acme", reason="again")


def test_erasing_a_job_is_refused_with_nothing_written_unless_it_has_a_key_of_its_own(
    open_engine: Any, store_url: str
) -> None:
    engine = open_engine()
    run_onboarding(engine, "j1", "ada", ADA)
    run_onboarding(engine, "j2", "ada", ADA)
    engine.submit("acme", "p", "plain")
    engine.run_until_idle()
    before = (stored_bytes(store_url, engine), key_rows(store_url), erasure_rows(store_url))

    with pytest.raises(UnknownJobError, match="no job 'nope' for tenant 'acme'"):
        engine.erase_job("acme", "nope", by="dpo", reason="asked")
    with pytest.raises(UnknownJobError):
        engine.erase_job("other-tenant", "j1", by="dpo", reason="asked")
    with pytest.raises(NoPersonalDataError, match="workflow 'plain' v1 declares no personal_data"):
        engine.erase_job("acme", "p", by="dpo", reason="asked")
    with pytest.raises(SubjectKeyError, match="sealed with its data subject's key") as shared:
        engine.erase_job("acme", "j1", by="dpo", reason="asked")
    assert "ada" not in str(shared.value)  # the subject's name may itself be personal
    with pytest.raises(InvalidPayloadError, match="erased by must be a string"):
        engine.erase_job("acme", "j1", by=None, reason="asked")  # type: ignore[arg-type]
    assert (stored_bytes(store_url, engine), key_rows(store_url), erasure_rows(store_url)) == before
    assert engine.job("acme", "j1").state["customer"]["name"] == "Ada Lovelace"

    # Once the subject is erased, its jobs are: erasing one of them says so.
    engine.erase("acme", "ada", by="dpo", reason="asked")
    with pytest.raises(JobErasedError, match="'j2' of tenant 'acme' was already erased at"):
        engine.erase_job("acme", "j2", by="dpo", reason="asked")
    assert [e.event_type for e in engine.history("acme", "j2")].count("Erased") == 1


def test_a_crash_between_a_jobs_erased_event_and_its_key_deletion_is_finished_by_a_rerun(
    open_engine: Any, store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine = open_engine()
    run_onboarding(engine, "anon", None, ADA)

    def crash(*_: object) -> None:
        raise RuntimeError("killed between the Erased event and the key deletion")

    with monkeypatch.context() as patched:
        patched.setattr(SubjectKeyTable, "destroy_job_key", crash)
        with pytest.raises(RuntimeError, match="killed"):
            engine.erase_job("acme", "anon", by="dpo", reason="asked")
    assert [e.event_type for e in engine.history("acme", "anon")][-1] == "Erased"
    assert len(key_rows(store_url)) == 1 and erasure_rows(store_url) == []

    rerun = open_engine().erase_job("acme", "anon", by="dpo", reason="asked")
    assert (rerun.erased, rerun.already) == ((), ("anon",))
    assert key_rows(store_url) == [] and len(erasure_rows(store_url)) == 1
    events = [e.event_type for e in engine.history("acme", "anon")]
    assert events.count("Erased") == 1
    assert open_engine().job("acme", "anon").state["customer"]["email"] == ERASED
    assert verify_store(store_of(engine)).intact


def test_an_imported_job_whose_key_stayed_behind_is_not_erased_again(
    open_engine: Any, fresh_store_url: str, tmp_path: Path
) -> None:
    """An export carries no key: in the store it is imported into, the values already
    read as [erased], and erasing the job says so, writing nothing."""
    run_onboarding(open_engine(), "anon", None, ADA)
    path = tmp_path / "export.jsonl"
    path.write_text(exported(open_engine()), encoding="utf-8")
    registry = DefinitionRegistry([parse_definition(ONBOARDING, "onboarding.yaml")])
    config = EngineConfig(store_url=fresh_store_url, token_secret=TOKEN_SECRET)
    with Engine.open(registry=registry, executor=Greeter(), config=config) as target:
        import_file(store_of(target), path)
        before = target.history("acme", "anon")
        with pytest.raises(JobErasedError, match="its key is not in this store"):
            target.erase_job("acme", "anon", by="dpo", reason="asked")
        assert target.history("acme", "anon") == before
        assert target.job("acme", "anon").state["customer"]["email"] == ERASED


@pytest.mark.parametrize(
    ("paths", "message"),
    [
        ("[customer..email]", "empty or padded segment"),
        ("['']", "non-empty dotted path"),
        ("[a, a]", "listed more than once"),
        ("customer.email", "valid list"),
    ],
)
def test_bad_personal_data_paths_are_a_definition_error(paths: str, message: str) -> None:
    text = ONBOARDING.replace("[customer.email, customer.name]", paths)
    with pytest.raises(DefinitionError, match="personal_data") as raised:
        parse_definition(text, "onboarding.yaml")
    assert message in str(raised.value)


# ---- plumbing -------------------------------------------------------------------------------


class _Cursor:
    def __init__(self, store_url: str) -> None:
        parts = urlsplit(store_url)
        self.sqlite = parts.scheme == "sqlite"
        if self.sqlite:
            self.connection: Any = sqlite3.connect(parts.path[1:])
            self.schema = ""
        else:
            schema = parse_qs(parts.query)["schema"][-1]
            self.connection = psycopg.connect(urlunsplit(parts._replace(query="")))
            self.schema = f'"{schema}".'

    def __enter__(self) -> tuple[Any, str]:
        return self.connection.cursor(), self.schema

    def __exit__(self, *_: object) -> None:
        self.connection.close()


def _cursor(store_url: str) -> _Cursor:
    return _Cursor(store_url)
