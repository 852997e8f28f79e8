"""Schedules on a Kafka deployment, through the real console scripts and the real broker:
two ``jobledger reconcile --transport kafka`` processes started together on a store where a
firing is due, and a ``jobledger worker --transport kafka``. Asserted: the firing makes
exactly one job (one ``Fired``, whichever reconciler won), its create tick is on the
ticks topic, and the worker runs it to completed.

The reconciler lock lets one of the two act at a time, so a second test races two firings
past it (as two reconcilers would if the lock were lost), each on an engine publishing to
the broker: still one job, run once by the worker."""

from __future__ import annotations

import os
import threading
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from jobledger import Engine, EngineConfig, JobStatus
from jobledger.adapters.clock import FakeClock
from jobledger.adapters.event_store import EventSourcedJobStore
from jobledger.adapters.kafka.messages import decode_tick
from jobledger.engine.schedule_commands import ScheduleFiring
from jobledger.projections import JobViews
from jobledger.workflows import DefinitionRegistry
from tests.support import pythonpath
from tests.support.fairness import NOOP_DEFINITION, runs
from tests.support.kafka_broker import KafkaTopics, read_topic, wait_for
from tests.test_kafka_chaos import Fleet

T = "sched-kafka"


def due_firing(engine: Engine, name: str) -> str:
    """A schedule whose one firing (this minute, once a year) is due now; its job id.

    Created on a clock a second before that minute, so the real clock of the reconciler
    processes finds it due. Catch-up ``one`` fires it even if the processes take more
    than a minute to start (it is then a missed firing), and the next firing is a year
    away: exactly one firing, whatever the wall clock."""
    minute = datetime.now(UTC).replace(second=0, microsecond=0)
    assert isinstance(engine.clock, FakeClock)
    engine.clock.set(minute - timedelta(seconds=1))
    view = engine.schedules.create(
        T,
        name,
        cron=f"{minute.minute} {minute.hour} {minute.day} {minute.month} *",
        timezone="UTC",
        workflow_type="noop",
        catch_up="one",
    )
    assert view.next_fire_at == minute
    return f"{name}@{minute:%Y-%m-%dT%H:%M:%S}Z"


def worker_env(store_url: str, topics: KafkaTopics, tmp_path: Path) -> dict[str, str]:
    """A Kafka deployment's environment, running the noop workflow and recording its runs."""
    (tmp_path / "defs").mkdir()
    (tmp_path / "defs" / "noop.yaml").write_text(NOOP_DEFINITION)
    return {
        **os.environ,
        **topics.env(),
        "PYTHONPATH": pythonpath(),
        "JOBLEDGER_STORE_URL": store_url,
        "JOBLEDGER_DEFINITIONS": str(tmp_path / "defs"),
        "JOBLEDGER_EXECUTOR": "tests.support.fairness:FileRunRecorder",
        "JOBLEDGER_TEST_RUNS": str(tmp_path / "runs"),
    }


def open_engine(store_url: str, tmp_path: Path, **config: Any) -> Engine:
    """An engine on a clock the test sets (the schedule's creation), publishing ticks to
    the broker when given the Kafka settings."""
    return Engine.open(
        registry=DefinitionRegistry.from_directory(tmp_path / "defs"),
        clock=FakeClock(),
        config=EngineConfig(store_url=store_url, worker_id="scheduler", **config),
    )


def create_ticks(topics: KafkaTopics) -> set[tuple[str, str]]:
    records = read_topic(topics.bootstrap, topics.ticks, at_least=1, timeout=15)
    return {(t.reason, t.job_id) for t in (decode_tick(r.value).tick for r in records)}


def job_ids(engine: Engine) -> list[str]:
    assert isinstance(engine.store, EventSourcedJobStore)
    views = JobViews(engine.store)
    views.catch_up()
    return [row.job_id for row in views.jobs(tenant_id=T)]


def fired(engine: Engine, name: str) -> list[object]:
    return [e.data["job_id"] for e in engine.schedules.history(T, name) if e.event_type == "Fired"]


@pytest.mark.slow
def test_two_kafka_reconcilers_fire_a_due_schedule_once_and_a_kafka_worker_runs_it(
    store_url: str, kafka_topics: KafkaTopics, tmp_path: Path
) -> None:
    fleet = Fleet(worker_env(store_url, kafka_topics, tmp_path), tmp_path)
    engine = open_engine(store_url, tmp_path)
    try:
        job_id = due_firing(engine, "nightly")
        fleet.service("reconciler-a", "reconcile", "--transport", "kafka")
        fleet.service("reconciler-b", "reconcile", "--transport", "kafka")
        fleet.start(0)
        wait_for(lambda: fired(engine, "nightly"), 45, "the firing")
        wait_for(lambda: engine.job(T, job_id).status is JobStatus.COMPLETED, 45, "its job ran")
        assert not fleet.crashed(), fleet.crashed()
    finally:
        fleet.stop()
    try:
        assert fired(engine, "nightly") == [job_id]
        assert engine.schedules.get(T, "nightly").fired == 1
        assert job_ids(engine) == [job_id]
        assert ("create", job_id) in create_ticks(kafka_topics)
        assert {job for _, job in create_ticks(kafka_topics)} == {job_id}
        assert ran(tmp_path) == [("begin", job_id), ("end", job_id)]
    finally:
        engine.close()


@pytest.mark.slow
def test_two_firings_racing_past_the_lock_on_kafka_still_make_one_job_run_once(
    store_url: str, kafka_topics: KafkaTopics, tmp_path: Path
) -> None:
    fleet = Fleet(worker_env(store_url, kafka_topics, tmp_path), tmp_path)
    engines = [open_engine(store_url, tmp_path, **kafka_topics.config()) for _ in range(2)]
    try:
        job_id = due_firing(engines[0], "racing")
        now = datetime.now(UTC)
        for engine in engines:
            assert isinstance(engine.clock, FakeClock)
            engine.clock.set(now)  # the moment both reconcilers fire at
        start = threading.Barrier(2)
        counts: list[int] = []

        def fire(engine: Engine) -> None:
            assert isinstance(engine.store, EventSourcedJobStore)
            views = JobViews(engine.store)
            views.catch_up()
            start.wait()
            counts.append(ScheduleFiring(engine.schedules, views).fire_due(now, 1_000))

        threads = [threading.Thread(target=fire, args=(e,)) for e in engines]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
        assert sorted(counts) == [0, 1]  # one Fired, recorded by one of them
        fleet.start(0)
        wait_for(lambda: engines[0].job(T, job_id).status is JobStatus.COMPLETED, 45, "its job ran")
        assert not fleet.crashed(), fleet.crashed()
    finally:
        fleet.stop()
    try:
        assert fired(engines[0], "racing") == [job_id]
        assert job_ids(engines[0]) == [job_id]
        assert ("create", job_id) in create_ticks(kafka_topics)
        assert ran(tmp_path) == [("begin", job_id), ("end", job_id)]
    finally:
        for engine in engines:
            engine.close()


def ran(tmp_path: Path) -> list[tuple[str, str]]:
    """What the worker ran: (begin|end, job id) in time order."""
    return [(kind, job) for kind, tenant, job, _ in runs(tmp_path / "runs") if tenant == T]
