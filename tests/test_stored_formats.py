"""Stored formats do not drift: what today's code writes, byte for byte, is kept in
tests/fixtures/stored-formats.jsonl (events, consumed keys and snapshots of jobs that
waited, buffered signals, had a token reissued, their budget raised and an approval
decided). A change that alters a single stored byte fails here; a store written by the
code of that day loads, folds and verifies on today's.

Regenerate (only for a deliberate format change, and say so): JOBLEDGER_WRITE_GOLDEN=1.
Keep the rows it replaces as a fixture of the release that wrote them, loaded by the same
test: tests/fixtures/stored-formats-before-one-row.jsonl is the same scenario as written
before issue 11 folded the continuation claim into the step (a ``Claimed`` after each
continuing step, a key row per step); stored-formats-before-sealing.jsonl as written before
issue 16 stored each event as the bytes its chain hash covers (eventsourcing's transcoder's
rows, ``{"timestamp":...``).
"""

from __future__ import annotations

import itertools
import json
import os
from datetime import timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any
from uuid import UUID

import pytest
from eventsourcing.persistence import StoredEvent

from jobledger import Engine, EngineConfig, FunctionRegistry, JobStatus, Resolution, linear_workflow
from jobledger.adapters.clock import FakeClock
from jobledger.adapters.event_store import EventSourcedJobStore
from jobledger.adapters.ops import MemoryOps
from jobledger.audit import export as exporting
from jobledger.audit import tamper
from jobledger.domain import chain
from jobledger.domain.errors import BrokenHistoryError
from jobledger.domain.identity import job_uuid
from jobledger.domain.job import Job
from jobledger.domain.keys import KeyKind, key_id
from jobledger.domain.steps import ApprovalSpec
from jobledger.domain.substate import ApprovalGate, BufferedSignal, EventWait, JobBudget
from tests.support.engines import TOKEN_SECRET, CountingExecutor
from tests.support.notifiers import Inbox

GOLDEN = Path(__file__).parent / "fixtures" / "stored-formats.jsonl"
BEFORE_ONE_ROW = GOLDEN.with_name("stored-formats-before-one-row.jsonl")
BEFORE_SEALING = GOLDEN.with_name("stored-formats-before-sealing.jsonl")
WRITTEN = {"today": GOLDEN, "before-one-row": BEFORE_ONE_ROW, "before-sealing": BEFORE_SEALING}
"""Every format a release wrote this scenario in, each loaded by today's code."""
JOBS = ("done", "waiting", "gated")


def registry() -> FunctionRegistry:
    registry = FunctionRegistry()
    registry.register(
        "rich",
        1,
        linear_workflow(
            [
                Resolution("run_interaction_task", JobStatus.QUEUED, params={"p": 1}),
                Resolution(
                    "wait_event",
                    JobStatus.WAITING_EVENT,
                    wait_event_name="invoice.paid",
                    wait_timeout_ms=3_600_000,
                    on_timeout=None,
                ),
                Resolution(
                    "await_approval",
                    JobStatus.AWAITING_APPROVAL,
                    step_name="review",
                    approval=ApprovalSpec(approvers=("ann", "bob"), expires_ms=600_000),
                ),
                Resolution("wait", JobStatus.WAITING_TIME, resume_delay_ms=1000),
                Resolution("complete", JobStatus.COMPLETED),
            ]
        ),
    )
    return registry


def deterministic(monkeypatch: pytest.MonkeyPatch, clock: FakeClock) -> None:
    """Claim ids, token nonces and snapshot times from counters and the fake clock."""
    claims = itertools.count(1)
    nonces = itertools.count(1)
    monkeypatch.setattr(
        "jobledger.orchestration.orchestrator.uuid4", lambda: UUID(int=next(claims))
    )
    # A resume's folded claim (the tick it wakes) too.
    monkeypatch.setattr("jobledger.engine.job_commands.uuid4", lambda: UUID(int=next(claims)))
    monkeypatch.setattr(
        "jobledger.adapters.jwt_tokens.secrets.token_hex", lambda n: f"{next(nonces):0{2 * n}x}"
    )
    monkeypatch.setattr(Job.Snapshot, "create_timestamp", classmethod(lambda cls: clock.now()))


def open_engine(store_url: str, clock: FakeClock, inbox: Inbox) -> Engine:
    config = EngineConfig(
        store_url=store_url,
        worker_id="w0",
        token_secret=TOKEN_SECRET,
        snapshot_interval=2,
        cache_size=0,
    )
    return Engine.open(
        registry=registry(),
        executor=CountingExecutor(),
        clock=clock,
        ops=MemoryOps(),
        config=config,
        notifier=inbox,
    )


