"""Jobs: submit, read, list, history, time travel."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from jobledger.api.deps import Caller, EngineDep, tenant_scope
from jobledger.api.models import Job

router = APIRouter(tags=["jobs"])

NOT_FOUND: dict[int | str, dict[str, Any]] = {
    404: {"description": "No such job (or not one the caller may see)."}
}


@router.get("/jobs/{tenant}/{job}", response_model=Job, responses=NOT_FOUND)
def get_job(tenant: str, job: str, caller: Caller, engine: EngineDep) -> Job:
    """The job now, with its open approval request and wait."""
    tenant_scope(caller, tenant, None, job_id=job)
    return Job.of(engine.job(tenant, job), engine.history(tenant, job))
