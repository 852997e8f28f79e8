"""Crash safety of retry, reset and fork, on SQLite and PostgreSQL: the process dies (a
BaseException nothing in the engine catches, and a real SIGKILL) at each write point of a
repair; a fresh engine then finds the repair recorded once or not at all, finishes it
the documented way (a retry or reset not recorded is asked again; a fork is asked again,
which writes whatever of it is missing and never a second fork), and the job completes
with each step key recorded once and the steps kept never run again."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from collections import Counter
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import pytest

from jobledger import Engine, JobStatus, RepairStatusError, StepError, StepRequest, Tick
from jobledger.adapters.clock import FakeClock
from jobledger.adapters.event_store import EventSourcedJobStore
from jobledger.adapters.local_queue import LocalQueue
from jobledger.adapters.locks import lock_for
from jobledger.adapters.ops import MemoryOps
from jobledger.adapters.store_url import parse_store_url
from jobledger.domain.job import Job
from jobledger.domain.keys import ConsumedKey
from jobledger.orchestration.ports import JobStore
from jobledger.orchestration.reconciler import Reconciler
from jobledger.projections import JobViews
from tests.support import pythonpath
from tests.support.crash_worker import TENANT, registry
from tests.support.engines import CountingExecutor, EngineFactory, StoreAround
from tests.support.repair_crash import FORK, JOB
from tests.test_crash_safety import LEASE_MS, Crash, reconcile, wait_for

REPAIR_EVENTS = (Job.Retried, Job.Reset, Job.ForkedFrom, Job.Forked)


class CrashOnAppend(StoreAround):
    """Dies at the append holding an event of type ``kind``: before it is written, or
    right after it committed."""

    def __init__(self, inner: JobStore, kind: type[Job.Event], *, after: bool) -> None:
        super().__init__(inner)
        self.kind = kind
        self.after = after
        self.crashed = False

    def append(self, job: Job, *keys: ConsumedKey) -> None:
        fatal = not self.crashed and any(isinstance(e, self.kind) for e in job.pending_events)
        if fatal and not self.after:
            self.crashed = True
            raise Crash
        self.inner.append(job, *keys)
        if fatal:
            self.crashed = True
            raise Crash


class CrashOnEnqueue(LocalQueue):
    """Dies putting the repaired job (or the fork) back on the queue."""

    def __init__(self, clock: FakeClock, reason: str) -> None:
        super().__init__(clock)
        self.reason = reason

    def enqueue(self, tick: Tick, *, delay_ms: int = 0, dedupe_key: str | None = None) -> None:
        if tick.reason == self.reason:
            raise Crash
        super().enqueue(tick, delay_ms=delay_ms, dedupe_key=dedupe_key)


@dataclass(frozen=True)
class Point:
    repair: str
    name: str
    kind: type[Job.Event] | None
    """The event whose append it dies at (None: at the enqueue)."""
    after: bool
    """Dies after that append committed (or at the enqueue, after every append before it)."""

    def __str__(self) -> str:
        return f"{self.repair}-{self.name}"


POINTS = [
    Point("retry", "before_retried", Job.Retried, after=False),
    Point("retry", "after_retried", Job.Retried, after=True),
    Point("retry", "at_enqueue", None, after=True),
    Point("reset", "before_reset", Job.Reset, after=False),
    Point("reset", "after_reset", Job.Reset, after=True),
    Point("reset", "at_enqueue", None, after=True),
    Point("fork", "before_fork", Job.ForkedFrom, after=False),
    Point("fork", "after_fork", Job.ForkedFrom, after=True),
    Point("fork", "at_enqueue", None, after=True),
    Point("fork", "before_forked", Job.Forked, after=False),
    Point("fork", "after_forked", Job.Forked, after=True),
]
WORKER = [sys.executable, "-m", "tests.support.repair_crash"]
TICK_REASONS = {"retry": "retried", "reset": "reset", "fork": "forked"}


def failed_job(engine: Engine, executor: CountingExecutor) -> None:
    """job-1 (agent3) failed in step 3, after steps 1-2 ran."""

    def fail(request: StepRequest) -> Exception | None:
        return StepError("bug", retryable=False) if request.step_number == 3 else None

    executor.fail_with = fail
    engine.submit(TENANT, JOB, "agent3")
    engine.run_until_idle()
    executor.fail_with = None
    assert engine.job(TENANT, JOB).status is JobStatus.FAILED


def repair(engine: Engine, which: str) -> None:
    if which == "retry":
        engine.retry(TENANT, JOB, by="ops", reason="fixed")
    elif which == "reset":
        engine.reset(TENANT, JOB, 1, by="ops", reason="again")
    else:
        engine.fork(TENANT, JOB, 2, new_job_id=FORK, by="ops", reason="variant")


def repair_events(engine: Engine, job_id: str) -> Counter[str]:
    found = engine.jobs.fetch(TENANT, job_id)
    if found is None:
        return Counter()
    events = engine.store.events(found.id)
    return Counter(type(e).__name__ for e in events if isinstance(e, REPAIR_EVENTS))


def finish(fresh: Engine, which: str, clock: FakeClock) -> str:
    """What an operator does after the crash: a retry or reset that did not land is asked
    again, a fork always (it completes itself); then the reconciler's ticks. Returns the
    job that runs now."""
    left = fresh.job(TENANT, JOB).status
    if which == "fork" or left is JobStatus.FAILED:
        repair(fresh, which)
    ran = FORK if which == "fork" else JOB
    reconcile(fresh, ran, wait_for_lease=lambda: clock.advance(timedelta(milliseconds=LEASE_MS)))
    return ran


def assert_repaired_once(fresh: Engine, which: str, ran: str, executor: CountingExecutor) -> None:
    assert fresh.job(TENANT, ran).status is JobStatus.COMPLETED
    for job_id in {JOB, ran}:
        recorded = Counter(
            e.idempotency_key
            for e in fresh.store.events(fresh.jobs.load(TENANT, job_id).id)
            if isinstance(e, Job.StepRecorded)
        )
        assert set(recorded.values()) == {1}, recorded  # no step key recorded twice
        assert fresh.verify(TENANT, job_id) is None
    expected = {"retry": {"Retried": 1}, "reset": {"Reset": 1}, "fork": {"Forked": 1}}[which]
    assert repair_events(fresh, JOB) == expected
    if which == "fork":
        assert repair_events(fresh, FORK) == {"ForkedFrom": 1}
    # The steps kept (1 and 2 of job-1) ran once, before the repair.
    key = f"{TENANT}/{JOB}:step:"
    assert (executor.calls[key + "1"], executor.calls[key + "2"]) == (1, 1)


@pytest.mark.parametrize("point", POINTS, ids=str)
def test_a_crash_at_each_write_point_of_a_repair_then_recover(
    point: Point, make_engine: EngineFactory, clock: FakeClock, executor: CountingExecutor
) -> None:
    config = {"lease_ms": LEASE_MS}
    failed_job(make_engine(registry=registry(), config=config), executor)
    kind = point.kind
    crashing = (
        make_engine(
            registry=registry(),
            config=config,
            queue=CrashOnEnqueue(clock, TICK_REASONS[point.repair]),
        )
        if kind is None
        else make_engine(
            registry=registry(),
            config=config,
            wrap_store=lambda store: CrashOnAppend(store, kind, after=point.after),
        )
    )
    with pytest.raises(Crash):
        repair(crashing, point.repair)

    # A fresh process: only the store survives. The repair is there once, or not at all.
    fresh = make_engine(registry=registry(), config=config)
    left = repair_events(fresh, JOB) + repair_events(fresh, FORK)
    assert set(left.values()) <= {1}
    landed = point.after or point.kind is Job.Forked
    if point.repair != "fork":
        assert sum(left.values()) == (1 if landed else 0)
    else:
        assert ("ForkedFrom" in left) is landed
        assert ("Forked" in left) is (point.name == "after_forked")

    ran = finish(fresh, point.repair, clock)
    assert_repaired_once(fresh, point.repair, ran, executor)


# ---- a real SIGKILL ---------------------------------------------------------------------


@pytest.mark.parametrize("which", ["retry", "reset", "fork"])
def test_sigkill_right_after_a_repair_committed_then_recover(
    which: str,
    store_url: str,
    tmp_path: Path,
    make_engine: EngineFactory,
    clock: FakeClock,
    executor: CountingExecutor,
) -> None:
    engine = make_engine(registry=registry(), config={"lease_ms": LEASE_MS})
    failed_job(engine, executor)
    marker = tmp_path / "hung"
    doomed = subprocess.Popen(
        [*WORKER, "--store", store_url, "--repair", which, "--marker", str(marker)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": pythonpath()},
    )
    try:
        wait_for(marker, doomed)
    finally:
        doomed.send_signal(signal.SIGKILL)
        doomed.communicate()

    fresh = make_engine(registry=registry(), config={"lease_ms": LEASE_MS})
    if which != "fork":
        assert repair_events(fresh, JOB) == {"Retried" if which == "retry" else "Reset": 1}
        assert fresh.job(TENANT, JOB).status is JobStatus.QUEUED  # on no queue: killed first
    else:
        # Killed between the fork's write and its origin's: the fork names its origin,
        # the origin does not name it yet, until the fork is asked again.
        assert repair_events(fresh, FORK) == {"ForkedFrom": 1}
        assert repair_events(fresh, JOB) == {}
    ran = finish(fresh, which, clock)
    assert_repaired_once(fresh, which, ran, executor)


def test_a_retry_whose_tick_was_lost_is_found_by_the_reconciler_in_the_status_view(
    make_engine: EngineFactory,
    store_url: str,
    clock: FakeClock,
    ops: MemoryOps,
    executor: CountingExecutor,
) -> None:
    failed_job(make_engine(registry=registry()), executor)
    crashing = make_engine(registry=registry(), queue=CrashOnEnqueue(clock, "retried"))
    with pytest.raises(Crash):
        crashing.retry(TENANT, JOB, by="ops", reason="fixed")

    queue = LocalQueue(clock)
    fresh = make_engine(registry=registry(), queue=queue)
    assert isinstance(fresh.store, EventSourcedJobStore)
    views = JobViews(fresh.store)
    views.catch_up()
    [row] = [row for row in views.jobs(limit=10) if row.job_id == JOB]
    assert (row.status, row.last_error, row.current_step) == ("queued", None, 2)
    reconciler = Reconciler(
        views=views,
        queue=queue,
        clock=clock,
        lock=lock_for(parse_store_url(store_url), "reconciler"),
        ops=ops,
    )
    clock.advance(timedelta(seconds=31))
    assert reconciler.reconcile().enqueued == 1
    fresh.run_until_idle()
    reconciler.stop()
    views.catch_up()
    [row] = [row for row in views.jobs(limit=10) if row.job_id == JOB]
    assert row.status == "completed"
    assert_repaired_once(fresh, "retry", JOB, executor)


def test_two_engines_retrying_one_job_at_once_retry_it_once(
    make_engine: EngineFactory, executor: CountingExecutor
) -> None:
    engines = [make_engine(registry=registry()) for _ in range(2)]
    failed_job(engines[0], executor)
    start = threading.Barrier(2)
    outcomes: list[str] = []

    def retry(engine: Engine) -> None:
        start.wait()
        try:
            engine.retry(TENANT, JOB, by="ops", reason="at once")
            outcomes.append("retried")
        except RepairStatusError as refused:
            outcomes.append(str(refused))

    threads = [threading.Thread(target=retry, args=(engine,)) for engine in engines]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert sorted(outcomes)[-1] == "retried"
    assert "is queued: only a failed job is retried" in sorted(outcomes)[0]
    assert repair_events(engines[1], JOB) == {"Retried": 1}
