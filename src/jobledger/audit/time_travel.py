"""Time travel: a job exactly as it was at an event version, or at a moment.

The past is the fold of a prefix of the job's events with the aggregate's own mutate(),
so it cannot disagree with how the job was built. On the event-sourced store a fold
starts from the newest snapshot at or before the version asked for, so a job with 100k
events costs no more to look at in the past than now.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import datetime
from uuid import UUID

from eventsourcing.application import AggregateNotFoundError

from jobledger.adapters.event_store import EventSourcedJobStore, project
from jobledger.adapters.store_errors import store_errors
from jobledger.audit.errors import NoSuchVersionError
from jobledger.domain.job import Job
from jobledger.orchestration.ports import JobStore


def fold(events: Iterable[Job.Event]) -> Job:
    """The job the events make, applied in order with each event's own mutate()."""
    job: Job | None = None
    for event in events:
        job = event.mutate(job)
    if job is None:
        raise NoSuchVersionError("no events to fold")
    return job


def version_at(events: Sequence[Job.Event], at: datetime) -> int | None:
    """The version of the job's last event whose timestamp is at or before ``at`` (the
    highest such version, should clocks have disagreed); None before the job existed."""
    if at.tzinfo is None:
        raise NoSuchVersionError("a moment to travel to needs a timezone")
    versions = [event.originator_version for event in events if event.timestamp <= at]
    return max(versions) if versions else None


def job_at(
    store: JobStore,
    job_uuid: UUID,
    *,
    version: int | None = None,
    at: datetime | None = None,
) -> Job:
    """The job as it was right after event ``version``, or after its last event at or
    before ``at``. Exactly one of the two is given."""
    if (version is None) == (at is None):
        raise NoSuchVersionError("give a version or a moment, not both or neither")
    if at is not None:
        events = store.events(job_uuid)
        found = version_at(events, at)
        if found is None:
            first = events[0].timestamp.isoformat() if events else "never"
            raise NoSuchVersionError(
                f"the job did not exist yet at {at.isoformat()} (it was submitted {first})"
            )
        return fold(event for event in events if event.originator_version <= found)
    assert version is not None
    if version < 1:
        raise NoSuchVersionError(f"versions start at 1, not {version}")
    job = _load_at(store, job_uuid, version)
    if job.version != version:
        raise NoSuchVersionError(f"the job has {job.version} events; there is no v{version}")
    return job


def _load_at(store: JobStore, job_uuid: UUID, version: int) -> Job:
    if isinstance(store, EventSourcedJobStore):
        # Snapshot-accelerated: the newest snapshot at or before the version, then the
        # events after it, folded by the same mutate() (eventsourcing's Repository).
        try:
            with store_errors("loading a job"):
                job: object = store.partition(job_uuid).repository.get(
                    job_uuid, version=version, projector_func=project
                )
        except AggregateNotFoundError:
            raise NoSuchVersionError("the job has no events") from None
        assert isinstance(job, Job)
        return job
    events = store.events(job_uuid, to_version=version)
    if not events:
        raise NoSuchVersionError("the job has no events")
    return fold(events)
