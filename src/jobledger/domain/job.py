"""The Job aggregate: its events are the job's state, its audit trail and its replay source."""

from __future__ import annotations

from collections.abc import Collection, Mapping
from copy import deepcopy
from dataclasses import dataclass, replace
from datetime import datetime
from decimal import Decimal
from enum import StrEnum
from typing import Any, ClassVar

from eventsourcing.domain import Aggregate
from eventsourcing.domain import Snapshot as AggregateSnapshot

from jobledger.domain import chain, erasure, fan_out, identity
from jobledger.domain.approval_answers import answer_sha256, approved_edit, check_edit
from jobledger.domain.errors import (
    AlreadyVotedError,
    InvalidPayloadError,
    JobFinishedError,
    JobNotWaitingError,
    StaleApprovalError,
    TokenMismatchError,
    UnauthorisedDeciderError,
)
from jobledger.domain.identity import KEY_SCHEME, LEGACY_KEY_SCHEME, job_uuid
from jobledger.domain.status import TRANSITION_STATUSES, JobStatus
from jobledger.domain.stored_topics import keep_stored_topics
from jobledger.domain.substate import (
    APPROVED,
    ApprovalGate,
    ApprovalVote,
    BufferedSignal,
    EventWait,
    JobBudget,
)

JSON = dict[str, Any]

WAKE_REASONS: Mapping[str, str] = {"token": "resumed", "signal": "signal"}
"""A resume's source -> the reason of the tick it wakes (``Job.Resumed.tick_reason``)."""


@dataclass(frozen=True)
class Claim:
    """A worker's lease on a job, under a claim id. Stored as a ``Claimed`` event, or
    folded into the event that hands the job on (a continuing step, a resume) as its
    ``claimed_by``, ``claim_id`` and ``lease_until``: one row where there were two."""

    worker_id: str
    claim_id: str
    lease_until: datetime

    @staticmethod
    def fields(claim: Claim | None) -> JSON:
        """The folded fields of an event (all None: no claim folded in)."""
        if claim is None:
            return {"claimed_by": None, "claim_id": None, "lease_until": None}
        return {
            "claimed_by": claim.worker_id,
            "claim_id": claim.claim_id,
            "lease_until": claim.lease_until,
        }

    @staticmethod
    def folded_into(event: object) -> Claim | None:
        """The claim folded into a stored event, if any (an event stored before the fold
        has none of the fields)."""
        state = vars(event)
        claim_id = state.get("claim_id")
        if claim_id is None:
            return None
        return Claim(state["claimed_by"], claim_id, state["lease_until"])


