"""Jobs handed back after use, so the next load of one continues from the object itself.

A worker's tick loads its job, appends to it and ends; the next tick of that job would
read back from the store the very events the last one wrote and deep-copy the cached
aggregate. Instead the tick hands its object back (``JobStore.keep``) and the next load
takes it (ownership passes, so no copy is needed: two users never share one object) and
only asks the store for events after its version, which another process may have added.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from uuid import UUID

from jobledger.domain.job import Job


class KeptJobs:
    """At most ``size`` jobs, the least recently handed back dropped first."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._lock = threading.Lock()
        self._jobs: OrderedDict[UUID, Job] = OrderedDict()

    def keep(self, job: Job) -> None:
        """Hold ``job``, unless a newer object of the same job is held already (two users
        of one job hand back in any order; the older one would only fast-forward)."""
        if not self.size or job.pending_events:
            return
        with self._lock:
            held = self._jobs.get(job.id)
            if held is not None and held.version > job.version:
                return
            self._jobs[job.id] = job
            self._jobs.move_to_end(job.id)
            if len(self._jobs) > self.size:
                self._jobs.popitem(last=False)

    def take(self, job_uuid: UUID) -> Job | None:
        """The held object, now the caller's (no longer held), or None."""
        with self._lock:
            return self._jobs.pop(job_uuid, None)

    def drop(self, job_uuid: UUID) -> None:
        with self._lock:
            self._jobs.pop(job_uuid, None)
