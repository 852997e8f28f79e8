"""Following the job log: one mechanism for every reader of it (the views, the outbox,
the in-memory spend).

A :class:`LogReader` says where it is in each partition's log and processes a batch; a
:class:`LogFollower` reads each partition from there in batches, hands them over, and,
run as a service, waits for new events the way the store's backend can (LISTEN/NOTIFY on
PostgreSQL, polling on SQLite), backing off after a failed pass instead of stalling.

A durable reader is its own tracking recorder (:class:`TrackedReader`, an eventsourcing
``TrackingRecorder``): it writes what a batch changes and its new position in one
transaction, so it is never ahead of or behind what it has done.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from typing import Protocol

from eventsourcing.persistence import Notification, PersistenceError, Tracking, TrackingRecorder

from jobledger.adapters.backends import Cursor, StoreBackend, TrackingConflict, Waiter
from jobledger.adapters.event_store import EventSourcedJobStore, LedgerPartition
from jobledger.adapters.store_errors import store_errors
from jobledger.domain.errors import StoreUnavailableError

log = logging.getLogger(__name__)

BATCH = 200
MAX_BACKOFF_SECONDS = 30.0
Progress = Callable[[int, int], None]


@dataclass(frozen=True)
class Lag:
    partition: str
    """The reader's name for the partition's log (its tracking name)."""
    last_event: int
    last_tracked: int

    @property
    def behind(self) -> int:
        return self.last_event - self.last_tracked


class Positions(Protocol):
    def tracking_name(self, partition: LedgerPartition) -> str:
        """Its name for its position in ``partition``'s log."""

    def position(self, partition: LedgerPartition) -> int:
        """The last notification of ``partition`` it has processed (0: none)."""


class LogReader(Positions, Protocol):
    @property
    def topics(self) -> Sequence[str]:
        """The event topics it reads (empty: every event)."""

    def process(self, partition: LedgerPartition, notifications: Sequence[Notification]) -> None:
        """Apply a batch read from after its position, and move its position to the
        batch's last notification."""


@store_errors("reading the lag")
def lag(store: EventSourcedJobStore, reader: Positions) -> list[Lag]:
    """Per partition: the last event, the last one ``reader`` processed."""
    return [
        Lag(reader.tracking_name(p), p.recorder.max_notification_id() or 0, reader.position(p))
        for p in store.partitions
    ]


@store_errors("reading the oldest event not yet read")
def pending_since(store: EventSourcedJobStore, reader: Positions) -> dict[str, datetime | None]:
    """Per partition: when the oldest event ``reader`` has not processed was written
    (None: it is caught up), from one notification each: how many seconds it is behind."""
    found: dict[str, datetime | None] = {}
    for partition in store.partitions:
        after = partition.recorder.select_notifications(
            reader.position(partition), 1, inclusive_of_start=False
        )
        event = partition.mapper.to_domain_event(after[0]) if after else None
        found[reader.tracking_name(partition)] = getattr(event, "timestamp", None)
    return found


class TrackedReader(TrackingRecorder):
    """A reader whose positions live in the store's tracking table (one row per
    partition's log), written by the reader in its own transactions."""

    topics: Sequence[str] = ()

    def __init__(self, store: EventSourcedJobStore) -> None:
        self.store = store
        self.backend: StoreBackend = store.backend

    def tracking_name(self, partition: LedgerPartition) -> str:
        return partition.name

    def position(self, partition: LedgerPartition) -> int:
        return self.max_tracking_id(self.tracking_name(partition)) or 0

    # ---- the library's TrackingRecorder ------------------------------------------------

    def max_tracking_id(self, application_name: str) -> int | None:
        return self.backend.position(application_name) or None

    def insert_tracking(self, tracking: Tracking) -> None:
        """Record a position on its own (a reader whose work is not in the store)."""
        with self.backend.transaction() as curs:
            after = self.backend.position(tracking.application_name, curs)
            self.track(curs, tracking, after=after)

    # ---- one transaction for the rows and the position ----------------------------------

    @contextmanager
    def tracked(self, partition: LedgerPartition) -> Iterator[tuple[Cursor, int]]:
        """A transaction and the position as it reads inside it; the caller writes its
        rows and calls :meth:`track`. A concurrent reader that got there first makes the
        whole transaction roll back (logged, not raised: the work is done)."""
        try:
            with self.backend.transaction() as curs:
                yield curs, self.backend.position(self.tracking_name(partition), curs)
        except TrackingConflict:
            log.info("another reader processed %s up to here first", partition.name)

    def track(self, curs: Cursor, tracking: Tracking, *, after: int) -> None:
        self.backend.track(curs, tracking.application_name, old=after, new=tracking.notification_id)


