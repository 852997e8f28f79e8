"""Bulk actions: a query, a dry run, a durable batch that acts on each job once, on both
stores, through crashes at each of its write points."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from datetime import timedelta
from pathlib import Path

import pytest

from jobledger import Engine, JobStatus, linear_workflow
from jobledger.adapters.clock import FakeClock
from jobledger.domain.batch import Batch, Outcome
from jobledger.domain.errors import (
    BatchBusyError,
    BatchExistsError,
    DuplicateKeyError,
    InvalidPayloadError,
    UnboundedBulkError,
    UnknownBatchError,
)
from jobledger.domain.identity import job_uuid
from jobledger.domain.job import Job
from jobledger.domain.keys import ConsumedKey
from jobledger.orchestration.ports import JobStore
from tests.support.bulk_crash import bulk_registry
from tests.support.engines import (
    CountingExecutor,
    EngineFactory,
    StoreAround,
    writes,
)
from tests.support.workflows import DONE, STEP

ROOT = Path(__file__).resolve().parent.parent
T = "bulk-tenant"


def waiting_jobs(engine: Engine, n: int, prefix: str = "w") -> list[str]:
    ids = [f"{prefix}{i}" for i in range(n)]
    for job_id in ids:
        engine.submit(T, job_id, "waiter", mission_id="m1" if job_id.endswith("0") else None)
    engine.run_until_idle()
    assert {engine.job(T, j).status for j in ids} == {JobStatus.WAITING_EVENT}
    return ids


def count_events(engine: Engine, job_id: str, event_type: str) -> int:
    return sum(1 for e in engine.history(T, job_id) if e.event_type == event_type)


@pytest.fixture
def engine(make_engine: EngineFactory) -> Engine:
    return make_engine(registry=bulk_registry())


# ---- acting -------------------------------------------------------------------------------


def test_a_bulk_cancel_cancels_the_matched_jobs_once_and_records_each_outcome(
    engine: Engine,
) -> None:
    waiters = waiting_jobs(engine, 4)
    engine.submit(T, "other", "agent3")
    engine.submit("another-tenant", "w0", "waiter")
    engine.run_until_idle()

    done = engine.bulk.bulk(
        T, "cancel", {"workflow_type": "waiter"}, by="ops", reason="the campaign is off"
    )

    assert (done.total, done.applied, done.skipped, done.failed, done.finished) == (
        4,
        4,
        0,
        0,
        True,
    )
    assert sorted(o.job_id for o in done.outcomes) == waiters
    for job_id in waiters:
        view = engine.job(T, job_id)
        assert view.status is JobStatus.CANCELLED
        assert count_events(engine, job_id, "Cancelled") == 1
        cancelled = next(e for e in engine.history(T, job_id) if e.event_type == "Cancelled")
        assert cancelled.data["cancelled_by"] == "ops"
        assert cancelled.data["reason"] == "the campaign is off"
    assert engine.job(T, "other").status is JobStatus.COMPLETED
    assert engine.job("another-tenant", "w0").status is JobStatus.WAITING_EVENT
    # The batch reads back from the store as it was run, and is listed.
    assert engine.bulk.batch(T, done.batch_id) == done
    [row] = engine.bulk.batches(T)
    assert (row.batch_id, row.action, row.total, row.applied, row.finished) == (
        done.batch_id,
        "cancel",
        4,
        4,
        True,
    )
    assert engine.bulk.unfinished() == []
    # Running a finished batch again acts on nothing.
    before = writes(engine)
    assert engine.bulk.run(T, done.batch_id) == done
    assert writes(engine) == before


def test_a_stopping_runner_stops_between_jobs_and_leaves_the_batch_to_resume(
    engine: Engine,
) -> None:
    # A server that stops (or fails to start) stops its batch threads before its engine
    # closes: each stops after the job in hand, and the batch is taken up again later.
    waiting_jobs(engine, 4)
    batch = engine.bulk.start(T, "cancel", {"workflow_type": "waiter"}, by="ops", reason="x")
    stopping = threading.Event()

    def stop_after_two(done: int, total: int) -> None:
        if done == 2:
            stopping.set()

    stopped = engine.bulk.run(T, batch.batch_id, stop_after_two, stopping=stopping)

    assert (stopped.applied, stopped.finished) == (2, False)
    assert engine.bulk.unfinished() == [(T, batch.batch_id)]
    resumed = engine.bulk.run(T, batch.batch_id)
    assert (resumed.applied, resumed.finished) == (4, True)


def test_jobs_that_refuse_the_action_are_skipped_with_the_reason(engine: Engine) -> None:
    waiting_jobs(engine, 2)
    engine.submit(T, "finished", "agent3")
    engine.run_until_idle()
    done = engine.bulk.bulk(T, "cancel", {"all": True}, by="ops", reason="all of them")
    outcomes = {o.job_id: o for o in done.outcomes}
    assert outcomes["finished"].outcome is Outcome.SKIPPED
    assert "finished" in outcomes["finished"].detail
    assert (done.applied, done.skipped) == (2, 1)
    assert count_events(engine, "finished", "Cancelled") == 0


def test_a_dry_run_counts_and_samples_and_writes_nothing(engine: Engine) -> None:
    waiting_jobs(engine, 12)
    before = writes(engine)
    preview = engine.bulk.preview(T, "cancel", {"status": ["waiting_event"]})
    assert preview.count == 12
    assert len(preview.sample) == 10
    assert {status for _, status in preview.sample} == {"waiting_event"}
    assert writes(engine) == before
    assert engine.bulk.batches(T) == []


def test_the_query_narrows_by_each_field(engine: Engine, executor: CountingExecutor) -> None:
    waiting_jobs(engine, 3)
    executor.fail_with = lambda r: (
        RuntimeError("tool exploded: quota") if "bad" in r.idempotency_key else None
    )
    for job_id in ("bad1", "bad2", "good"):
        engine.submit(T, job_id, "agent3", correlation_id="c-7" if job_id == "bad1" else None)
    engine.run_until_idle()

    def matched(**query: object) -> list[str]:
        return sorted(job_id for job_id, _ in engine.bulk.preview(T, "cancel", query).sample)

    assert matched(error_contains="quota") == ["bad1", "bad2"]
    assert matched(status=["failed"], correlation_id="c-7") == ["bad1"]
    assert matched(mission_id="m1") == ["w0"]
    assert matched(workflow_type="waiter", workflow_version=2) == ["w0", "w1", "w2"]
    assert matched(workflow_type="waiter", workflow_version=1) == []
    now = engine.clock.now()
    assert matched(finished_before=now.replace(year=now.year + 1)) == ["bad1", "bad2", "good"]
    assert matched(submitted_after=now.replace(year=now.year + 1)) == []


def test_bad_input_is_refused_by_name_and_writes_nothing(engine: Engine) -> None:
    waiting_jobs(engine, 2)
    before = writes(engine)
    with pytest.raises(UnboundedBulkError, match="every job of the tenant"):
        engine.bulk.start(T, "cancel", {}, by="ops", reason="oops")
    with pytest.raises(InvalidPayloadError, match="unknown bulk action 'delete'"):
        engine.bulk.start(T, "delete", {"all": True}, by="ops", reason="x")
    with pytest.raises(InvalidPayloadError, match="unknown status nope"):
        engine.bulk.start(T, "cancel", {"status": ["nope"]}, by="ops", reason="x")
    with pytest.raises(InvalidPayloadError, match="colour"):
        engine.bulk.start(T, "cancel", {"colour": "red"}, by="ops", reason="x")
    with pytest.raises(InvalidPayloadError, match="event name"):
        engine.bulk.start(T, "signal", {"all": True}, {}, by="ops", reason="x")
    with pytest.raises(InvalidPayloadError, match="needs max_steps"):
        engine.bulk.start(T, "raise-budget", {"all": True}, {}, by="ops", reason="x")
    with pytest.raises(InvalidPayloadError, match="to_version"):
        engine.bulk.start(T, "migrate", {"all": True}, {"to_version": "2"}, by="ops", reason="x")
    with pytest.raises(InvalidPayloadError, match="cancel takes no parameter"):
        engine.bulk.start(T, "cancel", {"all": True}, {"why": 1}, by="ops", reason="x")
    with pytest.raises(UnknownBatchError):
        engine.bulk.run(T, "no-such-batch")
    assert writes(engine) == before
    engine.bulk.start(T, "cancel", {"all": True}, by="ops", reason="x", batch_id="b1")
    with pytest.raises(BatchExistsError, match="exists"):
        engine.bulk.start(T, "cancel", {"all": True}, by="ops", reason="x", batch_id="b1")


def test_a_bulk_signal_resumes_the_waiting_jobs(engine: Engine) -> None:
    waiters = waiting_jobs(engine, 3)
    done = engine.bulk.bulk(
        T,
        "signal",
        {"status": ["waiting_event"]},
        {"event_name": "go", "payload": {"ok": True}},
        by="ops",
        reason="release them",
    )
    assert done.applied == 3
    resumed = next(e for e in engine.history(T, "w1") if e.event_type == "Resumed")
    assert resumed.data["signal_id"] == f"batch:{done.batch_id}"
    engine.run_until_idle()
    assert {engine.job(T, j).status for j in waiters} == {JobStatus.COMPLETED}


def test_a_bulk_budget_raise_lets_parked_jobs_go_on(engine: Engine) -> None:
    for job_id in ("p1", "p2"):
        engine.submit(T, job_id, "agent3", budget={"max_steps": 1})
    engine.run_until_idle()
    assert engine.job(T, "p1").status is JobStatus.BUDGET_EXCEEDED
    done = engine.bulk.bulk(
        T, "raise-budget", {"status": ["budget_exceeded"]}, {"max_steps": 10}, by="ops", reason="ok"
    )
    assert done.applied == 2
    engine.run_until_idle()
    assert {engine.job(T, j).status for j in ("p1", "p2")} == {JobStatus.COMPLETED}
    raised = next(e for e in engine.history(T, "p1") if e.event_type == "BudgetRaised")
    assert (raised.data["raised_by"], raised.data["reason"]) == ("ops", "ok")


def test_a_bulk_migration_moves_the_jobs_to_the_version(engine: Engine) -> None:
    engine.submit(T, "v1a", "waiter", workflow_version=1)
    engine.submit(T, "v1b", "waiter", workflow_version=1)
    engine.run_until_idle()
    done = engine.bulk.bulk(
        T,
        "migrate",
        {"workflow_type": "waiter", "workflow_version": 1},
        {"to_version": 2},
        by="ops",
        reason="v2 is the fix",
    )
    assert done.applied == 2
    assert {engine.job(T, j).workflow_version for j in ("v1a", "v1b")} == {2}
    migrated = next(e for e in engine.history(T, "v1a") if e.event_type == "Migrated")
    assert (migrated.data["migrated_by"], migrated.data["reason"]) == ("ops", "v2 is the fix")


def test_a_job_the_action_fails_on_is_recorded_failed_with_the_error_and_the_rest_go_on(
    make_engine: EngineFactory,
) -> None:
    engine = make_engine(registry=bulk_registry())
    waiting_jobs(engine, 3)

    class BreaksOnW1(StoreAround):
        def append(self, job: Job, *keys: ConsumedKey) -> None:
            if job.job_id == "w1":
                raise RuntimeError("disk on fire")
            self.inner.append(job, *keys)

    broken = make_engine(registry=bulk_registry(), wrap_store=BreaksOnW1)
    done = broken.bulk.bulk(T, "cancel", {"workflow_type": "waiter"}, by="ops", reason="x")
    outcomes = {o.job_id: o for o in done.outcomes}
    assert outcomes["w1"].outcome is Outcome.FAILED
    assert outcomes["w1"].detail == "RuntimeError: disk on fire"
    assert (done.applied, done.failed, done.finished) == (2, 1, True)
    assert engine.job(T, "w1").status is JobStatus.WAITING_EVENT


def test_a_migration_replay_refuses_is_skipped_with_the_divergence(
    make_engine: EngineFactory,
) -> None:
    registry = bulk_registry()
    registry.register("waiter", 3, linear_workflow([STEP, STEP, STEP, DONE]))
    engine = make_engine(registry=registry)
    engine.submit(T, "old", "waiter", workflow_version=1)
    engine.run_until_idle()
    done = engine.bulk.bulk(
        T, "migrate", {"workflow_type": "waiter"}, {"to_version": 3}, by="ops", reason="v3"
    )
    [outcome] = done.outcomes
    assert outcome.outcome is Outcome.SKIPPED and "diverges at step 2" in outcome.detail
    assert engine.job(T, "old").workflow_version == 1


# ---- crash safety ---------------------------------------------------------------------------


class Crash(BaseException):
    """The process dies here: not an Exception, so nothing on the way catches it."""


class CrashingStore(StoreAround):
    """Dies at one write point of a batch run, the ``nth`` time it is reached:
    ``job-before`` (a job's append not written), ``job-after`` (the job's append written,
    its outcome not), ``outcome-before`` (mid-list: the outcome not written),
    ``outcome-after`` (the outcome written, the next job not acted on)."""

    def __init__(self, inner: JobStore, point: str, nth: int) -> None:
        super().__init__(inner)
        self.point, self.left = point, nth

    def _reached(self, point: str) -> None:
        if point == self.point:
            self.left -= 1
            if self.left == 0:
                raise Crash(point)

    def append(self, job: object, *keys: object) -> None:
        self._reached("job-before")
        self.inner.append(job, *keys)  # type: ignore[arg-type]
        self._reached("job-after")

    def append_batch(self, batch: Batch) -> None:
        outcome = any(isinstance(e, Batch.JobDone) for e in batch.pending_events)
        if outcome:
            self._reached("outcome-before")
        self.inner.append_batch(batch)
        if outcome:
            self._reached("outcome-after")


@pytest.mark.parametrize("point", ["job-before", "job-after", "outcome-before", "outcome-after"])
@pytest.mark.parametrize("nth", [1, 3])
def test_a_batch_that_dies_at_a_write_point_resumes_and_acts_on_each_job_once(
    make_engine: EngineFactory, point: str, nth: int
) -> None:
    engine = make_engine(registry=bulk_registry())
    waiters = waiting_jobs(engine, 5)
    started = engine.bulk.start(T, "cancel", {"workflow_type": "waiter"}, by="ops", reason="x")
    dying = make_engine(
        registry=bulk_registry(),
        wrap_store=lambda store: CrashingStore(store, point, nth),
    )
    with pytest.raises(Crash):
        dying.bulk.run(T, started.batch_id)
    assert engine.bulk.unfinished() == [(T, started.batch_id)]

    resumed = make_engine(registry=bulk_registry()).bulk.run(T, started.batch_id)

    assert (resumed.applied, resumed.skipped, resumed.failed, resumed.finished) == (5, 0, 0, True)
    for job_id in waiters:
        assert count_events(engine, job_id, "Cancelled") == 1
    assert engine.bulk.unfinished() == []


def test_the_mark_is_written_with_the_jobs_own_event(engine: Engine) -> None:
    """The mark is what makes a second application impossible: it is there exactly when
    the job's event is, and an append carrying it again collides."""
    from jobledger.engine.batch_marks import acting_for, mark_id

    waiting_jobs(engine, 1)
    done = engine.bulk.bulk(T, "cancel", {"status": ["waiting_event"]}, by="ops", reason="x")
    assert engine.store.find_key(job_uuid(T, "w0"), mark_id(done.batch_id, T, "w0")) is not None
    assert engine.store.find_key(job_uuid(T, "w0"), mark_id("other", T, "w0")) is None
    waiting_jobs(engine, 1, prefix="again")
    with acting_for("b1", T, "again0"):
        engine.raise_budget(T, "again0", raised_by="ops", reason="x", max_steps=50)
    with acting_for("b1", T, "again0"), pytest.raises(DuplicateKeyError):
        engine.raise_budget(T, "again0", raised_by="ops", reason="x", max_steps=60)
    assert count_events(engine, "again0", "BudgetRaised") == 1


