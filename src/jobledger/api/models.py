"""The API's request and response bodies (pydantic: validated at the boundary, and the
OpenAPI document's schemas)."""

from __future__ import annotations

from datetime import datetime
from decimal import Decimal
from typing import Annotated, Any, Literal, Self

from pydantic import BaseModel, ConfigDict, Field, model_validator

from jobledger.api.approvals import ApprovalCard
from jobledger.domain.views import FamilyView, HistoryEntry, JobView
from jobledger.engine.erasure_commands import ErasureReport, Shred
from jobledger.orchestration.ports import BlockedNote
from jobledger.presentation.job_view import job_json
from jobledger.presentation.json_output import jsonable
from jobledger.projections.job_views import cursor
from jobledger.projections.status import StatusRow

Id = Field(min_length=1, max_length=200)


class Body(BaseModel):
    """A request body: unknown fields are refused, not ignored (a typo is not a no-op)."""

    model_config = ConfigDict(extra="forbid")


class Job(BaseModel):
    """A job now (or at a version): what ``jobledger show --json`` prints."""

    tenant_id: str
    job_id: str
    workflow_type: str
    workflow_version: int
    status: str
    current_step: int
    state: dict[str, Any]
    budget: dict[str, Any]
    version: int
    attempt: int
    total_steps_executed: int
    total_cost_usd: str
    resume_at: datetime | None
    wait_event_name: str | None
    worker_id: str | None
    lease_until: datetime | None
    last_error: str | None
    mission_id: str | None
    employee_id: str | None
    correlation_id: str | None
    created_at: datetime
    updated_at: datetime
    completed_at: datetime | None
    next_step: str | None
    pending_approval_id: str | None
    buffered_signals: int
    priority: int = 5
    """0-9, the higher admitted first among the tenant's queued jobs."""
    pending_approval: dict[str, Any] | None = None
    """The open approval request in full: step, attempt, approvers, expiry, action hash."""
    wait: dict[str, Any] | None = None
    """The event wait the job is in (never its token)."""
    blocked: dict[str, Any] | None = None

    @classmethod
    def of(cls, view: JobView, blocked: BlockedNote | None = None) -> Job:
        return cls.model_validate(job_json(view, blocked))


class Event(BaseModel):
    """One event of a job's history, with its chain hash."""

    version: int
    event_type: str
    timestamp: datetime
    data: dict[str, Any]
    chain_hash: str

    @classmethod
    def of(cls, entry: HistoryEntry) -> Event:
        return cls.model_validate(
            {
                "version": entry.version,
                "event_type": entry.event_type,
                "timestamp": entry.timestamp,
                "data": jsonable(entry.data),
                "chain_hash": entry.chain_hash,
            }
        )


class HistoryPage(BaseModel):
    events: list[Event]
    next_version: int | None
    """Where the next page starts (``?after=``), or null on the last page."""


class JobRow(BaseModel):
    """A row of the status view, as ``jobledger list --json`` prints it."""

    job_uuid: str
    tenant_id: str
    job_id: str
    workflow_type: str
    workflow_version: int
    status: str
    current_step: int
    next_step: str | None
    resume_at: datetime | None
    lease_until: datetime | None
    deadline_at: datetime | None
    due_at: datetime | None
    worker_id: str | None
    wait_event: str | None
    pending_approval: str | None
    cost_usd: str
    steps_executed: int
    last_error: str | None
    created_at: datetime
    updated_at: datetime
    version: int
    mission_id: str | None
    correlation_id: str | None
    blocked: dict[str, Any] | None
    cursor: str
    """Where a listing continues after this row."""

    @classmethod
    def of(cls, row: StatusRow, blocked: BlockedNote | None) -> JobRow:
        document = jsonable(
            {**vars(row), "cost_usd": row.cost_usd, "due_at": row.due_at, "blocked": blocked}
        )
        document.pop("cost_micros", None)
        return cls.model_validate({**document, "cursor": cursor(row)})


class JobPage(BaseModel):
    jobs: list[JobRow]
    next_cursor: str | None
    """Pass as ``?after=`` for the next page; null when this page is the last."""


class SubmitRequest(Body):
    job_id: str | None = Field(default=None, min_length=1, max_length=200)
    """Default: a new random id."""
    workflow_type: str = Id
    workflow_version: int | None = Field(default=None, ge=1)
    input: dict[str, Any] | None = None
    budget: dict[str, Any] | None = None
    idempotency_key: str | None = Field(default=None, min_length=1, max_length=200)
    """Same key (in this tenant), same job: a repeat answers 200 with the job it made."""
    mission_id: str | None = Field(default=None, min_length=1, max_length=200)
    employee_id: str | None = Field(default=None, min_length=1, max_length=200)
    correlation_id: str | None = Field(default=None, min_length=1, max_length=200)
    data_subject: str | None = Field(default=None, min_length=1, max_length=200)
    """Whose personal data the job holds (the workflow's ``personal_data``), sealed with
    that subject's key; without one, with a key of the job's own."""
    priority: int | None = Field(default=None, ge=0, le=9)
    """0-9, the higher started first among the tenant's queued jobs (default 5)."""


class SignalRequest(Body):
    event: str = Id
    signal_id: str = Id
    """Makes delivery idempotent: the same id again is ``duplicate``."""
    payload: dict[str, Any] | None = None


class SignalResult(BaseModel):
    outcome: Literal["resumed", "buffered", "duplicate"]
    job: Job


