"""Tenant spend per UTC day: the one fold every reader of spend applies (the durable
spend view and the in-memory Cost adapter), so they cannot disagree on what counts."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, date
from decimal import Decimal

from jobledger.domain.job import Job


@dataclass(frozen=True)
class Spend:
    tenant_id: str
    day: date
    """The UTC day the step ended on."""
    usd: Decimal


def spend_of(tenant_id: str, event: Job.Event) -> Spend | None:
    """What ``event`` of a job of ``tenant_id`` adds to the tenant's spend: a recorded
    step's cost, on the UTC day it ended; nothing for any other event."""
    if not isinstance(event, Job.StepRecorded) or not event.cost_usd:
        return None
    return Spend(tenant_id, event.ended_at.astimezone(UTC).date(), event.cost_usd)
