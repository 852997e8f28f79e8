"""Per-tenant concurrency limits, fair admission across tenants, priorities and aging
(``jobledger.domain.admission``), with real workers (the engine's own lanes) on both stores.

What is asserted is order and limits, never speed: the timings go in
scripts/bench_fairness.py. The Kafka side (several worker processes, kill -9) is in
tests/test_fairness_kafka.py.
"""

from __future__ import annotations

import os
import signal
import subprocess
from datetime import timedelta
from itertools import pairwise
from pathlib import Path
from typing import Any

import pytest

from jobledger import Engine, EngineConfig, JobStatus
from jobledger.adapters.clock import FakeClock
from jobledger.adapters.local_queue import LocalQueue
from jobledger.adapters.ops import MemoryOps
from jobledger.adapters.store_url import parse_store_url
from jobledger.api.auth import Role
from jobledger.domain.errors import InvalidPayloadError, UnknownJobError
from jobledger.domain.identity import job_uuid
from jobledger.orchestration.orchestrator import Outcome
from jobledger.orchestration.ports import Tick
from jobledger.orchestration.reconciler import Reconciler
from jobledger.projections import JobViews
from jobledger.runtime.supervisor import lock_for
from tests.support import pythonpath
from tests.support.cli import JOBLEDGER, make_cli
from tests.support.engines import EngineFactory
from tests.support.fairness import NOOP_DEFINITION, RunRecorder, peak_running, registry, runs
from tests.support.http import api_registry, start_api
from tests.support.kafka_broker import wait_for

STEPS = {"noop": 1, "agent3": 3}


def engine_with(make_engine: EngineFactory, recorder: RunRecorder, **config: Any) -> Engine:
    return make_engine(registry=registry(), executor=recorder, config=config)


def first_step_at(recorder: RunRecorder, tenant: str, job: str) -> int:
    return recorder.first_steps.index((tenant, job))


# ---- fairness ------------------------------------------------------------------------------


def test_a_small_tenant_starts_ahead_of_a_large_tenants_backlog(
    make_engine: EngineFactory, clock: FakeClock
) -> None:
    """Tenant A queues 2,000 jobs before tenant B submits 3: B's jobs start as soon as
    a few of A's jobs end, not after A's backlog (the window is 16 starting jobs)."""
    recorder = RunRecorder(STEPS)
    engine = engine_with(make_engine, recorder, admission_window=16, concurrency=4)
    backlog = [f"a{n}" for n in range(2_000)]
    for job in backlog:
        engine.submit("big", job, "noop")
    small = [f"b{n}" for n in range(3)]
    for job in small:
        engine.submit("small", job, "noop")
    assert "window of 16 starting jobs is full" in (engine.queued_because("small", "b0") or "")
    engine.run_until_idle()
    positions = [first_step_at(recorder, "small", job) for job in small]
    # Behind at most the window's jobs already admitted, and the few that end meanwhile.
    assert max(positions) < 16 + 8, positions
    assert len(recorder.first_steps) == len(backlog) + len(small)
    for job in (*small, *backlog[:50], *backlog[-50:]):
        tenant = "small" if job.startswith("b") else "big"
        assert engine.job(tenant, job).status is JobStatus.COMPLETED


def test_without_a_window_the_local_queue_still_serves_tenants_in_turn(
    make_engine: EngineFactory,
) -> None:
    """No gate at all: the in-process queue hands out due ticks a tenant at a time, so
    B's jobs start after a few of A's 2,000, not after all of them."""
    recorder = RunRecorder(STEPS)
    engine = engine_with(make_engine, recorder, concurrency=4)
    backlog = [f"a{n}" for n in range(2_000)]
    for job in backlog:
        engine.submit("big", job, "noop")
    small = [f"b{n}" for n in range(3)]
    for job in small:
        engine.submit("small", job, "noop")
    assert engine.queued_because("small", "b0") is None  # nothing went through a gate
    engine.run_until_idle()
    positions = [first_step_at(recorder, "small", job) for job in small]
    # One of B's per round of the two tenants, give or take the lanes already busy.
    assert max(positions) < 2 * len(small) + 8, positions
    assert len(recorder.first_steps) == len(backlog) + len(small)


