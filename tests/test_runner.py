"""The embedded runner and the operations commands, through the real console script."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from tests.support import pythonpath

JOBLEDGER = str(Path(sys.executable).with_name("jobledger"))
TESTS = Path(__file__).resolve().parent

FLOW = """
type: flow
version: 1
start: a
steps:
  a: {kind: run_interaction_task, params: {task: a}, next: pause}
  pause: {kind: wait_time, delay: {seconds: 1}, next: b}
  b: {kind: run_interaction_task, params: {task: b}, next: done}
  done: {kind: complete}
"""

SLOW_EXECUTOR = """
import os, time
from jobledger import StepRequest, StepResult

class Slow:
    def execute(self, request: StepRequest) -> StepResult:
        with open(os.environ["EFFECTS"], "a") as effects:
            effects.write(request.idempotency_key + "\\n")
        time.sleep(float(os.environ.get("STEP_SECONDS", "0")))
        return StepResult(output={}, state_patch={}, cost_usd="0.01")
"""


@pytest.fixture
def workspace(tmp_path: Path, store_url: str) -> dict[str, Any]:
    (tmp_path / "defs").mkdir()
    (tmp_path / "defs" / "flow.yaml").write_text(FLOW)
    (tmp_path / "slow_executor.py").write_text(SLOW_EXECUTOR)
    (tmp_path / "cfg.toml").write_text(
        'definitions = "defs"\nexecutor = "slow_executor:Slow"\nlease_ms = 1500\n'
        "inline_resume_max_delay_ms = 0\n"  # timers go through the queue, not a sleep
    )
    env = {
        **os.environ,
        "PYTHONPATH": pythonpath(tmp_path),
        "EFFECTS": str(tmp_path / "effects.log"),
        "JOBLEDGER_STORE_URL": store_url,
    }
    return {"dir": tmp_path, "env": env, "effects": tmp_path / "effects.log"}


def cli(ws: dict[str, Any], *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(
        [JOBLEDGER, *args, "--config", str(ws["dir"] / "cfg.toml")],
        env=ws["env"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    if check:
        assert result.returncode == 0, result.stderr
    return result


def start_runner(ws: dict[str, Any], *args: str, step_seconds: float = 0) -> subprocess.Popen[str]:
    env = {**ws["env"], "STEP_SECONDS": str(step_seconds)}
    return subprocess.Popen(
        [JOBLEDGER, "run", *args, "--config", str(ws["dir"] / "cfg.toml")],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def jobs(ws: dict[str, Any]) -> dict[str, dict[str, Any]]:
    rows = json.loads(cli(ws, "list", "--json").stdout)
    return {row["job_id"]: row for row in rows}


def wait_until(predicate: Any, seconds: float, what: str) -> None:
    deadline = time.monotonic() + seconds
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


def effects(ws: dict[str, Any]) -> Counter[str]:
    path: Path = ws["effects"]
    return Counter(path.read_text().split()) if path.exists() else Counter()


@pytest.mark.slow
def test_run_finishes_jobs_submitted_from_other_processes_and_stops_cleanly(
    workspace: dict[str, Any],
) -> None:
    for n in range(3):
        cli(workspace, "submit", "acme", f"job-{n}", "flow")
    runner = start_runner(workspace, "--workers", "2")
    try:
        wait_until(
            lambda: all(j["status"] == "completed" for j in jobs(workspace).values()),
            60,
            "the jobs to complete",
        )
        cli(workspace, "submit", "acme", "late", "flow")  # picked up while running
        wait_until(lambda: jobs(workspace)["late"]["status"] == "completed", 60, "late job")
    finally:
        runner.send_signal(signal.SIGINT)
        out, _ = runner.communicate(timeout=60)
    assert runner.returncode == 0, out
    assert "stopped cleanly" in out
    assert set(effects(workspace).values()) == {1}
    assert len(effects(workspace)) == 8


@pytest.mark.slow
def test_a_kill_9_loses_nothing_and_the_next_start_finishes_in_flight_work(
    workspace: dict[str, Any],
) -> None:
    for n in range(4):
        cli(workspace, "submit", "acme", f"job-{n}", "flow")
    runner = start_runner(workspace, step_seconds=1.0)
    wait_until(lambda: len(effects(workspace)) >= 2, 60, "steps to start")
    runner.kill()  # SIGKILL mid-step: no cleanup at all
    runner.wait(timeout=30)
    assert any(j["status"] != "completed" for j in jobs(workspace).values())

    restarted = start_runner(workspace)
    try:
        wait_until(
            lambda: all(j["status"] == "completed" for j in jobs(workspace).values()),
            90,
            "the restarted runner to finish",
        )
    finally:
        restarted.send_signal(signal.SIGTERM)
        restarted.communicate(timeout=60)
    counts = effects(workspace)
    assert len(counts) == 8
    # A step whose record landed never ran again; only the steps in flight at the kill
    # (one per job: the runner runs the four jobs' ticks at once) may have run twice.
    assert max(counts.values()) <= 2
    assert sum(1 for c in counts.values() if c > 1) <= 4
    for n in range(4):
        history = json.loads(cli(workspace, "history", "acme", f"job-{n}", "--json").stdout)[
            "events"
        ]
        keys = [e["data"]["idempotency_key"] for e in history if e["event_type"] == "StepRecorded"]
        assert len(keys) == len(set(keys)) == 4


def test_reconcile_once_runs_what_is_due_and_reports_counts(workspace: dict[str, Any]) -> None:
    cli(workspace, "submit", "acme", "j", "flow")

    first = json.loads(cli(workspace, "reconcile", "--once", "--json").stdout)

    assert first["acted"] is True and first["enqueued"] == 1 and first["handled"] >= 1
    assert jobs(workspace)["j"]["status"] == "waiting_time"  # step a ran, then the timer
    time.sleep(1.2)
    cli(workspace, "reconcile", "--once")
    assert jobs(workspace)["j"]["status"] == "completed"


def test_list_filters_and_projection_commands(workspace: dict[str, Any]) -> None:
    cli(workspace, "submit", "acme", "a", "flow")
    cli(workspace, "submit", "other", "b", "flow")
    cli(workspace, "cancel", "other", "b", "--reason", "test", "--by", "ops")

    assert list(jobs(workspace)) == ["b", "a"]
    only = json.loads(
        cli(workspace, "list", "--tenant", "acme", "--status", "queued", "--json").stdout
    )
    assert [r["job_id"] for r in only] == ["a"]
    bad = cli(workspace, "list", "--status", "sleeping", check=False)
    assert bad.returncode == 2 and "unknown status sleeping" in bad.stderr

    status = json.loads(cli(workspace, "projections", "status", "--json").stdout)
    assert status[0]["behind"] == 0
    rebuilt = json.loads(cli(workspace, "projections", "rebuild", "--json").stdout)
    assert rebuilt["replayed"] == status[0]["last_event"]
    assert jobs(workspace)["b"]["status"] == "cancelled"
