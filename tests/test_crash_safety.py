"""Crash safety: whatever point a worker dies at, every step is recorded exactly once, no
recorded step's side effect runs again, and the job still completes with an intact chain.

The only side effect allowed to run twice is that of the step a worker died in between
running it and recording it, and then with the same idempotency key.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from eventsourcing.persistence import OperationalError, StoredEvent

from jobledger import (
    Engine,
    JobStatus,
    Outcome,
    StepRequest,
    StepResult,
    StoreUnavailableError,
    Tick,
)
from jobledger.adapters.clock import FakeClock, SystemClock
from jobledger.adapters.event_store import EventSourcedJobStore
from jobledger.adapters.local_queue import LocalQueue
from jobledger.adapters.ops import MemoryOps
from jobledger.domain.identity import job_uuid, step_key
from jobledger.domain.job import Job
from jobledger.domain.keys import ConsumedKey
from jobledger.orchestration.ports import JobStore
from jobledger.runtime.embedded_runner import EmbeddedRunner
from tests.support import pythonpath
from tests.support.crash_worker import TENANT, FileCountingExecutor, read_counts, registry
from tests.support.engines import CountingExecutor, EngineFactory, StoreAround

JOB = "job-1"
AGENT_STEPS = 3  # "agent3": three side-effecting steps, then the pure step 4 "complete"
LEASE_MS = 30_000
WORKER = [sys.executable, "-m", "tests.support.crash_worker"]


class Crash(BaseException):
    """The process dies here: not an Exception, so nothing in the engine can catch it."""


# ---- in-process fault injection ----------------------------------------------------------


class CrashAfterAppend(StoreAround):
    """A JobStore that dies right after an append has committed, when ``crashes_on`` says
    the append was the one to die after."""

    def __init__(self, inner: JobStore, crashes_on: Callable[[Job, list[object]], bool]) -> None:
        super().__init__(inner)
        self.crashes_on = crashes_on
        self.crashed = False

    def append(self, job: Job, *keys: ConsumedKey) -> None:
        fatal = not self.crashed and self.crashes_on(job, list(job.pending_events))
        self.inner.append(job, *keys)
        if fatal:
            self.crashed = True
            raise Crash


class CrashInSideEffect:
    """An executor that dies after the side effect of the step with key ``key`` happened."""

    def __init__(self, inner: CountingExecutor, key: str) -> None:
        self.inner = inner
        self.key = key

    def execute(self, request: StepRequest) -> StepResult:
        result = self.inner.execute(request)
        if request.idempotency_key == self.key:
            raise Crash
        return result


class CrashOnContinuation(LocalQueue):
    """A queue whose process dies while enqueueing the continuation after ``step``."""

    def __init__(self, clock: FakeClock, step: int) -> None:
        super().__init__(clock)
        self.dedupe_key = f"burst:{step}"

    def enqueue(self, tick: Tick, *, delay_ms: int = 0, dedupe_key: str | None = None) -> None:
        if dedupe_key == self.dedupe_key:
            raise Crash
        super().enqueue(tick, delay_ms=delay_ms, dedupe_key=dedupe_key)


def fail_commit(
    engine: Engine, step: int, *, after_write: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Make the database driver raise once on the insert that records ``step``: before it
    writes anything, or after its commit landed (the acknowledgement is lost)."""
    store = engine.store
    assert isinstance(store, EventSourcedJobStore)
    (partition,) = store.partitions
    recorder = partition.events.recorder
    insert_events = recorder.insert_events
    failed = False

    def flaky_insert(stored_events: Sequence[StoredEvent], **kwargs: Any) -> Any:
        nonlocal failed
        events = [partition.mapper.to_domain_event(stored) for stored in stored_events]
        records_step = any(
            isinstance(event, Job.StepRecorded) and event.step_number == step for event in events
        )
        if failed or not records_step:
            return insert_events(stored_events, **kwargs)
        failed = True
        if after_write:
            insert_events(stored_events, **kwargs)
        raise OperationalError("connection reset by peer")

    monkeypatch.setattr(recorder, "insert_events", flaky_insert)