# ---- limits --------------------------------------------------------------------------------


def test_limits_on_a_tenant_and_on_its_workflow_are_never_exceeded(
    make_engine: EngineFactory,
) -> None:
    recorder = RunRecorder(STEPS, effect_s=0.002)
    limits = [
        {"tenant": "acme", "max_running": 3},
        {"tenant": "acme", "workflow": "agent3", "max_running": 2},
        {"tenant": "*", "max_running": 4},
    ]
    engine = engine_with(
        make_engine, recorder, concurrency_limits=limits, concurrency=8, max_steps_per_tick=1
    )
    jobs = [("acme", f"x{n}", "agent3") for n in range(10)]
    jobs += [("acme", f"n{n}", "noop") for n in range(10)]
    jobs += [("other", f"o{n}", "agent3") for n in range(10)]
    for tenant, job, workflow in jobs:
        engine.submit(tenant, job, workflow)
    engine.run_until_idle()
    assert all(engine.job(t, j).status is JobStatus.COMPLETED for t, j, _ in jobs)
    assert recorder.peak["acme"] <= 3 and recorder.peak["acme/agent3"] <= 2, recorder.peak
    assert recorder.peak["other"] <= 4, recorder.peak  # the limit ``*`` puts on each tenant
    assert recorder.peak["acme"] >= 2 and recorder.peak["other"] >= 2, "nothing ran at once"


def test_show_says_why_a_queued_job_waits(make_engine: EngineFactory) -> None:
    recorder = RunRecorder(STEPS)
    limits = [
        {"tenant": "acme", "max_running": 2},
        {"tenant": "acme", "workflow": "agent3", "max_running": 1},
    ]
    engine = engine_with(make_engine, recorder, concurrency_limits=limits, admission_window=3)
    engine.submit("acme", "a1", "agent3")
    engine.submit("acme", "a2", "agent3")
    assert engine.queued_because("acme", "a1") is None  # admitted
    assert engine.queued_because("acme", "a2") == (
        "queued: tenant acme's workflow agent3 at its limit of 1 running jobs"
    )
    engine.submit("acme", "n1", "noop")
    engine.submit("acme", "n2", "noop")
    assert engine.queued_because("acme", "n2") == (
        "queued: tenant acme at its limit of 2 running jobs"
    )
    engine.submit("beta", "b1", "noop")
    engine.submit("beta", "b2", "noop")
    assert (engine.queued_because("beta", "b2") or "").startswith(
        "queued: the fleet's window of 3 starting jobs is full"
    )
    # A tick that reaches a job the gate holds leaves it queued.
    assert engine.tick("beta", "b2").outcome is Outcome.HELD
    assert engine.job("beta", "b2").status is JobStatus.QUEUED
    engine.run_until_idle()
    assert engine.queued_because("acme", "a2") is None
    assert engine.job("acme", "a2").status is JobStatus.COMPLETED


def test_with_neither_window_nor_limit_no_job_waits_or_is_written_to_the_gate(
    make_engine: EngineFactory,
) -> None:
    recorder = RunRecorder(STEPS)
    engine = engine_with(make_engine, recorder)
    for n in range(5):
        engine.submit("t", f"j{n}", "noop")
    assert engine.deps.admission is None and engine.queued_because("t", "j4") is None
    assert engine.run_until_idle() == 5


def test_a_limit_alone_gates_only_the_jobs_it_applies_to(make_engine: EngineFactory) -> None:
    recorder = RunRecorder(STEPS)
    limits = [{"tenant": "acme", "max_running": 1}]
    engine = engine_with(make_engine, recorder, concurrency_limits=limits)
    for n in range(3):
        engine.submit("acme", f"a{n}", "noop")
        engine.submit("free", f"f{n}", "noop")
    gate = engine.deps.admission
    assert gate is not None
    assert gate.admitted(str(job_uuid("free", "f0"))) is None  # never entered
    assert gate.admitted(str(job_uuid("acme", "a0"))) is True
    assert gate.admitted(str(job_uuid("acme", "a1"))) is False
    engine.run_until_idle()
    assert recorder.peak["acme"] == 1 and recorder.peak["free"] >= 1
    assert gate.admitted(str(job_uuid("acme", "a2"))) is None  # ended: its row is gone


