"""Group commit across jobs (issue 11, item 1): ticks running at once share one commit for
their step appends, a refused append leaves its group without failing the others, a lone
tick never waits, and ``async def execute`` steps run many at once. The crash rule (a kill
inside or right after a group's commit) is proven with real processes at the end."""

from __future__ import annotations

import asyncio
import json
import signal
import threading
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from jobledger import Engine, JobStatus, StepRequest, StepResult, StoreUnavailableError
from jobledger.adapters.clock import SystemClock
from jobledger.domain.identity import job_uuid, step_key
from jobledger.domain.job import Job
from jobledger.domain.keys import ConsumedKey
from jobledger.orchestration import group_commit
from jobledger.orchestration.group_commit import GroupCommitter
from jobledger.orchestration.ports import Append, JobStore, Refusal
from tests.support.crash_worker import TENANT, FileCountingExecutor, read_counts, registry
from tests.support.engines import EngineFactory
from tests.test_crash_safety import Spawn, assert_completed_exactly_once, spawn, wait_for

__all__ = ["spawn"]  # the fixture, shared with the crash-safety tests

AGENT_STEPS = 3  # agent3: three side-effecting steps, then the pure "complete"


class GroupCounter:
    """The real store, counting the commits each kind of append costs."""

    def __init__(self, inner: JobStore) -> None:
        self.inner = inner
        self.groups: list[int] = []
        self.alone = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def append(self, job: Job, *keys: ConsumedKey) -> None:
        self.alone += 1
        self.inner.append(job, *keys)

    def append_many(self, appends: Sequence[Append]) -> list[Refusal | None]:
        self.groups.append(len(appends))
        return self.inner.append_many(appends)


class SlowExecutor:
    """Each side effect takes a few milliseconds, so the steps of many jobs overlap."""

    def __init__(self, effect_s: float = 0.005) -> None:
        self.effect_s = effect_s
        self.calls: Counter[str] = Counter()
        self.lock = threading.Lock()

    def execute(self, request: StepRequest) -> StepResult:
        with self.lock:
            self.calls[request.idempotency_key] += 1
        time.sleep(self.effect_s)
        return StepResult(output={"step": request.step_number})


def submit_all(engine: Engine, count: int) -> list[str]:
    jobs = [f"job-{n}" for n in range(count)]
    for job_id in jobs:
        engine.submit(TENANT, job_id, "agent3")
    return jobs


def assert_each_step_recorded_once(engine: Engine, job_id: str, steps: int) -> None:
    events = engine.store.events(job_uuid(TENANT, job_id))
    recorded = Counter(e.step_number for e in events if isinstance(e, Job.StepRecorded))
    assert recorded == dict.fromkeys(range(1, steps + 1), 1)


def grouped_engine(
    make_engine: EngineFactory, executor: object, **config: Any
) -> tuple[Engine, GroupCounter]:
    counted: list[GroupCounter] = []

    def wrap(store: JobStore) -> GroupCounter:
        counted.append(GroupCounter(store))
        return counted[0]

    settings = {"concurrency": 8, "max_batch_wait_ms": 200, **config}
    engine = make_engine(executor=executor, config=settings, wrap_store=wrap)
    return engine, counted[0]


def test_the_steps_of_many_runnable_jobs_share_commits_and_each_is_recorded_once(
    make_engine: EngineFactory,
) -> None:
    executor = SlowExecutor()
    engine, store = grouped_engine(make_engine, executor)
    jobs = submit_all(engine, 8)
    store.groups.clear()
    store.alone = 0

    engine.run_until_idle(wait_for_timers=True)

    for job_id in jobs:
        assert engine.job(TENANT, job_id).status is JobStatus.COMPLETED
        assert_each_step_recorded_once(engine, job_id, AGENT_STEPS + 1)
    assert set(executor.calls.values()) == {1} and len(executor.calls) == 8 * AGENT_STEPS
    steps = 8 * (AGENT_STEPS + 1)
    assert max(store.groups) >= 2
    # Fewer commits than steps (the bare claims that open the ticks included).
    assert len(store.groups) + store.alone < steps


