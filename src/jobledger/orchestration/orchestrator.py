"""The orchestrator: one tick advances one job by as many steps as its budget allows.

Each step is ONE atomic append: the step's record, its full transition and its idempotency
key go to the store together, so there is no window in which a step is recorded but the job
has not moved (the seed's insertStep/finalizeStep crash window does not exist here).

Guarantee, stated honestly: each step is recorded exactly once and never re-run once
recorded; a side effect may run again only if the worker died between running it and
recording it, and then with the same idempotency key.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager, nullcontext, suppress
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from decimal import Decimal, InvalidOperation
from enum import StrEnum
from typing import Any, Protocol
from uuid import uuid4

from jobledger.config import EngineConfig
from jobledger.domain import fan_out, transition
from jobledger.domain.admission import DEFAULT_PRIORITY, Policy, Queued, rank
from jobledger.domain.approval_answers import with_edit
from jobledger.domain.budget import exceeded_limit
from jobledger.domain.errors import (
    DeploymentError,
    DuplicateKeyError,
    InvalidPayloadError,
    NonDeterminismError,
    StepError,
    StoreUnavailableError,
    UnknownJobError,
    VersionConflict,
    WorkflowBodyError,
    WorkflowNotDeployedError,
)
from jobledger.domain.identity import job_uuid
from jobledger.domain.job import Claim, Job
from jobledger.domain.keys import ConsumedKey
from jobledger.domain.payloads import json_object
from jobledger.domain.status import JobStatus
from jobledger.domain.steps import (
    IssuedToken,
    Resolution,
    ResolveRequest,
    RetryPolicy,
    StepRequest,
    StepResult,
)
from jobledger.domain.transition import StepOutcome, Transition
from jobledger.domain.views import JobView
from jobledger.orchestration import tracing
from jobledger.orchestration.child_jobs import Family, Spawner
from jobledger.orchestration.deployment import Deployment
from jobledger.orchestration.group_commit import SharedLoop
from jobledger.orchestration.heartbeat import Heartbeats
from jobledger.orchestration.history import History, LastAppends
from jobledger.orchestration.ports import (
    AdmissionGate,
    ApprovalRequest,
    Clock,
    Cost,
    JobStore,
    Leases,
    Notifier,
    Ops,
    OpsEvent,
    Queue,
    ResumeTokens,
    StepExecutor,
    StepRates,
    Tick,
)
from jobledger.orchestration.tracing import Attributes, Span, Tracer
from jobledger.orchestration.unrecorded import RanStep, UnrecordedSteps

log = logging.getLogger(__name__)


class Outcome(StrEnum):
    """How a tick ended, for callers, tests and queue adapters."""

    ADVANCED = "advanced"
    IDLE = "idle"
    """Nothing to do now: parked, terminal, or a timer not yet due."""
    CLAIM_LOST = "claim_lost"
    """Another worker owns the job right now."""
    DUPLICATE_SKIPPED = "duplicate_skipped"
    DISCARDED = "discarded"
    """The job changed while our step ran; the step's result was not recorded."""
    DEFERRED = "deferred"
    RETRY_SCHEDULED = "retry_scheduled"
    PARKED = "parked"
    """A budget limit was reached; the job waits for a raised budget."""
    FAILED = "failed"
    HELD = "held"
    """Queued, not admitted yet (``jobledger.domain.admission``): its tick comes when it is."""


@dataclass
class TickReport:
    outcome: Outcome
    status: JobStatus
    steps_executed: int
    version: int
    step: int = 0
    """The job's current step when the tick ended."""
    span: Span | None = None
    """The tick's span, ended: its log line carries the span's ids."""
    workflow_type: str = ""
    """The job's: whether the admission gate holds its jobs depends on it."""


NO_ATTRIBUTES: Attributes = {}
"""One empty mapping for the events that carry none (a step makes two)."""
REBASE_ATTEMPTS = 100
"""How often a step's append is rebuilt on inputs that keep landing while it is written."""


class _LostRace(Exception):
    """An append was refused because another writer moved the job first."""

    def __init__(self, outcome: Outcome) -> None:
        super().__init__(outcome)
        self.outcome = outcome


@dataclass
class _Run:
    """Per-tick state: the job as this tick last saw it, the claim the tick holds and how
    many steps it has run."""

    tick: Tick
    job: Job
    claim_id: str
    span: Span
    """The tick's span, or its step's while a step runs: the claim, resolution and append
    events go to it without looking up the current span each time."""
    steps: int = 0
    appended: list[Job.Event] = field(default_factory=list)
    """The events this tick appended, in order, after the last ones the job's previous
    tick here appended: a code workflow's replay reads the newest of them here instead of
    from the store."""


class TickAppends(Protocol):
    """Where a tick's appends go (its claim, its step, a retry or a failure): the store
    itself, or a group commit over it (:class:`orchestration.group_commit.GroupCommitter`), with
    ``JobStore.append``'s promises."""

    def append(self, job: Job, *keys: ConsumedKey) -> None: ...


class Wiring(Protocol):
    """What the orchestrator runs with: ports only (``jobledger.engine.bootstrap.Deps`` is one,
    built by the composition root). Read once, when the orchestrator is made; the
    deployment's registry at each use, so that a reload reaches it."""

    @property
    def store(self) -> JobStore: ...
    @property
    def queue(self) -> Queue: ...
    @property
    def clock(self) -> Clock: ...
    @property
    def ops(self) -> Ops: ...
    @property
    def deployment(self) -> Deployment: ...
    @property
    def executor(self) -> StepExecutor | None: ...
    @property
    def config(self) -> EngineConfig: ...
    @property
    def cost(self) -> Cost | None: ...
    @property
    def tokens(self) -> ResumeTokens | None: ...
    @property
    def notifier(self) -> Notifier | None: ...
    @property
    def leases(self) -> Leases | None: ...
    @property
    def tracer(self) -> Tracer: ...
    @property
    def admission(self) -> AdmissionGate | None: ...
    @property
    def step_rates(self) -> StepRates | None: ...


