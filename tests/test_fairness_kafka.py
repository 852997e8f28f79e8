"""Fair admission on the real broker and PostgreSQL, with several worker processes
(``jobledger worker --transport kafka``) and a reconciler beside them, one worker
SIGKILLed and replaced mid-run.

A partition of the ticks topic is FIFO, so fairness has to come from admission: the
large tenant's backlog waits in the admission table, never on the topic. Asserted: the
small tenant's jobs start after at most a few windows' worth of other jobs' first steps
(not after the backlog); the large tenant's limit holds throughout, the kill included;
every job completes (the kill lost none). The timings are printed, not asserted.

Priorities on the same path (both stores): with a tenant limit of 1, the jobs queued
behind the one running start highest priority first.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from jobledger import Engine, EngineConfig, JobStatus
from jobledger.workflows import DefinitionRegistry
from tests.support import pythonpath
from tests.support.fairness import NOOP_DEFINITION, peak_running, runs
from tests.support.kafka_broker import KafkaTopics, wait_for
from tests.support.services import postgres_schema_url
from tests.test_kafka_chaos import Fleet

WORKERS = 3
CONCURRENCY = 4
WINDOW = 12
BIG_LIMIT = 8
BACKLOG = 1_500
OTHERS = 200


@pytest.fixture
def pg_url() -> Iterator[str]:
    yield from postgres_schema_url()


@pytest.mark.slow
def test_a_small_tenant_starts_within_a_few_windows_under_a_backlog_on_kafka(
    pg_url: str, kafka_topics: KafkaTopics, tmp_path: Path
) -> None:
    (tmp_path / "defs").mkdir()
    (tmp_path / "defs" / "noop.yaml").write_text(NOOP_DEFINITION)
    record = tmp_path / "runs"
    limits = [{"tenant": "big", "max_running": BIG_LIMIT}]
    env = {
        **os.environ,
        **kafka_topics.env(),
        "PYTHONPATH": pythonpath(),
        "JOBLEDGER_STORE_URL": pg_url,
        "JOBLEDGER_DEFINITIONS": str(tmp_path / "defs"),
        "JOBLEDGER_EXECUTOR": "tests.support.fairness:FileRunRecorder",
        "JOBLEDGER_TEST_RUNS": str(record),
        "JOBLEDGER_TEST_EFFECT_MS": "2",
        "JOBLEDGER_LEASE_MS": "3000",
        "JOBLEDGER_CONCURRENCY": str(CONCURRENCY),
        "JOBLEDGER_ADMISSION_WINDOW": str(WINDOW),
        "JOBLEDGER_CONCURRENCY_LIMITS": json.dumps(limits),
    }
    config = EngineConfig(
        store_url=pg_url,
        worker_id="submitter",
        admission_window=WINDOW,
        concurrency_limits=limits,
        **kafka_topics.config(),
    )
    registry = DefinitionRegistry.from_directory(tmp_path / "defs")
    engine = Engine.open(registry=registry, config=config)
    fleet = Fleet(env, tmp_path)
    backlog = [("big", f"a{n}") for n in range(BACKLOG)] + [("mid", f"m{n}") for n in range(OTHERS)]
    small = [("small", f"b{n}") for n in range(3)]
    try:
        submitting = time.monotonic()
        for tenant, job in backlog:
            engine.submit(tenant, job, "noop")
        submit_s = time.monotonic() - submitting
        fleet.service("reconciler", "reconcile", "--transport", "kafka")
        for slot in range(WORKERS):
            fleet.start(slot)
        wait_for(lambda: len(begins(record)) >= 100, 120, "the backlog is being worked off")
        submitted_ns = time.time_ns()
        for tenant, job in small:
            engine.submit(tenant, job, "noop")
        wait_for(lambda: started(record, small), 60, "the small tenant's jobs started")
        fleet.kill(0)
        fleet.start(0)
        every = backlog + small
        wait_for(lambda: all_completed(engine, every), 240, "every job completed", 1.0)
        assert not fleet.crashed(), fleet.crashed()
    finally:
        fleet.stop()
        engine.close()

    records = runs(record)
    first_begin = {(t, j): ns for kind, t, j, ns in reversed(records) if kind == "begin"}
    after_submit = sorted(ns for (t, _), ns in first_begin.items() if ns >= submitted_ns)
    for job in small:
        ahead = sum(1 for ns in after_submit if ns < first_begin[job])
        # Behind the jobs admitted already (the window) and those the workers had in hand.
        assert ahead <= 3 * WINDOW, (job, ahead)
    assert len(first_begin) == len(every)  # no job lost, the killed worker's included
    peak = peak_running(records)
    assert peak["big"] <= BIG_LIMIT, peak
    latencies = [(first_begin[job] - submitted_ns) / 1e6 for job in small]
    remaining = sum(1 for (t, _), ns in first_begin.items() if t == "big" and ns > submitted_ns)
    print(
        f"fairness on kafka: {len(backlog)} jobs submitted in {submit_s:.1f}s; the small "
        f"tenant's first steps {', '.join(f'{ms:.0f}' for ms in latencies)} ms after its "
        f"submit, with {remaining} of the big tenant's jobs still to start; peaks {peak}"
    )


@pytest.mark.slow
def test_priorities_order_the_start_within_a_tenant_on_kafka(
    store_url: str, kafka_topics: KafkaTopics, tmp_path: Path
) -> None:
    """A limit of 1: ``first`` holds the one place when the others are submitted, so
    they wait in the admission table and each place freed goes to the highest priority."""
    (tmp_path / "defs").mkdir()
    (tmp_path / "defs" / "noop.yaml").write_text(NOOP_DEFINITION)
    record = tmp_path / "runs"
    limits = [{"tenant": "acme", "max_running": 1}]
    env = {
        **os.environ,
        **kafka_topics.env(),
        "PYTHONPATH": pythonpath(),
        "JOBLEDGER_STORE_URL": store_url,
        "JOBLEDGER_DEFINITIONS": str(tmp_path / "defs"),
        "JOBLEDGER_EXECUTOR": "tests.support.fairness:FileRunRecorder",
        "JOBLEDGER_TEST_RUNS": str(record),
        "JOBLEDGER_CONCURRENCY_LIMITS": json.dumps(limits),
    }
    config = EngineConfig(
        store_url=store_url,
        worker_id="submitter",
        concurrency_limits=limits,
        **kafka_topics.config(),
    )
    engine = Engine.open(
        registry=DefinitionRegistry.from_directory(tmp_path / "defs"), config=config
    )
    fleet = Fleet(env, tmp_path)
    jobs = [("first", 0), ("p1", 1), ("p9", 9), ("p5", 5)]
    try:
        for job, priority in jobs:
            engine.submit("acme", job, "noop", priority=priority)
        held = "queued: tenant acme at its limit of 1 running jobs"
        assert [engine.queued_because("acme", job) for job, _ in jobs] == [None, held, held, held]
        for slot in range(2):
            fleet.start(slot)
        every = [("acme", job) for job, _ in jobs]
        wait_for(lambda: all_completed(engine, every), 50, "every job completed", 0.5)
        assert not fleet.crashed(), fleet.crashed()
    finally:
        fleet.stop()
        engine.close()
    assert [job for _, _, job, _ in begins(record)] == ["first", "p9", "p5", "p1"]
    assert peak_running(runs(record)) == {"acme": 1}


def begins(record: Path) -> list[tuple[str, str, str, int]]:
    return [r for r in runs(record) if r[0] == "begin"]


def started(record: Path, jobs: list[tuple[str, str]]) -> bool:
    seen = {(t, j) for _, t, j, _ in begins(record)}
    return all(job in seen for job in jobs)


def all_completed(engine: Engine, jobs: list[tuple[str, str]]) -> bool:
    return all(engine.job(t, j).status is JobStatus.COMPLETED for t, j in jobs)
