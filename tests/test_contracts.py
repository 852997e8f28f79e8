"""Every port's contract (tests/contracts/) run on each adapter that implements it:

- JobStore (job_store.JobStoreContract): EventSourcedJobStore on SQLite and PostgreSQL
- Leases (leases.LeasesContract): the LeaseTable of each store
- Lock (lock.LockContract): FileLock beside a SQLite file, PostgreSQL's AdvisoryLock
- Queue (queue.QueueContract): LocalQueue; KafkaQueue in tests/test_kafka_contracts.py
- Cost (cost.CostContract): LogSpend and the spend view (JobViews), on both stores
- Notifier (notifier.NotifierContract): MemoryNotifier, and the tests' own Inbox
- ResumeTokens (tokens.ResumeTokensContract): JwtResumeTokens
- Clock (clock.ClockContract): SystemClock, FakeClock
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from jobledger import Engine, FunctionRegistry
from jobledger.adapters.backends.postgres import AdvisoryLock
from jobledger.adapters.backends.sqlite import FileLock
from jobledger.adapters.clock import FakeClock, SystemClock
from jobledger.adapters.event_store import EventSourcedJobStore
from jobledger.adapters.jwt_tokens import JwtResumeTokens
from jobledger.adapters.leases import LeaseTable
from jobledger.adapters.local_queue import LocalQueue
from jobledger.adapters.locks import lock_for
from jobledger.adapters.log_spend import LogSpend
from jobledger.adapters.notifier import MemoryNotifier
from jobledger.adapters.store_url import parse_store_url
from jobledger.orchestration.ports import ApprovalRequest, Cost, Notifier, Queue, Tick
from jobledger.projections import JobViews
from tests.contracts.clock import ClockContract
from tests.contracts.cost import CostContract, CostReader
from tests.contracts.job_store import JobStoreContract
from tests.contracts.leases import LeasesContract
from tests.contracts.lock import LockCode, LockContract, LockMaker
from tests.contracts.notifier import NotifierContract, Open
from tests.contracts.queue import QueueContract
from tests.contracts.tokens import ResumeTokensContract
from tests.support.engines import EngineFactory
from tests.support.notifiers import Inbox
from tests.support.services import postgres_schema_url

# ---- the stores: one empty store of each kind ------------------------------------------------


def sqlite_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path}/jobs.db"


@pytest.fixture
def sqlite_store(tmp_path: Path) -> Iterator[EventSourcedJobStore]:
    store = EventSourcedJobStore(parse_store_url(sqlite_url(tmp_path)), partitions=4)
    yield store
    store.close()


@pytest.fixture
def postgres_store() -> Iterator[EventSourcedJobStore]:
    for url in postgres_schema_url():
        store = EventSourcedJobStore(parse_store_url(url), partitions=4)
        yield store
        store.close()


class TestJobStoreOnSQLite(JobStoreContract):
    @pytest.fixture
    def store(self, sqlite_store: EventSourcedJobStore) -> EventSourcedJobStore:
        return sqlite_store


@pytest.mark.postgres
class TestJobStoreOnPostgreSQL(JobStoreContract):
    @pytest.fixture
    def store(self, postgres_store: EventSourcedJobStore) -> EventSourcedJobStore:
        return postgres_store


class TestLeasesOnSQLite(LeasesContract):
    @pytest.fixture
    def table(self, sqlite_store: EventSourcedJobStore) -> LeaseTable:
        return sqlite_store.leases


@pytest.mark.postgres
class TestLeasesOnPostgreSQL(LeasesContract):
    @pytest.fixture
    def table(self, postgres_store: EventSourcedJobStore) -> LeaseTable:
        return postgres_store.leases


# ---- locks -----------------------------------------------------------------------------------


class StoreUrlLocks(LockContract):
    """The lock ``lock_for`` gives a store URL, which must be a ``lock_type``."""

    lock_type: type[FileLock | AdvisoryLock]

    @pytest.fixture
    def make_lock(self, url: str) -> Iterator[LockMaker]:
        made: list[Any] = []

        def make(name: str) -> FileLock | AdvisoryLock:
            lock = lock_for(parse_store_url(url), name)
            assert isinstance(lock, self.lock_type)
            made.append(lock)
            return lock

        yield make
        for lock in made:
            lock.release()

    @pytest.fixture
    def lock_code(self, url: str) -> LockCode:
        return lambda name: _lock_code(url, name)


class TestFileLock(StoreUrlLocks):
    lock_type = FileLock

    @pytest.fixture
    def url(self, tmp_path: Path) -> str:
        return sqlite_url(tmp_path)


@pytest.mark.postgres
class TestAdvisoryLock(StoreUrlLocks):
    lock_type = AdvisoryLock

    @pytest.fixture
    def url(self) -> Iterator[str]:
        yield from postgres_schema_url()


def _lock_code(url: str, name: str) -> str:
    return (
        "from jobledger.adapters.locks import lock_for\n"
        "from jobledger.adapters.store_url import parse_store_url\n"
        f"lock = lock_for(parse_store_url({url!r}), {name!r})"
    )


# ---- queues ----------------------------------------------------------------------------------


class TestLocalQueue(QueueContract):
    dedupes = True

    @pytest.fixture
    def queue(self, clock: FakeClock) -> LocalQueue:
        self.received: list[Tick] = []
        return LocalQueue(clock)

    def delivered(self, queue: Queue, *, at_least: int) -> list[Tick]:
        assert isinstance(queue, LocalQueue)
        while (tick := queue.pop_due()) is not None:
            self.received.append(tick)
        return list(self.received)

    def test_a_delayed_tick_is_delivered_once_due(
        self, queue: LocalQueue, clock: FakeClock
    ) -> None:
        queue.enqueue(Tick("t", "j", "timer"), delay_ms=60_000)
        clock.advance(timedelta(seconds=59))
        assert self.delivered(queue, at_least=0) == []
        clock.advance(timedelta(seconds=1))
        assert self.delivered(queue, at_least=1) == [Tick("t", "j", "timer")]

    def test_due_ticks_are_handed_out_a_tenant_at_a_time(self, queue: LocalQueue) -> None:
        for n in range(5):
            queue.enqueue(Tick("big", f"a{n}", "created"))
        queue.enqueue(Tick("small", "b0", "created"))
        queue.enqueue(Tick("small", "b1", "created"))
        order = [(tick.tenant_id, tick.job_id) for tick in self.delivered(queue, at_least=7)]
        assert order == [
            ("big", "a0"),
            ("small", "b0"),
            ("big", "a1"),
            ("small", "b1"),
            ("big", "a2"),
            ("big", "a3"),
            ("big", "a4"),
        ]
        assert len(queue) == 0 and queue.next_due() is None

    def test_a_tenant_whose_ticks_are_not_due_does_not_hold_up_the_others(
        self, queue: LocalQueue, clock: FakeClock
    ) -> None:
        queue.enqueue(Tick("later", "l", "timer"), delay_ms=60_000)
        queue.enqueue(Tick("now", "n", "created"))
        assert queue.pop_due() == Tick("now", "n", "created")
        assert queue.pop_due() is None
        assert queue.next_due() == clock.now() + timedelta(seconds=60)


# ---- cost ------------------------------------------------------------------------------------


class TestLogSpend(CostContract):
    @pytest.fixture
    def engine(self, make_engine: EngineFactory) -> Engine:
        return make_engine()

    @pytest.fixture
    def cost(self, engine: Engine) -> CostReader:
        assert isinstance(engine.store, EventSourcedJobStore)
        spend = LogSpend(engine.store)  # one instance, following the log across reads
        return lambda: spend


class TestSpendView(CostContract):
    @pytest.fixture
    def engine(self, make_engine: EngineFactory) -> Engine:
        return make_engine()

    @pytest.fixture
    def cost(self, engine: Engine) -> CostReader:
        assert isinstance(engine.store, EventSourcedJobStore)
        views = JobViews(engine.store)

        def caught_up() -> Cost:
            views.catch_up()  # what the projection runner does as the log grows
            return views

        return caught_up


# ---- notifiers -------------------------------------------------------------------------------


@pytest.fixture
def open_engine(make_engine: EngineFactory) -> Open:
    def open_(notifier: Notifier, registry: FunctionRegistry) -> Engine:
        return make_engine(notifier=notifier, registry=registry)

    return open_


class TestMemoryNotifier(NotifierContract):
    @pytest.fixture
    def notifier(self) -> MemoryNotifier:
        return MemoryNotifier()

    def tokens(self, notifier: Notifier) -> list[str]:
        assert isinstance(notifier, MemoryNotifier)
        return [issued.token for _, issued in notifier.tokens]

    def approvals(self, notifier: Notifier) -> list[ApprovalRequest]:
        assert isinstance(notifier, MemoryNotifier)
        return list(notifier.approvals)


class TestInbox(NotifierContract):
    @pytest.fixture
    def notifier(self) -> Inbox:
        return Inbox()

    def tokens(self, notifier: Notifier) -> list[str]:
        assert isinstance(notifier, Inbox)
        return [issued.token for issued in notifier.tokens.values()]

    def approvals(self, notifier: Notifier) -> list[ApprovalRequest]:
        assert isinstance(notifier, Inbox)
        return list(notifier.approvals.values())


# ---- resume tokens and clocks ----------------------------------------------------------------


def jwt_tokens(secret: str, ttl: timedelta) -> JwtResumeTokens:
    return JwtResumeTokens(
        secret=secret,
        key_id="k1",
        ttl_seconds=int(ttl.total_seconds()),
        issuer="jobledger",
        audience="jobledger.resume",
    )


class TestJwtResumeTokens(ResumeTokensContract):
    @pytest.fixture
    def tokens(self) -> JwtResumeTokens:
        return jwt_tokens("contract-secret-contract-secret-0123", self.ttl)

    @pytest.fixture
    def stranger(self) -> JwtResumeTokens:
        return jwt_tokens("another-secret-another-secret-01234", self.ttl)


class TestSystemClock(ClockContract):
    @pytest.fixture
    def clock(self) -> SystemClock:
        return SystemClock()


class TestFakeClock(ClockContract):
    """The ``clock`` fixture of tests/conftest.py."""
