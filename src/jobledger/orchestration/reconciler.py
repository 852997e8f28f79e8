"""The reconciler: the durability backstop that re-enqueues whatever is due.

Ticks can be lost (an in-process queue dies with its process; a delayed tick is never
published). The status projection knows what should happen next, so the reconciler
asks it, by index, for jobs that are due: timers and wait deadlines that have passed,
leases that have lapsed, queued jobs that have sat too long; and, by the same kind of
index, for schedules whose next firing is due (it fires them: ``ScheduleFirer``). Only
one reconciler acts at a time; another waits on the lock and takes over if the first dies.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from jobledger.domain.status import JobStatus
from jobledger.orchestration.ports import (
    Clock,
    DueFilter,
    DueJob,
    DueJobs,
    Lock,
    Ops,
    OpsEvent,
    Queue,
    ScheduleFirer,
    Tick,
)

log = logging.getLogger(__name__)

TIMED_STATUSES = (
    JobStatus.WAITING_TIME,
    JobStatus.WAITING_EVENT,
    JobStatus.AWAITING_APPROVAL,
    JobStatus.BUDGET_EXCEEDED,
    JobStatus.RUNNING,
)
IDLE_STATUSES = (JobStatus.QUEUED, JobStatus.WAITING_CHILDREN)
"""Due once they have not moved for ``lost_tick_after``: a queued job, or a join, may
have lost its tick (or, for a join, a child's report)."""


@dataclass(frozen=True)
class ReconcileResult:
    """The seed's reconcileWaitingTimeJobs result, plus whether this instance acted."""

    scanned: int
    enqueued: int
    skipped: int
    acted: bool = True
    fired: int = 0
    """Jobs submitted by due schedules in this pass."""


@dataclass(kw_only=True, eq=False)  # eq=False: compared and hashed by identity
class Reconciler:
    views: DueJobs
    queue: Queue
    clock: Clock
    lock: Lock
    ops: Ops
    lost_tick_after: timedelta = timedelta(seconds=30)
    resend_after: timedelta = timedelta(minutes=1)
    batch: int = 1_000
    schedules: ScheduleFirer | None = None
    admission: Callable[[], object] | None = None
    """A pass of the admission gate (``Engine.admission_pass``), run each round."""
    workers_take: bool = False
    """The workers take due jobs from the store themselves (:meth:`take`: the local
    transport, where each process has its own queue); a pass then leaves jobs to them."""
    take_hold: timedelta = timedelta(seconds=15)
    """How long a taken job is left to its taker before another may take it, should the
    taker die before its tick appends (the lease's length by default)."""
    sent: dict[tuple[str, int], datetime] = field(default_factory=dict, init=False)
    stopping: threading.Event = field(default_factory=threading.Event, init=False)

    def reconcile(
        self,
        as_of: datetime | None = None,
        *,
        lost_tick_after: timedelta | None = None,
        enqueue: bool | None = None,
    ) -> ReconcileResult:
        """One pass. Each due moment of a job (its version) is enqueued once; it is sent
        again only if the job has not moved for ``resend_after``. ``enqueue`` (default:
        unless the workers take) says whether the pass enqueues due jobs at all."""
        if not self.lock.try_acquire():
            return ReconcileResult(0, 0, 0, acted=False)
        started = time.perf_counter()
        now = as_of or self.clock.now()
        lost_after = self.lost_tick_after if lost_tick_after is None else lost_tick_after
        if self.admission is not None:
            self.admission()
        enqueue = not self.workers_take if enqueue is None else enqueue
        due = self.due_jobs(now, lost_after) if enqueue else []
        enqueued = sum(self.enqueue(job, now) for job in due)
        self.forget_before(now - self.resend_after)
        fired = 0 if self.schedules is None else self.schedules.fire_due(now, self.batch)
        result = ReconcileResult(
            scanned=len(due), enqueued=enqueued, skipped=len(due) - enqueued, fired=fired
        )
        self.ops.record(
            OpsEvent(
                jobId="",
                tenantId="",
                eventType="reconciler.pass",
                status="n/a",
                source="job_reconciler",
                metadata={
                    "durationMs": round((time.perf_counter() - started) * 1000, 3),
                    "scanned": result.scanned,
                    "enqueued": result.enqueued,
                    "fired": result.fired,
                },
            )
        )
        return result

    def due_jobs(self, now: datetime, lost_after: timedelta) -> list[DueJob]:
        due = [job for status in TIMED_STATUSES for job in self.views.due(status, now, self.batch)]
        for status in IDLE_STATUSES:  # its own tick repairs a lost one
            due += self.views.due(status, now - lost_after, self.batch)
        return due

    def take(self, limit: int) -> list[Tick]:
        """Ticks for at most ``limit`` due jobs, taken from the store for the caller's
        workers: what a pass finds due, but each job goes to one taker however many
        processes ask, and only as many as the caller has room for, so the rest stay in
        the store for the next process with room. No lock: the take itself is the
        claim, so every process takes at once."""
        now = self.clock.now()
        due = DueFilter(now, now - self.lost_tick_after, TIMED_STATUSES, IDLE_STATUSES)
        taken = self.views.take_due(due, limit, now + self.take_hold)
        for job in taken:
            self.record_reconciled(job, taken=True)
        return [Tick(job.tenant_id, job.job_id, f"reconcile_{job.status}") for job in taken]

    def enqueue(self, job: DueJob, now: datetime) -> bool:
        moment = (job.job_uuid, job.version)
        last = self.sent.get(moment)
        if last is not None and now - last < self.resend_after:
            return False
        self.queue.enqueue(
            Tick(job.tenant_id, job.job_id, f"reconcile_{job.status}"),
            dedupe_key=f"reconcile:{job.version}",
        )
        self.sent[moment] = now
        self.record_reconciled(job)
        return True

    def record_reconciled(self, job: DueJob, *, taken: bool = False) -> None:
        metadata: dict[str, object] = {"version": job.version}
        if taken:
            metadata["taken"] = True  # by a local worker, from the store
        self.ops.record(
            OpsEvent(
                jobId=job.job_id,
                tenantId=job.tenant_id,
                eventType="job.reconciled",
                status=job.status,
                source="job_reconciler",
                metadata=metadata,
            )
        )

    def forget_before(self, cutoff: datetime) -> None:
        self.sent = {k: v for k, v in self.sent.items() if v >= cutoff}

    def run_forever(
        self, interval: float = 5.0, *, catch_up: Callable[[], object] | None = None
    ) -> None:
        """A pass every ``interval`` seconds until stopped (the supervisor's reconciler
        role). ``catch_up`` brings the views up to date before each pass, when no
        follower does. A failed pass (the store or the broker briefly away) is logged
        and tried again next round."""
        while not self.stopping.wait(interval):
            try:
                if catch_up is not None:
                    catch_up()
                self.reconcile()
            except Exception:
                log.exception("reconcile pass failed")

    def stop(self) -> None:
        self.stopping.set()
        self.lock.release()
