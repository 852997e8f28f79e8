"""An archive run: the finished jobs past their retention (read from the status view),
each archived (``audit.archive``) and removed from the store with its views' rows, in
one transaction with its tombstone; then the archive directory reconciled.

Reconciling: a file no tombstone names is the archive of a run that crashed before its
transaction (the job is still in the store), or of a job restored since. The run
removes it when its job is in the store (a job still due is archived again, anew), and
removes the temporary files a crash left; a file of a job this store does not hold is
left alone and reported (``foreign``): it may be another store's.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any
from uuid import UUID

from jobledger.adapters.event_store import EventSourcedJobStore
from jobledger.audit.archive import (
    ArchiveSink,
    DirectoryArchive,
    Reader,
    archive_job,
    job_of_file,
    restore_job,
)
from jobledger.config import MAX_RETENTION_DAYS
from jobledger.domain.errors import ConcurrencyError, InvalidPayloadError, RetentionError
from jobledger.domain.job import Job
from jobledger.domain.retention import RetentionPolicy, Tombstone
from jobledger.domain.status import TERMINAL_STATUSES
from jobledger.projections.job_views import JobQuery, JobViews, cursor
from jobledger.projections.status import StatusRow

PAGE = 500
Progress = Callable[[int, int], None]


@dataclass(frozen=True)
class Scope:
    """Which finished jobs a run looks at: past ``older_than_days`` when given (over the
    configured retention), else past their retention; of one tenant or workflow."""

    policy: RetentionPolicy
    older_than_days: int | None = None
    tenant_id: str | None = None
    workflow_type: str | None = None

    def __post_init__(self) -> None:
        older = self.older_than_days
        if older is not None and not 0 <= older <= MAX_RETENTION_DAYS:
            raise InvalidPayloadError(f"--older-than is {older}: 0 to {MAX_RETENTION_DAYS} days")
        if self.older_than_days is None and self.policy.shortest_days() is None:
            raise InvalidPayloadError(
                "no retention is configured (retention_default_days, retention_tenants, "
                "retention_workflows): give --older-than DAYS"
            )

    def cutoff(self, now: datetime) -> datetime:
        """No job that ended after this is due under any rule."""
        days = self.older_than_days
        if days is None:
            days = self.policy.shortest_days()
        assert days is not None  # checked when made
        return now - timedelta(days=days)

    def due(self, row: StatusRow, now: datetime) -> bool:
        if self.older_than_days is not None:
            return row.updated_at <= self.cutoff(now)
        return self.policy.due(row.tenant_id, row.workflow_type, row.updated_at, now)


@dataclass
class ArchiveRun:
    due: int = 0
    archived: list[Tombstone] = field(default_factory=list)
    skipped: list[tuple[str, str, str]] = field(default_factory=list)
    """(tenant, job, why) of each due job left in the store."""
    bytes: int = 0
    strays_removed: list[str] = field(default_factory=list)
    foreign: list[str] = field(default_factory=list)

    def document(self) -> dict[str, Any]:
        return {
            "due": self.due,
            "archived": [t.document() for t in self.archived],
            "skipped": [{"tenant": t, "job": j, "reason": r} for t, j, r in self.skipped],
            "bytes": self.bytes,
            "strays_removed": self.strays_removed,
            "foreign": self.foreign,
        }


class ArchiveBusyError(RetentionError):
    """Another archive run or restore holds this store's archive lock."""


class Archiver:
    """Archive runs and restores over one store and its views."""

    def __init__(self, store: EventSourcedJobStore, views: JobViews) -> None:
        self.store = store
        self.views = views

    def due(self, scope: Scope, now: datetime) -> list[StatusRow]:
        """The finished jobs past their retention, the views caught up first."""
        self.views.catch_up()
        return [row for row in self._finished(scope, now) if scope.due(row, now)]

    def _finished(self, scope: Scope, now: datetime) -> Iterator[StatusRow]:
        query = JobQuery(
            tenant_id=scope.tenant_id,
            workflow_type=scope.workflow_type,
            status_in=sorted(str(s) for s in TERMINAL_STATUSES),
            updated_before=scope.cutoff(now) + timedelta(microseconds=1),
            limit=PAGE,
        )
        while True:
            rows = self.views.jobs(query)
            yield from rows
            if len(rows) < PAGE:
                return
            query = replace(query, after=cursor(rows[-1]))

    def run(
        self,
        sink: ArchiveSink,
        rows: list[StatusRow],
        now: datetime,
        progress: Progress | None = None,
    ) -> ArchiveRun:
        """Archive each of ``rows``; a job that cannot be (it moved, a reader is behind
        it, its chain is broken) is skipped with the reason, and the run goes on."""
        with self._alone():
            return self._run(sink, rows, now, progress)

    def _run(
        self,
        sink: ArchiveSink,
        rows: list[StatusRow],
        now: datetime,
        progress: Progress | None,
    ) -> ArchiveRun:
        report = ArchiveRun(due=len(rows))
        for done, row in enumerate(rows, start=1):
            try:
                archived = archive_job(
                    self.store,
                    sink,
                    row.tenant_id,
                    row.job_id,
                    now,
                    also=self._forget(row),
                )
            except (RetentionError, ConcurrencyError) as error:
                report.skipped.append((row.tenant_id, row.job_id, str(error)))
            else:
                report.archived.append(archived.tombstone)
                report.bytes += archived.bytes
            if progress is not None:
                progress(done, len(rows))
        if isinstance(sink, DirectoryArchive):
            self.reconcile(sink, report)
        return report

    def _forget(self, row: StatusRow) -> Callable[[Any], None]:
        return lambda curs: self.views.forget_job(curs, UUID(row.job_uuid))

    def reconcile(self, archive: DirectoryArchive, report: ArchiveRun) -> None:
        """Remove the directory's files no tombstone names whose job is in the store,
        and the temporary files; report the others."""
        buried = {t.archive_ref for t in self.store.tombstones.all()}
        for path in archive.strays(buried):
            job = job_of_file(path)
            temporary = path.name.endswith(".tmp")
            if temporary or (job is not None and self.store.load(job) is not None):
                _unlink(path)
                report.strays_removed.append(str(path))
            else:
                report.foreign.append(str(path))

    def restore(self, tenant_id: str, job_id: str, read: Reader, ref: str | None) -> Tombstone:
        def fold(events: list[Job.Event]) -> Callable[[Any], None]:
            return lambda curs: self.views.fold_job(curs, events)

        with self._alone():
            return restore_job(self.store, tenant_id, job_id, read, ref, fold)

    @contextmanager
    def _alone(self) -> Iterator[None]:
        """One archive run or restore at a time per store: two runs writing the same job's
        file could leave it holding the other's bytes, not the ones its tombstone names."""
        lock = self.store.backend.lock("archive")
        if not lock.try_acquire():
            raise ArchiveBusyError(
                "another archive run or restore is under way on this store: try again when "
                "it has ended"
            )
        try:
            yield
        finally:
            lock.release()


def _unlink(path: Path) -> None:
    with suppress(FileNotFoundError):
        path.unlink()
