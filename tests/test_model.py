"""A stateful model test: random interleavings of ticks, crashes, re-deliveries and time.

Several workers (engines on one store, sharing a clock, a queue and the outside world the
executor acts on) drive a few jobs of a multi-step agent workflow. After every rule the
store is read back and checked against a reference fold of the workflow definition:

* versions are contiguous, the chain verifies, and history is append-only (every earlier
  event is still there with the same hash);
* steps are recorded in order 1..current_step, each under its own key, exactly once, and
  each with the step type and next status the definition gives;
* the job's status, step, state and cost are what the reference fold of its events says;
* a side effect runs only for the next unrecorded step of a job, only while its worker
  holds a live claim, and never again once the step is recorded;
* a tick on a job nobody may claim writes nothing; a clean tick on a claimable job
  always makes progress; no job ever fails (every injected failure is retryable within
  its policy) and nothing is ever rejected.

At teardown every job is driven to completion and each step key is recorded exactly once.
"""

from __future__ import annotations

import shutil
import tempfile
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any, ClassVar

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule, run_state_machine_as_test

from jobledger import (
    Engine,
    EngineConfig,
    FunctionRegistry,
    JobStatus,
    Outcome,
    Resolution,
    RetryPolicy,
    StepError,
    StepRequest,
    StepResult,
    Tick,
    linear_workflow,
)
from jobledger.adapters.clock import FakeClock
from jobledger.adapters.event_store import EventSourcedJobStore
from jobledger.adapters.local_queue import LocalQueue
from jobledger.adapters.ops import MemoryOps
from jobledger.domain.identity import job_uuid, step_key
from jobledger.domain.job import Job
from jobledger.domain.keys import ConsumedKey
from jobledger.orchestration.orchestrator import TickReport
from jobledger.orchestration.ports import JobStore
from tests.support.engines import StoreWrapper
from tests.support.engines import open_engine as build_engine
from tests.support.services import POSTGRES_URL, REQUIRE_SERVICES, fresh_schema_url

LEASE = timedelta(seconds=60)
STEP_COST = Decimal("0.01")
FLAKY = "fail_first_calls"
"""Resolution param: the executor raises a retryable StepError on this many first calls."""

AGENT = "run_interaction_task"
FLOW: tuple[Resolution, ...] = (
    Resolution(AGENT, JobStatus.QUEUED),
    Resolution(AGENT, JobStatus.QUEUED, params={FLAKY: 1}),
    Resolution("pause", JobStatus.WAITING_TIME, resume_delay_ms=500),  # continues inline
    Resolution(AGENT, JobStatus.QUEUED),
    Resolution("wait", JobStatus.WAITING_TIME, resume_delay_ms=120_000),  # a queued timer
    Resolution(
        AGENT,
        JobStatus.QUEUED,
        params={FLAKY: 2},
        retry_policy=RetryPolicy(max_attempts=3, initial_backoff_ms=5_000),
    ),
    Resolution("complete", JobStatus.COMPLETED),
)
SHORT: tuple[Resolution, ...] = (
    Resolution(AGENT, JobStatus.QUEUED, params={FLAKY: 1}),
    Resolution("complete", JobStatus.COMPLETED),
)
WORKFLOWS = {"flow": FLOW, "short": SHORT}


@dataclass(frozen=True)
class JobRef:
    tenant_id: str
    job_id: str
    workflow: str

    @property
    def steps(self) -> tuple[Resolution, ...]:
        return WORKFLOWS[self.workflow]

    def __repr__(self) -> str:
        return f"{self.tenant_id}/{self.job_id}"


# The same job id under two tenants: they must never see each other.
JOBS = (JobRef("t1", "a", "flow"), JobRef("t1", "b", "flow"), JobRef("t2", "a", "short"))

# Workers differ in step budget, cache and snapshot interval, so every load path is used.
WORKER_CONFIGS: tuple[dict[str, Any], ...] = (
    {"max_steps_per_tick": 10, "cache_size": 100, "snapshot_interval": 100},
    {"max_steps_per_tick": 2, "cache_size": 0, "snapshot_interval": 5},
    {"max_steps_per_tick": 1, "cache_size": 100, "snapshot_interval": 3},
)


