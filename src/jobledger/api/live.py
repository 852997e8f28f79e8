"""Live updates: a job's events as they are appended, as Server-Sent Events.

One :class:`LogBell` per server follows every partition's notification log with the
log follower every other reader uses (:class:`~jobledger.adapters.follower.LogFollower`),
woken the way the store's backend offers (LISTEN/NOTIFY on PostgreSQL, polling on
SQLite). It does not hand events out: it only rings the streams of the jobs that moved.
Each stream then reads its own job's events after the last version it sent, straight
from the job's history. So a stream's cursor is the event version (the SSE id, and so
``Last-Event-ID`` on a reconnect): it can skip nothing and send nothing twice, however
the rings and reads interleave, and a client that resumes gets exactly what it missed.

The bell follows from the log's head when it starts (a stream reads its past itself),
and holds one store connection for the LISTEN however many streams are open.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
import threading
from collections.abc import AsyncIterator, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Final
from uuid import UUID

from eventsourcing.persistence import Notification

from jobledger.adapters.event_store import EventSourcedJobStore, LedgerPartition
from jobledger.adapters.follower import LogFollower
from jobledger.adapters.store_errors import store_errors
from jobledger.api.models import Event
from jobledger.api.problems import of_error
from jobledger.domain.errors import BrokenHistoryError, InvalidPayloadError, StoreUnavailableError
from jobledger.domain.job import Job
from jobledger.domain.views import HistoryEntry

log = logging.getLogger(__name__)

_VERSION: Final = re.compile(r"[0-9]{1,19}")
"""An event version as a stream's client sends it back: ASCII digits only (``int`` also
reads "٣", "1_0", "+1" and " 1 "), and no longer than the store's largest integer."""

READ_BATCH: Final = 200
"""Events read (and sent) per query: a stream resumed far back catches up in pages."""
RETRY_MS: Final = 1000
"""What a stream tells EventSource clients to wait before reconnecting."""
STORE_RETRY_SECONDS: Final = 1.0


def resume_after(last_event_id: str | None, after: int | None, head: int) -> int:
    """The version a stream goes on after: ``Last-Event-ID`` wins (it is what the client
    last got), else ``after``, else the start; one of the job's versions (0 to ``head``),
    or InvalidPayloadError saying what was sent."""
    if last_event_id is None:
        version = after or 0
    elif _VERSION.fullmatch(last_event_id):
        version = int(last_event_id)
    else:
        raise InvalidPayloadError(
            f"Last-Event-ID must be an event version (up to 19 digits 0-9), got {last_event_id!r}"
        )
    if version < 0:
        raise InvalidPayloadError(f"a stream starts after a version of 0 or more, not {version}")
    if version > head:
        raise InvalidPayloadError(f"the job has no event v{version} (its last is v{head})")
    return version


class LogBell:
    """Follows the log (from its head at :meth:`start`) and rings the subscribers of
    every job that moved. A reader of the log, kept in memory like ``LogSpend``."""

    topics: Sequence[str] = ()
    """Every event: keys and jobs share the tables; only subscribed jobs are rung."""

    def __init__(self, store: EventSourcedJobStore, *, poll_interval: float = 0.5) -> None:
        self.store = store
        self.follower = LogFollower(store, self, poll_interval=poll_interval)
        self.follower.what = "following the log for live streams"
        self._positions: dict[str, int] = {}
        self._subscribers: dict[UUID, set[Subscription]] = {}
        self._mutex = threading.Lock()
        self._thread: threading.Thread | None = None
        self.closed = threading.Event()

    # ---- the LogReader ------------------------------------------------------------------

    def tracking_name(self, partition: LedgerPartition) -> str:
        return f"{partition.name}.live"

    def position(self, partition: LedgerPartition) -> int:
        return self._positions.get(partition.name, 0)

    def process(self, partition: LedgerPartition, notifications: Sequence[Notification]) -> None:
        self._positions[partition.name] = notifications[-1].id
        moved = {_uuid(n.originator_id) for n in notifications}
        with self._mutex:
            rung = [s for job in moved for s in self._subscribers.get(job, ())]
        for subscription in rung:
            subscription.ring()

    # ---- running --------------------------------------------------------------------------

    def start(self) -> None:
        """Start following from the log's head (idempotent)."""
        with self._mutex:
            if self._thread is not None or self.closed.is_set():
                return
            with store_errors("reading the log's head"):
                for partition in self.store.partitions:
                    head = partition.recorder.max_notification_id() or 0
                    self._positions[partition.name] = head
            self._thread = threading.Thread(
                target=self.follower.run_forever, name="jobledger-live", daemon=True
            )
            self._thread.start()

    def close(self) -> None:
        """Stop following and end every stream (each sends what it has, then closes)."""
        self.closed.set()
        self.follower.stop()
        with self._mutex:
            everyone = [s for subs in self._subscribers.values() for s in subs]
            thread = self._thread
        for subscription in everyone:
            subscription.ring()
        if thread is not None:
            thread.join(timeout=5)

    @contextlib.contextmanager
    def subscribe(self, job_uuid: UUID) -> Iterator[Subscription]:
        """Be rung (on the calling event loop) whenever ``job_uuid`` may have moved."""
        self.start()
        subscription = Subscription(asyncio.get_running_loop())
        with self._mutex:
            self._subscribers.setdefault(job_uuid, set()).add(subscription)
        try:
            yield subscription
        finally:
            with self._mutex:
                members = self._subscribers.get(job_uuid, set())
                members.discard(subscription)
                if not members:
                    self._subscribers.pop(job_uuid, None)

    @property
    def streams(self) -> int:
        """How many streams are open (for tests and status)."""
        with self._mutex:
            return sum(len(members) for members in self._subscribers.values())


