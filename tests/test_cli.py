"""The ``jobledger`` console script, run for real as a subprocess, on both stores.

The executor comes from tests/support/cli.py (the repository root is on the script's
PYTHONPATH); definitions and settings from a TOML file passed with --config, or from
JOBLEDGER_* variables.
"""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.support import ROOT
from tests.support.cli import TICKET, Cli, make_cli
from tests.support.engines import TOKEN_SECRET


@pytest.fixture
def cli(tmp_path: Path, store_url: str) -> Cli:
    return make_cli(tmp_path, store_url)


@pytest.fixture
def sqlite_cli(tmp_path: Path) -> Cli:
    return make_cli(tmp_path, f"sqlite:///{tmp_path}/jobs.db")


# ---- on both stores -------------------------------------------------------------------


def test_submit_show_tick_resume_approve_and_history(cli: Cli) -> None:
    (cli.tmp / "input.json").write_text('{"customer": "c-9", "amount": "12.50"}')
    submitted = cli.json(
        "submit", "acme", "t1", "ticket", "--input", "@input.json",
        "--budget", '{"max_steps": 9}', "--idempotency-key", "req-1",
    )  # fmt: skip
    assert (submitted["status"], submitted["workflow_version"]) == ("queued", 1)
    assert submitted["state"] == {"customer": "c-9", "amount": "12.50"}
    assert submitted["budget"] == {"max_steps": 9} and submitted["total_cost_usd"] == "0"
    assert cli.json("show", "acme", "t1") == submitted

    ticked = cli.json("tick", "acme", "t1")
    assert (ticked["outcome"], ticked["steps_executed"]) == ("advanced", 2)
    assert ticked["job"]["status"] == "waiting_event"
    assert ticked["job"]["wait"]["event"] == "invoice.paid"
    [issued] = ticked["resume_tokens"]
    (cli.tmp / "token.txt").write_text(issued["token"] + "\n")
    resumed = cli.json("resume", "--token", "@token.txt", "--payload", '{"paid": 120}')
    assert resumed["job"]["status"] == "queued" and resumed["job"]["state"]["paid"] == 120
    replay = cli.fails(1, "resume", "--token", issued["token"])
    assert replay == "error: the resume token was already used"

    shown = cli.ok("tick", "acme", "t1")  # the human output: what it handed out, the job
    approval = "t1:step:3:approval"
    assert f"approval requested: {approval}" in shown and "job acme/t1" in shown
    assert f"pending approval  {approval} by lead" in shown and "awaiting_approval" in shown
    refused = cli.fails(1, "approve", "acme", "t1", "--by", "mallory")
    assert refused == f"error: 'mallory' may not decide approval '{approval}'; allowed: lead"
    out = cli.ok("approve", "acme", "t1", "--by", "lead", "--comment", "paid in full")
    assert out.startswith(f"approved {approval} as lead: acme/t1 is now queued")
    assert cli.json("tick", "acme", "t1")["job"]["status"] == "completed"

    history = cli.json("history", "acme", "t1")
    assert history["chain"] == {"intact": True, "broken_at": None}
    events = [(e["version"], e["event_type"], e["by"]) for e in history["events"]]
    assert events[0] == (1, "Submitted", "submit (key req-1)")
    assert ("ApprovalDecided", "decided_by lead") in [(kind, by) for _, kind, by in events]
    assert all(len(e["chain_hash"]) == 64 for e in history["events"])
    audit = cli.ok("history", "acme", "t1")
    assert f"token nonce {issued['nonce']}" in audit and "worker cli-worker" in audit
    assert "#4 publish (run_interaction_task)" in audit and "hash chain: intact" in audit
    # triage and publish, once each
    assert cli.effects() == {"acme/t1:step:1": 1, "acme/t1:step:4": 1}


def test_one_shot_commands_take_the_log_options_of_the_running_ones(cli: Cli) -> None:
    """--log-level and --log-format on a one-shot command: a tick run from the shell logs
    its line as JSON, naming the job; without either, logging is as it was (nothing
    below a warning), so what the commands print is unchanged."""
    cli.ok("submit", "acme", "l1", "ticket")
    quiet = cli("tick", "acme", "l1")
    assert quiet.returncode == 0 and quiet.stderr == ""
    signalled = cli("signal", "acme", "l1", "invoice.paid", "--id", "p1", "--log-format", "json")
    assert signalled.returncode == 0 and signalled.stderr == ""  # at warning by default
    logged = cli("tick", "acme", "l1", "--log-level", "info", "--log-format", "json")
    assert logged.returncode == 0 and "awaiting_approval" in logged.stdout
    lines = [json.loads(line) for line in logged.stderr.splitlines()]
    (ticked,) = [line for line in lines if line["logger"] == "jobledger.engine.ticks"]
    assert ticked["level"] == "info" and ticked["message"].startswith("tick acme/l1 (")
    assert (ticked["tenant"], ticked["job"], ticked["step"]) == ("acme", "l1", 3)
    refused = cli.fails(2, "show", "acme", "l1", "--log-format", "xml")
    assert "'xml' is not one of 'text', 'json'" in refused