# ---- priorities and aging ------------------------------------------------------------------


def test_priorities_order_the_start_within_a_tenant(
    make_engine: EngineFactory, clock: FakeClock
) -> None:
    recorder = RunRecorder(STEPS)
    limits = [{"tenant": "acme", "max_running": 1}]
    engine = engine_with(make_engine, recorder, concurrency_limits=limits)
    engine.submit("acme", "first", "noop", priority=0)  # admitted at once: nothing runs
    for job, priority in (("p1", 1), ("p9a", 9), ("p5", 5), ("p3", 3), ("p9b", 9), ("pd", None)):
        clock.advance(timedelta(milliseconds=10))
        engine.submit("acme", job, "noop", priority=priority)
    assert engine.job("acme", "p9a").priority == 9 and engine.job("acme", "pd").priority == 5
    engine.run_until_idle()
    order = [job for _, job in recorder.first_steps]
    assert order == ["first", "p9a", "p9b", "p5", "pd", "p3", "p1"]


@pytest.mark.parametrize(("waited_s", "first"), [(100, "low"), (50, "high")])
def test_aging_lets_a_low_priority_job_overtake_newer_high_priority_ones(
    make_engine: EngineFactory, clock: FakeClock, waited_s: int, first: str
) -> None:
    """With one level per 10 s, a priority-0 job that waited 100 s outranks priority-9
    jobs submitted now (it counts as 10); after only 50 s it does not (5 < 9)."""
    recorder = RunRecorder(STEPS)
    limits = [{"tenant": "acme", "max_running": 1}]
    engine = engine_with(
        make_engine, recorder, concurrency_limits=limits, priority_aging_seconds=10
    )
    engine.submit("acme", "blocker", "noop")
    engine.submit("acme", "low", "noop", priority=0)
    clock.advance(timedelta(seconds=waited_s))
    engine.submit("acme", "high", "noop", priority=9)
    engine.run_until_idle()
    order = [job for _, job in recorder.first_steps]
    assert order[:2] == ["blocker", first]


@pytest.mark.parametrize("priority", [-1, 10, 2.5, "9", True])
def test_a_priority_outside_0_to_9_is_refused(make_engine: EngineFactory, priority: Any) -> None:
    engine = engine_with(make_engine, RunRecorder(STEPS))
    with pytest.raises(InvalidPayloadError, match="priority must be"):
        engine.submit("acme", "j", "noop", priority=priority)
    with pytest.raises(UnknownJobError):
        engine.job("acme", "j")


# ---- step rates ----------------------------------------------------------------------------


def test_a_step_rate_spaces_a_tenants_steps_and_not_anothers(
    make_engine: EngineFactory, clock: FakeClock
) -> None:
    recorder = RunRecorder(STEPS)
    limits = [{"tenant": "slow", "max_steps_per_second": 2}]
    engine = engine_with(make_engine, recorder, concurrency_limits=limits, concurrency=1)

    def run(tenant: str) -> list[float]:
        """Run five of the tenant's jobs; when each step was recorded, from their start."""
        for n in range(5):
            engine.submit(tenant, f"{tenant[0]}{n}", "noop")
        started = clock.now()
        engine.run_until_idle()
        moments = []
        for n in range(5):
            history = engine.history(tenant, f"{tenant[0]}{n}")
            recorded = next(e for e in history if e.event_type == "StepRecorded")
            moments.append((recorded.timestamp - started).total_seconds())
        return sorted(moments)

    slow = run("slow")
    gaps = [b - a for a, b in pairwise(slow)]
    assert all(gap >= 0.5 for gap in gaps), slow
    assert slow[-1] >= 2.0  # five steps at two a second
    # Right after the slow tenant's burst, the fast tenant's steps wait for nothing.
    assert run("fast") == [0.0] * 5


