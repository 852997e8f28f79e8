"""Erasure: a data subject's personal data, or one job's, destroyed on request (admin).
Who erased is the authenticated caller, never a field of the body."""

from __future__ import annotations

from fastapi import APIRouter, Response

from jobledger.api.auth import Role
from jobledger.api.deps import Caller, EngineDep, tenant_scope
from jobledger.api.models import Erasure, ErasureRequest
from jobledger.api.paths import TENANT
from jobledger.api.problems import EVERY_REQUEST, documented

router = APIRouter(tags=["erasure"], responses=EVERY_REQUEST)


@router.post(
    f"{TENANT}/erasures",
    response_model=Erasure,
    responses={
        202: {"model": Erasure, "description": "Erased; the shred is pending: ask again"},
        **documented(403, 404, 409),
    },
)
def erase(
    tenant: str, body: ErasureRequest, caller: Caller, engine: EngineDep, response: Response
) -> Erasure:
    """Erase a data subject (``subject``) or one job submitted without one (``job_id``),
    recorded with the caller and the reason (admin): each job records ``Erased``, then the
    key is destroyed; the personal values read as ``[erased]`` from then on, and every
    chain still verifies. An erasure interrupted is finished by asking again. 202 (``shred``
    ``pending``): the key is deleted but another connection's read transaction still keeps
    its bytes in the database's files: asking again finishes it. 404: no such subject or
    job; 409: already erased, or a job sealed with its data subject's key (erase the
    subject), or one that holds no personal data."""
    tenant_scope(caller, tenant, Role.ADMIN, job_id=body.job_id)
    if body.subject is not None:
        report = engine.erase(tenant, body.subject, by=caller.subject, reason=body.reason)
    else:
        assert body.job_id is not None
        report = engine.erase_job(tenant, body.job_id, by=caller.subject, reason=body.reason)
    if report.shred == "pending":
        response.status_code = 202
    return Erasure.of(report)
