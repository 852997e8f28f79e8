"""Export (auditor): a tenant's job histories, or one job's, as the JSON lines of
``jobledger export``, streamed as they are read from the log.

The lines are the chain's canonical form and the manifest (counts, every job's head hash)
comes last, so the file verifies with the standard library alone and a stream cut off
part way (the server stopped, the store went away mid-read) has no manifest: ``jobledger
import`` refuses it rather than load part of a tenant."""

from __future__ import annotations

from urllib.parse import quote

from fastapi import APIRouter
from fastapi.responses import StreamingResponse

from jobledger.api.auth import Role
from jobledger.api.deps import Caller, EngineDep, tenant_scope
from jobledger.api.paths import JOB, TENANT
from jobledger.api.problems import EVERY_REQUEST, text_body
from jobledger.audit.export import Selection, export_lines
from jobledger.engine.engine import Engine

router = APIRouter(tags=["audit"], responses=EVERY_REQUEST)

MEDIA_TYPE = "application/jsonl"
EXPORTED = text_body(
    MEDIA_TYPE,
    "One canonical JSON line per event (job, then version order), then the manifest line.",
    403,
    404,
)


@router.get(f"{TENANT}/export", response_class=StreamingResponse, responses=EXPORTED)
def export_tenant(tenant: str, caller: Caller, engine: EngineDep) -> StreamingResponse:
    """Every job of the tenant, event by event, then the manifest (auditor)."""
    tenant_scope(caller, tenant, Role.AUDITOR)
    return _stream(engine, Selection(tenant_id=tenant), f"{tenant}.jsonl")


@router.get(f"{JOB}/export", response_class=StreamingResponse, responses=EXPORTED)
def export_job(tenant: str, job: str, caller: Caller, engine: EngineDep) -> StreamingResponse:
    """One job, event by event, then the manifest (auditor)."""
    tenant_scope(caller, tenant, Role.AUDITOR, job_id=job)
    engine.job(tenant, job)  # a job that does not exist is the 404, before any line
    return _stream(engine, Selection(tenant_id=tenant, job_id=job), f"{tenant}-{job}.jsonl")


def _stream(engine: Engine, selection: Selection, filename: str) -> StreamingResponse:
    # A plain generator: the server iterates it on its thread pool, a read at a time.
    lines = export_lines(engine.deps.store, selection, engine.clock.now())
    disposition = f"attachment; filename*=UTF-8''{quote(filename, safe='')}"
    return StreamingResponse(
        lines, media_type=MEDIA_TYPE, headers={"Content-Disposition": disposition}
    )
