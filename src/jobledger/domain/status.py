"""The lifecycle of a job: every status it can be in, and what each one permits."""

from __future__ import annotations

from enum import StrEnum


class JobStatus(StrEnum):
    """Where a job stands. Each value is documented because audits read them."""

    QUEUED = "queued"
    """Runnable: the next step may be claimed by any worker."""
    RUNNING = "running"
    """A worker holds a lease on the job and is executing a step."""
    WAITING_TIME = "waiting_time"
    """A durable timer: runnable again once ``resume_at`` has passed."""
    WAITING_EVENT = "waiting_event"
    """Parked until an outside event (a resume token or a signal) arrives."""
    WAITING_CHILDREN = "waiting_children"
    """Parked until the children a map step spawned meet its join (or it times out)."""
    AWAITING_APPROVAL = "awaiting_approval"
    """Parked until a person approves or rejects the pending request."""
    BUDGET_EXCEEDED = "budget_exceeded"
    """Parked: a budget limit was reached; raising the budget lets it go on, otherwise it
    fails at its deadline."""
    COMPLETED = "completed"
    """Terminal: the workflow finished."""
    FAILED = "failed"
    """Terminal: a step or the definition failed; the error is in the history."""
    CANCELLED = "cancelled"
    """Terminal: stopped on request; late step results are discarded."""

    @property
    def is_terminal(self) -> bool:
        return self in TERMINAL_STATUSES

    @property
    def is_runnable(self) -> bool:
        return self is JobStatus.QUEUED


TERMINAL_STATUSES = frozenset({JobStatus.COMPLETED, JobStatus.FAILED, JobStatus.CANCELLED})

# Statuses a step's resolution may move a job to (running is only ever set by a claim).
TRANSITION_STATUSES = frozenset(JobStatus) - {
    JobStatus.RUNNING,
    JobStatus.CANCELLED,
    JobStatus.BUDGET_EXCEEDED,
}


class UnknownStatusError(ValueError):
    def __init__(self, unknown: list[str]) -> None:
        self.unknown = unknown
        self.known = sorted(status.value for status in JobStatus)
        super().__init__(f"unknown status {', '.join(unknown)}; known: {', '.join(self.known)}")


def parse_statuses(raw: str | None) -> list[str]:
    """A comma-separated list of status names (a listing's filter); UnknownStatusError
    names the ones that are not statuses."""
    if raw is None:
        return []
    names = [part.strip() for part in raw.split(",") if part.strip()]
    known = {status.value for status in JobStatus}
    unknown = [name for name in names if name not in known]
    if unknown:
        raise UnknownStatusError(unknown)
    return names
