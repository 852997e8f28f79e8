"""Bulk retry and bulk reset, on SQLite and PostgreSQL: the jobs the repair takes are
reopened once each, the ones it refuses are skipped with why, bad parameters write
nothing, and a batch that dies right after a job's repair resumes without repairing it
twice (in process, at each write point, and under a real SIGKILL)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from jobledger import Engine, FunctionRegistry, JobStatus, StepError, StepRequest
from jobledger.domain.batch import Batch, Outcome
from jobledger.domain.errors import InvalidPayloadError
from jobledger.domain.job import Job
from jobledger.domain.keys import ConsumedKey
from jobledger.orchestration.ports import JobStore
from jobledger.orchestration.registry import linear_workflow
from tests.support.engines import CountingExecutor, EngineFactory, StoreAround, agent_steps
from tests.support.workflows import sleep_ms

ROOT = Path(__file__).resolve().parent.parent
T = "bulk-tenant"
WORKER = [sys.executable, "-m", "tests.support.bulk_crash"]
REPAIRS = {"retry": Job.Retried, "reset": Job.Reset}


def registry() -> FunctionRegistry:
    """agent3: v1, v2 the same steps, v3 a timer first (diverges at 1); one: a single step."""
    found = FunctionRegistry()
    found.register("agent3", 1, linear_workflow(agent_steps(3)))
    found.register("agent3", 2, linear_workflow(agent_steps(3)))
    found.register("agent3", 3, linear_workflow([sleep_ms(10), *agent_steps(3)]))
    found.register("one", 1, linear_workflow(agent_steps(1)))
    return found


@pytest.fixture
def engine(make_engine: EngineFactory) -> Engine:
    return make_engine(registry=registry())


def failing_at(executor: CountingExecutor, number: int) -> None:
    def fail(request: StepRequest) -> Exception | None:
        return StepError("bug", retryable=False) if request.step_number == number else None

    executor.fail_with = fail


def failed_jobs(engine: Engine, executor: CountingExecutor, n: int) -> list[str]:
    """n agent3 jobs that failed in step 3, after steps 1 and 2 ran."""
    ids = [f"f{i}" for i in range(n)]
    failing_at(executor, 3)
    for job_id in ids:
        engine.submit(T, job_id, "agent3", workflow_version=1)
    engine.run_until_idle()
    executor.fail_with = None
    assert {engine.job(T, j).status for j in ids} == {JobStatus.FAILED}
    return ids


def completed(engine: Engine, job_id: str, workflow: str = "agent3") -> str:
    engine.submit(T, job_id, workflow, workflow_version=1)
    engine.run_until_idle()
    assert engine.job(T, job_id).status is JobStatus.COMPLETED
    return job_id


def count(engine: Engine, job_id: str, kind: type[Job.Event]) -> int:
    return sum(isinstance(e, kind) for e in engine.store.events(engine.jobs.load(T, job_id).id))


def calls(executor: CountingExecutor, job_id: str, step: int) -> int:
    return executor.calls[f"{T}/{job_id}:step:{step}"]


# ---- acting -------------------------------------------------------------------------------


def test_a_bulk_retry_reopens_the_failed_jobs_and_skips_the_others_with_why(
    engine: Engine, executor: CountingExecutor
) -> None:
    failed = failed_jobs(engine, executor, 3)
    done_job = completed(engine, "ok")

    batch = engine.bulk.bulk(T, "retry", {"workflow_type": "agent3"}, by="ops", reason="fixed")
    engine.run_until_idle()

    assert (batch.applied, batch.skipped, batch.failed, batch.finished) == (3, 1, 0, True)
    [skipped] = [o for o in batch.outcomes if o.outcome is Outcome.SKIPPED]
    assert skipped.job_id == done_job and "completed" in skipped.detail
    for job_id in failed:
        assert engine.job(T, job_id).status is JobStatus.COMPLETED
        assert count(engine, job_id, Job.Retried) == 1
        # The steps recorded before the failure never run again.
        assert (calls(executor, job_id, 1), calls(executor, job_id, 2)) == (1, 1)
        assert engine.verify(T, job_id) is None
    assert count(engine, done_job, Job.Retried) == 0


def test_a_bulk_reset_runs_each_job_again_after_step_n_and_skips_jobs_too_short(
    engine: Engine, executor: CountingExecutor
) -> None:
    long_ones = [completed(engine, "c0"), completed(engine, "c1")]
    short = completed(engine, "s0", workflow="one")

    batch = engine.bulk.bulk(
        T, "reset", {"status": ["completed"]}, {"step": 2}, by="ops", reason="again"
    )
    engine.run_until_idle()

    assert (batch.applied, batch.skipped, batch.finished) == (2, 1, True)
    [skipped] = [o for o in batch.outcomes if o.outcome is Outcome.SKIPPED]
    assert skipped.job_id == short and "step 2" in skipped.detail
    for job_id in long_ones:
        assert engine.job(T, job_id).status is JobStatus.COMPLETED
        assert count(engine, job_id, Job.Reset) == 1
        assert (calls(executor, job_id, 1), calls(executor, job_id, 2)) == (1, 1)
        assert engine.verify(T, job_id) is None
    assert count(engine, short, Job.Reset) == 0


def test_a_bulk_retry_to_a_version_moves_the_jobs_where_replay_is_the_same(
    engine: Engine, executor: CountingExecutor
) -> None:
    [job_id] = failed_jobs(engine, executor, 1)
    moved = engine.bulk.bulk(
        T, "retry", {"status": ["failed"]}, {"to_version": 2}, by="ops", reason="v2"
    )
    assert moved.applied == 1
    engine.run_until_idle()
    view = engine.job(T, job_id)
    assert (view.status, view.workflow_version) == (JobStatus.COMPLETED, 2)


def test_a_repair_replay_refuses_is_skipped_with_the_divergence(
    engine: Engine, executor: CountingExecutor
) -> None:
    [job_id] = failed_jobs(engine, executor, 1)
    refused = engine.bulk.bulk(
        T, "retry", {"status": ["failed"]}, {"to_version": 3}, by="ops", reason="v3"
    )
    [outcome] = refused.outcomes
    assert outcome.outcome is Outcome.SKIPPED and "diverges" in outcome.detail
    assert engine.job(T, job_id).status is JobStatus.FAILED


def test_a_version_the_jobs_workflow_lacks_is_skipped_naming_it(
    engine: Engine, executor: CountingExecutor
) -> None:
    [failed] = failed_jobs(engine, executor, 1)
    done = completed(engine, "c0")
    retried = engine.bulk.bulk(
        T, "retry", {"job_ids": [failed]}, {"to_version": 9}, by="o", reason="r"
    )
    reset = engine.bulk.bulk(
        T, "reset", {"job_ids": [done]}, {"step": 1, "to_version": 9}, by="o", reason="r"
    )
    for batch in (retried, reset):
        [outcome] = batch.outcomes
        assert (
            outcome.outcome is Outcome.SKIPPED and "unknown workflow 'agent3' v9" in outcome.detail
        )
    assert engine.job(T, failed).status is JobStatus.FAILED
    assert count(engine, done, Job.Reset) == 0


@pytest.mark.parametrize(
    ("action", "params", "message"),
    [
        ("reset", {}, "reset needs step"),
        ("reset", {"step": -1}, "reset needs step"),
        ("reset", {"step": "2"}, "reset needs step"),
        ("reset", {"step": True}, "reset needs step"),
        ("reset", {"step": 1, "to_version": 0}, "reset takes to_version as a version >= 1"),
        ("retry", {"to_version": "2"}, "retry takes to_version as a version >= 1"),
        ("retry", {"step": 1}, "retry takes no parameter step"),
        ("reset", {"step": 1, "force": True}, "reset takes no parameter force"),
    ],
)
def test_bad_parameters_are_refused_by_name_and_write_nothing(
    engine: Engine, executor: CountingExecutor, action: str, params: dict[str, object], message: str
) -> None:
    [job_id] = failed_jobs(engine, executor, 1)
    before = len(engine.store.events(engine.jobs.load(T, job_id).id))
    with pytest.raises(InvalidPayloadError, match=message):
        engine.bulk.preview(T, action, {"status": ["failed"]}, params)
    with pytest.raises(InvalidPayloadError, match=message):
        engine.bulk.start(T, action, {"status": ["failed"]}, params, by="o", reason="r")
    assert engine.bulk.batches(T) == []
    assert len(engine.store.events(engine.jobs.load(T, job_id).id)) == before


# ---- crash safety ---------------------------------------------------------------------------


class Crash(BaseException):
    """The process dies here: not an Exception, so nothing on the way catches it."""


class DiesAtRepair(StoreAround):
    """Dies the ``nth`` time a write point of the batch is reached: ``before`` (the job's
    repair event not written), ``after`` (written, its outcome not), ``outcome-before``
    (the repair written, its outcome not), ``outcome-after`` (the outcome written, the
    next job not repaired)."""

    def __init__(self, inner: JobStore, kind: type[Job.Event], point: str, nth: int) -> None:
        super().__init__(inner)
        self.kind, self.point, self.left = kind, point, nth

    def _reached(self, point: str) -> None:
        if point == self.point:
            self.left -= 1
            if self.left == 0:
                raise Crash(point)

    def append(self, job: Job, *keys: ConsumedKey) -> None:
        repaired = any(isinstance(e, self.kind) for e in job.pending_events)
        if repaired:
            self._reached("before")
        self.inner.append(job, *keys)
        if repaired:
            self._reached("after")

    def append_batch(self, batch: Batch) -> None:
        outcome = any(isinstance(e, Batch.JobDone) for e in batch.pending_events)
        if outcome:
            self._reached("outcome-before")
        self.inner.append_batch(batch)
        if outcome:
            self._reached("outcome-after")


def repairable(engine: Engine, executor: CountingExecutor, action: str) -> list[str]:
    if action == "retry":
        return failed_jobs(engine, executor, 4)
    return [completed(engine, f"c{i}") for i in range(4)]


def params_of(action: str) -> dict[str, int]:
    return {"step": 1} if action == "reset" else {}


def requeue(engine: Engine, job_ids: list[str]) -> None:
    """What the reconciler does for a job reopened by a process that died before putting
    it back on the queue."""
    for job_id in job_ids:
        engine.tick(T, job_id, "reconcile")
    engine.run_until_idle()


# Where the second job's run dies: (outcomes recorded, repairs written) at the crash.
LEFT = {"before": (1, 1), "after": (1, 2), "outcome-before": (1, 2), "outcome-after": (2, 2)}


@pytest.mark.parametrize("point", list(LEFT))
@pytest.mark.parametrize("action", ["retry", "reset"])
def test_a_batch_that_dies_at_a_jobs_repair_resumes_and_repairs_each_job_once(
    make_engine: EngineFactory, executor: CountingExecutor, action: str, point: str
) -> None:
    engine = make_engine(registry=registry())
    jobs = repairable(engine, executor, action)
    query = {"workflow_type": "agent3"}
    started = engine.bulk.start(T, action, query, params_of(action), by="ops", reason="x")
    kind = REPAIRS[action]
    dying = make_engine(
        registry=registry(), wrap_store=lambda store: DiesAtRepair(store, kind, point, 2)
    )
    with pytest.raises(Crash):
        dying.bulk.run(T, started.batch_id)
    dead = engine.bulk.batch(T, started.batch_id)
    outcomes, repairs = LEFT[point]
    assert (dead.done, dead.finished) == (outcomes, False)
    assert sum(count(engine, j, kind) for j in jobs) == repairs

    fresh = make_engine(registry=registry())
    resumed = fresh.bulk.run(T, started.batch_id)
    assert {fresh.job(T, j).status for j in jobs} == {JobStatus.QUEUED}
    requeue(fresh, jobs)

    assert (resumed.applied, resumed.skipped, resumed.failed, resumed.finished) == (4, 0, 0, True)
    assert fresh.bulk.unfinished() == []
    for job_id in jobs:
        assert count(fresh, job_id, kind) == 1  # repaired exactly once by the batch
        assert fresh.job(T, job_id).status is JobStatus.COMPLETED
        recorded = Counter(
            e.idempotency_key
            for e in fresh.store.events(fresh.jobs.load(T, job_id).id)
            if isinstance(e, Job.StepRecorded)
        )
        assert set(recorded.values()) == {1}, recorded  # no step key recorded twice
        assert calls(executor, job_id, 1) == 1  # the step kept never ran again


def test_kill_9_mid_bulk_retry_then_resume_retries_each_job_once(
    make_engine: EngineFactory, executor: CountingExecutor, store_url: str, tmp_path: Path
) -> None:
    engine = make_engine(registry=registry())
    failed = failed_jobs(engine, executor, 5)
    started = engine.bulk.start(T, "retry", {"status": ["failed"]}, by="ops", reason="fixed")
    marker = tmp_path / "at-the-crash-point"
    process = subprocess.Popen(
        [*WORKER, store_url, T, started.batch_id, str(marker)],
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
    assert (dead.done, dead.finished) == (2, False)  # the third job retried, not recorded
    assert sum(count(engine, j, Job.Retried) for j in failed) == 3

    fresh = make_engine(registry=registry())
    resumed = fresh.bulk.run(T, started.batch_id)
    requeue(fresh, failed)

    assert (resumed.applied, resumed.finished) == (5, True)
    assert [count(fresh, j, Job.Retried) for j in failed] == [1] * 5
    assert {fresh.job(T, j).status for j in failed} == {JobStatus.COMPLETED}
