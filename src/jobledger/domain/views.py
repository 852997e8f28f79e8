"""Read-only views of a job and its history, safe to hand to callers and adapters."""

from __future__ import annotations

from collections.abc import Mapping
from copy import deepcopy
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from typing import Any

from jobledger.domain import chain, erasure
from jobledger.domain.admission import DEFAULT_PRIORITY
from jobledger.domain.job import Job
from jobledger.domain.read_only import FrozenDict
from jobledger.domain.status import JobStatus
from jobledger.domain.substate import ApprovalGate


@dataclass(frozen=True)
class JobView:
    tenant_id: str
    job_id: str
    workflow_type: str
    workflow_version: int
    status: JobStatus
    current_step: int
    state: Mapping[str, Any]
    """A deep copy (``of``), or a read-only view of the job's own (``read_only``)."""
    budget: Mapping[str, Any]
    version: int
    attempt: int
    total_steps_executed: int
    total_cost_usd: Decimal
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
    erased: tuple[str, ...] = ()
    """The paths of personal values in ``state`` that read as erased (their key is gone)."""
    priority: int = DEFAULT_PRIORITY
    """0-9, higher admitted first (``jobledger.domain.admission``)."""
    pending_approval: ApprovalGate | None = None
    """The open approval request in full: step, attempt, approvers, expiry, action hash."""
    wait: OpenWait | None = None
    """The event wait the job is in (never its token)."""

    @classmethod
    def of(cls, job: Job) -> JobView:
        """A snapshot the caller may keep and change: state and budget deep-copied."""
        return cls._of(job, deepcopy(job.state), job.budget.to_dict())

    @classmethod
    def read_only(cls, job: Job) -> JobView:
        """What the executor is handed, once per step: state and budget as read-only views
        of the job's own (``jobledger.domain.read_only``), no copy made."""
        return cls._of(job, FrozenDict(job.state), FrozenDict(job.budget.to_dict()))

    @classmethod
    def _of(cls, job: Job, state: Mapping[str, Any], budget: Mapping[str, Any]) -> JobView:
        return cls(
            tenant_id=job.tenant_id,
            job_id=job.job_id,
            workflow_type=job.workflow_type,
            workflow_version=job.workflow_version,
            status=job.status,
            current_step=job.current_step,
            state=state,
            budget=budget,
            version=job.version,
            attempt=job.attempt,
            total_steps_executed=job.total_steps_executed,
            total_cost_usd=job.total_cost_usd,
            resume_at=job.resume_at,
            wait_event_name=job.wait_event.name if job.wait_event else None,
            worker_id=job.worker_id,
            lease_until=job.lease_until,
            last_error=job.last_error,
            mission_id=job.mission_id,
            employee_id=job.employee_id,
            correlation_id=job.correlation_id,
            created_at=job.created_on,
            updated_at=job.modified_on,
            completed_at=job.completed_at,
            next_step=job.cursor,
            pending_approval_id=(
                job.pending_approval.approval_id if job.pending_approval else None
            ),
            buffered_signals=len(job.inbox),
            erased=tuple(erasure.erased_paths(job.state, job.personal_data)),
            priority=DEFAULT_PRIORITY if job.priority is None else job.priority,
            pending_approval=job.pending_approval,
            wait=OpenWait.of(job),
        )


@dataclass(frozen=True)
class OpenWait:
    """The event wait a job is in, as callers see it: its name, timeout and the current
    token's expiry and nonce (never the token, nor its hash)."""

    event: str
    step_number: int
    """The step that opened the wait: every recorded step sets (or clears) the wait."""
    timeout_at: datetime | None
    on_timeout: str | None
    token_expires_at: datetime
    token_nonce: str
    """The newest token's, after a reissue."""

    @classmethod
    def of(cls, job: Job) -> OpenWait | None:
        wait = job.wait_event
        if wait is None:
            return None
        # Positional, in the order of the fields above.
        return cls(
            wait.name, job.current_step, job.resume_at, wait.on_timeout, wait.expires_at, wait.nonce
        )


@dataclass(frozen=True)
class HistoryEntry:
    """One event of a job as an audit trail reads it."""

    version: int
    event_type: str
    timestamp: datetime
    data: dict[str, Any]
    chain_hash: str

    @classmethod
    def of(cls, event: Job.Event) -> HistoryEntry:
        fields = chain.event_fields(event)
        for name in ("originator_id", "originator_version", "timestamp", "originator_topic"):
            fields.pop(name, None)
        return cls(
            version=event.originator_version,
            event_type=type(event).__name__,
            timestamp=event.timestamp,
            data=fields,
            chain_hash=fields.pop(chain.CHAIN_FIELD),
        )


@dataclass(frozen=True)
class ChildRow:
    """One child a job's map step spawned, with its status now."""

    job_id: str
    step_number: int
    index: int
    workflow: str
    status: str
    """The child's status, or ``not spawned yet`` (a spawn the next tick finishes)."""


@dataclass(frozen=True)
class FamilyView:
    """A job's parent (the map step that spawned it) and the children it spawned."""

    parent: Mapping[str, Any] | None
    children: tuple[ChildRow, ...]
