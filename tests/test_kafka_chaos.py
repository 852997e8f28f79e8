"""Chaos against the real broker and PostgreSQL: three ``jobledger worker --transport
kafka`` processes run 200 jobs of 5 side-effecting steps while workers are SIGKILLed at
random moments and restarted; ``jobledger reconcile --transport kafka`` and
``jobledger projections run --outbox`` run beside them, as in docker-compose.yml.

Afterwards: every job completed; every step key recorded exactly once; no recorded step
executed twice (an external counter file: the only extra executions are of steps a
killed worker was running when it died, at most its concurrency per kill); the events topic holds
every event of every job, in order.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter, defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from jobledger import Engine, EngineConfig, JobStatus
from jobledger.domain.identity import step_key
from jobledger.workflows import DefinitionRegistry
from tests.support import pythonpath
from tests.support.kafka_broker import KafkaTopics, headers, read_topic, wait_for
from tests.support.services import postgres_schema_url

JOBLEDGER = str(Path(sys.executable).with_name("jobledger"))
TESTS = Path(__file__).resolve().parent
TENANT = "chaos"
JOBS = 200
STEPS = 5
WORKERS = 3
CONCURRENCY = 4
"""Ticks each worker runs at once: the most steps a kill can leave half-done."""
CHAOS_SECONDS = 25
SEED = int(os.environ.get("JOBLEDGER_CHAOS_SEED", str(random.randrange(1_000_000))))

DEFINITION = (
    "type: chaos5\nversion: 1\nstart: s1\nsteps:\n"
    + "".join(
        f"  s{n}: {{kind: run_interaction_task, params: {{n: {n}}}, next: "
        f"{'s' + str(n + 1) if n < STEPS else 'done'}}}\n"
        for n in range(1, STEPS + 1)
    )
    + "  done: {kind: complete}\n"
)


@pytest.fixture
def pg_url() -> Iterator[str]:
    yield from postgres_schema_url()


class Fleet:
    """The worker processes: kill one, start its successor, stop them all."""

    def __init__(self, env: dict[str, str], logs: Path) -> None:
        self.env = env
        self.logs = logs
        self.procs: dict[int, tuple[str, subprocess.Popen[bytes]]] = {}
        self.generation = Counter[int]()
        self.killed: set[str] = set()
        self.others: list[subprocess.Popen[bytes]] = []

    def start(self, slot: int) -> None:
        self.generation[slot] += 1
        worker_id = f"chaos-{slot}-{self.generation[slot]}"
        log = (self.logs / f"{worker_id}.log").open("wb")
        proc = subprocess.Popen(
            [JOBLEDGER, "worker", "--transport", "kafka"],
            env={**self.env, "JOBLEDGER_WORKER_ID": worker_id},
            cwd=TESTS,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        self.procs[slot] = (worker_id, proc)

    def kill(self, slot: int) -> str:
        worker_id, proc = self.procs[slot]
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        self.killed.add(worker_id)
        return worker_id

    def service(self, name: str, *args: str) -> None:
        log = (self.logs / f"{name}.log").open("wb")
        self.others.append(
            subprocess.Popen(
                [JOBLEDGER, *args],
                env={**self.env, "JOBLEDGER_WORKER_ID": name},
                cwd=TESTS,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        )

    def stop(self) -> None:
        procs = [proc for _, proc in self.procs.values()] + self.others
        for proc in procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in procs:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()

    def crashed(self) -> list[str]:
        """Processes that died without being killed: a bug, with its log."""
        dead = [(wid, p) for wid, p in self.procs.values() if p.poll() is not None]
        dead += [("service", p) for p in self.others if p.poll() is not None]
        return [f"{wid} exited {p.returncode}" for wid, p in dead]


@pytest.mark.slow
def test_chaos_sigkilled_workers_on_kafka_and_postgres(
    pg_url: str, kafka_topics: KafkaTopics, tmp_path: Path
) -> None:
    rng = random.Random(SEED)
    (tmp_path / "defs").mkdir()
    (tmp_path / "defs" / "chaos5.yaml").write_text(DEFINITION)
    counter = tmp_path / "effects"
    env = {
        **os.environ,
        **kafka_topics.env(),
        "PYTHONPATH": pythonpath(),
        "JOBLEDGER_STORE_URL": pg_url,
        "JOBLEDGER_DEFINITIONS": str(tmp_path / "defs"),
        "JOBLEDGER_EXECUTOR": "tests.support.kafka_procs:ChaosExecutor",
        "JOBLEDGER_TEST_COUNTER": str(counter),
        "JOBLEDGER_TEST_EFFECT_MS": "25",
        "JOBLEDGER_LEASE_MS": "3000",
        "JOBLEDGER_MAX_STEPS_PER_TICK": "2",
        "JOBLEDGER_CONCURRENCY": str(CONCURRENCY),
    }
    config = EngineConfig(store_url=pg_url, worker_id="submitter", **kafka_topics.config())
    registry = DefinitionRegistry.from_directory(tmp_path / "defs")
    engine = Engine.open(registry=registry, config=config)
    fleet = Fleet(env, tmp_path)
    jobs = [f"job-{n:03d}" for n in range(JOBS)]
    started = time.monotonic()
    try:
        fleet.service("reconciler", "reconcile", "--transport", "kafka")
        fleet.service("outbox", "projections", "run", "--outbox")
        for slot in range(WORKERS):
            fleet.start(slot)
        for job in jobs:
            engine.submit(TENANT, job, "chaos5")

        kills = []
        chaos_until = time.monotonic() + CHAOS_SECONDS
        while time.monotonic() < chaos_until and not done(engine, jobs):
            # Kills come faster than a fast machine finishes the jobs: three at least land.
            time.sleep(rng.uniform(0.3, 1.2))
            slot = rng.randrange(WORKERS)
            kills.append(fleet.kill(slot))
            fleet.start(slot)
        assert not fleet.crashed(), fleet.crashed()
        wait_for(lambda: done(engine, jobs), 150, f"every job completed (seed {SEED})", 1.0)
        assert not fleet.crashed(), fleet.crashed()
        assert len(kills) >= 3, f"the chaos was too short to matter: {kills}"

        # Every step key recorded exactly once, by one worker.
        recorded_by: dict[str, str] = {}
        total_events = 0
        for job in jobs:
            history = engine.history(TENANT, job)
            total_events += len(history)
            steps = [e.data for e in history if e.event_type == "StepRecorded"]
            keys = Counter(step["idempotency_key"] for step in steps)
            assert keys == {step_key(TENANT, job, n): 1 for n in range(1, STEPS + 2)}, job
            for step in steps[:STEPS]:
                recorded_by[step["idempotency_key"]] = step["worker_id"]
            assert engine.verify(TENANT, job) is None

        # No recorded step executed twice: each key ran once by the worker that
        # recorded it; any other run was by a worker killed mid-step (at most one per
        # tick it had in flight).
        executions: dict[str, list[str]] = defaultdict(list)
        for line in counter.read_text().splitlines():
            key, worker_id = line.split(" ")
            executions[key].append(worker_id)
        assert set(executions) == set(recorded_by)
        extra_by_worker: Counter[str] = Counter()
        for key, runs in executions.items():
            assert runs.count(recorded_by[key]) == 1, (key, runs)
            for other in runs:
                if other != recorded_by[key]:
                    assert other in fleet.killed, (key, runs, "a live worker re-ran a step")
                    extra_by_worker[other] += 1
        assert all(n <= CONCURRENCY for n in extra_by_worker.values()), extra_by_worker

        # The events topic holds every event of every job.
        def published() -> set[tuple[str, int]]:
            records = read_topic(kafka_topics.bootstrap, kafka_topics.events, timeout=10)
            return {(headers(r)["job"], int(headers(r)["job_version"])) for r in records}

        wait_for(lambda: len(published()) >= total_events, 60, "the outbox caught up", 1.0)
        expected = {(job, entry.version) for job in jobs for entry in engine.history(TENANT, job)}
        assert published() == expected
    finally:
        fleet.stop()
        engine.close()
    elapsed = time.monotonic() - started
    print(
        f"chaos: seed {SEED}, {len(kills)} kills, {sum(extra_by_worker.values())} steps "
        f"re-run after a kill, {total_events} events, {elapsed:.0f}s"
    )


def done(engine: Engine, jobs: list[str]) -> bool:
    views: Any = [engine.job(TENANT, job).status for job in jobs]
    return all(status is JobStatus.COMPLETED for status in views)