def write_scenario(engine: Engine, clock: FakeClock, inbox: Inbox) -> None:
    budget = {"max_steps": 20, "max_cost_usd": "5.50", "deadline_seconds": 86_400}
    for job in JOBS:
        engine.submit("t", job, "rich", input={"n": job}, budget=budget, idempotency_key=job)
        engine.signal("t", job, "noise", {"early": True}, signal_id=f"{job}-noise")
        engine.run_until_idle()
        clock.advance(timedelta(seconds=1))
    for job in ("done", "gated"):
        engine.reissue_token("t", job, by="ops")
        clock.advance(timedelta(seconds=1))
        engine.raise_budget("t", job, raised_by="ops", reason="more", max_steps=30)
        engine.resume(inbox.tokens[job].token, {"paid": True})
        engine.run_until_idle()
        clock.advance(timedelta(seconds=1))
    request = inbox.approvals["done"]
    engine.decide("t", "done", request.approval_id, "approve", "ann", "fine")
    engine.run_until_idle()
    clock.advance(timedelta(seconds=2))
    engine.run_until_idle()


def dump(store: EventSourcedJobStore) -> list[dict[str, Any]]:
    """Every stored row, as stored: the events table in log order, then the snapshots."""
    rows: list[dict[str, Any]] = []
    for partition in store.partitions:
        for record in partition.recorder.select_notifications(start=1, limit=10_000):
            rows.append(_row("events", record))
        assert partition.snapshots is not None
        for job in JOBS:
            for record in partition.snapshots.recorder.select_events(job_uuid("t", job)):
                rows.append(_row("snapshots", record))
    return rows


def _row(table: str, record: Any) -> dict[str, Any]:
    return {
        "table": table,
        "originator_id": str(record.originator_id),
        "originator_version": record.originator_version,
        "topic": record.topic,
        "state": bytes(record.state).decode(),
    }


