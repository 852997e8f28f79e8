"""Parents and children at run time: spawning a map step's children, telling a parent
when a child ends, meeting or failing its join, and cancelling children nobody waits for.

Every write here is a version-guarded append of one job, decided again on a fresh load
when another writer got there first, so it is safe to repeat: a child's end is recorded
in its parent once (the parent refuses a second record of the same child), a child is
spawned once (its job id and submit key derive from the parent's step). The primary
path is the engine's: a child's terminal commit is followed at once by the report to its
parent. Should the process die in between, or mid-spawn, the parent's next tick (the
reconciler's backstop looks at a join that has not moved for a while) repairs both.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from typing import Any, Protocol

from jobledger.domain import fan_out
from jobledger.domain.errors import DeploymentError, VersionConflict
from jobledger.domain.identity import job_uuid
from jobledger.domain.job import JSON, Job
from jobledger.domain.status import JobStatus
from jobledger.orchestration.ports import Clock, JobStore

APPEND_ATTEMPTS = 50
"""How often an append to a parent or child is decided again after losing a race."""
CANCELLED_BY = "jobledger:parent"


class Spawner(Protocol):
    """Submits one child of ``parent`` as ``plan`` names it (``children.plans``),
    idempotently: a child that exists already is left as it is."""

    def __call__(self, parent: Job, plan: JSON) -> None: ...


class Reporter(Protocol):
    def __call__(self, job: Job, event_type: str, **metadata: Any) -> None: ...


@dataclass(eq=False)  # eq=False: compared and hashed by identity, as a plain class is
class Family:
    """The orchestrator's part that acts on parents and children (one per engine)."""

    store: JobStore
    clock: Clock
    report: Reporter
    wake: Callable[[Job, str], None]
    """Enqueues the tick of a job that an append here made runnable."""
    spawner: Spawner | None
    """The engine's submit of a child; without one a map step is a deployment error."""

    # ---- the parent's side --------------------------------------------------------------

    def catch_up(self, parent: Job) -> Job:
        """Spawn the children of the open join that do not exist yet, record the ends of
        those that finished unreported, and decide the join. Returns the parent as stored."""
        if parent.join is None:
            return parent
        for plan in fan_out.unfinished(parent.children):
            if plan.get(fan_out.SUPERSEDED):
                continue
            child = self._load(parent.tenant_id, plan["job_id"])
            if child is None:
                self._spawn(parent, plan)
            elif child.status.is_terminal:
                parent = self._record_end(parent, child)
        return self._decide(parent)

    def check_spawner(self, parent: Job) -> None:
        if self.spawner is None:
            raise DeploymentError(
                f"job {parent.job_id!r} reached a map step, and this engine cannot submit jobs"
            )

    def _spawn(self, parent: Job, plan: JSON) -> None:
        self.check_spawner(parent)
        assert self.spawner is not None
        self.spawner(parent, plan)
        self.report(
            parent,
            "job.child.spawned",
            childJobId=plan["job_id"],
            index=plan["index"],
            stepNumber=plan["step_number"],
        )

    def _decide(self, parent: Job) -> Job:
        """Join (or fail) the parent if its children's ends decide its join."""

        decided: list[fan_out.Verdict] = []

        def decide(job: Job) -> bool:
            if job.status is not JobStatus.WAITING_CHILDREN or job.join is None:
                return False
            verdict = fan_out.verdict(job.join, job.children)
            if verdict is None:
                return False
            decided.append(verdict)
            now = self.clock.now()
            if verdict.joined:
                results = fan_out.results(job.join, job.children)
                job.join_children(results=results, next_step=job.join["next_step"], now=now)
            else:
                job.fail(error=verdict.reason, cause="children", now=now)
            return True

        job, changed = self._apply(parent, decide)
        if changed:
            reason = decided[-1].reason
            if job.status is JobStatus.QUEUED:
                self.report(job, "job.children.joined", stepNumber=job.current_step, reason=reason)
            else:
                self.report(job, "job.failed", error=reason, cause="children")
            self.wake(job, "children_joined")
            self.settle(job)
        return job

    # ---- the child's side ---------------------------------------------------------------

    def settle(self, job: Job) -> None:
        """What a job's new status means for its family: a finished child is reported to
        its parent; children nobody waits for any more (the parent finished, or their
        join was met or timed out) are cancelled."""
        if job.status.is_terminal and job.parent is not None:
            self._notify_parent(job)
        for plan in self._abandoned(job):
            self._cancel_child(job, plan)

    def _abandoned(self, job: Job) -> Iterator[JSON]:
        open_step = None if job.join is None else job.join["step_number"]
        for plan in fan_out.unfinished(job.children):
            superseded = plan.get(fan_out.SUPERSEDED, False)
            if job.status.is_terminal or plan["step_number"] != open_step or superseded:
                yield plan

    def _notify_parent(self, child: Job) -> None:
        link = child.parent
        assert link is not None
        parent = self._load(child.tenant_id, link["job_id"])
        if parent is None or parent.status.is_terminal:
            return
        parent = self._record_end(parent, child)
        self._decide(parent)

    def _record_end(self, parent: Job, child: Job) -> Job:
        result, error = fan_out.ended(child.status, child.state, child.last_error)
        cost = child.total_cost_usd + child.children_cost_usd

        def record(job: Job) -> bool:
            known = job.children.get(child.job_id)
            if job.status.is_terminal or known is None or known["end"] is not None:
                return False
            job.record_child_end(
                child_job_id=child.job_id,
                status=str(child.status),
                result=result,
                error=error,
                cost_usd=cost,
                now=self.clock.now(),
            )
            return True

        job, changed = self._apply(parent, record)
        if changed:
            self.report(
                job, "job.child.finished", childJobId=child.job_id, childStatus=str(child.status)
            )
        return job

    def _cancel_child(self, parent: Job, plan: JSON) -> None:
        child = self._load(parent.tenant_id, plan["job_id"])
        if child is None:
            return  # never spawned: nothing runs
        why = (
            f"parent {parent.job_id} is {parent.status}"
            if parent.status.is_terminal
            else f"parent {parent.job_id} no longer waits for it"
        )

        def cancel(job: Job) -> bool:
            if job.status.is_terminal:
                return False
            job.cancel(reason=why, cancelled_by=CANCELLED_BY, now=self.clock.now())
            return True

        child, changed = self._apply(child, cancel)
        if changed:
            self.report(child, "job.cancelled", reason=why, cancelledBy=CANCELLED_BY)
        self.settle(child)

    # ---- appends ------------------------------------------------------------------------

    def _apply(self, job: Job, change: Callable[[Job], bool]) -> tuple[Job, bool]:
        """Decide ``change`` on the job and append it; on a lost race, on a fresh load."""
        for _ in range(APPEND_ATTEMPTS):
            if not change(job):
                return job, False
            try:
                self.store.append(job)
            except VersionConflict:
                fresh = self.store.load(job.id)
                assert fresh is not None
                job = fresh
                continue
            return job, True
        raise VersionConflict(f"job {job.job_id!r} kept changing; its family update is retried")

    def _load(self, tenant_id: str, job_id: str) -> Job | None:
        return self.store.load(job_uuid(tenant_id, job_id))


def child_budget(parent: Job, now: datetime) -> JSON:
    """A child may spend what its parent has left, and must end by its deadline."""
    budget: JSON = {}
    limit = parent.budget.max_cost_usd
    if limit is not None:
        spent = parent.total_cost_usd + parent.children_cost_usd
        budget["max_cost_usd"] = str(max(Decimal(0), limit - spent))
    if parent.deadline_at is not None and parent.deadline_at > now:
        budget["deadline_at"] = parent.deadline_at.isoformat()
    return budget
