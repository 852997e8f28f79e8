"""Every reader of the job log follows it the same way: one follower reads the
partitions' notification logs, and the readers that keep their work in the store are
their own tracking recorders (rows and position in one transaction, through no private
method of the library). The spend is folded once, by the same rule, wherever it is kept."""

from __future__ import annotations

import re
from collections.abc import Callable
from decimal import Decimal
from pathlib import Path

import pytest
from eventsourcing.persistence import Tracking, TrackingRecorder

from jobledger import Engine
from jobledger.adapters.clock import FakeClock
from jobledger.adapters.event_store import EventSourcedJobStore
from jobledger.adapters.follower import LogFollower
from jobledger.adapters.log_spend import LogSpend
from jobledger.domain.spend import spend_of
from jobledger.projections import JobViews, ProjectionRunner
from jobledger.projections.outbox import Outbox, OutboxRunner

ROOT = Path(__file__).resolve().parent.parent
EngineFactory = Callable[..., Engine]


def sources() -> dict[str, str]:
    found = {}
    for base in (ROOT / "src" / "jobledger", ROOT / "projections"):
        for path in sorted(base.rglob("*.py")):
            found[str(path.relative_to(ROOT))] = path.read_text()
    return found


def test_only_the_follower_reads_the_notification_log() -> None:
    readers = [name for name, text in sources().items() if "select_notifications(" in text]
    assert readers == ["src/jobledger/adapters/follower.py"]


def test_nothing_calls_the_librarys_private_tracking_methods() -> None:
    private = re.compile(r"\._(insert_tracking|max_tracking_id)\b")
    assert [name for name, text in sources().items() if private.search(text)] == []


def store_of(engine: Engine) -> EventSourcedJobStore:
    assert isinstance(engine.store, EventSourcedJobStore)
    return engine.store


def test_the_views_are_their_own_tracking_recorder(make_engine: EngineFactory) -> None:
    engine = make_engine()
    engine.submit("t", "j", "agent3")
    engine.run_until_idle()
    store = store_of(engine)
    views = JobViews(store)
    (partition,) = store.partitions

    views.catch_up()

    assert isinstance(views, TrackingRecorder)
    assert views.max_tracking_id(partition.name) == partition.recorder.max_notification_id()
    # The library's interface records a position of its own, compare-and-swapped.
    views.insert_tracking(Tracking("elsewhere", 7))
    assert views.max_tracking_id("elsewhere") == 7
    assert views.max_tracking_id("nowhere") is None


def test_every_reader_and_service_is_the_one_follower(make_engine: EngineFactory) -> None:
    store = store_of(make_engine())
    views = JobViews(store)
    outbox = Outbox(store, publisher=NoPublisher())
    spend = LogSpend(store)

    for reader in (views, outbox, spend):
        assert isinstance(reader.follower, LogFollower)
        assert reader.follower.reader is reader
    assert isinstance(ProjectionRunner(views), LogFollower)
    assert isinstance(OutboxRunner(outbox), LogFollower)


class NoPublisher:
    def publish(self, messages: object) -> None:
        pass


def test_the_in_memory_spend_and_the_spend_view_fold_alike(
    make_engine: EngineFactory, clock: FakeClock
) -> None:
    engine = make_engine()
    engine.submit("t", "a", "agent3")
    engine.submit("u", "b", "agent3")
    engine.run_until_idle()
    store = store_of(engine)
    views = JobViews(store)
    views.catch_up()

    for tenant in ("t", "u"):
        in_memory = LogSpend(store).tenant_day_spend_usd(tenant, clock.now())
        assert in_memory == views.tenant_day_spend_usd(tenant, clock.now()) == Decimal("0.30")


@pytest.mark.parametrize("cost", [Decimal(0), None])
def test_a_step_without_cost_spends_nothing(cost: Decimal | None) -> None:
    from datetime import UTC, datetime
    from uuid import uuid4

    from jobledger.domain.job import Job

    event = object.__new__(Job.StepRecorded)
    event.__dict__.update(
        originator_id=uuid4(), cost_usd=cost, ended_at=datetime(2026, 1, 1, tzinfo=UTC)
    )
    assert spend_of("t", event) is None
