"""The in-process tick queue of the embedded default: delayed ticks with dedupe keys."""

from __future__ import annotations

import heapq
import itertools
import threading
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from jobledger.ports import Clock, Tick


@dataclass(order=True)
class _Entry:
    due: datetime
    seq: int
    tick: Tick = field(compare=False)
    dedupe: tuple[str, str, str] | None = field(compare=False)


class LocalQueue:
    """A heap ordered by due time. Not durable by design: the reconciler re-enqueues
    whatever a restart lost, from the status the store holds."""

    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self._heap: list[_Entry] = []
        self._pending: set[tuple[str, str, str]] = set()
        self._seq = itertools.count()
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)

    def enqueue(self, tick: Tick, *, delay_ms: int = 0, dedupe_key: str | None = None) -> None:
        dedupe = (tick.tenant_id, tick.job_id, dedupe_key) if dedupe_key else None
        due = self.clock.now() + timedelta(milliseconds=max(0, delay_ms))
        with self._lock:
            if dedupe is not None:
                if dedupe in self._pending:
                    return
                self._pending.add(dedupe)
            heapq.heappush(self._heap, _Entry(due, next(self._seq), tick, dedupe))
            self._changed.notify()

    def pop_due(self) -> Tick | None:
        with self._lock:
            return self._pop_due()

    def get(self, timeout: float) -> Tick | None:
        """The next due tick, waiting up to ``timeout`` seconds (on the wall clock) for one
        to be enqueued or to come due."""
        with self._lock:
            tick = self._pop_due()
            if tick is None:
                wait = timeout
                if self._heap:
                    until_due = (self._heap[0].due - self.clock.now()).total_seconds()
                    wait = min(timeout, max(0.0, until_due))
                self._changed.wait(wait)
                tick = self._pop_due()
            return tick

    def _pop_due(self) -> Tick | None:
        if not self._heap or self._heap[0].due > self.clock.now():
            return None
        entry = heapq.heappop(self._heap)
        if entry.dedupe is not None:
            self._pending.discard(entry.dedupe)
        return entry.tick

    def next_due(self) -> datetime | None:
        with self._lock:
            return self._heap[0].due if self._heap else None

    def pending(self) -> list[tuple[datetime, Tick, str | None]]:
        """What is waiting, soonest first: (due, tick, dedupe key)."""
        with self._lock:
            entries = sorted(self._heap)
        return [(e.due, e.tick, e.dedupe[2] if e.dedupe else None) for e in entries]

    def __len__(self) -> int:
        with self._lock:
            return len(self._heap)