def model_registry() -> FunctionRegistry:
    registry = FunctionRegistry()
    for name, steps in WORKFLOWS.items():
        registry.register(name, 1, linear_workflow(list(steps)))
    return registry


class WorkerCrash(BaseException):
    """The worker process dies here. Not an Exception: nothing in the engine may catch it."""


# ---- the outside world and the crashable parts of a worker ------------------------------


@dataclass
class World:
    """What the side effects touch, shared by every worker: it outlives their crashes."""

    clock: FakeClock
    observer: EventSourcedJobStore
    calls: Counter[str] = field(default_factory=Counter)
    """Side effects run, by tenant and idempotency key (two tenants may share a job id)."""
    hooks: dict[tuple[str, str], Callable[[], None]] = field(default_factory=dict)
    violations: list[str] = field(default_factory=list)


class WorldExecutor:
    """Counts each side effect by key and checks, at the moment it runs, that it may."""

    def __init__(self, world: World) -> None:
        self.world = world

    def execute(self, request: StepRequest) -> StepResult:
        world = self.world
        key = request.idempotency_key  # unique across tenants: no tenant needed beside it
        world.calls[key] += 1
        self.check_may_run(request, key)
        hook = world.hooks.pop((request.job.tenant_id, request.job.job_id), None)
        if hook is not None:
            hook()
        if world.calls[key] <= request.resolution.params.get(FLAKY, 0):
            raise StepError(f"transient failure #{world.calls[key]}", retryable=True)
        return StepResult(
            output={"step": request.step_number},
            state_patch={f"s{request.step_number}": True},
            cost_usd=STEP_COST,
        )

    def check_may_run(self, request: StepRequest, key: str) -> None:
        """Only the next unrecorded step, only under a live claim of the calling worker."""
        world = self.world
        stored = world.observer.load(job_uuid(request.job.tenant_id, request.job.job_id))
        if stored is None:
            world.violations.append(f"{key} ran for a job the store does not hold")
            return
        if stored.current_step + 1 != request.step_number:
            world.violations.append(
                f"{key} ran while the store is at step {stored.current_step} "
                f"(call #{world.calls[key]})"
            )
        now = world.clock.now()
        if (
            stored.status is not JobStatus.RUNNING
            or stored.worker_id != request.job.worker_id
            or stored.lease_until is None
            or stored.lease_until <= now
        ):
            world.violations.append(
                f"{key} ran without a live claim: store has {stored.status} "
                f"worker={stored.worker_id} lease_until={stored.lease_until}, "
                f"caller={request.job.worker_id}, now={now}"
            )


class CrashingStore:
    """The worker's view of the store; can be armed to die right after the n-th append."""

    def __init__(self, inner: JobStore) -> None:
        self.inner = inner
        self.crash_after: int | None = None

    def __getattr__(self, name: str) -> Any:
        """Every other port method is the real store's."""
        return getattr(self.inner, name)

    def append(self, job: Job, *keys: ConsumedKey) -> None:
        self.inner.append(job, *keys)
        if self.crash_after is not None:
            self.crash_after -= 1
            if self.crash_after == 0:
                self.crash_after = None
                raise WorkerCrash("died right after a successful append")


@dataclass
class Worker:
    engine: Engine
    store: CrashingStore


# ---- the reference model ------------------------------------------------------------------


@dataclass
class Expected:
    """What a job's events say it must be, folded by the test from the definition."""

    status: JobStatus
    current_step: int
    state: dict[str, Any]
    cost: Decimal


