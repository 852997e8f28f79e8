"""The public facade and composition root: ``from jobledger import Engine``.

The core (job, orchestrator, registry) talks to ports only; this module is where
configuration picks the adapters and plugs them in.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any
from uuid import uuid4

from jobledger import chain
from jobledger.adapters.clock import SystemClock
from jobledger.adapters.event_store import EventSourcedJobStore
from jobledger.adapters.jwt_tokens import JwtResumeTokens
from jobledger.adapters.local_queue import LocalQueue
from jobledger.adapters.log_spend import LogSpend
from jobledger.adapters.ops import LoggingOps
from jobledger.adapters.store_url import parse_store_url
from jobledger.config import EngineConfig
from jobledger.errors import (
    ConfigError,
    DuplicateKeyError,
    InvalidPayloadError,
    JobConflictError,
    JobLedgerError,
    StoreUnavailableError,
    UnknownJobError,
    UnknownWorkflowError,
    VersionConflict,
)
from jobledger.identity import job_uuid, key_uuid
from jobledger.job import Job
from jobledger.keys import ConsumedKey, KeyKind
from jobledger.orchestrator import Orchestrator, TickReport
from jobledger.payloads import json_object
from jobledger.ports import (
    Clock,
    Cost,
    JobStore,
    Notifier,
    Ops,
    OpsEvent,
    Queue,
    ResumeTokens,
    StepExecutor,
    StepRequest,
    StepResult,
    Tick,
    WorkflowRegistry,
)
from jobledger.views import HistoryEntry, JobView

log = logging.getLogger(__name__)

MAX_ID_LENGTH = 200


class NoExecutor:
    """The default executor: a workflow that needs one must be given one."""

    def execute(self, request: StepRequest) -> StepResult:
        raise ConfigError(f"step type {request.step_type!r} needs a step executor; none given")


class Engine:
    def __init__(
        self,
        *,
        store: JobStore,
        queue: Queue,
        clock: Clock,
        ops: Ops,
        registry: WorkflowRegistry,
        executor: StepExecutor,
        config: EngineConfig,
        cost: Cost | None = None,
        tokens: ResumeTokens | None = None,
        notifier: Notifier | None = None,
    ) -> None:
        self.store = store
        self.queue = queue
        self.clock = clock
        self.ops = ops
        self.registry = registry
        self.config = config
        self.orchestrator = Orchestrator(
            store=store,
            queue=queue,
            clock=clock,
            ops=ops,
            registry=registry,
            executor=executor,
            config=config,
            cost=cost,
            tokens=tokens,
            notifier=notifier,
        )

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
    ) -> Engine:
        """Open (creating if needed) the store at ``store_url`` and wire the defaults:
        a local in-process queue, the system clock, JSON ops logs, spend folded from the
        log, and JWT resume tokens when a token secret is configured."""
        config = config or EngineConfig()
        if store_url is not None:
            config = config.model_copy(update={"store_url": store_url})
        clock = clock or SystemClock()
        store = EventSourcedJobStore(
            parse_store_url(config.store_url),
            partitions=config.partitions,
            cache_size=config.cache_size,
            snapshot_interval=config.snapshot_interval,
        )
        if tokens is None and config.token_secret is not None:
            tokens = JwtResumeTokens(
                secret=config.token_secret.get_secret_value(),
                key_id=config.token_key_id,
                ttl_seconds=config.token_ttl_seconds,
                issuer=config.token_issuer,
                audience=config.token_audience,
            )
        return cls(
            store=store,
            queue=queue or LocalQueue(clock),
            clock=clock,
            ops=ops or LoggingOps(),
            registry=registry,
            executor=executor or NoExecutor(),
            config=config,
            cost=cost or LogSpend(store),
            tokens=tokens,
            notifier=notifier,
        )

    # ---- submitting ------------------------------------------------------------------

    def submit(
        self,
        tenant_id: str,
        job_id: str | None,
        workflow_type: str,
        *,
        workflow_version: int | None = None,
        input: Mapping[str, Any] | None = None,
        budget: Mapping[str, Any] | None = None,
        idempotency_key: str | None = None,
        mission_id: str | None = None,
        employee_id: str | None = None,
        correlation_id: str | None = None,
    ) -> JobView:
        """Create a job and enqueue its first tick. Submitting the same job again, or
        with an idempotency key already used, returns the existing job unchanged."""
        _check_id("tenant_id", tenant_id)
        job_id = job_id if job_id is not None else uuid4().hex
        _check_id("job_id", job_id)
        if idempotency_key is not None:
            _check_id("idempotency_key", idempotency_key)
            existing = self._job_for_submit_key(tenant_id, job_id, idempotency_key)
            if existing is not None:
                return JobView.of(existing)
        version = self._workflow_version(workflow_type, workflow_version)
        limit = self.config.max_payload_bytes
        job = Job.submit(
            tenant_id=tenant_id,
            job_id=job_id,
            workflow_type=workflow_type,
            workflow_version=version,
            state=json_object(input, what="job input", max_bytes=limit),
            budget=json_object(budget, what="job budget", max_bytes=limit),
            mission_id=mission_id,
            employee_id=employee_id,
            correlation_id=correlation_id,
            submit_key=idempotency_key,
            timestamp=self.clock.now(),
        )
        stored = self._create(job, idempotency_key)
        if stored is job:
            self._report(job, "job.submitted", workflowType=workflow_type, workflowVersion=version)
            self.queue.enqueue(Tick(tenant_id, job_id, "create"), dedupe_key="create")
        return JobView.of(stored)

    def _workflow_version(self, workflow_type: str, version: int | None) -> int:
        if version is None:
            return self.registry.latest_version(workflow_type)
        if not self.registry.has(workflow_type, version):
            raise UnknownWorkflowError(f"unknown workflow {workflow_type!r} v{version}")
        return version

    def _job_for_submit_key(self, tenant_id: str, job_id: str, key: str) -> Job | None:
        marker = self.store.find_key(
            job_uuid(tenant_id, job_id), key_uuid(tenant_id, KeyKind.SUBMIT, key)
        )
        if marker is None:
            return None
        return self.store.load(marker.job_uuid)

    def _create(self, job: Job, idempotency_key: str | None) -> Job:
        """Append Submitted (and its key); a job or key that already exists is returned
        when it is the same request, refused when it is a different one."""
        keys = []
        if idempotency_key is not None:
            keys.append(
                ConsumedKey.consume(
                    kind=KeyKind.SUBMIT,
                    key=idempotency_key,
                    tenant_id=job.tenant_id,
                    job_id=job.job_id,
                    job_uuid=job.id,
                    timestamp=job.created_on,
                )
            )
        try:
            self.store.append(job, *keys)
            return job
        except DuplicateKeyError:
            assert idempotency_key is not None
            existing = self._job_for_submit_key(job.tenant_id, job.job_id, idempotency_key)
        except VersionConflict:
            existing = self.store.load(job.id)
        assert existing is not None
        submitted = self.store.events(existing.id, to_version=1)[0]
        assert isinstance(submitted, Job.Submitted)
        _check_same_request(submitted, job)
        return existing

    # ---- running ---------------------------------------------------------------------

    def tick(self, tenant_id: str, job_id: str, reason: str = "queue") -> TickReport:
        return self.orchestrator.tick(Tick(tenant_id, job_id, reason))

    def run_until_idle(self, *, wait_for_timers: bool = False, max_ticks: int = 100_000) -> int:
        """Handle the local queue's ticks until none is due (or, with ``wait_for_timers``,
        until none is pending at all, sleeping on the engine's clock until each is due).
        Returns how many ticks were handled."""
        if not isinstance(self.queue, LocalQueue):
            raise ConfigError("run_until_idle drives the local queue; this engine has another")
        handled = 0
        while handled < max_ticks:
            tick = self.queue.pop_due()
            if tick is None:
                due = self.queue.next_due()
                if due is None or not wait_for_timers:
                    return handled
                self.clock.sleep((due - self.clock.now()).total_seconds())
                continue
            self.handle(tick)
            handled += 1
        return handled

    def handle(self, tick: Tick) -> TickReport | None:
        """What a queue consumer does with one tick: bad ticks are reported and dropped;
        an infrastructure error is re-enqueued with a delay, never turned into a failure."""
        try:
            return self.orchestrator.tick(tick)
        except StoreUnavailableError as error:
            log.warning(
                "tick for %s/%s hit a store error, retrying: %s", tick.tenant_id, tick.job_id, error
            )
            self.queue.enqueue(tick, delay_ms=1_000, dedupe_key="infra-retry")
        except JobLedgerError as error:
            self.ops.record(
                OpsEvent(
                    jobId=tick.job_id,
                    tenantId=tick.tenant_id,
                    eventType="job.tick.rejected",
                    status="unknown",
                    metadata={"error": str(error), "reason": tick.reason},
                )
            )
        return None

    # ---- reading ---------------------------------------------------------------------

    def job(self, tenant_id: str, job_id: str) -> JobView:
        return JobView.of(self._load(tenant_id, job_id))

    def history(self, tenant_id: str, job_id: str) -> list[HistoryEntry]:
        events = self.store.events(self._load(tenant_id, job_id).id)
        return [HistoryEntry.of(event) for event in events]

    def verify(self, tenant_id: str, job_id: str) -> chain.BrokenLink | None:
        """Recompute the job's chain hashes; the first broken link, or None if intact."""
        return chain.verify(self.store.events(job_uuid(tenant_id, job_id)))

    def _load(self, tenant_id: str, job_id: str) -> Job:
        job = self.store.load(job_uuid(tenant_id, job_id))
        if job is None:
            raise UnknownJobError(tenant_id, job_id)
        return job

    def _report(self, job: Job, event_type: str, **metadata: Any) -> None:
        self.orchestrator.report(job, event_type, **metadata)

    def close(self) -> None:
        close = getattr(self.store, "close", None)
        if close is not None:
            close()

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()


def _check_id(name: str, value: object) -> None:
    if not isinstance(value, str) or not value or len(value) > MAX_ID_LENGTH:
        raise InvalidPayloadError(
            f"{name} must be a non-empty string of at most "
            f"{MAX_ID_LENGTH} characters, got {value!r}"
        )
    if any(ord(c) < 32 for c in value):
        raise InvalidPayloadError(f"{name} must not contain control characters: {value!r}")


def _check_same_request(existing: Job.Submitted, requested: Job) -> None:
    """A repeated submit must ask for what the job was submitted with, not what it is now."""
    wanted = (requested.workflow_type, requested.workflow_version, requested.state)
    found = (existing.workflow_type, existing.workflow_version, existing.state)
    if wanted != found:
        raise JobConflictError(
            f"job {existing.job_id!r} of tenant {existing.tenant_id!r} already exists as "
            f"{existing.workflow_type!r} v{existing.workflow_version} with other input; "
            f"this submit asks for {requested.workflow_type!r} v{requested.workflow_version}"
        )
