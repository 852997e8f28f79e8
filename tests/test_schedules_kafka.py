"""Schedules on a Kafka deployment, through the real console scripts and the real broker:
two ``jobledger reconcile --transport kafka`` processes started together on a store where a
firing is due, and a ``jobledger worker --transport kafka``. Asserted: the firing makes
exactly one job (one ``Fired``, whichever reconciler won), its create tick is on the
ticks topic, and the worker runs it to completed.

The reconciler lock lets one of the two act at a time; the firing's own idempotence (two
firings racing past that lock) is tested in process in tests/test_schedules.py."""

from __future__ import annotations

import os
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from projections import JobViews

from jobledger import Engine, EngineConfig, JobStatus
from jobledger.adapters.clock import FakeClock
from jobledger.adapters.event_store import EventSourcedJobStore
from jobledger.adapters.kafka.messages import decode_tick
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


@pytest.mark.slow
def test_two_kafka_reconcilers_fire_a_due_schedule_once_and_a_kafka_worker_runs_it(
    store_url: str, kafka_topics: KafkaTopics, tmp_path: Path
) -> None:
    (tmp_path / "defs").mkdir()
    (tmp_path / "defs" / "noop.yaml").write_text(NOOP_DEFINITION)
    record = tmp_path / "runs"
    env = {
        **os.environ,
        **kafka_topics.env(),
        "PYTHONPATH": pythonpath(),
        "JOBLEDGER_STORE_URL": store_url,
        "JOBLEDGER_DEFINITIONS": str(tmp_path / "defs"),
        "JOBLEDGER_EXECUTOR": "tests.support.fairness:FileRunRecorder",
        "JOBLEDGER_TEST_RUNS": str(record),
    }
    registry = DefinitionRegistry.from_directory(tmp_path / "defs")
    engine = Engine.open(
        registry=registry,
        clock=FakeClock(),
        config=EngineConfig(store_url=store_url, worker_id="scheduler"),
    )
    fleet = Fleet(env, tmp_path)
    try:
        job_id = due_firing(engine, "nightly")
        fleet.service("reconciler-a", "reconcile", "--transport", "kafka")
        fleet.service("reconciler-b", "reconcile", "--transport", "kafka")
        fleet.start(0)
        history = lambda: engine.schedules.history(T, "nightly")  # noqa: E731
        wait_for(lambda: any(e.event_type == "Fired" for e in history()), 45, "the firing")
        wait_for(lambda: engine.job(T, job_id).status is JobStatus.COMPLETED, 45, "its job ran")
        assert not fleet.crashed(), fleet.crashed()
    finally:
        fleet.stop()
    try:
        fired = [e.data for e in history() if e.event_type == "Fired"]
        assert [data["job_id"] for data in fired] == [job_id]
        assert engine.schedules.get(T, "nightly").fired == 1
        assert isinstance(engine.store, EventSourcedJobStore)
        views = JobViews(engine.store)
        views.catch_up()
        assert [row.job_id for row in views.jobs(tenant_id=T)] == [job_id]
        records = read_topic(kafka_topics.bootstrap, kafka_topics.ticks, at_least=1, timeout=15)
        ticks = [decode_tick(r.value).tick for r in records]
        assert ("create", job_id) in {(t.reason, t.job_id) for t in ticks}
        assert {t.job_id for t in ticks} == {job_id}
        assert [(k, t, j) for k, t, j, _ in runs(record)] == [
            ("begin", T, job_id),
            ("end", T, job_id),
        ]
    finally:
        engine.close()
