"""kill -9 on code workflows: a worker process running ``@workflow`` bodies really is
SIGKILLed (by itself, at an exact point) inside a step after its side effect, right after
a step's record committed (before the body is replayed for the next step), and during a
map (children spawned, some finished). A fresh worker, whose registry holds no suspended
body, replays the body cold from the store and runs the job to its end.

Afterwards, from the store: every step recorded exactly once, every side effect ran once
per idempotency key except that of the step a worker died in before its record (which
ran again, with the same key: the documented at-least-once window), the job completed
with the result its body computes, and its hash chain is intact. On SQLite and
PostgreSQL with the local queue, and through real Kafka workers.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

from jobledger import Engine, EngineConfig, JobStatus, Outcome
from jobledger.adapters.clock import SystemClock
from jobledger.domain.identity import step_key
from jobledger.workflows.registries import Registries
from jobledger.workflows.replayer import CodeRegistry
from tests.support import pythonpath
from tests.support.code_crash_worker import (
    COUNTER_ENV,
    ITEMS,
    KILL_IN_STEP_ENV,
    STEPS,
    TENANT,
    WORKFLOWS,
)
from tests.support.crash_worker import read_counts
from tests.support.engines import TOKEN_SECRET
from tests.support.kafka_broker import KafkaTopics, wait_for

WORKER = [sys.executable, "-m", "tests.support.code_crash_worker"]
LEASE_MS = 400
JOB = "job-1"


@dataclass(frozen=True)
class Kill:
    """Where the doomed worker dies, and what the store holds then."""

    name: str
    workflow: str
    in_step: int | None = None
    """Die inside ``effect(n)`` with this n, after its side effect."""
    after_record: int | None = None
    """Die right after the append recording this step number committed."""

    @property
    def reran(self) -> str | None:
        """The key whose side effect runs twice: the step killed before its record."""
        if self.in_step is None:
            return None
        if self.workflow == "chain":
            return step_key(TENANT, JOB, self.in_step)
        return step_key(TENANT, child(ITEMS.index(self.in_step)), 1)

    @property
    def claim_left_behind(self) -> bool:
        """The dead worker left a live claim in the way: the step it died in, or the next
        step's, carried by the record it died after. A map's record leaves the parent
        waiting for its children, claimed by nobody."""
        return self.workflow == "chain" or self.in_step is not None

    def args(self) -> list[str]:
        return [] if self.after_record is None else ["--kill-after-record", str(self.after_record)]

    def env(self) -> dict[str, str]:
        return {} if self.in_step is None else {KILL_IN_STEP_ENV: str(self.in_step)}


KILLS = [
    Kill("in_step", "chain", in_step=2),
    Kill("after_record", "chain", after_record=2),
    Kill("map_child_in_step", "fan_out", in_step=3),
    Kill("map_after_spawn", "fan_out", after_record=1),
]


def child(index: int) -> str:
    return f"{JOB}.1.{index}"


def expected_result(workflow: str) -> int:
    if workflow == "chain":
        return sum(10 * n for n in range(1, STEPS + 1))
    return sum(10 * n for n in ITEMS)


def jobs_of(engine: Engine, job_id: str) -> list[str]:
    """The job and every child it spawned."""
    return [job_id, *(c.job_id for c in engine.family(TENANT, job_id).children)]


def code_registry(engine: Engine) -> CodeRegistry:
    registries = engine.registry
    assert isinstance(registries, Registries)
    (code,) = [r for r in registries.registries if isinstance(r, CodeRegistry)]
    return code


@pytest.fixture
def counter(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The side-effect counter, shared by the worker processes and the test's engine."""
    path = tmp_path / "calls"
    monkeypatch.setenv(COUNTER_ENV, str(path))
    return path


@contextmanager
def survivor(store_url: str, **config: object) -> Iterator[Engine]:
    """The test's engine: it submits, reads the store, and (locally) is the fresh worker."""
    settings = EngineConfig(
        store_url=store_url,
        worker_id="survivor",
        lease_ms=LEASE_MS,
        token_secret=TOKEN_SECRET,
        **config,  # type: ignore[arg-type]
    )
    with Engine.open(workflows=WORKFLOWS, config=settings, clock=SystemClock()) as engine:
        yield engine


def worker_env(store_url: str, counter: Path, worker_id: str, **extra: str) -> dict[str, str]:
    return {
        **os.environ,
        "PYTHONPATH": pythonpath(),
        "JOBLEDGER_STORE_URL": store_url,
        "JOBLEDGER_WORKER_ID": worker_id,
        "JOBLEDGER_LEASE_MS": str(LEASE_MS),
        "JOBLEDGER_TOKEN_SECRET": TOKEN_SECRET,
        COUNTER_ENV: str(counter),
        **extra,
    }