def test_signal_reject_and_cancel(cli: Cli) -> None:
    cli.ok("submit", "acme", "t2", "ticket")
    early = cli.json(
        "signal", "acme", "t2", "invoice.paid", "--id", "evt-1", "--payload", '{"paid": 5}'
    )
    assert early["outcome"] == "buffered"  # it came before the wait opened: kept
    ticked = cli.json("tick", "acme", "t2")  # the wait opens and takes the buffered signal
    assert ticked["job"]["status"] == "awaiting_approval" and ticked["job"]["state"]["paid"] == 5
    approval = ticked["job"]["pending_approval_id"]
    out = cli.ok(
        "reject", "acme", "t2", "--approval", approval, "--by", "lead", "--comment", "wrong amount"
    )
    assert f"rejected {approval} as lead" in out

    cancelled = cli.json("cancel", "acme", "t2", "--reason", "customer withdrew", "--by", "ops")
    assert cancelled["job"]["status"] == "cancelled"
    again = cli.fails(1, "cancel", "acme", "t2", "--reason", "again", "--by", "ops")
    assert again == "error: job 't2' is already cancelled"
    late = cli.fails(1, "signal", "acme", "t2", "invoice.paid", "--id", "evt-2")
    assert late == "error: job 't2' is cancelled; signal not delivered"


# ---- errors and their exit codes (the store does not matter: SQLite) -----------------


UNREACHABLE = "postgresql://jobledger:jobledger@127.0.0.1:1/jobledger?connect_timeout=1"
LONG = "u" * 201

ERRORS = [
    # exit code, arguments (the test's --config is added unless they give one), stderr says
    (1, ("show", "acme", "nope"), ["error: no job 'nope' for tenant 'acme'"]),
    (1, ("approve", "acme", "nope", "--by", "lead"), ["error: no job 'nope' for tenant 'acme'"]),
    (1, ("submit", "acme", "x", "nosuch"), ["error: unknown workflow type 'nosuch'"]),
    (1, ("resume", "--token", "not-a-jwt"), ["error: resume token is malformed"]),
    (
        1,
        ("cancel", "acme", "x", "--reason", "r", "--by", LONG),
        ["error: by must be a non-empty string of at most 200 characters"],
    ),
    (
        2,
        ("submit", "acme", "x", "ticket", "--input", "{oops"),
        [
            "Invalid value for '--input': not valid JSON: Expecting property name enclosed in "
            "double quotes at line 1 column 2"
        ],
    ),
    (
        2,
        ("signal", "acme", "x", "paid", "--id", "s1", "--payload", "[1]"),
        ["Invalid value for '--payload': must be a JSON object, got list"],
    ),
    (
        2,
        ("submit", "acme", "x", "ticket", "--input", "@nope.json"),
        ["Invalid value for '--input': cannot read 'nope.json'"],
    ),
    (1, ("definitions", "check", "nowhere"), ["error: nowhere: no such file or directory"]),
    (
        3,
        ("show", "a", "b", "--store", "mysql://db/x"),
        ["error: unsupported store URL 'mysql://db/x': use sqlite:///"],
    ),
    (
        3,
        ("show", "a", "b", "--store", "sqlite:///no/such/dir/x.db"),
        ["error: SQLite URL 'sqlite:///no/such/dir/x.db': directory 'no/such/dir' does not exist"],
    ),
    (
        3,
        ("show", "a", "b", "--store", UNREACHABLE),
        ["error: cannot open the postgresql store: ", "Connection refused"],
    ),
    (
        3,
        ("show", "a", "b", "--config", "missing.toml"),
        ["error: cannot read config file 'missing.toml': No such file or directory"],
    ),
    (
        3,
        ("show", "a", "b", "--config", "bad.toml"),
        [
            "error: invalid config file 'bad.toml'",
            "partitions must be at least 1 (got 0)",
            "unknown setting 'colour'",
        ],
    ),
    (
        3,
        ("tick", "a", "b", "--config", "empty.toml"),
        [
            "error: tick needs workflow definitions (definitions = DIR, or "
            "JOBLEDGER_DEFINITIONS) or code workflows (workflows = [modules], or "
            "JOBLEDGER_WORKFLOWS) and a step executor (executor = 'module:attr', or "
            "JOBLEDGER_EXECUTOR) or step functions (workflows = [modules]): set them in the "
            "config file"
        ],
    ),
]


