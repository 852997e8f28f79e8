"""`jobledger run`'s workers group-commit whatever is runnable (issue 11, item 1): one
local worker runs up to ``concurrency`` jobs' ticks at once (one per job), so their step
appends share commits; each step is still recorded once."""

from __future__ import annotations

import threading

from jobledger import StepRequest, StepResult
from jobledger.domain.status import JobStatus
from jobledger.runtime.supervisor import Services, Supervisor
from tests.support.crash_worker import TENANT
from tests.support.engines import EngineFactory
from tests.test_group_commit import (
    AGENT_STEPS,
    SlowExecutor,
    assert_each_step_recorded_once,
    grouped_engine,
    submit_all,
)


def test_one_local_worker_runs_many_jobs_at_once_and_their_steps_share_commits(
    make_engine: EngineFactory,
) -> None:
    width = 4
    together = threading.Barrier(width, timeout=10)

    class Together(SlowExecutor):
        def execute(self, request: StepRequest) -> StepResult:
            if request.step_number == 1:
                together.wait()  # passes only when `width` jobs' steps run at once
            return super().execute(request)

    executor = Together()
    engine, store = grouped_engine(make_engine, executor, concurrency=width)
    jobs = submit_all(engine, 2 * width)
    supervisor = Supervisor(engine, Services(workers=1))

    def finished() -> bool:
        return all(engine.job(TENANT, job).status.is_terminal for job in jobs)

    supervisor.run(until=finished)

    assert not together.broken
    for job_id in jobs:
        assert engine.job(TENANT, job_id).status is JobStatus.COMPLETED
        assert_each_step_recorded_once(engine, job_id, AGENT_STEPS + 1)
    assert set(executor.calls.values()) == {1} and len(executor.calls) == 2 * width * AGENT_STEPS
    assert max(store.groups) >= 2
    assert supervisor.handled >= len(jobs)


def test_a_local_worker_with_concurrency_one_runs_one_tick_at_a_time(
    make_engine: EngineFactory,
) -> None:
    inside = 0
    most = 0
    lock = threading.Lock()

    class Counting(SlowExecutor):
        def execute(self, request: StepRequest) -> StepResult:
            nonlocal inside, most
            with lock:
                inside += 1
                most = max(most, inside)
            try:
                return super().execute(request)
            finally:
                with lock:
                    inside -= 1

    engine, _ = grouped_engine(make_engine, Counting(), concurrency=1)
    jobs = submit_all(engine, 4)
    Supervisor(engine, Services(workers=1)).run(
        until=lambda: all(engine.job(TENANT, job).status.is_terminal for job in jobs)
    )
    assert most == 1
    for job_id in jobs:
        assert_each_step_recorded_once(engine, job_id, AGENT_STEPS + 1)
