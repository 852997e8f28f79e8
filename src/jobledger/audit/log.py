"""Reading the raw log: every job in a store, straight from the partitions' event tables.

Audits read the log, never the views: a stale or tampered status view cannot hide a job,
and a row that no longer decodes is reported instead of stopping the scan.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any
from uuid import UUID

from eventsourcing.persistence import StoredEvent
from eventsourcing.utils import get_topic

from jobledger.adapters.event_store import EventSourcedJobStore, LedgerPartition
from jobledger.adapters.mapper import MovedRowError
from jobledger.adapters.store_errors import store_errors
from jobledger.domain.job import Job

JOB_TOPIC_PREFIX = get_topic(Job) + "."
"""Every job event's topic starts with this (``jobledger.job:Job.``); keys and
snapshots have topics of their own."""
BATCH = 200


@dataclass(frozen=True)
class StoredRecord:
    """One stored row of a job's history: the event, or why it does not decode."""

    job_uuid: UUID
    version: int
    topic: str
    event: Job.Event | None
    error: str | None = None
    moved: str | None = None
    """Why the row, which decodes, is another job's event (then ``event`` is None)."""

    @property
    def event_type(self) -> str:
        """The class name the row's topic names (``Job.StepRecorded``)."""
        return self.topic.rpartition(":")[2] or self.topic


def job_uuids(store: EventSourcedJobStore) -> list[UUID]:
    """Every job with at least one stored event, in id order."""
    found: set[UUID] = set()
    b = store.backend
    for partition in store.partitions:
        statement = (
            f"SELECT DISTINCT originator_id FROM {b.table(partition.events_table)} "
            "WHERE topic LIKE :prefix"
        )
        for row in _query(store, statement, {"prefix": JOB_TOPIC_PREFIX + "%"}):
            found.add(_uuid(row["originator_id"]))
    return sorted(found)


def read_jobs(
    store: EventSourcedJobStore, uuids: Iterable[UUID], batch: int = BATCH
) -> Iterator[tuple[UUID, list[StoredRecord]]]:
    """Each job's stored rows in version order, read ``batch`` jobs per query. A job
    with no rows yields an empty list."""
    pending: list[UUID] = []
    for job_uuid in uuids:
        pending.append(job_uuid)
        if len(pending) >= batch:
            yield from _read_batch(store, pending)
            pending = []
    if pending:
        yield from _read_batch(store, pending)


def read_job(store: EventSourcedJobStore, job_uuid: UUID) -> list[StoredRecord]:
    return next(_read_batch(store, [job_uuid]))[1]


def is_empty(store: EventSourcedJobStore) -> bool:
    """Whether no partition holds any event (jobs or keys)."""
    for partition in store.partitions:
        statement = f"SELECT 1 AS found FROM {store.backend.table(partition.events_table)} LIMIT 1"
        if _query(store, statement, {}):
            return False
    return True


def events_of(records: Sequence[StoredRecord]) -> list[Job.Event]:
    """The decoded events of an intact history."""
    return [record.event for record in records if record.event is not None]


# ---- plumbing -----------------------------------------------------------------------------


def _read_batch(
    store: EventSourcedJobStore, uuids: list[UUID]
) -> Iterator[tuple[UUID, list[StoredRecord]]]:
    by_partition: dict[int, list[UUID]] = {}
    for job_uuid in uuids:
        by_partition.setdefault(store.partitions.index(store.partition(job_uuid)), []).append(
            job_uuid
        )
    rows: dict[UUID, list[StoredRecord]] = {job_uuid: [] for job_uuid in uuids}
    for index, members in by_partition.items():
        partition = store.partitions[index]
        names = [f"u{n}" for n in range(len(members))]
        statement = (
            "SELECT originator_id, originator_version, topic, state "
            f"FROM {store.backend.table(partition.events_table)} "
            f"WHERE originator_id IN ({', '.join(':' + n for n in names)}) "
            "ORDER BY originator_id, originator_version"
        )
        params = {n: store.backend.uuid(m) for n, m in zip(names, members, strict=True)}
        for row in _query(store, statement, params):
            record = _decode(partition, row)
            rows[record.job_uuid].append(record)
    for job_uuid in uuids:
        yield job_uuid, rows[job_uuid]


def _decode(partition: LedgerPartition, row: Any) -> StoredRecord:
    job_uuid = _uuid(row["originator_id"])
    version = int(row["originator_version"])
    topic = str(row["topic"])
    state = row["state"]
    try:
        # SQLite keeps whatever type was written: a tampered row may hold text.
        data = state.encode() if isinstance(state, str) else bytes(state)
        event = partition.mapper.to_domain_event(
            StoredEvent(originator_id=job_uuid, originator_version=version, topic=topic, state=data)
        )
    except MovedRowError as error:
        return StoredRecord(job_uuid, version, topic, None, moved=error.why)
    except Exception as error:
        return StoredRecord(job_uuid, version, topic, None, f"does not decode: {error}")
    if not isinstance(event, Job.Event):
        return StoredRecord(job_uuid, version, topic, None, f"is not a job event ({topic})")
    return StoredRecord(job_uuid, version, topic, event)


def _uuid(value: object) -> UUID:
    return value if isinstance(value, UUID) else UUID(str(value))


def _query(store: EventSourcedJobStore, statement: str, params: dict[str, Any]) -> list[Any]:
    """Run a read-only statement built from this module's literals (never from input)."""
    with store_errors("reading the log"):
        return store.backend.fetch(statement, params)
