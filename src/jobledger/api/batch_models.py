"""The batch routes' request and response bodies (pydantic: validated at the boundary, and
the OpenAPI document's schemas). Their fields are ``jobledger bulk ... --json``'s and
``jobledger batches ... --json``'s."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal, Self

from pydantic import BaseModel, Field

from jobledger.api.models import Body
from jobledger.domain.batch import BatchView
from jobledger.engine.bulk_commands import BulkPreview
from jobledger.engine.bulk_query import BulkQuery
from jobledger.presentation.json_output import jsonable
from jobledger.projections.batches import BatchRow

Action = Literal["cancel", "signal", "raise-budget", "migrate", "retry", "reset"]


class BatchRequest(Body):
    """One action over the jobs ``query`` matches, by the caller, for ``reason``.
    ``params``: ``signal`` takes ``event_name`` and ``payload``; ``raise-budget``
    ``max_steps``, ``max_cost_usd``, ``deadline_at``; ``migrate`` ``to_version`` and
    ``force``; ``retry`` ``to_version`` (optional); ``reset`` ``step`` (the step number to
    run again after, the same for every job) and ``to_version`` (optional); ``cancel``
    none."""

    action: Action
    query: BulkQuery
    params: dict[str, Any] = Field(default_factory=dict)
    reason: str = Field(min_length=1, max_length=10_000)
    dry_run: bool = False
    """Only count the matched jobs and show the first 10: nothing is written (200)."""


class SampledJob(BaseModel):
    job_id: str
    status: str


class BatchPreview(BaseModel):
    """A dry run: how many jobs the query matches now, and the first 10."""

    dry_run: Literal[True] = True
    action: str
    count: int
    sample: list[SampledJob]

    @classmethod
    def of(cls, preview: BulkPreview) -> Self:
        sample = [SampledJob(job_id=j, status=s) for j, s in preview.sample]
        return cls(action=preview.action, count=preview.count, sample=sample)


class JobOutcomeBody(BaseModel):
    job_id: str
    outcome: Literal["applied", "skipped", "failed"]
    detail: str
    """Why it was skipped, the error it failed with; empty when applied."""
    at: datetime


class Batch(BaseModel):
    """A batch and its progress: each matched job's outcome so far."""

    tenant_id: str
    batch_id: str
    action: str
    params: dict[str, Any]
    query: dict[str, Any]
    by: str
    reason: str
    total: int
    done: int
    applied: int
    skipped: int
    failed: int
    finished: bool
    created_at: datetime
    finished_at: datetime | None
    outcomes: list[JobOutcomeBody]

    @classmethod
    def of(cls, view: BatchView) -> Self:
        return cls.model_validate({**jsonable(view), "done": view.done})


class BatchSummary(BaseModel):
    """A batch as the batches view lists it (no outcomes)."""

    tenant_id: str
    batch_id: str
    action: str
    by_whom: str
    reason: str
    total: int
    applied: int
    skipped: int
    failed: int
    finished: bool
    created_at: datetime
    updated_at: datetime

    @classmethod
    def of(cls, row: BatchRow) -> Self:
        return cls.model_validate(jsonable(row))


class BatchList(BaseModel):
    batches: list[BatchSummary]
