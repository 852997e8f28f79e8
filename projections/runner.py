"""Keeps the views following the log: woken by LISTEN/NOTIFY on PostgreSQL, by polling
on SQLite, and never stalled silently by a lost connection."""

from __future__ import annotations

import logging
import threading

from eventsourcing.persistence import PersistenceError

from jobledger.adapters.event_store import EventSourcedJobStore
from jobledger.errors import StoreUnavailableError
from projections.job_views import JobViews

log = logging.getLogger(__name__)

MAX_BACKOFF_SECONDS = 30.0


class LogFollower:
    """Follows the partitions' logs: one pass, then wait for a notification (or the poll
    interval); after a failed pass, back off exponentially instead of stalling."""

    what = "pass"
    retried: tuple[type[Exception], ...] = (PersistenceError, StoreUnavailableError)

    def __init__(self, store: EventSourcedJobStore, poll_interval: float) -> None:
        self.store = store
        self.poll_interval = poll_interval
        self.stopping = threading.Event()
        self.failures = 0
        """Consecutive failed passes; visible to status checks."""

    def run_forever(self) -> None:
        waiter = self.store.backend.waiter([p.recorder for p in self.store.partitions])
        try:
            while not self.stopping.is_set():
                if self.run_once():
                    waiter.wait(self.poll_interval)
                else:
                    self.stopping.wait(self.backoff())
        finally:
            waiter.close()
            self.stopped()

    def run_once(self) -> bool:
        """One pass; False after an error it retries (logged, then backed off)."""
        try:
            self.follow()
        except self.retried:
            self.failures += 1
            log.warning(
                "%s failed (%d in a row); retrying after %.1fs",
                self.what,
                self.failures,
                self.backoff(),
                exc_info=True,
            )
            return False
        self.failures = 0
        return True

    def follow(self) -> None:
        raise NotImplementedError

    def stopped(self) -> None:
        """Called once the loop has ended."""

    def backoff(self) -> float:
        delay: float = min(MAX_BACKOFF_SECONDS, 0.5 * 2.0 ** max(0, self.failures - 1))
        return delay

    def stop(self) -> None:
        self.stopping.set()


class ProjectionRunner(LogFollower):
    what = "projection pass"

    def __init__(self, views: JobViews, *, poll_interval: float = 0.5) -> None:
        super().__init__(views.store, poll_interval)
        self.views = views

    def follow(self) -> None:
        self.views.catch_up()
