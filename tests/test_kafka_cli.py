"""The command line with ``--transport kafka`` (and JOBLEDGER_TRANSPORT=kafka), through
the real console script and a real broker."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from jobledger.adapters.kafka.messages import decode_tick
from tests.support import pythonpath
from tests.support.kafka_broker import KafkaTopics, headers, read_topic, wait_for

JOBLEDGER = str(Path(sys.executable).with_name("jobledger"))
TESTS = Path(__file__).resolve().parent

FLOW = """
type: flow
version: 1
start: a
steps:
  a: {kind: run_interaction_task, params: {task: a}, next: pause}
  pause: {kind: wait_time, delay: {seconds: 2}, next: b}
  b: {kind: run_interaction_task, params: {task: b}, next: done}
  done: {kind: complete}
"""

EXECUTOR = """
import os
from jobledger import StepRequest, StepResult

class Noting:
    def execute(self, request: StepRequest) -> StepResult:
        with open(os.environ["EFFECTS"], "a") as effects:
            effects.write(request.idempotency_key + "\\n")
        return StepResult(output={}, state_patch={}, cost_usd="0.01")
"""


@pytest.fixture
def ws(tmp_path: Path, kafka_topics: KafkaTopics) -> dict[str, Any]:
    (tmp_path / "defs").mkdir()
    (tmp_path / "defs" / "flow.yaml").write_text(FLOW)
    (tmp_path / "noting.py").write_text(EXECUTOR)
    env = {
        **os.environ,
        **kafka_topics.env(),
        "PYTHONPATH": pythonpath(tmp_path),
        "EFFECTS": str(tmp_path / "effects.log"),
        "JOBLEDGER_STORE_URL": f"sqlite:///{tmp_path}/jobs.db",
        "JOBLEDGER_DEFINITIONS": str(tmp_path / "defs"),
        "JOBLEDGER_EXECUTOR": "noting:Noting",
        "JOBLEDGER_INLINE_RESUME_MAX_DELAY_MS": "0",
    }
    return {"dir": tmp_path, "env": env, "topics": kafka_topics}


def cli(ws: dict[str, Any], *args: str, env: dict[str, str] | None = None) -> Any:
    return subprocess.run(
        [JOBLEDGER, *args],
        env={**ws["env"], **(env or {})},
        cwd=ws["dir"],
        capture_output=True,
        text=True,
        timeout=120,
    )


def ticks(ws: dict[str, Any], at_least: int) -> list[Any]:
    topics: KafkaTopics = ws["topics"]
    records = read_topic(topics.bootstrap, topics.ticks, at_least=at_least, timeout=15)
    return [decode_tick(r.value).tick for r in records]


def test_submit_publishes_the_first_tick_and_reconcile_publishes_a_lost_one(
    ws: dict[str, Any],
) -> None:
    submitted = cli(ws, "submit", "acme", "job-1", "flow")
    assert submitted.returncode == 0, submitted.stderr
    assert [(t.job_id, t.reason) for t in ticks(ws, 1)] == [("job-1", "create")]
    # Submitted on the local transport (from a process without Kafka): no tick on the
    # topic until the reconciler finds the queued job.
    local = cli(ws, "submit", "acme", "job-2", "flow", env={"JOBLEDGER_TRANSPORT": "local"})
    assert local.returncode == 0, local.stderr
    reconciled = cli(ws, "reconcile", "--once", "--transport", "kafka", "--json")
    assert reconciled.returncode == 0, reconciled.stderr
    document = json.loads(reconciled.stdout)
    assert document["published"] == document["enqueued"] == 2  # both are queued
    found = {(t.job_id, t.reason) for t in ticks(ws, 3)}
    assert ("job-2", "reconcile_queued") in found


def test_unknown_transport_is_a_usage_error(ws: dict[str, Any]) -> None:
    result = cli(ws, "worker", "--transport", "carrier-pigeon")
    assert result.returncode == 2
    assert "carrier-pigeon" in result.stderr


@pytest.mark.slow
def test_run_with_kafka_runs_jobs_timers_and_the_outbox_then_stops_cleanly(
    ws: dict[str, Any],
) -> None:
    for n in range(3):
        assert cli(ws, "submit", "acme", f"job-{n}", "flow").returncode == 0
    runner = subprocess.Popen(
        [JOBLEDGER, "run", "--transport", "kafka", "--workers", "2"],
        env=ws["env"],
        cwd=ws["dir"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )

    def statuses() -> dict[str, str]:
        listed = cli(ws, "list", "--json")
        return {row["job_id"]: row["status"] for row in json.loads(listed.stdout or "[]")}

    try:
        # Each job sleeps 2 s between its steps: the reconciler publishes the wake-up.
        wait_for(lambda: set(statuses().values()) == {"completed"}, 120, "jobs done", 0.5)
    finally:
        runner.send_signal(signal.SIGINT)
        out, _ = runner.communicate(timeout=60)
    assert runner.returncode == 0, out
    assert "stopped cleanly" in out
    effects = (ws["dir"] / "effects.log").read_text().split()
    assert sorted(effects) == sorted(f"acme/job-{n}:step:{s}" for n in range(3) for s in (1, 3))
    reasons = {t.reason for t in ticks(ws, 6)}
    assert {"create", "reconcile_waiting_time"} <= reasons
    topics: KafkaTopics = ws["topics"]
    events = read_topic(topics.bootstrap, topics.events, at_least=3 * 8, timeout=15)
    assert {headers(r)["job"] for r in events} == {"job-0", "job-1", "job-2"}
    assert {headers(r)["event_type"] for r in events} >= {"Submitted", "StepRecorded"}
    lag = json.loads(cli(ws, "projections", "status", "--json").stdout)
    outbox = next(row for row in lag if row["partition"].endswith(".outbox"))
    assert outbox["last_tracked"] >= len(events)
