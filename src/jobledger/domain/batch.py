"""The Batch aggregate: one action over the jobs a query matched, and each job's outcome.

``Created`` freezes the matched job ids at the start, so a resumed run acts on the same
jobs whatever changed since. Each job then gets exactly one outcome event (applied,
skipped with the reason, failed with the error); a run resumes from the first job
without one. That the action itself lands once per job is not this aggregate's doing: the
action consumes the job-scoped key ``(BATCH, batch id)`` in the job's own append
(:mod:`jobledger.domain.keys`), and a resumed run asks for that key before acting.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Any
from uuid import UUID, uuid5

from eventsourcing.domain import Aggregate

from jobledger.domain.stored_topics import keep_stored_topics

JSON = dict[str, Any]
BATCH_NAMESPACE = UUID("a4c1d6e2-5b7f-4e09-8c3a-71f2b9d04e58")


def batch_uuid(tenant_id: str, batch_id: str) -> UUID:
    """A batch's aggregate id: its tenant and its id, as a job's is."""
    return uuid5(BATCH_NAMESPACE, f"{len(tenant_id)}:{tenant_id}/{batch_id}")


class Outcome(StrEnum):
    APPLIED = "applied"
    SKIPPED = "skipped"
    """The job refused the action as it stood (already finished, not waiting, ...)."""
    FAILED = "failed"
    """The action raised an error the job did not decide (contention that outlasted its
    retries, a bug): named, so it can be acted on again alone."""


@dataclass(frozen=True)
class JobOutcome:
    job_id: str
    outcome: Outcome
    detail: str
    at: datetime


class Batch(Aggregate):
    tenant_id: str
    batch_id: str
    action: str
    params: JSON
    query: JSON
    by: str
    reason: str
    job_ids: list[str]
    outcomes: dict[str, JobOutcome]
    created_at: datetime
    finished_at: datetime | None

    def __init__(self) -> None:
        """State is set by ``Created``: the events, not the constructor, define a batch."""

    class Event(Aggregate.Event):
        def apply(self, aggregate: Any) -> None:
            assert isinstance(aggregate, Batch)
            self.evolve(aggregate)

        def evolve(self, batch: Batch) -> None:
            """What this event changes; overridden by each event type."""

    class Created(Event, Aggregate.Created):
        tenant_id: str
        batch_id: str
        action: str
        params: JSON
        query: JSON
        by: str
        reason: str
        job_ids: list[str]

        def evolve(self, batch: Batch) -> None:
            batch.tenant_id, batch.batch_id = self.tenant_id, self.batch_id
            batch.action, batch.params, batch.query = self.action, dict(self.params), self.query
            batch.by, batch.reason = self.by, self.reason
            batch.job_ids = list(self.job_ids)
            batch.outcomes = {}
            batch.created_at, batch.finished_at = self.timestamp, None

    class JobDone(Event):
        """One job's outcome: ``outcome`` is an :class:`Outcome`, ``detail`` the reason
        it was skipped or the error it failed with (empty when applied)."""

        job_id: str
        outcome: str
        detail: str

        def evolve(self, batch: Batch) -> None:
            done = JobOutcome(self.job_id, Outcome(self.outcome), self.detail, self.timestamp)
            batch.outcomes[self.job_id] = done

    class Finished(Event):
        def evolve(self, batch: Batch) -> None:
            batch.finished_at = self.timestamp

    @classmethod
    def create(
        cls,
        *,
        tenant_id: str,
        batch_id: str,
        action: str,
        params: JSON,
        query: JSON,
        by: str,
        reason: str,
        job_ids: list[str],
        now: datetime,
    ) -> Batch:
        return cls._create(
            cls.Created,
            id=batch_uuid(tenant_id, batch_id),
            timestamp=now,
            tenant_id=tenant_id,
            batch_id=batch_id,
            action=action,
            params=params,
            query=query,
            by=by,
            reason=reason,
            job_ids=job_ids,
        )

    @property
    def finished(self) -> bool:
        return self.finished_at is not None

    def pending(self) -> list[str]:
        """The matched jobs without an outcome yet, in the order they were matched."""
        return [job_id for job_id in self.job_ids if job_id not in self.outcomes]

    def record(self, job_id: str, outcome: Outcome, detail: str, *, now: datetime) -> None:
        if job_id in self.outcomes or job_id not in self.job_ids:
            raise ValueError(f"job {job_id!r} is not pending in batch {self.batch_id!r}")
        self.trigger_event(
            self.JobDone, timestamp=now, job_id=job_id, outcome=str(outcome), detail=detail
        )

    def finish(self, *, now: datetime) -> None:
        """Once every matched job has its outcome."""
        if self.finished or self.pending():
            raise ValueError(f"batch {self.batch_id!r} has jobs pending or finished already")
        self.trigger_event(self.Finished, timestamp=now)

    def count(self, outcome: Outcome) -> int:
        return sum(1 for done in self.outcomes.values() if done.outcome is outcome)


@dataclass(frozen=True)
class BatchView:
    """A batch as callers read it: what it does, to how many jobs, how far it got."""

    tenant_id: str
    batch_id: str
    action: str
    params: JSON
    query: JSON
    by: str
    reason: str
    total: int
    applied: int
    skipped: int
    failed: int
    finished: bool
    created_at: datetime
    finished_at: datetime | None
    outcomes: tuple[JobOutcome, ...]

    @property
    def done(self) -> int:
        return self.applied + self.skipped + self.failed

    @classmethod
    def of(cls, batch: Batch) -> BatchView:
        return cls(
            tenant_id=batch.tenant_id,
            batch_id=batch.batch_id,
            action=batch.action,
            params=dict(batch.params),
            query=dict(batch.query),
            by=batch.by,
            reason=batch.reason,
            total=len(batch.job_ids),
            applied=batch.count(Outcome.APPLIED),
            skipped=batch.count(Outcome.SKIPPED),
            failed=batch.count(Outcome.FAILED),
            finished=batch.finished,
            created_at=batch.created_at,
            finished_at=batch.finished_at,
            outcomes=tuple(batch.outcomes[j] for j in batch.job_ids if j in batch.outcomes),
        )


keep_stored_topics("jobledger.batch", Batch)