def test_a_refused_append_leaves_its_group_and_is_handled_alone_the_others_commit(
    make_engine: EngineFactory,
) -> None:
    """Job 0 is cancelled while its step 2 runs: its append, in the same group as the
    other jobs' step 2, is refused and discarded; the others' step 2 is recorded."""
    barrier = threading.Barrier(4, timeout=10)
    engines: list[Engine] = []

    class CancelsJobZero(SlowExecutor):
        def execute(self, request: StepRequest) -> StepResult:
            result = super().execute(request)
            if request.step_number == 2:
                if request.job.job_id == "job-0":
                    engines[0].cancel(TENANT, "job-0", "changed our mind", "ops")
                barrier.wait()  # every step 2 ends together: one group
            return result

    engine, store = grouped_engine(make_engine, CancelsJobZero(), concurrency=4)
    engines.append(engine)
    jobs = submit_all(engine, 4)

    engine.run_until_idle(wait_for_timers=True)

    cancelled = engine.store.events(job_uuid(TENANT, "job-0"))
    assert [e.step_number for e in cancelled if isinstance(e, Job.StepRecorded)] == [1]
    assert any(isinstance(e, Job.LateResultDiscarded) for e in cancelled)
    assert engine.job(TENANT, "job-0").status is JobStatus.CANCELLED
    for job_id in jobs[1:]:
        assert engine.job(TENANT, job_id).status is JobStatus.COMPLETED
        assert_each_step_recorded_once(engine, job_id, AGENT_STEPS + 1)
    assert 4 in store.groups  # the refused append was in a group with the others


def test_a_failed_group_commit_is_retried_by_each_tick_and_no_step_is_lost_or_doubled(
    make_engine: EngineFactory,
) -> None:
    failed: list[int] = []

    class FailsOnce(GroupCounter):
        def append_many(self, appends: Sequence[Append]) -> list[Refusal | None]:
            if not failed and len(appends) >= 2:
                failed.append(len(appends))
                raise StoreUnavailableError("connection reset by peer")
            return super().append_many(appends)

    executor = SlowExecutor()
    engine = make_engine(
        executor=executor,
        config={"concurrency": 4, "max_batch_wait_ms": 200},
        wrap_store=FailsOnce,
    )
    jobs = submit_all(engine, 4)

    engine.run_until_idle(wait_for_timers=True)

    assert failed
    for job_id in jobs:
        assert engine.job(TENANT, job_id).status is JobStatus.COMPLETED
        assert_each_step_recorded_once(engine, job_id, AGENT_STEPS + 1)


def test_async_executors_run_many_steps_at_once_on_one_loop(make_engine: EngineFactory) -> None:
    running = 0
    most = 0

    class AsyncExecutor:
        async def execute(self, request: StepRequest) -> StepResult:
            nonlocal running, most
            running += 1
            most = max(most, running)
            await asyncio.sleep(0.01)
            running -= 1
            return StepResult(output={"step": request.step_number})

    engine = make_engine(executor=AsyncExecutor(), config={"concurrency": 8})
    jobs = submit_all(engine, 8)

    engine.run_until_idle(wait_for_timers=True)

    for job_id in jobs:
        assert engine.job(TENANT, job_id).status is JobStatus.COMPLETED
        assert_each_step_recorded_once(engine, job_id, AGENT_STEPS + 1)
    assert most >= 2


# ---- the committer alone -------------------------------------------------------------


class RecordingStore:
    """Only the two appends, remembered."""

    def __init__(self) -> None:
        self.calls: list[int] = []

    def append(self, job: Job, *keys: ConsumedKey) -> None:
        self.calls.append(1)

    def append_many(self, appends: Sequence[Append]) -> list[Refusal | None]:
        self.calls.append(len(appends))
        return [None] * len(appends)


def run_in_thread(target: Any) -> threading.Thread:
    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    return thread