# ---- restarts ------------------------------------------------------------------------------


def test_a_restart_loses_no_queued_job_and_keeps_the_limit(
    make_engine: EngineFactory, store_url: str, clock: FakeClock, ops: MemoryOps
) -> None:
    """The first engine dies with its in-process queue (the admitted jobs' ticks with
    it) after a few ticks; a second one, with the reconciler as its backstop, finishes
    every job, never more than the limit at once."""
    recorder = RunRecorder(STEPS, effect_s=0.001)
    limits = [{"tenant": "acme", "max_running": 2}]
    settings = {"concurrency_limits": limits, "concurrency": 4, "max_steps_per_tick": 1}
    first = engine_with(make_engine, recorder, **settings)
    jobs = [f"j{n}" for n in range(8)]
    for job in jobs:
        first.submit("acme", job, "agent3")
    first.run_until_idle(max_ticks=3)
    first.close()

    second = engine_with(make_engine, recorder, **settings)
    queue = second.deps.local_queue
    assert isinstance(queue, LocalQueue) and len(queue) == 0
    views = JobViews(second.store)
    reconciler = Reconciler(
        views=views,
        queue=queue,
        clock=clock,
        lock=lock_for(parse_store_url(store_url), "fair-reconciler"),
        ops=ops,
        lost_tick_after=timedelta(seconds=30),
        admission=second.admission_pass,
    )
    for _ in range(20):
        if all(second.job("acme", job).status is JobStatus.COMPLETED for job in jobs):
            break
        clock.advance(timedelta(minutes=2))
        views.catch_up()
        reconciler.reconcile()
        second.run_until_idle()
    assert all(second.job("acme", job).status is JobStatus.COMPLETED for job in jobs)
    assert recorder.peak["acme"] == 2, recorder.peak
    assert sorted(job for _, job in recorder.first_steps) == sorted(jobs)


# ---- the CLI and the HTTP API --------------------------------------------------------------


def test_cli_submit_takes_a_priority_and_show_says_why_the_job_is_queued(
    tmp_path: Path, store_url: str
) -> None:
    limits = '[{tenant = "acme", max_running = 1}]'
    cli = make_cli(tmp_path, store_url, settings=f"concurrency_limits = {limits}\n")
    first = cli.json("submit", "acme", "t1", "ticket")
    assert (first["priority"], first["queued_because"]) == (5, None)
    second = cli.json("submit", "acme", "t2", "ticket", "--priority", "8")
    assert second["priority"] == 8
    why = "queued: tenant acme at its limit of 1 running jobs"
    assert second["queued_because"] == why
    shown = " ".join(cli.ok("show", "acme", "t2").split())
    assert f"queued because {why}" in shown and "priority 8" in shown
    refused = cli.fails(2, "submit", "acme", "t3", "ticket", "--priority", "10")
    assert "Invalid value for '--priority': Input should be less than or equal to 9" in refused
    settings = {row["setting"]: row for row in cli.json("config", "show")["settings"]}
    limit = settings["concurrency_limits"]
    assert limit["value"] == [{"tenant": "acme", "max_running": 1}] and "file" in limit["source"]
    cli.ok("cancel", "acme", "t1", "--reason", "make room", "--by", "ops")
    assert cli.json("show", "acme", "t2")["queued_because"] is None  # admitted on the cancel


def test_http_submit_takes_a_priority(make_engine: EngineFactory, tmp_path: Path) -> None:
    engine = make_engine(registry=api_registry())
    with start_api(engine, tmp_path) as api, api.as_role(Role.OPERATOR) as http:
        made = http.post("/v1/jobs/acme", json={"workflow_type": "agent3", "priority": 9})
        refused = http.post("/v1/jobs/acme", json={"workflow_type": "agent3", "priority": 12})
    assert made.status_code == 201 and made.json()["priority"] == 9
    assert refused.status_code == 400 and "priority" in refused.text
    assert engine.job("acme", made.json()["job_id"]).priority == 9


