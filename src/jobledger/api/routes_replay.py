"""Replay against a posted definition (auditor): what the job's recorded decisions would
have been under it, step by step, and whether it is safe to migrate to it. The body is
the definition as a file would hold it (JSON, or YAML with a YAML content type), checked
as ``jobledger definitions check`` checks a file. Pure: nothing runs, nothing is written.
The answer is the document ``jobledger replay --json`` prints."""

from __future__ import annotations

import asyncio
from typing import Annotated, Any

from fastapi import APIRouter, Query, Request
from pydantic import BaseModel

from jobledger.api.auth import Role
from jobledger.api.deps import Caller, EngineDep, tenant_scope
from jobledger.api.paths import JOB, TENANT
from jobledger.api.problems import EVERY_REQUEST, Problem, documented
from jobledger.audit.replay import ReplayReport, StepReplay
from jobledger.presentation.json_output import jsonable
from jobledger.workflows.definition import WorkflowDefinition
from jobledger.workflows.loader import parse_definition

router = APIRouter(tags=["audit"], responses=EVERY_REQUEST)

YAML_TYPES = ("application/yaml", "application/x-yaml", "text/yaml", "text/x-yaml")
DEFINITION_BODY: dict[str, Any] = {
    "requestBody": {
        "required": True,
        "description": "A workflow definition, as a definition file holds it.",
        "content": {
            "application/json": {"schema": {"type": "object"}},
            "application/yaml": {"schema": {"type": "string"}},
        },
    }
}
REFUSALS = documented(403, 404, 415)
"""400 also names every problem of an invalid definition, or one of another type."""


class StepDiff(BaseModel):
    step_number: int
    event_version: int
    outcome: str
    """``same``, or what differs."""
    differences: list[str]
    recorded: dict[str, Any]
    replayed: dict[str, Any]

    @classmethod
    def of(cls, step: StepReplay) -> StepDiff:
        document: dict[str, Any] = jsonable(step)
        document["outcome"] = step.outcome
        document["recorded"]["description"] = step.recorded.describe()
        document["replayed"]["description"] = step.replayed.describe()
        return cls.model_validate(document)


class Replay(BaseModel):
    """A job replayed against the definition: ``jobledger replay --json``'s document."""

    tenant: str
    job: str
    job_uuid: str
    workflow_type: str
    recorded_version: int
    definition_version: int
    status: str
    events: int
    safe: bool
    finished: bool
    migratable: bool
    verdict: str
    diverged_at_step: int | None
    steps: list[StepDiff]

    @classmethod
    def of(cls, report: ReplayReport) -> Replay:
        return cls(
            tenant=report.tenant_id,
            job=report.job_id,
            job_uuid=str(report.job_uuid),
            workflow_type=report.workflow_type,
            recorded_version=report.recorded_version,
            definition_version=report.definition_version,
            status=report.status,
            events=report.events,
            safe=report.safe,
            finished=report.finished,
            migratable=report.migratable,
            verdict=report.verdict,
            diverged_at_step=report.diverged_at.step_number if report.diverged_at else None,
            steps=[StepDiff.of(step) for step in report.steps],
        )


@router.post(
    f"{JOB}/replay",
    response_model=Replay,
    responses=REFUSALS,
    openapi_extra=DEFINITION_BODY,
)
async def replay_job(
    tenant: str, job: str, request: Request, caller: Caller, engine: EngineDep
) -> Replay:
    """Replay the job's recorded decisions against the posted definition (auditor)."""
    tenant_scope(caller, tenant, Role.AUDITOR, job_id=job)
    definition = await _definition(request)
    report = await asyncio.to_thread(engine.replay, tenant, job, definition)
    return Replay.of(report)


@router.post(
    f"{TENANT}/replay",
    response_model=list[Replay],
    responses=REFUSALS,
    openapi_extra=DEFINITION_BODY,
)
async def replay_tenant(
    tenant: str,
    request: Request,
    caller: Caller,
    engine: EngineDep,
    status: Annotated[
        list[str] | None, Query(description="Only jobs in these statuses (repeatable).")
    ] = None,
) -> list[Replay]:
    """Replay every job of the tenant of the definition's type against it (auditor),
    sorted by job."""
    tenant_scope(caller, tenant, Role.AUDITOR)
    definition = await _definition(request)
    reports = await asyncio.to_thread(
        engine.replay_all, definition, statuses=status or (), tenant_id=tenant
    )
    return [Replay.of(report) for report in reports]


async def _definition(request: Request) -> WorkflowDefinition:
    """The posted definition, parsed and checked (its problems are the 400)."""
    kind = request.headers.get("content-type", "application/json").split(";")[0].strip()
    if kind != "application/json" and kind not in YAML_TYPES:
        raise Problem(
            415,
            f"post the definition as application/json or application/yaml, not {kind!r}",
            error="InvalidRequest",
        )
    try:
        text = (await request.body()).decode("utf-8")
    except UnicodeDecodeError:
        raise Problem(400, "the definition is not UTF-8 text", error="InvalidRequest") from None
    source = "definition.json" if kind == "application/json" else "definition.yaml"
    return await asyncio.to_thread(parse_definition, text, source)
