"""PostgreSQL appends (issue 11, item 4): one round trip per append, and the table lock
that keeps notification ids committed in the order they were drawn.

Round trips are counted on the client: every exchange with the server goes through
``psycopg.Connection.wait`` (a send and the wait for its reply), every statement through
``Cursor.execute``."""

from __future__ import annotations

import threading
from collections.abc import Callable, Generator, Iterator
from datetime import timedelta
from typing import Any
from uuid import uuid4

import eventsourcing.utils
import psycopg
import pytest
from eventsourcing.persistence import StoredEvent

from jobledger.adapters.event_store import EventSourcedJobStore
from jobledger.adapters.store_url import parse_store_url
from jobledger.domain.errors import StoreUnavailableError, VersionConflict
from tests.contracts.job_store import AT, consumed, submitted
from tests.support.services import postgres_schema_url

POOL = 2


@pytest.fixture
def store() -> Iterator[EventSourcedJobStore]:
    for url in postgres_schema_url():
        opened = EventSourcedJobStore(parse_store_url(f"{url}&pool_size={POOL}"), partitions=1)
        yield opened
        opened.close()


class Exchanges:
    """Counts, while active, the client's exchanges with the server (the calls of
    ``Connection.wait`` whose generator touched the socket: a commit of a connection
    already idle, for one, waits on nothing) and its statements."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.exchanges = 0
        self.statements = 0
        wait, execute = psycopg.Connection.wait, psycopg.Cursor.execute

        def counted_wait(conn: Any, gen: Generator[Any, Any, Any], *args: Any, **kw: Any) -> Any:
            return wait(conn, self.observed(gen), *args, **kw)

        def counted_execute(curs: Any, *args: Any, **kwargs: Any) -> Any:
            self.statements += 1
            return execute(curs, *args, **kwargs)

        monkeypatch.setattr(psycopg.Connection, "wait", counted_wait)
        monkeypatch.setattr(psycopg.Cursor, "execute", counted_execute)

    def observed(self, gen: Generator[Any, Any, Any]) -> Generator[Any, Any, Any]:
        """``gen`` as it is, counted once if it asks to wait on the socket at all."""
        try:
            request = gen.send(None)
        except StopIteration as stop:
            return stop.value
        self.exchanges += 1
        while True:
            try:
                reply = yield request
            except BaseException as error:  # handed on to the generator
                try:
                    request = gen.throw(error)
                except StopIteration as stop:
                    return stop.value
                continue
            try:
                request = gen.send(reply)
            except StopIteration as stop:
                return stop.value

    def during(self, action: Callable[[], object]) -> tuple[int, int]:
        self.exchanges = self.statements = 0
        action()
        return self.exchanges, self.statements


def test_an_append_is_one_round_trip_and_one_statement(
    store: EventSourcedJobStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Each pooled connection prepares the statement on its first append (a round trip
    # of its own); every append after that only binds and executes it. Sequential
    # appends go round the pool's connections: these reach every one of them.
    for n in range(10):
        store.append(submitted(f"warm-{n}"))
    exchanges = Exchanges(monkeypatch)
    job = submitted("j")

    # A job and a key it consumes: two events, one transaction, one exchange.
    assert exchanges.during(lambda: store.append(job, consumed(job, "submit", "k"))) == (1, 1)
    job.cancel(reason="done", cancelled_by="ops", now=AT + timedelta(seconds=1))
    assert exchanges.during(lambda: store.append(job)) == (1, 1)


def test_a_conflict_is_still_a_conflict_and_writes_nothing(store: EventSourcedJobStore) -> None:
    job = submitted("j")
    store.append(job)
    stale = store.load(job.id)
    assert stale is not None
    job.cancel(reason="first", cancelled_by="ops", now=AT + timedelta(seconds=1))
    store.append(job)
    stale.cancel(reason="second", cancelled_by="ops", now=AT + timedelta(seconds=2))

    with pytest.raises(VersionConflict):
        store.append(stale)
    assert [getattr(e, "reason", None) for e in store.events(job.id)] == [None, "first"]


def test_a_table_lock_not_granted_in_time_is_a_store_error(
    store: EventSourcedJobStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The lock timeout of POSTGRES_LOCK_TIMEOUT still applies to the append's lock (whole
    seconds there: shortened here on the recorder, and the library's retry pause too)."""
    recorder: Any = store.partitions[0].recorder
    monkeypatch.setattr(recorder, "lock_timeout", "20ms")
    monkeypatch.setattr(eventsourcing.utils, "sleep", lambda seconds: None)
    table = f"{store.backend.schema}.{store.partitions[0].events_table}"
    with psycopg.connect(store.backend.conninfo()) as holder:
        holder.execute(f"LOCK TABLE {table} IN EXCLUSIVE MODE")
        with pytest.raises(StoreUnavailableError, match="lock timeout"):
            store.append(submitted("j"))
    store.append(submitted("j"))  # the lock released, the same append goes through
    assert store.load(submitted("j").id) is not None


def test_concurrent_appends_commit_their_notification_ids_in_order(
    store: EventSourcedJobStore,
) -> None:
    """A reader that moves its position to the highest id it has read never passes an id
    that commits later: with writers on one table racing, it still reads every id."""
    recorder: Any = store.partitions[0].recorder
    writers, appends = 4, 100
    done = threading.Event()
    read: list[int] = []

    def write() -> None:
        for _ in range(appends):
            originator = uuid4()
            recorder.insert_events(
                [StoredEvent(originator, v, "t", b"{}") for v in (1, 2)],
            )

    def follow() -> None:
        position = 0
        while True:
            finished = done.is_set()  # read once more after the last commit
            for note in recorder.select_notifications(position + 1, limit=1000):
                read.append(note.id)
                position = note.id
            if finished:
                return

    follower = threading.Thread(target=follow)
    follower.start()
    threads = [threading.Thread(target=write) for _ in range(writers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    done.set()
    follower.join()

    assert len(read) == writers * appends * 2
    assert read == sorted(set(read)) == list(range(1, len(read) + 1))


def test_a_partition_added_after_the_migration_gets_its_append_function() -> None:
    """Store migration 3 made the functions of the tables there were; a store opened
    later with more partitions makes each new table's function with the table."""
    for url in postgres_schema_url():
        EventSourcedJobStore(parse_store_url(url), partitions=1).close()
        wider = EventSourcedJobStore(parse_store_url(url), partitions=4)
        try:
            jobs = [submitted(job_id=f"j{n}") for n in range(16)]
            assert {wider.partition(job.id).name for job in jobs} != {"jobledger_p0"}
            for job in jobs:
                wider.append(job)
            assert all(wider.load(job.id) is not None for job in jobs)
        finally:
            wider.close()
