"""Engine configuration: one pydantic settings model, read from ``JOBLEDGER_*`` variables."""

from __future__ import annotations

import os
import socket
from decimal import Decimal
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict

# Kafka's legal topic names.
_TOPIC = r"^[A-Za-z0-9._-]{1,249}$"


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


class EngineConfig(BaseSettings):
    """The seed's knobs plus what an event-sourced store needs."""

    model_config = SettingsConfigDict(env_prefix="JOBLEDGER_", extra="forbid", frozen=True)

    store_url: str = "sqlite:///jobledger.sqlite"
    """``sqlite:///relative.db``, ``sqlite:////absolute.db`` or ``postgresql://u:p@host/db``."""
    partitions: int = Field(default=1, ge=1, le=64)
    """Event tables; a job lives in partition hash(job id) % partitions. Fixed per store."""
    worker_id: str = Field(default_factory=_default_worker_id, min_length=1)

    max_steps_per_tick: int = Field(default=10, ge=1)
    inline_resume_max_delay_ms: int = Field(default=1_000, ge=0)
    default_wait_ms: int = Field(default=60_000, ge=0)
    cost_ceiling_usd: Decimal = Field(default=Decimal(0), ge=0)
    """Per tenant per UTC day; 0 disables the ceiling."""
    tenant_cost_ceilings_usd: dict[str, Decimal] = Field(default_factory=dict)
    """Overrides of the ceiling by tenant id (JSON in the environment variable)."""
    resume_mode: Literal["queue", "scan_only"] = "queue"
    """``scan_only`` leaves every timer to the reconciler instead of enqueueing it."""
    lease_ms: int = Field(default=15_000, ge=1)
    """How long a claim protects a running step without a heartbeat. While the step runs,
    its worker renews the lease every lease_ms / 3, so a live step keeps its job however
    long it takes, and a dead worker's job is taken over about one lease after it died."""
    max_payload_bytes: int = Field(default=256 * 1024, ge=1)

    concurrency: int = Field(default=16, ge=1, le=1024)
    """Ticks one worker runs at once (threads; an ``async def execute`` runs on one shared
    event loop). Their step appends are committed together (group commit)."""
    max_batch: int = Field(default=64, ge=1)
    """The most step appends one group commit writes."""
    max_batch_wait_ms: float = Field(default=2.0, ge=0)
    """How long the first append of a group waits for the other ticks in flight; a tick
    running alone never waits."""

    admission_window: int = Field(default=0, ge=0)
    """Jobs started (admitted) and not yet ended or waiting, fleet-wide; queued jobs
    beyond it are admitted round-robin across tenants as these end. 0: no window (the
    gate then holds only jobs a ``max_running`` limit applies to; other jobs start at
    submit, with no write of the gate's)."""
    priority_aging_seconds: float = Field(default=60.0, gt=0)
    """A queued job gains one priority level per this many seconds it waits."""
    concurrency_limits: list[ConcurrencyLimit] = Field(default_factory=list)
    """Per tenant and per tenant and workflow type (JSON list in the environment)."""

    cache_size: int = Field(default=10_000, ge=0)
    snapshot_interval: int = Field(default=100, ge=0)
    """Snapshot a job every N events so a cold load never replays a long history."""

    token_secret: SecretStr | None = Field(default=None, min_length=32)
    """HS256 key for resume tokens (>= 32 bytes, RFC 7518 3.2); needed to wait for events."""
    token_key_id: str = "k1"
    token_previous_keys: dict[str, SecretStr] = Field(default_factory=dict)
    """Retired keys by key id, still accepted when verifying tokens issued under them."""
    token_ttl_seconds: int = Field(default=86_400, ge=1)
    token_issuer: str = "jobledger"
    token_audience: str = "jobledger.resume"

    erasure_master_key: SecretStr | None = None
    """Wraps the data subjects' keys in the store (base64url of 32 bytes): a copy of the
    database alone then opens no personal value. Unset: the keys are stored unwrapped."""

    notifier: str | None = None
    """Where the tokens and approval requests jobs hand out go: ``stdout``, ``file:PATH``
    (JSON lines), ``webhook:URL`` (a JSON POST) or ``package.module:Class``."""
    notifier_secret: SecretStr | None = None
    """Signs each webhook POST: ``X-Jobledger-Signature: sha256=<HMAC of the body>``."""

    otel_exporter: Literal["none", "console", "otlp"] = "none"
    """Where spans go (the otel extra): ``otlp`` (to ``OTEL_EXPORTER_OTLP_ENDPOINT``, the
    OpenTelemetry SDK's own settings), ``console`` (stdout, for development) or nowhere."""
    otel_service_name: str = Field(default="jobledger", min_length=1)
    """The ``service.name`` of the spans this process exports."""

    signing_keys: Path | None = None
    """The signing-keys file (``jobledger.adapters.signing``): set, every event this process
    writes is signed by the key valid at its time; unset, events are written unsigned."""
    keyring: Path | None = None
    """The keyring file of published public keys ``jobledger verify`` checks
    signatures against."""

    transport: Literal["local", "kafka"] = "local"
    """Where ticks go: ``local`` (the in-process queue) or ``kafka`` (the ticks topic)."""
    kafka_bootstrap_servers: str = "localhost:9092"
    """Comma-separated ``host:port`` list."""
    kafka_ticks_topic: str = Field(default="jobledger.ticks", pattern=_TOPIC)
    kafka_ticks_dlq_topic: str = Field(default="jobledger.ticks.dlq", pattern=_TOPIC)
    kafka_signals_topic: str = Field(default="jobledger.signals", pattern=_TOPIC)
    kafka_signals_dlq_topic: str = Field(default="jobledger.signals.dlq", pattern=_TOPIC)
    kafka_events_topic: str = Field(default="jobledger.events", pattern=_TOPIC)
    kafka_group_id: str = Field(default="jobledger-workers", min_length=1)
    kafka_client_id: str = Field(default="jobledger", min_length=1)
    kafka_create_topics: bool = True
    """Create missing topics at start-up (brokers here run with auto-creation off)."""
    kafka_topic_partitions: int = Field(default=12, ge=1)
    """Partitions of topics jobledger creates: the most consumers that can share the work."""
    kafka_replication_factor: int = Field(default=1, ge=1)
    kafka_session_timeout_ms: int = Field(default=10_000, ge=1_000)
    """How long the group waits for a silent (dead) worker before its partitions move."""
    kafka_send_timeout_ms: int = Field(default=15_000, ge=1_000)
    """How long a publish may take before it counts as an infrastructure error."""

    metrics_port: int | None = Field(default=None, ge=0, le=65_535)
    """Serve Prometheus metrics at ``/metrics`` on this port (0: any free one) from
    ``run``, ``worker``, ``projections run`` and ``reconcile``; unset, none are kept."""
    metrics_host: str = Field(default="127.0.0.1", min_length=1)
    """Where that server listens: loopback unless told otherwise (it asks for no credential)."""
    metrics_tenant_label: bool = False
    """Label tenant-level metrics (spend, jobs by status) by tenant; off, they are totals."""
    metrics_tenant_cap: int = Field(default=50, ge=1, le=10_000)
    """The most tenants given a label of their own; the ones seen after fold into ``other``."""

    def cost_ceiling_for(self, tenant_id: str) -> Decimal:
        """The tenant's spend ceiling per UTC day (its override, else the default); 0 is
        no ceiling."""
        return self.tenant_cost_ceilings_usd.get(tenant_id, self.cost_ceiling_usd)
