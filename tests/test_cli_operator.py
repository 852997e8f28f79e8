"""The operator's commands, run for real through the console script on a SQLite store."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from tests.support.cli import JOBLEDGER, run_jobledger
from tests.support.workflows import tasks_definition

THREE_STEPS = tasks_definition("chores", "one", "two", "three")
EXECUTOR = """
from jobledger import StepRequest, StepResult

class Chores:
    def execute(self, request: StepRequest) -> StepResult:
        return StepResult(output={"did": request.resolution.params["task"]}, cost_usd="0.25")
"""


class Operator:
    def __init__(self, home: Path) -> None:
        self.home = home
        (home / "definitions").mkdir()
        (home / "definitions" / "chores.yaml").write_text(THREE_STEPS)
        (home / "chores_executor.py").write_text(EXECUTOR)
        (home / "jobledger.toml").write_text(
            'store_url = "sqlite:///jobs.db"\n'
            'definitions = "definitions"\n'
            'executor = "chores_executor:Chores"\n'
        )

    def __call__(self, *args: str) -> subprocess.CompletedProcess[str]:
        return run_jobledger(*args, cwd=self.home)

    def json(self, *args: str) -> Any:
        result = self(*args, "--json")
        assert result.returncode == 0, (args, result.stderr)
        return json.loads(result.stdout)


@pytest.fixture
def operator(tmp_path: Path) -> Operator:
    return Operator(tmp_path)


def test_raise_budget_lets_a_parked_job_go_on(operator: Operator) -> None:
    operator.json("submit", "t", "j", "chores", "--budget", '{"max_steps": 1, "max_cost_usd": "5"}')
    assert operator.json("tick", "t", "j")["job"]["status"] == "budget_exceeded"
    raised = operator.json(
        "raise-budget",
        "t",
        "j",
        "--by",
        "ops",
        "--reason",
        "worth it",
        "--max-steps",
        "10",
        "--max-cost",
        "7.50",
    )
    assert raised["job"]["status"] == "queued"
    assert raised["job"]["budget"]["max_steps"] == 10
    assert operator.json("tick", "t", "j")["job"]["status"] == "completed"
    history = operator.json("history", "t", "j")["events"]
    [raise_event] = [e for e in history if e["event_type"] == "BudgetRaised"]
    assert raise_event["data"]["raised_by"] == "ops"
    assert raise_event["data"]["reason"] == "worth it"


@pytest.mark.parametrize(
    ("args", "says"),
    [
        ((), "give at least one of --max-steps, --max-cost, --deadline"),
        (("--max-cost", "lots"), "not an amount of dollars: 'lots'"),
        (("--max-cost", "-1"), "must be a finite amount of at least 0"),
        (("--deadline", "tomorrow"), "not an ISO 8601 time: 'tomorrow'"),
    ],
)
def test_raise_budget_refuses_bad_options_as_usage_errors(
    operator: Operator, args: tuple[str, ...], says: str
) -> None:
    operator.json("submit", "t", "j", "chores")
    result = operator("raise-budget", "t", "j", "--by", "ops", "--reason", "r", *args)
    assert result.returncode == 2
    assert says in " ".join(result.stderr.replace("│", " ").split())


def test_raise_budget_of_an_unknown_job_says_so(operator: Operator) -> None:
    operator.json("submit", "t", "j", "chores")
    result = operator(
        "raise-budget", "t", "nope", "--by", "ops", "--reason", "r", "--max-steps", "3"
    )
    assert result.returncode == 1
    assert "nope" in result.stderr and "Traceback" not in result.stderr


def test_verify_and_export_cover_every_job_by_default_and_one_tenant_on_request(
    operator: Operator,
) -> None:
    for tenant, job in (("t", "a"), ("t", "b"), ("u", "c")):
        operator.json("submit", tenant, job, "chores")
        operator.json("tick", tenant, job)
    everything = operator.json("verify")
    assert everything["intact"] is True
    assert everything["jobs"] == 3
    one_tenant = operator.json("verify", "--tenant", "u")
    assert one_tenant["jobs"] == 1
    assert one_tenant["job"]["tenant"] == "u" and one_tenant["job"]["job"] == "c"
    exported = operator("export")
    assert exported.returncode == 0, exported.stderr
    *events, manifest = [json.loads(line) for line in exported.stdout.splitlines()]
    assert {(event["tenant"], event["job"]) for event in events} == {
        ("t", "a"),
        ("t", "b"),
        ("u", "c"),
    }
    assert manifest["record"] == "manifest" and manifest["jobs"] == 3


@pytest.mark.parametrize(
    "args", [("verify", "t"), ("verify", "t", "a", "--all"), ("verify", "--tenant", "t", "--all")]
)
def test_verify_refuses_a_mixed_selection(operator: Operator, args: tuple[str, ...]) -> None:
    result = operator(*args)
    assert result.returncode == 2
    assert "give TENANT JOB, or --tenant T, or --all" in " ".join(result.stderr.split()) or (
        "not both" in result.stderr
    )


WAITS = """
type: invoice
version: 1
start: send
steps:
  send: {kind: run_interaction_task, params: {task: send}, next: paid}
  paid: {kind: wait_event, event: invoice.paid, next: review}
  review: {kind: await_approval, approvers: [lead], on_approve: done}
  done: {kind: complete}
