"""Erasing a data subject: every job sealed with the subject's key records ``Erased``, then
the key is destroyed, and the subject's personal values read as ``[erased]`` everywhere
(the store, exports, the events topic) while every chain still verifies.

A job submitted without a data subject has a key of its own, and is erased alone
(``erase_job``) the same way: ``Erased``, then its key.

The order is what makes a crash safe: the events first, the key last. A crash between the
two leaves the key in place and the subject (or job) still erasable, so running the
erasure again finishes it (jobs that already recorded ``Erased`` are not erased twice).

Destroying a key ends with its shred, which another connection's read transaction can
hold back past the key store's bounded wait: the report then says ``pending`` (the key is
deleted, its bytes not yet gone from the database's files), and the same erasure asked
again, or any later one, finishes it.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Literal

from jobledger.domain.erasure import KeyState, SubjectKeys, check_subject
from jobledger.domain.errors import (
    ConfigError,
    JobErasedError,
    NoPersonalDataError,
    SubjectErasedError,
    SubjectKeyError,
    UnknownSubjectError,
)
from jobledger.domain.job import Job
from jobledger.domain.keys import ConsumedKey
from jobledger.domain.payloads import text
from jobledger.engine.bootstrap import Deps
from jobledger.engine.job_commands import JobCommands
from jobledger.engine.job_finder import JobFinder
from jobledger.orchestration.orchestrator import Orchestrator

Shred = Literal["done", "pending"]


@dataclass(frozen=True)
class ErasureReport:
    tenant_id: str
    key_ids: tuple[str, ...]
    """The subject's keys (or the job's own key), destroyed."""
    erased: tuple[str, ...]
    """The jobs that recorded ``Erased`` now."""
    already: tuple[str, ...]
    """The jobs that had recorded it already (an erasure interrupted and run again)."""
    erased_at: datetime
    shred: Shred
    """``done``: the keys' bytes are gone from the database's files too. ``pending``:
    another connection's read transaction still keeps them there (the keys are deleted,
    the values read as ``[erased]``): the same erasure asked again finishes it."""


def _shred(done: bool) -> Shred:
    return "done" if done else "pending"


class ErasureCommands:
    """Erasing a data subject, or one job, through the commands' writes."""

    def __init__(
        self, deps: Deps, orchestrator: Orchestrator, jobs: JobFinder, commands: JobCommands
    ) -> None:
        self._deps = deps
        self._orchestrator = orchestrator
        self._jobs = jobs
        self._commands = commands

    def erase(self, tenant_id: str, subject: str, *, by: str, reason: str) -> ErasureReport:
        """Erase the data subject ``subject`` of the tenant: ``by`` who, and why."""
        keys = self._keys()
        check_subject(subject)
        text(by, what="erased by", max_bytes=200)
        text(reason, what="erasure reason", max_bytes=self._deps.config.limits.max_payload_bytes)
        found = keys.keys_of(tenant_id, subject)
        if not found:
            return self._finish_shred(keys, tenant_id, subject)
        erased: list[str] = []
        already: list[str] = []
        self._erase_jobs(tenant_id, found, by, reason, erased, already)
        now = self._deps.clock.now()
        shredded = keys.destroy(tenant_id, subject, list(found), now)
        # A job submitted for the subject while the others were erased took the same key:
        # its values are written as [erased] from now on, and it records Erased too.
        late = {
            key_id: [j for j in job_ids if j not in erased and j not in already]
            for key_id, job_ids in keys.jobs_of(list(found)).items()
        }
        self._erase_jobs(tenant_id, late, by, reason, erased, already)
        return ErasureReport(
            tenant_id, tuple(found), tuple(erased), tuple(already), now, _shred(shredded)
        )

    def _finish_shred(self, keys: SubjectKeys, tenant_id: str, subject: str) -> ErasureReport:
        """A subject without keys: never known, or erased; refused, unless its erasure's
        shred was left pending, which is then tried again."""
        erasure = keys.erasure(tenant_id, subject)
        if erasure is None:
            raise UnknownSubjectError(f"tenant {tenant_id!r} has no such data subject")
        if erasure.shredded:
            raise SubjectErasedError(
                f"this data subject of tenant {tenant_id!r} was already erased at "
                f"{erasure.erased_at.isoformat()}"
            )
        shredded = keys.shred(self._deps.clock.now())
        jobs = [j for ids in keys.jobs_of(erasure.key_ids).values() for j in ids]
        # A job whose submit died after taking the key was never written: not one erased.
        written = tuple(j for j in jobs if self._jobs.fetch(tenant_id, j) is not None)
        return ErasureReport(
            tenant_id, erasure.key_ids, (), written, erasure.erased_at, _shred(shredded)
        )

    def _erase_jobs(
        self,
        tenant_id: str,
        jobs: dict[str, list[str]],
        by: str,
        reason: str,
        erased: list[str],
        already: list[str],
    ) -> None:
        for key_id, job_ids in jobs.items():
            for job_id in job_ids:
                done = self._erase_job(tenant_id, job_id, key_id, by, reason)
                if done is not None:
                    (erased if done else already).append(job_id)

    def erase_job(self, tenant_id: str, job_id: str, *, by: str, reason: str) -> ErasureReport:
        """Erase one job sealed with a key of its own (submitted without a data subject):
        ``by`` who, and why. A job sealed with its subject's key is refused: that key is
        the subject's other jobs' too, so only erasing the subject destroys it."""
        keys = self._keys()
        text(by, what="erased by", max_bytes=200)
        text(reason, what="erasure reason", max_bytes=self._deps.config.limits.max_payload_bytes)
        key_id, state = self._own_key(keys, tenant_id, job_id)
        if state.erased_at is not None:  # erased, its shred left pending: tried again
            shredded = keys.shred(self._deps.clock.now())
            return ErasureReport(
                tenant_id, (key_id,), (), (job_id,), state.erased_at, _shred(shredded)
            )
        done = self._erase_job(tenant_id, job_id, key_id, by, reason)
        now = self._deps.clock.now()
        shredded = keys.destroy_job_key(tenant_id, job_id, key_id, now)
        erased, already = ((job_id,), ()) if done else ((), (job_id,))
        return ErasureReport(tenant_id, (key_id,), erased, already, now, _shred(shredded))

    def _own_key(self, keys: SubjectKeys, tenant_id: str, job_id: str) -> tuple[str, KeyState]:
        """The id of the job's own key and its state: still held, or erased with its
        shred pending; or the error that says why not."""
        job = self._jobs.load(tenant_id, job_id)
        key_id = job.personal_data_key
        if key_id is None:
            raise NoPersonalDataError(
                f"job {job_id!r} of tenant {tenant_id!r} holds no personal data: workflow "
                f"{job.workflow_type!r} v{job.workflow_version} declares no personal_data"
            )
        state = keys.key_state(tenant_id, key_id)
        if state.erased_at is not None:
            if not state.shredded:
                return key_id, state
            raise JobErasedError(
                f"job {job_id!r} of tenant {tenant_id!r} was already erased at "
                f"{state.erased_at.isoformat()}"
            )
        if not state.held:
            raise JobErasedError(
                f"job {job_id!r} of tenant {tenant_id!r}: its key is not in this store (an "
                "imported job?), so its personal values already read as [erased]"
            )
        if state.subject:
            # Never the subject's name: it may itself be personal.
            raise SubjectKeyError(
                f"job {job_id!r} of tenant {tenant_id!r} is sealed with its data subject's "
                "key, shared with the subject's other jobs: erase the data subject instead"
            )
        return key_id, state

    def _erase_job(
        self, tenant_id: str, job_id: str, key_id: str, by: str, reason: str
    ) -> bool | None:
        """True: erased now; False: erased before; None: no such job (its submit died
        after taking the key, before writing the job)."""
        first = self._jobs.fetch(tenant_id, job_id)
        if first is None:
            return None
        if first.personal_data_erased:
            return False

        def erase(job: Job) -> list[ConsumedKey]:
            if not job.personal_data_erased:
                job.erase(key_id=key_id, erased_by=by, reason=reason, now=self._deps.clock.now())
            return []

        job = self._commands.apply(tenant_id, job_id, erase)
        self._orchestrator.report(job, "job.erased", keyId=key_id, erasedBy=by)
        return True

    def _keys(self) -> SubjectKeys:
        if self._deps.subject_keys is None:
            raise ConfigError("this engine was built without a subject key store")
        return self._deps.subject_keys
