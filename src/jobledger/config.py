"""Engine configuration: one pydantic settings model, read from ``JOBLEDGER_*`` variables.

Its settings are grouped by concern (``config.kafka.ticks_topic``, ``config.leases.ms``),
yet each keeps its flat name: the group's prefix plus its own (``kafka_ticks_topic``,
``lease_ms``). That name is the keyword (``EngineConfig(lease_ms=5_000)``), the config
file's key and, upper-cased after ``JOBLEDGER_``, the environment variable; an error
names it too. :data:`SETTINGS` maps every flat name to its place.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping
from decimal import Decimal
from pathlib import Path
from typing import Any, ClassVar, Final, Literal, Self

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    ValidationError,
    ValidatorFunctionWrapHandler,
    create_model,
    field_validator,
    model_validator,
)
from pydantic.fields import FieldInfo
from pydantic_core import InitErrorDetails
from pydantic_settings import (
    BaseSettings,
    EnvSettingsSource,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
)

from jobledger.domain.errors import ConfigError
from jobledger.domain.event_routes import KAFKA_TOPIC, EventRoute
from jobledger.domain.retention import ArchiveTarget
from jobledger.domain.subscription import Subscription, check_libraries, check_unique

_TOPIC = KAFKA_TOPIC


def _default_worker_id() -> str:
    return f"{socket.gethostname()}-{os.getpid()}"


class ConcurrencyLimit(BaseModel):
    """A limit on one tenant's jobs (``tenant`` ``*``: on each tenant's, separately), or
    on its jobs of one workflow type."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    tenant: str = Field(default="*", min_length=1)
    workflow: str | None = Field(default=None, min_length=1)
    max_running: int | None = Field(default=None, ge=1)
    """Jobs started and not yet ended at once; more stay queued until one ends."""
    max_steps_per_second: float | None = Field(default=None, gt=0)
    """Steps of these jobs, fleet-wide; a step over the rate waits for its turn."""


class Options(BaseModel):
    """One group of :class:`EngineConfig`'s settings. Each setting's flat name is the
    group's ``prefix`` plus its own."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    prefix: ClassVar[str] = ""


class StoreOptions(Options):
    """The event store's shape and caches."""

    partitions: int = Field(default=1, ge=1, le=64)
    """Event tables; a job lives in partition hash(job id) % partitions. Fixed per store."""
    cache_size: int = Field(default=10_000, ge=0)
    snapshot_interval: int = Field(default=100, ge=0)
    """Snapshot a job every N events so a cold load never replays a long history."""
    erasure_master_key: SecretStr | None = None
    """Wraps the data subjects' keys in the store (base64url of 32 bytes): a copy of the
    database alone then opens no personal value. Unset: the keys are stored unwrapped."""


class TickOptions(Options):
    """How far one tick goes and when a parked job resumes."""

    max_steps_per_tick: int = Field(default=10, ge=1)
    inline_resume_max_delay_ms: int = Field(default=1_000, ge=0)
    default_wait_ms: int = Field(default=60_000, ge=0)
    resume_mode: Literal["queue", "scan_only"] = "queue"
    """``scan_only`` leaves every timer to the reconciler instead of enqueueing it."""


class LeaseOptions(Options):
    """The claim a running step holds on its job."""

    prefix: ClassVar[str] = "lease_"

    ms: int = Field(default=15_000, ge=1)
    """How long a claim protects a running step without a heartbeat. While the step runs,
    its worker renews the lease every lease_ms / 3, so a live step keeps its job however
    long it takes, and a dead worker's job is taken over about one lease after it died."""


class LimitOptions(Options):
    """What a tenant may spend and what a payload may weigh."""

    cost_ceiling_usd: Decimal = Field(default=Decimal(0), ge=0)
    """Per tenant per UTC day; 0 disables the ceiling."""
    tenant_cost_ceilings_usd: dict[str, Decimal] = Field(default_factory=dict)
    """Overrides of the ceiling by tenant id (JSON in the environment variable)."""
    max_payload_bytes: int = Field(default=256 * 1024, ge=1)


class BatchOptions(Options):
    """Ticks run at once and the group commits of their appends."""

    concurrency: int = Field(default=16, ge=1, le=1024)
    """Ticks one worker runs at once (threads; an ``async def execute`` runs on one shared
    event loop). Their step appends are committed together (group commit)."""
    max_batch: int = Field(default=64, ge=1)
    """The most step appends one group commit writes."""
    max_batch_wait_ms: float = Field(default=2.0, ge=0)
    """How long the first append of a group waits for the other ticks in flight; a tick
    running alone never waits."""


