"""Admission: which queued jobs may start now, fairly across tenants.

A submitted job waits in the admission table (the store's, so a restart loses none)
until a pass admits it; only then is its first tick sent. A pass fills the fleet's
window of starting jobs round-robin across tenants, the tenant with the fewest jobs
running first, and within a tenant by priority, then age. So a tenant's deep backlog
never reaches the tick queue ahead of another tenant's few jobs: a Kafka partition is
FIFO, and fairness has to be decided before a tick is published.

Aging keeps it starvation-free: a priority level is worth ``aging_seconds`` of waiting,
so a job's place is its queue time moved earlier by that much per level (its rank),
one index-friendly number.
"""

from __future__ import annotations

import heapq
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime

from jobledger.config import ConcurrencyLimit, EngineConfig
from jobledger.domain.errors import InvalidPayloadError

DEFAULT_PRIORITY = 5
LOWEST_PRIORITY, HIGHEST_PRIORITY = 0, 9

UNWINDOWED_BATCH = 1_000
"""The most jobs one pass admits when there is no window (only limits)."""

Group = tuple[str, str]
"""(tenant, workflow type): the unit limits are kept for."""


def check_priority(priority: object) -> int:
    """A job's priority: a whole number 0-9, higher runs first."""
    if isinstance(priority, bool) or not isinstance(priority, int):
        raise InvalidPayloadError(f"priority must be a whole number 0-9, got {priority!r}")
    if not LOWEST_PRIORITY <= priority <= HIGHEST_PRIORITY:
        raise InvalidPayloadError(f"priority must be 0-9 (9 runs first), got {priority}")
    return priority


def rank(queued_at: datetime, priority: int, aging_seconds: float) -> int:
    """Microseconds; the lowest is admitted first. Job a outranks job b when
    ``p_a + waited_a / aging > p_b + waited_b / aging``, which is this order."""
    micros = round(queued_at.timestamp() * 1_000_000)
    return micros - round(priority * aging_seconds * 1_000_000)


@dataclass(frozen=True)
class Queued:
    """A job in the admission table."""

    job_uuid: str
    tenant_id: str
    job_id: str
    workflow_type: str
    priority: int
    rank: int

    @property
    def group(self) -> Group:
        return (self.tenant_id, self.workflow_type)


@dataclass(frozen=True)
class Occupancy:
    """What is admitted as a pass begins: jobs not yet ended by group (limits), and of
    those, the ones not parked in a wait (the window)."""

    running: Mapping[Group, int]
    in_flight: int


