"""Repairing a job (operator): retry a failed one, reset one to an earlier step, fork one
at a step (``engine.repair_commands``). Who repairs is the authenticated caller, never a
field of the body; the repair rules (``jobledger.domain.repair``) decide the rest: a job
in a status the repair does not take is a 409, a step out of range a 422, a version whose
replay diverges a 409 naming the first difference."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter
from pydantic import BaseModel, Field

from jobledger.api.auth import Role
from jobledger.api.deps import Caller, EngineDep, tenant_scope
from jobledger.api.models import Body, Job
from jobledger.api.paths import JOB
from jobledger.api.problems import EVERY_REQUEST, documented
from jobledger.engine.repair_commands import Repaired

router = APIRouter(tags=["repair"], responses=EVERY_REQUEST)

REFUSALS = documented(403, 404, 409, 422)
LARGEST = 2**63 - 1
"""The largest number a store holds: a larger step or version is a 422, not a crash."""


class RetryRequest(Body):
    reason: str = Field(min_length=1, max_length=10_000)
    to_version: int | None = Field(default=None, ge=1, le=LARGEST)
    """Run on this definition version, if the recorded steps replay the same on it."""


class ResetRequest(RetryRequest):
    step: int = Field(ge=0, le=LARGEST)
    """Run again from after this step (0: from the start)."""


class ForkRequest(ResetRequest):
    new_job_id: str = Field(min_length=1, max_length=200)
    input_patch: dict[str, Any] | None = None
    """Merged over the state the fork starts with."""


class RepairResult(BaseModel):
    job: Job
    """The job that runs now: the repaired job, or the fork."""
    replay_verdict: str
    origin: Job | None = None
    """For a fork: the job it was forked from, naming the fork."""

    @classmethod
    def of(cls, repaired: Repaired) -> RepairResult:
        origin = Job.of(repaired.origin) if repaired.origin is not None else None
        return cls(job=Job.of(repaired.job), replay_verdict=repaired.replay_verdict, origin=origin)


@router.post(f"{JOB}/retry", response_model=RepairResult, responses=REFUSALS)
def retry(
    tenant: str, job: str, body: RetryRequest, caller: Caller, engine: EngineDep
) -> RepairResult:
    """Reopen a failed job at the step that failed (operator), as a new attempt under
    the same step key."""
    tenant_scope(caller, tenant, Role.OPERATOR, job_id=job)
    repaired = engine.retry(
        tenant, job, by=caller.subject, reason=body.reason, to_version=body.to_version
    )
    return RepairResult.of(repaired)


@router.post(f"{JOB}/reset", response_model=RepairResult, responses=REFUSALS)
def reset(
    tenant: str, job: str, body: ResetRequest, caller: Caller, engine: EngineDep
) -> RepairResult:
    """Run the job again from after a step (operator): the later steps re-run under a new
    epoch, with new step keys."""
    tenant_scope(caller, tenant, Role.OPERATOR, job_id=job)
    repaired = engine.reset(
        tenant, job, body.step, by=caller.subject, reason=body.reason, to_version=body.to_version
    )
    return RepairResult.of(repaired)


@router.post(f"{JOB}/fork", response_model=RepairResult, responses=REFUSALS)
def fork(
    tenant: str, job: str, body: ForkRequest, caller: Caller, engine: EngineDep
) -> RepairResult:
    """A new job from this one after a step (operator), with the state then; each
    history names the other. The same fork asked again returns it."""
    tenant_scope(caller, tenant, Role.OPERATOR, job_id=job)
    repaired = engine.fork(
        tenant,
        job,
        body.step,
        new_job_id=body.new_job_id,
        by=caller.subject,
        reason=body.reason,
        input_patch=body.input_patch,
        to_version=body.to_version,
    )
    return RepairResult.of(repaired)