class AdmissionOptions(Options):
    """Which queued jobs start, and when."""

    admission_window: int = Field(default=0, ge=0)
    """Jobs started (admitted) and not yet ended or waiting, fleet-wide; queued jobs
    beyond it are admitted round-robin across tenants as these end. 0: no window (the
    gate then holds only jobs a ``max_running`` limit applies to; other jobs start at
    submit, with no write of the gate's)."""
    priority_aging_seconds: float = Field(default=60.0, gt=0)
    """A queued job gains one priority level per this many seconds it waits."""
    concurrency_limits: list[ConcurrencyLimit] = Field(default_factory=list)
    """Per tenant and per tenant and workflow type (JSON list in the environment)."""


class TokenOptions(Options):
    """The resume tokens jobs waiting for an event hand out."""

    prefix: ClassVar[str] = "token_"

    secret: SecretStr | None = Field(default=None, min_length=32)
    """HS256 key for resume tokens (>= 32 bytes, RFC 7518 3.2); needed to wait for events."""
    key_id: str = "k1"
    previous_keys: dict[str, SecretStr] = Field(default_factory=dict)
    """Retired keys by key id, still accepted when verifying tokens issued under them."""
    ttl_seconds: int = Field(default=86_400, ge=1)
    issuer: str = "jobledger"
    audience: str = "jobledger.resume"


class NotifierOptions(Options):
    """Where the tokens and approval requests jobs hand out go."""

    notifier: str | None = None
    """``stdout``, ``file:PATH`` (JSON lines), ``webhook:URL`` (a JSON POST) or
    ``package.module:Class``."""
    notifier_secret: SecretStr | None = None
    """Signs each webhook POST: ``X-Jobledger-Signature: sha256=<HMAC of the body>``."""


class OtelOptions(Options):
    """Tracing (the otel extra)."""

    prefix: ClassVar[str] = "otel_"

    exporter: Literal["none", "console", "otlp"] = "none"
    """Where spans go: ``otlp`` (to ``OTEL_EXPORTER_OTLP_ENDPOINT``, the OpenTelemetry
    SDK's own settings), ``console`` (stdout, for development) or nowhere."""
    service_name: str = Field(default="jobledger", min_length=1)
    """The ``service.name`` of the spans this process exports."""


class SigningOptions(Options):
    """Signed events and the keys that check them."""

    signing_keys: Path | None = None
    """The signing-keys file (``jobledger.adapters.signing``): set, every event this process
    writes is signed by the key valid at its time; unset, events are written unsigned."""
    keyring: Path | None = None
    """The keyring file of published public keys ``jobledger verify`` checks
    signatures against."""


class KafkaOptions(Options):
    """The Kafka transport (``transport`` kafka)."""

    prefix: ClassVar[str] = "kafka_"

    bootstrap_servers: str = "localhost:9092"
    """Comma-separated ``host:port`` list."""
    ticks_topic: str = Field(default="jobledger.ticks", pattern=_TOPIC)
    ticks_dlq_topic: str = Field(default="jobledger.ticks.dlq", pattern=_TOPIC)
    signals_topic: str = Field(default="jobledger.signals", pattern=_TOPIC)
    signals_dlq_topic: str = Field(default="jobledger.signals.dlq", pattern=_TOPIC)
    events_topic: str = Field(default="jobledger.events", pattern=_TOPIC)
    group_id: str = Field(default="jobledger-workers", min_length=1)
    client_id: str = Field(default="jobledger", min_length=1)
    create_topics: bool = True
    """Create missing topics at start-up (brokers here run with auto-creation off)."""
    topic_partitions: int = Field(default=12, ge=1)
    """Partitions of topics jobledger creates: the most consumers that can share the work."""
    replication_factor: int = Field(default=1, ge=1)
    session_timeout_ms: int = Field(default=10_000, ge=1_000)
    """How long the group waits for a silent (dead) worker before its partitions move."""
    send_timeout_ms: int = Field(default=15_000, ge=1_000)
    """How long a publish may take before it counts as an infrastructure error."""


class OutboxOptions(Options):
    """Where the outbox sends job events besides the events topic."""

    event_routes: list[EventRoute] = Field(default_factory=list)
    """Routes of job events to your own topics as CloudEvents (``[[event_routes]]`` in
    the config file, a JSON list in the environment): :mod:`jobledger.domain.event_routes`."""


class SubscriptionOptions(Options):
    """Jobs from your own topics (``[[subscriptions]]`` in the config file, a JSON list in
    the environment): :mod:`jobledger.domain.subscription`; the Kafka workers consume them."""

    subscriptions: list[Subscription] = Field(default_factory=list)

    @field_validator("subscriptions")
    @classmethod
    def _named_once(cls, subscriptions: list[Subscription]) -> list[Subscription]:
        check_unique(subscriptions)
        check_libraries(subscriptions)
        return subscriptions


