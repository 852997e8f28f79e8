"""Batches: one action over the jobs a query matches (a dry run first, if asked), run in
the background; then its progress and each job's outcome.

Acting takes the role the single-job action takes (operator: cancel, signal,
raise-budget, retry, reset; admin: migrate, which has no single-job route); every role
reads batches."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, Request, Response

from jobledger.api.auth import Role
from jobledger.api.batch_models import Batch, BatchList, BatchPreview, BatchRequest, BatchSummary
from jobledger.api.batch_runner import BatchRunner
from jobledger.api.deps import Caller, EngineDep, tenant_scope
from jobledger.api.paths import BATCH, BATCHES, id_path
from jobledger.api.problems import EVERY_REQUEST, documented

router = APIRouter(tags=["batches"], responses=EVERY_REQUEST)

ROLES = {"migrate": Role.ADMIN}
"""The role each action needs, operator unless named here."""
MAX_PAGE = 1000


def _location(tenant: str, batch_id: str) -> str:
    return f"/v1/tenants/{id_path(tenant)}/batches/{id_path(batch_id)}"


@router.post(
    BATCHES,
    response_model=Batch | BatchPreview,
    status_code=202,
    responses={
        200: {"model": BatchPreview, "description": "A dry run: the count and a sample."},
        **documented(403, 404, 409),
    },
)
def start_batch(
    tenant: str,
    body: BatchRequest,
    caller: Caller,
    engine: EngineDep,
    request: Request,
    response: Response,
) -> Batch | BatchPreview:
    """Act on every job the query matches, as the caller (202: the batch, its jobs
    frozen, runs in the background; ``Location`` is its progress). ``dry_run``: the
    count and the first 10 jobs (200), nothing written. A query that names nothing but
    the tenant needs ``query.all``; bad parameters are 400, nothing written."""
    tenant_scope(caller, tenant, ROLES.get(body.action, Role.OPERATOR))
    if body.dry_run:
        response.status_code = 200
        preview = engine.bulk.preview(tenant, body.action, body.query, body.params)
        return BatchPreview.of(preview)
    view = engine.bulk.start(
        tenant, body.action, body.query, body.params, by=caller.subject, reason=body.reason
    )
    runner: BatchRunner = request.app.state.batches
    runner.run(tenant, view.batch_id)
    response.headers["Location"] = _location(tenant, view.batch_id)
    return Batch.of(view)


@router.get(BATCHES, response_model=BatchList, responses=documented(403, 404))
def list_batches(
    tenant: str,
    caller: Caller,
    engine: EngineDep,
    limit: Annotated[int, Query(ge=1, le=MAX_PAGE, description="At most this many.")] = 100,
) -> BatchList:
    """The tenant's batches, newest first, with their counts (from the batches view,
    brought up to date with the log first)."""
    tenant_scope(caller, tenant, None)
    return BatchList(batches=[BatchSummary.of(r) for r in engine.bulk.batches(tenant, limit)])


@router.get(BATCH, response_model=Batch, responses=documented(403, 404))
def get_batch(tenant: str, batch: str, caller: Caller, engine: EngineDep) -> Batch:
    """A batch's progress and each job's outcome so far."""
    tenant_scope(caller, tenant, None)
    return Batch.of(engine.bulk.batch(tenant, batch))


@router.post(
    f"{BATCH}/resume", response_model=Batch, status_code=202, responses=documented(403, 404)
)
def resume_batch(
    tenant: str, batch: str, caller: Caller, engine: EngineDep, request: Request
) -> Batch:
    """Go on with a batch whose runner stopped (operator; admin for migrate), in the
    background, from the first job without an outcome."""
    tenant_scope(caller, tenant, None)
    view = engine.bulk.batch(tenant, batch)
    tenant_scope(caller, tenant, ROLES.get(view.action, Role.OPERATOR))
    runner: BatchRunner = request.app.state.batches
    runner.run(tenant, batch)
    return Batch.of(view)
