"""The supervisor: runs the services a process is given, by role, each in its thread.

Roles (:class:`Services`): workers (the local queue's, or consumer-group members of the
Kafka ticks and signals topics, by the transport the engine was built with), the views
following the log, the event outbox, and the reconciler. One start, one stop, one
restart rule: a service that dies of an unexpected error is started again after a pause
(a Kafka worker whose broker is away, a follower whose client broke); a service stops
when the supervisor does, after the message or tick in hand.

Nothing is lost to a kill -9. On the local transport the in-process queue is only a
cache of what to do next: on start the views catch up with the log, and the workers take
what is due from the store (every process on one store its share, each due job by one
process: ``Reconciler.take``). Ticks on Kafka are durable; there the
reconciler publishes what timers, wait deadlines, retry back-offs and lapsed leases make
due (there are no delay topics). The outbox and the reconciler each act in one process at
a time (a lock), so running several copies is safe.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Literal

from jobledger.adapters.local_queue import LocalQueue
from jobledger.adapters.locks import lock_for
from jobledger.domain.errors import ConfigError, StoreUnavailableError, UnknownWorkflowError
from jobledger.engine.engine import Engine
from jobledger.engine.schedule_commands import ScheduleFiring
from jobledger.orchestration.lanes import Lanes
from jobledger.orchestration.ports import Tick, WorkflowRegistry
from jobledger.orchestration.reconciler import Reconciler, ReconcileResult
from jobledger.projections import JobViews, ProjectionRunner

if TYPE_CHECKING:
    from jobledger.adapters.kafka import KafkaSettings
    from jobledger.adapters.kafka.publisher import KafkaEventPublisher
    from jobledger.adapters.kafka.worker import KafkaWorker, RecordHook, TickObserver
    from jobledger.adapters.metrics import MetricsServer
    from jobledger.api.server import ApiServer
    from jobledger.api.settings import ApiSettings
    from jobledger.audit.anchor_schedule import AnchorPlan, ScheduledAnchoring
    from jobledger.projections.archive_schedule import ScheduledArchiving

log = logging.getLogger(__name__)

RESTART_BACKOFF_SECONDS = 2.0
TAKE_INTERVAL = 0.1
"""Seconds an idle local worker waits between asking the store for due jobs."""
LOCAL_LOST_TICK_AFTER = timedelta(seconds=2)
"""With an in-process queue nobody else enqueues for us: a queued job whose tick is not
here after this long was submitted by another process (a CLI command)."""
KAFKA_LOST_TICK_AFTER = timedelta(seconds=30)
"""Ticks on Kafka are durable; a queued job without one (submitted while the broker was
away, or by a process on the local transport) is published after this long."""

Command = Literal["run", "worker", "reconcile", "projections"]


@dataclass(frozen=True)
class Services:
    """What a process runs, by role."""

    workers: int = 0
    views: bool = False
    """Follow the log with the views (without it, the reconciler catches them up before
    each pass)."""
    outbox: bool = False
    """Publish every job event to the Kafka events topic."""
    reconciler: bool = False
    reconcile_interval: float = 1.0
    lost_tick_after: timedelta | None = None
    """Default: by transport, ``LOCAL_LOST_TICK_AFTER`` or ``KAFKA_LOST_TICK_AFTER``."""
    max_poll_records: int = 50
    http: ApiSettings | None = None
    """Serve the HTTP API at the settings' host and port (``run --http``)."""
    anchors: AnchorPlan | None = None
    """Anchor every chain head on a schedule (``run --anchor-to``)."""
    archiving: bool = False
    """Archive the jobs past their retention on a schedule, when ``retention_archive_to``
    is configured."""

    @classmethod
    def of(
        cls, command: Command, *, kafka: bool, workers: int = 1, outbox: bool = False
    ) -> Services:
        """What each command of the CLI runs, on the local transport or on Kafka.

        - ``run``: everything: workers, the views, the reconciler, scheduled archiving
          (when configured; and on Kafka the outbox).
        - ``worker``: workers; on the local transport with a reconciler, whose rule of
          what is due they take jobs by (``Reconciler.take``), on Kafka nothing else.
        - ``reconcile``: the reconciler (on the local transport with one worker, which
          runs what it enqueues).
        - ``projections``: the views, and the outbox if asked for.
        """
        if command == "run":
            return cls(workers=workers, views=True, outbox=kafka, reconciler=True, archiving=True)
        if command == "worker":
            return cls(workers=workers, reconciler=not kafka)
        if command == "reconcile":
            return cls(workers=0 if kafka else 1, reconciler=True)
        return cls(views=True, outbox=outbox)


@dataclass(frozen=True)
class _Service:
    name: str
    run: Callable[[], None]
    stop: Callable[[], None]


