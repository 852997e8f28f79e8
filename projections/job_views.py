"""The job views (status, spend, approvals) kept in the store's own database.

Each batch of events updates the views AND advances the partition's eventsourcing
tracking record in one transaction: a crash can never leave a view ahead of or behind
its tracking, so every event is applied exactly once, and a re-delivered one is skipped.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from typing import Any

from eventsourcing.persistence import IntegrityError, Notification, Tracking

from jobledger.adapters.event_store import EventSourcedJobStore, LedgerPartition
from jobledger.adapters.leases import LEASE_TABLE
from jobledger.adapters.locks import schema_lock
from jobledger.adapters.store_errors import store_errors
from jobledger.job import Job
from jobledger.ports import BlockedNote
from jobledger.status import TERMINAL_STATUSES, JobStatus
from projections import approvals, blocked, spend, status
from projections.dialect import Cursor, Dialect, PostgresDialect, SQLiteDialect, fetch
from projections.status import StatusRow

log = logging.getLogger(__name__)

BATCH = 200
VIEW_TABLES = ("jobledger_job_status", "jobledger_tenant_spend", "jobledger_pending_approvals")
Progress = Callable[[int, int], None]


@dataclass(frozen=True)
class Lag:
    partition: str
    last_event: int
    last_tracked: int

    @property
    def behind(self) -> int:
        return self.last_event - self.last_tracked


class JobViews:
    """Every public method translates store errors (``store_errors``): callers see
    StoreUnavailableError, never a driver's or the library's own error."""

    def __init__(self, store: EventSourcedJobStore) -> None:
        self.store = store
        self.dialect = _dialect(store.partitions[0])
        # A store opened to read gets no lock file and no DDL, unless the views were never
        # made (then there is no way to list without making them).
        views = (*VIEW_TABLES, _tracking_table(self.dialect))
        if not (store.read_only and store.partitions[0].has_tables(*views)):
            self.create_tables()

    # ---- schema ----------------------------------------------------------------------

    @store_errors("creating the views")
    def create_tables(self) -> None:
        d = self.dialect
        with schema_lock(self.store.location):
            d.tracking.create_table()  # type: ignore[attr-defined]
            with d.transaction() as curs:
                for module in (status, spend, approvals, blocked):
                    for statement in module.create_statements(d):
                        curs.execute(d.sql(statement))
                if status.upgrade(d, curs):
                    log.warning("the status view gained columns; it is folded again from the log")
                    self._forget(curs)

    # ---- following the log -----------------------------------------------------------

    def position(self, partition: LedgerPartition) -> int:
        return self.dialect.tracking.max_tracking_id(partition.name) or 0

    @store_errors("reading new events")
    def pending(self, partition: LedgerPartition, limit: int = BATCH) -> Sequence[Notification]:
        notifications: Sequence[Notification] = partition.recorder.select_notifications(
            self.position(partition), limit, inclusive_of_start=False
        )
        return notifications

    @store_errors("updating the views")
    def process(self, partition: LedgerPartition, notifications: Sequence[Notification]) -> None:
        """Apply a batch and record its last position, all in one transaction. Events at
        or before the tracked position were applied already: a re-delivery skips them,
        and a concurrent runner that got there first makes this batch roll back whole."""
        d = self.dialect
        try:
            with d.transaction() as curs:
                position = d.tracking._max_tracking_id(partition.name, curs) or 0  # type: ignore[attr-defined]
                fresh = [n for n in notifications if n.id > position]
                for notification in fresh:
                    event = partition.mapper.to_domain_event(notification)
                    if isinstance(event, Job.Event):
                        self.apply(curs, event)
                if fresh:
                    d.tracking._insert_tracking(  # type: ignore[attr-defined]
                        curs, Tracking(partition.name, fresh[-1].id)
                    )
        except IntegrityError:
            log.info("another runner applied %s up to here first", partition.name)

    def apply(self, curs: Cursor, event: Job.Event) -> None:
        d = self.dialect
        row = status.load(d, curs, str(event.originator_id))
        if row is not None and row.version >= event.originator_version:
            return  # already folded: a replayed batch changes nothing
        row = status.fold(row, event)
        status.save(d, curs, row)
        spend.apply(d, curs, row.tenant_id, event)
        approvals.apply(d, curs, row.tenant_id, row.job_id, event)

    @store_errors("catching the views up")
    def catch_up(self, progress: Progress | None = None) -> int:
        """Apply everything appended so far; returns how many notifications were read."""
        done = 0
        total = self.lag_total() if progress else 0
        for partition in self.store.partitions:
            while batch := self.pending(partition):
                self.process(partition, batch)
                done += len(batch)
                if progress:
                    progress(done, total)
        return done

    @store_errors("rebuilding the views")
    def rebuild(self, progress: Progress | None = None) -> int:
        """Drop every view row and the tracking, then fold the whole log again."""
        with self.dialect.transaction() as curs:
            self._forget(curs)
        return self.catch_up(progress)

    def _forget(self, curs: Cursor) -> None:
        """Every view row and the views' tracking: the next catch-up folds from zero."""
        d = self.dialect
        for table in VIEW_TABLES:
            curs.execute(d.sql(f"DELETE FROM {d.table(table)}"))
        for partition in self.store.partitions:
            curs.execute(
                d.sql(f"DELETE FROM {d.table(_tracking_table(d))} WHERE application_name = :name"),
                {"name": partition.name},
            )

    @store_errors("reading the views' lag")
    def lag(self) -> list[Lag]:
        return [
            Lag(p.name, p.recorder.max_notification_id() or 0, self.position(p))
            for p in self.store.partitions
        ]

    def lag_total(self) -> int:
        return sum(entry.behind for entry in self.lag())

    # ---- reading ---------------------------------------------------------------------

    @store_errors("listing jobs")
    def jobs(
        self,
        *,
        tenant_id: str | None = None,
        status_in: Sequence[str] = (),
        workflow_type: str | None = None,
        limit: int = 100,
    ) -> list[StatusRow]:
        where = ["1 = 1"]
        params: dict[str, Any] = {"limit": limit}
        if tenant_id is not None:
            where.append("tenant_id = :tenant_id")
            params["tenant_id"] = tenant_id
        if workflow_type is not None:
            where.append("workflow_type = :workflow_type")
            params["workflow_type"] = workflow_type
        if status_in:
            names = [f"s{n}" for n in range(len(status_in))]
            where.append(f"status IN ({', '.join(':' + n for n in names)})")
            params.update(dict(zip(names, status_in, strict=True)))
        statement = (
            f"SELECT * FROM {self.dialect.table('jobledger_job_status')} "
            f"WHERE {' AND '.join(where)} ORDER BY updated_at DESC LIMIT :limit"
        )
        return [status.row_from(r) for r in fetch(self.dialect, statement, params)]

    @store_errors("reading due jobs")
    def due(self, job_status: JobStatus, before: datetime, limit: int) -> list[StatusRow]:
        """Jobs in ``job_status`` whose due moment is at or before ``before``: an index
        range scan, so the cost follows the number of due jobs, not of all jobs. A running
        job's due moment is its Claimed lease; one whose heartbeat keeps a live lease row
        (or that a take-over is claiming right now) is not due."""
        statement = (
            f"SELECT * FROM {self.dialect.table('jobledger_job_status')} AS s "
            "WHERE status = :status AND due_at <= :before"
        )
        if job_status is JobStatus.RUNNING:
            statement += (
                f" AND NOT EXISTS (SELECT 1 FROM {self.dialect.table(LEASE_TABLE)} AS l "
                "WHERE l.job_uuid = s.job_uuid AND l.lease_until > :before)"
            )
        statement += " ORDER BY due_at LIMIT :limit"
        params = {"status": str(job_status), "before": self.dialect.ts(before), "limit": limit}
        return [status.row_from(r) for r in fetch(self.dialect, statement, params)]

    @store_errors("reading pending approvals")
    def pending_approvals(self, tenant_id: str | None = None) -> list[dict[str, Any]]:
        t = self.dialect.table("jobledger_pending_approvals")
        where = "WHERE tenant_id = :tenant_id" if tenant_id is not None else ""
        statement = f"SELECT * FROM {t} {where} ORDER BY requested_at"
        return list(fetch(self.dialect, statement, {"tenant_id": tenant_id}))

    @store_errors("reading the jobs pinned to each version")
    def live_pins(self) -> dict[tuple[str, int], int]:
        """How many jobs that have not finished are pinned to each (type, version)."""
        names = [f"s{n}" for n in range(len(TERMINAL_STATUSES))]
        statement = (
            "SELECT workflow_type, workflow_version, COUNT(*) AS jobs "
            f"FROM {self.dialect.table('jobledger_job_status')} "
            f"WHERE status NOT IN ({', '.join(':' + n for n in names)}) "
            "GROUP BY workflow_type, workflow_version"
        )
        params = dict(zip(names, sorted(TERMINAL_STATUSES), strict=True))
        rows = fetch(self.dialect, statement, params)
        return {(r["workflow_type"], int(r["workflow_version"])): int(r["jobs"]) for r in rows}

    # ---- deployment problems (not a view of the log: see projections.blocked) ----------

    @store_errors("noting a blocked job")
    def note_blocked(self, note: BlockedNote) -> None:
        """The BlockedNotes port: a worker says why it left a job untouched."""
        with self.dialect.transaction() as curs:
            blocked.save(self.dialect, curs, note)

    @store_errors("reading the blocked jobs")
    def blocked_notes(self, rows: Sequence[StatusRow]) -> dict[str, BlockedNote]:
        """The notes that still apply to these jobs (by job uuid)."""
        return blocked.current(self.dialect, [(r.job_uuid, r.version) for r in rows])

    @store_errors("reading a blocked job")
    def blocked_note(self, job_uuid: str, version: int) -> BlockedNote | None:
        return blocked.current(self.dialect, [(job_uuid, version)]).get(job_uuid)

    @store_errors("reading the tenant's spend")
    def tenant_day_spend_usd(self, tenant_id: str, day_start: datetime) -> Decimal:
        """The Cost port, read from the spend view (as fresh as the projection)."""
        return spend.day_spend(self.dialect, tenant_id, day_start)


def _dialect(partition: LedgerPartition) -> Dialect:
    datastore: Any = getattr(partition.factory, "datastore")  # noqa: B009 - untyped on the base
    if partition.store_kind == "sqlite":
        return SQLiteDialect(datastore)
    return PostgresDialect(datastore)


def _tracking_table(d: Dialect) -> str:
    return "tracking" if isinstance(d, SQLiteDialect) else "jobledger_view_tracking"