class MetricsOptions(Options):
    """Prometheus metrics."""

    prefix: ClassVar[str] = "metrics_"

    port: int | None = Field(default=None, ge=0, le=65_535)
    """Serve Prometheus metrics at ``/metrics`` on this port (0: any free one) from
    ``run``, ``worker``, ``projections run`` and ``reconcile``; unset, none are kept."""
    host: str = Field(default="127.0.0.1", min_length=1)
    """Where that server listens: loopback unless told otherwise (it asks for no credential)."""
    tenant_label: bool = False
    """Label tenant-level metrics (spend, jobs by status) by tenant; off, they are totals."""
    tenant_cap: int = Field(default=50, ge=1, le=10_000)
    """The most tenants given a label of their own; the ones seen after fold into ``other``."""


MAX_RETENTION_DAYS: Final = 36_500
"""A century: the longest retention (and ``--older-than``) a date can be counted back."""


class RetentionOptions(Options):
    """How long finished jobs stay in the store before ``jobledger archive`` takes them
    (``retention: {default_days, tenants: {t: days}, workflows: {w: days}}``): the
    workflow's days, else the tenant's, else the default; none set keeps jobs for ever."""

    prefix: ClassVar[str] = "retention_"

    default_days: int | None = Field(default=None, ge=0, le=MAX_RETENTION_DAYS)
    tenants: dict[str, int] = Field(default_factory=dict)
    workflows: dict[str, int] = Field(default_factory=dict)
    archive_to: str | None = None
    """The runner (``jobledger run``) archives the jobs past their retention here on its
    own: a directory, or ``kafka:TOPIC``; unset, only ``jobledger archive`` does."""
    interval_seconds: float = Field(default=3600.0, gt=0)
    """Seconds between the runner's archive passes."""

    @model_validator(mode="after")
    def _days_in_range(self) -> Self:
        for scope, days in (*self.tenants.items(), *self.workflows.items()):
            if not 0 <= days <= MAX_RETENTION_DAYS:
                raise ValueError(
                    f"retention of {scope!r} is {days} days: it must be 0 to {MAX_RETENTION_DAYS}"
                )
        return self

    @field_validator("archive_to")
    @classmethod
    def _parses(cls, value: str | None) -> str | None:
        if value is not None:
            ArchiveTarget.parse(value)
        return value

    @model_validator(mode="after")
    def _archive_target(self) -> Self:
        if self.archive_to is None:
            return self
        if self.default_days is None and not self.tenants and not self.workflows:
            # Nothing would ever be due: a target alone is a mistake, not a no-op.
            raise ValueError(
                "retention_archive_to needs a retention to archive by: set "
                "retention_default_days, retention_tenants or retention_workflows"
            )
        return self


class EngineConfig(BaseSettings):
    """The seed's knobs plus what an event-sourced store needs: where the store is, who
    this worker is and where ticks go, then each concern's group of settings."""

    model_config = SettingsConfigDict(env_prefix="JOBLEDGER_", extra="forbid", frozen=True)

    store_url: str = "sqlite:///jobledger.sqlite"
    """``sqlite:///relative.db``, ``sqlite:////absolute.db`` or ``postgresql://u:p@host/db``."""
    store: StoreOptions = Field(default_factory=StoreOptions)
    worker_id: str = Field(default_factory=_default_worker_id, min_length=1)
    ticks: TickOptions = Field(default_factory=TickOptions)
    leases: LeaseOptions = Field(default_factory=LeaseOptions)
    limits: LimitOptions = Field(default_factory=LimitOptions)
    batching: BatchOptions = Field(default_factory=BatchOptions)
    admission: AdmissionOptions = Field(default_factory=AdmissionOptions)
    tokens: TokenOptions = Field(default_factory=TokenOptions)
    notifications: NotifierOptions = Field(default_factory=NotifierOptions)
    otel: OtelOptions = Field(default_factory=OtelOptions)
    signing: SigningOptions = Field(default_factory=SigningOptions)
    transport: Literal["local", "kafka"] = "local"
    """Where ticks go: ``local`` (the in-process queue) or ``kafka`` (the ticks topic)."""
    kafka: KafkaOptions = Field(default_factory=KafkaOptions)
    outbox: OutboxOptions = Field(default_factory=OutboxOptions)
    subscribing: SubscriptionOptions = Field(default_factory=SubscriptionOptions)
    metrics: MetricsOptions = Field(default_factory=MetricsOptions)
    retention: RetentionOptions = Field(default_factory=RetentionOptions)

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        assert isinstance(env_settings, EnvSettingsSource)
        variables = _FlatVariables(
            _VARIABLES,
            case_sensitive=env_settings.case_sensitive,
            env_prefix=env_settings.env_prefix,
            env_ignore_empty=env_settings.env_ignore_empty,
            env_parse_none_str=env_settings.env_parse_none_str,
            env_parse_enums=env_settings.env_parse_enums,
        )
        return init_settings, variables

    @model_validator(mode="wrap")
    @classmethod
    def _flat_names(cls, values: Any, handler: ValidatorFunctionWrapHandler) -> Any:
        """Flat keywords land in their groups; an error names the setting flat."""
        try:
            return handler(grouped(values) if isinstance(values, Mapping) else values)
        except ValidationError as error:
            details = [_flat_error(detail) for detail in error.errors()]
            raise ValidationError.from_exception_data(error.title, details) from None

    def model_copy(self, *, update: Mapping[str, Any] | None = None, deep: bool = False) -> Self:
        """Pydantic's copy, where ``update`` may name settings flat (``{"store_url": ...,
        "lease_ms": ...}``): each lands in its group. As pydantic's, it validates nothing."""
        changes = grouped(update or {})
        for name, value in changes.items():
            if name in GROUPS and isinstance(value, Mapping):
                changes[name] = getattr(self, name).model_copy(update=value)
        return super().model_copy(update=changes, deep=deep)

    def setting(self, name: str) -> Any:
        """The value of the setting of this flat name (``kafka_ticks_topic``)."""
        group, field = SETTINGS[name]
        return getattr(getattr(self, group), field) if group else getattr(self, field)

    def cost_ceiling_for(self, tenant_id: str) -> Decimal:
        """The tenant's spend ceiling per UTC day (its override, else the default); 0 is
        no ceiling."""
        return self.limits.tenant_cost_ceilings_usd.get(tenant_id, self.limits.cost_ceiling_usd)


