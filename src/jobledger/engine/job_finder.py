"""Finding a job by its tenant and id, as every part of the engine does."""

from __future__ import annotations

from datetime import datetime

from jobledger.domain.errors import BrokenHistoryError, JobArchivedError, UnknownJobError
from jobledger.domain.identity import job_uuid
from jobledger.domain.job import Job
from jobledger.domain.status import JobStatus
from jobledger.orchestration.ports import JobStore, Leases


class JobFinder:
    """Loads jobs from the store by tenant and id; and the lease a running job's
    heartbeat keeps (the lease row), which its events do not say."""

    def __init__(self, store: JobStore, leases: Leases | None) -> None:
        self._store = store
        self._leases = leases

    def load(self, tenant_id: str, job_id: str) -> Job:
        job = self.fetch(tenant_id, job_id)
        if job is None:
            self.raise_if_archived(tenant_id, job_id)
            raise UnknownJobError(tenant_id, job_id)
        return job

    def raise_if_archived(self, tenant_id: str, job_id: str) -> None:
        """A job not in the store may have been archived: say so, and where to."""
        tombstone = self._store.tombstone(job_uuid(tenant_id, job_id))
        if tombstone is not None:
            raise JobArchivedError(tenant_id, job_id, tombstone.document())

    def fetch(self, tenant_id: str, job_id: str) -> Job | None:
        try:
            return self._store.load(job_uuid(tenant_id, job_id))
        except BrokenHistoryError as error:
            raise error.of(tenant_id, job_id) from None  # the store knows only the uuid

    def kept_until(self, job: Job) -> datetime | None:
        """The lease a running job's heartbeat keeps, beyond its Claimed event's."""
        if self._leases is None or job.status is not JobStatus.RUNNING:
            return None
        row = self._leases.get(job.id)
        return row.lease_until if row is not None and row.claim_id == job.claim_id else None