"""


def notices(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_a_configured_notifier_hands_tokens_and_approvals_to_people_while_the_runner_runs(
    operator: Operator, tmp_path: Path
) -> None:
    (operator.home / "definitions" / "invoice.yaml").write_text(WAITS)
    with (operator.home / "jobledger.toml").open("a") as config:
        config.write('notifier = "file:notices.jsonl"\n')
        config.write('token_secret = "0123456789abcdef0123456789abcdef"\n')
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("JOBLEDGER_")}
    # Started from another directory: the notices file is beside the config file.
    runner = subprocess.Popen(
        [str(JOBLEDGER), "run", "--config", str(operator.home / "jobledger.toml")],
        cwd=elsewhere,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        operator.json("submit", "t", "inv-1", "invoice")
        path = operator.home / "notices.jsonl"
        [token_notice] = wait_for(lambda: notices(path), "a token notice")
        assert token_notice["type"] == "waiting_for_event"
        assert token_notice["event_name"] == "invoice.paid"
        resumed = operator.json("resume", "--token", token_notice["token"], "--payload", "{}")
        assert resumed["job"]["job_id"] == "inv-1"
        approval = wait_for(lambda: notices(path)[1:], "an approval notice")[0]
        assert approval["type"] == "approval_requested" and approval["approvers"] == ["lead"]
        operator.json(
            "approve", "t", "inv-1", "--by", "lead", "--approval", approval["approval_id"]
        )
        wait_for(lambda: operator.json("show", "t", "inv-1")["status"] == "completed", "completion")
    finally:
        runner.terminate()
        runner.wait(timeout=30)
    assert not (elsewhere / "notices.jsonl").exists()


def wait_for(probe: Any, what: str, timeout: float = 30.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = probe()
        if found:
            return found
        time.sleep(0.2)
    raise AssertionError(f"no {what} within {timeout} s")


BROKEN_EXECUTOR = """
from jobledger import StepRequest, StepResult

class Chores:
    def execute(self, request: StepRequest) -> StepResult:
        if request.job.job_id == "bad":
            raise KeyError("no such chore")
        return StepResult(output={"did": request.resolution.params["task"]})
"""


def test_the_runner_says_what_it_runs_and_logs_a_line_per_tick_and_executor_tracebacks(
    operator: Operator,
) -> None:
    (operator.home / "chores_executor.py").write_text(BROKEN_EXECUTOR)
    operator.json("submit", "t", "good", "chores")
    operator.json("submit", "t", "bad", "chores")
    env = {k: v for k, v in os.environ.items() if not k.startswith("JOBLEDGER_")}
    runner = subprocess.Popen(
        [str(JOBLEDGER), "run", "--log-format", "json"],
        cwd=operator.home,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_for(lambda: operator.json("show", "t", "bad")["status"] == "failed", "a failure")
        wait_for(lambda: operator.json("show", "t", "good")["status"] == "completed", "completion")
    finally:
        runner.terminate()
        out, err = runner.communicate(timeout=30)
    assert "store: sqlite:///" in out and "transport: local" in out
    assert "definitions: chores@1" in out and "executor: chores_executor:Chores" in out
    lines = [json.loads(line) for line in err.splitlines() if line.startswith("{")]
    ticks = [line["message"] for line in lines if line["logger"] == "jobledger.engine.ticks"]
    assert any(m.startswith("tick t/good (") and "now completed at step 4" in m for m in ticks)
    assert any(m.startswith("tick t/bad (") and ": failed," in m for m in ticks)
    [failure] = [line for line in lines if line["level"] == "error"]
    assert failure["message"].startswith("step 1 of t/bad raised KeyError")
    assert "Traceback" in failure["traceback"] and "no such chore" in failure["traceback"]
    assert not [line for line in lines if line["logger"] == "jobledger.ops"]  # debug only


def test_replay_all_does_not_call_finished_jobs_safe_to_migrate(operator: Operator) -> None:
    operator.json("submit", "t", "done", "chores")
    operator.json("tick", "t", "done")
    operator.json("submit", "t", "waiting", "chores")
    definition = str(operator.home / "definitions" / "chores.yaml")
    report = operator.json("replay", "--all", "--definition", definition)
    jobs = {job["job"]: job for job in report["jobs"]}
    assert jobs["done"]["verdict"] == "completed: replays the same; nothing to migrate"
    assert jobs["done"]["migratable"] is False and jobs["done"]["safe"] is True
    assert jobs["waiting"]["verdict"] == "safe to migrate" and jobs["waiting"]["migratable"]
    assert (report["migratable"], report["finished"]) == (1, 1)
    table = operator("replay", "--all", "--definition", definition).stdout
    assert "1 of 2 jobs safe to migrate (1 finished: nothing to migrate)" in " ".join(table.split())


LOOP = """
type: loop
version: 1
start: work
steps:
  work: {kind: run_interaction_task, params: {task: work}, next: again, max_visits: 2}
  again: {kind: branch, cases: [{when: {path: never, op: exists}, next: done}], default: work}
  done: {kind: complete}
