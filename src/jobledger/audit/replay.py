"""Replaying a job's recorded decisions against a definition, without any side effect.

For each recorded step the job's events are folded up to just before it, the
:class:`ResolveRequest` the engine resolved at that point is rebuilt, the PURE resolution
of the given definition is run on it, and what it decides is compared with what was
recorded. Nothing is executed and nothing is written: the executor, the store, the
clock, tokens and notifiers are never touched.

How the request is rebuilt (the engine does not record it as such):

- ``state``, ``cursor``, ``visits``, ``current_step``, ``budget``, ``workflow_type``: the
  fold of every event before the step (outside events such as a resume payload or an
  approval's route included);
- ``workflow_version``: the version being replayed against, not the recorded one;
- ``status``: the job's status when the step was resolved. A side-effecting step is
  resolved BEFORE its claim, so when the event right before the step is a claim taken for
  it (any claim but a ``continuation``) the claim's ``previous_status`` is used; after a
  continuation claim the job was ``running``, as it is in the fold. Inputs that landed
  while the step ran sit between its claim and its record (they commute with it, see
  ``Orchestrator._commit_step``); the step was resolved before them, so the ``budget`` is
  the one the claim found;
- ``now``: the step's ``started_at`` (the engine resolves moments before it starts a
  step; the recorded start is the closest moment the history holds);
- ``reason``: the reason of the tick that ran the step when its claim records it (the
  claim's ``reason``, followed back through continuation claims of the same claim id);
  otherwise it is not recorded and ``"replay"`` is used. Definitions do not read it.

A failure recorded as a resolution error (``Failed`` with cause ``definition``) is
replayed too: resolving without an error there is a divergence. Records a repair
superseded (steps after a ``Reset``'s step, a failure a ``Retried`` reopened) are folded
but not compared (``jobledger.domain.repair.superseded``).

What is compared cannot drift from what the engine does: the replayed decision comes from
``jobledger.domain.transition.decide``, the function the tick records every step with, and it is
compared on everything that reaches the executor or decides the next transition: the
step's kind and name, the next status and step, the wait or gate it opens, and
``input_sha256`` (the params, retry policy and the step's own output and state patch; steps
recorded before the engine kept that hash are compared on the rest).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from functools import partial
from typing import Any, Final, TypeVar
from uuid import UUID

from jobledger.audit.errors import ReplayError
from jobledger.config import TickOptions
from jobledger.domain import erasure, transition
from jobledger.domain.approval_answers import with_edit
from jobledger.domain.job import Claim, Job
from jobledger.domain.repair import superseded
from jobledger.domain.status import JobStatus
from jobledger.domain.steps import HistoryReader, Resolution, ResolveRequest
from jobledger.domain.substate import EventWait
from jobledger.workflows.definition import WorkflowDefinition
from jobledger.workflows.resolver import resolve

Resolver = Callable[[ResolveRequest], Resolution]

UNKNOWN_REASON: Final = "replay"
"""The tick reason used when the history does not record it."""
DEFAULT_WAIT_MS: Final[int] = TickOptions.model_fields["default_wait_ms"].default
"""A waiting_time step without a delay of its own waits this long (the engine's default)."""
SAFE: Final = "safe to migrate"
FINISHED: Final = "nothing to migrate"
"""A finished job agrees with the definition but is never migrated (migrate refuses it)."""
SAME: Final = "same"
OUTCOMES: Final = {
    "status": "different status",
    "next_step": "different next step",
    "wait": "different wait",
    "step": "different step",
    "input": "different input",
}
"""Each kind of difference, in the order a step's outcome names the first one found."""


@dataclass(frozen=True)
class Decision:
    """What a step decided, in the terms a migration cares about."""

    step_type: str
    step_name: str | None
    next_status: JobStatus
    next_step: str | None
    wait: Mapping[str, Any] | None = None
    """The wait it opened (all values strings or lists, for JSON): ``resume_at`` for a
    timer; ``event``, ``timeout_at``, ``on_timeout`` for an event; ``approvers``,
    ``expires_at``, ``on_approve``, ``on_reject``, ``on_expire`` for an approval."""
    error: str | None = None
    """Resolution raised: the engine fails the job ("workflow resolution failed")."""
    input_sha256: str | None = None
    """What the definition handed the step (params, retry policy, its own output and
    state patch), hashed; None for a step recorded before the engine kept it."""

    def describe(self) -> str:
        if self.error is not None:
            return f"fail the job (resolution failed: {self.error})"
        name, kind = self.step_name, self.step_type
        text = f"{name!r} ({kind})" if name and name != kind else kind
        text += f" -> {self.next_status}"
        wait = self.wait or {}
        if wait.get("event"):
            text += f" for event {wait['event']!r}"
        if wait.get("approvers"):
            text += f" by {', '.join(wait['approvers'])}"
        for key, label in (
            ("resume_at", "until"),
            ("timeout_at", "timeout"),
            ("expires_at", "expires"),
        ):
            if wait.get(key):
                text += f" {label} {wait[key]}"
        for key in ("on_timeout", "on_approve", "on_reject", "on_expire"):
            if wait.get(key) and not (key == "on_approve" and wait[key] == self.next_step):
                text += f", {key} {wait[key]!r}"
        if self.next_step:
            text += f", next {self.next_step!r}"
        return text


@dataclass(frozen=True)
class StepReplay:
    """One recorded decision next to what the definition decides now."""

    step_number: int
    event_version: int
    recorded: Decision
    replayed: Decision
    differences: tuple[str, ...]
    """Which of ``status``, ``next_step``, ``wait``, ``step`` differ (empty: the same)."""

    @property
    def same(self) -> bool:
        return not self.differences

    @property
    def outcome(self) -> str:
        """``same``, or the first difference: ``different status``, ``different next
        step``, ``different wait`` or ``different step``."""
        return OUTCOMES[self.differences[0]] if self.differences else SAME


@dataclass(frozen=True)
class ReplayReport:
    job_uuid: UUID
    tenant_id: str
    job_id: str
    workflow_type: str
    recorded_version: int
    """The definition version the job is on (after any migration)."""
    definition_version: int
    """The version replayed against."""
    status: str
    events: int
    steps: tuple[StepReplay, ...] = field(default_factory=tuple)
    unreadable: tuple[str, ...] = ()
    """The personal values replay could not read (erased: ``v3 output.customer.email``);
    a step that decided on one of them may replay differently."""

    @property
    def safe(self) -> bool:
        """Every recorded step replays the same."""
        return all(step.same for step in self.steps)

    @property
    def finished(self) -> bool:
        return JobStatus(self.status).is_terminal

    @property
    def migratable(self) -> bool:
        """Safe, and not finished: ``migrate`` moves only jobs that are still going."""
        return self.safe and not self.finished

    @property
    def diverged_at(self) -> StepReplay | None:
        return next((step for step in self.steps if not step.same), None)

    @property
    def verdict(self) -> str:
        """``safe to migrate``, or ``diverges at step k: recorded X, would now do Y``."""
        first = self.diverged_at
        if first is None:
            return SAFE if not self.finished else f"{self.status}: replays the same; {FINISHED}"
        verdict = (
            f"diverges at step {first.step_number}: recorded {first.recorded.describe()}, "
            f"would now do {first.replayed.describe()}"
        )
        if "input" in first.differences:
            verdict += " with other input (params, retry policy, or the step's own output)"
        return verdict


def replay_job(
    events: Sequence[Job.Event],
    definition: WorkflowDefinition | Resolver,
    *,
    version: int | None = None,
    default_wait_ms: int = DEFAULT_WAIT_MS,
    step_inputs: bool = True,
) -> ReplayReport:
    """Replay a job's history (its events, in order) against a definition, or against
    any pure resolver with the ``version`` it stands for. One pass over the events; each
    request carries the history before its step (a code workflow's body replays against
    it). ``step_inputs`` False compares a step's input only where it opened a wait, as
    the engine checks a code workflow: a step's arguments are computed by code that may
    change (the body gets the recorded result back), what a wait waits for may not."""
    resolver, target = _resolver(definition, version)
    replays: list[StepReplay] = []
    job: Job | None = None
    claim: _Claim | None = None
    tick_reasons: dict[str, str] = {}
    unreadable: list[str] = []
    # A step a reset superseded, or a failure a retry reopened, was decided again since.
    skipped = superseded(events)
    for index, event in enumerate(events):
        if job is None and not isinstance(event, Job.Submitted):
            raise ReplayError(f"the history starts with {type(event).__name__}, not Submitted")
        if isinstance(definition, WorkflowDefinition) and isinstance(event, Job.Submitted):
            _check_type(event.workflow_type, definition)
        if index in skipped:
            pass
        elif job is not None and isinstance(event, Job.StepRecorded):
            before = _history(events, index)
            request = _request(job, claim, tick_reasons, target, event.started_at, before)
            recorded = _recorded(
                event,
                _after_step(Job.ApprovalRequested, events, index, event.step_number),
                _after_step(Job.ChildrenSpawned, events, index, event.step_number),
            )
            replayed = _replayed(resolver, request, job, event.ended_at, default_wait_ms)
            replays.append(
                StepReplay(
                    event.step_number,
                    event.originator_version,
                    recorded,
                    replayed,
                    _differences(recorded, replayed, step_inputs=step_inputs),
                )
            )
        elif job is not None and isinstance(event, Job.Failed) and event.cause == "definition":
            before = _history(events, index)
            request = _request(job, claim, tick_reasons, target, event.timestamp, before)
            recorded = Decision(
                "(resolution)", job.cursor, JobStatus.FAILED, None, error=event.error
            )
            replayed = _replayed(resolver, request, job, event.timestamp, default_wait_ms)
            differences = (
                ()
                if replayed.error is not None
                else _differences(recorded, replayed, step_inputs=step_inputs)
            )
            replays.append(
                StepReplay(
                    event.step_number, event.originator_version, recorded, replayed, differences
                )
            )
        taken = _claim_taken(event, job)
        if taken is not None:
            claim = taken
            if taken.reason is not None:
                tick_reasons[taken.claim_id] = taken.reason
        try:
            job = event.mutate(job)
        except Exception as error:
            raise ReplayError(
                f"the history does not fold at v{event.originator_version} "
                f"({type(event).__name__}): {error}"
            ) from None
        if job is not None and job.personal_data:
            unreadable.extend(_unreadable(event, job.personal_data))
        if job is not None and job.status is not JobStatus.RUNNING:
            claim = None
    if job is None:
        raise ReplayError("the job has no events")
    return ReplayReport(
        job_uuid=job.id,
        tenant_id=job.tenant_id,
        job_id=job.job_id,
        workflow_type=job.workflow_type,
        recorded_version=job.workflow_version,
        definition_version=target,
        status=str(job.status),
        events=len(events),
        steps=tuple(replays),
        unreadable=tuple(unreadable),
    )


def _unreadable(event: Job.Event, paths: Sequence[str]) -> list[str]:
    fields = erasure.unreadable_fields(type(event).__qualname__, vars(event), paths)
    return [f"v{event.originator_version} {name}" for name in fields]


# ---- rebuilding the request ---------------------------------------------------------------


def _resolver(
    definition: WorkflowDefinition | Resolver, version: int | None
) -> tuple[Resolver, int]:
    if isinstance(definition, WorkflowDefinition):
        if version is not None and version != definition.version:
            raise ReplayError(f"{definition.label} cannot stand for v{version}")
        return partial(resolve, definition), definition.version
    if version is None:
        raise ReplayError("replaying against a resolver needs the version it stands for")
    return definition, version


def _check_type(workflow_type: str, definition: WorkflowDefinition) -> None:
    if workflow_type != definition.type:
        raise ReplayError(
            f"the job runs workflow {workflow_type!r}; the definition is {definition.label}"
        )


@dataclass(frozen=True)
class _Claim:
    """The claim a step ran under, and the budget the step was resolved with: inputs that
    landed while the step ran (a buffered signal, a budget raise) sit between the claim
    and the step in the history, but the step was resolved before them."""

    claim_id: str
    reason: str | None
    """The reason of the tick that took it; None for a continuation (the tick's reason
    is that of the claim it continues)."""
    previous_status: JobStatus | None
    """The status a tick's own claim found (the step was resolved before it); None for a
    claim held before the step was resolved (a continuation, a resume's folded claim):
    the job was running."""
    budget: Mapping[str, Any]


def _claim_taken(event: Job.Event, job: Job | None) -> _Claim | None:
    """The claim an event takes: a ``Claimed``, or a claim folded into a continuing step
    (a continuation) or into a resume (for the tick it wakes, held before it resolves)."""
    budget = job.budget.to_dict() if job is not None else {}
    if isinstance(event, Job.Claimed):
        if event.reason == "continuation":
            return _Claim(event.claim_id, None, None, budget)
        return _Claim(event.claim_id, event.reason, event.previous_status, budget)
    folded = Claim.folded_into(event)
    if folded is None:
        return None
    reason = event.tick_reason if isinstance(event, Job.Resumed) else None
    return _Claim(folded.claim_id, reason, None, budget)


def _history(events: Sequence[Job.Event], index: int) -> HistoryReader:
    """The events before ``events[index]``, read as a code workflow's resolution reads
    the job's history (those after a version)."""
    before = events[:index]
    return lambda after: [event for event in before if event.originator_version > after]


def _request(
    job: Job,
    claim: _Claim | None,
    tick_reasons: Mapping[str, str],
    version: int,
    now: datetime,
    history: HistoryReader,
) -> ResolveRequest:
    status = job.status
    reason = UNKNOWN_REASON
    budget: Mapping[str, Any] = job.budget.to_dict()
    if claim is not None:
        budget = claim.budget
        if claim.previous_status is not None and claim.reason is not None:
            # Resolved before this claim was taken for it: the job was as the claim found it.
            status, reason = claim.previous_status, claim.reason
        else:
            reason = tick_reasons.get(claim.claim_id, UNKNOWN_REASON)
    return ResolveRequest(
        workflow_type=job.workflow_type,
        workflow_version=version,
        budget=budget,
        state=job.state,
        current_step=job.current_step,
        status=status,
        reason=reason,
        now=now,
        cursor=job.cursor,
        visits=job.visits,
        # No job_uuid: a registry keeps no suspended body for a rebuilt request.
        version=job.version,
        history=history,
    )


# ---- the two decisions --------------------------------------------------------------------


_AfterStep = TypeVar("_AfterStep", Job.ApprovalRequested, Job.ChildrenSpawned)


def _after_step(
    kind: type[_AfterStep], events: Sequence[Job.Event], index: int, step_number: int
) -> _AfterStep | None:
    """What a step opened rides in the same append, right after it: the approval request,
    or the children a map step spawned."""
    following = events[index + 1] if index + 1 < len(events) else None
    if isinstance(following, kind) and following.step_number == step_number:
        return following
    return None


def _children_wait(
    children: Sequence[Mapping[str, Any]], join: Mapping[str, Any] | None, timeout_at: str | None
) -> dict[str, Any]:
    """A join as replay compares it: the children (ids, workflows, items) and the join."""
    spawned = [
        {k: child[k] for k in ("job_id", "workflow_type", "workflow_version", "item")}
        for child in children
    ]
    return {"children": spawned, "join": dict(join or {}), "timeout_at": timeout_at}


def _recorded(
    step: Job.StepRecorded,
    approval: Job.ApprovalRequested | None,
    spawned: Job.ChildrenSpawned | None = None,
) -> Decision:
    wait: dict[str, Any] | None = None
    status = step.next_status
    if status is JobStatus.WAITING_CHILDREN:
        children = spawned.children if spawned else []
        wait = _children_wait(children, spawned.join if spawned else None, _iso(step.resume_at))
    elif status is JobStatus.WAITING_TIME:
        wait = {"resume_at": _iso(step.resume_at)}
    elif status is JobStatus.WAITING_EVENT:
        opened = EventWait.from_dict(step.wait_event) if step.wait_event else None
        wait = {
            "event": opened.name if opened else None,
            "timeout_at": _iso(step.resume_at),
            "on_timeout": opened.on_timeout if opened else None,
        }
    elif status is JobStatus.AWAITING_APPROVAL:
        wait = {
            "approvers": list(approval.approvers) if approval else [],
            "expires_at": _iso(approval.expires_at if approval else step.resume_at),
            "on_approve": approval.on_approve if approval else step.next_step,
            "on_reject": approval.on_reject if approval else None,
            "on_expire": approval.on_expire if approval else None,
        }
        if approval is not None and approval.quorum is not None:
            wait["quorum"] = approval.quorum
    return _decision(step, wait, getattr(step, "input_sha256", None))


def _replayed(
    resolver: Resolver, request: ResolveRequest, job: Job, at: datetime, default_wait_ms: int
) -> Decision:
    """The engine's own decision: the same ``transition.decide`` the tick records with."""
    try:
        resolution = resolver(request)
    except Exception as error:
        return Decision("(resolution)", request.cursor, JobStatus.FAILED, None, error=str(error))
    resolution = with_edit(job.approved_edit, resolution)
    step = transition.decide(job, resolution, at=at, default_wait_ms=default_wait_ms)
    wait: dict[str, Any] | None = None
    if step.next_status is JobStatus.WAITING_CHILDREN:
        wait = _children_wait(step.children, step.join, _iso(step.resume_at))
    elif step.next_status is JobStatus.WAITING_TIME:
        wait = {"resume_at": _iso(step.resume_at)}
    elif step.next_status is JobStatus.WAITING_EVENT:
        wait = {
            "event": step.wait_event_name,
            "timeout_at": _iso(step.resume_at),
            "on_timeout": step.on_timeout,
        }
    elif step.approval is not None:
        wait = {
            "approvers": list(step.approval.approvers),
            "expires_at": _iso(step.resume_at),
            "on_approve": step.approval.on_approve,
            "on_reject": step.approval.on_reject,
            "on_expire": step.approval.on_expire,
        }
        if step.approval.quorum is not None:
            wait["quorum"] = step.approval.quorum
    return _decision(step, wait, step.input_sha256)


def _decision(
    step: Job.StepRecorded | transition.Transition,
    wait: Mapping[str, Any] | None,
    input_sha256: str | None,
) -> Decision:
    """The recorded step and the replayed transition name their outcome alike."""
    return Decision(
        step.step_type,
        step.step_name,
        step.next_status,
        step.next_step,
        wait,
        input_sha256=input_sha256,
    )


def _differences(
    recorded: Decision, replayed: Decision, *, step_inputs: bool = True
) -> tuple[str, ...]:
    """In the order of OUTCOMES: a step of another kind shows as a different status; a
    different step is one with the same effect under another name or kind."""
    found = []
    if recorded.next_status != replayed.next_status:
        found.append("status")
    if recorded.next_step != replayed.next_step:
        found.append("next_step")
    if recorded.wait != replayed.wait:
        found.append("wait")
    identity = (recorded.step_type, recorded.step_name) != (replayed.step_type, replayed.step_name)
    if identity or replayed.error is not None:
        found.append("step")
    compared = step_inputs or recorded.wait is not None
    if compared and recorded.input_sha256 not in (None, replayed.input_sha256):
        found.append("input")
    return tuple(found)


def _iso(moment: datetime | None) -> str | None:
    return moment.isoformat() if moment is not None else None
