"""The job views (status, spend, approvals) kept in the store's own database.

The views are their own tracking recorder (a :class:`TrackedReader`, as eventsourcing's
examples write a projection): each batch of events updates the views AND moves the
partition's tracking position in one transaction, so a crash can never leave a view
ahead of or behind its tracking; every event is applied exactly once, and a re-delivered
one is skipped. The log is read by the one :class:`LogFollower` every reader uses.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any
from uuid import UUID

from eventsourcing.persistence import Notification, Tracking

from jobledger.adapters.backends import (
    ADMISSION_TABLE,
    LEASE_TABLE,
    Cursor,
    Migration,
    StoreBackend,
    scratch_backend,
)
from jobledger.adapters.backends.migrations import COMPONENT, STORE_MIGRATIONS
from jobledger.adapters.event_store import EventSourcedJobStore, LedgerPartition
from jobledger.adapters.follower import Lag, LogFollower, Progress, TrackedReader
from jobledger.adapters.store_errors import store_errors
from jobledger.domain.batch import Batch
from jobledger.domain.errors import InvalidPayloadError, StoreUnavailableError
from jobledger.domain.job import Job
from jobledger.domain.schedule import Schedule
from jobledger.domain.status import TERMINAL_STATUSES, JobStatus
from jobledger.orchestration.ports import BlockedNote, DueFilter
from jobledger.projections import approvals, batches, blocked, schedules, spend, status
from jobledger.projections.batches import BatchRow
from jobledger.projections.schedules import ScheduleRow
from jobledger.projections.status import StatusRow

log = logging.getLogger(__name__)

BATCH = 200
VIEW_TABLES = (
    "jobledger_job_status",
    "jobledger_tenant_spend",
    "jobledger_pending_approvals",
    schedules.TABLE,
    batches.TABLE,
)
SCHEMA = "views"
"""The views' component in the store's schema table (their own numbered migrations)."""
__all__ = ["BATCH", "JobQuery", "JobViews", "Lag", "Progress", "cursor"]


@dataclass(frozen=True)
class JobQuery:
    """What ``list`` asks the status view: every field narrows the listing."""

    tenant_id: str | None = None
    status_in: Sequence[str] = ()
    workflow_type: str | None = None
    workflow_version: int | None = None
    mission_id: str | None = None
    correlation_id: str | None = None
    created_after: datetime | None = None
    created_before: datetime | None = None
    updated_after: datetime | None = None
    updated_before: datetime | None = None
    after: str | None = None
    limit: int = 100


def cursor(row: StatusRow) -> str:
    """Where a listing continues after ``row`` (its change time in microseconds and its
    job): stable while the job does not change."""
    micros = int(row.updated_at.timestamp() * 1_000_000)
    return f"{micros:x}-{UUID(row.job_uuid).hex}"


def parse_cursor(text: str) -> tuple[datetime, str]:
    try:
        micros, job = text.split("-")
        moment = datetime.fromtimestamp(int(micros, 16) / 1_000_000, UTC)
        return moment, str(UUID(hex=job))
    except ValueError:
        raise InvalidPayloadError(f"not a listing cursor: {text!r}") from None


# A running job whose heartbeat keeps a live lease row (or that a take-over is claiming
# right now) is not due, whatever its Claimed lease says.
_LEASE_LIVE = (
    "EXISTS (SELECT 1 FROM {leases} AS l WHERE l.job_uuid = s.job_uuid AND l.lease_until > :now)"
)
# Held by the admission gate: its tick comes when a pass admits it, and a tick for each
# of a deep backlog would only fill the tick queue.
_ADMISSION_HELD = (
    "EXISTS (SELECT 1 FROM {admission} AS a WHERE a.job_uuid = s.job_uuid AND a.state = 0)"
)


class JobViews(TrackedReader):
    """Every public method translates store errors (``store_errors``): callers see
    StoreUnavailableError, never a driver's or the library's own error."""

    def __init__(self, store: EventSourcedJobStore) -> None:
        super().__init__(store)
        self.follower = LogFollower(store, self, batch=BATCH)
        self.notes: StoreBackend = self.backend
        """Where the blocked notes are (not a view of the log: see projections.blocked)."""
        # A store opened to read gets no lock and no DDL, unless the views are behind this
        # release (never made, say): then they are made, where the store lets a reader.
        current = self.backend.check_schema(SCHEMA, self.migrations()) == _latest(self)
        if store.read_only and current:
            return
        try:
            self.create_tables()
        except StoreUnavailableError:
            if not store.read_only:
                raise
            self._fold_apart()

    @store_errors("folding the views from the log")
    def _fold_apart(self) -> None:
        """The views of a store that cannot take them or bring them up to date (read-only
        media, a session that may only read): made in a scratch database of this
        process's own, which a catch-up folds from the whole log. The store's blocked
        notes are read where they are, if it has them."""
        log.info("the store cannot take its views: they are folded from its log in memory")
        scratch = scratch_backend()
        if not self.backend.has_tables(blocked.TABLE):
            self.notes = scratch
        self.backend = scratch  # before migrating: a migration may forget positions
        scratch.migrate(COMPONENT, STORE_MIGRATIONS)
        scratch.migrate(SCHEMA, self.migrations())

    # ---- schema ----------------------------------------------------------------------

    def migrations(self) -> tuple[Migration, ...]:
        """Version 1 is the views as they were before versions were recorded (a store of
        an earlier release adopts them); every later change is a new number."""
        return (
            Migration(1, "the status, spend, approvals and blocked-jobs tables", _create),
            Migration(2, "the status view's deadline_at, folded again", self._add_columns),
            Migration(3, "the status view's mission and correlation ids", self._add_columns),
            Migration(4, "the schedules view", _create_schedules),
            Migration(5, "the status view's taken marks", status.add_taken_marks),
            Migration(6, "the batches view", _create_batches),
        )

    @store_errors("creating the views")
    def create_tables(self) -> None:
        with self.backend.schema_lock():
            if self.store.read_only:  # its opening applied nothing
                self.backend.migrate(COMPONENT, STORE_MIGRATIONS)
            self.backend.migrate(SCHEMA, self.migrations())

    def _add_columns(self, b: StoreBackend, curs: Cursor) -> None:
        """A status view of an earlier release lacks columns (the deadline; the mission
        and correlation ids); its rows lack the values, so every view is folded again."""
        if status.upgrade(b, curs):
            log.warning("the status view gained columns; it is folded again from the log")
            self._forget(curs)

    # ---- following the log -----------------------------------------------------------

    def pending(self, partition: LedgerPartition) -> Sequence[Notification]:
        return self.follower.pending(partition)

    @store_errors("updating the views")
    def process(self, partition: LedgerPartition, notifications: Sequence[Notification]) -> None:
        """Apply a batch and record its last position, all in one transaction. Events at
        or before the tracked position were applied already: a re-delivery skips them,
        and a concurrent runner that got there first makes this batch roll back whole."""
        with self.tracked(partition) as (curs, position):
            fresh = [n for n in notifications if n.id > position]
            for notification in fresh:
                event = partition.mapper.to_domain_event(notification)
                if isinstance(event, Job.Event):
                    self.apply(curs, event)
                elif isinstance(event, Schedule.Event):
                    schedules.apply(self.backend, curs, event)
                elif isinstance(event, Batch.Event):
                    batches.apply(self.backend, curs, event)
            if fresh:
                self.track(curs, Tracking(partition.name, fresh[-1].id), after=position)

    def apply(self, curs: Cursor, event: Job.Event) -> None:
        d = self.backend
        row = status.load(d, curs, str(event.originator_id))
        if row is not None and row.version >= event.originator_version:
            return  # already folded: a replayed batch changes nothing
        row = status.fold(row, event)
        status.save(d, curs, row)
        spend.apply(d, curs, row.tenant_id, event)
        approvals.apply(d, curs, row.tenant_id, row.job_id, event)

    @store_errors("catching the views up")
    def catch_up(self, progress: Progress | None = None) -> int:
        """Apply everything appended so far; returns how many notifications were read.
        A store opened to read whose views are behind and cannot be written has them
        folded apart (an outage fails there again, as it would have here)."""
        try:
            return self.follower.catch_up(progress)
        except StoreUnavailableError:
            if not self.store.read_only or self.backend is not self.store.backend:
                raise
        self._fold_apart()
        return self.follower.catch_up(progress)

    @store_errors("rebuilding the views")
    def rebuild(self, progress: Progress | None = None) -> int:
        """Drop every view row and the tracking, then fold the whole log again."""
        with self.backend.transaction() as curs:
            self._forget(curs)
        return self.catch_up(progress)

    def _forget(self, curs: Cursor) -> None:
        """Every view row and the views' tracking: the next catch-up folds from zero."""
        b = self.backend
        for table in VIEW_TABLES:
            curs.execute(b.sql(f"DELETE FROM {b.table(table)}"))
        b.forget(curs, [partition.name for partition in self.store.partitions])

    # ---- archived jobs (projections.retention) ----------------------------------------

    def forget_job(self, curs: Cursor, job_uuid: UUID) -> None:
        """An archived job's rows, deleted in its archive's transaction: it leaves the
        listings. Its spend stays in the tenant's days: it was spent."""
        b = self.backend
        for table in ("jobledger_job_status", "jobledger_pending_approvals", blocked.TABLE):
            curs.execute(
                b.sql(f"DELETE FROM {b.table(table)} WHERE job_uuid = :job"), {"job": str(job_uuid)}
            )

    def fold_job(self, curs: Cursor, events: Sequence[Job.Event]) -> None:
        """A restored job's status row, folded in its restore's transaction: when the
        follower reaches the events again it finds them folded and skips them, so the
        tenant's spend is not counted twice."""
        row: StatusRow | None = None
        for event in events:
            row = status.fold(row, event)
        if row is not None:
            status.save(self.backend, curs, row)

    def lag(self) -> list[Lag]:
        return self.follower.lag()

    def pending_since(self) -> dict[str, datetime | None]:
        return self.follower.pending_since()

    def lag_total(self) -> int:
        return sum(entry.behind for entry in self.lag())

    # ---- reading ---------------------------------------------------------------------

    @store_errors("listing jobs")
    def jobs(self, query: JobQuery | None = None, **filters: Any) -> list[StatusRow]:
        """Jobs matching ``query`` (or the same fields as keywords), newest update
        first; ``query.after`` (a row's :func:`cursor`) continues a listing where its
        last page ended, however many jobs changed meanwhile (keyset, not an offset)."""
        q = query if query is not None else JobQuery(**filters)
        where = ["1 = 1"]
        params: dict[str, Any] = {"limit": q.limit}
        equal = ("tenant_id", "workflow_type", "workflow_version", "mission_id", "correlation_id")
        for column in equal:
            if getattr(q, column) is not None:
                where.append(f"{column} = :{column}")
                params[column] = getattr(q, column)
        if q.status_in:
            names = [f"s{n}" for n in range(len(q.status_in))]
            where.append(f"status IN ({', '.join(':' + n for n in names)})")
            params.update(dict(zip(names, q.status_in, strict=True)))
        for column, op, value in (
            ("created_at", ">=", q.created_after),
            ("created_at", "<", q.created_before),
            ("updated_at", ">=", q.updated_after),
            ("updated_at", "<", q.updated_before),
        ):
            if value is not None:
                name = f"{column}_{'from' if op == '>=' else 'to'}"
                where.append(f"{column} {op} :{name}")
                params[name] = self.backend.ts(value)
        if q.after is not None:
            updated_at, job_uuid = parse_cursor(q.after)
            where.append(
                "(updated_at < :after_at OR (updated_at = :after_at AND job_uuid < :after_job))"
            )
            params.update(after_at=self.backend.ts(updated_at), after_job=job_uuid)
        statement = (
            f"SELECT * FROM {self.backend.table('jobledger_job_status')} "
            f"WHERE {' AND '.join(where)} ORDER BY updated_at DESC, job_uuid DESC LIMIT :limit"
        )
        return [status.row_from(r) for r in self.backend.fetch(statement, params)]

    @store_errors("reading due jobs")
    def due(self, job_status: JobStatus, before: datetime, limit: int) -> list[StatusRow]:
        """Jobs in ``job_status`` whose due moment is at or before ``before``: an index
        range scan, so the cost follows the number of due jobs, not of all jobs. A running
        job's due moment is its Claimed lease; one whose heartbeat keeps a live lease row
        (or that a take-over is claiming right now) is not due."""
        statement = (
            f"SELECT * FROM {self.backend.table('jobledger_job_status')} AS s "
            f"WHERE {self._due_where(job_status)} ORDER BY due_at LIMIT :limit"
        )
        before_at = self.backend.ts(before)
        params = {"status": str(job_status), "before": before_at, "now": before_at}
        return [
            status.row_from(r) for r in self.backend.fetch(statement, {**params, "limit": limit})
        ]

    @store_errors("taking due jobs")
    def take_due(self, due: DueFilter, limit: int, hold_until: datetime) -> list[StatusRow]:
        """Mark at most ``limit`` due jobs taken by the caller and return them, in one
        transaction. A job is taken at its version: no other caller takes it again until
        the view moves on (its tick appended) or ``hold_until`` passes (the taker died
        first). Concurrent callers pass each other's rows by (``SKIP LOCKED``) instead of
        waiting for them, so each due job goes to exactly one of them."""
        b = self.backend
        moments = [(s, due.now) for s in due.timed] + [(s, due.idle_before) for s in due.idle]
        taken: list[StatusRow] = []
        with b.transaction() as curs:
            for job_status, before in moments:
                if len(taken) == limit:
                    break
                params = {
                    "status": str(job_status),
                    "before": b.ts(before),
                    "now": b.ts(due.now),
                    "hold": b.ts(hold_until),
                    "limit": limit - len(taken),
                }
                curs.execute(b.sql(self._take_statement(job_status)), params)
                taken += [status.row_from(b.row(r)) for r in curs.fetchall()]
        return taken

    def _due_where(self, job_status: JobStatus) -> str:
        """The condition of a due job in ``job_status`` (a row ``s``), by the ``(status,
        due_at)`` index; ``:now`` judges the lease rows."""
        where = "s.status = :status AND s.due_at <= :before"
        if job_status is JobStatus.RUNNING:
            where += f" AND NOT {_LEASE_LIVE.format(leases=self.backend.table(LEASE_TABLE))}"
        if job_status is JobStatus.QUEUED:
            admission = self.backend.table(ADMISSION_TABLE)
            where += f" AND NOT {_ADMISSION_HELD.format(admission=admission)}"
        return where

    def _take_statement(self, job_status: JobStatus) -> str:
        """One status at a time, so each choice is an ordered index range scan that stops
        at the limit, however deep the backlog. The choice is a WITH query: PostgreSQL runs
        it once, where a subquery in the UPDATE's WHERE could be run again and skip its
        way past the LIMIT."""
        t = self.backend.table("jobledger_job_status")
        return (
            f"WITH chosen AS (SELECT s.job_uuid FROM {t} AS s "
            f"WHERE {self._due_where(job_status)} "
            "AND (s.taken_version IS NULL OR s.taken_version <> s.version "
            "OR s.taken_until <= :now) "
            f"ORDER BY s.due_at LIMIT :limit {self.backend.skip_locked}) "
            f"UPDATE {t} SET taken_version = version, taken_until = :hold "
            "WHERE job_uuid IN (SELECT job_uuid FROM chosen) RETURNING *"
        )

    @store_errors("reading due schedules")
    def due_schedules(self, before: datetime, limit: int) -> list[ScheduleRow]:
        """Active schedules whose next (or buffered) firing is at or before ``before``."""
        return schedules.due(self.backend, before, limit)

    @store_errors("listing schedules")
    def tenant_schedules(self, tenant_id: str, *, deleted: bool = False) -> list[ScheduleRow]:
        """The tenant's schedules by name (deleted ones only with ``deleted``)."""
        return schedules.of_tenant(self.backend, tenant_id, deleted=deleted)

    @store_errors("listing batches")
    def tenant_batches(self, tenant_id: str, limit: int = 100) -> list[BatchRow]:
        """The tenant's bulk actions, newest first."""
        return batches.of_tenant(self.backend, tenant_id, limit)

    @store_errors("reading unfinished batches")
    def unfinished_batches(self) -> list[BatchRow]:
        """Every bulk action not finished yet: its runner is at work, or died."""
        return batches.unfinished(self.backend)

    @store_errors("reading pending approvals")
    def pending_approvals(self, tenant_id: str | None = None) -> list[dict[str, Any]]:
        t = self.backend.table("jobledger_pending_approvals")
        where = "WHERE tenant_id = :tenant_id" if tenant_id is not None else ""
        statement = f"SELECT * FROM {t} {where} ORDER BY requested_at"
        return list(self.backend.fetch(statement, {"tenant_id": tenant_id}))

    @store_errors("counting jobs by status")
    def status_counts(self, tenant_id: str) -> dict[str, int]:
        """How many of the tenant's jobs are in each status (statuses with none left out)."""
        statement = (
            "SELECT status, COUNT(*) AS jobs "
            f"FROM {self.backend.table('jobledger_job_status')} "
            "WHERE tenant_id = :tenant_id GROUP BY status"
        )
        rows = self.backend.fetch(statement, {"tenant_id": tenant_id})
        return {str(r["status"]): int(r["jobs"]) for r in rows}

    @store_errors("counting jobs by tenant and status")
    def status_totals(self) -> list[tuple[str, str, int]]:
        """(tenant, status, jobs) for every pair with a job: one grouped read of the view."""
        statement = (
            "SELECT tenant_id, status, COUNT(*) AS jobs "
            f"FROM {self.backend.table('jobledger_job_status')} GROUP BY tenant_id, status"
        )
        rows = self.backend.fetch(statement)
        return [(str(r["tenant_id"]), str(r["status"]), int(r["jobs"])) for r in rows]

    @store_errors("counting the ready jobs")
    def ready_jobs(self) -> tuple[int, datetime | None]:
        """Jobs queued for a worker, and when the longest-waiting one was queued (its
        last change: the change that queued it)."""
        statement = (
            "SELECT COUNT(*) AS jobs, MIN(updated_at) AS oldest "
            f"FROM {self.backend.table('jobledger_job_status')} WHERE status = :status"
        )
        row = self.backend.fetch(statement, {"status": str(JobStatus.QUEUED)})[0]
        oldest = row["oldest"]
        if isinstance(oldest, str):  # SQLite keeps times as ISO text
            oldest = datetime.fromisoformat(oldest)
        return int(row["jobs"]), oldest

    @store_errors("reading the tenant's spend per day")
    def spend_days(self, tenant_id: str, limit: int = 31) -> list[tuple[str, Decimal]]:
        """The tenant's spend per UTC day (ISO date, dollars), newest first."""
        return spend.days(self.backend, tenant_id, limit)

    @store_errors("reading the jobs pinned to each version")
    def live_pins(self) -> dict[tuple[str, int], int]:
        """How many jobs that have not finished are pinned to each (type, version)."""
        names = [f"s{n}" for n in range(len(TERMINAL_STATUSES))]
        statement = (
            "SELECT workflow_type, workflow_version, COUNT(*) AS jobs "
            f"FROM {self.backend.table('jobledger_job_status')} "
            f"WHERE status NOT IN ({', '.join(':' + n for n in names)}) "
            "GROUP BY workflow_type, workflow_version"
        )
        params = dict(zip(names, sorted(TERMINAL_STATUSES), strict=True))
        rows = self.backend.fetch(statement, params)
        return {(r["workflow_type"], int(r["workflow_version"])): int(r["jobs"]) for r in rows}

    # ---- deployment problems (not a view of the log: see jobledger.projections.blocked) ----------

    @store_errors("noting a blocked job")
    def note_blocked(self, note: BlockedNote) -> None:
        """The BlockedNotes port: a worker says why it left a job untouched."""
        with self.notes.transaction() as curs:
            blocked.save(self.notes, curs, note)

    @store_errors("reading the blocked jobs")
    def blocked_notes(self, rows: Sequence[StatusRow]) -> dict[str, BlockedNote]:
        """The notes that still apply to these jobs (by job uuid)."""
        return blocked.current(self.notes, [(r.job_uuid, r.version) for r in rows])

    @store_errors("reading a blocked job")
    def blocked_note(self, job_uuid: str, version: int) -> BlockedNote | None:
        return blocked.current(self.notes, [(job_uuid, version)]).get(job_uuid)

    @store_errors("reading the tenant's spend")
    def tenant_day_spend_usd(self, tenant_id: str, day_start: datetime) -> Decimal:
        """The Cost port, read from the spend view (as fresh as the projection)."""
        return spend.day_spend(self.backend, tenant_id, day_start)


def _create(b: StoreBackend, curs: Cursor) -> None:
    for module in (status, spend, approvals, blocked):
        for statement in module.create_statements(b):
            curs.execute(b.sql(statement))


def _create_schedules(b: StoreBackend, curs: Cursor) -> None:
    for statement in schedules.create_statements(b):
        curs.execute(b.sql(statement))


def _create_batches(b: StoreBackend, curs: Cursor) -> None:
    for statement in batches.create_statements(b):
        curs.execute(b.sql(statement))


def _latest(views: JobViews) -> int:
    return max(m.version for m in views.migrations())
