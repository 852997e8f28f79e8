"""Group commit across jobs: the step appends of ticks running at once share one commit.

Leader and followers, as in a database's own group commit (no committer thread: handing
each append to another thread costs a GIL hand-off per step). The first tick to bring
its append while no group is being written leads: it waits until every tick in flight
has brought its append, ``max_batch`` are queued or ``max_batch_wait_ms`` has passed,
then writes the group with ``JobStore.append_many``. A tick goes on only once the group
holding its append has committed; an append the store refused raises its refusal in its
own tick, exactly as ``JobStore.append`` would.

Each waiting tick is woken once: when its group has committed, or when it is handed the
lead of the next group. Nothing is broadcast: a broadcast per append wakes every waiting
tick to find it has nothing to do, and those wake-ups grow with the square of the ticks
in flight.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from copy import copy
from typing import TypeVar

from jobledger.domain.job import Job
from jobledger.domain.keys import ConsumedKey
from jobledger.orchestration.ports import Append, JobStore

T = TypeVar("T")


class _Waiting:
    """One tick's append, and the one wake-up that tells it what became of it."""

    __slots__ = ("_wake", "append", "error", "leads")

    def __init__(self, append: Append) -> None:
        self.append = append
        self.error: Exception | None = None
        self.leads = False
        """Woken to lead the next group, not because its own group committed."""
        # A lock held from birth is a one-shot wake-up: cheaper than an Event, whose
        # Condition takes two more locks per wait.
        self._wake = threading.Lock()
        self._wake.acquire()

    def wait(self, timeout: float = -1) -> bool:
        return self._wake.acquire(timeout=timeout)

    def wake(self) -> None:
        self._wake.release()


class GroupCommitter:
    """Appends steps for the ticks of one worker. ``in_flight`` counts the ticks running
    now (``running``): the leader waits for no more appends than could still come."""

    def __init__(
        self,
        store: JobStore,
        *,
        max_batch: int,
        max_wait_ms: float,
        prepare: Callable[[Job], None] | None = None,
    ) -> None:
        self.store = store
        self.prepare = prepare
        """Done by each tick to its own job before it joins a group (the store's hashing
        and signing): one leader writes a group at a time, so work left to the write
        would be done one job after another while the other ticks wait."""
        self.max_batch = max_batch
        self.max_wait = max_wait_ms / 1000
        self._lock = threading.Lock()
        self._queue: list[_Waiting] = []
        self._leading = False
        self._gathering: _Waiting | None = None
        """The leader, while it waits for its group to fill: woken once it has."""
        self._in_flight = 0

    @contextmanager
    def running(self) -> Iterator[None]:
        """Around each tick this worker runs, so a leader knows whom to wait for."""
        with self._lock:
            self._in_flight += 1
        try:
            yield
        finally:
            with self._lock:
                self._in_flight -= 1
                self._wake_gatherer_if_full()

    def append(self, job: Job, *keys: ConsumedKey) -> None:
        """``JobStore.append``, committed together with the other ticks' step appends."""
        if self.prepare is not None:
            self.prepare(job)
        waiting = _Waiting(Append(job, keys))
        with self._lock:
            self._queue.append(waiting)
            leads = waiting.leads = not self._leading
            if leads:
                self._leading = True
            else:
                self._wake_gatherer_if_full()
        if not leads:
            waiting.wait()
        if waiting.leads:
            self._lead(waiting)
        if waiting.error is not None:
            raise waiting.error

    def _lead(self, leader: _Waiting) -> None:
        """Gather a group (the leader is its first append), write it, wake each of its
        ticks, and hand the lead to the first append left queued, if any."""
        group = self._gather(leader)
        try:
            self._commit(group)
        finally:
            with self._lock:
                heir = self._queue[0] if self._queue else None
                self._leading = heir is not None
            for written in group:
                if written is not leader:
                    written.wake()
            if heir is not None:
                heir.leads = True
                heir.wake()

    def _gather(self, leader: _Waiting) -> list[_Waiting]:
        """Wait for the group to fill (or the wait to run out), then take it."""
        deadline = time.monotonic() + self.max_wait
        with self._lock:
            while not self._full():
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._gathering = leader
                self._lock.release()
                try:
                    leader.wait(left)
                finally:
                    self._lock.acquire()
                if self._gathering is leader:  # timed out: nobody will wake it now
                    self._gathering = None
                else:  # woken: its wake-up was used, the lock is held again
                    continue
            group, self._queue = self._queue[: self.max_batch], self._queue[self.max_batch :]
        return group

    def _full(self) -> bool:
        """Called holding the lock: every tick in flight has brought its append."""
        return len(self._queue) >= min(self.max_batch, max(self._in_flight, 1))

    def _wake_gatherer_if_full(self) -> None:
        """Called holding the lock: the one wake-up a gathering leader waits for."""
        gathering = self._gathering
        if gathering is not None and self._full():
            self._gathering = None
            gathering.wake()

    def _commit(self, group: list[_Waiting]) -> None:
        """Outside the lock: the next group gathers while this one is written."""
        try:
            if len(group) == 1:
                # A group of one is today's append, word for word.
                self.store.append(group[0].append.job, *group[0].append.keys)
                return
            refusals = self.store.append_many([w.append for w in group])
        except Exception as error:
            # The group's commit failed (or its acknowledgement was lost): each tick of
            # it gets its own copy of the error (a tick adds its claim to it) and handles
            # it as its own failed append.
            for waiting in group:
                waiting.error = _own(error)
            return
        for waiting, refusal in zip(group, refusals, strict=True):
            waiting.error = refusal


def _own(error: Exception) -> Exception:
    """A copy of the error for one tick; the error itself if it cannot be copied."""
    try:
        return copy(error)
    except Exception:
        return error


class SharedLoop:
    """One event loop, on its own thread, for every ``async def execute`` of a worker:
    each tick's thread waits for its own coroutine while the loop runs them all at once."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None

    def run(self, awaitable: Awaitable[T]) -> T:
        # Scheduled in a copy of this thread's context (call_soon_threadsafe's), so the
        # coroutine logs under the step's job fields and makes its spans the step's children.
        return asyncio.run_coroutine_threadsafe(_awaited(awaitable), self._started()).result()

    def _started(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._loop is None:
                loop = asyncio.new_event_loop()
                threading.Thread(
                    target=_serve, args=(loop,), name="jobledger-async-steps", daemon=True
                ).start()
                self._loop = loop
            return self._loop

    def close(self) -> None:
        with self._lock:
            loop, self._loop = self._loop, None
        if loop is not None:
            loop.call_soon_threadsafe(loop.stop)


def _serve(loop: asyncio.AbstractEventLoop) -> None:
    loop.run_forever()
    loop.close()


async def _awaited(awaitable: Awaitable[T]) -> T:
    return await awaitable
