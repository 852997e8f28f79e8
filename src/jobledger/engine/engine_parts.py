"""What every part of the engine facade shares: its wiring, and finding a job.

The facade (:class:`jobledger.engine.engine.Engine`) is a thin composition of its parts, one
module each: the commands on jobs (:mod:`jobledger.engine.job_commands`), the tick
(:mod:`jobledger.engine.ticks`) and the reads and audit (:mod:`jobledger.engine.reads`).
"""

from __future__ import annotations

import threading
import unicodedata
from datetime import datetime
from typing import Any

from jobledger.config import EngineConfig
from jobledger.domain.erasure import SubjectKeys
from jobledger.domain.errors import (
    BrokenHistoryError,
    InvalidPayloadError,
    UnknownJobError,
)
from jobledger.domain.identity import job_uuid
from jobledger.domain.job import Job
from jobledger.domain.payloads import lone_surrogate
from jobledger.domain.status import JobStatus
from jobledger.engine.bootstrap import Deps
from jobledger.orchestration.group_commit import GroupCommitter
from jobledger.orchestration.orchestrator import Orchestrator
from jobledger.orchestration.ports import (
    BlockedNotes,
    Clock,
    JobStore,
    Leases,
    Ops,
    Queue,
    ResumeTokens,
    WorkflowRegistry,
)
from jobledger.orchestration.tracing import Tracer

MAX_ID_LENGTH = 200


class EngineParts:
    """The wiring each part reads (set by ``Engine.__init__``) and the lookups they share."""

    deps: Deps
    store: JobStore
    queue: Queue
    clock: Clock
    ops: Ops
    registry: WorkflowRegistry
    config: EngineConfig
    tokens: ResumeTokens | None
    leases: Leases | None
    orchestrator: Orchestrator
    group: GroupCommitter
    blocked_notes: BlockedNotes | None
    subject_keys: SubjectKeys | None
    tracer: Tracer
    _turns: list[threading.Lock]

    def _kept_until(self, job: Job) -> datetime | None:
        """The lease a running job's heartbeat keeps, beyond its Claimed event's."""
        if self.leases is None or job.status is not JobStatus.RUNNING:
            return None
        row = self.leases.get(job.id)
        return row.lease_until if row is not None and row.claim_id == job.claim_id else None

    def _load(self, tenant_id: str, job_id: str) -> Job:
        job = self._fetch(tenant_id, job_id)
        if job is None:
            raise UnknownJobError(tenant_id, job_id)
        return job

    def _fetch(self, tenant_id: str, job_id: str) -> Job | None:
        try:
            return self.store.load(job_uuid(tenant_id, job_id))
        except BrokenHistoryError as error:
            raise error.of(tenant_id, job_id) from None  # the store knows only the uuid

    def _report(self, job: Job, event_type: str, **metadata: Any) -> None:
        self.orchestrator.report(job, event_type, **metadata)


def _check_id(name: str, value: object) -> None:
    if not isinstance(value, str) or not value or len(value) > MAX_ID_LENGTH:
        raise InvalidPayloadError(
            f"{name} must be a non-empty string of at most "
            f"{MAX_ID_LENGTH} characters, got {value!r}"
        )
    if any(unicodedata.category(c) in ("Cc", "Cf", "Zl", "Zp") for c in value):
        raise InvalidPayloadError(f"{name} must not contain control characters: {value!r}")
    if lone_surrogate(value) is not None:
        raise InvalidPayloadError(f"{name} must not contain a lone surrogate: {value!r}")
    if value in (".", ".."):
        # Encoded or not, "." and ".." are the dot segments every URL client removes: the
        # job's Location, /v1/jobs/t/.., would lead to /v1/jobs/.
        raise InvalidPayloadError(
            f"{name} must not be '.' or '..': a URL path resolves it away, got {value!r}"
        )
