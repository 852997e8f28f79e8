"""The public facade: ``from jobledger import Engine``.

The core (job, orchestrator, registry) talks to ports only; the composition root
(``jobledger.engine.bootstrap``) picks the adapters, and the engine builds its parts from
what it wired, one module each: the commands on jobs (:mod:`jobledger.engine.job_commands`),
erasure (:mod:`jobledger.engine.erasure_commands`), repair
(:mod:`jobledger.engine.repair_commands`), schedules
(:mod:`jobledger.engine.schedule_commands`), the tick (:mod:`jobledger.engine.ticks`), the
reads (:mod:`jobledger.engine.reads`) and the admission gate
(:mod:`jobledger.engine.admission_gate`). Its methods forward to them.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, Concatenate, ParamSpec, TypeVar, Unpack

from jobledger.config import EngineConfig
from jobledger.domain.erasure import SubjectKeys
from jobledger.engine import bootstrap
from jobledger.engine.admission_gate import Gatekeeper
from jobledger.engine.bootstrap import Deps, Parts
from jobledger.engine.bulk_commands import BulkCommands
from jobledger.engine.erasure_commands import ErasureCommands
from jobledger.engine.job_commands import JobCommands, SignalOutcome, Submission
from jobledger.engine.job_finder import JobFinder
from jobledger.engine.reads import JobReader
from jobledger.engine.repair_commands import RepairCommands
from jobledger.engine.schedule_commands import ScheduleCommands
from jobledger.engine.ticks import TickRunner
from jobledger.orchestration.group_commit import GroupCommitter
from jobledger.orchestration.orchestrator import Orchestrator
from jobledger.orchestration.ports import (
    Clock,
    JobStore,
    Leases,
    Ops,
    Queue,
    ResumeTokens,
    WorkflowRegistry,
)
from jobledger.orchestration.tracing import Tracer

__all__ = ["Engine", "SignalOutcome", "Submission"]

_P = ParamSpec("_P")
_R = TypeVar("_R")


def _to(
    part: str, method: Callable[Concatenate[Any, _P], _R]
) -> Callable[Concatenate[Any, _P], _R]:
    """The engine's method that calls ``method`` on its part named ``part``: one line per
    method, with the part's signature and docstring."""

    @functools.wraps(method)
    def forwarded(engine: Any, /, *args: _P.args, **kwargs: _P.kwargs) -> _R:
        return method(getattr(engine, part), *args, **kwargs)

    return forwarded


class Engine:
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
        self.config: EngineConfig = deps.config
        self.tokens: ResumeTokens | None = deps.tokens
        self.leases: Leases | None = deps.leases
        self.subject_keys: SubjectKeys | None = deps.subject_keys
        self.tracer: Tracer = deps.tracer
        self.jobs = JobFinder(deps.store, deps.leases)
        self.group = GroupCommitter(
            deps.store,
            max_batch=deps.config.batching.max_batch,
            max_wait_ms=deps.config.batching.max_batch_wait_ms,
            prepare=deps.store.sealing.seal_pending,
        )
        """Commits the step appends of the ticks this engine runs at once together."""
        # The children a map step plans are submitted by the commands, built below with
        # this orchestrator: it is handed the engine's method, which reaches them by then.
        self.orchestrator = Orchestrator(deps, tick_appends=self.group, spawner=self.spawn_child)
        self.gatekeeper = Gatekeeper(deps, self.orchestrator)
        self.commands = JobCommands(deps, self.orchestrator, self.jobs, self.gatekeeper)
        self.erasure = ErasureCommands(deps, self.orchestrator, self.jobs, self.commands)
        self.repairs = RepairCommands(
            deps, self.orchestrator, self.jobs, self.commands, self.gatekeeper
        )
        """Retry, reset and fork jobs (``engine.repair_commands``)."""
        self.ticks = TickRunner(deps, self.orchestrator, self.group, self.gatekeeper)
        self.reads = JobReader(deps, self.jobs)
        self.schedules = ScheduleCommands(deps, self.jobs, self.commands)
        """Create, pause, resume, delete and trigger schedules (``engine.schedule_commands``)."""
        self.bulk = BulkCommands(deps, self.commands, self.repairs)
        """Bulk actions over a query, as durable batches (``engine.bulk_commands``)."""

    @classmethod
    def open(
        cls,
        store_url: str | None = None,
        *,
        config: EngineConfig | None = None,
        **parts: Unpack[Parts],
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
        return cls(bootstrap.build(config, **parts))

    @property
    def registry(self) -> WorkflowRegistry:
        """The definitions this engine runs with now (``deps.deployment``)."""
        return self.deps.deployment.registry

    def use_registry(self, registry: WorkflowRegistry) -> None:
        """Run with these definitions from the next resolution on (a reload on SIGHUP):
        one reference swapped, in the deployment every part reads."""
        self.deps.deployment.registry = registry

    # ---- the commands on jobs (engine.job_commands) -----------------------------------
    submit = _to("commands", JobCommands.submit)
    submission = _to("commands", JobCommands.submission)
    spawn_child = _to("commands", JobCommands.spawn_child)
    resume = _to("commands", JobCommands.resume)
    reissue_token = _to("commands", JobCommands.reissue_token)
    signal = _to("commands", JobCommands.signal)
    decide = _to("commands", JobCommands.decide)
    reassign = _to("commands", JobCommands.reassign)
    raise_budget = _to("commands", JobCommands.raise_budget)
    cancel = _to("commands", JobCommands.cancel)
    migrate = _to("commands", JobCommands.migrate)

    # ---- erasure (engine.erasure_commands) --------------------------------------------
    erase = _to("erasure", ErasureCommands.erase)
    erase_job = _to("erasure", ErasureCommands.erase_job)

    # ---- repair (engine.repair_commands) ----------------------------------------------
    retry = _to("repairs", RepairCommands.retry)
    reset = _to("repairs", RepairCommands.reset)
    fork = _to("repairs", RepairCommands.fork)

    # ---- the tick (engine.ticks) ------------------------------------------------------
    tick = _to("ticks", TickRunner.tick)
    run_tick = _to("ticks", TickRunner.run_tick)
    run_until_idle = _to("ticks", TickRunner.run_until_idle)
    handle = _to("ticks", TickRunner.handle)
    deployment_blocked = _to("ticks", TickRunner.deployment_blocked)
    note_blocked_in = _to("ticks", TickRunner.note_blocked_in)

    # ---- the admission gate (engine.admission_gate) -----------------------------------
    admission_pass = _to("gatekeeper", Gatekeeper.admission_pass)
    queued_because = _to("gatekeeper", Gatekeeper.queued_because)

    # ---- the reads (engine.reads) -----------------------------------------------------
    job = _to("reads", JobReader.job)
    family = _to("reads", JobReader.family)
    history = _to("reads", JobReader.history)
    verify = _to("reads", JobReader.verify)
    job_at = _to("reads", JobReader.job_at)
    replay = _to("reads", JobReader.replay)
    replay_all = _to("reads", JobReader.replay_all)

    def close(self) -> None:
        self.ticks.close()
        self.orchestrator.async_steps.close()
        self.deps.close()

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()
