"""Keeps the views following the log: the one log follower, run as a service."""

from __future__ import annotations

from jobledger.adapters.follower import LogFollower
from jobledger.orchestration.ports import Lock
from jobledger.projections.job_views import BATCH, JobViews


class ProjectionRunner(LogFollower):
    """Woken by LISTEN/NOTIFY on PostgreSQL, by polling on SQLite, and never stalled
    silently by a lost connection (it backs off and tries again). With ``lock``, it folds
    only while it holds the lock: of several processes on one store one keeps the views
    for all, where each folding every event would only roll back the others' batches."""

    what = "projection pass"

    def __init__(
        self, views: JobViews, *, poll_interval: float = 0.5, lock: Lock | None = None
    ) -> None:
        super().__init__(views.store, views, batch=BATCH, poll_interval=poll_interval)
        self.views = views
        self.lock = lock

    def follow(self) -> None:
        if self.lock is None or self.lock.try_acquire():
            self.views.catch_up()

    def stopped(self) -> None:
        if self.lock is not None:
            self.lock.release()
