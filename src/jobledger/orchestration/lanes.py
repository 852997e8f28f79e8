"""Lanes: work handled up to N items at once, one at a time per key, in order per key.

A worker runs many jobs' ticks at once so that their step appends can share a group
commit, but never two ticks of one job at once: they would only race for its claim (and
a job's signals must keep their order). Each key (a job) is a lane; lanes run on a
bounded set of threads, and a lane's next item runs after its previous one, on
whichever thread is free.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

log = logging.getLogger(__name__)

T = TypeVar("T")


class Lanes(Generic[T]):
    def __init__(
        self,
        width: int,
        handle: Callable[[T], None],
        key_of: Callable[[T], Hashable],
        *,
        name: str = "jobledger-lane",
    ) -> None:
        if width < 1:
            raise ValueError(f"lanes need a width of at least 1, not {width}")
        self.width = width
        self.handle = handle
        self.key_of = key_of
        self.name = name
        self._changed = threading.Condition()
        self._lanes: dict[Hashable, deque[T]] = {}
        """Each key with work, its head item being handled or about to be."""
        self._ready: deque[Hashable] = deque()
        """Keys whose head item waits for a thread."""
        self._threads: list[threading.Thread] = []
        self._closed = False

    def put(self, item: T) -> None:
        """Queue ``item`` behind its key's earlier items; never blocks."""
        key = self.key_of(item)
        with self._changed:
            if self._closed:
                raise RuntimeError("these lanes are closed")
            lane = self._lanes.get(key)
            if lane is not None:
                lane.append(item)
                return
            self._lanes[key] = deque([item])
            self._ready.append(key)
            self._grow()
            self._changed.notify_all()

    def busy(self) -> int:
        """How many keys have work queued or running."""
        with self._changed:
            return len(self._lanes)

    def wait_below(self, keys: int, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for fewer than ``keys`` keys to have work."""
        with self._changed:
            return self._changed.wait_for(lambda: len(self._lanes) < keys, timeout)

    def join(self) -> None:
        """Wait until every item put so far has been handled."""
        with self._changed:
            self._changed.wait_for(lambda: not self._lanes)

    def widen(self, width: int) -> None:
        """Let up to ``width`` keys run at once from now on (threads already started stay)."""
        with self._changed:
            self.width = max(self.width, width)

    def withdraw(self) -> list[T]:
        """Take back every item not yet started, in order, and wait for the ones being
        handled to finish: the lanes stay open for more work."""
        with self._changed:
            ready = set(self._ready)
            left: list[T] = []
            for key, lane in list(self._lanes.items()):
                started = key not in ready
                left.extend(list(lane)[1:] if started else lane)
                if started:
                    while len(lane) > 1:
                        lane.pop()
                else:
                    del self._lanes[key]
            self._ready.clear()
            self._changed.wait_for(lambda: not self._lanes)
            return left

    def close(self) -> list[T]:
        """Stop after the items being handled; return those never started, in order."""
        with self._changed:
            self._closed = True
            self._changed.notify_all()
        for thread in self._threads:
            thread.join()
        with self._changed:
            left = [item for lane in self._lanes.values() for item in lane]
            self._lanes.clear()
            self._ready.clear()
            return left

    def _grow(self) -> None:
        # A thread per busy key up to the width: an idle worker keeps no threads warm
        # beyond what it once needed.
        if len(self._threads) < min(self.width, len(self._lanes)):
            thread = threading.Thread(
                target=self._work, name=f"{self.name}-{len(self._threads)}", daemon=True
            )
            self._threads.append(thread)
            thread.start()

    def _work(self) -> None:
        while True:
            with self._changed:
                self._changed.wait_for(lambda: self._closed or bool(self._ready))
                if self._closed:
                    return
                key = self._ready.popleft()
                item = self._lanes[key][0]
            try:
                self.handle(item)
            except Exception:  # the handler reports its own errors; a bug must not stall
                log.exception("%s: an item of %r failed", self.name, key)
            with self._changed:
                lane = self._lanes[key]
                lane.popleft()
                if lane:
                    self._ready.append(key)
                else:
                    del self._lanes[key]
                self._changed.notify_all()
