"""Live updates: ``GET /v1/jobs/{tenant}/{job}/events``, the job's log as Server-Sent
Events (see :mod:`jobledger.api.live`).

Each message's id is the event's version, so a client that reconnects with
``Last-Event-ID`` (EventSource does it by itself) gets exactly the events it missed;
``?after=N`` does the same for a first connection. Without either, the stream starts
with the job's whole history. A comment line is sent while nothing happens, and the
stream ends when the server stops."""

from __future__ import annotations

import asyncio
from typing import Annotated

from fastapi import APIRouter, Header, Query, Request
from fastapi.responses import StreamingResponse

from jobledger.api.deps import Caller, EngineDep, tenant_scope
from jobledger.api.live import LogBell, job_events, resume_after
from jobledger.api.paths import JOB
from jobledger.api.problems import EVERY_REQUEST, text_body
from jobledger.api.settings import ApiSettings
from jobledger.domain.identity import job_uuid

router = APIRouter(tags=["live"], responses=EVERY_REQUEST)

MEDIA_TYPE = "text/event-stream"
STREAM = text_body(
    MEDIA_TYPE,
    "The job's events after the given version, then each new one (``id``: the version, "
    "``event``: the event type, ``data``: the event as the history gives it).",
    404,
)


@router.get(f"{JOB}/events", response_class=StreamingResponse, responses=STREAM)
async def job_event_stream(
    tenant: str,
    job: str,
    request: Request,
    caller: Caller,
    engine: EngineDep,
    last_event_id: Annotated[
        str | None,
        Header(description="The last version received: the stream goes on after it."),
    ] = None,
    after: Annotated[
        int | None, Query(ge=0, description="Start after this version (0: from the start).")
    ] = None,
) -> StreamingResponse:
    """The job's events as Server-Sent Events, following its log."""
    tenant_scope(caller, tenant, None, job_id=job)
    head = (await asyncio.to_thread(engine.job, tenant, job)).version
    start = resume_after(last_event_id, after, head)
    bell: LogBell = request.app.state.live
    settings: ApiSettings = request.app.state.settings
    await asyncio.to_thread(bell.start)  # a store error is the 503 problem, not a cut stream
    stream = job_events(
        bell, job_uuid(tenant, job), start, heartbeat_seconds=settings.sse_heartbeat_seconds
    )
    headers = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
    return StreamingResponse(stream, media_type=MEDIA_TYPE, headers=headers)
