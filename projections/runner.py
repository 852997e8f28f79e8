"""Keeps the views following the log: woken by LISTEN/NOTIFY on PostgreSQL, by polling
on SQLite, and never stalled silently by a lost connection."""

from __future__ import annotations

import logging
import threading

from eventsourcing.persistence import PersistenceError

from projections.job_views import JobViews

log = logging.getLogger(__name__)

MAX_BACKOFF_SECONDS = 30.0


class ProjectionRunner:
    def __init__(self, views: JobViews, *, poll_interval: float = 0.5) -> None:
        self.views = views
        self.poll_interval = poll_interval
        self.stopping = threading.Event()
        self.failures = 0
        """Consecutive failed passes; visible to status checks."""

    def run_forever(self) -> None:
        # PostgreSQL recorders NOTIFY on a channel per events table; SQLite has none.
        channels = [
            str(getattr(p.recorder, "channel_name", ""))
            for p in self.views.store.partitions
            if hasattr(p.recorder, "channel_name")
        ]
        waiter = self.views.dialect.waiter(channels)
        try:
            while not self.stopping.is_set():
                if self.run_once():
                    waiter.wait(self.poll_interval)
                else:
                    self.stopping.wait(self.backoff())
        finally:
            waiter.close()

    def run_once(self) -> bool:
        """One catch-up pass; False after a store error (logged, then backed off)."""
        try:
            self.views.catch_up()
        except PersistenceError:
            self.failures += 1
            log.warning(
                "projection pass failed (%d in a row); retrying after %.1fs",
                self.failures,
                self.backoff(),
                exc_info=True,
            )
            return False
        self.failures = 0
        return True

    def backoff(self) -> float:
        delay: float = min(MAX_BACKOFF_SECONDS, 0.5 * 2.0 ** max(0, self.failures - 1))
        return delay

    def stop(self) -> None:
        self.stopping.set()
