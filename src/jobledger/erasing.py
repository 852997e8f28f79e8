"""Erasing a data subject: every job sealed with the subject's key records ``Erased``, then
the key is destroyed, and the subject's personal values read as ``[erased]`` everywhere
(the store, exports, the events topic) while every chain still verifies.

The order is what makes a crash safe: the events first, the key last. A crash between the
two leaves the key in place and the subject still listed, so running the erasure again
finishes it (jobs that already recorded ``Erased`` are not erased twice).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from jobledger.commands import JobCommands
from jobledger.erasure import SubjectKeys, check_subject
from jobledger.errors import ConfigError, SubjectErasedError, UnknownSubjectError
from jobledger.job import Job
from jobledger.keys import ConsumedKey
from jobledger.payloads import text


@dataclass(frozen=True)
class ErasureReport:
    tenant_id: str
    key_ids: tuple[str, ...]
    """The subject's keys, destroyed."""
    erased: tuple[str, ...]
    """The jobs that recorded ``Erased`` now."""
    already: tuple[str, ...]
    """The jobs that had recorded it already (an erasure interrupted and run again)."""
    erased_at: datetime


class ErasureCommands(JobCommands):
    def erase(self, tenant_id: str, subject: str, *, by: str, reason: str) -> ErasureReport:
        """Erase the data subject ``subject`` of the tenant: ``by`` who, and why."""
        keys = self._keys()
        check_subject(subject)
        text(by, what="erased by", max_bytes=200)
        text(reason, what="erasure reason", max_bytes=self.config.max_payload_bytes)
        found = keys.keys_of(tenant_id, subject)
        if not found:
            erased_at = keys.erased_at(tenant_id, subject)
            if erased_at is not None:
                raise SubjectErasedError(
                    f"this data subject of tenant {tenant_id!r} was already erased at "
                    f"{erased_at.isoformat()}"
                )
            raise UnknownSubjectError(f"tenant {tenant_id!r} has no such data subject")
        erased: list[str] = []
        already: list[str] = []
        for key_id, job_ids in found.items():
            for job_id in job_ids:
                done = self._erase_job(tenant_id, job_id, key_id, by, reason)
                if done is not None:
                    (erased if done else already).append(job_id)
        now = self.clock.now()
        keys.destroy(tenant_id, subject, list(found), now)
        return ErasureReport(tenant_id, tuple(found), tuple(erased), tuple(already), now)

    def _erase_job(
        self, tenant_id: str, job_id: str, key_id: str, by: str, reason: str
    ) -> bool | None:
        """True: erased now; False: erased before; None: no such job (its submit died
        after taking the key, before writing the job)."""
        first = self._fetch(tenant_id, job_id)
        if first is None:
            return None
        if first.personal_data_erased:
            return False

        def erase(job: Job) -> list[ConsumedKey]:
            if not job.personal_data_erased:
                job.erase(key_id=key_id, erased_by=by, reason=reason, now=self.clock.now())
            return []

        job = self._apply(tenant_id, job_id, erase)
        self._report(job, "job.erased", keyId=key_id, erasedBy=by)
        return True

    def _keys(self) -> SubjectKeys:
        if self.subject_keys is None:
            raise ConfigError("this engine was built without a subject key store")
        return self.subject_keys
