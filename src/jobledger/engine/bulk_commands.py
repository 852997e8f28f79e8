"""Bulk actions: one action over the jobs a query matches, as a durable batch.

``start`` freezes the matched job ids in a new :class:`~jobledger.domain.batch.Batch`;
``run`` acts on each job without an outcome, recording one outcome event each, then
``Finished``. A run that died resumes from the first job without an outcome; that job may
have been acted on already (the crash fell between its append and its outcome): its mark
(``engine.batch_marks``), written in the job's own append, says so, and the outcome is
recorded without acting again.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from uuid import uuid4

from jobledger.domain.batch import Batch, BatchView, Outcome, batch_uuid
from jobledger.domain.errors import (
    BatchBusyError,
    BatchExistsError,
    ConcurrencyError,
    DuplicateKeyError,
    JobLedgerError,
    StoreUnavailableError,
    UnknownBatchError,
    VersionConflict,
)
from jobledger.domain.identity import job_uuid
from jobledger.domain.keys import KeyKind
from jobledger.domain.payloads import text
from jobledger.engine import batch_marks
from jobledger.engine.bootstrap import Deps
from jobledger.engine.bulk_actions import BulkAction, Commands, Params, Who, action_named
from jobledger.engine.bulk_query import BulkQuery
from jobledger.engine.ids import check_id
from jobledger.engine.job_commands import JobCommands
from jobledger.engine.repair_commands import RepairCommands
from jobledger.projections.batches import BatchRow
from jobledger.projections.job_views import JobViews

log = logging.getLogger(__name__)

SAMPLE = 10
"""How many matched jobs a dry run shows."""

Progress = Callable[[int, int], None]
"""``progress(done, total)``: told before the first job and after each."""


@dataclass(frozen=True)
class BulkPreview:
    """What a dry run found: how many jobs, and the first few with their status."""

    action: str
    count: int
    sample: tuple[tuple[str, str], ...]


class BulkCommands:
    def __init__(self, deps: Deps, commands: JobCommands, repairs: RepairCommands) -> None:
        self._deps = deps
        self._store = deps.store
        self._clock = deps.clock
        self._commands = Commands(commands, repairs)

    def _views(self) -> JobViews:
        views = JobViews(self._store)
        views.catch_up()
        return views

    def _checked(
        self, tenant_id: str, action: str, query: BulkQuery | dict[str, Any], params: Params | None
    ) -> tuple[BulkQuery, Params]:
        check_id("tenant_id", tenant_id)
        chosen = query if isinstance(query, BulkQuery) else BulkQuery.parse(query)
        chosen.check()
        return chosen, action_named(action).check(dict(params or {}))

    def preview(
        self,
        tenant_id: str,
        action: str,
        query: BulkQuery | dict[str, Any],
        params: Params | None = None,
    ) -> BulkPreview:
        """A dry run: the query and the parameters checked, the jobs counted; nothing written."""
        chosen, _ = self._checked(tenant_id, action, query, params)
        rows = list(chosen.rows(self._views(), tenant_id))
        sample = tuple((row.job_id, row.status) for row in rows[:SAMPLE])
        return BulkPreview(action, len(rows), sample)

    def start(
        self,
        tenant_id: str,
        action: str,
        query: BulkQuery | dict[str, Any],
        params: Params | None = None,
        *,
        by: str,
        reason: str,
        batch_id: str | None = None,
    ) -> BatchView:
        """Record a batch of the jobs the query matches now (not acted on yet: ``run``)."""
        chosen, checked = self._checked(tenant_id, action, query, params)
        check_id("by", by)
        text(reason, what="bulk reason", max_bytes=self._deps.config.limits.max_payload_bytes)
        batch_id = batch_id if batch_id is not None else uuid4().hex
        check_id("batch_id", batch_id)
        job_ids = [row.job_id for row in chosen.rows(self._views(), tenant_id)]
        batch = Batch.create(
            tenant_id=tenant_id,
            batch_id=batch_id,
            action=action,
            params=checked,
            query=chosen.document(),
            by=by,
            reason=reason,
            job_ids=job_ids,
            now=self._clock.now(),
        )
        try:
            self._store.append_batch(batch)
        except VersionConflict:
            raise BatchExistsError(f"batch {batch_id!r} of tenant {tenant_id!r} exists") from None
        return BatchView.of(batch)

    def run(
        self,
        tenant_id: str,
        batch_id: str,
        progress: Progress | None = None,
        stopping: threading.Event | None = None,
    ) -> BatchView:
        """Act on every job of the batch without an outcome, then finish it; a finished
        batch is returned as it is. Stops with BatchBusyError when another runner
        records an outcome meanwhile (it goes on with the batch), and between two jobs
        once ``stopping`` is set (the batch stays unfinished, to be resumed)."""
        batch = self._load(tenant_id, batch_id)
        action = action_named(batch.action)
        who = Who(batch.batch_id, batch.by, batch.reason)
        total = len(batch.job_ids)
        if progress is not None:
            progress(len(batch.outcomes), total)
        for job_id in batch.pending():
            if stopping is not None and stopping.is_set():
                return BatchView.of(batch)
            outcome, detail = self._act(batch, job_id, action, who)
            batch.record(job_id, outcome, detail, now=self._clock.now())
            self._save(batch)
            if progress is not None:
                progress(len(batch.outcomes), total)
        if not batch.finished:
            batch.finish(now=self._clock.now())
            self._save(batch)
        return BatchView.of(batch)

    def _act(self, batch: Batch, job_id: str, action: BulkAction, who: Who) -> tuple[Outcome, str]:
        """One job's outcome. Acted on already (its mark is there): applied, not again.
        Refused by the job as it stands: skipped, with its reason. Store outages are
        raised: the batch stays unfinished, to be resumed."""
        if self._marked(batch, job_id):
            return Outcome.APPLIED, "applied before the run was interrupted"
        try:
            with batch_marks.acting_for(batch.batch_id, batch.tenant_id, job_id):
                action.act(self._commands, batch.tenant_id, job_id, batch.params, who)
        except DuplicateKeyError as error:
            if error.kind == KeyKind.BATCH:
                return Outcome.APPLIED, "applied by another runner of the batch"
            return Outcome.FAILED, str(error)
        except StoreUnavailableError:
            raise
        except ConcurrencyError as error:
            return Outcome.FAILED, str(error)
        except JobLedgerError as error:
            if self._marked(batch, job_id):  # another runner acted first: the job moved
                return Outcome.APPLIED, "applied by another runner of the batch"
            return Outcome.SKIPPED, str(error)
        except Exception as error:  # a bug in a step of the action: named, the rest go on
            log.exception("batch %s: job %s failed", batch.batch_id, job_id)
            return Outcome.FAILED, f"{type(error).__name__}: {error}"
        return Outcome.APPLIED, ""

    def _marked(self, batch: Batch, job_id: str) -> bool:
        mark = batch_marks.mark_id(batch.batch_id, batch.tenant_id, job_id)
        return self._store.find_key(job_uuid(batch.tenant_id, job_id), mark) is not None

    def _save(self, batch: Batch) -> None:
        try:
            self._store.append_batch(batch)
        except VersionConflict:
            raise BatchBusyError(
                f"batch {batch.batch_id!r} is being run by another runner"
            ) from None

    def bulk(
        self,
        tenant_id: str,
        action: str,
        query: BulkQuery | dict[str, Any],
        params: Params | None = None,
        *,
        by: str,
        reason: str,
        batch_id: str | None = None,
        progress: Progress | None = None,
    ) -> BatchView:
        """``start`` then ``run``: the whole batch, in this thread."""
        started = self.start(
            tenant_id, action, query, params, by=by, reason=reason, batch_id=batch_id
        )
        return self.run(tenant_id, started.batch_id, progress)

    def batch(self, tenant_id: str, batch_id: str) -> BatchView:
        return BatchView.of(self._load(tenant_id, batch_id))

    def batches(self, tenant_id: str, limit: int = 100) -> list[BatchRow]:
        """The tenant's batches, newest first (from the batches view, caught up)."""
        check_id("tenant_id", tenant_id)
        return self._views().tenant_batches(tenant_id, limit)

    def unfinished(self) -> list[tuple[str, str]]:
        """(tenant, batch id) of every batch not finished: to resume after a runner died."""
        return [(row.tenant_id, row.batch_id) for row in self._views().unfinished_batches()]

    def _load(self, tenant_id: str, batch_id: str) -> Batch:
        check_id("tenant_id", tenant_id)
        check_id("batch_id", batch_id)
        batch = self._store.load_batch(batch_uuid(tenant_id, batch_id))
        if batch is None:
            raise UnknownBatchError(tenant_id, batch_id)
        return batch