def test_a_lone_tick_never_waits_for_a_group() -> None:
    store = RecordingStore()
    committer = GroupCommitter(store, max_batch=64, max_wait_ms=600_000)  # type: ignore[arg-type]

    def alone() -> None:
        with committer.running():
            committer.append(object())  # type: ignore[arg-type]

    thread = run_in_thread(alone)
    thread.join(timeout=10)  # the wait is ten minutes: returning at all proves no wait
    assert not thread.is_alive() and store.calls == [1]


def test_the_appends_of_ticks_in_flight_form_one_group() -> None:
    store = RecordingStore()
    committer = GroupCommitter(store, max_batch=64, max_wait_ms=600_000)  # type: ignore[arg-type]
    entered = threading.Barrier(3, timeout=10)

    def tick() -> None:
        with committer.running():
            entered.wait()  # all three in flight before any appends
            committer.append(object())  # type: ignore[arg-type]

    threads = [run_in_thread(tick) for _ in range(3)]
    for thread in threads:
        thread.join(timeout=10)
    assert not any(t.is_alive() for t in threads)
    assert store.calls == [3]


def test_a_group_is_never_larger_than_max_batch() -> None:
    store = RecordingStore()
    committer = GroupCommitter(store, max_batch=2, max_wait_ms=600_000)  # type: ignore[arg-type]
    entered = threading.Barrier(5, timeout=10)

    def tick() -> None:
        with committer.running():
            entered.wait()
            committer.append(object())  # type: ignore[arg-type]

    threads = [run_in_thread(tick) for _ in range(5)]
    for thread in threads:
        thread.join(timeout=10)
    assert not any(t.is_alive() for t in threads)
    assert sorted(store.calls) == [1, 2, 2] and max(store.calls) <= 2