@dataclass(frozen=True)
class CrashPoint:
    name: str
    max_steps_per_tick: int
    """1 makes each step a tick of its own: a bare claim, and a continuation to enqueue."""
    effect_ran: bool
    """The crashed step's side effect happened before the crash."""
    record_landed: bool
    """The crashed step's record reached the store."""
    surfaces: type[BaseException] = Crash

    @property
    def claim_left_behind(self) -> bool:
        """The dead tick left a live claim (its own, or the next step's carried in the
        record's commit) that only the lease's expiry can release."""
        return not self.record_landed or self.max_steps_per_tick > 1


POINTS = [
    CrashPoint("after_claim", 1, effect_ran=False, record_landed=False),
    CrashPoint("during_side_effect", 10, effect_ran=True, record_landed=False),
    CrashPoint("after_record", 10, effect_ran=True, record_landed=True),
    CrashPoint("before_enqueue", 1, effect_ran=True, record_landed=True),
    CrashPoint(
        "commit_failed", 10, effect_ran=True, record_landed=False, surfaces=StoreUnavailableError
    ),
    CrashPoint(
        "commit_ack_lost", 10, effect_ran=True, record_landed=True, surfaces=StoreUnavailableError
    ),
]


def open_crashing_engine(
    make_engine: EngineFactory,
    point: CrashPoint,
    step: int,
    clock: FakeClock,
    executor: CountingExecutor,
    monkeypatch: pytest.MonkeyPatch,
) -> Engine:
    config = {"max_steps_per_tick": point.max_steps_per_tick, "lease_ms": LEASE_MS}
    if point.name == "during_side_effect":
        return make_engine(
            config=config, executor=CrashInSideEffect(executor, step_key(TENANT, JOB, step))
        )
    if point.name == "before_enqueue":
        return make_engine(config=config, queue=CrashOnContinuation(clock, step))
    if point.name == "after_claim":
        return make_engine(
            config=config,
            wrap_store=lambda store: CrashAfterAppend(
                store,
                lambda job, events: (
                    job.current_step == step - 1
                    and all(isinstance(event, Job.Claimed) for event in events)
                ),
            ),
        )
    if point.name == "after_record":
        return make_engine(
            config=config,
            wrap_store=lambda store: CrashAfterAppend(
                store,
                lambda _, events: any(
                    isinstance(event, Job.StepRecorded) and event.step_number == step
                    for event in events
                ),
            ),
        )
    engine = make_engine(config=config)
    fail_commit(engine, step, after_write=point.record_landed, monkeypatch=monkeypatch)
    return engine


# ---- reconciling and checking ------------------------------------------------------------


def reconcile(
    engine: Engine, job_id: str, *, wait_for_lease: Callable[[], None], max_rounds: int = 50
) -> list[Outcome]:
    """Re-deliver ticks as a reconciler scanning the store would, until the job is
    terminal; ``wait_for_lease`` is called whenever a (dead) worker's claim is in the way."""
    outcomes: list[Outcome] = []
    for _ in range(max_rounds):
        report = engine.tick(TENANT, job_id, "reconcile")
        outcomes.append(report.outcome)
        if isinstance(engine.queue, LocalQueue):
            engine.run_until_idle(wait_for_timers=True)
        if engine.job(TENANT, job_id).status.is_terminal:
            return outcomes
        if report.outcome is Outcome.CLAIM_LOST:
            wait_for_lease()
    raise AssertionError(f"job {job_id} never finished: {outcomes}")


def assert_completed_exactly_once(engine: Engine, job_id: str, side_effect_steps: int) -> None:
    """From the store: completed, each step recorded exactly once, versions contiguous and
    the hash chain intact."""
    view = engine.job(TENANT, job_id)
    assert view.status is JobStatus.COMPLETED, view
    history = engine.history(TENANT, job_id)
    recorded = Counter(
        entry.data["idempotency_key"] for entry in history if entry.event_type == "StepRecorded"
    )
    all_steps = range(1, side_effect_steps + 2)
    assert recorded == {step_key(TENANT, job_id, n): 1 for n in all_steps}
    assert [entry.version for entry in history] == list(range(1, len(history) + 1))
    assert view.current_step == view.total_steps_executed == side_effect_steps + 1
    assert view.state == {f"s{n}": True for n in range(1, side_effect_steps + 1)}
    assert engine.verify(TENANT, job_id) is None


