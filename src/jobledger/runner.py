"""The embedded runner: workers, projections and the reconciler in one process.

Nothing is lost to a kill -9: the in-process queue is only a cache of what to do next.
On start the views catch up with the log and the reconciler re-enqueues every job that
is due or queued, so the next start finishes whatever was in flight.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta

from projections import JobViews, ProjectionRunner

from jobledger.adapters.event_store import EventSourcedJobStore
from jobledger.adapters.local_queue import LocalQueue
from jobledger.adapters.locks import lock_for
from jobledger.engine import Engine
from jobledger.errors import ConfigError
from jobledger.reconciler import Reconciler

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RunnerSettings:
    workers: int = 1
    projections: bool = True
    reconcile_interval: float = 1.0
    lost_tick_after: timedelta = timedelta(seconds=2)
    """With an in-process queue nobody else enqueues for us: a queued job whose tick is
    not here after this long was submitted by another process (a CLI command)."""


class EmbeddedRunner:
    def __init__(self, engine: Engine, settings: RunnerSettings | None = None) -> None:
        if not isinstance(engine.queue, LocalQueue) or not isinstance(
            engine.store, EventSourcedJobStore
        ):
            raise ConfigError("the embedded runner needs the local queue and the event store")
        self.engine = engine
        self.queue: LocalQueue = engine.queue
        self.settings = settings or RunnerSettings()
        self.views = JobViews(engine.store)
        engine.blocked_notes = self.views  # workers note jobs they cannot run as deployed
        self.projection_runner = ProjectionRunner(self.views, poll_interval=0.2)
        self.reconciler = Reconciler(
            views=self.views,
            queue=engine.queue,
            clock=engine.clock,
            lock=lock_for(engine.store.location, "reconciler"),
            ops=engine.ops,
            lost_tick_after=self.settings.lost_tick_after,
        )
        self.stopping = threading.Event()
        self.threads: list[threading.Thread] = []
        self.handled = 0
        self._count = threading.Lock()

    def start(self) -> None:
        """Catch up, re-enqueue everything due, then start the threads."""
        self.views.catch_up()
        result = self.reconciler.reconcile(lost_tick_after=timedelta(0))
        log.info("start-up: %d due jobs re-enqueued", result.enqueued)
        if self.settings.projections:
            self._spawn("projections", self.projection_runner.run_forever)
        self._spawn("reconciler", self._reconcile_forever)
        for n in range(self.settings.workers):
            self._spawn(f"worker-{n}", self._work)

    def run(self, until: Callable[[], bool] | None = None) -> None:
        """Block until stopped (or ``until()`` holds), then stop cleanly."""
        self.start()
        try:
            while not self.stopping.wait(0.1):
                if until is not None and until():
                    break
        finally:
            self.stop()

    def stop(self) -> None:
        self.stopping.set()
        self.projection_runner.stop()
        self.reconciler.stop()
        for thread in self.threads:
            thread.join(timeout=30)

    def _spawn(self, name: str, target: Callable[[], None]) -> None:
        thread = threading.Thread(target=target, name=f"jobledger-{name}", daemon=True)
        thread.start()
        self.threads.append(thread)

    def _work(self) -> None:
        while not self.stopping.is_set():
            tick = self.queue.get(timeout=0.2)
            if tick is None:
                continue
            try:
                self.engine.handle(tick)
            except Exception:  # a bug must not kill the worker; the reconciler retries
                log.exception("tick for %s/%s failed", tick.tenant_id, tick.job_id)
            with self._count:
                self.handled += 1

    def _reconcile_forever(self) -> None:
        while not self.stopping.wait(self.settings.reconcile_interval):
            try:
                if not self.settings.projections:
                    self.views.catch_up()
                self.reconciler.reconcile()
            except Exception:  # the store may be briefly away: try again next round
                log.exception("reconcile pass failed")