"""


def test_show_says_why_a_job_failed_and_why_one_is_parked(operator: Operator) -> None:
    (operator.home / "definitions" / "loop.yaml").write_text(LOOP)
    operator.json("submit", "t", "looping", "loop")
    operator.json("tick", "t", "looping")
    failed = operator.json("show", "t", "looping")
    assert failed["status"] == "failed"
    assert failed["last_error"] == "step 'work' reached its bound of max_visits=2"
    shown = " ".join(operator("show", "t", "looping").stdout.split())
    assert "failed because step 'work' reached its bound of max_visits=2" in shown

    budget = '{"max_steps": 1, "deadline_at": "2030-01-01T00:00:00Z"}'
    operator.json("submit", "t", "thrifty", "chores", "--budget", budget)
    operator.json("tick", "t", "thrifty")
    parked = operator.json("show", "t", "thrifty")
    assert parked["status"] == "budget_exceeded"
    assert parked["parked"].startswith("budget max_steps reached: 1 of 1: raise-budget lets it")
    assert "fails at its deadline 2030-01-01 00:00:00 UTC unless raised" in parked["parked"]
    shown = " ".join(operator("show", "t", "thrifty").stdout.split())
    assert "parked budget max_steps reached" in shown
    assert "deadline 2030-01-01 00:00:00 UTC" in shown


def test_list_filters_pages_and_prints_plain_lines(operator: Operator) -> None:
    for n in range(5):
        operator.json(
            "submit",
            "t",
            f"job-{n}",
            "chores",
            "--mission",
            "m-even" if n % 2 == 0 else "m-odd",
            "--correlation",
            f"c-{n}",
        )
    by_mission = operator.json("list", "--mission", "m-even")
    assert sorted(row["job_id"] for row in by_mission) == ["job-0", "job-2", "job-4"]
    assert [row["job_id"] for row in operator.json("list", "--correlation", "c-3")] == ["job-3"]
    assert len(operator.json("list", "--workflow", "chores", "--version", "1")) == 5
    assert operator.json("list", "--workflow", "chores", "--version", "2") == []
    assert operator.json("list", "--created-after", "2999-01-01") == []
    assert len(operator.json("list", "--updated-before", "2999-01-01T00:00:00Z")) == 5
    # Pages of two: every job exactly once, newest change first.
    seen: list[str] = []
    after: list[str] = []
    while True:
        page = operator.json("list", "--limit", "2", *after)
        seen += [row["job_id"] for row in page]
        if len(page) < 2:
            break
        after = ["--after", page[-1]["cursor"]]
    assert seen == [f"job-{n}" for n in reversed(range(5))]
    table = operator("list", "--limit", "2").stdout
    assert f"more: --after {operator.json('list', '--limit', '2')[-1]['cursor']}" in table
    plain = operator("list", "--output", "plain", "--mission", "m-odd").stdout.splitlines()
    assert [line.split("\t")[:3] for line in plain] == [
        ["t", "job-3", "queued"],
        ["t", "job-1", "queued"],
    ]
    refused = operator("list", "--after", "not-a-cursor")
    assert refused.returncode == 1 and "not a listing cursor: 'not-a-cursor'" in refused.stderr
