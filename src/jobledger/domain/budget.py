"""Job budgets: validated at submit, checked before every step."""

from __future__ import annotations

from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from jobledger.domain.errors import InvalidPayloadError
from jobledger.domain.job import Job


class Budget(BaseModel):
    """What a job may spend: steps, dollars and time. Every limit is optional."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    max_steps: int | None = Field(default=None, ge=1)
    max_cost_usd: Decimal | None = Field(default=None, ge=0)
    deadline_seconds: int | None = Field(default=None, ge=1)
    deadline_at: datetime | None = None

    def stored(self, now: datetime) -> dict[str, Any]:
        """The JSON the job carries: an absolute deadline, so replays never drift."""
        deadline = self.deadline_at
        if deadline is None and self.deadline_seconds is not None:
            deadline = now + timedelta(seconds=self.deadline_seconds)
        stored: dict[str, Any] = {}
        if self.max_steps is not None:
            stored["max_steps"] = self.max_steps
        if self.max_cost_usd is not None:
            stored["max_cost_usd"] = str(self.max_cost_usd)
        if deadline is not None:
            if deadline.tzinfo is None:
                raise InvalidPayloadError("budget deadline_at needs a timezone")
            stored["deadline_at"] = deadline.isoformat()
        return stored


def parse_budget(raw: dict[str, Any], *, now: datetime) -> dict[str, Any]:
    try:
        return Budget.model_validate(raw).stored(now)
    except ValidationError as error:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in error.errors()
        )
        raise InvalidPayloadError(f"invalid job budget: {problems}") from None


def exceeded_limit(job: Job) -> tuple[str, str, str] | None:
    """(limit, used, allowed) for the first limit the job has reached, else None."""
    # What its finished children spent counts toward a parent's limit.
    spent = job.total_cost_usd + job.children_cost_usd
    return job.budget.exceeded(job.total_steps_executed, spent)