def golden(path: Path = GOLDEN) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_todays_code_stores_exactly_the_recorded_bytes(
    store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = FakeClock()
    deterministic(monkeypatch, clock)
    inbox = Inbox()
    with open_engine(store_url, clock, inbox) as engine:
        write_scenario(engine, clock, inbox)
        assert isinstance(engine.store, EventSourcedJobStore)
        rows = dump(engine.store)
    if os.environ.get("JOBLEDGER_WRITE_GOLDEN") == "1" and store_url.startswith("sqlite"):
        GOLDEN.write_text("".join(json.dumps(r, sort_keys=True) + "\n" for r in rows))
    assert {r["table"] for r in rows} == {"events", "snapshots"}
    assert rows == golden()


def insert(engine: Engine, rows: list[dict[str, Any]]) -> None:
    """Rows as stored, straight into the store's tables."""
    assert isinstance(engine.store, EventSourcedJobStore)
    partition = engine.store.partitions[0]
    assert partition.snapshots is not None
    for table, recorder in (
        ("events", partition.recorder),
        ("snapshots", partition.snapshots.recorder),
    ):
        stored = [
            StoredEvent(
                originator_id=UUID(r["originator_id"]),
                originator_version=r["originator_version"],
                topic=r["topic"],
                state=r["state"].encode(),
            )
            for r in rows
            if r["table"] == table
        ]
        if stored:
            recorder.insert_events(stored)


@pytest.mark.parametrize("written", sorted(WRITTEN))
def test_a_store_written_before_loads_folds_and_verifies(
    store_url: str, fresh_store_url: str, written: str, tmp_path: Path
) -> None:
    clock = FakeClock()
    inbox = Inbox()
    with open_engine(store_url, clock, inbox) as engine:
        assert isinstance(engine.store, EventSourcedJobStore)
        insert(engine, golden(WRITTEN[written]))
        for job in JOBS:
            assert engine.verify("t", job) is None
            # Replay rebuilds every request the engine of that day resolved, whichever
            # way its claims were stored, and finds no divergence.
            assert engine.replay("t", job).safe, engine.replay("t", job).verdict
        assert tamper.verify_store(engine.store).intact
        exported_to = tmp_path / "export.jsonl"
        with exported_to.open("w") as out:
            exporting.export_jobs(engine.store, out, exporting.Selection(), clock.now())
        with open_engine(fresh_store_url, FakeClock(), Inbox()) as target:
            assert isinstance(target.store, EventSourcedJobStore)
            exporting.import_file(target.store, exported_to)
            for job in JOBS:
                assert target.verify("t", job) is None
                assert target.job("t", job) == engine.job("t", job)
        done, waiting, gated = (engine.job("t", job) for job in JOBS)
        assert done.status is JobStatus.COMPLETED
        assert done.budget == {
            "max_steps": 30,
            "max_cost_usd": "5.50",
            "deadline_at": done.budget["deadline_at"],
        }
        assert waiting.status is JobStatus.WAITING_EVENT
        assert waiting.wait_event_name == "invoice.paid"
        assert waiting.buffered_signals == 1
        assert gated.status is JobStatus.AWAITING_APPROVAL
        assert gated.pending_approval_id == "gated:step:3:approval"
        steps = [e for e in engine.history("t", "done") if e.event_type == "StepRecorded"]
        assert [s.data["next_status"] for s in steps] == [
            "queued",
            "waiting_event",
            "awaiting_approval",
            "waiting_time",
            "completed",
        ]
        # Stored as strings, read as the enums the events declare.
        events = engine.store.events(job_uuid("t", "done"))
        assert {type(e.next_status) for e in events if isinstance(e, Job.StepRecorded)} == {
            JobStatus
        }
        assert {type(e.previous_status) for e in events if isinstance(e, Job.Claimed)} == {
            JobStatus
        }
        submit_key = key_id(KeyKind.SUBMIT, "t", "done", "done")
        found = engine.store.find_key(submit_key, submit_key)
        assert found is not None and found.kind is KeyKind.SUBMIT
        # The parts of a job's state are value objects, from events and snapshots alike.
        loaded = engine.store.load(job_uuid("t", "waiting"))
        assert loaded is not None and isinstance(loaded.budget, JobBudget)
        assert loaded.budget.max_cost_usd == Decimal("5.50")
        assert isinstance(loaded.wait_event, EventWait)
        assert loaded.wait_event.name == "invoice.paid" and loaded.wait_event.on_timeout is None
        assert loaded.inbox == (BufferedSignal("waiting-noise", "noise", {"early": True}),)
        gate = engine.store.load(job_uuid("t", "gated"))
        assert gate is not None and isinstance(gate.pending_approval, ApprovalGate)
        assert gate.pending_approval.approvers == ("ann", "bob")
        assert gate.wait_event is None
        # The old rows go on: a job loaded from them takes its next commands.
        engine.decide("t", "gated", "gated:step:3:approval", "reject", "bob", "no")
        assert engine.job("t", "gated").status is JobStatus.FAILED
        engine.resume(inbox_token(engine, "waiting"), {})
        # Runnable, held by the claim of the tick the resume woke (issue 11; was "queued").
        assert engine.job("t", "waiting").status is JobStatus.RUNNING
        assert engine.verify("t", "waiting") is None


def test_a_stored_status_outside_the_enum_is_a_broken_history(store_url: str) -> None:
    """Read as the enum, a status no JobStatus has does not decode: the job is not folded
    (nothing is written on top of it) and verify says where."""
    done = str(job_uuid("t", "done"))
    rows = [r for r in golden() if r["table"] == "events"]
    step = next(
        r for r in rows if r["originator_id"] == done and r["topic"].endswith("StepRecorded")
    )
    step["state"] = step["state"].replace('"next_status":"queued"', '"next_status":"paused"')
    assert "paused" in step["state"]
    with open_engine(store_url, FakeClock(), Inbox()) as engine:
        insert(engine, rows)
        with pytest.raises(
            BrokenHistoryError, match=f"t/done is broken at v{step['originator_version']}"
        ):
            engine.job("t", "done")
        with pytest.raises(BrokenHistoryError):
            engine.cancel("t", "done", "r", "ops")


def inbox_token(engine: Engine, job: str) -> str:
    """A fresh token for a waiting job of the golden store (its own was never kept)."""
    return engine.reissue_token("t", job, by="test").token


def test_the_stored_format_changed_but_not_one_chain_hash() -> None:
    """Issue 16 stores the bytes the chain hashes (format v2) instead of the transcoder's
    rows: the same scenario's events carry the same chain hashes as before, and each v2
    row's body is exactly the bytes hashed."""

    def hashes(rows: list[dict[str, Any]]) -> list[str]:
        events = [r for r in rows if r["table"] == "events" and "jobledger.job:" in r["topic"]]
        return [json.loads(r["state"])["chain_hash"] for r in events]

    today, before = golden(), golden(BEFORE_SEALING)
    assert hashes(today) == hashes(before) and len(hashes(today)) > 20
    previous: dict[str, str] = {}
    for row in today:
        if row["table"] != "events" or "jobledger.job:" not in row["topic"]:
            continue
        state = row["state"].encode()
        body = state[state.index(b'"event":') + len(b'"event":') : -1]
        stored = json.loads(state)["chain_hash"]
        assert chain.link_bytes(previous.get(row["originator_id"], ""), body) == stored
        previous[row["originator_id"]] = stored


def test_an_event_reads_the_same_from_either_format(store_url: str, fresh_store_url: str) -> None:
    """The typed decoder of the stored rows gives back, field for field and type for
    type, the events eventsourcing's transcoder gave back from the rows before them."""
    read: dict[str, list[dict[str, Any]]] = {}
    for name, url in (("today", store_url), ("before-sealing", fresh_store_url)):
        with open_engine(url, FakeClock(), Inbox()) as engine:
            insert(engine, golden(WRITTEN[name]))
            read[name] = [
                chain.event_fields(event)
                for job in JOBS
                for event in engine.store.events(job_uuid("t", job))
            ]
    assert len(read["today"]) > 20
    for today, before in zip(read["today"], read["before-sealing"], strict=True):
        assert today == before
        assert {k: type(v) for k, v in today.items()} == {k: type(v) for k, v in before.items()}
