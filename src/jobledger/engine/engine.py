"""The public facade: ``from jobledger import Engine``.

The core (job, orchestrator, registry) talks to ports only; the composition root
(``jobledger.engine.bootstrap``) picks the adapters, and the engine is built from what it wired.
The facade is thin: its parts live one module each (:mod:`jobledger.engine.job_commands`,
:mod:`jobledger.engine.ticks`, :mod:`jobledger.engine.reads`) over :class:`EngineParts`.
"""

from __future__ import annotations

import threading

from jobledger.adapters.event_store import StoreMode
from jobledger.config import EngineConfig
from jobledger.domain.erasure import SubjectKeys
from jobledger.engine import bootstrap
from jobledger.engine.bootstrap import Deps
from jobledger.engine.engine_parts import EngineParts
from jobledger.engine.erasure_commands import ErasureCommands
from jobledger.engine.job_commands import SignalOutcome, Submission
from jobledger.engine.reads import JobReader
from jobledger.engine.schedule_commands import ScheduleCommands
from jobledger.engine.ticks import TickRunner
from jobledger.orchestration.group_commit import GroupCommitter
from jobledger.orchestration.orchestrator import Orchestrator
from jobledger.orchestration.ports import (
    BlockedNotes,
    Clock,
    Cost,
    EventSigner,
    FieldSealer,
    JobStore,
    Leases,
    Notifier,
    Ops,
    Queue,
    ResumeTokens,
    StepExecutor,
    WorkflowRegistry,
)
from jobledger.orchestration.tracing import Tracer

_TURN_STRIPES = 64
"""Locks the commands' writers of one job take turns on (a job hashes to one): the
engine's own threads queue here rather than racing each other at the store."""

__all__ = ["Engine", "EngineParts", "SignalOutcome", "Submission"]


class Engine(ErasureCommands, TickRunner, JobReader):
    """The facade: commands on jobs, the tick, the reads. Built from the wiring the
    composition root decided (:func:`jobledger.engine.bootstrap.build`); ``Engine.open`` does
    both."""

    def __init__(self, deps: Deps) -> None:
        self.deps = deps
        """What this engine was wired with, the concrete adapters included."""
        self.store: JobStore = deps.store
        self.queue: Queue = deps.queue
        self.clock: Clock = deps.clock
        self.ops: Ops = deps.ops
        self.registry: WorkflowRegistry = deps.registry
        self.config: EngineConfig = deps.config
        self.tokens: ResumeTokens | None = deps.tokens
        self.leases: Leases | None = deps.leases
        self.subject_keys: SubjectKeys | None = deps.subject_keys
        self.tracer: Tracer = deps.tracer
        self._turns = [threading.Lock() for _ in range(_TURN_STRIPES)]
        self.blocked_notes: BlockedNotes | None = None
        """Where ``handle`` notes jobs it left untouched for a deployment error (the
        supervisor plugs in the views, so ``show`` and ``list`` say why)."""
        self.orchestrator = Orchestrator(deps)
        self.group = GroupCommitter(
            deps.store,
            max_batch=deps.config.batching.max_batch,
            max_wait_ms=deps.config.batching.max_batch_wait_ms,
            prepare=deps.store.sealing.seal_pending,
        )
        """Commits the step appends of the ticks this engine runs at once together."""
        self.orchestrator.tick_appends = self.group
        self.orchestrator.family.spawner = self.spawn_child
        self.schedules = ScheduleCommands(self)
        """Create, pause, resume, delete and trigger schedules (``engine.schedule_commands``)."""

    @classmethod
    def open(
        cls,
        store_url: str | None = None,
        *,
        registry: WorkflowRegistry,
        executor: StepExecutor | None = None,
        clock: Clock | None = None,
        config: EngineConfig | None = None,
        queue: Queue | None = None,
        ops: Ops | None = None,
        cost: Cost | None = None,
        tokens: ResumeTokens | None = None,
        notifier: Notifier | None = None,
        store_mode: StoreMode = "create",
        sealer: FieldSealer | None = None,
        signer: EventSigner | None = None,
        metrics: bool = False,
        tracer: Tracer | None = None,
    ) -> Engine:
        """Open (creating if needed, unless ``store_mode`` says otherwise: see
        :data:`~jobledger.adapters.event_store.StoreMode`) the store at ``store_url`` and
        wire the defaults (:func:`jobledger.engine.bootstrap.build`):
        a local in-process queue (the Kafka ticks topic when ``transport`` is kafka), the
        system clock, JSON ops logs, spend folded from the log, and JWT resume tokens when
        a token secret is configured. Any clock but a ``FakeClock`` is set to the store's
        (``StoreTimeClock``). The store signs every event it writes with
        ``signer`` and seals personal values with ``sealer`` when given. With ``metrics``
        (or ``config.metrics.port``) it keeps Prometheus metrics (``deps.metrics``). Its spans go to
        ``tracer``, else to the exporter the config names (none by default)."""
        config = config if config is not None else EngineConfig()
        if store_url is not None:
            config = config.model_copy(update={"store_url": store_url})
        deps = bootstrap.build(
            config,
            registry=registry,
            executor=executor,
            clock=clock,
            queue=queue,
            ops=ops,
            cost=cost,
            tokens=tokens,
            notifier=notifier,
            store_mode=store_mode,
            sealer=sealer,
            signer=signer,
            metrics=metrics,
            tracer=tracer,
        )
        return cls(deps)

    def close(self) -> None:
        self.orchestrator.async_steps.close()
        self.deps.close()

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()
