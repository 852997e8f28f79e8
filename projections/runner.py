"""Keeps the views following the log: the one log follower, run as a service."""

from __future__ import annotations

from jobledger.adapters.follower import LogFollower
from jobledger.projections.job_views import BATCH, JobViews


class ProjectionRunner(LogFollower):
    """Woken by LISTEN/NOTIFY on PostgreSQL, by polling on SQLite, and never stalled
    silently by a lost connection (it backs off and tries again)."""

    what = "projection pass"

    def __init__(self, views: JobViews, *, poll_interval: float = 0.5) -> None:
        super().__init__(views.store, views, batch=BATCH, poll_interval=poll_interval)
        self.views = views

    def follow(self) -> None:
        self.views.catch_up()