def test_batches_list_newest_first_and_unfinished_ones_are_found(
    engine: Engine, clock: FakeClock
) -> None:
    waiting_jobs(engine, 1)
    first = engine.bulk.start(T, "cancel", {"status": ["waiting_event"]}, by="a", reason="1")
    clock.advance(timedelta(minutes=1))
    second = engine.bulk.start(T, "cancel", {"status": ["waiting_event"]}, by="b", reason="2")
    assert [r.batch_id for r in engine.bulk.batches(T)] == [second.batch_id, first.batch_id]
    assert {b for _, b in engine.bulk.unfinished()} == {first.batch_id, second.batch_id}


def test_two_runners_of_one_batch_act_on_each_job_once_and_the_later_one_stops(
    make_engine: EngineFactory,
) -> None:
    engine = make_engine(registry=bulk_registry())
    waiters = waiting_jobs(engine, 4)
    started = engine.bulk.start(T, "cancel", {"workflow_type": "waiter"}, by="ops", reason="x")
    other = make_engine(registry=bulk_registry())

    class OvertakenAtFirstOutcome(StoreAround):
        """Just before this runner records its first outcome, another runs the batch."""

        def append_batch(self, batch: Batch) -> None:
            if batch.version == 2 and not getattr(self, "overtaken", False):
                self.overtaken = True
                assert other.bulk.run(T, started.batch_id).finished
            self.inner.append_batch(batch)

    slow = make_engine(registry=bulk_registry(), wrap_store=OvertakenAtFirstOutcome)
    with pytest.raises(BatchBusyError, match="another runner"):
        slow.bulk.run(T, started.batch_id)
    done = engine.bulk.batch(T, started.batch_id)
    assert (done.applied, done.finished) == (4, True)
    assert [count_events(engine, j, "Cancelled") for j in waiters] == [1] * 4


