"""Leases kept alive by a heartbeat: a live long step is never stolen, a lapsed one is taken
over, and a heartbeat racing a take-over leaves exactly one owner.

(The SIGKILL case, a dead worker's job finished within 30 s on the default lease, is in
tests/test_crash_safety.py beside the other kill -9 tests.)
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from datetime import timedelta
from uuid import UUID

import pytest

from jobledger import (
    Engine,
    FunctionRegistry,
    JobStatus,
    Outcome,
    StepRequest,
    StepResult,
    linear_workflow,
)
from jobledger.adapters.clock import FakeClock, SystemClock
from jobledger.adapters.event_store import EventSourcedJobStore
from jobledger.adapters.leases import LeaseTable
from jobledger.adapters.local_queue import LocalQueue
from jobledger.adapters.locks import lock_for
from jobledger.adapters.ops import MemoryOps
from jobledger.audit.errors import MigrationRefusedError
from jobledger.domain.identity import job_uuid, step_key
from jobledger.domain.job import Job
from jobledger.orchestration.ports import Lease
from jobledger.orchestration.reconciler import Reconciler
from jobledger.projections import JobViews
from tests.support.engines import CountingExecutor, EngineFactory, agent_steps, default_registry

TENANT = "lease-tenant"
JOB = "job-1"


def one_long_step() -> FunctionRegistry:
    registry = FunctionRegistry()
    registry.register("long1", 1, linear_workflow(agent_steps(1)))
    return registry


class BlockingExecutor(CountingExecutor):
    """Counts every side effect; the first call blocks until released (a long step)."""

    def __init__(self, seconds: float | None = None) -> None:
        super().__init__()
        self.seconds = seconds
        self.entered = threading.Event()
        self.release = threading.Event()
        self.workers: list[str | None] = []

    def execute(self, request: StepRequest) -> StepResult:
        first = not self.entered.is_set()
        self.workers.append(request.job.worker_id)
        self.entered.set()
        if first:
            self.release.wait(self.seconds)
        return super().execute(request)


def leases_of(engine: Engine) -> LeaseTable:
    assert isinstance(engine.store, EventSourcedJobStore)
    return engine.store.leases


def claims(engine: Engine, job_id: str = JOB) -> list[str]:
    """The workers of the job's claims, in order: its Claimed events and the claims
    folded into a continuing step or a resume (``claimed_by``)."""
    found = []
    for entry in engine.history(TENANT, job_id):
        if entry.event_type == "Claimed":
            found.append(entry.data["worker_id"])
        elif entry.data.get("claimed_by") is not None:
            found.append(entry.data["claimed_by"])
    return found


# ---- (a) a live long step is never stolen ------------------------------------------------


@pytest.mark.slow
def test_a_live_step_longer_than_several_leases_is_never_stolen(make_engine: EngineFactory) -> None:
    """A 2 s step on a 0.6 s lease, while another engine ticks the job every 50 ms: the
    heartbeat keeps the claim, the other engine stands aside every time, and the side
    effect runs once."""
    lease_ms = 600
    ops = MemoryOps()
    executor = BlockingExecutor(seconds=2.0)
    config = {"lease_ms": lease_ms}
    owner, other = (
        make_engine(
            registry=one_long_step(),
            executor=executor,
            clock=SystemClock(),
            ops=ops,
            config=config,
        )
        for _ in range(2)
    )
    owner.submit(TENANT, JOB, "long1")
    reports = []
    running = threading.Thread(target=lambda: reports.append(owner.tick(TENANT, JOB)))
    running.start()
    assert executor.entered.wait(10)
    outcomes: Counter[Outcome] = Counter()
    while running.is_alive():
        outcomes[other.tick(TENANT, JOB).outcome] += 1
        time.sleep(0.05)
    running.join()

    assert reports[0].outcome is Outcome.ADVANCED
    assert owner.job(TENANT, JOB).status is JobStatus.COMPLETED
    assert executor.calls == {step_key(TENANT, JOB, 1): 1}
    assert executor.workers == ["w0"]
    # The other engine really looked while the step ran (well past its first lease) and
    # stood aside every time; the claims on the log are all the owner's.
    assert outcomes[Outcome.CLAIM_LOST] >= 20, outcomes
    assert set(outcomes) <= {Outcome.CLAIM_LOST, Outcome.IDLE}, outcomes
    assert "job.step.recovered" not in ops.types(JOB)
    assert set(claims(owner)) == {"w0"}
    # The heartbeats are a row beside the job, not events in its history.
    row = leases_of(owner).get(job_uuid(TENANT, JOB))
    assert row is not None and row.worker_id == "w0"
    history = [entry.event_type for entry in owner.history(TENANT, JOB)]
    # The continuation claim rides in step 1's record (issue 11: one event per step).
    assert history == ["Submitted", "Claimed", "StepRecorded", "StepRecorded"]


# ---- (c) the take-over race: exactly one owner: tests/contracts/leases.py, run on
# each store's lease table by tests/test_contracts.py


class StalledLeases:
    """The old owner's heartbeat stalls (a paused process, a partition) until released."""

    def __init__(self, inner: LeaseTable) -> None:
        self.inner = inner
        self.called = threading.Event()
        self.release = threading.Event()
        self.results: list[bool] = []

    def renew(self, lease: Lease) -> bool:
        self.called.set()
        self.release.wait(10)
        result = self.inner.renew(lease)
        self.results.append(result)
        return result

    def take_over(self, lease: Lease, *, from_claim: str, now: object) -> Lease | None:
        raise AssertionError("the stalled owner takes nothing over")

    def get(self, job_uuid: UUID) -> Lease | None:
        return self.inner.get(job_uuid)


