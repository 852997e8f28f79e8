"""Steps that ran whose record the store refused, kept in the worker until it lands.

A full disk or an outage can refuse a step's append after its side effect ran. The tick
is retried (under the same claim) and, without this, would run the side effect again on
every retry, though nothing else could have run or recorded it meanwhile. So what the
step did is kept here, keyed by its job, and the retry records it instead of running it.
It is taken only by a retry that still finds the job at that step and attempt, running
under that same claim: once another worker took the job over (our lease lapsed), the
entry is dropped and the new owner's run is the documented at-least-once case.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from uuid import UUID

from jobledger.domain.job import Job
from jobledger.domain.steps import IssuedToken, Resolution
from jobledger.domain.transition import StepOutcome

KEPT_AT_MOST = 1024
"""Entries whose retry never comes (the job was cancelled or taken over meanwhile) are
dropped oldest first beyond this: at worst such a step re-runs, as it would have."""


@dataclass
class RanStep:
    """A step as far as it went: resolved, its side effect run (what it returned, or the
    error it raised) and, once issued, the resume token its wait hands out."""

    claim_id: str
    step_number: int
    attempt: int
    resolution: Resolution
    done: StepOutcome | Exception
    token: IssuedToken | None = None

    @classmethod
    def of(
        cls, job: Job, claim_id: str, resolution: Resolution, done: StepOutcome | Exception
    ) -> RanStep:
        return cls(claim_id, job.current_step + 1, job.attempt, resolution, done)

    def is_pending_on(self, job: Job) -> bool:
        """Still unrecorded on ``job`` as stored, under the claim that ran it."""
        return (
            job.step_in_flight(self.claim_id)
            and job.current_step + 1 == self.step_number
            and job.attempt == self.attempt
        )


class UnrecordedSteps:
    """The worker's kept steps, one per job at most (a job runs one tick at a time)."""

    def __init__(self) -> None:
        self._kept: dict[UUID, RanStep] = {}
        self._lock = threading.Lock()

    def keep(self, job_uuid: UUID, ran: RanStep) -> None:
        with self._lock:
            self._kept.pop(job_uuid, None)  # re-inserted last: the newest is dropped last
            self._kept[job_uuid] = ran
            if len(self._kept) > KEPT_AT_MOST:
                del self._kept[next(iter(self._kept))]

    def take(self, job: Job, claim_id: str) -> RanStep | None:
        """The job's kept step, if this tick (``claim_id``) is the one to record it. An
        entry the job moved past is stale and dropped; one kept for another claim is
        left to that claim's retry."""
        with self._lock:
            ran = self._kept.get(job.id)
            if ran is None or (ran.claim_id != claim_id and ran.is_pending_on(job)):
                return None
            del self._kept[job.id]
        return ran if ran.is_pending_on(job) else None
