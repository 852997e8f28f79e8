"""The ports: everything the core needs from the outside world, as typing.Protocols.

The core (job, orchestrator, engine) imports no adapter. Adapters live in
``jobledger.adapters`` and are chosen by configuration.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from decimal import Decimal
from typing import Any, Protocol
from uuid import UUID

from jobledger.domain.admission import Queued
from jobledger.domain.batch import Batch
from jobledger.domain.errors import DuplicateKeyError, VersionConflict
from jobledger.domain.job import Job
from jobledger.domain.keys import ConsumedKey
from jobledger.domain.retention import Tombstone
from jobledger.domain.schedule import Schedule
from jobledger.domain.status import JobStatus
from jobledger.domain.steps import (
    IssuedToken,
    Resolution,
    ResolveRequest,
    StepRequest,
    StepResult,
)
from jobledger.domain.substate import ApprovalGate
from jobledger.domain.views import JobView

# ---- values crossing the ports -----------------------------------------------------------


@dataclass(frozen=True)
class Tick:
    """A request to advance one job. Re-deliveries are expected and harmless."""

    tenant_id: str
    job_id: str
    reason: str = "queue"
    claim_id: str | None = None
    """Only on an in-process tick: the retry of a tick interrupted by a store error (the
    claim it held), or the tick a resume woke (the claim folded into the resume), so it
    goes on at once (a stranger's tick waits for the lease)."""
    attempt: int = 0
    """Only on that retry too: how many store errors this tick has hit, so each retry
    waits longer than the one before."""
    trace_context: Mapping[str, str] | None = field(default=None, compare=False, hash=False)
    """The W3C trace context of the span that enqueued the tick (``orchestration.tracing``):
    its tick span is that span's child. None: the job's own trace context is used."""

    @property
    def job(self) -> tuple[str, str]:
        """The job it advances: a worker's lane (one tick of a job at a time)."""
        return (self.tenant_id, self.job_id)


@dataclass(frozen=True)
class OpsEvent:
    """A structured operational event, with the seed's names and fields."""

    jobId: str
    tenantId: str
    eventType: str
    status: str
    source: str = "job_orchestrator"
    queueName: str = "jobledger.ticks"
    missionId: str | None = None
    employeeId: str | None = None
    correlationId: str | None = None
    metadata: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class ApprovalRequest:
    """What the approval notifier tells a person: decide this, by then."""

    approval_id: str
    step_number: int
    attempt: int
    action_sha256: str
    approvers: tuple[str, ...]
    expires_at: datetime | None

    @classmethod
    def of(cls, gate: ApprovalGate) -> ApprovalRequest:
        return cls(
            approval_id=gate.approval_id,
            step_number=gate.step_number,
            attempt=gate.attempt,
            action_sha256=gate.action_sha256,
            approvers=gate.approvers,
            expires_at=gate.expires_at,
        )


@dataclass(frozen=True)
class TokenClaims:
    """What a verified resume token binds it to."""

    tenant_id: str
    job_id: str
    step_number: int
    event_name: str
    workflow_version: int
    nonce: str
    expires_at: datetime


@dataclass(frozen=True)
class BlockedNote:
    """A worker could not run a job as deployed: the job is untouched, this says why.
    It applies while the job is still at ``version``; once the job moves it is stale."""

    tenant_id: str
    job_id: str
    version: int
    reason: str
    worker_id: str
    noticed_at: datetime


@dataclass(frozen=True)
class Lease:
    """A running job's claim as its worker's heartbeat keeps it: one row per job, beside
    the job's history, never in it."""

    job_uuid: UUID
    claim_id: str
    worker_id: str
    epoch: int
    """A version of the job at which this claim held it (a take-over: the version its
    ``Claimed`` will have). It orders claims, so an older one never overwrites a newer."""
    lease_until: datetime


@dataclass(frozen=True)
class OutboxMessage:
    """One job event on its way to the events topic (or, as a CloudEvent, to a routed
    ``topic``), with where it stands in its log."""

    key: bytes
    value: bytes
    headers: list[tuple[str, bytes]]
    log: str
    position: int
    topic: str | None = None
    """None: the events topic."""


@dataclass(frozen=True)
class Append:
    """One job's pending events and the keys they consume: one unit of ``append_many``."""

    job: Job
    keys: tuple[ConsumedKey, ...] = ()


Refusal = DuplicateKeyError | VersionConflict
"""Why one append of a group was not written (what ``append`` would have raised)."""


# ---- the ports ---------------------------------------------------------------------------


class JobStore(Protocol):
    """An append-only store of job events; every append is atomic and version-checked."""

    def load(self, job_uuid: UUID) -> Job | None:
        """The job at its newest version, or None. The caller owns the object."""

    def keep(self, job: Job) -> None:
        """Take back a loaded job whose every event is committed (nothing pending, no
        refused append applied to it), so the next load of it continues from this object
        instead of re-reading and copying its history. The caller must not use it after."""

    def append(self, job: Job, *keys: ConsumedKey) -> None:
        """Write the job's pending events and the keys they consume in ONE transaction.

        Raises DuplicateKeyError if a key was used before (a step's key included: it is
        the step's own record, so a step the store already holds is named as a duplicate),
        VersionConflict if the job moved on since it was loaded, StoreUnavailableError for
        an infrastructure failure (an adapter maps its driver's errors onto it): the
        caller retries.
        """

    def append_many(self, appends: Sequence[Append]) -> list[Exception | None]:
        """Write many jobs' appends together: one transaction per partition, so a group
        costs one commit. Each append stays all-or-nothing. An append the store refuses
        (its version was taken, or a key was used, by the store or by an earlier append of
        the same group: a ``Refusal``) or cannot write (its events do not seal: the error
        ``append`` would raise) is left out and the rest are written without it: the
        result holds, in order, None for each append written and the refusal or error for
        each one left out (its job's pending events are then spent, as after a refused
        ``append``). Raises
        StoreUnavailableError if a commit failed: which appends landed is then unknown
        (none of a partition's, unless only the acknowledgement was lost)."""

    def tombstone(self, job_uuid: UUID) -> Tombstone | None:
        """The tombstone of an archived job (its events gone to an archive), or None."""

    def remove_archived(self, tombstone: Tombstone, also: Callable[[Any], None] | None) -> None:
        """In ONE transaction: delete the job's events, snapshots, lease and admission rows,
        run ``also`` with the transaction's cursor (the views' rows of the job), write the
        tombstone. Raises VersionConflict if the job is no longer at the tombstone's head,
        RetentionError if a reader of the log (the views, the outbox) is behind the job."""

    def restore_archived(
        self,
        tombstone: Tombstone,
        events: Sequence[Job.Event],
        also: Callable[[Any], None] | None,
    ) -> None:
        """In ONE transaction: write the archived ``events`` back as they were stored, run
        ``also``, delete the tombstone. Raises RetentionError if there is none."""

    def reserve_key(self, key: ConsumedKey) -> None:
        """Append a key on its own, in the partition its id hashes to (for keys that must
        be unique beyond one job). Raises DuplicateKeyError if it was used before."""

    def colocated(self, first: UUID, second: UUID) -> bool:
        """Whether two ids live in the same partition (one append can cover both)."""

    def find_key(self, route: UUID, key_id: UUID) -> ConsumedKey | None:
        """The record of a consumed key, looked up in the partition of ``route``: the job
        it guards, or the key itself for a reserved key."""

    def holds(self, job_uuid: UUID, version: int, chain_hash: str) -> bool:
        """Whether the job's event at ``version`` is stored with exactly that chain hash."""
        ...

    def load_schedule(self, schedule_uuid: UUID) -> Schedule | None:
        """The schedule at its newest version, or None."""

    def append_schedule(self, schedule: Schedule) -> None:
        """Write the schedule's pending events in one transaction. Raises VersionConflict
        if it moved on since it was loaded (or, creating it, if it exists)."""

    def schedule_events(self, schedule_uuid: UUID) -> list[Schedule.Event]:
        """The schedule's events in order: its history."""

    def load_batch(self, batch_uuid: UUID) -> Batch | None:
        """The bulk action's batch at its newest version, or None."""

    def append_batch(self, batch: Batch) -> None:
        """Write the batch's pending events in one transaction. Raises VersionConflict
        if it moved on since it was loaded (or, creating it, if it exists)."""

    def events(
        self,
        job_uuid: UUID,
        *,
        after: int = 0,
        to_version: int | None = None,
        limit: int | None = None,
    ) -> list[Job.Event]:
        """The job's events in order: those after version ``after``, up to ``to_version``,
        at most ``limit`` of them (a page of a long history reads only that page)."""


class Leases(Protocol):
    """The heartbeat-renewed leases of running jobs. The ``Claimed`` event holds a claim's
    first lease; a worker still executing its step extends it here, so a live long step
    keeps its job without a history event per heartbeat."""

    def renew(self, lease: Lease) -> bool:
        """The heartbeat: write the job's row for ``lease.claim_id`` (creating it, or
        replacing the row of an older claim). False if a newer claim holds the row: a
        take-over won, and the caller no longer owns the job."""

    def take_over(self, lease: Lease, *, from_claim: str, now: datetime) -> Lease | None:
        """Take the row of a running job whose claim ``from_claim`` lapsed on the log,
        atomically, before appending the new ``Claimed``. None if taken; otherwise the
        live row in the way (the old claim's heartbeat, or another take-over)."""

    def get(self, job_uuid: UUID) -> Lease | None:
        """The job's row, live or not."""


class AdmissionGate(Protocol):
    """The admission table (:mod:`jobledger.domain.admission`): every pass is one transaction
    that one process at a time takes, so two workers never admit past a limit."""

    def enter(self, job: Queued, now: datetime) -> list[Queued]:
        """Queue ``job`` (once: a second entry is a no-op), then run a pass; the jobs it
        admitted (this one among them, perhaps), whose first ticks the caller sends."""

    def leave(self, job_uuid: str, now: datetime) -> list[Queued]:
        """The job ended (or was cancelled while queued): free its place, run a pass."""

    def park(self, job_uuid: str, now: datetime) -> list[Queued]:
        """The job waits (a timer, an event, an approval): it keeps its place under its
        limits but leaves the window; a pass runs only if it was in the window."""

    def lend(self, job_uuid: str, now: datetime) -> list[Queued]:
        """The job waits for its children: it counts toward neither its limits nor the
        window until it takes its place back (``requeue``), so its children can run."""

    def requeue(self, job_uuid: str, now: datetime) -> list[Queued]:
        """A job that lent its place queues for one again, keeping its rank, then a pass."""

    def lent(self, job_uuid: str) -> bool:
        """Whether the job has lent its place (it waits for its children, or did)."""

    def admit(self, now: datetime) -> list[Queued]:
        """A pass on its own (the reconciler's backstop)."""

    def admitted(self, job_uuid: str) -> bool | None:
        """Whether the job was admitted; None: it is not in the table."""

    def admitted_before(self, moment: datetime, limit: int) -> list[str]:
        """Admitted jobs (their uuids) admitted, or last seen alive (``seen``), before
        ``moment``, the longest unseen first."""

    def seen(self, job_uuids: list[str], now: datetime) -> None:
        """These admitted jobs were found not ended: the backstop looks at others first."""

    def why_waiting(self, job_uuid: str) -> str | None:
        """Why a queued job has not been admitted (None: it has, or is not queued)."""


class StepRates(Protocol):
    """Fleet-wide step rates (``max_steps_per_second``), one bucket per scope."""

    def reserve(self, scope: str, per_second: float, now: datetime) -> float:
        """Take the scope's next free moment for one step; the seconds until it."""


class Queue(Protocol):
    def enqueue(self, tick: Tick, *, delay_ms: int = 0, dedupe_key: str | None = None) -> None:
        """Deliver ``tick`` after ``delay_ms``. A queue that can see what is pending (the
        local one) makes a tick with the same job and dedupe key as a pending one a no-op;
        one that cannot (Kafka keeps no pending set) delivers it again, which is harmless:
        a tick is only a hint to look at the job, and claims and step keys decide."""


class Clock(Protocol):
    def now(self) -> datetime:
        """Timezone-aware UTC now."""

    def sleep(self, seconds: float) -> None: ...


class Ops(Protocol):
    def record(self, event: OpsEvent) -> None: ...


class StepExecutor(Protocol):
    def execute(self, request: StepRequest) -> StepResult | Awaitable[StepResult]:
        """Run the side effect. Raise StepError(retryable=True) for a transient failure;
        any other exception fails the step for good. An ``async def execute`` is run on
        the worker's shared event loop, many steps at once."""


class WorkflowRegistry(Protocol):
    def latest_version(self, workflow_type: str) -> int:
        """Raise UnknownWorkflowError if the type is unknown."""

    def has(self, workflow_type: str, workflow_version: int) -> bool: ...

    def known(self) -> list[tuple[str, int]]:
        """Every (type, version) it can resolve, sorted: what a worker runs, said at start."""

    def budget_defaults(self, workflow_type: str, workflow_version: int) -> dict[str, Any]:
        """The definition's budget (max_steps, max_cost_usd, deadline_seconds); a submit's
        own budget overrides it key by key."""

    def personal_data(self, workflow_type: str, workflow_version: int) -> tuple[str, ...]:
        """The dotted paths into job state whose values are personal (``domain.erasure``)."""

    def resolve(self, request: ResolveRequest) -> Resolution:
        """Pure: the same request always gives the same resolution. A throw is a bug in
        the definition and fails the job."""


class Cost(Protocol):
    def tenant_day_spend_usd(self, tenant_id: str, day_start: datetime) -> Decimal:
        """What the tenant has spent in the UTC day starting at ``day_start``."""


class ResumeTokens(Protocol):
    def issue(
        self,
        job: JobView,
        *,
        step_number: int,
        event_name: str,
        now: datetime,
        lasts_until: datetime | None = None,
    ) -> IssuedToken:
        """A token for the wait; it expires after its time to live, and never before
        ``lasts_until`` (when the wait it belongs to ends)."""

    def verify(self, token: str, *, now: datetime) -> TokenClaims:
        """Check signature, key id, issuer, audience and expiry; raise a TokenError
        subclass saying which failed."""


class BlockedNotes(Protocol):
    def note_blocked(self, note: BlockedNote) -> None:
        """Keep why a job could not run here, for ``show`` and ``list``; the newest
        note of a job replaces the one before."""


class DueJob(Protocol):
    """A row of the status view, as much of it as the reconciler reads."""

    @property
    def tenant_id(self) -> str: ...
    @property
    def job_id(self) -> str: ...
    @property
    def job_uuid(self) -> str: ...
    @property
    def status(self) -> str: ...
    @property
    def version(self) -> int: ...


@dataclass(frozen=True)
class DueFilter:
    """What counts as due when a worker takes work: jobs in a ``timed`` status whose due
    moment is by ``now``, and jobs in an ``idle`` status (queued, a join) that have not
    moved since ``idle_before`` (their tick may be lost, or be another process's)."""

    now: datetime
    idle_before: datetime
    timed: Sequence[JobStatus]
    idle: Sequence[JobStatus]


class DueJobs(Protocol):
    def due(self, job_status: JobStatus, before: datetime, limit: int) -> Sequence[DueJob]:
        """Jobs in ``job_status`` whose due moment (timer, wait timeout, lease expiry,
        last change for queued jobs) is at or before ``before``."""

    def take_due(self, due: DueFilter, limit: int, hold_until: datetime) -> Sequence[DueJob]:
        """At most ``limit`` jobs that ``due`` finds, marked taken by the caller until they
        move on or ``hold_until`` passes: each due job is taken by one caller only,
        however many processes ask at once."""


class ScheduleFirer(Protocol):
    def fire_due(self, now: datetime, limit: int) -> int:
        """Fire the schedules due by ``now`` (at most ``limit`` of them); how many jobs
        were fired."""


class Lock(Protocol):
    """Mutual exclusion across processes, released by the OS or database if the holder
    dies, so a waiting instance takes over."""

    def try_acquire(self) -> bool:
        """True if this instance holds the lock now (re-entrant, never blocks)."""

    def release(self) -> None: ...


class EventPublisher(Protocol):
    def publish(self, messages: Sequence[OutboxMessage]) -> None:
        """Send every message (in order per key) and return only once all of them were
        acknowledged; raise if any was not."""


class Notifier(Protocol):
    """Tells the outside world that a job now waits for it."""

    def waiting_for_event(self, job: JobView, event_name: str, token: IssuedToken) -> None: ...

    def approval_requested(self, job: JobView, request: ApprovalRequest) -> None: ...


# ---- the evidence a store writes with each event (issue 16) -----------------------------


class EventSigner(Protocol):
    def sign(self, chain_hash: str, at: datetime) -> tuple[str, str]:
        """(key id, signature): Ed25519 by the key valid at ``at``, base64url no padding."""


class KeyringCheck(Protocol):
    def check(
        self, signer: str | None, signature: str | None, chain_hash: str, at: datetime
    ) -> str | None:
        """None when the signature is valid by a key known and valid at ``at``; else why not."""


class FieldSealer(Protocol):
    def seal(self, job: Job, event_type: str, fields: dict[str, Any]) -> dict[str, Any]:
        """The event's fields with the job's personal values replaced by sealed values."""

    def open(self, fields: dict[str, Any]) -> dict[str, Any]:
        """Sealed values replaced by their plaintext, or by ERASED where the key is gone."""