def test_a_worker_whose_heartbeat_stalled_past_its_lease_loses_to_the_take_over(
    make_engine: EngineFactory, clock: FakeClock
) -> None:
    """The owner is alive but its heartbeat could not land within the lease: a take-over
    wins, the owner's late beat learns it lost, and its late record is not written. One
    owner recorded the step."""
    ops = MemoryOps()
    executor = BlockingExecutor()
    engines = [
        make_engine(registry=one_long_step(), executor=executor, ops=ops, config={"lease_ms": 300})
        for _ in range(2)
    ]
    owner, taker = engines
    assert owner.orchestrator.heartbeats is not None
    stalled = StalledLeases(leases_of(owner))
    owner.orchestrator.heartbeats.leases = stalled
    owner.submit(TENANT, JOB, "long1")
    reports = []
    running = threading.Thread(target=lambda: reports.append(owner.tick(TENANT, JOB)))
    running.start()
    assert executor.entered.wait(10) and stalled.called.wait(10)

    assert taker.tick(TENANT, JOB).outcome is Outcome.CLAIM_LOST  # Claimed lease still live
    clock.advance(timedelta(seconds=1))
    report = taker.tick(TENANT, JOB)
    assert (report.outcome, report.status) == (Outcome.ADVANCED, JobStatus.COMPLETED)

    stalled.release.set()
    deadline = time.monotonic() + 10
    while "job.lease.lost" not in ops.types(JOB) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert stalled.results[0] is False
    executor.release.set()
    running.join()

    assert reports[0].outcome in (Outcome.DUPLICATE_SKIPPED, Outcome.DISCARDED)
    recorded = [
        entry.data["worker_id"]
        for entry in owner.history(TENANT, JOB)
        if entry.event_type == "StepRecorded" and entry.data["step_number"] == 1
    ]
    assert recorded == ["w1"]
    assert claims(owner) == ["w0", "w1", "w1"]
    assert [(e.metadata["workerId"]) for e in ops.events if e.eventType == "job.lease.lost"] == [
        "w0"
    ]
    # The documented at-least-once window: a worker presumed dead may have run it too.
    assert executor.calls == {step_key(TENANT, JOB, 1): 2}


def claimed_by_hand(engine: Engine, clock: FakeClock) -> Job:
    """A job running a step (claim "busy", a 0.3 s Claimed lease) of a worker elsewhere."""
    engine.submit(TENANT, JOB, "agent3")
    job = engine.store.load(job_uuid(TENANT, JOB))
    assert job is not None
    job.claim(
        worker_id="w-busy",
        claim_id="busy",
        lease_until=clock.now() + timedelta(milliseconds=300),
        reason="test",
        now=clock.now(),
    )
    engine.store.append(job)
    return job


def beat(job: Job, clock: FakeClock) -> Lease:
    """The busy worker's heartbeat: its lease for one more second."""
    return Lease(job.id, "busy", "w-busy", job.version, clock.now() + timedelta(seconds=1))


# ---- the reconciler sees the heartbeat -------------------------------------------------------


def test_the_reconciler_leaves_a_running_job_with_a_live_heartbeat_alone(
    make_engine: EngineFactory, clock: FakeClock
) -> None:
    """Past its Claimed lease but with a live lease row of its claim, a running job is not
    due; once the row lapses too (its worker died) it is."""
    engine = make_engine(config={"lease_ms": 300})
    store = engine.store
    assert isinstance(store, EventSourcedJobStore)
    job = claimed_by_hand(engine, clock)
    views = JobViews(store)
    reconciler = Reconciler(
        views=views,
        queue=LocalQueue(clock),
        clock=clock,
        lock=lock_for(store.location, "reconciler"),
        ops=MemoryOps(),
    )
    clock.advance(timedelta(seconds=5))  # far past the Claimed lease
    assert store.leases.renew(beat(job, clock))
    views.catch_up()
    assert reconciler.reconcile().enqueued == 0

    clock.advance(timedelta(seconds=1))  # the heartbeat stopped: the row lapsed
    result = reconciler.reconcile()
    assert (result.scanned, result.enqueued) == (1, 1)


def test_a_job_whose_heartbeat_keeps_its_step_running_is_not_migrated(
    make_engine: EngineFactory, clock: FakeClock
) -> None:
    registry = default_registry()
    engine = make_engine(registry=registry, config={"lease_ms": 300})
    job = claimed_by_hand(engine, clock)
    registry.register("agent3", 2, linear_workflow(agent_steps(3)))
    clock.advance(timedelta(seconds=5))  # far past the Claimed lease
    assert leases_of(engine).renew(beat(job, clock))
    with pytest.raises(MigrationRefusedError, match="running a step"):
        engine.migrate(TENANT, JOB, 2)
    clock.advance(timedelta(seconds=1))  # its worker stopped beating: nothing runs now
    view, _ = engine.migrate(TENANT, JOB, 2)
    assert view.workflow_version == 2


def test_a_running_jobs_view_shows_the_lease_its_heartbeat_keeps(
    make_engine: EngineFactory,
) -> None:
    executor = BlockingExecutor(seconds=1.5)
    owner = make_engine(
        registry=one_long_step(), executor=executor, clock=SystemClock(), config={"lease_ms": 300}
    )
    owner.submit(TENANT, JOB, "long1")
    running = threading.Thread(target=lambda: owner.tick(TENANT, JOB))
    running.start()
    assert executor.entered.wait(10)
    time.sleep(0.6)  # two heartbeats past the claim's own lease
    claimed = [e for e in owner.history(TENANT, JOB) if e.event_type == "Claimed"][-1]
    view = owner.job(TENANT, JOB)
    running.join()
    assert view.status is JobStatus.RUNNING and view.lease_until is not None
    assert view.lease_until > claimed.data["lease_until"]  # the heartbeat's, not the event's
