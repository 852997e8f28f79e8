"""Approval requests for the people who decide them: the caller's inbox across its
tenants, and one request as it stands (what is approved, the hash a decision is bound
to, how it ended). Deciding is ``POST .../approvals/{approval}`` (routes_inputs)."""

from __future__ import annotations

from fastapi import APIRouter, Request

from jobledger.api import approvals
from jobledger.api.auth import Role
from jobledger.api.deps import Caller, EngineDep, tenant_scope
from jobledger.api.models import Approval
from jobledger.api.paths import JOB
from jobledger.api.problems import EVERY_REQUEST, Problem, documented
from jobledger.projections import JobViews

router = APIRouter(tags=["approvals"], responses=EVERY_REQUEST)


@router.get("/approvals", response_model=list[Approval], responses=documented(403))
def inbox(request: Request, caller: Caller, engine: EngineDep) -> list[Approval]:
    """The open approval requests the caller may decide, across its tenants, oldest
    first: those that list its subject (or list nobody). Approvers and admins only."""
    if Role.APPROVER not in caller.roles and Role.ADMIN not in caller.roles:
        raise Problem(403, "listing approvals needs the approver role", error="Forbidden")
    views: JobViews = request.app.state.views
    with request.app.state.views_lock:
        views.catch_up()
    return [Approval.of(card) for card in approvals.inbox(engine, views, caller)]


@router.get(JOB + "/approvals/{approval:id}", response_model=Approval, responses=documented(404))
def approval(tenant: str, job: str, approval: str, caller: Caller, engine: EngineDep) -> Approval:
    """One approval request of the job, open or not (any role of the tenant reads it)."""
    tenant_scope(caller, tenant, None, job_id=job)
    card = approvals.approval(engine, tenant, job, approval)
    if card is None:
        raise Problem(
            404, f"job {job!r} made no approval request {approval!r}", error="UnknownApproval"
        )
    return Approval.of(card)
