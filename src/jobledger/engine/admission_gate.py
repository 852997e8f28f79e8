"""The admission gate, as the facade drives it (:mod:`jobledger.domain.admission` says why):
a submitted job enters it, a job that ends or parks in a wait frees its place at once
(one waiting for its children lends it to them),
through the engine, and the reconciler runs a pass as the backstop."""

from __future__ import annotations

from datetime import timedelta
from uuid import UUID

from jobledger.domain.identity import job_uuid
from jobledger.domain.job import Job
from jobledger.domain.status import JobStatus
from jobledger.engine.bootstrap import Deps
from jobledger.orchestration.orchestrator import Orchestrator, Outcome, TickReport
from jobledger.orchestration.ports import Tick

PARKED = frozenset(
    {
        JobStatus.WAITING_TIME,
        JobStatus.WAITING_EVENT,
        JobStatus.AWAITING_APPROVAL,
        JobStatus.BUDGET_EXCEEDED,
    }
)
SWEEP_AFTER = timedelta(seconds=30)
"""Admitted this long ago, a job is checked by the backstop in case its end was missed."""
SWEEP_BATCH = 100
"""The most admitted jobs one backstop pass loads."""
_NOTHING_DONE = frozenset({Outcome.IDLE, Outcome.CLAIM_LOST, Outcome.HELD})


class Gatekeeper:
    """Lets jobs through the admission gate (``deps.admission``; none: every job goes
    at once), starting those it admits through the orchestrator."""

    def __init__(self, deps: Deps, orchestrator: Orchestrator) -> None:
        self._gate = deps.admission
        self._queue = deps.queue
        self._clock = deps.clock
        self._store = deps.store
        self._orchestrator = orchestrator

    def enter(self, job: Job, first: Tick) -> None:
        """Queue a new job for admission; its first tick (``first``) goes now if a pass
        admits it at once, else when one does."""
        gate = self._gate
        if gate is None or not self._orchestrator.policy.gates(job.tenant_id, job.workflow_type):
            self._queue.enqueue(first, dedupe_key="create")
            return
        now = self._clock.now()
        admitted = gate.enter(self._orchestrator.queued(job, now), now)
        self._orchestrator.start(admitted, except_job=str(job.id))
        if any(queued.job_uuid == str(job.id) for queued in admitted):
            self._queue.enqueue(first, dedupe_key="create")

    def after_tick(self, report: TickReport, tick: Tick) -> None:
        """A job that ended frees its place, one parked in a wait its place in the
        window; the jobs that admits start now, not at the reconciler's next pass."""
        gate = self._gate
        if gate is None or report.outcome in _NOTHING_DONE:
            return
        if not self._orchestrator.policy.gates(tick.tenant_id, report.workflow_type):
            return
        uuid = str(job_uuid(tick.tenant_id, tick.job_id))
        if report.status.is_terminal:
            self._orchestrator.start(gate.leave(uuid, self._clock.now()))
        elif report.status in PARKED:
            self._orchestrator.start(gate.park(uuid, self._clock.now()))
        elif report.status is JobStatus.WAITING_CHILDREN:
            self._orchestrator.start(gate.lend(uuid, self._clock.now()))

    def left(self, job: Job) -> None:
        """A command ended the job (a cancel): free its place, or its place in the queue."""
        gate = self._gate
        if gate is None or not job.status.is_terminal:
            return
        if self._orchestrator.policy.gates(job.tenant_id, job.workflow_type):
            self._orchestrator.start(gate.leave(str(job.id), self._clock.now()))

    def admission_pass(self) -> int:
        """The reconciler's backstop: free the places of admitted jobs that ended while
        their end went unnoticed (a worker killed between the two), then admit what fits.
        Returns how many jobs it admitted."""
        gate = self._gate
        if gate is None:
            return 0
        now = self._clock.now()
        alive, admitted = [], []
        for uuid in gate.admitted_before(now - SWEEP_AFTER, SWEEP_BATCH):
            job = self._store.load(UUID(uuid))
            if job is None or job.status.is_terminal:
                admitted += gate.leave(uuid, now)
            else:
                alive.append(uuid)
        # Looked at again only after the others: jobs parked for days (an approval) are
        # not loaded on every round, and every admitted job is looked at in turn.
        gate.seen(alive, now)
        admitted += gate.admit(now)
        self._orchestrator.start(admitted)
        return len(admitted)

    def queued_because(self, tenant_id: str, job_id: str) -> str | None:
        """Why a queued job has not started: its tenant's (or workflow's) limit, or the
        fleet's window; None when it is not held by the gate."""
        gate = self._gate
        return None if gate is None else gate.why_waiting(str(job_uuid(tenant_id, job_id)))
