"""Several processes on one PostgreSQL store, local transport: real ``jobledger`` processes
share a backlog (each takes due jobs from the store, ``FOR UPDATE SKIP LOCKED``), no step
is recorded twice, a SIGKILLed one leaves the others to finish, and ``--processes N``
runs and stops N of them under one parent."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from pathlib import Path

import pytest

from jobledger import Engine, JobStatus, Tick
from jobledger.adapters.clock import FakeClock
from jobledger.domain.identity import step_key
from jobledger.orchestration.ports import DueFilter
from jobledger.orchestration.reconciler import IDLE_STATUSES, TIMED_STATUSES
from jobledger.projections import JobViews
from jobledger.runtime.processes import STARTUP_SECONDS
from jobledger.workflows import DefinitionRegistry, parse_definition
from tests.support import pythonpath
from tests.support.cli import JOBLEDGER
from tests.support.engines import TOKEN_SECRET, EngineFactory
from tests.support.processes import (
    EFFECT_MS_VARIABLE,
    EFFECTS_VARIABLE,
    STEPS,
    chain_definition,
    effects_by_pid,
)
from tests.support.services import postgres_schema_url

TENANT = "procs"
JOBS = [f"job-{n:02d}" for n in range(24)]


@pytest.fixture
def store(tmp_path: Path) -> Iterator[str]:
    yield from postgres_schema_url()


class Setup:
    """A config file (the chain workflow, the pid-noting executor, four ticks at once per
    process so one process cannot take the whole backlog) and the jobs, submitted by an
    engine whose in-process queue nobody runs: the workers must find them in the store."""

    def __init__(self, tmp: Path, store: str, *, lease_ms: int = 15_000) -> None:
        self.tmp = tmp
        (tmp / "definitions").mkdir()
        (tmp / "definitions" / "chain.yaml").write_text(chain_definition())
        self.config = tmp / "jobledger.toml"
        self.config.write_text(
            f'store_url = "{store}"\ndefinitions = "definitions"\n'
            'executor = "tests.support.processes:PidRecordingExecutor"\n'
            f'token_secret = "{TOKEN_SECRET}"\nconcurrency = 4\nlease_ms = {lease_ms}\n'
        )
        self.effects = tmp / "effects.log"
        self.engine = Engine.open(
            store, registry=DefinitionRegistry([parse_definition(chain_definition(), "chain")])
        )
        for job_id in JOBS:
            self.engine.submit(TENANT, job_id, "chain")

    def start(self, *args: str, name: str) -> subprocess.Popen[bytes]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("JOBLEDGER_")}
        env.update(
            PYTHONPATH=pythonpath(),
            **{EFFECTS_VARIABLE: str(self.effects), EFFECT_MS_VARIABLE: "20"},
        )
        log = (self.tmp / f"{name}.log").open("wb")
        return subprocess.Popen(
            [str(JOBLEDGER), *args, "--config", str(self.config)],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=self.tmp,
        )

    def log(self, name: str) -> str:
        return (self.tmp / f"{name}.log").read_text()

    def all_done(self) -> bool:
        return all(self.engine.job(TENANT, j).status is JobStatus.COMPLETED for j in JOBS)

    def steps_by_worker(self) -> Counter[str]:
        """From the store: each job's steps, credited to the worker whose claim it was
        recorded under (asserting on the way that each step is recorded exactly once)."""
        credited: Counter[str] = Counter()
        for job_id in JOBS:
            history = self.engine.history(TENANT, job_id)
            recorded = Counter(
                e.data["idempotency_key"] for e in history if e.event_type == "StepRecorded"
            )
            assert recorded == {step_key(TENANT, job_id, n): 1 for n in range(1, STEPS + 2)}
            holder = None
            for entry in history:
                if entry.event_type == "Claimed":
                    holder = entry.data["worker_id"]
                elif entry.event_type == "StepRecorded":
                    credited[holder] += 1
                    holder = entry.data.get("claimed_by") or holder
        return credited


def wait_until(done: Callable[[], bool], what: str, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not done():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


def stop(process: subprocess.Popen[bytes]) -> int:
    process.send_signal(signal.SIGTERM)
    return process.wait(timeout=60)


def test_two_worker_processes_share_a_backlog_and_record_each_step_once(
    tmp_path: Path, store: str
) -> None:
    setup = Setup(tmp_path, store)
    workers = [setup.start("worker", name=f"worker{n}") for n in range(2)]
    try:
        wait_until(setup.all_done, "every job to complete")
    finally:
        statuses = [stop(worker) for worker in workers]
    assert statuses == [0, 0], [setup.log(f"worker{n}") for n in range(2)]

    credited = setup.steps_by_worker()
    total = len(JOBS) * (STEPS + 1)
    assert sum(credited.values()) == total
    assert len(credited) == 2, credited  # one worker id per process, both recorded steps
    assert min(credited.values()) >= total / 5, credited
    effects = effects_by_pid(setup.effects)
    assert set(effects) == {worker.pid for worker in workers}
    assert sum(effects.values(), Counter()) == {
        step_key(TENANT, j, n): 1 for j in JOBS for n in range(1, STEPS + 1)
    }


def test_a_sigkilled_process_leaves_the_other_to_finish_every_job(
    tmp_path: Path, store: str
) -> None:
    setup = Setup(tmp_path, store, lease_ms=3_000)
    doomed, survivor = (setup.start("worker", name=name) for name in ("doomed", "survivor"))
    try:
        # Both at work: the doomed one holds jobs mid-chain when it dies.
        wait_until(lambda: len(effects_by_pid(setup.effects)) == 2, "both processes to work")
        doomed.send_signal(signal.SIGKILL)
        doomed.wait(timeout=30)
        killed_at = sum(effects_by_pid(setup.effects)[survivor.pid].values())
        wait_until(setup.all_done, "the survivor to finish every job")
    finally:
        if doomed.poll() is None:
            doomed.kill()
        status = stop(survivor)
    assert status == 0, setup.log("survivor")

    setup.steps_by_worker()  # every job: each step recorded exactly once
    effects = effects_by_pid(setup.effects)
    assert sum(effects[survivor.pid].values()) > killed_at  # it went on after the kill
    # At least once: only a step the doomed process was in when it died runs twice.
    ran = sum(effects.values(), Counter())
    assert set(ran) == {step_key(TENANT, j, n) for j in JOBS for n in range(1, STEPS + 1)}
    twice = {key for key, times in ran.items() if times > 1}
    assert all(ran[key] == 2 and key in effects[doomed.pid] for key in twice), twice
    assert len(twice) <= 4  # its concurrency: the steps it had in flight


def test_run_processes_starts_n_runners_that_share_the_work_and_stop_on_sigterm(
    tmp_path: Path, store: str
) -> None:
    setup = Setup(tmp_path, store)
    parent = setup.start("run", "--processes", "2", name="parent")
    try:
        wait_until(setup.all_done, "every job to complete")
    finally:
        status = stop(parent)
    output = setup.log("parent")
    assert status == 0, output
    assert "jobledger run: 2 processes on one store" in output
    assert output.count("stopped cleanly after") == 2  # each child stopped on the SIGTERM
    children = set(effects_by_pid(setup.effects))
    assert len(children) == 2 and parent.pid not in children
    for pid in children:  # none left behind
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
    setup.steps_by_worker()


def test_processes_refuse_a_port_they_cannot_share(tmp_path: Path, store: str) -> None:
    setup = Setup(tmp_path, store)
    refused = setup.start("run", "--processes", "2", "--metrics-port", "0", name="refused")
    assert refused.wait(timeout=60) == 2
    assert "one port cannot serve several processes" in " ".join(setup.log("refused").split())


# ---- the take itself, on both stores -------------------------------------------------------


def due_now(clock: FakeClock) -> DueFilter:
    now = clock.now()
    return DueFilter(now, now - timedelta(seconds=2), TIMED_STATUSES, IDLE_STATUSES)


def test_concurrent_takers_each_take_a_due_job_once_and_no_more_than_asked(
    make_engine: EngineFactory, clock: FakeClock
) -> None:
    engine = make_engine()
    for n in range(30):
        engine.submit("t", f"j{n}", "agent3")
    takers = [JobViews(make_engine().deps.store) for _ in range(3)]  # three "processes"
    takers[0].catch_up()
    clock.advance(timedelta(seconds=5))  # queued and idle past lost_tick_after: due
    hold = clock.now() + timedelta(seconds=15)

    def take_all(views: JobViews) -> list[str]:
        taken: list[str] = []
        while batch := views.take_due(due_now(clock), 4, hold):
            assert len(batch) <= 4
            taken += [row.job_id for row in batch]
        return taken

    with ThreadPoolExecutor(3) as pool:
        shares = list(pool.map(take_all, takers))
    taken = [job for share in shares for job in share]
    assert sorted(taken) == sorted(f"j{n}" for n in range(30))  # each once, none left out
    assert takers[0].take_due(due_now(clock), 100, hold) == []


def test_a_taken_job_is_taken_again_only_once_it_moved_on_or_its_hold_passed(
    make_engine: EngineFactory, clock: FakeClock
) -> None:
    engine = make_engine(config={"max_steps_per_tick": 1})
    engine.submit("t", "moves", "agent3")
    engine.submit("t", "stalls", "agent3")
    views = JobViews(engine.deps.store)

    def take() -> set[str]:
        views.catch_up()
        hold = clock.now() + timedelta(seconds=15)
        return {row.job_id for row in views.take_due(due_now(clock), 10, hold)}

    clock.advance(timedelta(seconds=5))
    assert take() == {"moves", "stalls"}
    assert take() == set()
    engine.handle(Tick("t", "moves", "test"))  # one step: queued again, at a new version
    clock.advance(timedelta(seconds=5))  # idle again: due at its new version
    assert take() == {"moves"}
    clock.advance(timedelta(seconds=10))  # the taker of "stalls" never ticked it
    assert take() == {"stalls"}


def children_of(pid: int) -> set[int]:
    text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    return {int(child) for child in text.split()}


def test_the_parent_starts_again_a_process_that_died_and_stops_the_new_one_too(
    tmp_path: Path, store: str
) -> None:
    setup = Setup(tmp_path, store)
    parent = setup.start("worker", "--processes", "2", name="parent")
    try:
        wait_until(setup.all_done, "every job to complete")
        wait_until(lambda: len(children_of(parent.pid)) == 2, "two processes")
        time.sleep(STARTUP_SECONDS)  # past its start: a death now is not a failed start
        first = children_of(parent.pid)
        victim = min(first)
        os.kill(victim, signal.SIGKILL)
        wait_until(
            lambda: len(children := children_of(parent.pid)) == 2 and children != first,
            "the dead process started again",
            timeout=60,
        )
        replaced = children_of(parent.pid)
    finally:
        status = stop(parent)
    assert victim not in replaced and len(replaced & first) == 1
    assert status == 0, setup.log("parent")
    for pid in replaced:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


def test_processes_that_cannot_start_stop_the_parent_with_their_status(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("JOBLEDGER_")}
    env["PYTHONPATH"] = pythonpath()
    # No definitions and no executor here: every process exits 3 at once, and would again.
    done = subprocess.run(
        [str(JOBLEDGER), "worker", "--processes", "2"],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=120,
    )
    assert done.returncode == 3, done
    assert "exited with 3 while starting" in done.stderr
    assert "needs workflow definitions" in done.stderr