def test_the_backstop_frees_the_place_of_a_job_whose_end_went_unnoticed(
    make_engine: EngineFactory, clock: FakeClock
) -> None:
    """A worker killed between a job's last append and the pass that frees its place:
    played by running the tick below the engine (no pass after it). The reconciler's
    pass frees the place once the job was admitted 30 s ago, and admits the next."""
    recorder = RunRecorder(STEPS)
    limits = [{"tenant": "acme", "max_running": 1}]
    engine = engine_with(make_engine, recorder, concurrency_limits=limits)
    engine.submit("acme", "first", "noop")
    engine.submit("acme", "second", "noop")
    engine.orchestrator.tick(Tick("acme", "first", "create"))
    assert engine.job("acme", "first").status is JobStatus.COMPLETED
    assert engine.admission_pass() == 0  # too soon to suspect it
    clock.advance(timedelta(seconds=31))
    assert engine.admission_pass() == 1
    assert engine.queued_because("acme", "second") is None
    engine.run_until_idle()
    assert engine.job("acme", "second").status is JobStatus.COMPLETED


# ---- kill -9 of a runner -------------------------------------------------------------------


@pytest.mark.slow
def test_a_kill_9_of_a_runner_keeps_the_limit_and_loses_no_queued_job(
    tmp_path: Path, store_url: str
) -> None:
    """``jobledger run`` (local queue, reconciler beside its workers) is SIGKILLed with
    jobs running and more queued behind a limit; the next start finishes every job, and
    the big tenant never had more than its limit running, the kill included."""
    (tmp_path / "defs").mkdir()
    (tmp_path / "defs" / "noop.yaml").write_text(NOOP_DEFINITION)
    limits = [{"tenant": "big", "max_running": 3}]
    (tmp_path / "cfg.toml").write_text(
        'definitions = "defs"\nexecutor = "tests.support.fairness:FileRunRecorder"\n'
        "lease_ms = 1500\nadmission_window = 6\n"
        'concurrency_limits = [{tenant = "big", max_running = 3}]\n'
    )
    record = tmp_path / "runs"
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("JOBLEDGER_")},
        "PYTHONPATH": pythonpath(),
        "JOBLEDGER_STORE_URL": store_url,
        "JOBLEDGER_TEST_RUNS": str(record),
        "JOBLEDGER_TEST_EFFECT_MS": "100",
    }
    config = EngineConfig(
        store_url=store_url, worker_id="submitter", admission_window=6, concurrency_limits=limits
    )
    jobs = [("big", f"a{n}") for n in range(20)] + [("other", f"o{n}") for n in range(6)]
    with Engine.open(registry=registry(), config=config) as engine:
        for tenant, job in jobs:
            engine.submit(tenant, job, "noop")

        def start() -> subprocess.Popen[bytes]:
            command = [str(JOBLEDGER), "run", "--workers", "2", "--config", "cfg.toml"]
            log = (tmp_path / "runner.log").open("ab")
            return subprocess.Popen(command, env=env, cwd=tmp_path, stdout=log, stderr=log)

        def completed() -> bool:
            return all(engine.job(t, j).status is JobStatus.COMPLETED for t, j in jobs)

        runner = start()
        try:
            wait_for(lambda: len(runs(record)) >= 12, 60, "jobs running")
            runner.send_signal(signal.SIGKILL)
            runner.wait(timeout=30)
            assert not completed()
            runner = start()
            wait_for(completed, 120, "the restarted runner finished every job", 0.5)
        finally:
            runner.send_signal(signal.SIGTERM)
            runner.wait(timeout=60)
    records = runs(record)
    assert {(t, j) for kind, t, j, _ in records if kind == "begin"} == set(jobs)
    peak = peak_running(records)
    assert peak["big"] <= 3, peak
    assert peak["big"] >= 2, f"the limit was never approached: {peak}"
