"""A step as workflows and executors see it: what the engine asks a workflow
(``ResolveRequest``), what the workflow decides (``Resolution``, its ``ApprovalSpec`` and
``RetryPolicy``), what an executor is handed (``StepRequest``) and returns
(``StepResult``), and the resume token a wait issues."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from decimal import Decimal
from typing import Any
from uuid import UUID

from jobledger.domain.fan_out import MapRequest
from jobledger.domain.status import JobStatus
from jobledger.domain.views import JobView

SIDE_EFFECT_STEP_TYPES = frozenset({"run_interaction_task"})
COSTLY_STEP_TYPES = frozenset({"run_interaction_task"})


@dataclass(frozen=True)
class RetryPolicy:
    max_attempts: int = 3
    initial_backoff_ms: int = 1_000
    multiplier: float = 2.0
    max_backoff_ms: int = 300_000
    retry_on: frozenset[str] = frozenset()
    """Error kinds that retry; empty means every error marked retryable."""

    def backoff_ms(self, attempt: int) -> int:
        """Delay before retry number ``attempt`` (1-based)."""
        delay = self.initial_backoff_ms * self.multiplier ** (attempt - 1)
        return int(min(delay, self.max_backoff_ms))

    def allows(self, attempt: int, kind: str) -> bool:
        return attempt <= self.max_attempts and (not self.retry_on or kind in self.retry_on)


HistoryReader = Callable[[int], Sequence[Any]]
"""The job's events after the version given, in order, up to the request's version."""


@dataclass(frozen=True)
class ResolveRequest:
    workflow_type: str
    workflow_version: int
    budget: Mapping[str, Any]
    state: Mapping[str, Any]
    current_step: int
    """How many steps the job has recorded; the next one is current_step + 1."""
    status: JobStatus
    reason: str
    now: datetime
    cursor: str | None = None
    """The name of the definition step to run next; None before the first step."""
    visits: Mapping[str, int] = field(default_factory=dict)
    """How many times each named step has been recorded (bounds cycles)."""
    # How a registry may read the job, not what it decides on: two requests that ask for
    # the same decision are equal whatever they carry here (an audit replay's rebuilt
    # request equals the tick's).
    job_uuid: UUID | None = field(default=None, compare=False)
    """The job, for a registry that keeps a job's replay between its steps (a code
    workflow's suspended body); None when the request is rebuilt (an audit replay)."""
    version: int = field(default=0, compare=False)
    """The job's version the request was made at."""
    history: HistoryReader | None = field(default=None, compare=False)
    """The job's recorded events after a version, up to ``version``: what a code workflow
    replays its body against. None: the registry does not need them (declarative)."""


@dataclass(frozen=True)
class ApprovalSpec:
    """A human gate: who may decide, for how long, and where each decision leads."""

    approvers: tuple[str, ...] = ()
    """Who may decide; empty means any caller the deployment trusts."""
    expires_ms: int | None = None
    on_approve: str | None = None
    on_reject: str | None = None
    """None fails the job on rejection."""
    on_expire: str | None = None
    """None fails the job when the request expires."""
    quorum: int | None = None
    """How many of ``approvers`` must approve; None: one decision decides."""

    def __post_init__(self) -> None:
        # A quorum the named approvers cannot reach would reject on the first vote.
        if self.quorum is not None and not 1 <= self.quorum <= len(self.approvers):
            raise ValueError(
                f"an approval quorum of {self.quorum} needs 1 to {len(self.approvers)} "
                "(the approvers named)"
            )


@dataclass(frozen=True)
class Resolution:
    """What the workflow decides for the next step: the seed's Resolution fields."""

    step_type: str
    next_status: JobStatus
    triggered_by: str = "workflow"
    transition_reason: str = ""
    resume_delay_ms: int | None = None
    wait_event_name: str | None = None
    state_patch: dict[str, Any] = field(default_factory=dict)
    output: dict[str, Any] = field(default_factory=dict)
    retry_policy: RetryPolicy | None = None
    params: dict[str, Any] = field(default_factory=dict)
    """Inputs for the executor (a prompt, a tool name, ...)."""
    step_name: str | None = None
    """The definition step this resolution runs (None for unnamed workflows)."""
    next_step: str | None = None
    """Where the job goes after this step (after its wait, if it opens one)."""
    resume_at: datetime | None = None
    """An absolute time for a waiting_time step; wins over resume_delay_ms."""
    wait_timeout_ms: int | None = None
    """How long a waiting_event step waits before ``on_timeout``."""
    on_timeout: str | None = None
    """The step after a wait timeout; None fails the job."""
    approval: ApprovalSpec | None = None
    children: MapRequest | None = None
    """The children a map step spawns and the join it waits on."""

    @property
    def has_side_effect(self) -> bool:
        return self.step_type in SIDE_EFFECT_STEP_TYPES

    @property
    def is_costly(self) -> bool:
        return self.step_type in COSTLY_STEP_TYPES


@dataclass(frozen=True)
class StepRequest:
    job: JobView
    step_number: int
    step_type: str
    triggered_by: str
    idempotency_key: str
    """Stable for this step across every re-delivery: pass it to external systems."""
    resolution: Resolution
    heartbeat: Callable[[], bool] | None = field(default=None, compare=False)
    """Renew this step's lease now; False once another worker took the job over (this
    step's result will not be recorded): a long step should stop. None: no lease port."""
    span: Any = field(default=None, compare=False)
    """The step's span (``orchestration.tracing.Span``): attributes and events set on it
    land in the step's trace. None outside a tick."""


@dataclass(frozen=True)
class StepResult:
    output: dict[str, Any] = field(default_factory=dict)
    state_patch: dict[str, Any] = field(default_factory=dict)
    cost_usd: Decimal | float | int | str = 0


@dataclass(frozen=True)
class IssuedToken:
    token: str
    nonce: str
    token_sha256: str
    expires_at: datetime