def reference_fold(ref: JobRef, events: list[Job.Event]) -> Expected:
    """Fold the events by the model's own rules, checking that each was allowed."""
    assert events, f"{ref}: no events"
    first = events[0]
    assert isinstance(first, Job.Submitted), f"{ref}: starts with {type(first).__name__}"
    assert (first.tenant_id, first.job_id, first.workflow_type) == (
        ref.tenant_id,
        ref.job_id,
        ref.workflow,
    )
    status, step, state, cost = JobStatus.QUEUED, 0, dict(first.state), Decimal(0)
    claimed_by: str | None = None
    lease_until: datetime | None = None
    resume_at: datetime | None = None
    for event in events[1:]:
        name = f"{ref} v{event.originator_version} {type(event).__name__}"
        assert not status.is_terminal, f"{name} after the job was {status}"
        if isinstance(event, Job.Claimed):
            assert (
                status is JobStatus.QUEUED
                or (
                    status is JobStatus.WAITING_TIME
                    and (resume_at is None or resume_at <= event.timestamp)
                )
                or (
                    status is JobStatus.RUNNING
                    and lease_until is not None
                    and lease_until <= event.timestamp
                )
            ), f"{name}: claimed a {status} job that was not claimable"
            status, claimed_by, lease_until = JobStatus.RUNNING, event.worker_id, event.lease_until
            resume_at = None
        elif isinstance(event, Job.StepRecorded):
            step += 1
            assert event.step_number == step, f"{name}: step {event.step_number}, want {step}"
            assert event.idempotency_key == step_key(ref.tenant_id, ref.job_id, step), name
            definition = ref.steps[step - 1]
            assert event.step_type == definition.step_type, name
            assert event.next_status == str(definition.next_status), name
            if definition.has_side_effect:
                assert status is JobStatus.RUNNING, f"{name}: side effect without a claim"
                assert event.worker_id == claimed_by, f"{name}: recorded by a non-holder"
                state[f"s{step}"] = True
                cost += STEP_COST
            status, claimed_by, lease_until = definition.next_status, None, None
            resume_at = event.resume_at
            if event.claim_id is not None:
                # The continuation claim, folded into the step: the job it left queued
                # (claimable) is claimed in the same event.
                assert status is JobStatus.QUEUED, f"{name}: a claim folded into a {status}"
                assert event.lease_until is not None, name
                status, claimed_by, lease_until = (
                    JobStatus.RUNNING,
                    event.claimed_by,
                    event.lease_until,
                )
                resume_at = None
        elif isinstance(event, Job.RetryScheduled):
            assert status is JobStatus.RUNNING, f"{name}: a retry without a claim"
            assert event.step_number == step + 1, name
            flaky = ref.steps[step].params.get(FLAKY, 0)
            assert 1 <= event.attempt <= flaky, f"{name}: attempt {event.attempt} of {flaky}"
            status, claimed_by, lease_until = JobStatus.WAITING_TIME, None, None
            resume_at = event.resume_at
        else:
            raise AssertionError(f"{name}: not expected in this model")
    return Expected(status, step, state, cost)


# ---- stores, one fresh store per example ------------------------------------------------


@contextmanager
def fresh_store(backend: str) -> Iterator[str]:
    if backend == "sqlite":
        directory = tempfile.mkdtemp(prefix="jobledger-model-")
        try:
            yield f"sqlite:///{directory}/jobs.db"
        finally:
            shutil.rmtree(directory, ignore_errors=True)
        return
    assert POSTGRES_URL
    with fresh_schema_url(POSTGRES_URL, "m_") as url:
        yield url


# ---- the machine --------------------------------------------------------------------------

CLOCK_STEPS = (
    timedelta(seconds=1),
    timedelta(seconds=10),
    LEASE + timedelta(seconds=1),
    timedelta(minutes=3),
    timedelta(hours=2),
)
TICK_WAITS = (timedelta(0), timedelta(0), timedelta(seconds=10), LEASE + timedelta(seconds=1))
workers = st.integers(min_value=0, max_value=len(WORKER_CONFIGS) - 1)
jobs = st.sampled_from(JOBS)