class Job(Aggregate):
    """A job is the fold of its events; commands only decide which event comes next."""

    tenant_id: str
    job_id: str
    workflow_type: str
    workflow_version: int
    mission_id: str | None
    employee_id: str | None
    correlation_id: str | None
    submit_key: str | None
    key_scheme: int
    budget: JobBudget
    state: JSON
    status: JobStatus
    current_step: int
    resume_at: datetime | None
    wait_event: EventWait | None
    claim_id: str | None
    worker_id: str | None
    lease_until: datetime | None
    attempt: int
    total_steps_executed: int
    total_cost_usd: Decimal
    last_error: str | None
    completed_at: datetime | None
    cursor: str | None
    visits: dict[str, int]
    pending_approval: ApprovalGate | None
    inbox: tuple[BufferedSignal, ...]
    chain_head: str
    personal_data: tuple[str, ...]
    personal_data_key: str | None
    personal_data_erased: bool
    trace_context: dict[str, str] | None
    """The W3C trace context the job was submitted in (``orchestration.tracing``): every later
    span about the job continues that trace. Kept in a snapshot only when set."""
    parent: JSON | None
    """For a child job: ``{job_id, step_number, index}`` of the parent's map step that
    spawned it (``jobledger.domain.fan_out``). None for a job submitted from outside."""
    children: dict[str, JSON]
    """The children this job spawned, by child job id: each one's plan and, once it
    finished, its end (``jobledger.domain.fan_out.ChildEnd``)."""
    join: JSON | None
    """The join the job waits on (or will, for children that finished early)."""
    children_cost_usd: Decimal
    """What finished children spent: it counts toward this job's max_cost_usd."""
    priority: int | None
    """0-9, higher admitted first (``jobledger.domain.admission``); None: the default. Kept in a
    snapshot only when set."""
    epoch: int
    """How many times the job was reset (``Reset``): its step keys name it from 1 on
    (``jobledger.domain.identity.step_key``). Kept in a snapshot only when not 0."""
    forked_from: JSON | None
    """For a fork: ``{job_id, step_number}`` of the job it was forked from (``ForkedFrom``).
    Kept in a snapshot only when set."""
    approved_edit: JSON | None
    """An approver's edit of the params of the step the approval leads to (``{step,
    params}``, ``jobledger.domain.approval_answers``), kept until a step is recorded.
    Kept in a snapshot only when set."""

    # Version 2 holds ``key_scheme``, 3 ``personal_data``; older snapshots are upcast.
    class_version = 3

    def __init__(self) -> None:
        """State is set by ``Submitted.evolve``: the events, not the constructor, define a job."""

    @staticmethod
    def upcast_v1_v2(state: JSON) -> None:
        state["key_scheme"] = LEGACY_KEY_SCHEME

    @staticmethod
    def upcast_v2_v3(state: JSON) -> None:
        state["personal_data"] = []
        state["personal_data_key"] = None
        state["personal_data_erased"] = False

    def step_key(self, step_number: int) -> str:
        """The idempotency key of the job's step ``step_number``, in the job's own scheme."""
        return identity.step_key(
            self.tenant_id, self.job_id, step_number, self.key_scheme, self.epoch
        )

    class Snapshot(AggregateSnapshot):
        """Snapshots store the job's parts as the JSON objects they always were."""

        @classmethod
        def take(cls, aggregate: Any) -> Job.Snapshot:
            snapshot = super().take(aggregate)
            state = snapshot.state  # a fresh dict, in the job's own key order
            state["budget"] = aggregate.budget.to_dict()
            wait, approval = aggregate.wait_event, aggregate.pending_approval
            state["wait_event"] = None if wait is None else wait.to_dict()
            state["pending_approval"] = None if approval is None else approval.to_dict()
            state["inbox"] = [signal.to_dict() for signal in aggregate.inbox]
            if state.get("trace_context") is None:
                # An untraced job's snapshot keeps the bytes it had before tracing.
                state.pop("trace_context", None)
            if state.get("priority") is None:
                # Likewise a job submitted without a priority.
                state.pop("priority", None)
            if state.get("approved_edit") is None:
                state.pop("approved_edit", None)
            # Likewise a job with no parent and no children, never reset or forked.
            for name, empty in _OMITTED_WHEN_EMPTY.items():
                if state.get(name, empty) == empty:
                    state.pop(name, None)
            return snapshot

        def mutate(self, _: None) -> Job:
            job = super().mutate(None)
            assert isinstance(job, Job)
            # JSON has no enums: the snapshot stored the status as its string value.
            job.status = JobStatus(job.status)
            job.budget = JobBudget.from_dict(vars(job)["budget"])
            wait, approval = vars(job)["wait_event"], vars(job)["pending_approval"]
            job.wait_event = None if wait is None else EventWait.from_dict(wait)
            job.pending_approval = None if approval is None else ApprovalGate.from_dict(approval)
            job.inbox = tuple(BufferedSignal.from_dict(m) for m in vars(job)["inbox"])
            job.personal_data = tuple(vars(job)["personal_data"])
            job.trace_context = vars(job).get("trace_context")
            for name, empty in _OMITTED_WHEN_EMPTY.items():
                setattr(job, name, deepcopy(vars(job).get(name, empty)))
            job.children_cost_usd = Decimal(job.children_cost_usd)
            job.priority = vars(job).get("priority")
            job.approved_edit = deepcopy(vars(job).get("approved_edit"))
            return job

    class Event(Aggregate.Event):
        chain_hash: str
        stored_enums: ClassVar[Mapping[str, type[StrEnum]]] = {}
        """Fields stored as an enum's string (JSON has no enums: the stored bytes and the
        chain hash are the string's), typed again when read (``adapters.mapper``)."""
        stored_when_set: ClassVar[frozenset[str]] = frozenset()
        """Fields added later that are stored only when not None, so an event that does
        not use them keeps the bytes (and the chain hash) it had before they existed."""

        def apply(self, aggregate: Any) -> None:
            assert isinstance(aggregate, Job)
            self.evolve(aggregate)
            # A stored event carries its hash; a new one is hashed by the store as it is
            # written (``adapters.sealing``), which then moves the head.
            if self.chain_hash:
                aggregate.chain_head = self.chain_hash

        def evolve(self, job: Job) -> None:
            """What this event changes; overridden by each event type."""

    class Submitted(Event, Aggregate.Created):
        tenant_id: str
        job_id: str
        workflow_type: str
        workflow_version: int
        state: JSON
        budget: JSON
        mission_id: str | None
        employee_id: str | None
        correlation_id: str | None
        submit_key: str | None
        key_scheme: int = LEGACY_KEY_SCHEME
        """How the job's step keys are shaped (``jobledger.domain.identity``); absent from jobs
        submitted before it was kept, which keep the keys they started with."""
        personal_data: list[str] | None = None
        personal_data_key: str | None = None
        """The dotted paths into state whose values are personal, fixed at submit, and
        the opaque id of the key they are sealed with (never the data subject's name:
        it may itself be personal). None: the job holds no personal data."""
        trace_context: dict[str, str] | None = None
        """The W3C trace context of the span that submitted the job; None: untraced."""
        parent: JSON | None = None
        """The parent's map step that spawned this job (``Job.parent``); None: none."""
        priority: int | None = None
        """0-9, higher admitted first; None: the default priority."""
        stored_when_set = frozenset(
            {"personal_data", "personal_data_key", "trace_context", "parent", "priority"}
        )

        def evolve(self, job: Job) -> None:
            job.tenant_id = self.tenant_id
            job.job_id = self.job_id
            job.workflow_type = self.workflow_type
            job.workflow_version = self.workflow_version
            job.state = deepcopy(self.state)
            job.budget = JobBudget.from_dict(self.budget)
            job.mission_id = self.mission_id
            job.employee_id = self.employee_id
            job.correlation_id = self.correlation_id
            job.submit_key = self.submit_key
            job.key_scheme = self.key_scheme
            job.personal_data = tuple(self.personal_data or ())
            job.personal_data_key = self.personal_data_key
            job.personal_data_erased = False
            job.trace_context = self.trace_context
            job.parent = deepcopy(self.parent)
            job.children = {}
            job.join = None
            job.children_cost_usd = Decimal(0)
            job.priority = self.priority
            job.epoch = 0
            job.forked_from = None
            job.chain_head = chain.GENESIS
            job.status = JobStatus.QUEUED
            job.current_step = 0
            job.resume_at = None
            job.wait_event = None
            job.claim_id = None
            job.worker_id = None
            job.lease_until = None
            job.attempt = 0
            job.total_steps_executed = 0
            job.total_cost_usd = Decimal(0)
            job.last_error = None
            job.completed_at = None
            job.cursor = None
            job.visits = {}
            job.pending_approval = None
            job.inbox = ()
            job.approved_edit = None

    class Claimed(Event):
        """A worker took a lease on the job to execute its next step."""

        worker_id: str
        claim_id: str
        lease_until: datetime
        reason: str
        previous_status: JobStatus
        previous_worker_id: str | None
        stored_enums: ClassVar[Mapping[str, type[StrEnum]]] = {"previous_status": JobStatus}

        def evolve(self, job: Job) -> None:
            job.hold(Claim(self.worker_id, self.claim_id, self.lease_until))

    class StepRecorded(Event):
        """A step ran (or a pure transition was taken) and the job moved to ``next_status``."""

        step_number: int
        step_type: str
        triggered_by: str
        idempotency_key: str
        started_at: datetime
        ended_at: datetime
        duration_ms: int
        output: JSON
        state_patch: JSON
        cost_usd: Decimal
        transition_reason: str
        next_status: JobStatus
        resume_at: datetime | None
        wait_event: JSON | None
        worker_id: str | None
        step_name: str | None
        next_step: str | None
        input_sha256: str | None = None
        """sha256 of what the definition handed the step (``jobledger.domain.transition``);
        absent from steps recorded before it was kept, which replay then cannot compare."""
        claimed_by: str | None = None
        claim_id: str | None = None
        lease_until: datetime | None = None
        """The claim the job goes on under when the tick continues it (the worker, the
        claim, its lease): the continuation claim, folded into the step so a continuing
        step is one event. None when the job does not go on at once; absent from steps
        recorded before the fold, whose continuation is a ``Claimed`` of its own."""
        stored_enums: ClassVar[Mapping[str, type[StrEnum]]] = {"next_status": JobStatus}

        def evolve(self, job: Job) -> None:
            job.current_step = self.step_number
            job.cursor = self.next_step
            if self.step_name is not None:
                job.visits = {**job.visits, self.step_name: job.visits.get(self.step_name, 0) + 1}
            # The mapper reads it as the enum; an event decoded some other way holds the string.
            job.status = JobStatus(self.next_status)
            job.resume_at = self.resume_at
            job.wait_event = (
                None if self.wait_event is None else EventWait.from_dict(self.wait_event)
            )
            job.state = {**job.state, **deepcopy(self.state_patch)}
            job.total_steps_executed += 1
            job.total_cost_usd += self.cost_usd
            job.attempt = 0
            # An approver's edit is for the step right after the approval: this one.
            job.approved_edit = None
            job.release_lease()
            # Read from the state: a step stored before the fold has no such fields.
            claim = Claim.folded_into(self)
            if claim is not None:
                job.hold(claim)
            if job.status.is_terminal:
                job.completed_at = self.ended_at
            if job.status is JobStatus.FAILED:
                # A definition's fail step, or a loop past its max_visits: the reason is
                # why the job failed, as a step error's message is.
                job.last_error = self.transition_reason or f"step {self.step_name!r} failed"

    class CostCeilingDeferred(Event):
        """The tenant's spend for the UTC day reached its ceiling: no step ran."""

        step_number: int
        spend_usd: Decimal
        ceiling_usd: Decimal
        resume_at: datetime

        def evolve(self, job: Job) -> None:
            job.status = JobStatus.WAITING_TIME
            job.resume_at = self.resume_at
            job.release_lease()

    class RetryScheduled(Event):
        """A step failed with a retryable error; it runs again at ``resume_at``."""

        step_number: int
        attempt: int
        error: str
        error_kind: str
        resume_at: datetime

        def evolve(self, job: Job) -> None:
            job.status = JobStatus.WAITING_TIME
            job.resume_at = self.resume_at
            job.attempt = self.attempt
            job.last_error = self.error
            job.release_lease()

    class Failed(Event):
        """The job failed for good: a step error, or a bug in its workflow definition."""

        step_number: int
        error: str
        cause: str

        def evolve(self, job: Job) -> None:
            job.status = JobStatus.FAILED
            job.last_error = self.error
            job.completed_at = self.timestamp
            job.resume_at = None
            job.release_lease()

    class ApprovalRequested(Event):
        """A person must decide before the job goes on; ``action_sha256`` pins what."""

        approval_id: str
        step_number: int
        attempt: int
        action_sha256: str
        approvers: list[str]
        expires_at: datetime | None
        on_approve: str | None
        on_reject: str | None
        on_expire: str | None
        quorum: int | None = None
        """How many of ``approvers`` must approve; None: one decision decides."""
        stored_when_set = frozenset({"quorum"})

        def evolve(self, job: Job) -> None:
            job.pending_approval = ApprovalGate(
                approval_id=self.approval_id,
                step_number=self.step_number,
                attempt=self.attempt,
                action_sha256=self.action_sha256,
                approvers=tuple(self.approvers),
                expires_at=self.expires_at,
                on_approve=self.on_approve,
                on_reject=self.on_reject,
                on_expire=self.on_expire,
                quorum=self.quorum,
            )

    class ApprovalVoted(Event):
        """One approver's vote on a quorum request, bound to its step, attempt and action
        hash; the request is decided (an ``ApprovalDecided`` in the same append) once the
        quorum approved or can no longer be reached."""

        approval_id: str
        step_number: int
        attempt: int
        action_sha256: str
        decision: str
        voted_by: str
        comment: str | None
        data: JSON | None
        data_sha256: str | None

        def evolve(self, job: Job) -> None:
            assert job.pending_approval is not None, "a vote is cast on an open request"
            vote = ApprovalVote(self.voted_by, self.decision, deepcopy(self.data))
            gate = job.pending_approval
            job.pending_approval = replace(gate, votes=(*gate.votes, vote))

    class ApprovalDecided(Event):
        approval_id: str
        decision: str
        decided_by: str
        comment: str | None
        next_step: str | None
        edit: JSON | None = None
        """The approver's edit of the params of step ``next_step``; it runs with them."""
        edit_sha256: str | None = None
        data: JSON | None = None
        """The data the decision answered with: it lands in the job's state."""
        data_sha256: str | None = None
        stored_when_set = frozenset({"edit", "edit_sha256", "data", "data_sha256"})

        def evolve(self, job: Job) -> None:
            job.leave_wait(self.next_step)
            if self.data is not None:
                job.state = {**job.state, **deepcopy(self.data)}
            if self.edit is not None and self.next_step is not None:
                job.approved_edit = approved_edit(self.next_step, deepcopy(self.edit))

    class ApprovalReassigned(Event):
        """The open request moved to other approvers (who moved it, and why): from here
        on only they may decide; the votes cast before stay counted."""

        approval_id: str
        approvers: list[str]
        previous_approvers: list[str]
        reassigned_by: str
        reason: str

        def evolve(self, job: Job) -> None:
            assert job.pending_approval is not None, "an open request is reassigned"
            job.pending_approval = replace(job.pending_approval, approvers=tuple(self.approvers))

    class ApprovalExpired(Event):
        approval_id: str
        next_step: str | None

        def evolve(self, job: Job) -> None:
            job.leave_wait(self.next_step)

    class SignalBuffered(Event):
        """A signal arrived before the job waited for it: kept until a wait opens."""

        signal_id: str
        event_name: str
        payload: JSON

        def evolve(self, job: Job) -> None:
            signal = BufferedSignal(self.signal_id, self.event_name, deepcopy(self.payload))
            job.inbox = (*job.inbox, signal)

    class Resumed(Event):
        """The outside event a job waited for arrived (by token or by signal)."""

        event_name: str
        source: str
        nonce: str | None
        signal_id: str | None
        payload: JSON
        claimed_by: str | None = None
        claim_id: str | None = None
        lease_until: datetime | None = None
        """The claim of the tick this resume wakes, when the engine that took the resume
        runs that tick itself: folded in, so resume -> next step recorded is two commits.
        None otherwise; absent from resumes recorded before the fold."""

        @property
        def tick_reason(self) -> str:
            """The reason of the tick a resume wakes (the one a folded claim is for)."""
            return WAKE_REASONS.get(self.source, self.source)

        def evolve(self, job: Job) -> None:
            job.state = {**job.state, **deepcopy(self.payload)}
            job.inbox = tuple(m for m in job.inbox if m.signal_id != self.signal_id)
            job.wait_event = None
            job.resume_at = None
            job.status = JobStatus.QUEUED
            claim = Claim.folded_into(self)
            if claim is not None:
                job.hold(claim)

    class ResumeTokenReissued(Event):
        """A new resume token for the open wait; the previous one is void from here on
        (its nonce is consumed in this same append)."""

        nonce: str
        token_sha256: str
        expires_at: datetime
        previous_nonce: str
        reissued_by: str

        def evolve(self, job: Job) -> None:
            assert job.wait_event is not None, "a token is reissued for an open wait"
            job.wait_event = job.wait_event.reissued(
                nonce=self.nonce, token_sha256=self.token_sha256, expires_at=self.expires_at
            )

    class WaitTimedOut(Event):
        event_name: str
        next_step: str | None

        def evolve(self, job: Job) -> None:
            job.leave_wait(self.next_step)

    class BudgetExceeded(Event):
        """A budget limit was reached: the job is parked, not failed."""

        limit: str
        used: str
        allowed: str
        deadline_at: datetime | None

        def evolve(self, job: Job) -> None:
            job.status = JobStatus.BUDGET_EXCEEDED
            job.last_error = f"budget {self.limit} reached: {self.used} of {self.allowed}"
            job.resume_at = self.deadline_at
            job.release_lease()

    class BudgetRaised(Event):
        raised_by: str
        reason: str
        budget: JSON

        def evolve(self, job: Job) -> None:
            job.budget = JobBudget.from_dict(self.budget)
            if job.status is JobStatus.BUDGET_EXCEEDED:
                job.status = JobStatus.QUEUED
                job.resume_at = None

    class Cancelled(Event):
        """Stopped on request: open tokens and approvals are void from here on."""

        reason: str
        cancelled_by: str

        def evolve(self, job: Job) -> None:
            job.status = JobStatus.CANCELLED
            job.completed_at = self.timestamp
            job.wait_event = None
            job.pending_approval = None
            job.resume_at = None
            job.release_lease()

    class ChildrenSpawned(Event):
        """A map step spawned these children (one per item, ids derived from the step's
        key) and the join it waits on. Recorded in the step's own append, before any child
        is submitted: the children are submitted after it, idempotently, by the tick and
        by every later tick while the join is open."""

        step_number: int
        children: list[JSON]
        join: JSON

        def evolve(self, job: Job) -> None:
            spawned = {plan["job_id"]: {**deepcopy(plan), "end": None} for plan in self.children}
            job.children = {**job.children, **spawned}
            job.join = deepcopy(self.join)

    class ChildFinished(Event):
        """A child reached a terminal status; kept whether or not the join is open yet."""

        child_job_id: str
        status: str
        result: JSON
        error: str | None
        cost_usd: Decimal

        def evolve(self, job: Job) -> None:
            end = {
                "status": self.status,
                "result": deepcopy(self.result),
                "error": self.error,
                "cost_usd": str(self.cost_usd),
            }
            child = job.children.get(self.child_job_id, {})
            job.children = {**job.children, self.child_job_id: {**child, "end": end}}
            job.children_cost_usd += self.cost_usd

    class JoinEnded(Event):
        """What both ends of a join do: the results land in the state, and the job goes on.
        Only its two kinds below are ever recorded."""

        step_number: int
        results_key: str
        results: list[JSON]
        next_step: str | None

        def evolve(self, job: Job) -> None:
            job.state = {**job.state, self.results_key: deepcopy(self.results)}
            job.join = None
            job.leave_wait(self.next_step)

    class ChildrenJoined(JoinEnded):
        """The join was met: one result per item lands in the state, and the job goes on."""

    class JoinTimedOut(JoinEnded):
        """The join's timeout passed first: the results so far land in the state, and the
        job goes to the step's ``on_timeout`` (or fails, in the ``Failed`` that follows)."""

    class LateResultDiscarded(Event):
        """A step finished after the job was cancelled; its result was not applied."""

        step_number: int
        idempotency_key: str
        worker_id: str | None
        reason: str

    class Migrated(Event):
        """Moved to another version of its workflow definition, with the replay verdict
        that allowed it (or ``forced``, with who and why)."""

        from_version: int
        to_version: int
        forced: bool
        migrated_by: str | None
        reason: str | None
        replay_verdict: str

        def evolve(self, job: Job) -> None:
            job.workflow_version = self.to_version

    class Retried(Event):
        """A failed job reopened at the step that failed, as a new attempt of it under the
        same step key (``jobledger.domain.repair``): who, why, and on which version. The
        failure stays in the history before it."""

        step_number: int
        cause: str
        """The ``Failed`` cause it reopens (``step`` or ``definition``)."""
        from_version: int
        to_version: int
        retried_by: str
        reason: str
        replay_verdict: str
        """Replay of the recorded steps against ``to_version`` (the same version: not run)."""

        def evolve(self, job: Job) -> None:
            job.workflow_version = self.to_version
            job.reopen()

    class Reset(Event):
        """The job runs again from after its step ``step_number``: the steps recorded after
        it are superseded, and re-run under the new ``epoch`` (new step keys). The state,
        cursor and visits are those the job had before its next step ran then."""

        step_number: int
        epoch: int
        from_version: int
        to_version: int
        reset_by: str
        reason: str
        replay_verdict: str
        state: JSON
        cursor: str | None
        visits: dict[str, int]
        approved_edit: JSON | None = None
        """The approver's edit the job held as of step N: a decision the reset keeps
        (N is the approval's step) keeps its edit for the step it leads to."""
        stored_when_set = frozenset({"approved_edit"})

        def evolve(self, job: Job) -> None:
            job.workflow_version = self.to_version
            job.epoch = self.epoch
            # The edit of a decision the reset undoes goes with it; a kept one stays.
            job.approved_edit = deepcopy(self.approved_edit)
            job.current_step = self.step_number
            job.cursor = self.cursor
            job.visits = dict(self.visits)
            job.state = deepcopy(self.state)
            job.join = None
            # The children of the steps it runs again are no longer waited on.
            job.children = {
                child_id: {**plan, fan_out.SUPERSEDED: True}
                if plan["step_number"] > self.step_number
                else plan
                for child_id, plan in job.children.items()
            }
            job.reopen()

    class ForkedFrom(Event):
        """A fork's second event, in its submit's append: the job it was forked from and
        where. The fork starts after ``step_number`` with that job's state then (its own
        ``Submitted.state``), cursor and visits; it never ran the steps before."""

        origin_job_id: str
        step_number: int
        cursor: str | None
        visits: dict[str, int]
        forked_by: str
        reason: str
        approved_edit: JSON | None = None
        """The approver's edit the origin held as of step N, for the step the fork runs next."""
        stored_when_set = frozenset({"approved_edit"})

        def evolve(self, job: Job) -> None:
            job.forked_from = {"job_id": self.origin_job_id, "step_number": self.step_number}
            job.current_step = self.step_number
            job.cursor = self.cursor
            job.visits = dict(self.visits)
            job.approved_edit = deepcopy(self.approved_edit)

    class Forked(Event):
        """This job was forked at ``step_number`` into ``fork_job_id`` (whose history
        names this one in its ``ForkedFrom``). Changes nothing here."""

        fork_job_id: str
        step_number: int
        forked_by: str
        reason: str

    class ApprovalRerouted(Event):
        """The open approval request as another definition version words it (after a
        migration): the same request, bound to the same action, with that version's
        approvers, expiry and routes."""

        approval: JSON
        reason: str

        def evolve(self, job: Job) -> None:
            job.pending_approval = ApprovalGate.from_dict(self.approval)

    class Erased(Event):
        """The data subject's key was destroyed on request: the job's personal values
        (``paths``, sealed with key ``key_id``) are unreadable from here on, in every
        event that holds them. Written before the key is deleted."""

        key_id: str
        paths: list[str]
        erased_by: str
        reason: str

        def evolve(self, job: Job) -> None:
            job.personal_data_erased = True
            # A process that still holds the job in memory stops serving the plaintext.
            job.state = erasure.replaced(job.state, self.paths, erasure.ERASED)
            job.inbox = tuple(
                replace(m, payload=erasure.replaced(m.payload, self.paths, erasure.ERASED))
                for m in job.inbox
            )

    # ---- creation -------------------------------------------------------------------

    @classmethod
    def submit(
        cls,
        *,
        tenant_id: str,
        job_id: str,
        workflow_type: str,
        workflow_version: int,
        state: JSON,
        budget: JSON,
        mission_id: str | None,
        employee_id: str | None,
        correlation_id: str | None,
        submit_key: str | None,
        timestamp: datetime,
        key_scheme: int = KEY_SCHEME,
        personal_data: tuple[str, ...] = (),
        personal_data_key: str | None = None,
        trace_context: Mapping[str, str] | None = None,
        parent: JSON | None = None,
        priority: int | None = None,
    ) -> Job:
        return cls._create(
            cls.Submitted,
            id=job_uuid(tenant_id, job_id),
            timestamp=timestamp,
            chain_hash="",
            tenant_id=tenant_id,
            job_id=job_id,
            workflow_type=workflow_type,
            workflow_version=workflow_version,
            state=state,
            budget=budget,
            mission_id=mission_id,
            employee_id=employee_id,
            correlation_id=correlation_id,
            submit_key=submit_key,
            key_scheme=key_scheme,
            personal_data=list(personal_data) if personal_data else None,
            personal_data_key=personal_data_key,
            trace_context=dict(trace_context) if trace_context else None,
            parent=parent,
            priority=priority,
        )

    # ---- commands: each checks its precondition, then appends one event ---------------

    def claim(
        self,
        *,
        worker_id: str,
        claim_id: str,
        lease_until: datetime,
        reason: str,
        now: datetime,
    ) -> None:
        if not self.is_claimable(now):
            raise ValueError(f"job {self.job_id!r} is {self.status}, not claimable")
        self._append(
            Job.Claimed,
            now,
            worker_id=worker_id,
            claim_id=claim_id,
            lease_until=lease_until,
            reason=reason,
            previous_status=self.status,
            previous_worker_id=self.worker_id if self.status is JobStatus.RUNNING else None,
        )

    def record_step(
        self,
        *,
        step_number: int,
        step_type: str,
        triggered_by: str,
        idempotency_key: str,
        started_at: datetime,
        ended_at: datetime,
        output: JSON,
        state_patch: JSON,
        cost_usd: Decimal,
        transition_reason: str,
        next_status: JobStatus,
        resume_at: datetime | None,
        wait_event: JSON | None,
        worker_id: str | None,
        step_name: str | None = None,
        next_step: str | None = None,
        input_sha256: str | None = None,
        continuation: Claim | None = None,
    ) -> None:
        """``continuation``: the claim the job goes on under, folded into the step; only a
        step that leaves the job queued goes on."""
        if step_number != self.current_step + 1:
            raise ValueError(f"step {step_number} does not follow step {self.current_step}")
        if next_status not in TRANSITION_STATUSES:
            raise ValueError(f"a step cannot move a job to {next_status}")
        if continuation is not None and next_status is not JobStatus.QUEUED:
            raise ValueError(f"a step to {next_status} leaves nothing to go on with")
        self._append(
            Job.StepRecorded,
            ended_at,
            step_number=step_number,
            step_type=step_type,
            triggered_by=triggered_by,
            idempotency_key=idempotency_key,
            started_at=started_at,
            ended_at=ended_at,
            duration_ms=max(0, int((ended_at - started_at).total_seconds() * 1000)),
            output=output,
            state_patch=state_patch,
            cost_usd=cost_usd,
            transition_reason=transition_reason,
            next_status=next_status,
            resume_at=resume_at,
            wait_event=wait_event,
            worker_id=worker_id,
            step_name=step_name,
            next_step=next_step,
            input_sha256=input_sha256,
            **Claim.fields(continuation),
        )

    def defer_for_cost_ceiling(
        self, *, spend_usd: Decimal, ceiling_usd: Decimal, resume_at: datetime, now: datetime
    ) -> None:
        self._append(
            Job.CostCeilingDeferred,
            now,
            step_number=self.current_step + 1,
            spend_usd=spend_usd,
            ceiling_usd=ceiling_usd,
            resume_at=resume_at,
        )

    def schedule_retry(
        self, *, error: str, error_kind: str, resume_at: datetime, now: datetime
    ) -> None:
        self._append(
            Job.RetryScheduled,
            now,
            step_number=self.current_step + 1,
            attempt=self.attempt + 1,
            error=error,
            error_kind=error_kind,
            resume_at=resume_at,
        )

    def fail(self, *, error: str, cause: str, now: datetime) -> None:
        self._check_not_finished()
        self._append(Job.Failed, now, step_number=self.current_step + 1, error=error, cause=cause)

    def request_approval(
        self,
        *,
        approval_id: str,
        attempt: int,
        action_sha256: str,
        approvers: list[str],
        expires_at: datetime | None,
        on_approve: str | None,
        on_reject: str | None,
        on_expire: str | None,
        now: datetime,
        quorum: int | None = None,
    ) -> None:
        if self.status is not JobStatus.AWAITING_APPROVAL:
            raise ValueError("an approval is requested by a step that awaits approval")
        self._append(
            Job.ApprovalRequested,
            now,
            approval_id=approval_id,
            step_number=self.current_step,
            attempt=attempt,
            action_sha256=action_sha256,
            approvers=approvers,
            expires_at=expires_at,
            on_approve=on_approve,
            on_reject=on_reject,
            on_expire=on_expire,
            quorum=quorum,
        )

    def decide_approval(
        self,
        *,
        approval_id: str,
        decision: str,
        decided_by: str,
        comment: str | None,
        action_sha256: str | None,
        now: datetime,
        edit: JSON | None = None,
        editable: Collection[str] | None = None,
        data: JSON | None = None,
    ) -> None:
        """Approve or reject the open request: the one named, on the action that was
        shown (when its hash is given), before it expires, by someone allowed. On a
        quorum request the decision is one vote (``_cast_vote``). ``edit``: new values
        for params of the step the approval leads to, among ``editable`` (that step's
        params as its definition gives them; None: no definition says); ``data``: what
        lands in the job's state for the steps after it."""
        approval = self._open_gate(approval_id)
        self._check_decider(approval, decided_by, action_sha256, now)
        if edit is not None:
            check_edit(approval, decision, edit, editable)
        if approval.quorum is not None:
            self._cast_vote(approval, decision, decided_by, comment, data, now)
            return
        self._decide(approval, decision, decided_by, comment, edit=edit, data=data, now=now)

    def reassign_approval(
        self,
        *,
        approval_id: str,
        approvers: list[str],
        reassigned_by: str,
        reason: str,
        now: datetime,
    ) -> None:
        """Move the open request to ``approvers``: the ones listed before may no longer
        decide. The votes already cast stay counted; a list that leaves a quorum out of
        reach is refused."""
        approval = self._open_gate(approval_id)
        if not approvers:
            raise InvalidPayloadError("a request is reassigned to one approver or more")
        if len(set(approvers)) != len(approvers):
            raise InvalidPayloadError(f"approvers listed more than once: {', '.join(approvers)}")
        if list(approvers) == list(approval.approvers):
            raise InvalidPayloadError(f"approval {approval_id!r} is already theirs")
        moved = replace(approval, approvers=tuple(approvers))
        if approval.quorum is not None and moved.outcome() is not None:
            raise InvalidPayloadError(
                f"approval {approval_id!r} needs {approval.quorum} approvals and has "
                f"{len(approval.tally(APPROVED))}: {len(moved.yet_to_vote())} approver(s) "
                "yet to vote cannot reach it"
            )
        self._append(
            Job.ApprovalReassigned,
            now,
            approval_id=approval_id,
            approvers=list(approvers),
            previous_approvers=list(approval.approvers),
            reassigned_by=reassigned_by,
            reason=reason,
        )

    def _check_decider(
        self, approval: ApprovalGate, name: str, action_sha256: str | None, now: datetime
    ) -> None:
        approval_id = approval.approval_id
        if action_sha256 is not None and action_sha256 != approval.action_sha256:
            raise StaleApprovalError("the action to approve changed since it was shown")
        expires_at = approval.expires_at
        if expires_at is not None and now >= expires_at:
            raise StaleApprovalError(
                f"approval {approval_id!r} expired at {expires_at.isoformat()}"
            )
        if approval.approvers and name not in approval.approvers:
            raise UnauthorisedDeciderError(
                f"{name!r} may not decide approval {approval_id!r}; allowed: "
                f"{', '.join(approval.approvers)}"
            )
        if approval.voted(name):
            raise AlreadyVotedError(f"{name!r} already voted on approval {approval_id!r}")

    def _cast_vote(
        self,
        approval: ApprovalGate,
        decision: str,
        voted_by: str,
        comment: str | None,
        data: JSON | None,
        now: datetime,
    ) -> None:
        """One vote; the decision follows in the same append once the votes settle it,
        by the voters of the side that won, with their data merged in vote order."""
        self._append(
            Job.ApprovalVoted,
            now,
            approval_id=approval.approval_id,
            step_number=approval.step_number,
            attempt=approval.attempt,
            action_sha256=approval.action_sha256,
            decision=decision,
            voted_by=voted_by,
            comment=comment,
            data=data,
            data_sha256=None if data is None else answer_sha256(data),
        )
        counted = self.pending_approval
        assert counted is not None
        outcome = counted.outcome()
        if outcome is None:
            return
        side = counted.tally(outcome)
        answers = [vote.data for vote in side if vote.data is not None]
        merged = {key: value for answer in answers for key, value in answer.items()}
        self._decide(
            counted,
            outcome,
            ", ".join(vote.voter for vote in side),
            comment,
            edit=None,
            data=merged if answers else None,
            now=now,
        )

    def _decide(
        self,
        approval: ApprovalGate,
        decision: str,
        decided_by: str,
        comment: str | None,
        *,
        edit: JSON | None,
        data: JSON | None,
        now: datetime,
    ) -> None:
        next_step = approval.next_step(decision == APPROVED)
        self._append(
            Job.ApprovalDecided,
            now,
            approval_id=approval.approval_id,
            decision=decision,
            decided_by=decided_by,
            comment=comment,
            next_step=next_step,
            edit=edit,
            edit_sha256=None if edit is None else answer_sha256(edit),
            data=data,
            data_sha256=None if data is None else answer_sha256(data),
        )
        if decision != APPROVED and next_step is None:
            self.fail(
                error=f"rejected by {decided_by}: {comment or 'no comment'}",
                cause="rejected",
                now=now,
            )

    def spawn_children(
        self, *, step_number: int, children: list[JSON], join: JSON, now: datetime
    ) -> None:
        if self.status is not JobStatus.WAITING_CHILDREN:
            raise ValueError("children are spawned by a step that waits for them")
        self._append(
            Job.ChildrenSpawned, now, step_number=step_number, children=children, join=join
        )

    def record_child_end(
        self,
        *,
        child_job_id: str,
        status: str,
        result: JSON,
        error: str | None,
        cost_usd: Decimal,
        now: datetime,
    ) -> None:
        """Keep a child's end, once: a second report of the same child is refused."""
        self._check_not_finished()
        child = self.children.get(child_job_id)
        if child is None:
            raise ValueError(f"job {self.job_id!r} spawned no child {child_job_id!r}")
        if child["end"] is not None:
            raise ValueError(f"the end of child {child_job_id!r} is already recorded")
        self._append(
            Job.ChildFinished,
            now,
            child_job_id=child_job_id,
            status=status,
            result=result,
            error=error,
            cost_usd=cost_usd,
        )

    def join_children(self, *, results: list[JSON], next_step: str | None, now: datetime) -> None:
        assert self.join is not None and self.status is JobStatus.WAITING_CHILDREN
        self._append(
            Job.ChildrenJoined,
            now,
            step_number=self.join["step_number"],
            results_key=self.join["results"],
            results=results,
            next_step=next_step,
        )

    def time_out_join(self, *, results: list[JSON], now: datetime) -> None:
        assert self.join is not None and self.status is JobStatus.WAITING_CHILDREN
        on_timeout = self.join["on_timeout"]
        self._append(
            Job.JoinTimedOut,
            now,
            step_number=self.join["step_number"],
            results_key=self.join["results"],
            results=results,
            next_step=on_timeout,
        )
        if on_timeout is None:
            self.fail(error="timed out waiting for its children", cause="join_timeout", now=now)

    def expire_approval(self, *, now: datetime) -> None:
        assert self.pending_approval is not None
        approval = self.pending_approval
        self._append(
            Job.ApprovalExpired,
            now,
            approval_id=approval.approval_id,
            next_step=approval.on_expire,
        )
        if approval.on_expire is None:
            self.fail(
                error=f"approval {approval.approval_id} expired undecided",
                cause="approval_expired",
                now=now,
            )

    def deliver_signal(
        self,
        *,
        signal_id: str,
        event_name: str,
        payload: JSON,
        now: datetime,
        claim: Claim | None = None,
    ) -> bool:
        """Resume the job if it waits for this event (True), else keep the signal until a
        wait for it opens (False). ``claim`` is folded into a resume, never a buffering."""
        if self.status.is_terminal:
            raise JobFinishedError(f"job {self.job_id!r} is {self.status}; signal not delivered")
        wait = self.wait_event
        if self.status is JobStatus.WAITING_EVENT and wait is not None and wait.name == event_name:
            self.resume(source="signal", payload=payload, now=now, signal_id=signal_id, claim=claim)
            return True
        self.buffer_signal(signal_id=signal_id, event_name=event_name, payload=payload, now=now)
        return False

    def buffer_signal(
        self, *, signal_id: str, event_name: str, payload: JSON, now: datetime
    ) -> None:
        self._append(
            Job.SignalBuffered, now, signal_id=signal_id, event_name=event_name, payload=payload
        )

    def resume(
        self,
        *,
        source: str,
        payload: JSON,
        now: datetime,
        nonce: str | None = None,
        signal_id: str | None = None,
        claim: Claim | None = None,
    ) -> None:
        """``claim``: the claim of the tick this resume wakes, folded into the resume."""
        assert self.wait_event is not None and self.status is JobStatus.WAITING_EVENT
        self._append(
            Job.Resumed,
            now,
            event_name=self.wait_event.name,
            source=source,
            nonce=nonce,
            signal_id=signal_id,
            payload=payload,
            **Claim.fields(claim),
        )

    def resume_by_token(
        self,
        *,
        step_number: int,
        event_name: str,
        nonce: str,
        token_sha256: str,
        payload: JSON,
        now: datetime,
        claim: Claim | None = None,
    ) -> None:
        """Resume with a verified token: it must be the one issued for the wait the job
        is in right now (its step, its event, its nonce and exact bytes)."""
        wait = self.open_wait()
        if step_number != self.current_step:
            raise TokenMismatchError(
                f"the token is for step {step_number}; the job waits at step {self.current_step}"
            )
        if event_name != wait.name:
            raise TokenMismatchError(
                f"the token is for event {event_name!r}; the job waits for {wait.name!r}"
            )
        if nonce != wait.nonce or token_sha256 != wait.token_sha256:
            raise TokenMismatchError("the token is not the one issued for this wait")
        self.resume(source="token", payload=payload, now=now, nonce=nonce, claim=claim)

    def buffered_signal(self) -> BufferedSignal | None:
        """The oldest kept signal for the event this job now waits for, if any."""
        if self.wait_event is None:
            return None
        name = self.wait_event.name
        return next((m for m in self.inbox if m.event_name == name), None)

    def reissue_token(
        self,
        *,
        nonce: str,
        token_sha256: str,
        expires_at: datetime,
        reissued_by: str,
        now: datetime,
    ) -> None:
        wait = self.open_wait()
        self._append(
            Job.ResumeTokenReissued,
            now,
            nonce=nonce,
            token_sha256=token_sha256,
            expires_at=expires_at,
            previous_nonce=wait.nonce,
            reissued_by=reissued_by,
        )

    def time_out_wait(self, *, now: datetime) -> None:
        assert self.wait_event is not None
        name, on_timeout = self.wait_event.name, self.wait_event.on_timeout
        self._append(Job.WaitTimedOut, now, event_name=name, next_step=on_timeout)
        if on_timeout is None:
            self.fail(error=f"timed out waiting for {name!r}", cause="wait_timeout", now=now)

    def exceed_budget(self, *, limit: str, used: str, allowed: str, now: datetime) -> None:
        self._append(
            Job.BudgetExceeded,
            now,
            limit=limit,
            used=used,
            allowed=allowed,
            deadline_at=self.deadline_at,
        )

    def raise_budget(self, *, raised_by: str, reason: str, budget: JSON, now: datetime) -> None:
        self._check_not_finished()
        self._append(Job.BudgetRaised, now, raised_by=raised_by, reason=reason, budget=budget)

    def cancel(self, *, reason: str, cancelled_by: str, now: datetime) -> None:
        self._check_not_finished()
        self._append(Job.Cancelled, now, reason=reason, cancelled_by=cancelled_by)

    def discard_late_result(
        self, *, step_number: int, idempotency_key: str, worker_id: str | None, now: datetime
    ) -> None:
        self._append(
            Job.LateResultDiscarded,
            now,
            step_number=step_number,
            idempotency_key=idempotency_key,
            worker_id=worker_id,
            reason=f"the job was {self.status} when the step finished",
        )

    def migrate(
        self,
        *,
        to_version: int,
        forced: bool,
        migrated_by: str | None,
        reason: str | None,
        replay_verdict: str,
        now: datetime,
        approval: ApprovalGate | None = None,
    ) -> None:
        self._check_not_finished()
        if to_version == self.workflow_version:
            raise ValueError(f"job {self.job_id!r} is already on v{to_version}")
        from_version = self.workflow_version
        self._append(
            Job.Migrated,
            now,
            from_version=from_version,
            to_version=to_version,
            forced=forced,
            migrated_by=migrated_by,
            reason=reason,
            replay_verdict=replay_verdict,
        )
        if approval is not None:
            why = f"migrated from v{from_version} to v{to_version}"
            self._append(Job.ApprovalRerouted, now, approval=approval.to_dict(), reason=why)

    def retry(
        self,
        *,
        cause: str,
        to_version: int,
        retried_by: str,
        reason: str,
        replay_verdict: str,
        now: datetime,
    ) -> None:
        """Reopen a failed job at the step that failed (the caller checked the rules of
        ``jobledger.domain.repair``)."""
        if self.status is not JobStatus.FAILED:
            raise ValueError(f"job {self.job_id!r} is {self.status}, not failed")
        self._append(
            Job.Retried,
            now,
            step_number=self.current_step + 1,
            cause=cause,
            from_version=self.workflow_version,
            to_version=to_version,
            retried_by=retried_by,
            reason=reason,
            replay_verdict=replay_verdict,
        )

    def reset(
        self,
        *,
        step_number: int,
        as_of: Job,
        to_version: int,
        reset_by: str,
        reason: str,
        replay_verdict: str,
        now: datetime,
    ) -> None:
        """Run again from after ``step_number``, with the state ``as_of`` held (the job
        folded up to just before its next step then), under the next epoch."""
        self._append(
            Job.Reset,
            now,
            step_number=step_number,
            epoch=self.epoch + 1,
            from_version=self.workflow_version,
            to_version=to_version,
            reset_by=reset_by,
            reason=reason,
            replay_verdict=replay_verdict,
            state=deepcopy(as_of.state),
            cursor=as_of.cursor,
            visits=dict(as_of.visits),
            approved_edit=deepcopy(as_of.approved_edit),
        )

    def start_fork(
        self, *, origin: Job, step_number: int, forked_by: str, reason: str, now: datetime
    ) -> None:
        """The fork's own record of its origin (``origin`` folded as of the fork point)."""
        self._append(
            Job.ForkedFrom,
            now,
            origin_job_id=origin.job_id,
            step_number=step_number,
            cursor=origin.cursor,
            visits=dict(origin.visits),
            forked_by=forked_by,
            reason=reason,
            approved_edit=deepcopy(origin.approved_edit),
        )

    def note_fork(
        self, *, fork_job_id: str, step_number: int, forked_by: str, reason: str, now: datetime
    ) -> None:
        self._append(
            Job.Forked,
            now,
            fork_job_id=fork_job_id,
            step_number=step_number,
            forked_by=forked_by,
            reason=reason,
        )

    def erase(self, *, key_id: str, erased_by: str, reason: str, now: datetime) -> None:
        """Record that the key of this job's personal values is being destroyed. A
        finished job is erased too: its history still holds the values."""
        if key_id != self.personal_data_key:
            raise ValueError(f"job {self.job_id!r} holds no values sealed with key {key_id!r}")
        paths = list(self.personal_data)
        self._append(
            Job.Erased, now, key_id=key_id, paths=paths, erased_by=erased_by, reason=reason
        )

    # ---- the preconditions commands share ---------------------------------------------

    def open_wait(self) -> EventWait:
        """The event wait the job is in, for a command that acts on it (its tokens die
        with the job, and mean nothing while it is not waiting)."""
        if self.status.is_terminal:
            raise JobFinishedError(f"job {self.job_id!r} is {self.status}; its tokens are void")
        if self.status is not JobStatus.WAITING_EVENT or self.wait_event is None:
            raise JobNotWaitingError(
                f"job {self.job_id!r} is {self.status}, not waiting for an event"
            )
        return self.wait_event

    def _open_gate(self, approval_id: str) -> ApprovalGate:
        """The approval request open now, if it is the one named."""
        if self.status.is_terminal:
            raise JobFinishedError(f"job {self.job_id!r} is {self.status}; approvals are void")
        gate = self.pending_approval
        if self.status is not JobStatus.AWAITING_APPROVAL or gate is None:
            raise StaleApprovalError(f"job {self.job_id!r} is {self.status}, not awaiting approval")
        if gate.approval_id != approval_id:
            raise StaleApprovalError(
                f"approval {approval_id!r} is not the open request; the open one is "
                f"{gate.approval_id!r}"
            )
        return gate

    def _check_not_finished(self) -> None:
        if self.status.is_terminal:
            raise JobFinishedError(f"job {self.job_id!r} is already {self.status}")

    # ---- queries ----------------------------------------------------------------------

    def is_claimable(self, now: datetime) -> bool:
        """Queued, a due timer, or a running claim whose holder let its lease lapse."""
        if self.status is JobStatus.QUEUED:
            return True
        if self.status is JobStatus.WAITING_TIME:
            return self.resume_at is None or self.resume_at <= now
        if self.status is JobStatus.RUNNING:
            return self.lease_until is not None and self.lease_until <= now
        return False

    def holds_claim(self, claim_id: str, now: datetime) -> bool:
        return (
            self.status is JobStatus.RUNNING
            and self.claim_id == claim_id
            and self.lease_until is not None
            and self.lease_until > now
        )

    def step_in_flight(self, claim_id: str) -> bool:
        """Still running under that claim, lapsed lease or not. Whatever landed since the
        claim left it so (a buffered signal, a budget change) commutes with the step."""
        return self.status is JobStatus.RUNNING and self.claim_id == claim_id

    @property
    def deadline_at(self) -> datetime | None:
        return self.budget.deadline_at

    @property
    def due_at(self) -> datetime | None:
        """When a tick should next look at this job unasked (see ``due_moment``)."""
        return due_moment(
            self.status,
            resume_at=self.resume_at,
            lease_until=self.lease_until,
            deadline_at=self.deadline_at,
            since=self.modified_on,
        )

    @property
    def wait_ends_at(self) -> datetime | None:
        """When the event wait the job is in ends on its own: its timeout or the job's
        deadline, whichever comes first; None when it may last for ever."""
        if self.status is not JobStatus.WAITING_EVENT:
            return None
        return _earliest(self.resume_at, self.deadline_at)

    def is_overdue(self, now: datetime) -> bool:
        """Timeouts of a wait or an approval request are due like timers."""
        return self.status in _TIMED_WAITS and self.resume_at is not None and self.resume_at <= now

    def leave_wait(self, next_step: str | None) -> None:
        """A wait or an approval gate ended (decided, expired, timed out): go on there."""
        self.pending_approval = None
        self.wait_event = None
        self.resume_at = None
        self.status = JobStatus.QUEUED
        self.cursor = next_step

    def reopen(self) -> None:
        """Runnable again after a repair (a retry, a reset): whatever the job waited on
        or ended with is behind it."""
        self.status = JobStatus.QUEUED
        self.completed_at = None
        self.last_error = None
        self.attempt = 0
        self.resume_at = None
        self.wait_event = None
        self.pending_approval = None
        self.release_lease()

    def release_lease(self) -> None:
        self.claim_id = None
        self.worker_id = None
        self.lease_until = None

    def hold(self, claim: Claim) -> None:
        """Running under ``claim``: a ``Claimed``, or a claim folded into a step or a resume."""
        self.status = JobStatus.RUNNING
        self.claim_id = claim.claim_id
        self.worker_id = claim.worker_id
        self.lease_until = claim.lease_until
        self.resume_at = None

    # ---- the chain --------------------------------------------------------------------

    def _append(self, event_class: type[Job.Event], timestamp: datetime, **data: Any) -> None:
        """Trigger an event; the store hashes (and seals, and signs) it as it writes it."""
        self.trigger_event(event_class, timestamp=timestamp, chain_hash="", **data)


