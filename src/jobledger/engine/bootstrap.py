"""The composition root: the one place where configuration picks the adapters.

``build(config, **parts)`` opens the store and wires the ports a process runs with (the
caller's :class:`Parts`, the config's defaults for the rest) into a :class:`Deps`. The
facade (:class:`jobledger.Engine`) and the orchestrator are built from it; the process
level (the supervisor, the CLI) reads the concrete adapters it needs from it, typed as
what was built, instead of downcasting the facade's ports.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypedDict, Unpack

from jobledger.adapters.admission_table import AdmissionTable
from jobledger.adapters.clock import FakeClock, StoreTimeClock, SystemClock
from jobledger.adapters.event_store import EventSourcedJobStore, StoreMode
from jobledger.adapters.field_cipher import FieldCipher
from jobledger.adapters.jwt_tokens import JwtResumeTokens
from jobledger.adapters.local_queue import LocalQueue
from jobledger.adapters.log_spend import LogSpend
from jobledger.adapters.notifier import Notifiers, notifier_from_spec
from jobledger.adapters.ops import LoggingOps, TeeOps
from jobledger.adapters.signing import Ed25519Signer
from jobledger.adapters.step_rates import StepRateTable
from jobledger.adapters.store_url import parse_store_url
from jobledger.adapters.subject_keys import MasterKeyError, SubjectKeyTable, master_key
from jobledger.config import EngineConfig
from jobledger.domain.admission import Policy
from jobledger.domain.errors import ConfigError
from jobledger.orchestration.deployment import Deployment
from jobledger.orchestration.ports import (
    AdmissionGate,
    Clock,
    Cost,
    EventSigner,
    FieldSealer,
    Leases,
    Notifier,
    Ops,
    Queue,
    ResumeTokens,
    StepExecutor,
    StepRates,
    WorkflowRegistry,
)
from jobledger.orchestration.tracing import NOOP, Tracer
from jobledger.workflows.code import CodeWorkflow
from jobledger.workflows.definition import WorkflowDefinition
from jobledger.workflows.registries import Registries
from jobledger.workflows.replayer import CodeRegistry
from jobledger.workflows.resolver import DefinitionRegistry
from jobledger.workflows.serving import require_served, task_names
from jobledger.workflows.tasks import Task, TaskExecutor

if TYPE_CHECKING:
    from jobledger.adapters.kafka import KafkaQueue
    from jobledger.adapters.metrics import Metrics


class Parts(TypedDict, total=False):
    """What the caller hands in (``Engine.open``, :func:`build`); the rest is wired from
    the config. ``registry`` or ``workflows`` is required."""

    registry: WorkflowRegistry
    workflows: Sequence[CodeWorkflow | WorkflowDefinition]
    """Code workflows and definitions, served beside ``registry`` (if any)."""
    tasks: Sequence[Task]
    """Step functions beyond those the code workflows name (a definition's tasks)."""
    executor: StepExecutor | None
    clock: Clock | None
    queue: Queue | None
    ops: Ops | None
    cost: Cost | None
    tokens: ResumeTokens | None
    notifier: Notifier | None
    store_mode: StoreMode
    sealer: FieldSealer | None
    signer: EventSigner | None
    metrics: bool
    tracer: Tracer | None


@dataclass(frozen=True)
class Deps:
    """The ports and adapters one process runs with, wired once by :func:`build`.

    ``store`` is the event store itself; ``local_queue`` and ``kafka_queue`` name the
    queue again, concretely, when it is the in-process one or the Kafka ticks topic (at
    most one of them is set): what drains the local queue, or consumes the topic, needs
    that adapter and not just the ``Queue`` port."""

    config: EngineConfig
    deployment: Deployment
    """The registry, held once: a reload swaps it there for every reader."""
    executor: StepExecutor | None
    store: EventSourcedJobStore
    queue: Queue
    clock: Clock
    ops: Ops
    cost: Cost | None
    tokens: ResumeTokens | None
    notifier: Notifier | None
    subject_keys: SubjectKeyTable | None = None
    """The data subjects' keys (the cipher's, and erasure's), beside the store."""
    local_queue: LocalQueue | None = None
    kafka_queue: KafkaQueue | None = None
    metrics: Metrics | None = None
    """The process's Prometheus metrics, when kept: already teed into ``ops``."""
    tracer: Tracer = NOOP
    """Where the spans go (``orchestration.tracing``): nowhere unless an exporter is set."""
    admission: AdmissionGate | None = None
    """The admission gate (``jobledger.domain.admission``); None when its window is 0."""
    step_rates: StepRates | None = None
    """The fleet-wide step-rate buckets, beside the store."""

    @property
    def leases(self) -> Leases:
        """The heartbeat-renewed leases live in the store's database."""
        return self.store.leases

    def close(self) -> None:
        # The queue first: a Kafka producer flushes what it still holds.
        close = getattr(self.queue, "close", None)
        if close is not None:
            close()
        stop = getattr(self.clock, "close", None)
        if stop is not None:  # a StoreTimeClock's thread
            stop()
        self.store.close()
        shutdown = getattr(self.tracer, "shutdown", None)
        if shutdown is not None:  # exports the spans still batched
            shutdown()


def build(config: EngineConfig, **parts: Unpack[Parts]) -> Deps:
    """Open (creating if needed, unless ``store_mode`` says otherwise: see
    :data:`~jobledger.adapters.event_store.StoreMode`) the store at ``config.store_url``
    and wire the defaults for what is not given: a local in-process queue (the Kafka
    ticks topic when ``config.transport`` is kafka), the system clock, JSON ops logs,
    spend folded from the log, and JWT resume tokens when a token secret is configured.
    Any clock but a ``FakeClock`` is set to the store's (``_store_time``).
    The store signs what it writes with ``signer``, or the configured signing keys.
    Spans go to ``tracer``, else to the configured exporter (``otel_exporter``).

    Metrics are kept when ``metrics`` says so or ``config.metrics.port`` is set: their
    counting sink then gets every ops event beside the given (or logging) sink.

    The transport is decided here, once: a process that runs on Kafka says so in the
    config it builds from (the CLI's ``--transport``), never by swapping queues later."""
    store_mode = parts.get("store_mode", "create")
    signer, sealer = parts.get("signer"), parts.get("sealer")
    subject_keys = SubjectKeyTable(master=_master_key(config))
    if signer is None and store_mode != "read" and config.signing.signing_keys is not None:
        signer = Ed25519Signer.from_file(config.signing.signing_keys)
    store = EventSourcedJobStore(
        parse_store_url(config.store_url),
        partitions=config.store.partitions,
        cache_size=config.store.cache_size,
        snapshot_interval=config.store.snapshot_interval,
        mode=store_mode,
        sealer=sealer if sealer is not None else FieldCipher(subject_keys),
        signer=signer,
    )
    subject_keys.attach(store.backend, create=store_mode != "read")
    given = parts.get("clock")
    clock = _store_time(given if given is not None else SystemClock(), store)
    chosen, local_queue, kafka_queue = _queue(config, clock, parts.get("queue"))
    ops, cost, tokens = parts.get("ops"), parts.get("cost"), parts.get("tokens")
    tracer = parts.get("tracer")
    sink = ops if ops is not None else LoggingOps()
    metrics = parts.get("metrics", False) or config.metrics.port is not None
    kept = _metrics(config, clock) if metrics else None
    return Deps(
        config=config,
        deployment=Deployment(workflow_registry(parts)),
        executor=step_executor(parts),
        store=store,
        queue=chosen,
        clock=clock,
        ops=sink if kept is None else TeeOps(sink, kept),
        cost=cost if cost is not None else LogSpend(store),
        tokens=tokens if tokens is not None else _tokens(config),
        notifier=_notifier(config, parts.get("notifier")),
        subject_keys=subject_keys,
        local_queue=local_queue,
        kafka_queue=kafka_queue,
        metrics=kept,
        tracer=tracer if tracer is not None else _tracer(config),
        admission=_admission(config, store),
        step_rates=StepRateTable(store.backend),
    )


def workflow_registry(parts: Parts) -> WorkflowRegistry:
    """The registry the engine resolves with: the one handed in, and the code workflows
    and definitions of ``workflows`` beside it."""
    given = parts.get("registry")
    workflows = list(parts.get("workflows", ()))
    if given is None and not workflows:
        raise ConfigError("an engine needs workflows: pass registry= or workflows=")
    if not workflows:
        assert given is not None
        return given
    code = CodeRegistry(w for w in workflows if isinstance(w, CodeWorkflow))
    declared = [w for w in workflows if isinstance(w, WorkflowDefinition)]
    unknown = [w for w in workflows if not isinstance(w, CodeWorkflow | WorkflowDefinition)]
    if unknown:
        raise ConfigError(
            f"workflows= takes @workflow functions and definitions, not {unknown[0]!r}"
        )
    registries: list[WorkflowRegistry] = [code, DefinitionRegistry(declared)]
    try:
        return Registries([*registries, *([given] if given is not None else [])])
    except ValueError as error:
        raise ConfigError(str(error)) from None


def step_executor(parts: Parts) -> StepExecutor | None:
    """The executor of the engine's steps: the step functions (those ``tasks`` lists and
    those the code workflows name) by task name, the ``executor`` handed in for the rest.
    Without an executor, every task a definition names must be served by a function."""
    given = parts.get("executor")
    tasks = list(parts.get("tasks", ()))
    workflows = list(parts.get("workflows", ()))
    names = task_names([*workflows, *_definitions_of(parts.get("registry"))], tasks)
    if not names.served:
        return given
    try:
        executor = TaskExecutor(tasks, fallback=given)
        for workflow in workflows:
            if isinstance(workflow, CodeWorkflow):
                for task in workflow.tasks():
                    executor.add(task)
    except ValueError as error:
        raise ConfigError(str(error)) from None
    if given is None:
        require_served(names)
    return executor


def _definitions_of(registry: WorkflowRegistry | None) -> list[WorkflowDefinition]:
    if isinstance(registry, DefinitionRegistry):
        return [registry.get(t, v) for t, v in registry.known()]
    return []


def _store_time(clock: Clock, store: EventSourcedJobStore) -> Clock:
    """This host's clock set to the store's, so that every process keeps one time: a
    worker whose clock is wrong neither fires a timer early nor takes a lease that is
    live. A ``FakeClock`` is a simulation's whole time (a test's, the demo's), the
    store's included: it is kept as it is."""
    if isinstance(clock, FakeClock):
        return clock
    return StoreTimeClock(clock, store.clock)


def _queue(
    config: EngineConfig, clock: Clock, given: Queue | None
) -> tuple[Queue, LocalQueue | None, KafkaQueue | None]:
    """The queue, and again as the in-process one or as the Kafka ticks topic. A queue
    the caller hands in (a test's, a benchmark's) counts as the local queue only when it
    is one; it is classified here, where it enters, not where it is used."""
    if given is not None:
        return given, (given if isinstance(given, LocalQueue) else None), None
    if config.transport == "kafka":
        # Imported here: an engine on the local queue never loads the Kafka client.
        from jobledger.adapters.kafka import KafkaQueue, KafkaSettings

        kafka = KafkaQueue(KafkaSettings.of(config))
        return kafka, None, kafka
    local = LocalQueue(clock)
    return local, local, None


def _admission(config: EngineConfig, store: EventSourcedJobStore) -> AdmissionGate | None:
    """The admission table, when a window or a limit asks for it: without either, no job
    waits, and none pays for a write of the gate's."""
    policy = Policy(config)
    return AdmissionTable(store.backend, policy) if policy.enabled else None


def _metrics(config: EngineConfig, clock: Clock) -> Metrics:
    """Imported only when kept: prometheus-client is an extra (``metrics``, or ``http``)."""
    try:
        from jobledger.adapters.metrics import Metrics
    except ImportError:
        raise ConfigError(
            "metrics need prometheus-client: pip install 'jobledger[metrics]'"
        ) from None
    return Metrics.of(config, clock.now)


def _tracer(config: EngineConfig) -> Tracer:
    if config.otel.exporter == "none":
        return NOOP  # no SDK loaded, no span made
    # Imported here: the OpenTelemetry SDK is the otel extra's, loaded only when asked for.
    try:
        from jobledger.adapters.otel import OtelTracer
    except ImportError as error:
        raise ConfigError(
            f"otel_exporter {config.otel.exporter} needs the otel extra "
            f"(pip install 'jobledger[otel]'): {error}"
        ) from None
    return OtelTracer.exporting(config.otel.exporter, service_name=config.otel.service_name)


def _master_key(config: EngineConfig) -> bytes | None:
    secret = config.store.erasure_master_key
    try:
        return None if secret is None else master_key(secret.get_secret_value())
    except MasterKeyError as error:
        raise ConfigError(f"JOBLEDGER_ERASURE_MASTER_KEY: {error}") from None


def _notifier(config: EngineConfig, given: Notifier | None) -> Notifier | None:
    """The configured notifier, beside the one the caller hands in (the CLI keeps what a
    tick hands out, to print it); each shielded from the other's failures."""
    if config.notifications.notifier is None:
        return given
    secret = (
        config.notifications.notifier_secret.get_secret_value()
        if config.notifications.notifier_secret
        else None
    )
    configured = notifier_from_spec(config.notifications.notifier, secret=secret)
    return Notifiers(*(n for n in (given, configured) if n is not None))


def _tokens(config: EngineConfig) -> ResumeTokens | None:
    if config.tokens.secret is None:
        return None
    return JwtResumeTokens(
        secret=config.tokens.secret.get_secret_value(),
        key_id=config.tokens.key_id,
        ttl_seconds=config.tokens.ttl_seconds,
        issuer=config.tokens.issuer,
        audience=config.tokens.audience,
        previous_keys={
            kid: key.get_secret_value() for kid, key in config.tokens.previous_keys.items()
        },
    )