class LedgerMachine(RuleBasedStateMachine):
    backend: ClassVar[str] = "sqlite"

    def __init__(self) -> None:
        super().__init__()
        self._store_context = fresh_store(self.backend)
        self.url = self._store_context.__enter__()
        self.clock = FakeClock()
        self.ops = MemoryOps()
        self.queue = LocalQueue(self.clock)
        # Reads for the checks go through an engine with no cache, straight to the store.
        self.observer_engine = self.open_engine("observer", {"cache_size": 0}, executor=None)
        observer = self.observer_engine.store
        assert isinstance(observer, EventSourcedJobStore)
        self.world = World(self.clock, observer)
        self.workers = [self.open_worker(i) for i in range(len(WORKER_CONFIGS))]
        self.delivered: list[Tick] = []
        self.seen_hashes: dict[JobRef, list[str]] = {}
        self.recorded_calls: dict[str, int] = {}
        for ref in JOBS:
            self.workers[0].engine.submit(ref.tenant_id, ref.job_id, ref.workflow, input={"n": 1})

    # ---- plumbing ---------------------------------------------------------------------

    def open_engine(
        self,
        worker_id: str,
        overrides: dict[str, Any],
        executor: WorldExecutor | None,
        wrap_store: StoreWrapper | None = None,
    ) -> Engine:
        config = EngineConfig(
            store_url=self.url,
            worker_id=worker_id,
            lease_ms=int(LEASE.total_seconds() * 1000),
            **overrides,
        )
        return build_engine(
            wrap_store=wrap_store,
            registry=model_registry(),
            executor=executor,
            clock=self.clock,
            queue=self.queue,
            ops=self.ops,
            config=config,
        )

    def open_worker(self, index: int) -> Worker:
        engine = self.open_engine(
            f"w{index}", WORKER_CONFIGS[index], WorldExecutor(self.world), wrap_store=CrashingStore
        )
        assert isinstance(engine.store, CrashingStore)
        assert isinstance(engine.store.inner, EventSourcedJobStore)
        return Worker(engine, engine.store)

    def restart(self, index: int) -> None:
        """A crashed worker comes back as a new process: nothing in memory survives."""
        self.workers[index].engine.close()
        self.workers[index] = self.open_worker(index)

    def stored(self, ref: JobRef) -> Job:
        job = self.world.observer.load(job_uuid(ref.tenant_id, ref.job_id))
        assert job is not None, f"{ref} vanished"
        return job

    def events(self, ref: JobRef) -> list[Job.Event]:
        return self.world.observer.events(job_uuid(ref.tenant_id, ref.job_id))

    def crashing_tick(self, index: int, tick: Tick, restart: bool) -> TickReport | None:
        try:
            return self.workers[index].engine.tick(tick.tenant_id, tick.job_id, tick.reason)
        except WorkerCrash:
            if restart:
                self.restart(index)
            return None
        finally:
            self.world.hooks.pop((tick.tenant_id, tick.job_id), None)
            self.workers[index].store.crash_after = None

    # ---- rules ------------------------------------------------------------------------

    @rule(worker=workers, ref=jobs, wait=st.sampled_from(TICK_WAITS))
    def tick(self, worker: int, ref: JobRef, wait: timedelta) -> None:
        """A clean tick (after some time passed): nothing crashes, nobody else runs. It
        moves a claimable job on, and leaves a job nobody may claim exactly as it was."""
        self.clock.advance(wait)
        before = self.stored(ref)
        calls_before = sum(self.world.calls.values())
        claimable = before.is_claimable(self.clock.now())

        report = self.workers[worker].engine.tick(ref.tenant_id, ref.job_id, "queue")

        after = self.stored(ref)
        assert (report.version, report.status) == (after.version, after.status)
        if claimable:
            assert report.outcome in (Outcome.ADVANCED, Outcome.RETRY_SCHEDULED), report
            assert after.version > before.version, f"a clean tick of claimable {ref} stalled"
        else:
            assert report.outcome in (Outcome.IDLE, Outcome.CLAIM_LOST), report
            assert after.version == before.version, f"a tick of unclaimable {ref} wrote"
            assert sum(self.world.calls.values()) == calls_before

    @rule(worker=workers)
    def deliver_from_queue(self, worker: int) -> None:
        """The queue hands its next due tick to some worker."""
        tick = self.queue.pop_due()
        if tick is None:
            return
        self.delivered.append(tick)
        self.workers[worker].engine.handle(tick)

    @rule(worker=workers, pick=st.integers(min_value=0))
    def redeliver(self, worker: int, pick: int) -> None:
        """At-least-once delivery: a tick already handled arrives again, anywhere."""
        if not self.delivered:
            return
        tick = self.delivered[pick % len(self.delivered)]
        self.workers[worker].engine.handle(Tick(tick.tenant_id, tick.job_id, "redelivery"))

    @rule(worker=workers, ref=jobs, restart=st.booleans())
    def crash_during_side_effect(self, worker: int, ref: JobRef, restart: bool) -> None:
        """The worker dies inside its next side effect (after the call was counted)."""

        def die() -> None:
            raise WorkerCrash("died during the side effect")

        self.world.hooks[(ref.tenant_id, ref.job_id)] = die
        self.crashing_tick(worker, Tick(ref.tenant_id, ref.job_id, "queue"), restart)

    @rule(
        worker=workers,
        ref=jobs,
        after_appends=st.integers(min_value=1, max_value=3),
        restart=st.booleans(),
    )
    def crash_after_record(
        self, worker: int, ref: JobRef, after_appends: int, restart: bool
    ) -> None:
        """The worker dies right after its n-th append of a tick committed."""
        self.workers[worker].store.crash_after = after_appends
        self.crashing_tick(worker, Tick(ref.tenant_id, ref.job_id, "queue"), restart)

    @rule(first=workers, second=workers, ref=jobs, lease_lapses=st.booleans())
    def concurrent_tick_during_side_effect(
        self, first: int, second: int, ref: JobRef, lease_lapses: bool
    ) -> None:
        """While the first worker's side effect runs, a second ticks the same job; if the
        first stalls past its lease the second takes over and the first must lose."""
        seen: list[tuple[int, TickReport]] = []

        def interleave() -> None:
            version = self.stored(ref).version
            if lease_lapses:
                self.clock.advance(LEASE + timedelta(seconds=1))
            seen.append((version, self.workers[second].engine.tick(ref.tenant_id, ref.job_id)))

        self.world.hooks[(ref.tenant_id, ref.job_id)] = interleave
        report = self.crashing_tick(first, Tick(ref.tenant_id, ref.job_id, "queue"), False)
        assert report is not None
        if not seen:
            return  # the first worker ran no side effect this tick
        version_before, inner = seen[0]
        if not lease_lapses:
            assert inner.outcome is Outcome.CLAIM_LOST, inner
            assert inner.version == version_before
        elif inner.version > version_before:
            lost = (Outcome.DISCARDED, Outcome.DUPLICATE_SKIPPED, Outcome.CLAIM_LOST)
            assert report.outcome in lost, f"stalled worker was not refused: {report}"

    @rule(delta=st.sampled_from(CLOCK_STEPS))
    def advance_clock(self, delta: timedelta) -> None:
        """Time passes: within a lease, past one, past the timers, far past everything."""
        self.clock.advance(delta)

    @rule(worker=workers, ref=jobs)
    def resubmit(self, worker: int, ref: JobRef) -> None:
        """A client retries its submit: it gets the job back and nothing is written."""
        version = self.stored(ref).version
        view = self.workers[worker].engine.submit(
            ref.tenant_id, ref.job_id, ref.workflow, input={"n": 1}
        )
        assert (view.job_id, view.tenant_id) == (ref.job_id, ref.tenant_id)
        assert self.stored(ref).version == version

    @rule(worker=workers)
    def restart_worker(self, worker: int) -> None:
        self.restart(worker)

    # ---- invariants -------------------------------------------------------------------

    @invariant()
    def the_ledger_is_consistent(self) -> None:
        assert not self.world.violations, self.world.violations
        for ref in JOBS:
            self.check_job(ref)
        rejected = [e for e in self.ops.events if e.eventType == "job.tick.rejected"]
        assert not rejected, [e.metadata for e in rejected]

    def check_job(self, ref: JobRef) -> None:
        events = self.events(ref)
        versions = [event.originator_version for event in events]
        assert versions == list(range(1, len(events) + 1)), f"{ref}: versions {versions}"
        hashes = [event.chain_hash for event in events]
        seen = self.seen_hashes.get(ref, [])
        assert hashes[: len(seen)] == seen, f"{ref}: history was rewritten"
        self.seen_hashes[ref] = hashes
        assert self.observer_engine.verify(ref.tenant_id, ref.job_id) is None

        expected = reference_fold(ref, events)
        job = self.stored(ref)
        assert job.status is expected.status, f"{ref}: {job.status}, model {expected.status}"
        assert job.current_step == expected.current_step
        assert job.state == expected.state
        assert job.total_cost_usd == expected.cost
        assert job.status is not JobStatus.FAILED, job.last_error
        assert (job.status is JobStatus.COMPLETED) == (job.current_step == len(ref.steps))

        for number, definition in enumerate(ref.steps, start=1):
            key = step_key(ref.tenant_id, ref.job_id, number)
            calls = self.world.calls[key]
            if not definition.has_side_effect:
                assert calls == 0, f"{key} is not a side effect but ran"
            if number <= job.current_step:
                if definition.has_side_effect:
                    assert calls >= 1, f"{key} recorded without running"
                first_seen = self.recorded_calls.setdefault(key, calls)
                assert calls == first_seen, f"{key} ran again after it was recorded"
            elif number > job.current_step + 1:
                assert calls == 0, f"{key} ran ahead of step {job.current_step + 1}"

    # ---- teardown: everything finishes --------------------------------------------------

    def teardown(self) -> None:
        try:
            self.world.hooks.clear()
            for worker in self.workers:
                worker.store.crash_after = None
            for ref in JOBS:
                self.finish(ref)
            self.the_ledger_is_consistent()
        finally:
            for worker in self.workers:
                with suppress(Exception):
                    worker.engine.close()
            with suppress(Exception):
                self.observer_engine.close()
            self._store_context.__exit__(None, None, None)

    def finish(self, ref: JobRef) -> None:
        engine = self.workers[0].engine
        for _ in range(4 * len(ref.steps)):
            if self.stored(ref).status is JobStatus.COMPLETED:
                break
            self.clock.advance(max(LEASE, timedelta(minutes=3)))
            engine.tick(ref.tenant_id, ref.job_id, "drain")
        job = self.stored(ref)
        assert job.status is JobStatus.COMPLETED, f"{ref} is {job.status}: {job.last_error}"
        keys = [e.idempotency_key for e in self.events(ref) if isinstance(e, Job.StepRecorded)]
        assert keys == [
            step_key(ref.tenant_id, ref.job_id, n) for n in range(1, len(ref.steps) + 1)
        ]


# ---- the tests ----------------------------------------------------------------------------

MODEL_SETTINGS = {"sqlite": (30, 30), "postgres": (12, 30)}
"""Per backend: (examples, steps per example), sized to keep the whole file well under 60 s."""


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
def test_random_interleavings_keep_every_guarantee(backend: str) -> None:
    if backend == "postgres" and not POSTGRES_URL:
        if REQUIRE_SERVICES:
            pytest.fail("JOBLEDGER_TEST_POSTGRES_URL is not set but services are required")
        pytest.skip("PostgreSQL not configured (set JOBLEDGER_TEST_POSTGRES_URL)")
    examples, steps = MODEL_SETTINGS[backend]
    machine = type(f"LedgerMachine_{backend}", (LedgerMachine,), {"backend": backend})
    run_state_machine_as_test(
        machine,
        settings=settings(
            max_examples=examples,
            stateful_step_count=steps,
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
        ),
    )
