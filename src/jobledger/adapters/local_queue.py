"""The in-process tick queue of the embedded default: delayed ticks with dedupe keys,
handed out fairly across tenants."""

from __future__ import annotations

import heapq
import itertools
import threading
from collections import deque
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from jobledger.orchestration.ports import Clock, Tick


@dataclass(order=True)
class _Entry:
    due: datetime
    seq: int
    tick: Tick = field(compare=False)
    dedupe: tuple[str, str, str] | None = field(compare=False)


class LocalQueue:
    """Due ticks are handed out a tenant at a time, in turn; each tenant's in due order.
    Not durable by design: the reconciler re-enqueues whatever a restart lost, from the
    status the store holds."""

    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        # One heap per tenant, and the tenants in the order of their next turn: a tenant
        # with ten thousand due ticks gets one tick per round, like a tenant with three,
        # so the small one's wait is a few ticks, not the large one's backlog.
        self._heaps: dict[str, list[_Entry]] = {}
        self._turns: deque[str] = deque()
        self._size = 0
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
            heap = self._heaps.get(tick.tenant_id)
            if heap is None:
                heap = self._heaps[tick.tenant_id] = []
                self._turns.append(tick.tenant_id)
            heapq.heappush(heap, _Entry(due, next(self._seq), tick, dedupe))
            self._size += 1
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
                if (soonest := self._soonest()) is not None:
                    until_due = (soonest - self.clock.now()).total_seconds()
                    wait = min(timeout, max(0.0, until_due))
                self._changed.wait(wait)
                tick = self._pop_due()
            return tick

    def _pop_due(self) -> Tick | None:
        """The due tick of the first tenant in turn that has one; that tenant's next turn
        comes after every other tenant's."""
        now = self.clock.now()
        for _ in range(len(self._turns)):
            tenant = self._turns[0]
            self._turns.rotate(-1)
            heap = self._heaps[tenant]
            if heap[0].due > now:
                continue
            entry = heapq.heappop(heap)
            if not heap:
                del self._heaps[tenant]
                self._turns.pop()
            self._size -= 1
            if entry.dedupe is not None:
                self._pending.discard(entry.dedupe)
            return entry.tick
        return None

    def _soonest(self) -> datetime | None:
        return min((heap[0].due for heap in self._heaps.values()), default=None)

    def next_due(self) -> datetime | None:
        with self._lock:
            return self._soonest()

    def pending(self) -> list[tuple[datetime, Tick, str | None]]:
        """What is waiting, soonest first: (due, tick, dedupe key)."""
        with self._lock:
            entries = sorted(entry for heap in self._heaps.values() for entry in heap)
        return [(e.due, e.tick, e.dedupe[2] if e.dedupe else None) for e in entries]

    def __len__(self) -> int:
        with self._lock:
            return self._size