class LogFollower:
    """Reads every partition's log after the reader's position, ``batch`` notifications
    at a time, and hands each batch to the reader."""

    what = "pass"
    retried: tuple[type[Exception], ...] = (PersistenceError, StoreUnavailableError)

    def __init__(
        self,
        store: EventSourcedJobStore,
        reader: LogReader,
        *,
        batch: int = BATCH,
        poll_interval: float = 0.5,
    ) -> None:
        self.store = store
        self.reader = reader
        self.batch = batch
        self.poll_interval = poll_interval
        self.stopping = threading.Event()
        self.failures = 0
        """Consecutive failed passes; visible to status checks."""
        self._waiter: Waiter | None = None

    # ---- reading -------------------------------------------------------------------------

    @store_errors("reading new events")
    def pending(self, partition: LedgerPartition) -> Sequence[Notification]:
        notifications: Sequence[Notification] = partition.recorder.select_notifications(
            self.reader.position(partition),
            self.batch,
            topics=self.reader.topics,
            inclusive_of_start=False,
        )
        return notifications

    def catch_up(self, progress: Progress | None = None) -> int:
        """Hand the reader everything appended so far; returns how many notifications
        were read."""
        done = 0
        total = sum(entry.behind for entry in self.lag()) if progress else 0
        for partition in self.store.partitions:
            while batch := self.pending(partition):
                self.reader.process(partition, batch)
                done += len(batch)
                if progress:
                    progress(done, total)
                if len(batch) < self.batch:
                    break
        return done

    def lag(self) -> list[Lag]:
        return lag(self.store, self.reader)

    def pending_since(self) -> dict[str, datetime | None]:
        return pending_since(self.store, self.reader)

    # ---- run as a service ------------------------------------------------------------------

    def run_forever(self) -> None:
        """One pass, then wait for new events (or the poll interval); after a failed
        pass, back off exponentially."""
        waiter = self.store.backend.waiter([p.recorder for p in self.store.partitions])
        self._waiter = waiter
        try:
            while not self.stopping.is_set():
                if self.run_once():
                    waiter.wait(self.poll_interval)
                else:
                    self.stopping.wait(self.backoff())
        finally:
            waiter.close()
            self.stopped()

    def run_once(self) -> bool:
        """One pass; False after an error it retries (logged, then backed off)."""
        try:
            self.follow()
        except self.retried:
            self.failures += 1
            log.warning(
                "%s failed (%d in a row); retrying after %.1fs",
                self.what,
                self.failures,
                self.backoff(),
                exc_info=True,
            )
            return False
        self.failures = 0
        return True

    def follow(self) -> None:
        """One pass (a service may guard it, e.g. with a lock)."""
        self.catch_up()

    def stopped(self) -> None:
        """Called once the loop has ended."""

    def backoff(self) -> float:
        delay: float = min(MAX_BACKOFF_SECONDS, 0.5 * 2.0 ** max(0, self.failures - 1))
        return delay

    def stop(self) -> None:
        self.stopping.set()
        waiter = self._waiter
        if waiter is not None:
            waiter.close()  # a pass waiting for new events ends now, not after the poll