def run_to_death(command: list[str], env: dict[str, str], timeout: float = 60) -> None:
    """Run the doomed worker until it SIGKILLs itself; anything else is a failure."""
    process = subprocess.Popen(
        command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        _, stderr = process.communicate(timeout=timeout)
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()
    assert process.returncode == -signal.SIGKILL, f"exited {process.returncode}:\n{stderr}"


def reconcile(engine: Engine, job_id: str, *, max_seconds: float = 30) -> Counter[Outcome]:
    """Tick the job and its children as a scanning reconciler would, until the job is
    terminal; a dead worker's live claim is waited out."""
    outcomes: Counter[Outcome] = Counter()
    deadline = time.monotonic() + max_seconds
    while not engine.job(TENANT, job_id).status.is_terminal:
        assert time.monotonic() < deadline, f"{job_id} never finished: {outcomes}"
        for each in jobs_of(engine, job_id):
            if not engine.job(TENANT, each).status.is_terminal:
                outcomes[engine.tick(TENANT, each, "reconcile").outcome] += 1
        engine.run_until_idle(wait_for_timers=True)
        if outcomes[Outcome.CLAIM_LOST]:
            time.sleep(LEASE_MS / 4000)
    return outcomes


def assert_left_as_killed(engine: Engine, kill: Kill, *, in_order: bool) -> None:
    """What the store holds when the worker died: its claim, and no more than it did.
    ``in_order``: the worker ran one tick at a time, the children in item order."""
    view = engine.job(TENANT, JOB)
    assert view.status is not JobStatus.COMPLETED
    if kill.workflow == "chain":
        assert (view.status, view.worker_id) == (JobStatus.RUNNING, "doomed")
        assert view.current_step == (kill.after_record or (kill.in_step or 0) - 1)
        return
    children = engine.family(TENANT, JOB).children
    assert [c.job_id for c in children] == [child(i) for i in range(len(ITEMS))]
    finished = [c.job_id for c in children if c.status == JobStatus.COMPLETED]
    if kill.in_step is None:
        assert finished == []
    elif in_order:
        # Children spawned, the ones before the killed one finished, the rest not.
        assert finished == [child(i) for i in range(ITEMS.index(kill.in_step))]
    else:
        assert child(ITEMS.index(kill.in_step)) not in finished


def assert_ran_once(engine: Engine, kill: Kill, counter: Path) -> None:
    """From the store: completed with the body's result, each step recorded once, the
    chain intact; each side effect ran once per key but the killed step's (twice)."""
    view = engine.job(TENANT, JOB)
    assert (view.status, view.last_error) == (JobStatus.COMPLETED, None), view
    assert view.state["result"] == expected_result(kill.workflow)
    effects: dict[str, int] = {}
    for job_id in jobs_of(engine, JOB):
        history = engine.history(TENANT, job_id)
        recorded = Counter(
            e.data["idempotency_key"] for e in history if e.event_type == "StepRecorded"
        )
        steps = len(recorded)
        assert recorded == {step_key(TENANT, job_id, n): 1 for n in range(1, steps + 1)}, job_id
        assert [e.version for e in history] == list(range(1, len(history) + 1))
        assert engine.verify(TENANT, job_id) is None
        # The last step is the body's return (no side effect); the parent's map is none.
        side_effect_steps = range(1, steps) if job_id != JOB or kill.workflow == "chain" else ()
        effects.update({step_key(TENANT, job_id, n): 1 for n in side_effect_steps})
    if kill.workflow == "fan_out":
        history = engine.history(TENANT, JOB)
        assert [e.event_type for e in history].count("ChildrenSpawned") == 1
        assert len(engine.family(TENANT, JOB).children) == len(ITEMS)
    if kill.reran is not None:
        effects[kill.reran] = 2  # died between its side effect and its record
    assert read_counts(counter) == effects


@pytest.mark.slow
@pytest.mark.parametrize("kill", KILLS, ids=lambda kill: kill.name)
def test_a_sigkilled_code_worker_is_replayed_cold_and_finishes_each_step_once(
    kill: Kill, store_url: str, counter: Path
) -> None:
    with survivor(store_url) as engine:
        engine.submit(TENANT, JOB, kill.workflow, input={})
        # One tick at a time, so the map's first children finish before the killed one.
        env = worker_env(store_url, counter, "doomed", JOBLEDGER_CONCURRENCY="1", **kill.env())
        run_to_death([*WORKER, "--jobs", JOB, *kill.args()], env)
        assert_left_as_killed(engine, kill, in_order=True)
        assert code_registry(engine).cold_replays == 0  # nothing replayed here yet

        outcomes = reconcile(engine, JOB)

        # The dead worker's live claim was waited out, not run over.
        assert (outcomes[Outcome.CLAIM_LOST] > 0) is kill.claim_left_behind, outcomes
        # This worker never saw the bodies run: each job it moved on was replayed cold once
        # (from the store), then kept hot for the steps that followed.
        replayed = [j for j in jobs_of(engine, JOB) if j == JOB or kill.workflow == "fan_out"]
        assert 1 <= code_registry(engine).cold_replays <= len(replayed)
        assert_ran_once(engine, kill, counter)


# ---- through real Kafka workers -------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("kill", [KILLS[0], KILLS[1], KILLS[2]], ids=lambda kill: kill.name)
def test_a_sigkilled_kafka_code_worker_is_replayed_cold_by_its_successor(
    kill: Kill, store_url: str, counter: Path, kafka_topics: KafkaTopics
) -> None:
    with survivor(store_url, **kafka_topics.config()) as engine:
        engine.submit(TENANT, JOB, kill.workflow, input={})
        command = [*WORKER, "--kafka", *kill.args()]
        doomed = worker_env(store_url, counter, "doomed", **kafka_topics.env(), **kill.env())
        run_to_death(command, doomed, timeout=90)
        assert_left_as_killed(engine, kill, in_order=False)

        successor = subprocess.Popen(
            command[: command.index("--kafka") + 1],
            env=worker_env(store_url, counter, "successor", **kafka_topics.env()),
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            wait_for(
                lambda: engine.job(TENANT, JOB).status.is_terminal or successor.poll() is not None,
                90,
                "the successor finished the job",
            )
            assert successor.poll() is None, successor.stderr.read() if successor.stderr else ""
        finally:
            successor.send_signal(signal.SIGTERM)
            successor.communicate(timeout=30)
        assert_ran_once(engine, kill, counter)
        taken_over = [
            e.data
            for job_id in jobs_of(engine, JOB)
            for e in engine.history(TENANT, job_id)
            if e.event_type == "Claimed" and e.data["previous_worker_id"] == "doomed"
        ]
        assert taken_over and all(c["worker_id"] == "successor" for c in taken_over)