class Supervisor:
    def __init__(
        self,
        engine: Engine,
        services: Services,
        *,
        on_tick: TickObserver | None = None,
        after_effect: RecordHook | None = None,
    ) -> None:
        deps = engine.deps
        if services.workers and deps.local_queue is None and deps.kafka_queue is None:
            raise ConfigError("workers need the local queue or the Kafka ticks topic")
        self.engine = engine
        self.services = services
        self.stopping = threading.Event()
        self.threads: list[threading.Thread] = []
        self.kafka: KafkaSettings | None = None
        if deps.kafka_queue is not None or services.outbox:
            from jobledger.adapters.kafka import KafkaSettings

            self.kafka = KafkaSettings.of(deps.config)
        self.views = (
            JobViews(deps.store)
            if services.views or services.reconciler or services.workers
            else None
        )
        if services.workers and self.views is not None:
            engine.note_blocked_in(self.views)  # workers note jobs they cannot run as deployed
        self.kafka_workers = self._kafka_workers(on_tick, after_effect)
        self.publisher: KafkaEventPublisher | None = None
        self.reconciler = self._reconciler()
        self.local_workers = self._local_workers()
        self.metrics = self._metrics()
        self.api = self._api()
        self.anchoring = self._anchoring()
        self.archiving = self._archiving()
        self._services = self._wire()

    # ---- the roles ---------------------------------------------------------------------

    def _kafka_workers(
        self, on_tick: TickObserver | None, after_effect: RecordHook | None
    ) -> list[KafkaWorker]:
        if self.engine.deps.kafka_queue is None or self.kafka is None:
            if self.services.workers and self.engine.config.subscribing.subscriptions:
                # Silently not consuming a configured topic would lose its messages' jobs.
                raise ConfigError("subscriptions are read by Kafka workers: set transport = kafka")
            return []
        from jobledger.adapters.kafka.worker import KafkaWorker

        if self.services.workers:
            self._check_subscribed_workflows()

        return [
            KafkaWorker(
                self.engine,
                self.kafka,
                stopping=self.stopping,
                max_poll_records=self.services.max_poll_records,
                concurrency=self.engine.config.batching.concurrency,
                on_tick=on_tick,
                after_effect=after_effect,
            )
            for _ in range(self.services.workers)
        ]

    def _check_subscribed_workflows(self) -> None:
        """A subscription's workflow must be deployed here: else every message of its
        topic would be dead-lettered for a deployment mistake."""
        registry = self.engine.registry
        for subscription in self.engine.config.subscribing.subscriptions:
            workflow, version = subscription.workflow, subscription.workflow_version
            if workflow is None:
                continue
            known = registry.has(workflow, version) if version else _deployed(registry, workflow)
            if not known:
                which = workflow if version is None else f"{workflow} v{version}"
                raise ConfigError(
                    f"subscription {subscription.name!r}: workflow {which!r} is not deployed here"
                )

    def _local_workers(self) -> list[LocalWorker]:
        """Fed by their own process's queue and, with a reconciler, by the due jobs they
        take from the store: several processes on one store share those."""
        queue = self.engine.deps.local_queue
        if queue is None:
            return []
        take = None if self.reconciler is None else self.reconciler.take
        return [
            LocalWorker(self.engine, queue, self.stopping, take=take)
            for _ in range(self.services.workers)
        ]

    def _reconciler(self) -> Reconciler | None:
        if not self.services.reconciler:
            return None
        assert self.views is not None
        deps = self.engine.deps
        lost_tick_after = self.services.lost_tick_after
        if lost_tick_after is None:
            local = deps.local_queue is not None
            lost_tick_after = LOCAL_LOST_TICK_AFTER if local else KAFKA_LOST_TICK_AFTER
        return Reconciler(
            views=self.views,
            queue=deps.queue,
            clock=deps.clock,
            lock=lock_for(deps.store.location, "reconciler"),
            ops=deps.ops,
            lost_tick_after=lost_tick_after,
            schedules=ScheduleFiring(self.engine.schedules, self.views),
            admission=self.engine.admission_pass,
            # On the local transport each process's workers take due jobs from the store
            # (every process its share); on Kafka the pass publishes them for all.
            workers_take=bool(self.services.workers) and deps.local_queue is not None,
            take_hold=timedelta(milliseconds=deps.config.leases.ms),
        )

    def _metrics(self) -> MetricsServer | None:
        """What the process's metrics read at scrape time, by role (the outbox's lag is
        added with the outbox), and their own port when one is configured: bound now,
        like the API's, so a port in use stops the process before any service starts."""
        metrics = self.engine.deps.metrics
        if metrics is None:
            return None
        if self.views is not None:
            metrics.watch_status(self.views)
            metrics.watch_log_reader("views", self.views)
        if self.kafka_workers and self.kafka is not None:
            subscriptions = {s.name: s.topic for s in self.kafka.subscriptions}
            metrics.watch_consumers(list(self.kafka_workers), self.kafka.group_id, subscriptions)
        config = self.engine.config
        if config.metrics.port is None:
            return None
        return metrics.serve(config.metrics.host, config.metrics.port)

    def _api(self) -> ApiServer | None:
        """The HTTP API, its socket bound now: a port in use stops the process before
        any service starts. Imported only when asked for (the ``http`` extra)."""
        if self.services.http is None:
            return None
        from jobledger.api.server import serve_engine

        return serve_engine(self.engine, self.services.http)

    def _anchoring(self) -> ScheduledAnchoring | None:
        plan = self.services.anchors
        if plan is None:
            return None
        from jobledger.audit.anchor_schedule import ScheduledAnchoring

        deps = self.engine.deps
        lock = lock_for(deps.store.location, "anchors")
        return ScheduledAnchoring(deps.store, deps.clock, plan, deps.config, lock)

    def _archiving(self) -> ScheduledArchiving | None:
        deps = self.engine.deps
        if not self.services.archiving or deps.config.retention.archive_to is None:
            return None
        from jobledger.projections.archive_schedule import ScheduledArchiving

        return ScheduledArchiving(deps.store, deps.clock, deps.ops, deps.config)

    def _wire(self) -> list[_Service]:
        """The services in the order they start: the readers of the log, then the
        reconciler, then the workers, then the HTTP API."""
        wired: list[_Service] = []
        if self.services.views:
            assert self.views is not None
            lock = lock_for(self.engine.deps.store.location, "views")
            follower = ProjectionRunner(self.views, poll_interval=0.2, lock=lock)
            wired.append(_Service("projections", follower.run_forever, follower.stop))
        if self.services.outbox:
            wired.append(self._outbox())
        if self.reconciler is not None:
            reconciler = self.reconciler
            # Without a views follower, the reconciler brings the views up to date itself.
            catch_up = None if self.services.views or self.views is None else self.views.catch_up
            interval = self.services.reconcile_interval

            def reconcile() -> None:
                reconciler.run_forever(interval, catch_up=catch_up)

            wired.append(_Service("reconciler", reconcile, reconciler.stop))
        for n, worker in enumerate(self.local_workers):
            wired.append(_Service(f"worker-{n}", worker.run, worker.stop))
        for n, kafka_worker in enumerate(self.kafka_workers):
            wired.append(_Service(f"kafka-worker-{n}", kafka_worker.run, kafka_worker.stop))
        if self.api is not None:
            wired.append(_Service("http", self.api.run, self.api.stop))
        if self.anchoring is not None:
            wired.append(_Service("anchors", self.anchoring.run, self.anchoring.stop))
        if self.archiving is not None:
            wired.append(_Service("archiving", self.archiving.run, self.archiving.stop))
        return wired

    def _outbox(self) -> _Service:
        from jobledger.adapters.kafka.publisher import KafkaEventPublisher
        from jobledger.projections.outbox import Outbox, OutboxRunner

        assert self.kafka is not None
        store = self.engine.deps.store
        self.publisher = KafkaEventPublisher(self.kafka)
        lock = lock_for(store.location, "outbox")
        outbox = Outbox(store, self.publisher, lock=lock, routes=self.kafka.event_routes)
        if self.engine.deps.metrics is not None:
            self.engine.deps.metrics.watch_log_reader("outbox", outbox)
        runner = OutboxRunner(outbox)
        return _Service("outbox", runner.run_forever, runner.stop)

    # ---- running -----------------------------------------------------------------------

    @property
    def handled(self) -> int:
        """Ticks (and, on Kafka, signals) the workers handled."""
        local = sum(worker.handled for worker in self.local_workers)
        return local + sum(w.stats.ticks + w.stats.signals for w in self.kafka_workers)

    def start(self) -> None:
        """Make the topics (if asked to), catch up, re-enqueue what the in-process queue
        lost, then start the services."""
        self._prepare()
        reconciler = self.reconciler
        local = self.engine.deps.local_queue is not None
        if reconciler is not None and local and not reconciler.workers_take:
            result = reconciler.reconcile(lost_tick_after=timedelta(0))
            log.info("start-up: %d due jobs re-enqueued", result.enqueued)
        for service in self._services:
            self._spawn(service)

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
        for service in self._services:
            service.stop()
        for thread in self.threads:
            thread.join(timeout=30)
        if self.anchoring is not None:
            self.anchoring.final()  # after the workers: it pins their last steps too
        if self.publisher is not None:
            self.publisher.close()
        if self.metrics is not None:
            self.metrics.stop()  # last: a scrape sees the final counts until the end

    def reconcile_once(self) -> tuple[ReconcileResult, int]:
        """One reconcile pass by hand, then stop: every queued job counts as due (no other
        process is about to tick it). On the local queue the ticks it enqueued are run
        here, until none is due; on Kafka they are published for the workers. Returns the
        pass's result and how many ticks were run here."""
        reconciler = self.reconciler
        if reconciler is None:
            raise ConfigError("reconcile_once needs the reconciler role")
        self._prepare()
        try:
            # Its own workers do not run here: the pass enqueues what it finds.
            result = reconciler.reconcile(lost_tick_after=timedelta(0), enqueue=True)
            local = self.engine.deps.local_queue is not None
            handled = self.engine.run_until_idle() if local else 0
        finally:
            reconciler.stop()
        return result, handled

    def _prepare(self) -> None:
        if self.kafka is not None and self.kafka.create_topics:
            from jobledger.adapters.kafka import ensure_topics

            ensure_topics(self.kafka)
        if self.views is not None and (self.services.views or self.services.reconciler):
            self.views.catch_up()

    def _spawn(self, service: _Service) -> None:
        thread = threading.Thread(
            target=self._keep_running(service), name=f"jobledger-{service.name}", daemon=True
        )
        thread.start()
        self.threads.append(thread)

    def _keep_running(self, service: _Service) -> Callable[[], None]:
        def run() -> None:
            # A service that died of an unexpected error starts again (a worker whose
            # broker was away at start-up, a client that broke): uncommitted messages are
            # delivered again, and a follower goes on from its tracked position.
            while not self.stopping.is_set():
                try:
                    service.run()
                    return
                except Exception:
                    log.exception("%s stopped; restarting it", service.name)
                    self.stopping.wait(RESTART_BACKOFF_SECONDS)

        return run