def test_kill_9_mid_batch_then_resume_acts_on_each_job_once(
    make_engine: EngineFactory, store_url: str, tmp_path: Path
) -> None:
    engine = make_engine(registry=bulk_registry())
    waiters = waiting_jobs(engine, 6)
    started = engine.bulk.start(T, "cancel", {"workflow_type": "waiter"}, by="ops", reason="x")
    marker = tmp_path / "at-the-crash-point"
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tests.support.bulk_crash",
            store_url,
            T,
            started.batch_id,
            str(marker),
        ],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": f"{ROOT / 'src'}{os.pathsep}{ROOT}"},
    )
    try:
        deadline = time.monotonic() + 60
        while not marker.exists():
            assert process.poll() is None, "the runner ended before the crash point"
            assert time.monotonic() < deadline, "the runner never reached the crash point"
            time.sleep(0.05)
        process.send_signal(signal.SIGKILL)
        assert process.wait(30) == -signal.SIGKILL
    finally:
        if process.poll() is None:
            process.kill()
    dead = engine.bulk.batch(T, started.batch_id)
    assert (dead.done, dead.finished) == (2, False)  # the third job acted on, not recorded
    assert sum(count_events(engine, j, "Cancelled") for j in waiters) == 3

    resumed = make_engine(registry=bulk_registry()).bulk.run(T, started.batch_id)

    assert (resumed.applied, resumed.finished) == (6, True)
    assert [count_events(engine, j, "Cancelled") for j in waiters] == [1] * 6
