"""What people and outside systems send a job: signals, approval decisions, budget
raises, cancellation. Who did it is always the authenticated caller, never a field of
the body; the engine's own rules (the job's commands) decide the rest."""

from __future__ import annotations

from fastapi import APIRouter

from jobledger.api.auth import Role
from jobledger.api.deps import Caller, EngineDep, tenant_scope
from jobledger.api.models import (
    BudgetRequest,
    CancelRequest,
    DecisionRequest,
    Job,
    ReassignRequest,
    SignalRequest,
    SignalResult,
)
from jobledger.api.paths import JOB
from jobledger.api.problems import EVERY_REQUEST, documented

router = APIRouter(tags=["inputs"], responses=EVERY_REQUEST)

REFUSALS = documented(403, 404, 409)


@router.post(f"{JOB}/signals", response_model=SignalResult, responses=REFUSALS)
def signal(
    tenant: str, job: str, body: SignalRequest, caller: Caller, engine: EngineDep
) -> SignalResult:
    """Deliver an outside event by name (operator). A job waiting for it resumes
    (``resumed``); otherwise it is kept for the wait (``buffered``). The signal id makes
    delivery idempotent: a repeat is ``duplicate`` and changes nothing."""
    tenant_scope(caller, tenant, Role.OPERATOR, job_id=job)
    outcome = engine.signal(tenant, job, body.event, body.payload, signal_id=body.signal_id)
    return SignalResult(outcome=outcome.value, job=Job.of(engine.job(tenant, job)))


@router.post(
    JOB + "/approvals/{approval:id}",
    response_model=Job,
    responses=REFUSALS,
)
def decide(
    tenant: str, job: str, approval: str, body: DecisionRequest, caller: Caller, engine: EngineDep
) -> Job:
    """Approve or reject the job's open approval request (approver); on a quorum request,
    cast the caller's one vote. The decider is the authenticated subject, and must be one
    the request lists; a decision on another attempt, or on an action other than
    ``action_sha256``, is refused as stale (409), a second vote too. ``edit`` changes
    params of the step approved (the step runs with them), ``data`` lands in the job's
    state; a bad edit or data is refused (400), nothing written."""
    tenant_scope(caller, tenant, Role.APPROVER, job_id=job)
    view = engine.decide(
        tenant,
        job,
        approval,
        body.decision,
        caller.subject,
        body.comment,
        action_sha256=body.action_sha256,
        edit=body.edit,
        data=body.data,
    )
    return Job.of(view)


@router.post(
    JOB + "/approvals/{approval:id}/reassign",
    response_model=Job,
    responses=documented(400, 403, 404, 409),
)
def reassign(
    tenant: str, job: str, approval: str, body: ReassignRequest, caller: Caller, engine: EngineDep
) -> Job:
    """Move the job's open approval request to other approvers (operator), recorded with
    the caller and the reason: the ones named before may no longer decide; votes already
    cast stay counted. A list that leaves the quorum out of reach is refused (400)."""
    tenant_scope(caller, tenant, Role.OPERATOR, job_id=job)
    view = engine.reassign(
        tenant, job, approval, list(body.approvers), by=caller.subject, reason=body.reason
    )
    return Job.of(view)


@router.post(f"{JOB}/budget", response_model=Job, responses=REFUSALS)
def raise_budget(
    tenant: str, job: str, body: BudgetRequest, caller: Caller, engine: EngineDep
) -> Job:
    """Lift the job's limits (operator), recorded with the caller and the reason; a job
    parked on a limit goes on."""
    tenant_scope(caller, tenant, Role.OPERATOR, job_id=job)
    view = engine.raise_budget(
        tenant,
        job,
        raised_by=caller.subject,
        reason=body.reason,
        max_steps=body.max_steps,
        max_cost_usd=body.max_cost_usd,
        deadline_at=body.deadline_at,
    )
    return Job.of(view)


@router.post(f"{JOB}/cancel", response_model=Job, responses=REFUSALS)
def cancel(tenant: str, job: str, body: CancelRequest, caller: Caller, engine: EngineDep) -> Job:
    """Cancel the job (operator): terminal; open tokens and approvals stop working."""
    tenant_scope(caller, tenant, Role.OPERATOR, job_id=job)
    view = engine.cancel(tenant, job, body.reason, caller.subject)
    return Job.of(view)
