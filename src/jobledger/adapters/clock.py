"""Clocks: the system clock, this host's clock set to the store's, and a fake one that
tests and the demo move by hand."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

from jobledger.orchestration.ports import Clock

log = logging.getLogger(__name__)

REFRESH_SECONDS = 30.0
"""How often a process measures its clock against the store's again."""
SAMPLES = 3


class SystemClock:
    def now(self) -> datetime:
        return datetime.now(UTC)

    def sleep(self, seconds: float) -> None:
        time.sleep(max(0.0, seconds))


class StoreTimeClock:
    """``local`` (this host's clock) plus its offset from the store's clock, measured when
    made and every ``refresh`` seconds after, on a thread of its own: every process then
    keeps the store's time whatever its host's clock says, so a timer one worker sets is
    due by another's clock at the same moment and a lease lapses for all of them at once.
    The offset is off by at most half the quickest of ``SAMPLES`` round trips."""

    def __init__(
        self,
        local: Clock,
        store_clock: Callable[[], datetime],
        *,
        refresh: float = REFRESH_SECONDS,
    ) -> None:
        self.local = local
        self.store_clock = store_clock
        self.offset = self.measure()
        """The store's time minus this host's."""
        self._stopping = threading.Event()
        self._thread = threading.Thread(
            target=self._remeasure, args=(refresh,), name="jobledger-store-time", daemon=True
        )
        self._thread.start()

    def now(self) -> datetime:
        return self.local.now() + self.offset

    def sleep(self, seconds: float) -> None:
        self.local.sleep(seconds)

    def measure(self) -> timedelta:
        """The store read its clock somewhere within the round trip: taken at its middle,
        from the sample whose round trip was quickest."""
        samples = []
        for _ in range(SAMPLES):
            before = self.local.now()
            theirs = self.store_clock()
            after = self.local.now()
            samples.append((after - before, theirs - (before + (after - before) / 2)))
        return min(samples)[1]

    def close(self) -> None:
        self._stopping.set()

    def _remeasure(self, refresh: float) -> None:
        # Not done inside now(): a caller may hold the store's last pooled connection.
        while not self._stopping.wait(refresh):
            try:
                self.offset = self.measure()
            except Exception as error:  # the store away, or closing: the last offset stands
                if not self._stopping.is_set():
                    log.warning("could not read the store's clock: %s", error)


class FakeClock:
    """Time stands still until someone sleeps or advances it."""

    def __init__(self, start: datetime | None = None) -> None:
        self._now = start or datetime(2026, 1, 1, tzinfo=UTC)
        self._lock = threading.Lock()

    def now(self) -> datetime:
        with self._lock:
            return self._now

    def sleep(self, seconds: float) -> None:
        self.advance(timedelta(seconds=max(0.0, seconds)))

    def advance(self, delta: timedelta) -> None:
        with self._lock:
            self._now += delta

    def set(self, moment: datetime) -> None:
        with self._lock:
            self._now = max(self._now, moment)