def test_each_waiting_tick_is_woken_once_and_no_append_wakes_the_others(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Issue 25 item 1: 48 ticks in flight, groups of at most 8. A tick that waits is
    woken once (its group committed, or it was handed the next group's lead); a
    broadcast per append would wake each waiting tick once per later append."""
    woken: Counter[int] = Counter()
    wake = group_commit._Waiting.wake

    def counted(waiting: Any) -> None:
        woken[id(waiting)] += 1
        wake(waiting)

    monkeypatch.setattr(group_commit._Waiting, "wake", counted)
    store = RecordingStore()
    committer = GroupCommitter(store, max_batch=8, max_wait_ms=600_000)  # type: ignore[arg-type]
    ticks = 48
    entered = threading.Barrier(ticks, timeout=10)

    def tick() -> None:
        with committer.running():
            entered.wait()
            committer.append(object())  # type: ignore[arg-type]

    threads = [run_in_thread(tick) for _ in range(ticks)]
    for thread in threads:
        thread.join(timeout=10)
    assert not any(t.is_alive() for t in threads)
    assert sum(store.calls) == ticks and max(store.calls) <= 8
    # Every append but the first leader's is woken once; a leader that gathered waits
    # for its group to fill and may be woken once more for that, and never again.
    assert max(woken.values()) <= 2
    assert ticks - 1 <= sum(woken.values()) <= ticks - 1 + len(store.calls)


def test_each_tick_prepares_its_own_job_in_its_own_thread_before_any_group_is_written() -> None:
    """The store's hashing and signing (``prepare``) run in the ticks' threads, side by
    side, not one job after another in the leader's write."""
    store = RecordingStore()
    prepared: dict[int, tuple[int, int]] = {}
    """Thread -> (the job it prepared, groups written when it did)."""

    def prepare(job: Job) -> None:
        prepared[threading.get_ident()] = (id(job), len(store.calls))

    committer = GroupCommitter(store, max_batch=64, max_wait_ms=600_000, prepare=prepare)  # type: ignore[arg-type]
    entered = threading.Barrier(3, timeout=10)
    jobs: dict[int, int] = {}

    def tick() -> None:
        job = object()
        jobs[threading.get_ident()] = id(job)
        with committer.running():
            entered.wait()
            committer.append(job)  # type: ignore[arg-type]

    threads = [run_in_thread(tick) for _ in range(3)]
    for thread in threads:
        thread.join(timeout=10)
    assert not any(t.is_alive() for t in threads)
    assert store.calls == [3]
    assert prepared == {thread: (job, 0) for thread, job in jobs.items()}


# ---- killing a real worker process mid-group-commit ---------------------------------------

GROUP_STEP = 2
GROUP_JOBS = [f"grouped-{n}" for n in range(4)]


@pytest.mark.slow
@pytest.mark.parametrize("kill_point", ["inside_commit", "after_commit"])
def test_sigkill_inside_or_after_a_group_commit_loses_no_step_and_records_none_twice(
    kill_point: str, tmp_path: Path, make_engine: EngineFactory, spawn: Spawn
) -> None:
    """Four jobs' step 2 share one commit; the worker is SIGKILLed with the group's rows
    written but not committed, or just after the commit. From the store: the group is all
    in or all out; a fresh worker then finishes every job with each step recorded once,
    and only an uncommitted group's steps ran twice, each with its same key."""
    lease_ms = 300
    counter = tmp_path / "calls"
    engine = make_engine(
        registry=registry(),
        executor=FileCountingExecutor(counter),
        clock=SystemClock(),
        config={"lease_ms": lease_ms},
    )
    for job_id in GROUP_JOBS:
        engine.submit(TENANT, job_id, "agent3")
    marker = tmp_path / "hung.json"
    hang = (
        "--hang-in-group-commit" if kill_point == "inside_commit" else "--hang-after-group-commit"
    )
    grouped = ["--grouped", "--concurrency", "4", "--max-batch-wait-ms", "2000"]
    jobs = ",".join(GROUP_JOBS)
    doomed = spawn(
        "--jobs",
        jobs,
        "--worker-id",
        "doomed",
        "--lease-ms",
        str(lease_ms),
        *grouped,
        hang,
        str(GROUP_STEP),
        "--marker",
        str(marker),
    )
    wait_for(marker, doomed)
    doomed.send_signal(signal.SIGKILL)
    doomed.communicate()

    uuids = set(json.loads(marker.read_text()))
    group = [j for j in GROUP_JOBS if str(job_uuid(TENANT, j)) in uuids]
    assert len(group) >= 2
    committed = kill_point == "after_commit"
    at_kill = {j: engine.job(TENANT, j).current_step for j in GROUP_JOBS}
    for job_id in group:  # the whole group is in, or the whole group is out
        assert at_kill[job_id] == (GROUP_STEP if committed else GROUP_STEP - 1), job_id
    ran = read_counts(counter)
    assert set(ran.values()) == {1}
    for job_id in group:
        assert ran[step_key(TENANT, job_id, GROUP_STEP)] == 1

    fresh = spawn("--jobs", jobs, "--worker-id", "fresh", "--lease-ms", str(lease_ms), *grouped)
    _, stderr = fresh.communicate(timeout=60)
    assert fresh.returncode == 0, stderr

    # A side effect ran twice only if it ran and the kill came before its record was
    # committed (the group's, when the kill was inside its commit), with its same key.
    expected = {step_key(TENANT, j, n): 1 for j in GROUP_JOBS for n in range(1, AGENT_STEPS + 1)}
    for key in ran:
        job_id, step = next(
            (j, n)
            for j in GROUP_JOBS
            for n in range(1, AGENT_STEPS + 1)
            if step_key(TENANT, j, n) == key
        )
        if step > at_kill[job_id]:
            expected[key] = 2
    if not committed:
        assert all(expected[step_key(TENANT, j, GROUP_STEP)] == 2 for j in group)
    else:
        assert all(expected[step_key(TENANT, j, GROUP_STEP)] == 1 for j in group)
    assert read_counts(counter) == expected
    for job_id in GROUP_JOBS:
        assert_completed_exactly_once(engine, job_id, AGENT_STEPS)