@dataclass(eq=False)
class Subscription:
    """A stream's doorbell: set from the bell's thread, awaited on the stream's loop."""

    loop: asyncio.AbstractEventLoop
    rung: asyncio.Event = field(default_factory=asyncio.Event)

    def ring(self) -> None:
        with contextlib.suppress(RuntimeError):  # the stream's loop has already closed
            self.loop.call_soon_threadsafe(self.rung.set)

    async def wait(self, timeout: float) -> bool:
        """Whether it was rung within ``timeout`` seconds (then it is ready again)."""
        try:
            await asyncio.wait_for(self.rung.wait(), timeout)
        except TimeoutError:
            return False
        self.rung.clear()
        return True


# ---- the stream ------------------------------------------------------------------------------


@store_errors("reading events")
def events_after(
    store: EventSourcedJobStore, job_uuid: UUID, version: int, limit: int = READ_BATCH
) -> list[Job.Event]:
    """The job's events after ``version``, at most ``limit``, in order: up to the first
    row that no longer decodes, which raises once nothing before it is left to send."""
    partition = store.partition(job_uuid)
    found: list[Job.Event] = []
    for stored in partition.recorder.select_events(job_uuid, gt=version, limit=limit):
        try:
            event = partition.mapper.to_domain_event(stored)
        except Exception:  # a row that no longer decodes: stop there, as load does
            if found:
                return found
            raise BrokenHistoryError(str(job_uuid), stored.originator_version) from None
        if isinstance(event, Job.Event):
            found.append(event)
    return found


def frame(entry: HistoryEntry) -> str:
    """One SSE message: the version as its id, the event type as its name, the event as
    the history endpoint gives it, in compact JSON (no raw newline can end the data line
    early)."""
    data = Event.of(entry).model_dump_json()
    return f"id: {entry.version}\nevent: {entry.event_type}\ndata: {data}\n\n"


def broken_frame(error: BrokenHistoryError) -> str:
    """The last message of a stream whose history breaks: ``event: error``, with the
    problem the API answers a broken history with."""
    problem = of_error(error)
    data = json.dumps(
        {"status": problem.status, "error": problem.error, "detail": problem.detail},
        separators=(",", ":"),
    )
    return f"event: error\ndata: {data}\n\n"


HEARTBEAT: Final = ": heartbeat\n\n"
"""A comment line: keeps proxies and clients from timing the stream out."""


async def job_events(
    bell: LogBell, job_uuid: UUID, after: int, *, heartbeat_seconds: float
) -> AsyncIterator[str]:
    """The job's events after version ``after``, then each new one as it is appended,
    until the bell closes (the server stops) or the client goes away. A comment every
    ``heartbeat_seconds`` while nothing happens. A store outage is waited out (the
    stream resumes where it was); a broken history ends the stream with an ``error``
    message (:func:`broken_frame`)."""
    store = bell.store
    with bell.subscribe(job_uuid) as subscription:
        yield f"retry: {RETRY_MS}\n\n"
        while not bell.closed.is_set():
            subscription.rung.clear()  # a ring from here on means: read again
            try:
                events = await asyncio.to_thread(events_after, store, job_uuid, after)
            except StoreUnavailableError as error:
                log.warning("live stream of %s: %s; retrying", job_uuid, error)
                await asyncio.sleep(STORE_RETRY_SECONDS)
                continue
            except BrokenHistoryError as error:
                # What came before the break was sent; a problem says where it is, and
                # the stream ends (nothing after a broken link can be trusted).
                yield broken_frame(error)
                return
            for event in events:
                yield frame(HistoryEntry.of(event))
                after = event.originator_version
            if events:
                continue  # a full page, or one cut short by a broken row: read on first
            if not await subscription.wait(heartbeat_seconds) and not bell.closed.is_set():
                yield HEARTBEAT


def _uuid(value: object) -> UUID:
    return value if isinstance(value, UUID) else UUID(str(value))
