"""Jobs: submit, read, list, history, time travel."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated

from fastapi import APIRouter, Header, Query, Request, Response

from jobledger.api.auth import Role
from jobledger.api.deps import Caller, EngineDep, tenant_scope
from jobledger.api.models import (
    Event,
    HistoryPage,
    Job,
    JobPage,
    JobRow,
    JobWithFamily,
    SubmitRequest,
)
from jobledger.api.paths import JOB, JOBS, id_path
from jobledger.api.problems import EVERY_REQUEST, Problem, documented
from jobledger.domain.identity import job_uuid
from jobledger.domain.status import UnknownStatusError, parse_statuses
from jobledger.projections import JobViews
from jobledger.projections.job_views import JobQuery, cursor

router = APIRouter(tags=["jobs"], responses=EVERY_REQUEST)

MAX_PAGE = 1000
NOT_FOUND = documented(403, 404)
Limit = Annotated[int, Query(ge=1, le=MAX_PAGE, description="At most this many.")]


@router.post(
    JOBS,
    response_model=Job,
    status_code=201,
    responses={
        200: {"model": Job, "description": "The job this request (or its key) made before."},
        **documented(403, 404, 409, 422),
    },
)
def submit(
    tenant: str,
    body: SubmitRequest,
    caller: Caller,
    engine: EngineDep,
    response: Response,
    idempotency_key: Annotated[
        str | None,
        Header(
            alias="Idempotency-Key",
            min_length=1,
            max_length=200,
            description="The same as the body's idempotency_key (either, or both alike).",
        ),
    ] = None,
) -> Job:
    """Submit a job (operator). 201 with the new job; a repeat (the same job id, or an
    idempotency key already used in this tenant) is 200 with the job it made. The same
    job id asked differently is 409; a key used before for a different request (another
    job id, workflow, input, ids or priority) is 422 ``IdempotencyKeyReusedError``, naming
    the first request's job and what differs."""
    tenant_scope(caller, tenant, Role.OPERATOR)
    key = _one_key(body.idempotency_key, idempotency_key)
    made = engine.submission(
        tenant,
        body.job_id,
        body.workflow_type,
        workflow_version=body.workflow_version,
        input=body.input,
        budget=body.budget,
        idempotency_key=key,
        mission_id=body.mission_id,
        employee_id=body.employee_id,
        correlation_id=body.correlation_id,
        data_subject=body.data_subject,
        priority=body.priority,
    )
    view = made.job
    if not made.created:
        response.status_code = 200
    response.headers["Location"] = f"/v1/jobs/{id_path(tenant, view.job_id)}"
    return Job.of(view)


def _one_key(in_body: str | None, in_header: str | None) -> str | None:
    if in_body is not None and in_header is not None and in_body != in_header:
        raise Problem(
            400,
            "the Idempotency-Key header and the body's idempotency_key differ",
            error="InvalidPayloadError",
        )
    return in_body if in_body is not None else in_header


@router.get(JOBS, response_model=JobPage, responses=NOT_FOUND)
def list_jobs(
    tenant: str,
    caller: Caller,
    request: Request,
    status: Annotated[
        str | None, Query(description="Comma-separated statuses, e.g. waiting_event,failed.")
    ] = None,
    workflow: Annotated[str | None, Query(description="Workflow type.")] = None,
    version: Annotated[int | None, Query(ge=1, description="Workflow version.")] = None,
    mission: Annotated[str | None, Query(description="Mission id.")] = None,
    correlation: Annotated[str | None, Query(description="Correlation id.")] = None,
    created_after: Annotated[datetime | None, Query(description="Created at or after.")] = None,
    created_before: Annotated[datetime | None, Query(description="Created before.")] = None,
    updated_after: Annotated[datetime | None, Query(description="Changed at or after.")] = None,
    updated_before: Annotated[datetime | None, Query(description="Changed before.")] = None,
    after: Annotated[str | None, Query(description="A page's next_cursor.")] = None,
    limit: Limit = 100,
) -> JobPage:
    """The tenant's jobs, newest change first, with ``jobledger list``'s filters; the
    status view is brought up to date with the log first. A page that is full says
    where the next one starts (``next_cursor``): keyset paging, stable however many
    jobs change meanwhile."""
    tenant_scope(caller, tenant, None)
    query = JobQuery(
        tenant_id=tenant,
        status_in=_statuses(status),
        workflow_type=workflow,
        workflow_version=version,
        mission_id=mission,
        correlation_id=correlation,
        created_after=created_after,
        created_before=created_before,
        updated_after=updated_after,
        updated_before=updated_before,
        after=after,
        limit=limit,
    )
    views: JobViews = request.app.state.views
    with request.app.state.views_lock:
        views.catch_up()
    rows = views.jobs(query)
    blocked = views.blocked_notes(rows)
    return JobPage(
        jobs=[JobRow.of(row, blocked.get(row.job_uuid)) for row in rows],
        next_cursor=cursor(rows[-1]) if len(rows) == limit else None,
    )


def _statuses(raw: str | None) -> list[str]:
    try:
        return parse_statuses(raw)
    except UnknownStatusError as error:
        names = ", ".join(map(repr, error.unknown))
        detail = f"unknown status {names} (known: {', '.join(error.known)})"
        raise Problem(400, detail, error="InvalidPayloadError") from None


@router.get(JOB, response_model=JobWithFamily, responses=documented(403, 404, 410))
def get_job(
    tenant: str, job: str, caller: Caller, engine: EngineDep, request: Request
) -> JobWithFamily:
    """The job now, with its open approval request and wait, its parent and children,
    and why a worker left it untouched (``blocked``), if that still applies. An archived
    job is 410 Gone, its ``tombstone`` in the problem."""
    tenant_scope(caller, tenant, None, job_id=job)
    view = engine.job(tenant, job)
    views: JobViews = request.app.state.views
    blocked = views.blocked_note(str(job_uuid(tenant, job)), view.version)
    return JobWithFamily.of_family(view, engine.family(tenant, job), blocked)


@router.get(f"{JOB}/history", response_model=HistoryPage, responses=NOT_FOUND)
def history(
    tenant: str,
    job: str,
    caller: Caller,
    engine: EngineDep,
    after: Annotated[int, Query(ge=0, description="Events after this version.")] = 0,
    limit: Limit = 100,
) -> HistoryPage:
    """The job's events in order, each with its chain hash, a page at a time."""
    tenant_scope(caller, tenant, None, job_id=job)
    # One more than the page: whether there is a next page, without reading the rest.
    entries = engine.history(tenant, job, after=after, limit=limit + 1)
    page = entries[:limit]
    more = len(entries) > limit
    return HistoryPage(
        events=[Event.of(entry) for entry in page],
        next_version=page[-1].version if more else None,
    )


@router.get(
    f"{JOB}/at",
    response_model=Job,
    responses=NOT_FOUND,
)
def job_at(
    tenant: str,
    job: str,
    caller: Caller,
    engine: EngineDep,
    version: Annotated[int | None, Query(ge=1, description="Right after this event.")] = None,
    at: Annotated[
        datetime | None, Query(description="After its last event at or before this time.")
    ] = None,
) -> Job:
    """Time travel: the job exactly as it was at a version or a time."""
    tenant_scope(caller, tenant, None, job_id=job)
    if (version is None) == (at is None):
        raise Problem(400, "give exactly one of version and at", error="InvalidPayloadError")
    if at is not None and at.tzinfo is None:
        raise Problem(400, "at needs a timezone (e.g. ...Z)", error="InvalidPayloadError")
    return Job.of(engine.job_at(tenant, job, version=version, at=at))
