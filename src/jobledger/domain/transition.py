"""The transition: from a job and the resolution of its next step to what the step records.

One pure function decides, one applies, and both the tick (``Orchestrator._record``) and
replay (``jobledger.audit.replay``) call them: replay runs the engine's own transition
code over the recorded history, the way Temporal's replayer runs the production worker,
so it cannot disagree with what the engine would record.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any

from jobledger.domain import erasure, fan_out, identity
from jobledger.domain.job import Claim, Job
from jobledger.domain.status import JobStatus
from jobledger.domain.steps import ApprovalSpec, IssuedToken, Resolution
from jobledger.domain.substate import EventWait

DEFAULT_EVENT_NAME = "job.resume"
"""The event a ``waiting_event`` step waits for when its resolution names none."""


@dataclass(frozen=True)
class Transition:
    """Everything a step records that the definition decides, before the step runs."""

    step_number: int
    idempotency_key: str
    step_type: str
    step_name: str | None
    triggered_by: str
    transition_reason: str
    next_status: JobStatus
    next_step: str | None
    resume_at: datetime | None
    """The timer, or the deadline of the wait or approval the step opens."""
    wait_event_name: str | None
    """The outside event a ``waiting_event`` step waits for."""
    on_timeout: str | None
    approval: ApprovalSpec | None
    """The gate an ``awaiting_approval`` step opens, ``on_approve`` already defaulted."""
    params: dict[str, Any]
    """What the executor is asked to do (and what an approval's action hash covers)."""
    input_sha256: str
    """What the definition hands the step beyond its name and kind: the executor's
    params, the retry policy, and the step's own output and state patch."""
    children: list[dict[str, Any]]
    """The children a map step spawns (``jobledger.domain.fan_out.plans``); empty otherwise."""
    join: dict[str, Any] | None
    """The join a map step waits on."""


def decide(job: Job, resolution: Resolution, *, at: datetime, default_wait_ms: int) -> Transition:
    """Pure: the same job, resolution and moment always give the same transition."""
    step_number = job.current_step + 1
    step_key = job.step_key(step_number)
    status = resolution.next_status
    waits_for_event = status is JobStatus.WAITING_EVENT
    spawns = resolution.children if status is JobStatus.WAITING_CHILDREN else None
    approval: ApprovalSpec | None = None
    if status is JobStatus.AWAITING_APPROVAL:
        spec = resolution.approval or ApprovalSpec()
        approval = ApprovalSpec(
            approvers=spec.approvers,
            expires_ms=spec.expires_ms,
            on_approve=spec.on_approve or resolution.next_step,
            on_reject=spec.on_reject,
            on_expire=spec.on_expire,
            quorum=spec.quorum,
        )
    return Transition(
        step_number=step_number,
        idempotency_key=step_key,
        step_type=resolution.step_type,
        step_name=resolution.step_name,
        triggered_by=resolution.triggered_by,
        transition_reason=resolution.transition_reason,
        next_status=status,
        next_step=resolution.next_step,
        resume_at=resume_at(resolution, at, default_wait_ms),
        wait_event_name=event_name(resolution) if waits_for_event else None,
        on_timeout=resolution.on_timeout if waits_for_event else None,
        approval=approval,
        params=resolution.params,
        input_sha256=input_sha256(resolution),
        children=[]
        if spawns is None
        else fan_out.plans(
            spawns,
            parent_job_id=job.job_id,
            step_number=step_number,
            step_key=step_key,
            epoch=job.epoch,
        ),
        join=None
        if spawns is None
        else fan_out.join_spec(spawns, step_number, resolution.next_step),
    )


@dataclass(frozen=True)
class StepOutcome:
    """What running the step produced (nothing but timings for a pure transition)."""

    started_at: datetime
    ended_at: datetime
    output: dict[str, Any]
    state_patch: dict[str, Any]
    cost_usd: Decimal
    worker_id: str | None


def apply(
    job: Job,
    transition: Transition,
    outcome: StepOutcome,
    *,
    token: IssuedToken | None,
    continuation: Claim | None = None,
) -> None:
    """Trigger the step's events on the job (the caller appends them): the step and its
    transition, the approval request it opens, the resume by a signal that arrived
    before its wait opened and, when the tick goes on with the job (``continuation``),
    its claim: folded into the step when the step itself leaves the job queued (one
    event), else a ``Claimed`` after the resume that queued it."""
    at = outcome.ended_at
    folded = continuation if transition.next_status is JobStatus.QUEUED else None
    job.record_step(
        step_number=transition.step_number,
        step_type=transition.step_type,
        triggered_by=transition.triggered_by,
        idempotency_key=transition.idempotency_key,
        started_at=outcome.started_at,
        ended_at=at,
        output=outcome.output,
        state_patch=outcome.state_patch,
        cost_usd=outcome.cost_usd,
        transition_reason=transition.transition_reason,
        next_status=transition.next_status,
        resume_at=transition.resume_at,
        wait_event=_wait_event(transition, token),
        worker_id=outcome.worker_id,
        step_name=transition.step_name,
        next_step=transition.next_step,
        input_sha256=transition.input_sha256,
        continuation=folded,
    )
    _open_approval(job, transition, at)
    if transition.join is not None:
        job.spawn_children(
            step_number=transition.step_number,
            children=transition.children,
            join=transition.join,
            now=at,
        )
    _take_early_signal(job, at)
    if continuation is not None and folded is None and job.status is JobStatus.QUEUED:
        job.claim(
            worker_id=continuation.worker_id,
            claim_id=continuation.claim_id,
            lease_until=continuation.lease_until,
            reason="continuation",
            now=at,
        )


def input_sha256(resolution: Resolution) -> str:
    policy = resolution.retry_policy
    retry = None if policy is None else {**asdict(policy), "retry_on": sorted(policy.retry_on)}
    document = {
        "params": resolution.params,
        "output": resolution.output,
        "state_patch": resolution.state_patch,
        "retry": retry,
    }
    return _sha256(document)


def action_sha256(
    step_name: str | None,
    params: dict[str, Any],
    state: dict[str, Any],
    personal_data: Sequence[str] = (),
) -> str:
    """What a person approves: the step and the inputs it acts on."""
    masked = erasure.replaced(state, personal_data, erasure.ERASED)
    return _sha256({"step": step_name, "params": params, "state": masked})


# ---- the parts of a transition ------------------------------------------------------------


def event_name(resolution: Resolution) -> str:
    """The outside event a ``waiting_event`` step waits for."""
    return resolution.wait_event_name or DEFAULT_EVENT_NAME


def resume_at(resolution: Resolution, at: datetime, default_wait_ms: int) -> datetime | None:
    """When a tick should next look at the job: its timer, or its wait's deadline."""
    status = resolution.next_status
    if status is JobStatus.WAITING_TIME:
        if resolution.resume_at is not None:
            return resolution.resume_at
        delay = resolution.resume_delay_ms
        return at + timedelta(milliseconds=default_wait_ms if delay is None else delay)
    timed_waits = (JobStatus.WAITING_EVENT, JobStatus.WAITING_CHILDREN)
    if status in timed_waits and resolution.wait_timeout_ms is not None:
        return at + timedelta(milliseconds=resolution.wait_timeout_ms)
    approval = resolution.approval
    if status is JobStatus.AWAITING_APPROVAL and approval and approval.expires_ms is not None:
        return at + timedelta(milliseconds=approval.expires_ms)
    return None


def _wait_event(transition: Transition, token: IssuedToken | None) -> dict[str, Any] | None:
    """The wait the step opens, as its event stores it."""
    if token is None or transition.wait_event_name is None:
        return None
    wait = EventWait(
        name=transition.wait_event_name,
        nonce=token.nonce,
        token_sha256=token.token_sha256,
        expires_at=token.expires_at,
        on_timeout=transition.on_timeout,
    )
    return wait.to_dict()


def _open_approval(job: Job, transition: Transition, at: datetime) -> None:
    spec = transition.approval
    if spec is None:
        return
    job.request_approval(
        approval_id=identity.approval_id(job.job_id, transition.step_number, job.epoch),
        attempt=job.visits.get(transition.step_name or "", 1),
        action_sha256=action_sha256(
            transition.step_name, transition.params, job.state, job.personal_data
        ),
        approvers=list(spec.approvers),
        expires_at=job.resume_at,
        on_approve=spec.on_approve,
        on_reject=spec.on_reject,
        on_expire=spec.on_expire,
        now=at,
        quorum=spec.quorum,
    )


def _take_early_signal(job: Job, at: datetime) -> None:
    """A signal that arrived before this wait opened resumes it at once."""
    if job.status is not JobStatus.WAITING_EVENT:
        return
    signal = job.buffered_signal()
    if signal is not None:
        job.resume(
            source="early_signal", payload=signal.payload, now=at, signal_id=signal.signal_id
        )


def _sha256(document: object) -> str:
    encoded = json.dumps(document, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(encoded.encode()).hexdigest()
