"""Which jobs a bulk action acts on: a query over the status view, as ``jobledger jobs``
and ``GET /v1/jobs`` filter, plus the failure reason (a piece of the job's last error).

A query is always within one tenant; one that names nothing beyond it matches every job
of the tenant, and must say so (``all``), or it is refused before anything is written.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from jobledger.domain.errors import InvalidPayloadError, UnboundedBulkError
from jobledger.domain.status import TERMINAL_STATUSES, UnknownStatusError, parse_statuses
from jobledger.projections.job_views import JobQuery, JobViews, cursor
from jobledger.projections.status import StatusRow

PAGE = 1_000
"""Rows read from the view at a time while a query is matched."""
MAX_JOB_IDS = 10_000


class BulkQuery(BaseModel):
    """What a bulk action selects. Every field narrows; ``all`` is the consent to a query
    that narrows nothing. ``finished_*`` is the time a finished job finished (its last
    change): only finished jobs match it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    workflow_type: str | None = None
    workflow_version: int | None = Field(default=None, ge=1)
    status: tuple[str, ...] = ()
    submitted_after: datetime | None = None
    submitted_before: datetime | None = None
    finished_after: datetime | None = None
    finished_before: datetime | None = None
    mission_id: str | None = None
    correlation_id: str | None = None
    error_contains: str | None = Field(default=None, min_length=1)
    job_ids: tuple[str, ...] = Field(default=(), max_length=MAX_JOB_IDS)
    """Only these jobs (a selection someone made, in the console say)."""
    all: bool = False

    @classmethod
    def parse(cls, fields: dict[str, Any]) -> BulkQuery:
        """From JSON (a caller's dict): InvalidPayloadError naming a field that is wrong.
        What the fields ask for together is :meth:`check`'s."""
        try:
            query = cls.model_validate(fields)
        except ValidationError as error:
            problems = "; ".join(
                f"{'.'.join(str(p) for p in e['loc']) or 'query'}: {e['msg']}"
                for e in error.errors()
            )
            raise InvalidPayloadError(f"bad bulk query: {problems}") from None
        return query

    def check(self) -> None:
        """The statuses are statuses, a version has its type, and the query narrows
        (or says ``all``)."""
        try:
            parse_statuses(",".join(self.status) or None)
        except UnknownStatusError as error:
            raise InvalidPayloadError(str(error)) from None
        if self.workflow_version is not None and self.workflow_type is None:
            raise InvalidPayloadError("a workflow version needs its workflow type")
        narrowing = self.model_dump(exclude={"all"}, exclude_defaults=True)
        if not narrowing and not self.all:
            raise UnboundedBulkError(
                "the query matches every job of the tenant: narrow it (workflow, status, "
                "times, mission, correlation, error, job ids) or say all"
            )

    def document(self) -> dict[str, Any]:
        """As stored in the batch and shown: the fields given, times in ISO 8601."""
        return self.model_dump(mode="json", exclude_defaults=True)

    def _view_query(self, tenant_id: str, after: str | None) -> JobQuery:
        finished = self.finished_after is not None or self.finished_before is not None
        statuses = list(self.status)
        if finished:
            terminal = sorted(str(s) for s in TERMINAL_STATUSES)
            statuses = [s for s in statuses if s in terminal] if statuses else terminal
            if not statuses:  # asked for finished jobs in statuses that never finish
                statuses = ["-"]
        return JobQuery(
            tenant_id=tenant_id,
            status_in=statuses,
            workflow_type=self.workflow_type,
            workflow_version=self.workflow_version,
            mission_id=self.mission_id,
            correlation_id=self.correlation_id,
            created_after=self.submitted_after,
            created_before=self.submitted_before,
            updated_after=self.finished_after,
            updated_before=self.finished_before,
            after=after,
            limit=PAGE,
        )

    def rows(self, views: JobViews, tenant_id: str) -> Iterator[StatusRow]:
        """The matching jobs, newest change first, read page by page from the view."""
        after: str | None = None
        chosen = set(self.job_ids)
        while True:
            page = views.jobs(self._view_query(tenant_id, after))
            for row in page:
                if chosen and row.job_id not in chosen:
                    continue
                if self.error_contains is None or self.error_contains in (row.last_error or ""):
                    yield row
            if len(page) < PAGE:
                return
            after = cursor(page[-1])
