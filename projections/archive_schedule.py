"""Archiving on a schedule, inside a running process (``jobledger run`` with
``retention_archive_to``), so the store stays lean without an operator remembering to
run ``jobledger archive``.

One pass at start, then one every ``retention_interval_seconds``: the finished jobs past
their retention go to the target, exactly as ``jobledger archive`` would take them. Each
pass's counts are an ops event (``retention.pass``: the ops log, the metrics). Several
runners on one store are safe: retention's store lock lets one pass at a time through,
and a runner that finds it held skips its pass quietly (logged at info). A pass that
fails (a broker away, the store away) is logged at error and tried at the next interval;
the process keeps running.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from jobledger.adapters.event_store import EventSourcedJobStore
from jobledger.audit.archive_targets import close_archive, open_archive
from jobledger.config import EngineConfig
from jobledger.domain.errors import ConfigError, RetentionError
from jobledger.domain.retention import ArchiveTarget, RetentionPolicy
from jobledger.orchestration.ports import Clock, Ops, OpsEvent
from jobledger.projections.job_views import JobViews
from jobledger.projections.retention import ArchiveBusyError, Archiver, ArchiveRun, Scope

log = logging.getLogger(__name__)

PASS_EVENT = "retention.pass"


class ScheduledArchiving:
    """The runner's archiving service: ``run`` until ``stop``."""

    def __init__(
        self, store: EventSourcedJobStore, clock: Clock, ops: Ops, config: EngineConfig
    ) -> None:
        options = config.retention
        if options.archive_to is None:
            raise ConfigError("scheduled archiving needs retention_archive_to")
        self.target = ArchiveTarget.parse(options.archive_to)
        self.scope = Scope(
            RetentionPolicy(options.default_days, options.tenants, options.workflows)
        )
        self.interval = options.interval_seconds
        self.config = config
        self.clock = clock
        self.ops = ops
        # Views of its own: the process's views follower keeps folding beside it, as it
        # does beside a `jobledger archive` run by hand.
        self.archiver = Archiver(store, JobViews(store))
        self.stopping = threading.Event()
        self._check_directory()

    def _check_directory(self) -> None:
        """A directory that cannot be made stops the process at start, not at a pass."""
        if self.target.directory is None:
            return
        try:
            open_archive(self.target, self.config)
        except RetentionError as error:
            raise ConfigError(f"retention_archive_to: {error}") from None

    def describe(self) -> str:
        return f"archiving: to {self.target} every {self.interval:g}s"

    def run(self) -> None:
        while not self.stopping.is_set():
            self.archive_once()
            if self.stopping.wait(self.interval):
                return

    def stop(self) -> None:
        self.stopping.set()

    def archive_once(self) -> ArchiveRun | None:
        """One pass now: its report, or None when it was skipped (another pass holds the
        store) or failed (logged)."""
        started = time.perf_counter()
        now = self.clock.now()
        try:
            rows = self.archiver.due(self.scope, now)
            sink = open_archive(self.target, self.config)
            try:
                run = self.archiver.run(sink, rows, now)
            finally:
                close_archive(sink)
        except ArchiveBusyError:
            log.info("another archive run or restore holds this store; this pass is skipped")
            self._record("busy", started, {})
            return None
        except Exception as error:
            log.error(
                "archive pass to %s failed (next in %gs): %s", self.target, self.interval, error
            )
            self._record("failed", started, {"error": str(error)})
            return None
        counts = {
            "due": run.due,
            "archived": len(run.archived),
            "skipped": len(run.skipped),
            "bytes": run.bytes,
            "straysRemoved": len(run.strays_removed),
        }
        self._record("done", started, counts)
        return run

    def _record(self, outcome: str, started: float, counts: dict[str, Any]) -> None:
        self.ops.record(
            OpsEvent(
                jobId="",
                tenantId="",
                eventType=PASS_EVENT,
                status=outcome,
                source="job_archiver",
                metadata={
                    "durationMs": round((time.perf_counter() - started) * 1000, 3),
                    "target": str(self.target),
                    **counts,
                },
            )
        )
