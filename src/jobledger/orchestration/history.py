"""A job's recorded events as a resolution reads them (``ResolveRequest.history``): from
the events the tick itself appended when they cover what is asked, else from the store."""

from __future__ import annotations

from collections.abc import Sequence
from uuid import UUID

from jobledger.domain.job import Job
from jobledger.orchestration.ports import JobStore


class History:
    """The events of ``job_uuid`` after a version, up to ``version``. A code workflow's
    hot body asks only for the step it waited on, which its own tick appended: no read."""

    def __init__(
        self, store: JobStore, job_uuid: UUID, version: int, appended: Sequence[Job.Event]
    ) -> None:
        self.store = store
        self.job_uuid = job_uuid
        self.version = version
        self.appended = appended

    def __call__(self, after: int) -> Sequence[Job.Event]:
        if after >= self.version:
            return []
        tail = [e for e in self.appended if after < e.originator_version <= self.version]
        if (
            tail
            and tail[0].originator_version == after + 1
            and tail[-1].originator_version == self.version
            and len(tail) == self.version - after
        ):
            return tail
        return self.store.events(self.job_uuid, after=after, to_version=self.version)
