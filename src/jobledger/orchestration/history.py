"""A job's recorded events as a resolution reads them (``ResolveRequest.history``): from
the events the tick itself appended when they cover what is asked, else from the store."""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Sequence
from typing import Final
from uuid import UUID

from jobledger.domain.job import Job
from jobledger.orchestration.ports import JobStore

LAST_APPENDS: Final = 8
"""Events of a tick's end kept for the job's next tick: a step's record and its claim."""


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


class LastAppends:
    """The last events each job's tick in this process appended, handed to its next tick.

    A tick that spends its step budget ends on a step's record, with nothing resolved
    after it: the hot body waits one step behind. Without these, its next tick would read
    that record back from the store; with them, the next tick's History covers it. The
    History checks what it is handed is contiguous up to the version asked, so events
    another writer appended in between still come from the store."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._lock = threading.Lock()
        self._jobs: OrderedDict[UUID, list[Job.Event]] = OrderedDict()

    def keep(self, job_uuid: UUID, events: Sequence[Job.Event]) -> None:
        """Hold the newest of ``events`` (every one of them committed) for the next tick."""
        if not self.size or not events:
            return
        with self._lock:
            self._jobs[job_uuid] = list(events[-LAST_APPENDS:])
            self._jobs.move_to_end(job_uuid)
            if len(self._jobs) > self.size:
                self._jobs.popitem(last=False)

    def take(self, job_uuid: UUID) -> list[Job.Event]:
        """What the job's last tick here kept (now the caller's), or nothing."""
        with self._lock:
            return self._jobs.pop(job_uuid, [])