_TIMED_WAITS = (JobStatus.WAITING_EVENT, JobStatus.AWAITING_APPROVAL, JobStatus.WAITING_CHILDREN)
_FAMILY_DEFAULTS: Mapping[str, Any] = {
    "parent": None,
    "children": {},
    "join": None,
    "children_cost_usd": Decimal(0),
}
"""A job's family fields as a job without parent or children holds them."""
_OMITTED_WHEN_EMPTY: Mapping[str, Any] = {**_FAMILY_DEFAULTS, "epoch": 0, "forked_from": None}
"""Fields a snapshot keeps only when set, so a job without them keeps its bytes."""


def due_moment(
    status: JobStatus,
    *,
    resume_at: datetime | None,
    lease_until: datetime | None,
    deadline_at: datetime | None,
    since: datetime,
) -> datetime | None:
    """The one rule for when a job is due, read by the tick's own scheduling, the status
    view and so the reconciler.

    A parked job (a timer, an event wait, an approval, a budget limit) is due at the
    earliest of its ``resume_at`` (timer, wait timeout, approval expiry) and its
    deadline, so a deadline is enforced while it waits. A running job is due when its
    lease lapses: a live step is not cut short, its deadline is checked when the step
    ends or the lease lapses. A queued job is due from the moment it became runnable
    (``since``); a finished one never.
    """
    if status.is_terminal:
        return None
    if status is JobStatus.RUNNING:
        return lease_until
    if status in (JobStatus.QUEUED, JobStatus.WAITING_CHILDREN):
        # A join is resumed by its children's ends; were one lost, the reconciler looks
        # at the job once it has not moved for a while (``Reconciler.lost_tick_after``).
        return since
    return _earliest(resume_at, deadline_at)


def _earliest(*moments: datetime | None) -> datetime | None:
    return min((m for m in moments if m is not None), default=None)


keep_stored_topics("jobledger.job", Job)
