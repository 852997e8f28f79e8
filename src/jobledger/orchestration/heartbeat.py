"""Leases that live as long as their worker: a heartbeat while a step runs, and take-overs.

A ``Claimed`` event gives its claim a short first lease. While the executor runs, one
thread per orchestrator renews the claim's row in the Leases port every lease/3, so a
step that is alive keeps its job however long it takes, and a job whose worker died is
free one lease after its last heartbeat. Heartbeats are not events: a ten-minute step
would otherwise add a hundred and twenty of them to the job's history (and to every
replay, export and outbox copy) to say nothing more than "still alive".

The effective lease of a running job is the later of its ``Claimed`` lease and its row's,
when the row belongs to that claim. A worker taking over a job whose ``Claimed`` lease
lapsed must first take the row (one conditional write, see ``Leases.take_over``), then
append its ``Claimed`` at the loaded version: the row decides between the old owner's
heartbeat and the taker, the version compare-and-swap between takers and the old owner's
own record.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timedelta
from uuid import UUID

from jobledger.domain.job import Job
from jobledger.orchestration.ports import Clock, Lease, Leases, Ops, OpsEvent

log = logging.getLogger(__name__)


@dataclass
class _Kept:
    """A step being executed, whose claim the heartbeat keeps."""

    job_uuid: UUID
    tenant_id: str
    job_id: str
    claim_id: str
    epoch: int
    due: float
    """When (time.monotonic) to renew it next."""


class Heartbeats:
    """Renews the lease of every step this orchestrator is executing, from one thread that
    runs only while there is something to renew."""

    def __init__(
        self, leases: Leases, clock: Clock, ops: Ops, *, lease_ms: int, worker_id: str
    ) -> None:
        self.leases = leases
        self.clock = clock
        self.ops = ops
        self.lease = timedelta(milliseconds=lease_ms)
        # Three beats per lease: one lost or late beat never lets a live step's lease lapse.
        self.interval = lease_ms / 3000
        self.worker_id = worker_id
        self._kept: dict[int, _Kept] = {}
        self._next_key = 0
        self._wake = threading.Condition()
        self._thread: threading.Thread | None = None

    # ---- taking over a job whose claim lapsed on the log ------------------------------

    def take_over(self, job: Job, claim_id: str, now: datetime) -> Lease | None:
        """Take the lease row of ``job`` (running, its ``Claimed`` lease lapsed) for
        ``claim_id``. None when taken; otherwise the live lease in the way."""
        assert job.claim_id is not None  # a running job always has its claim
        wanted = Lease(job.id, claim_id, self.worker_id, job.version + 1, now + self.lease)
        return self.leases.take_over(wanted, from_claim=job.claim_id, now=now)

    # ---- the heartbeat ---------------------------------------------------------------

    @contextmanager
    def kept(self, job: Job, claim_id: str) -> Iterator[None]:
        """Renew ``claim_id``'s lease on ``job`` while the block runs. The first beat is
        due a third of a lease in, so steps shorter than that never write a row."""
        kept = _Kept(job.id, job.tenant_id, job.job_id, claim_id, job.version, due=self._due_next())
        with self._wake:
            key = self._next_key
            self._next_key += 1
            self._kept[key] = kept
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="jobledger-heartbeat", daemon=True
                )
                self._thread.start()
        try:
            yield
        finally:
            with self._wake:
                self._kept.pop(key, None)

    def beat_now(self, job: Job, claim_id: str) -> bool:
        """A step's own heartbeat (``StepContext.heartbeat``): renew its lease at once;
        False if a newer claim holds the job (a take-over won)."""
        lease = Lease(job.id, claim_id, self.worker_id, job.version, self.clock.now() + self.lease)
        return self.leases.renew(lease)

    def _beat_due(self) -> None:
        """Renew every lease whose beat is due."""
        with self._wake:
            now = time.monotonic()
            due = [(key, kept) for key, kept in self._kept.items() if kept.due <= now]
            for _, kept in due:
                kept.due = self._due_next()
        for key, kept in due:
            self._beat(key, kept)

    def _run(self) -> None:
        while True:
            with self._wake:
                if not self._kept:
                    # Idle for a whole interval: let the thread end; the next step starts one.
                    self._wake.wait(self.interval)
                    if not self._kept:
                        self._thread = None
                        return
                wait = min(kept.due for kept in self._kept.values()) - time.monotonic()
                if wait > 0:
                    self._wake.wait(wait)
                    continue
            self._beat_due()

    def _beat(self, key: int, kept: _Kept) -> None:
        lease = Lease(
            kept.job_uuid, kept.claim_id, self.worker_id, kept.epoch, self.clock.now() + self.lease
        )
        try:
            renewed = self.leases.renew(lease)
        except Exception:  # the store may be briefly away: the next beat tries again
            log.warning("heartbeat for job %s failed", kept.job_id, exc_info=True)
            return
        if renewed:
            return
        with self._wake:
            self._kept.pop(key, None)  # lost for good: never beat for this claim again
        self.ops.record(
            OpsEvent(
                jobId=kept.job_id,
                tenantId=kept.tenant_id,
                eventType="job.lease.lost",
                status="running",
                metadata={"workerId": self.worker_id, "claimId": kept.claim_id},
            )
        )

    def _due_next(self) -> float:
        return time.monotonic() + self.interval