def test_errors_exit_with_their_code_and_message_and_no_traceback(sqlite_cli: Cli) -> None:
    cli = sqlite_cli
    (cli.tmp / "bad.toml").write_text("partitions = 0\ncolour = 'blue'\n")
    (cli.tmp / "empty.toml").write_text("")
    cli.ok("submit", "acme", "other", "ticket")  # only commands that write create a store
    with ThreadPoolExecutor(max_workers=4) as pool:  # independent: run them side by side
        results = list(
            pool.map(lambda case: cli(*case[1], config="--config" not in case[1]), ERRORS)
        )
    for (code, args, says), result in zip(ERRORS, results, strict=True):
        stderr = " ".join(result.stderr.replace("│", " ").split())  # undo rich's error box
        assert result.returncode == code, (args, result.returncode, stderr)
        assert result.stdout == "" or code == 2, (args, result.stdout)
        for text in says:
            assert text in stderr, (args, stderr)


def test_environment_variables_configure_the_store_definitions_and_executor(
    sqlite_cli: Cli,
) -> None:
    cli = sqlite_cli
    cli.env.update(
        JOBLEDGER_STORE_URL=f"sqlite:///{cli.tmp}/env.db",
        JOBLEDGER_DEFINITIONS=str(cli.tmp / "definitions"),
        JOBLEDGER_EXECUTOR="tests.support.cli:RecordingExecutor",
        JOBLEDGER_TOKEN_SECRET=TOKEN_SECRET,
    )
    cli.config = None  # no --config from here on
    assert cli.json("submit", "acme", "e1", "ticket")["status"] == "queued"
    assert cli.json("tick", "acme", "e1")["job"]["status"] == "waiting_event"
    assert (cli.tmp / "env.db").exists()
    cli.env["JOBLEDGER_EXECUTOR"] = "no_such_module:Executor"
    broken = cli.fails(3, "tick", "acme", "e1")
    assert "executor 'no_such_module:Executor': cannot import 'no_such_module'" in broken


def test_definitions_check(sqlite_cli: Cli) -> None:
    cli = sqlite_cli
    checked = cli.json("definitions", "check", str(ROOT / "examples" / "definitions"))
    assert checked["ok"] is True
    found = {(d["file"], d["type"], d["version"]) for d in checked["definitions"]}
    assert ("demo_mission.v1.yaml", "demo_mission", 1) in found
    assert "1 definition(s) OK" in cli.ok("definitions", "check")  # the configured directory

    bad = cli.tmp / "bad"
    bad.mkdir()
    (bad / "a.yaml").write_text(TICKET.replace("on_reject: rejected", "on_reject: rejectd"))
    (bad / "b.json").write_text('{"type": "x", "version": 1, "start": "s", "steps": {"s": 7}}')
    problems = cli.fails(1, "definitions", "check", str(bad))
    assert problems.startswith("error: 3 problems in workflow definitions:")
    assert "a.yaml: step 'review': field 'on_reject': unknown step 'rejectd'" in problems
    assert "a.yaml: step 'rejected': unreachable from start step 'triage'" in problems
    assert "b.json: step 's': must be a mapping, got 7" in problems
    result = cli("definitions", "check", str(bad), "--json")
    assert result.returncode == 1 and len(json.loads(result.stdout)["problems"]) == 3


def test_demo(sqlite_cli: Cli) -> None:
    result = sqlite_cli("demo", config=False)
    assert result.returncode == 0, result.stdout + result.stderr
    out = result.stdout
    assert "FakeClock" in out and "a fresh temporary file" in out
    for capability in (
        "agent step",
        "worker crash",
        "no step re-run",
        "durable timer",
        "outside event",
        "human approval",
        "cost ceiling",
        "completed",
        "chain verified",
        "fan-out join",
    ):
        assert f"PASS  {capability}" in out
    assert "FAIL" not in out and "all 10 checks passed" in out
    assert "took over from worker-1 (lease expired)" in out
    assert "the resume token was already used" in out
    assert "decided_by demo-reviewer" in out and "CostCeilingDeferred" in out