class DecisionRequest(Body):
    """The approver is the authenticated caller; it is not a field."""

    decision: Literal["approve", "reject"]
    comment: str | None = Field(default=None, max_length=10_000)
    action_sha256: str | None = Field(default=None, pattern=r"^[0-9a-f]{64}$")
    """The action hash the approver was shown; a decision on another action is refused."""
    edit: dict[str, Any] | None = None
    """New values for params of the step the approval leads to (only params it has):
    the step runs with them. Recorded with its sha256."""
    data: dict[str, Any] | None = None
    """An answer merged into the job's state for the steps after the decision. Recorded
    with its sha256."""


class ReassignRequest(Body):
    """Who reassigns is the authenticated caller; it is not a field."""

    approvers: list[Annotated[str, Field(min_length=1, max_length=200)]] = Field(min_length=1)
    reason: str = Field(min_length=1, max_length=10_000)


class BudgetRequest(Body):
    reason: str = Field(min_length=1, max_length=10_000)
    max_steps: int | None = Field(default=None, ge=1)
    max_cost_usd: Decimal | None = Field(default=None, ge=0)
    deadline_at: datetime | None = None


class CancelRequest(Body):
    reason: str = Field(min_length=1, max_length=10_000)


class ErasureRequest(Body):
    """Erase a data subject, or one job sealed with a key of its own. Who erases is the
    authenticated caller; it is not a field."""

    subject: str | None = Field(default=None, min_length=1, max_length=200)
    job_id: str | None = Field(default=None, min_length=1, max_length=200)
    reason: str = Field(min_length=1, max_length=10_000)

    @model_validator(mode="after")
    def _one_target(self) -> Self:
        if (self.subject is None) == (self.job_id is None):
            raise ValueError("give exactly one of subject and job_id")
        return self


class Erasure(BaseModel):
    """What was erased: what ``jobledger erase --json`` prints."""

    tenant: str
    keys: list[str]
    """The keys destroyed."""
    erased: list[str]
    """The jobs that recorded ``Erased`` now."""
    already_erased: list[str]
    """The jobs that had recorded it already (an erasure interrupted and run again)."""
    erased_at: datetime
    shred: Shred
    """``done``: the keys' bytes are gone from the database's files; ``pending`` (202):
    another connection's read transaction still keeps them there: ask again to finish."""

    @classmethod
    def of(cls, report: ErasureReport) -> Erasure:
        return cls(
            tenant=report.tenant_id,
            keys=list(report.key_ids),
            erased=list(report.erased),
            already_erased=list(report.already),
            erased_at=report.erased_at,
            shred=report.shred,
        )


class Verdict(BaseModel):
    """A job's chain: intact, or the first broken link."""

    tenant_id: str
    job_id: str
    intact: bool
    signatures_checked: bool = False
    """False: no keyring is configured, so who wrote the events was not checked."""
    broken_at: int | None = None
    event_type: str | None = None
    reason: str | None = None


class TenantVerdict(BaseModel):
    tenant_id: str
    jobs: int
    intact: bool
    broken: list[Verdict]
    signatures_checked: bool = False


class PartitionLag(BaseModel):
    partition: str
    last_event: int
    last_tracked: int
    behind: int


class Health(BaseModel):
    status: Literal["ok"]


class Approval(BaseModel):
    """An approval request as the person deciding sees it: what is being approved (the
    step's params and the state it rests on), the action hash a decision is bound to, who
    may decide and until when; and, once it is not open, how it ended."""

    tenant_id: str
    job_id: str
    workflow: str
    approval_id: str
    step_number: int
    step_name: str | None
    attempt: int
    action_sha256: str
    approvers: list[str]
    """Who may decide (empty: any approver of the tenant); after a reassignment, the
    approvers it named."""
    expires_at: datetime | None
    requested_at: datetime
    quorum: int | None = None
    """How many of ``approvers`` must approve (null: one decision decides)."""
    votes: list[dict[str, Any]] = []
    """The votes cast so far on a quorum request: ``voter``, ``decision``, ``at``."""
    params: dict[str, Any] | None
    """The step's params as its definition gives them (null: not known here)."""
    state: dict[str, Any]
    """The job's state when the request was made: the outputs the action rests on."""
    hash_matches: bool | None
    """Whether the step, params and state shown hash to ``action_sha256`` (null: the
    params are not known here, so it was not checked)."""
    open: bool
    outcome: str | None
    """How it ended when not open: who decided what, or that it expired."""

    @classmethod
    def of(cls, card: ApprovalCard) -> Approval:
        return cls.model_validate(jsonable(card))


class Child(BaseModel):
    """A child job a map step spawned, with its status now."""

    job_id: str
    step_number: int
    index: int
    """The item of the map step it runs."""
    workflow: str
    status: str
    """Its status, or ``not spawned yet`` (a spawn the parent's next tick finishes)."""


class JobWithFamily(Job):
    """A job now, with its parent and children: what ``jobledger show --json`` prints."""

    parent: dict[str, Any] | None
    """The map step that spawned it (``job_id``, ``step_number``, ``index``), or null."""
    children: list[Child]
    """The children it spawned, by step and item."""

    @classmethod
    def of_family(
        cls, view: JobView, family: FamilyView, blocked: BlockedNote | None = None
    ) -> JobWithFamily:
        return cls.model_validate({**job_json(view, blocked), **jsonable(family)})
