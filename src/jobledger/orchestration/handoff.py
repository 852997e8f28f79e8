"""Jobs a command committed, handed to the in-process tick it woke, so that tick starts
from the job as committed instead of loading it again."""

from __future__ import annotations

import threading
from uuid import UUID

from jobledger.domain.job import Job
from jobledger.orchestration.ports import Tick

HELD_AT_MOST = 1024
"""Hand-offs kept at once: a tick that never runs (dropped by its queue) leaves its
entry behind, so the oldest go first; a tick that finds none simply loads the job."""


class HandedJobs:
    """Keyed by the claim a resume folded in for the tick it wakes: that claim id rides
    only in the tick this process enqueued, so nothing but that tick can take the job.

    Starting from the handed job is as safe as loading it: whatever another process
    appended since is caught by the version check of the tick's first append (then
    rebased, or ended as for an input that lands mid-step). This process's own commands
    on the job void the hand-off (``drop``), so its tick loads what they wrote."""

    def __init__(self, limit: int = HELD_AT_MOST) -> None:
        self._limit = limit
        self._jobs: dict[str, Job] = {}
        self._claims: dict[UUID, str] = {}
        self._lock = threading.Lock()

    def hand(self, claim_id: str, job: Job) -> None:
        """The caller gives the job up: from now on only the tick changes it."""
        with self._lock:
            self._forget(self._claims.get(job.id))
            self._jobs[claim_id] = job
            self._claims[job.id] = claim_id
            while len(self._jobs) > self._limit:
                self._forget(next(iter(self._jobs)))

    def drop(self, job_uuid: UUID) -> None:
        """Another command is about to change the job: its tick must load it."""
        with self._lock:
            self._forget(self._claims.get(job_uuid))

    def take(self, tick: Tick) -> Job | None:
        """The job handed to this tick, once (a retry of the tick loads it afresh)."""
        if tick.claim_id is None:
            return None
        with self._lock:
            job = self._forget(tick.claim_id)
        if job is None or job.claim_id != tick.claim_id or job.job_id != tick.job_id:
            return None
        return job if job.tenant_id == tick.tenant_id and not job.pending_events else None

    def _forget(self, claim_id: str | None) -> Job | None:
        job = self._jobs.pop(claim_id, None) if claim_id is not None else None
        if job is not None and self._claims.get(job.id) == claim_id:
            del self._claims[job.id]
        return job