class Orchestrator:
    def __init__(
        self, wiring: Wiring, *, tick_appends: TickAppends, spawner: Spawner | None
    ) -> None:
        """``tick_appends``: where the ticks' appends go (the store, or a group commit
        over it); ``spawner``: what submits a map step's children (without one a map
        step is a deployment error)."""
        self.store = wiring.store
        self.queue = wiring.queue
        self.clock = wiring.clock
        self.ops = wiring.ops
        self.deployment = wiring.deployment
        self.executor = wiring.executor
        self.config = config = wiring.config
        self.cost = wiring.cost
        self.tokens = wiring.tokens
        self.notifier = wiring.notifier
        self.tracer = wiring.tracer
        self.family = Family(self.store, self.clock, self.report, self._wake, spawner)
        """Parents and children: spawns, child ends, joins (``orchestration.child_jobs``)."""
        self.admission = wiring.admission
        self.step_rates = wiring.step_rates
        self.policy = Policy(config)
        self.tick_appends = tick_appends
        self.unrecorded = UnrecordedSteps()
        """Steps run here whose record the store refused, until their retry records them."""
        self.last_appends = LastAppends(config.store.cache_size)
        """Each job's last tick's appends, for the next tick's replay (as jobs are kept)."""
        self.async_steps = SharedLoop()
        """The loop ``async def`` steps run on, shared by the tick threads."""
        # Without a Leases port a claim is only its Claimed event's lease (no heartbeat).
        leases = wiring.leases
        self.heartbeats = (
            Heartbeats(
                leases, self.clock, self.ops, lease_ms=config.leases.ms, worker_id=config.worker_id
            )
            if leases is not None
            else None
        )

    # ---- the tick, as a list of steps ------------------------------------------------

    def tick(self, tick: Tick) -> TickReport:
        """Advance the job until it parks, finishes, or spends this tick's step budget,
        in a span of the job's trace: the child of the span that enqueued the tick, else
        of the one that submitted the job."""
        job = self.load(tick)
        attributes: Attributes = {
            "jobledger.tenant_id": job.tenant_id,
            "jobledger.job_id": job.job_id,
            "jobledger.workflow.type": job.workflow_type,
            "jobledger.workflow.version": job.workflow_version,
            "jobledger.tick.reason": tick.reason,
            "jobledger.worker_id": self.config.worker_id,
        }
        parent = tick.trace_context or job.trace_context
        with self.tracer.span("jobledger.tick", parent=parent, attributes=attributes) as span:
            with tracing.logged(span, tenant=job.tenant_id, job=job.job_id):
                run = _Run(tick, job, claim_id=tick.claim_id or uuid4().hex, span=span)
                run.appended = self.last_appends.take(job.id)
                report = self._drive(run)
                # A finished child tells its parent now, in the tick that finished it.
                self.family.settle(run.job)
                # Reached only when every append of the tick committed (a refused one
                # reloads run.job): the job's next tick continues from this object.
                self.store.keep(run.job)
                if not run.job.status.is_terminal:
                    self.last_appends.keep(run.job.id, run.appended)
            span.set(
                {
                    "jobledger.outcome": str(report.outcome),
                    "jobledger.tick.steps": report.steps_executed,
                    "jobledger.job.status": str(report.status),
                    "jobledger.job.version": report.version,
                }
            )
        report.span = span
        return report

    def _drive(self, run: _Run) -> TickReport:
        """Take steps until one ends the tick; report the job as the store holds it."""
        tick = run.tick
        try:
            while (outcome := self._advance(run)) is None:
                pass
        except StoreUnavailableError as error:
            error.claim_id = run.claim_id
            raise
        except _LostRace as lost:
            # The in-memory job holds the refused events: report what the store holds.
            outcome = lost.outcome
            run.job = self.load(tick)
        job = run.job
        return TickReport(
            outcome,
            job.status,
            run.steps,
            job.version,
            job.current_step,
            workflow_type=job.workflow_type,
        )

    def _advance(self, run: _Run) -> Outcome | None:
        """One step. Returns an outcome to stop the tick, or None to take another step."""
        job = run.job
        now = self.clock.now()
        if self._past_deadline(job, now):
            return Outcome.FAILED
        if job.is_overdue(now):
            self._check_history(job, run, now)
            self._time_out(job, now)
            return None
        if run.steps == 0 and self._held_for_admission(job, now):
            return Outcome.HELD
        if job.status is JobStatus.WAITING_CHILDREN:
            return self._await_children(run, now)
        if not job.holds_claim(run.claim_id, now) and not job.is_claimable(now):
            return self._stand_aside(job, run, now)
        self._check_pinned(job)
        if self._lease_kept_elsewhere(job, run, now):
            return Outcome.CLAIM_LOST
        if self._park_over_budget(job, now):
            return Outcome.PARKED
        number = job.current_step + 1
        # The job's own attributes are the tick span's: a step span names only its step.
        attributes: Attributes = {
            "jobledger.step.number": number,
            "jobledger.step.idempotency_key": job.step_key(number),
        }
        lost: _LostRace | None = None
        decided: dict[str, tracing.Attribute] = {}
        with self.tracer.span("jobledger.step", attributes=attributes) as span:
            tick_span, run.span = run.span, span
            with tracing.logged(span, step=number):
                try:
                    outcome = self._step(job, run, now, decided)
                except _LostRace as race:  # how the tick ends, not a failed span
                    lost, outcome = race, race.outcome
                finally:
                    run.span = tick_span
            # Set once, at the end: each call costs the SDK a lock and a check per value.
            decided["jobledger.outcome"] = "continued" if outcome is None else str(outcome)
            span.set(decided)
        if lost is not None:
            raise lost
        return outcome

    def _step(
        self, job: Job, run: _Run, now: datetime, decided: dict[str, tracing.Attribute]
    ) -> Outcome | None:
        """Resolve, run and record the job's next step (or end the tick without one);
        what the resolution decided goes in ``decided``, for the step span. A step this
        worker ran but could not record is recorded, not run again."""
        ran = self.unrecorded.take(job, run.claim_id)
        if ran is None:
            resolution = self._resolve(job, run, now)
            if isinstance(resolution, Outcome):
                return resolution
            run.span.event("jobledger.resolution", NO_ATTRIBUTES)
            if resolution.is_costly and self._defer_for_ceiling(job, now):
                return Outcome.DEFERRED
            self._check_deployment(job, resolution)
            if self._refuses_to_spawn(job, resolution):
                return Outcome.FAILED
            self._pace(job)
            if resolution.has_side_effect and not job.holds_claim(run.claim_id, now):
                self._claim(job, run, now)
            ran = RanStep.of(job, run.claim_id, resolution, self._execute(job, run, resolution))
        else:
            self.report(job, "job.step.kept_result", stepNumber=ran.step_number)
        decided["jobledger.step.type"] = ran.resolution.step_type
        decided["jobledger.next_status"] = str(ran.resolution.next_status)
        return self._conclude(job, run, ran)

    def _conclude(self, job: Job, run: _Run, ran: RanStep) -> Outcome | None:
        """Record what the step did: its result, or its error's retry or failure. When
        the store refuses that record after a side effect ran (a full disk), the step is
        kept for the tick's retry (which inherits the claim) to record."""
        resolution = ran.resolution
        try:
            if isinstance(ran.done, Exception):
                return self._step_failed(job, resolution, ran.done)
            if ran.token is None:
                ran.token = self._issue_token(job, resolution)
            self._record(run, resolution, ran.done, ran.token)
        except StoreUnavailableError:
            if resolution.has_side_effect:
                self.unrecorded.keep(job.id, ran)
            raise
        return self._follow_up(run.job, run, resolution, ran.token)

    # ---- loading and standing aside --------------------------------------------------

    def load(self, tick: Tick) -> Job:
        job = self.store.load(job_uuid(tick.tenant_id, tick.job_id))
        if job is None:
            raise UnknownJobError(tick.tenant_id, tick.job_id)
        return job

    def _stand_aside(self, job: Job, run: _Run, now: datetime) -> Outcome:
        """Not ours to run now. A timer (or a wait's timeout) that is not yet due is
        re-armed: if the tick meant to wake it was lost in a crash, this restores it."""
        due = job.due_at
        if due is not None and job.status is not JobStatus.RUNNING:
            self._schedule(job, due, f"resume:{job.version}", now)
            return Outcome.IDLE
        if job.status is JobStatus.RUNNING and job.lease_until is not None:
            # Someone else's live claim: look again when it lapses, in case they died.
            self._schedule(job, job.lease_until, f"lease:{job.version}", now)
            return Outcome.CLAIM_LOST
        return Outcome.IDLE

    # ---- admission and step rates ---------------------------------------------------

    def _held_for_admission(self, job: Job, now: datetime) -> bool:
        """A job that has not started starts only once admitted. One the table does not
        hold (its submit died before entering it, or it was submitted with no gate)
        enters it now, and waits its turn like the others."""
        if self.admission is None:
            return False
        if job.children and job.status is not JobStatus.WAITING_CHILDREN:
            return self._held_after_join(job, now)
        if job.status is not JobStatus.QUEUED or job.current_step:
            return False
        if job.total_steps_executed or not self.policy.gates(job.tenant_id, job.workflow_type):
            return False
        admitted = self.admission.admitted(str(job.id))
        if admitted is None:
            self.start(self.admission.enter(self.queued(job, now), now))
            return True
        return not admitted

    def _held_after_join(self, job: Job, now: datetime) -> bool:
        """A parent lent its place to its children while it waited for them (else a limit
        of one would wait forever); joined, it queues for a place again, keeping its rank,
        before its next step, so the limit holds for its remaining steps too."""
        assert self.admission is not None
        uuid = str(job.id)
        if not self.policy.gates(job.tenant_id, job.workflow_type):
            return False
        if self.admission.lent(uuid):
            admitted = self.admission.requeue(uuid, now)
            self.start(admitted, except_job=uuid)
            return all(queued.job_uuid != uuid for queued in admitted)
        return self.admission.admitted(uuid) is False

    def queued(self, job: Job, now: datetime) -> Queued:
        """The job as the admission table queues it, ranked from ``now``."""
        priority = job.priority if job.priority is not None else DEFAULT_PRIORITY
        return Queued(
            job_uuid=str(job.id),
            tenant_id=job.tenant_id,
            job_id=job.job_id,
            workflow_type=job.workflow_type,
            priority=priority,
            rank=rank(now, priority, self.policy.aging_seconds),
        )

    def start(self, admitted: list[Queued], *, except_job: str | None = None) -> None:
        """Send the first tick of each job a pass admitted (but ``except_job``'s, which
        the caller sends itself)."""
        for queued in admitted:
            if queued.job_uuid == except_job:
                continue
            # No trace context of ours: the tick continues its own job's trace, not the
            # trace of whichever job's end made room for it.
            self.queue.enqueue(
                Tick(queued.tenant_id, queued.job_id, "admitted"), dedupe_key="admitted"
            )
            self.ops.record(
                OpsEvent(
                    jobId=queued.job_id,
                    tenantId=queued.tenant_id,
                    eventType="job.admitted",
                    status=str(JobStatus.QUEUED),
                    metadata={"priority": queued.priority, "workflowType": queued.workflow_type},
                )
            )

    def _pace(self, job: Job) -> None:
        """Wait for this step's turn under the step rates that apply (none by default)."""
        if self.step_rates is None:
            return
        rates = self.policy.steps_per_second(job.tenant_id, job.workflow_type)
        now = self.clock.now()
        waits = [self.step_rates.reserve(scope, rate, now) for scope, rate in rates]
        wait = max(waits, default=0.0)
        if wait > 0:
            self.clock.sleep(wait)

    def _lease_kept_elsewhere(self, job: Job, run: _Run, now: datetime) -> bool:
        """A running job whose Claimed lease lapsed may still be alive on its worker's
        heartbeat. Take its lease row before anything else is appended: a live row means
        its step is running, so look again when that row's lease lapses."""
        if (
            self.heartbeats is None
            or job.status is not JobStatus.RUNNING
            or job.holds_claim(run.claim_id, now)
        ):
            return False
        in_the_way = self.heartbeats.take_over(job, run.claim_id, now)
        if in_the_way is None:
            return False
        self._schedule(job, in_the_way.lease_until, f"lease:{job.version}", now)
        return True

    # ---- time limits and budgets ----------------------------------------------------

    def _past_deadline(self, job: Job, now: datetime) -> bool:
        deadline = job.deadline_at
        if deadline is None or now < deadline or job.status.is_terminal:
            return False
        self._fail(job, f"deadline {deadline.isoformat()} passed", "deadline")
        return True

    def _time_out(self, job: Job, now: datetime) -> None:
        """A wait's timeout or an approval's expiry came due: take the definition's
        timeout path (or fail), as a pure transition guarded by the version."""
        if job.status is JobStatus.WAITING_EVENT:
            job.time_out_wait(now=now)
            event_type = "job.waiting_event.timed_out"
        elif job.status is JobStatus.WAITING_CHILDREN:
            assert job.join is not None
            job.time_out_join(results=fan_out.results(job.join, job.children), now=now)
            event_type = "job.children.timed_out"
        else:
            job.expire_approval(now=now)
            event_type = "job.approval.expired"
        self._append(job)
        self.report(job, event_type, stepNumber=job.current_step, nextStep=job.cursor)

    def _park_over_budget(self, job: Job, now: datetime) -> bool:
        """A job that reached a budget limit is parked with the reason, never failed
        silently; raising its budget lets it go on."""
        limit = exceeded_limit(job)
        if limit is None:
            return False
        name, used, allowed = limit
        job.exceed_budget(limit=name, used=used, allowed=allowed, now=now)
        self._append(job)
        self.report(job, "job.budget_exceeded", limit=name, used=used, allowed=allowed)
        if job.due_at is not None:
            self._schedule(job, job.due_at, "deadline", now)
        return True

    # ---- resolution and the cost ceiling ---------------------------------------------

    def _request(self, job: Job, run: _Run, now: datetime) -> ResolveRequest:
        return ResolveRequest(
            workflow_type=job.workflow_type,
            workflow_version=job.workflow_version,
            budget=job.budget.to_dict(),
            state=job.state,
            current_step=job.current_step,
            status=job.status,
            reason=run.tick.reason,
            now=now,
            cursor=job.cursor,
            visits=job.visits,
            job_uuid=job.id,
            version=job.version,
            history=History(self.store, job.id, job.version, run.appended),
        )

    def _check_history(self, job: Job, run: _Run, now: datetime) -> None:
        """Before the engine itself writes to a waiting job (its timeout), a registry that
        can tell (code workflows: ``check_history``) says whether this worker's code still
        replays the job's history; if not, the job is left untouched, as resolving would."""
        check = getattr(self.deployment.registry, "check_history", None)
        if check is None:
            return
        try:
            check(self._request(job, run, now))
        except NonDeterminismError as error:
            raise self._blocked(job, error) from None

    def _resolve(self, job: Job, run: _Run, now: datetime) -> Resolution | Outcome:
        """Pure resolution from the definition; a throw is a definition bug: fail the job.
        Unless this worker has no definition for the job's pinned (type, version) at all,
        or its code no longer replays the job's history: that is a deployment error (a
        rolling deploy), and the job is left untouched. A code workflow's body that
        raised fails the job, or retries under the workflow's policy, as a step would."""
        request = self._request(job, run, now)
        registry = self.deployment.registry  # one throughout, should a reload swap it
        try:
            # The step an approver edited runs with the edit (replay applies it alike).
            return with_edit(job.approved_edit, registry.resolve(request))
        except StoreUnavailableError:
            raise  # a registry that reads a store: its outage is no definition bug
        except NonDeterminismError as error:
            raise self._blocked(job, error) from None
        except WorkflowBodyError as error:
            body = Resolution("workflow", JobStatus.FAILED, retry_policy=error.retry_policy)
            raised = StepError(str(error), retryable=error.retryable, kind=error.kind)
            return self._step_failed(job, body, raised)
        except Exception as error:
            if not registry.has(job.workflow_type, job.workflow_version):
                raise self._blocked(job, WorkflowNotDeployedError(str(error))) from None
            self._fail(job, f"workflow resolution failed: {error}", "definition")
            return Outcome.FAILED

    def _defer_for_ceiling(self, job: Job, now: datetime) -> bool:
        ceiling = self.config.cost_ceiling_for(job.tenant_id)
        if ceiling <= 0 or self.cost is None:
            return False
        day_start = now.astimezone(UTC).replace(hour=0, minute=0, second=0, microsecond=0)
        spend = self.cost.tenant_day_spend_usd(job.tenant_id, day_start)
        if spend < ceiling:
            return False
        resume_at = day_start + timedelta(days=1)
        job.defer_for_cost_ceiling(
            spend_usd=spend, ceiling_usd=ceiling, resume_at=resume_at, now=now
        )
        self._append(job)
        self.report(
            job,
            "job.cost_ceiling_deferred",
            spendUsd=str(spend),
            ceilingUsd=str(ceiling),
            resumeAt=resume_at.isoformat(),
        )
        self._schedule(job, job.due_at or resume_at, f"ceiling:{_epoch_ms(resume_at)}", now)
        return True

    def has_pinned(self, job: Job) -> bool:
        """Whether this worker has the definition the job is pinned to. Asked before
        anything claims the job for this worker (a tick's claim or lease take-over, the
        claim a resume folds in): one that can never run it must not hold it."""
        return self.deployment.registry.has(job.workflow_type, job.workflow_version)

    def _check_pinned(self, job: Job) -> None:
        """Refuse a job this worker has no definition for (a rolling deploy) before its
        lease or claim is taken, whatever woke it: the job is left as it is."""
        if self.has_pinned(job):
            return
        kind = job.workflow_type
        known = ", ".join(f"v{v}" for t, v in self.deployment.registry.known() if t == kind)
        raise self._blocked(
            job,
            WorkflowNotDeployedError(
                f"unknown workflow {kind!r} v{job.workflow_version} (known: {known or 'none'})"
            ),
        )

    def _check_deployment(self, job: Job, resolution: Resolution) -> None:
        """Refuse before the side effect, not after: a step with no executor to run it,
        or a wait with no way to mint its resume token, is a deployment error that must
        never fail the job. The tick is retried once the deployment is fixed."""
        if resolution.has_side_effect and self.executor is None:
            raise self._blocked(
                job,
                DeploymentError(
                    f"step type {resolution.step_type!r} needs a step executor; none is configured"
                ),
            )
        if resolution.children is not None:
            self.family.check_spawner(job)
            request = resolution.children
            if not self.deployment.registry.has(request.workflow_type, request.workflow_version):
                raise self._blocked(
                    job,
                    WorkflowNotDeployedError(
                        f"map step {resolution.step_name!r} spawns workflow "
                        f"{request.workflow_type!r} v{request.workflow_version}, which this "
                        "worker does not know"
                    ),
                )
        if resolution.next_status is JobStatus.WAITING_EVENT and self.tokens is None:
            raise self._blocked(
                job, DeploymentError("a step waits for an event but no token secret is configured")
            )

    def _refuses_to_spawn(self, job: Job, resolution: Resolution) -> bool:
        """Fail the job, saying why, for a wait for children that cannot be: one that
        names no children (a code workflow's bug), or children that would carry personal
        data (a child's input and final state are copied into the parent's events, where
        no personal path of either would seal or erase them). Nothing is spawned."""
        request = resolution.children
        if resolution.next_status is not JobStatus.WAITING_CHILDREN:
            return False
        if request is None:
            self._fail(job, "a step waits for children but names none to spawn", "definition")
            return True
        child = self.deployment.registry.personal_data(
            request.workflow_type, request.workflow_version
        )
        if not job.personal_data and not child:
            return False
        whose = "this job's workflow" if job.personal_data else f"{request.workflow_type!r}"
        self._fail(
            job,
            f"a map step cannot spawn children when {whose} declares personal_data "
            "(their inputs and results would be copied unsealed)",
            "definition",
        )
        return True

    def _blocked(self, job: Job, error: DeploymentError) -> DeploymentError:
        """Name the job (and the version it was left at) on the error, and say so in an
        ops event: nothing is written to the job, so this is where it shows."""
        error.tenant_id, error.job_id, error.version = job.tenant_id, job.job_id, job.version
        self.report(
            job,
            "job.deployment_blocked",
            reason=str(error),
            workflowType=job.workflow_type,
            workflowVersion=job.workflow_version,
            workerId=self.config.worker_id,
        )
        return error

    # ---- the claim -------------------------------------------------------------------

    def _claim(self, job: Job, run: _Run, now: datetime) -> None:
        """Append Claimed at the loaded version; losing the race means another worker
        owns this tick, so the tick ends quietly."""
        expired_holder = job.worker_id if job.status is JobStatus.RUNNING else None
        job.claim(
            worker_id=self.config.worker_id,
            claim_id=run.claim_id,
            lease_until=now + timedelta(milliseconds=self.config.leases.ms),
            reason=run.tick.reason,
            now=now,
        )
        self._append(job, run)
        run.span.event("jobledger.claim", {"jobledger.claim_id": run.claim_id})
        if expired_holder is not None:
            # The previous holder died mid-step: the step re-runs with the same key.
            self.report(
                job,
                "job.step.recovered",
                stepNumber=job.current_step + 1,
                idempotencyKey=job.step_key(job.current_step + 1),
                previousWorkerId=expired_holder,
            )

    # ---- the side effect -------------------------------------------------------------

    def _execute(self, job: Job, run: _Run, resolution: Resolution) -> StepOutcome | Exception:
        """Run the side effect (if the step has one): what it returned, merged with the
        resolution's output, or the error it raised (or its result's wrong shape)."""
        step_number = job.current_step + 1
        key = job.step_key(step_number)
        started_at = self.clock.now()
        self.report(
            job,
            "job.step.started",
            stepNumber=step_number,
            reason=run.tick.reason,
            idempotencyKey=key,
        )
        result: object = StepResult()
        if resolution.has_side_effect:
            request = StepRequest(
                job=JobView.read_only(job),
                step_number=step_number,
                step_type=resolution.step_type,
                triggered_by=resolution.triggered_by,
                idempotency_key=key,
                resolution=resolution,
                heartbeat=self._beat_now(job, run),
                span=run.span,
            )
            assert self.executor is not None  # checked before the claim
            try:
                with self._heartbeat(job, run):
                    returned = self.executor.execute(request)
                    # An ``async def execute`` runs on the worker's shared loop, so many
                    # such steps are in flight at once, one per tick thread.
                    result = (
                        self.async_steps.run(returned)
                        if inspect.isawaitable(returned)
                        else returned
                    )
            except Exception as error:
                return error
        try:
            return self._merge(resolution, result, started_at)
        except InvalidPayloadError as error:
            return error

    def _beat_now(self, job: Job, run: _Run) -> Callable[[], bool] | None:
        """What a step calls to renew its lease at once (None without a Leases port)."""
        heartbeats = self.heartbeats
        if heartbeats is None:
            return None
        claim_id = run.claim_id
        return lambda: heartbeats.beat_now(job, claim_id)

    def _heartbeat(self, job: Job, run: _Run) -> AbstractContextManager[None]:
        """Keep the claim alive while the side effect runs, however long it takes."""
        if self.heartbeats is None:
            return nullcontext()
        return self.heartbeats.kept(job, run.claim_id)

    def _merge(self, resolution: Resolution, result: object, started_at: datetime) -> StepOutcome:
        """Check what the executor returned before anything is built from it: a wrong
        shape is a step failure, never a crashed tick that would re-run the side effect."""
        if not isinstance(result, StepResult):
            raise InvalidPayloadError(
                f"the executor returned {type(result).__name__}, not a StepResult"
            )
        limit = self.config.limits.max_payload_bytes
        output = json_object(
            {**resolution.output, **_mapping(result.output, "step output")},
            what="step output",
            max_bytes=limit,
        )
        patch = json_object(
            {**resolution.state_patch, **_mapping(result.state_patch, "step state patch")},
            what="step state patch",
            max_bytes=limit,
        )
        worker_id = self.config.worker_id if resolution.has_side_effect else None
        return StepOutcome(
            started_at, self.clock.now(), output, patch, _cost(result.cost_usd), worker_id
        )

    def _step_failed(self, job: Job, resolution: Resolution, error: Exception) -> Outcome:
        """A retryable error within its policy schedules a retry; anything else fails."""
        kind = error.kind if isinstance(error, StepError) else type(error).__name__
        self.tracer.current().event("jobledger.step.error", {"jobledger.error.kind": kind})
        policy = resolution.retry_policy or RetryPolicy()
        attempt = job.attempt + 1
        retries = isinstance(error, StepError) and error.retryable and policy.allows(attempt, kind)
        self.report(
            job,
            "job.step.errored",
            stepNumber=job.current_step + 1,
            stepType=resolution.step_type,
            workflowType=job.workflow_type,
            errorKind=kind,
            willRetry=retries,
        )
        where = f"step {job.current_step + 1} of {job.tenant_id}/{job.job_id}"
        if isinstance(error, StepError):
            log.warning("%s raised %s (%s): %s", where, type(error).__name__, kind, error)
        else:  # not the executor's way of saying it failed: a bug, with its traceback
            log.error("%s raised %s: %s", where, type(error).__name__, error, exc_info=error)
        if retries:
            now = self.clock.now()
            resume_at = now + timedelta(milliseconds=policy.backoff_ms(attempt))
            job.schedule_retry(error=str(error), error_kind=kind, resume_at=resume_at, now=now)
            self._append(job)
            self.report(
                job,
                "job.step.retry_scheduled",
                stepNumber=job.current_step + 1,
                attempt=attempt,
                error=str(error),
                resumeAt=resume_at.isoformat(),
            )
            self._schedule(
                job, job.due_at or resume_at, f"retry:{job.current_step + 1}:{attempt}", now
            )
            return Outcome.RETRY_SCHEDULED
        self._fail(job, f"step {job.current_step + 1} failed: {error}", "step")
        return Outcome.FAILED

    def _fail(self, job: Job, error: str, cause: str) -> None:
        job.fail(error=error, cause=cause, now=self.clock.now())
        self._append(job)
        self.report(job, "job.failed", error=error, cause=cause)

    # ---- recording: one atomic append ----------------------------------------------

    def _issue_token(self, job: Job, resolution: Resolution) -> IssuedToken | None:
        if resolution.next_status is not JobStatus.WAITING_EVENT:
            return None
        assert self.tokens is not None  # checked before the side effect
        now = self.clock.now()
        # The token lives as long as the wait: until its timeout or the job's deadline.
        timeout_at = transition.resume_at(resolution, now, self.config.ticks.default_wait_ms)
        ends = min((m for m in (timeout_at, job.deadline_at) if m is not None), default=None)
        return self.tokens.issue(
            JobView.of(job),
            step_number=job.current_step + 1,
            event_name=transition.event_name(resolution),
            now=now,
            lasts_until=ends,
        )

    def _record(
        self,
        run: _Run,
        resolution: Resolution,
        executed: StepOutcome,
        token: IssuedToken | None,
    ) -> None:
        """The step, its transition, what it opens (an approval request, or the resume by
        a signal that arrived early) and, when the tick goes on, the next claim: all in
        one append, and one event when the step itself leaves the job queued."""
        at = executed.ended_at
        step = transition.decide(
            run.job, resolution, at=at, default_wait_ms=self.config.ticks.default_wait_ms
        )
        run.steps += 1
        # Carry the next step's claim in this same commit: one durable write per step.
        # Its lease runs from now, not from the step's end: a record that lands late
        # (kept through a full disk) must not hand the next step a lapsed lease.
        goes_on = run.steps < self.config.ticks.max_steps_per_tick
        continuation = (
            Claim(
                self.config.worker_id,
                run.claim_id,
                self.clock.now() + timedelta(milliseconds=self.config.leases.ms),
            )
            if goes_on
            else None
        )

        def build(job: Job) -> None:
            transition.apply(job, step, executed, token=token, continuation=continuation)

        self._commit_step(run, step, build)
        self.report(
            run.job,
            "job.step.completed",
            stepNumber=step.step_number,
            stepType=step.step_type,
            workflowType=run.job.workflow_type,
            transitionReason=step.transition_reason,
            durationMs=int((at - executed.started_at).total_seconds() * 1000),
            idempotencyKey=step.idempotency_key,
            costUsd=str(executed.cost_usd),
            stepsExecutedThisTick=run.steps,
            maxStepsPerTick=self.config.ticks.max_steps_per_tick,
        )

    def _commit_step(self, run: _Run, step: Transition, build: Callable[[Job], None]) -> None:
        """Append the step. Inputs that landed while the step ran and left
        the job running under this tick's claim (a buffered signal, a budget change)
        commute with it: the step is rebuilt on top of them and appended again, so it is
        recorded once and never re-run. Anything that took the claim away (a cancel, a
        take-over after the lease lapsed) discards the result; a duplicate key means the
        step is already recorded. Any other store error propagates so the tick is retried
        and the job is not failed."""
        job = run.job
        for _ in range(REBASE_ATTEMPTS):
            claimed = job.step_in_flight(run.claim_id)
            build(job)
            pending = list(job.pending_events)
            first = pending[0]
            assert isinstance(first, Job.Event)
            try:
                # The step key is derived, not a row of its own: step n is only appended on
                # a fold at step n-1, so the (job, version) key that refuses a stale append
                # refuses a second record of step n (the store reports it DuplicateKeyError).
                self.tick_appends.append(job)
            except (DuplicateKeyError, VersionConflict) as refused:
                if claimed and self.store.holds(job.id, first.originator_version, first.chain_hash):
                    # Our commit landed but its acknowledgement was lost, and the retried
                    # insert met our own rows. The chain hash covers our claim's unique id,
                    # so no other writer's event can carry it.
                    break
                if isinstance(refused, DuplicateKeyError):
                    self.report(
                        self.load(run.tick),
                        "job.step.duplicate_skipped",
                        idempotencyKey=step.idempotency_key,
                    )
                    raise _LostRace(Outcome.DUPLICATE_SKIPPED) from None
                job = self.load(run.tick)
                if not job.step_in_flight(run.claim_id):
                    self._discard_late_result(job, step.idempotency_key, step.step_number)
                    raise _LostRace(Outcome.DISCARDED) from None
                self.report(job, "job.step.rebased", idempotencyKey=step.idempotency_key)
                run.span.event("jobledger.rebased", NO_ATTRIBUTES)
                continue
            break
        else:
            raise StoreUnavailableError(
                f"job {job.job_id!r} kept changing while step {step.step_number} was recorded"
            )
        run.appended.extend(pending)  # type: ignore[arg-type]
        run.job = job
        run.span.event("jobledger.append", NO_ATTRIBUTES)

    def _discard_late_result(self, job: Job, key: str, step_number: int) -> None:
        """The job moved on while our step ran. If it was cancelled, say so in its history."""
        if job.status is JobStatus.CANCELLED:
            job.discard_late_result(
                step_number=step_number,
                idempotency_key=key,
                worker_id=self.config.worker_id,
                now=self.clock.now(),
            )
            with suppress(VersionConflict):
                self.store.append(job)
        self.report(
            job,
            "job.step.discarded",
            idempotencyKey=key,
            reason=f"the job changed while the step ran (now {job.status})",
        )

    # ---- acting on the new status ----------------------------------------------------

    def _follow_up(
        self, job: Job, run: _Run, resolution: Resolution, token: IssuedToken | None
    ) -> Outcome | None:
        status = job.status
        if status is JobStatus.COMPLETED:
            self.report(job, "job.completed")
        elif status is JobStatus.FAILED:
            self.report(job, "job.failed", error=resolution.transition_reason, cause="workflow")
        elif status is JobStatus.WAITING_EVENT:
            self._await_event(job, resolution, token)
        elif status is JobStatus.AWAITING_APPROVAL:
            self._await_approval(job)
        elif status is JobStatus.WAITING_CHILDREN:
            self.report(job, "job.waiting_children", children=len(job.children))
            return self._await_children(run, self.clock.now())
        elif status is JobStatus.WAITING_TIME:
            return self._wait(job, run, resolution)
        elif job.holds_claim(run.claim_id, self.clock.now()):
            return None
        elif status is JobStatus.QUEUED:
            self._continue_later(job)
        return Outcome.ADVANCED

    def _await_event(self, job: Job, resolution: Resolution, token: IssuedToken | None) -> None:
        assert token is not None
        name = transition.event_name(resolution)
        self.report(
            job,
            "job.waiting_event",
            stepNumber=job.current_step,
            waitEventName=name,
            resumeTokenExpiresAt=token.expires_at.isoformat(),
            timeoutAt=job.resume_at.isoformat() if job.resume_at else None,
        )
        self._schedule_deadline(job)
        if self.notifier is not None:
            self.notifier.waiting_for_event(JobView.of(job), name, token)

    def _await_children(self, run: _Run, now: datetime) -> Outcome | None:
        """Spawn the join's children that do not exist yet and take in the ends of those
        that finished: the first tick after the step spawns them; a later one (the
        reconciler's backstop) repairs a spawn or a child's report lost in a crash."""
        run.job = job = self.family.catch_up(run.job)
        if job.status is JobStatus.WAITING_CHILDREN:
            self._schedule_deadline(job)
            return Outcome.IDLE if run.steps == 0 else Outcome.ADVANCED
        if job.status is JobStatus.QUEUED and run.steps < self.config.ticks.max_steps_per_tick:
            return None
        return Outcome.ADVANCED

    def _await_approval(self, job: Job) -> None:
        assert job.pending_approval is not None
        request = ApprovalRequest.of(job.pending_approval)
        self.report(
            job,
            "job.awaiting_approval",
            stepNumber=job.current_step,
            approvalId=request.approval_id,
            attempt=request.attempt,
            approvers=list(request.approvers),
        )
        self._schedule_deadline(job)
        if self.notifier is not None:
            self.notifier.approval_requested(JobView.of(job), request)

    def _schedule_deadline(self, job: Job) -> None:
        """A wait's timeout, an approval's expiry or the job's deadline, the earliest;
        nothing for a wait without one. Not the job's due moment: a join's is when it
        last moved (the reconciler's look for a lost report), and a tick queued for it
        re-queued itself, polling the parent every millisecond."""
        due = _earliest(job.resume_at, job.deadline_at)
        if due is not None:
            self._schedule(job, due, f"timeout:{job.current_step}", self.clock.now())

    def _wait(self, job: Job, run: _Run, resolution: Resolution) -> Outcome | None:
        """Short waits continue inline (the timer is honoured by sleeping) while the tick
        has step budget; longer ones are handed to the queue or, in scan_only mode, left
        to the reconciler."""
        assert job.resume_at is not None
        due = job.due_at  # the timer, or the deadline if that comes first
        assert due is not None
        now = self.clock.now()
        self.report(
            job,
            "job.waiting_time",
            stepNumber=job.current_step,
            transitionReason=resolution.transition_reason,
            resumeAt=job.resume_at.isoformat(),
            resumeMode=self.config.ticks.resume_mode,
        )
        delay_ms = max(0, _millis(due - now))
        limit = self.config.ticks.inline_resume_max_delay_ms
        if run.steps < self.config.ticks.max_steps_per_tick and delay_ms <= limit:
            # Sleep the exact remainder: a truncated delay could wake just before resume_at.
            self.clock.sleep((due - now).total_seconds())
            self.report(
                job,
                "job.waiting_time.inline_continued",
                stepNumber=job.current_step,
                resumeDelayMs=delay_ms,
                inlineResumeMaxDelayMs=limit,
            )
            return None
        key = job.step_key(job.current_step)
        self._schedule(job, due, f"{job.current_step}:{key}", now)
        return Outcome.ADVANCED

    def _continue_later(self, job: Job) -> None:
        """Burst continuation: this tick spent its step budget; hand the rest back."""
        self.report(
            job,
            "job.burst_continued",
            stepNumber=job.current_step,
            maxStepsPerTick=self.config.ticks.max_steps_per_tick,
        )
        self.queue.enqueue(
            Tick(job.tenant_id, job.job_id, "burst_continuation", trace_context=self._carrier()),
            dedupe_key=f"burst:{job.current_step}",
        )

    # ---- helpers ---------------------------------------------------------------------

    def _wake(self, job: Job, reason: str) -> None:
        """Enqueue the tick of a job made runnable outside a tick (a join met)."""
        if job.status is JobStatus.QUEUED:
            self.queue.enqueue(
                Tick(job.tenant_id, job.job_id, reason, trace_context=self._carrier()),
                dedupe_key=f"{reason}:{job.version}",
            )

    def _schedule(self, job: Job, at: datetime, dedupe_key: str, now: datetime) -> None:
        if self.config.ticks.resume_mode == "scan_only":
            return
        self.queue.enqueue(
            Tick(job.tenant_id, job.job_id, "waiting_time_resume", trace_context=self._carrier()),
            delay_ms=max(1, _millis(at - now)),
            dedupe_key=dedupe_key,
        )

    def _append(self, job: Job, run: _Run | None = None) -> None:
        """Append a transition that guards no key; a lost race ends the tick quietly."""
        pending = list(job.pending_events) if run is not None else []
        try:
            self.tick_appends.append(job)
        except VersionConflict:
            raise _LostRace(Outcome.CLAIM_LOST) from None
        if run is not None:
            run.appended.extend(pending)  # type: ignore[arg-type]
        span = run.span if run is not None else self.tracer.current()
        span.event("jobledger.append", NO_ATTRIBUTES)

    def _carrier(self) -> dict[str, str] | None:
        """The current span's trace context, for a tick enqueued from it to continue."""
        return self.tracer.current().carrier or None

    def report(self, job: Job, event_type: str, **metadata: Any) -> None:
        self.ops.record(
            OpsEvent(
                jobId=job.job_id,
                tenantId=job.tenant_id,
                eventType=event_type,
                status=str(job.status),
                missionId=job.mission_id,
                employeeId=job.employee_id,
                correlationId=job.correlation_id,
                metadata=metadata,
            )
        )


def _mapping(value: object, what: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise InvalidPayloadError(f"{what} must be a JSON object, got {type(value).__name__}")
    return value


def _cost(value: Decimal | float | int | str) -> Decimal:
    try:
        cost = Decimal(str(value))
    except InvalidOperation:
        raise InvalidPayloadError(f"step cost {value!r} is not a number") from None
    if not cost.is_finite() or cost < 0:
        raise InvalidPayloadError(f"step cost {value!r} must be a finite amount >= 0")
    return cost


def _earliest(*moments: datetime | None) -> datetime | None:
    return min((m for m in moments if m is not None), default=None)


def _millis(delta: timedelta) -> int:
    return int(delta.total_seconds() * 1000)


def _epoch_ms(moment: datetime) -> int:
    return int(moment.timestamp() * 1000)