class LocalWorker:
    """Takes ticks from the in-process queue and hands them to the engine, up to the
    engine's ``concurrency`` at once (one per job), so their step appends share a group
    commit. With ``take``, a free lane with nothing due here takes due jobs from the
    store (:meth:`Reconciler.take`), only as many as it has free lanes: a backlog stays
    in the store for whichever process has room, so every process sharing the store
    keeps busy."""

    def __init__(
        self,
        engine: Engine,
        queue: LocalQueue,
        stopping: threading.Event,
        *,
        take: Callable[[int], list[Tick]] | None = None,
    ) -> None:
        self.engine = engine
        self.queue = queue
        self.stopping = stopping
        self.take = take
        self.handled = 0
        self._counting = threading.Lock()
        self._store_empty_until = 0.0

    def run(self) -> None:
        width = self.engine.config.batching.concurrency
        lanes: Lanes[Tick] = Lanes(
            width, self.handle, lambda tick: tick.job, name="jobledger-worker"
        )
        try:
            while not self.stopping.is_set():
                if not lanes.wait_below(width, timeout=0.2):
                    continue
                tick = self.queue.pop_due()
                if tick is None and self._take_into(lanes, width - lanes.busy()):
                    continue
                if tick is None:
                    tick = self.queue.get(timeout=TAKE_INTERVAL if self.take else 0.2)
                if tick is not None:
                    lanes.put(tick)
        finally:
            # The ticks in hand finish; the ones not started go back (the queue is only a
            # cache of what is due: the reconciler re-enqueues them after a restart).
            for tick in lanes.close():
                self.queue.enqueue(tick)

    def _take_into(self, lanes: Lanes[Tick], room: int) -> bool:
        """Take up to ``room`` due jobs from the store onto the lanes; True if any came.
        A take that found the store with less than asked waits ``TAKE_INTERVAL`` before
        the next, so an idle process asks the store a few times a second, not per loop."""
        if self.take is None or room < 1 or time.monotonic() < self._store_empty_until:
            return False
        try:
            ticks = self.take(room)
        except StoreUnavailableError:  # the store briefly away: our own queue goes on
            log.warning("taking due jobs from the store failed; trying again shortly")
            ticks = []
        if len(ticks) < room:
            self._store_empty_until = time.monotonic() + TAKE_INTERVAL
        for tick in ticks:
            lanes.put(tick)
        return bool(ticks)

    def handle(self, tick: Tick) -> None:
        try:
            self.engine.handle(tick)
        except Exception:  # a bug must not kill the worker; the reconciler retries
            log.exception("tick for %s/%s failed", tick.tenant_id, tick.job_id)
        with self._counting:
            self.handled += 1

    def stop(self) -> None:
        self.stopping.set()


def _deployed(registry: WorkflowRegistry, workflow_type: str) -> bool:
    try:
        registry.latest_version(workflow_type)
    except UnknownWorkflowError:
        return False
    return True
