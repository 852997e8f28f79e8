"""Running jobledger as a Kafka-driven service: any mix of consumer-group workers, the
views, the event outbox and the reconciler, in one process.

- Workers consume the ticks and signals topics (``jobledger worker --transport kafka``).
- The views follow the log; the outbox publishes every job event to the events topic
  (``jobledger projections run --outbox``).
- The reconciler publishes due ticks to the ticks topic: there are no delay topics, so
  timers, wait deadlines, retry back-offs and lapsed leases come back through it
  (``jobledger reconcile --transport kafka``).

``jobledger run --transport kafka`` runs all of them. The outbox and the reconciler each
act in one process at a time (a lock), so running several copies is safe.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta

from projections import JobViews, ProjectionRunner
from projections.outbox import Outbox, OutboxRunner

from jobledger.adapters.event_store import EventSourcedJobStore
from jobledger.adapters.kafka import KafkaQueue, KafkaSettings, ensure_topics
from jobledger.adapters.kafka.publisher import KafkaEventPublisher
from jobledger.adapters.kafka.worker import KafkaWorker, RecordHook, TickObserver
from jobledger.adapters.locks import lock_for
from jobledger.engine import Engine
from jobledger.errors import ConfigError
from jobledger.reconciler import Reconciler

log = logging.getLogger(__name__)

RESTART_BACKOFF_SECONDS = 2.0


@dataclass(frozen=True)
class KafkaRunnerSettings:
    workers: int = 1
    projections: bool = False
    outbox: bool = False
    reconciler: bool = False
    reconcile_interval: float = 1.0
    lost_tick_after: timedelta = timedelta(seconds=30)
    """Ticks on Kafka are durable; a queued job without one (submitted while the broker
    was away, or by a process on the local transport) is published after this long."""
    max_poll_records: int = 50


class KafkaRunner:
    def __init__(
        self,
        engine: Engine,
        settings: KafkaRunnerSettings | None = None,
        *,
        on_tick: TickObserver | None = None,
        after_effect: RecordHook | None = None,
    ) -> None:
        self.settings = settings = settings or KafkaRunnerSettings()
        if not isinstance(engine.store, EventSourcedJobStore):
            raise ConfigError("the Kafka runner needs the event store")
        if (settings.workers or settings.reconciler) and not isinstance(engine.queue, KafkaQueue):
            raise ConfigError("Kafka workers and the Kafka reconciler need transport = kafka")
        self.engine = engine
        self.store: EventSourcedJobStore = engine.store
        self.kafka = KafkaSettings.of(engine.config)
        self.stopping = threading.Event()
        self.threads: list[threading.Thread] = []
        self.workers = [
            KafkaWorker(
                engine,
                self.kafka,
                stopping=self.stopping,
                max_poll_records=settings.max_poll_records,
                on_tick=on_tick,
                after_effect=after_effect,
            )
            for _ in range(settings.workers)
        ]
        needs_views = settings.projections or settings.reconciler
        self.views = JobViews(self.store) if needs_views else None
        if self.workers:
            # Workers note the jobs they cannot run as deployed, for show and list.
            engine.blocked_notes = self.views or JobViews(self.store)
        self.projection_runner = (
            ProjectionRunner(self.views, poll_interval=0.2)
            if self.views is not None and settings.projections
            else None
        )
        self.publisher: KafkaEventPublisher | None = None
        self.outbox_runner: OutboxRunner | None = None
        if settings.outbox:
            self.publisher = KafkaEventPublisher(self.kafka)
            outbox = Outbox(
                self.store, self.publisher, lock=lock_for(self.store.location, "outbox")
            )
            self.outbox_runner = OutboxRunner(outbox)
        self.reconciler: Reconciler | None = None
        if settings.reconciler:
            assert self.views is not None
            self.reconciler = Reconciler(
                views=self.views,
                queue=engine.queue,
                clock=engine.clock,
                lock=lock_for(self.store.location, "reconciler"),
                ops=engine.ops,
                lost_tick_after=settings.lost_tick_after,
            )

    @property
    def handled(self) -> int:
        return sum(worker.stats.ticks + worker.stats.signals for worker in self.workers)

    def start(self) -> None:
        if self.kafka.create_topics:
            ensure_topics(self.kafka)
        if self.views is not None:
            self.views.catch_up()
        if self.projection_runner is not None:
            self._spawn("projections", self.projection_runner.run_forever)
        if self.outbox_runner is not None:
            self._spawn("outbox", self.outbox_runner.run_forever)
        if self.reconciler is not None:
            self._spawn("reconciler", self._reconcile_forever)
        for n, worker in enumerate(self.workers):
            self._spawn(f"kafka-worker-{n}", self._keep_running(worker))

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
        if self.projection_runner is not None:
            self.projection_runner.stop()
        if self.outbox_runner is not None:
            self.outbox_runner.stop()
        if self.reconciler is not None:
            self.reconciler.stop()
        for thread in self.threads:
            thread.join(timeout=30)
        if self.publisher is not None:
            self.publisher.close()

    def _spawn(self, name: str, target: Callable[[], None]) -> None:
        thread = threading.Thread(target=target, name=f"jobledger-{name}", daemon=True)
        thread.start()
        self.threads.append(thread)

    def _keep_running(self, worker: KafkaWorker) -> Callable[[], None]:
        def run() -> None:
            # A worker whose broker is away at start-up (or whose client broke) starts
            # again: uncommitted messages are simply delivered again.
            while not self.stopping.is_set():
                try:
                    worker.run()
                except Exception:
                    log.exception("Kafka worker stopped; restarting it")
                    self.stopping.wait(RESTART_BACKOFF_SECONDS)

        return run

    def _reconcile_forever(self) -> None:
        assert self.reconciler is not None and self.views is not None
        while not self.stopping.wait(self.settings.reconcile_interval):
            try:
                if self.projection_runner is None:
                    self.views.catch_up()
                self.reconciler.reconcile()
            except Exception:  # the store or the broker may be briefly away
                log.exception("reconcile pass failed")
