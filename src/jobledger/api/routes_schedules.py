"""Schedules: create, list, read, pause, resume, trigger, delete, and their history.

Operators change schedules; every role reads them. A schedule of a tenant the caller
cannot see is answered exactly as one that does not exist (404, the same words)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, Request, Response

from jobledger.api.auth import Principal, Role
from jobledger.api.deps import Caller, EngineDep, tenant_scope
from jobledger.api.paths import SCHEDULE, SCHEDULES, id_path
from jobledger.api.problems import EVERY_REQUEST, Problem, documented
from jobledger.api.schedule_models import (
    ManualFiring,
    Schedule,
    ScheduleEvent,
    ScheduleHistory,
    ScheduleList,
    ScheduleRequest,
    ScheduleSummary,
)
from jobledger.domain.errors import UnknownScheduleError
from jobledger.projections import JobViews

router = APIRouter(tags=["schedules"], responses=EVERY_REQUEST)

NOT_FOUND = documented(403, 404)
CHANGED = documented(403, 404, 409)
"""409: a name taken (``ScheduleExistsError``), or a command that does not apply to the
schedule as it is (``ScheduleStateError``)."""


def _scope(who: Principal, tenant: str, role: Role | None, name: str) -> None:
    """``tenant_scope``, but a tenant the caller cannot see is answered as a schedule
    that does not exist, so names do not leak."""
    if not who.sees(tenant):
        error = UnknownScheduleError(tenant, name)
        raise Problem(404, str(error), error=type(error).__name__)
    tenant_scope(who, tenant, role)


@router.post(SCHEDULES, response_model=Schedule, status_code=201, responses=CHANGED)
def create_schedule(
    tenant: str, body: ScheduleRequest, caller: Caller, engine: EngineDep, response: Response
) -> Schedule:
    """Create a schedule (operator). Everything is checked before anything is written:
    a bad cron, time zone, policy, input or workflow is 400 naming it; a name taken (a
    deleted schedule keeps its name) is 409 ``ScheduleExistsError``."""
    tenant_scope(caller, tenant, Role.OPERATOR)
    view = engine.schedules.create(
        tenant,
        body.name,
        cron=body.cron,
        timezone=body.timezone,
        workflow_type=body.workflow_type,
        workflow_version=body.workflow_version,
        input=body.input,
        catch_up=str(body.catch_up),
        catch_up_max=body.catch_up_max,
        overlap=str(body.overlap),
    )
    response.headers["Location"] = f"/v1/tenants/{id_path(tenant)}/schedules/{id_path(view.name)}"
    return Schedule.of_view(view)


@router.get(SCHEDULES, response_model=ScheduleList, responses=NOT_FOUND)
def list_schedules(
    tenant: str,
    caller: Caller,
    request: Request,
    deleted: Annotated[bool, Query(description="Deleted schedules too.")] = False,
) -> ScheduleList:
    """The tenant's schedules by name, from the schedules view (brought up to date with
    the log first), each with its next firing in UTC and on its own clock."""
    tenant_scope(caller, tenant, None)
    views: JobViews = request.app.state.views
    with request.app.state.views_lock:
        views.catch_up()
    rows = views.tenant_schedules(tenant, deleted=deleted)
    return ScheduleList(schedules=[ScheduleSummary.of(row) for row in rows])


@router.get(SCHEDULE, response_model=Schedule, responses=NOT_FOUND)
def get_schedule(tenant: str, name: str, caller: Caller, engine: EngineDep) -> Schedule:
    """The schedule now, with its input and its next firing in UTC and local time."""
    _scope(caller, tenant, None, name)
    return Schedule.of_view(engine.schedules.get(tenant, name))


@router.post(f"{SCHEDULE}/pause", response_model=Schedule, responses=CHANGED)
def pause_schedule(tenant: str, name: str, caller: Caller, engine: EngineDep) -> Schedule:
    """Stop firing until resumed (operator; a manual trigger still fires)."""
    _scope(caller, tenant, Role.OPERATOR, name)
    return Schedule.of_view(engine.schedules.pause(tenant, name))


@router.post(f"{SCHEDULE}/resume", response_model=Schedule, responses=CHANGED)
def resume_schedule(tenant: str, name: str, caller: Caller, engine: EngineDep) -> Schedule:
    """Fire again from the next cron time (operator); what was missed while paused is not
    caught up."""
    _scope(caller, tenant, Role.OPERATOR, name)
    return Schedule.of_view(engine.schedules.resume(tenant, name))


@router.post(f"{SCHEDULE}/trigger", response_model=ManualFiring, status_code=201, responses=CHANGED)
def trigger_schedule(
    tenant: str, name: str, caller: Caller, engine: EngineDep, response: Response
) -> ManualFiring:
    """Fire now (operator), outside the cron and its overlap policy, under a key of its
    own: 201 with the job submitted (a worker runs it) and, as a submit, its ``Location``;
    the next cron firing is unchanged."""
    _scope(caller, tenant, Role.OPERATOR, name)
    job_id = engine.schedules.trigger(tenant, name)
    response.headers["Location"] = f"/v1/jobs/{id_path(tenant, job_id)}"
    return ManualFiring(
        job_id=job_id, schedule=Schedule.of_view(engine.schedules.get(tenant, name))
    )


@router.delete(SCHEDULE, response_model=Schedule, responses=CHANGED)
def delete_schedule(tenant: str, name: str, caller: Caller, engine: EngineDep) -> Schedule:
    """Never fire again (operator); the history, and the name, are kept."""
    _scope(caller, tenant, Role.OPERATOR, name)
    return Schedule.of_view(engine.schedules.delete(tenant, name))


@router.get(f"{SCHEDULE}/history", response_model=ScheduleHistory, responses=NOT_FOUND)
def schedule_history(tenant: str, name: str, caller: Caller, engine: EngineDep) -> ScheduleHistory:
    """Every event of the schedule in order: each firing with its job and trigger, each
    skip with its reason."""
    _scope(caller, tenant, None, name)
    entries = engine.schedules.history(tenant, name)
    return ScheduleHistory(events=[ScheduleEvent.of(entry) for entry in entries])
