"""The schedule routes' request and response bodies (pydantic: validated at the boundary,
and the OpenAPI document's schemas). Their fields are ``jobledger schedule ... --json``'s;
a schedule's are its view's (``ScheduleView``), so they are declared there only."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Self

from pydantic import BaseModel, Field
from pydantic.dataclasses import dataclass

from jobledger.api.models import Body
from jobledger.domain.schedule import MAX_CATCH_UP, CatchUp, Overlap, ScheduleEntry, ScheduleView
from jobledger.engine.schedule_commands import MAX_NAME_LENGTH
from jobledger.presentation.json_output import jsonable
from jobledger.projections.schedules import ScheduleRow


class ScheduleRequest(Body):
    """A schedule to create: each time of ``cron`` on ``timezone``'s clock submits a
    ``workflow_type`` job with ``input``."""

    name: str = Field(min_length=1, max_length=MAX_NAME_LENGTH)
    cron: str = Field(min_length=1, max_length=200, examples=["0 7 * * 1-5"])
    """Five cron fields."""
    timezone: str = Field(min_length=1, max_length=100, examples=["Europe/Paris"])
    """An IANA time zone."""
    workflow_type: str = Field(min_length=1, max_length=200)
    workflow_version: int | None = Field(default=None, ge=1)
    """Default: the newest definition at each firing."""
    input: dict[str, Any] | None = None
    catch_up: CatchUp = CatchUp.SKIP
    """Firings missed while nothing ran: skip them, fire the latest one, or all."""
    catch_up_max: int | None = Field(default=None, ge=1, le=MAX_CATCH_UP)
    """With ``catch_up: all`` (and only then): fire at most the latest N missed firings."""
    overlap: Overlap = Overlap.ALLOW
    """While the previous job runs: fire anyway, skip, or keep one firing for when it ends."""


@dataclass(frozen=True)
class Schedule(ScheduleView):
    """A schedule now, with its input: what ``jobledger schedule create --json`` prints."""

    @classmethod
    def of_view(cls, view: ScheduleView) -> Self:
        return cls(**vars(view))


class ScheduleSummary(BaseModel):
    """A schedule as the schedules view lists it (no input): ``schedule list --json``."""

    tenant_id: str
    name: str
    cron: str
    timezone: str
    workflow_type: str
    workflow_version: int | None
    catch_up: str
    catch_up_max: int
    overlap: str
    state: str
    next_fire_at: datetime | None
    next_fire_local: datetime | None
    buffered_fire_at: datetime | None
    last_job_id: str | None
    last_fired_at: datetime | None
    fired: int
    skipped: int
    created_at: datetime
    updated_at: datetime
    version: int

    @classmethod
    def of(cls, row: ScheduleRow) -> Self:
        next_at, local = row.schedule.next_firing()
        return cls.model_validate(
            {**jsonable(row), "next_fire_at": next_at, "next_fire_local": local}
        )


class ScheduleList(BaseModel):
    schedules: list[ScheduleSummary]
    """By name."""


class ManualFiring(BaseModel):
    """A manual firing: the job it submitted, and the schedule after it."""

    job_id: str
    schedule: Schedule


class ScheduleEvent(BaseModel):
    """One event of a schedule's history: ``Created``, ``Fired`` (with its job and
    trigger), ``Skipped`` (with the reason), ``Paused``, ``Resumed``, ``Deleted``..."""

    version: int
    event_type: str
    timestamp: datetime
    data: dict[str, Any]

    @classmethod
    def of(cls, entry: ScheduleEntry) -> Self:
        return cls.model_validate(jsonable(entry))


class ScheduleHistory(BaseModel):
    events: list[ScheduleEvent]