GROUPS: Final[dict[str, type[Options]]] = {
    name: info.annotation
    for name, info in EngineConfig.model_fields.items()
    if isinstance(info.annotation, type) and issubclass(info.annotation, Options)
}
"""EngineConfig's groups of settings by attribute name."""

SETTINGS: Final[dict[str, tuple[str | None, str]]] = {
    flat: place
    for name in EngineConfig.model_fields
    for flat, place in (
        [(GROUPS[name].prefix + field, (name, field)) for field in GROUPS[name].model_fields]
        if name in GROUPS
        else [(name, (None, name))]
    )
}
"""Every setting's flat name (keyword, config file key, ``JOBLEDGER_`` variable), in
order, and its place: (group, field), or (None, field) for one outside any group."""


def grouped(values: Mapping[str, Any]) -> dict[str, Any]:
    """``values`` with each flat name of a grouped setting moved into its group (a dict,
    over the group's own values when the group is given too)."""
    out = dict(values)
    for flat, (group, field) in SETTINGS.items():
        if group is None or flat not in out:
            continue
        into = out.get(group, {})
        if isinstance(into, BaseModel | Mapping):
            out[group] = {**dict(into), field: out.pop(flat)}
    return out


def _flat_error(detail: Any) -> InitErrorDetails:
    loc = tuple(detail["loc"])
    if len(loc) > 1 and loc[0] in GROUPS:
        loc = (GROUPS[str(loc[0])].prefix + str(loc[1]), *loc[2:])
    error = InitErrorDetails(type=detail["type"], loc=loc, input=detail["input"])
    if "ctx" in detail:
        error["ctx"] = detail["ctx"]
    return error


class _FlatVariables(EnvSettingsSource):
    """The ``JOBLEDGER_*`` variables of the flat names, parsed as pydantic-settings parses
    a field's (JSON for a dict or a list), then moved into their groups."""

    def __call__(self) -> dict[str, Any]:
        return grouped(super().__call__())

    def prepare_field_value(
        self, field_name: str, field: FieldInfo, value: Any, value_is_complex: bool
    ) -> Any:
        """A list or table setting's value, read as JSON; one that is not JSON is named
        (pydantic-settings' own error names neither the variable nor the problem)."""
        try:
            return super().prepare_field_value(field_name, field, value, value_is_complex)
        except ValueError as error:
            variable = f"{self.env_prefix}{field_name}".upper()
            raise ConfigError(f"{variable} must be JSON (a list or a table): {error}") from None


# A settings class of flat fields alone, for _FlatVariables to read the variables by.
_FLAT_FIELDS: Final[dict[str, Any]] = {
    flat: (
        (GROUPS[group].model_fields if group else EngineConfig.model_fields)[field].annotation,
        None,
    )
    for flat, (group, field) in SETTINGS.items()
}
_VARIABLES: Final = create_model("EngineConfigVariables", __base__=BaseSettings, **_FLAT_FIELDS)