def recovered_from(ops: MemoryOps) -> list[tuple[int, str]]:
    return [
        (event.metadata["stepNumber"], event.metadata["previousWorkerId"])
        for event in ops.events
        if event.eventType == "job.step.recovered"
    ]


# ---- 1. in-process crash injection -------------------------------------------------------


@pytest.mark.parametrize("step", range(1, AGENT_STEPS + 1))
@pytest.mark.parametrize("point", POINTS, ids=lambda point: point.name)
def test_crash_at_every_point_then_recover_on_a_fresh_engine(
    point: CrashPoint,
    step: int,
    make_engine: EngineFactory,
    clock: FakeClock,
    executor: CountingExecutor,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    crashing = open_crashing_engine(make_engine, point, step, clock, executor, monkeypatch)
    crashing.submit(TENANT, JOB, "agent3")
    with pytest.raises(point.surfaces):
        for _ in range(step):
            crashing.tick(TENANT, JOB)

    # A fresh process: empty cache, empty local queue, only the store survives.
    ops = MemoryOps()
    fresh = make_engine(ops=ops, config={"max_steps_per_tick": 1, "lease_ms": LEASE_MS})
    left = fresh.job(TENANT, JOB)
    assert left.current_step == (step if point.record_landed else step - 1)
    assert left.status is (JobStatus.RUNNING if point.claim_left_behind else JobStatus.QUEUED)
    ran_before_crash = {
        step_key(TENANT, JOB, n): 1 for n in range(1, step + 1 if point.effect_ran else step)
    }
    assert executor.calls == ran_before_crash

    outcomes = reconcile(
        fresh, JOB, wait_for_lease=lambda: clock.advance(timedelta(milliseconds=LEASE_MS + 1))
    )

    # A dead worker's live lease is respected: nobody runs its step alongside it.
    assert outcomes[0] is (Outcome.CLAIM_LOST if point.claim_left_behind else Outcome.ADVANCED)
    stale_step = step if not point.record_landed else step + 1
    if point.claim_left_behind and stale_step <= AGENT_STEPS:
        assert recovered_from(ops) == [(stale_step, "w0")]
    else:
        assert recovered_from(ops) == []
    assert_completed_exactly_once(fresh, JOB, AGENT_STEPS)
    expected_calls = {step_key(TENANT, JOB, n): 1 for n in range(1, AGENT_STEPS + 1)}
    if point.effect_ran and not point.record_landed:
        expected_calls[step_key(TENANT, JOB, step)] = 2  # the documented at-least-once window
    assert executor.calls == expected_calls


@pytest.mark.parametrize("after_write", [False, True], ids=["before_write", "ack_lost"])
def test_a_failed_commit_is_retried_by_the_same_engine_until_the_job_completes(
    after_write: bool,
    make_engine: EngineFactory,
    executor: CountingExecutor,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A store error on a step's commit is infrastructure: the job is not failed, the tick is
    re-enqueued, and the engine's own queue finishes the job once the store is back (waiting
    out the failed tick's lease if it must; the fake clock makes that free). The engine
    did not die: the step whose record never landed is recorded by the retry from what it
    kept, not run again (issue 29, item 4)."""
    engine = make_engine(config={"lease_ms": LEASE_MS})
    fail_commit(engine, 2, after_write=after_write, monkeypatch=monkeypatch)
    engine.submit(TENANT, JOB, "agent3")
    assert isinstance(engine.queue, LocalQueue)
    assert engine.run_until_idle() == 1
    assert len(engine.queue) == 1
    view = engine.job(TENANT, JOB)
    assert (view.status, view.last_error) == (JobStatus.RUNNING, None)
    assert view.current_step == (2 if after_write else 1)

    engine.run_until_idle(wait_for_timers=True)

    assert_completed_exactly_once(engine, JOB, AGENT_STEPS)
    assert executor.calls == {step_key(TENANT, JOB, n): 1 for n in range(1, AGENT_STEPS + 1)}


@pytest.mark.parametrize("repeat_by", ["idempotency_key", "job_id"])
def test_a_submit_that_died_before_the_first_tick_is_started_by_its_repeat(
    repeat_by: str, make_engine: EngineFactory, executor: CountingExecutor
) -> None:
    """The job written, its first tick never sent: a repeat of the submit (a client's
    retry, a subscription's message read again) finds the job still as its submit wrote
    it and sends that tick, so the job starts without waiting for the reconciler. A repeat
    that finds its job started sends nothing."""
    key = {"idempotency_key": "order-7"} if repeat_by == "idempotency_key" else {}
    crashing = make_engine(
        wrap_store=lambda store: CrashAfterAppend(
            store, lambda _, events: any(isinstance(e, Job.Submitted) for e in events)
        )
    )
    with pytest.raises(Crash):
        crashing.submit(TENANT, JOB, "agent3", **key)
    assert isinstance(crashing.queue, LocalQueue) and len(crashing.queue) == 0

    fresh = make_engine()  # a fresh process: its own empty queue
    assert isinstance(fresh.queue, LocalQueue)
    again = fresh.submission(TENANT, JOB, "agent3", **key)
    assert again.created is False and again.job.version == 1
    pending = [(tick.job_id, tick.reason, dedupe) for _, tick, dedupe in fresh.queue.pending()]
    assert pending == [(JOB, "create", "create")]
    fresh.run_until_idle()
    assert_completed_exactly_once(fresh, JOB, AGENT_STEPS)
    fresh.submission(TENANT, JOB, "agent3", **key)
    assert len(fresh.queue) == 0


# ---- 2. real process kills ---------------------------------------------------------------


Spawn = Callable[..., subprocess.Popen[str]]


@pytest.fixture
def spawn(store_url: str, tmp_path: Path) -> Iterator[Spawn]:
    """Start tests/support/crash_worker.py processes on the test's store; SIGKILL any left
    at teardown."""
    started: list[subprocess.Popen[str]] = []

    def start(*args: str) -> subprocess.Popen[str]:
        command = [*WORKER, "--store", store_url]
        process = subprocess.Popen(
            [*command, "--counter", str(tmp_path / "calls"), *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, "PYTHONPATH": pythonpath()},
        )
        started.append(process)
        return process

    yield start
    for process in started:
        if process.poll() is None:
            process.kill()
            process.communicate()


def wait_for(path: Path, process: subprocess.Popen[str], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        if process.poll() is not None:
            _, stderr = process.communicate()
            pytest.fail(f"worker exited with {process.returncode} before {path.name}:\n{stderr}")
        if time.monotonic() > deadline:
            pytest.fail(f"worker never reached {path.name}")
        time.sleep(0.01)


@pytest.mark.slow
@pytest.mark.parametrize("kill_point", ["in_side_effect", "after_record"])
def test_sigkill_mid_step_or_after_record_then_finish_after_lease(
    kill_point: str, tmp_path: Path, make_engine: EngineFactory, spawn: Spawn
) -> None:
    lease_ms = 300
    counter = tmp_path / "calls"
    ops = MemoryOps()
    engine = make_engine(
        registry=registry(),
        executor=FileCountingExecutor(counter),
        clock=SystemClock(),
        ops=ops,
        config={"lease_ms": lease_ms},
    )
    engine.submit(TENANT, JOB, "agent3")
    marker = tmp_path / "hung"
    hang = "--hang-in-step" if kill_point == "in_side_effect" else "--hang-after-record"
    worker = spawn(
        "--jobs",
        JOB,
        "--worker-id",
        "doomed",
        "--lease-ms",
        str(lease_ms),
        hang,
        "2",
        "--marker",
        str(marker),
    )
    wait_for(marker, worker)
    worker.send_signal(signal.SIGKILL)
    worker.communicate()

    record_landed = kill_point == "after_record"
    left = engine.job(TENANT, JOB)
    assert (left.status, left.worker_id) == (JobStatus.RUNNING, "doomed")
    assert left.current_step == (2 if record_landed else 1)
    assert read_counts(counter) == {step_key(TENANT, JOB, 1): 1, step_key(TENANT, JOB, 2): 1}

    reconcile(engine, JOB, wait_for_lease=lambda: time.sleep(lease_ms / 5000))

    assert_completed_exactly_once(engine, JOB, AGENT_STEPS)
    assert recovered_from(ops) == [(3 if record_landed else 2, "doomed")]
    expected = {step_key(TENANT, JOB, n): 1 for n in range(1, AGENT_STEPS + 1)}
    if not record_landed:
        expected[step_key(TENANT, JOB, 2)] = 2  # died between running step 2 and recording it
    assert read_counts(counter) == expected


# ---- 3. two processes racing on the same jobs --------------------------------------------


@pytest.mark.slow
def test_two_processes_ticking_the_same_jobs_run_each_step_exactly_once(
    tmp_path: Path, make_engine: EngineFactory, spawn: Spawn
) -> None:
    jobs, steps = [f"race-{n:02d}" for n in range(20)], 5
    engine = make_engine(registry=registry(), clock=SystemClock())
    for job_id in jobs:
        engine.submit(TENANT, job_id, f"agent{steps}")
    go = tmp_path / "go"
    workers = [
        spawn(
            "--jobs",
            ",".join(jobs),
            "--worker-id",
            f"racer{n}",
            "--max-steps-per-tick",
            "1",
            "--effect-ms",
            "2",
            "--ready",
            str(tmp_path / f"ready{n}"),
            "--go",
            str(go),
        )
        for n in range(2)
    ]
    for n, worker in enumerate(workers):
        wait_for(tmp_path / f"ready{n}", worker)
    go.touch()  # both engines are open: start them together so they really race
    summaries: list[Counter[str]] = []
    for worker in workers:
        stdout, stderr = worker.communicate(timeout=60)
        assert worker.returncode == 0, stderr
        summaries.append(Counter(json.loads(stdout)))

    # Both made progress and they did collide, or this would prove nothing about races.
    assert all(summary[Outcome.ADVANCED] > 0 for summary in summaries), summaries
    lost = (Outcome.CLAIM_LOST, Outcome.DUPLICATE_SKIPPED, Outcome.DISCARDED)
    assert sum(summary[outcome] for summary in summaries for outcome in lost) > 0, summaries
    for job_id in jobs:
        assert_completed_exactly_once(engine, job_id, steps)
    assert read_counts(tmp_path / "calls") == {
        step_key(TENANT, job_id, n): 1 for job_id in jobs for n in range(1, steps + 1)
    }


# ---- 4. a dead worker's job is taken over on the default lease ---------------------------


@pytest.mark.slow
def test_a_sigkilled_workers_job_is_finished_by_a_live_runner_within_30_s_on_the_defaults(
    tmp_path: Path, make_engine: EngineFactory, spawn: Spawn
) -> None:
    """A worker on the default lease runs step 2 long enough for its heartbeat to extend
    the lease, then is SIGKILLed. A live embedded runner on the defaults takes the job over
    and completes it well inside 30 s of the kill (one lease after the last heartbeat,
    plus a reconcile pass)."""
    counter = tmp_path / "calls"
    ops = MemoryOps()
    engine = make_engine(
        registry=registry(), executor=FileCountingExecutor(counter), clock=SystemClock(), ops=ops
    )
    engine.submit(TENANT, JOB, "agent3")
    marker = tmp_path / "hung"
    worker = spawn(
        "--jobs", JOB, "--worker-id", "doomed", "--hang-in-step", "2", "--marker", str(marker)
    )
    wait_for(marker, worker)
    store = engine.store
    assert isinstance(store, EventSourcedJobStore)
    running = engine.job(TENANT, JOB)
    assert running.lease_until is not None
    deadline = time.monotonic() + 15
    while (
        row := store.leases.get(job_uuid(TENANT, JOB))
    ) is None or row.lease_until <= running.lease_until:
        assert time.monotonic() < deadline, "the hung worker's heartbeat never extended its lease"
        time.sleep(0.05)
    worker.send_signal(signal.SIGKILL)
    worker.communicate()
    killed_at = time.monotonic()

    runner = EmbeddedRunner(engine)
    runner.run(
        until=lambda: (
            engine.job(TENANT, JOB).status.is_terminal or time.monotonic() - killed_at > 30
        )
    )

    assert engine.job(TENANT, JOB).status is JobStatus.COMPLETED, "not finished within 30 s"
    assert_completed_exactly_once(engine, JOB, AGENT_STEPS)
    assert recovered_from(ops) == [(2, "doomed")]
    expected = {step_key(TENANT, JOB, n): 1 for n in range(1, AGENT_STEPS + 1)}
    expected[step_key(TENANT, JOB, 2)] = 2  # died between running step 2 and recording it
    assert read_counts(counter) == expected