class Policy:
    """The window and the limits, as the config states them."""

    def __init__(self, config: EngineConfig) -> None:
        self.window = config.admission.admission_window
        self.aging_seconds = config.admission.priority_aging_seconds
        self.limits = tuple(config.admission.concurrency_limits)

    @property
    def enabled(self) -> bool:
        """Whether any job goes through the gate at all (a window, or a limit)."""
        return self.window > 0 or any(limit.max_running is not None for limit in self.limits)

    def gates(self, tenant_id: str, workflow_type: str) -> bool:
        """Whether this tenant's jobs of this workflow wait to be admitted: always under a
        window, else only when a limit applies to them."""
        if self.window > 0:
            return True
        limits = (self.tenant_limit(tenant_id), self.workflow_limit(tenant_id, workflow_type))
        return any(limit is not None for limit in limits)

    def free(self, in_flight: int) -> int:
        """How many more jobs the window takes (without one, a pass's batch)."""
        return self.window - in_flight if self.window > 0 else UNWINDOWED_BATCH

    def tenant_limit(self, tenant_id: str) -> int | None:
        return _tightest(self.limits, tenant_id, None)

    def workflow_limit(self, tenant_id: str, workflow_type: str) -> int | None:
        return _tightest(self.limits, tenant_id, workflow_type)

    def steps_per_second(self, tenant_id: str, workflow_type: str) -> list[tuple[str, float]]:
        """The step rates that apply, each with the key its bucket is kept under."""
        rates = []
        for limit in self.limits:
            if limit.max_steps_per_second is None or limit.tenant not in ("*", tenant_id):
                continue
            if limit.workflow not in (None, workflow_type):
                continue
            scope = tenant_id if limit.workflow is None else f"{tenant_id}\x1f{workflow_type}"
            rates.append((scope, limit.max_steps_per_second))
        return rates

    def choose(self, candidates: Sequence[Queued], occupancy: Occupancy) -> list[Queued]:
        """The jobs to admit now: round-robin across tenants (fewest running first, then
        the best rank), each tenant's best rank first, within the window and the limits.
        ``candidates`` holds each group's best waiting jobs."""
        free = self.free(occupancy.in_flight)
        by_tenant: dict[str, list[Queued]] = {}
        for job in sorted(candidates, key=lambda job: job.rank):
            by_tenant.setdefault(job.tenant_id, []).append(job)
        tenant_running: Counter[str] = Counter()
        for (tenant, _), count in occupancy.running.items():
            tenant_running[tenant] += count
        group_running = Counter(occupancy.running)
        turns = [(tenant_running[t], jobs[0].rank, t) for t, jobs in by_tenant.items()]
        heapq.heapify(turns)
        chosen: list[Queued] = []
        while free > 0 and turns:
            _, _, tenant = heapq.heappop(turns)
            fitting = self._next_fitting(by_tenant[tenant], tenant_running, group_running)
            if fitting is None:
                continue
            chosen.append(fitting)
            free -= 1
            tenant_running[tenant] += 1
            group_running[fitting.group] += 1
            if by_tenant[tenant]:
                heapq.heappush(turns, (tenant_running[tenant], by_tenant[tenant][0].rank, tenant))
        return chosen

    def _next_fitting(
        self, jobs: list[Queued], tenant_running: Counter[str], group_running: Counter[Group]
    ) -> Queued | None:
        """Take the tenant's best job whose workflow is under its limit (None: the tenant
        is at its own limit, or every workflow it waits in is at theirs)."""
        while jobs:
            tenant = jobs[0].tenant_id
            limit = self.tenant_limit(tenant)
            if limit is not None and tenant_running[tenant] >= limit:
                return None
            job = jobs.pop(0)
            cap = self.workflow_limit(tenant, job.workflow_type)
            if cap is None or group_running[job.group] < cap:
                return job
        return None

    def why_waiting(self, job: Queued, occupancy: Occupancy, ahead: int) -> str:
        """Why a queued job has not started, for ``show``."""
        running = sum(n for (t, _), n in occupancy.running.items() if t == job.tenant_id)
        limit = self.tenant_limit(job.tenant_id)
        if limit is not None and running >= limit:
            return f"queued: tenant {job.tenant_id} at its limit of {limit} running jobs"
        cap = self.workflow_limit(job.tenant_id, job.workflow_type)
        if cap is not None and occupancy.running.get(job.group, 0) >= cap:
            return (
                f"queued: tenant {job.tenant_id}'s workflow {job.workflow_type} at its limit "
                f"of {cap} running jobs"
            )
        if self.window > 0 and occupancy.in_flight >= self.window:
            return (
                f"queued: the fleet's window of {self.window} starting jobs is full; shared "
                f"round-robin across tenants as they end ({ahead} of this tenant's ahead)"
            )
        return f"queued: waiting for admission ({ahead} of this tenant's jobs ahead)"


def _tightest(
    limits: Sequence[ConcurrencyLimit], tenant_id: str, workflow: str | None
) -> int | None:
    """The smallest max_running among the limits on exactly this scope (a tenant's own,
    or ``*``'s, for each tenant)."""
    found = [
        limit.max_running
        for limit in limits
        if limit.max_running is not None
        and limit.tenant in ("*", tenant_id)
        and limit.workflow == workflow
    ]
    return min(found, default=None)
