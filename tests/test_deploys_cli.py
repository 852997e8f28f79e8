"""Issue 9 items 5 and 6 through the real console script, on both stores: a runner that
lacks a job's pinned version says why (show, list, its log), reloads on SIGHUP and goes
on; ``definitions check --store`` warns before such a deploy; ``token reissue``."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.support import pythonpath
from tests.support.engines import TOKEN_SECRET

JOBLEDGER = str(Path(sys.executable).with_name("jobledger"))
TESTS = Path(__file__).resolve().parent


def five(version: int) -> str:
    return f"""
type: five
version: {version}
start: a
steps:
  a: {{kind: run_interaction_task, params: {{task: a{version}}}, next: done}}
  done: {{kind: complete}}
"""


REPLY = """
type: reply
version: 1
start: ask
steps:
  ask: {kind: wait_event, event: reply, next: done}
  done: {kind: complete}
"""


@pytest.fixture
def ws(tmp_path: Path, store_url: str) -> dict[str, Any]:
    for name, files in {
        "defs_old": {"five_v1.yaml": five(1), "reply.yaml": REPLY},
        "defs_new": {"five_v1.yaml": five(1), "five_v2.yaml": five(2), "reply.yaml": REPLY},
    }.items():
        (tmp_path / name).mkdir()
        for file, text in files.items():
            (tmp_path / name / file).write_text(text)
    for name in ("old", "new"):
        (tmp_path / f"{name}.toml").write_text(
            f'definitions = "defs_{name}"\nexecutor = "tests.support.cli:RecordingExecutor"\n'
            f'token_secret = "{TOKEN_SECRET}"\nworker_id = "{name}-worker"\n'
        )
    env = {k: v for k, v in os.environ.items() if not k.startswith("JOBLEDGER_")}
    # Keep the caller's PYTHONPATH after the checkout: the script then runs this checkout's code.
    env.update(PYTHONPATH=pythonpath(), JOBLEDGER_STORE_URL=store_url, COLUMNS="200")
    return {"dir": tmp_path, "env": env, "store": store_url}


def cli(ws: dict[str, Any], *args: str, cfg: str = "new", code: int = 0) -> str:
    result = subprocess.run(
        [JOBLEDGER, *args, "--config", str(ws["dir"] / f"{cfg}.toml")],
        env=ws["env"],
        cwd=ws["dir"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert "Traceback" not in result.stderr, result.stderr
    assert result.returncode == code, (args, result.stdout, result.stderr)
    return result.stdout + result.stderr


def listed(ws: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {row["job_id"]: row for row in json.loads(cli(ws, "list", "--json"))}


def wait_until(predicate: Any, seconds: float, what: str) -> None:
    deadline = time.monotonic() + seconds
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.3)


@pytest.mark.slow
def test_a_runner_without_the_version_says_why_and_goes_on_after_a_sighup_reload(
    ws: dict[str, Any],
) -> None:
    cli(ws, "submit", "acme", "j", "five", "--version", "2")
    warned = cli(ws, "definitions", "check", "defs_old", "--store", ws["store"], "--json")
    check = json.loads(warned)
    assert check["ok"] is True
    assert any("'five' v2" in w for w in check["warnings"]), check
    runner = subprocess.Popen(
        [JOBLEDGER, "run", "--config", str(ws["dir"] / "old.toml")],
        env=ws["env"],
        cwd=ws["dir"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        wait_until(lambda: listed(ws)["j"]["blocked"] is not None, 60, "the job to be blocked")
        row = listed(ws)["j"]
        assert row["status"] == "queued" and row["version"] == 1
        assert "unknown workflow 'five' v2 (known: v1)" in row["blocked"]["reason"]
        assert row["blocked"]["worker_id"] == "old-worker"
        shown = json.loads(cli(ws, "show", "acme", "j", "--json"))
        assert "unknown workflow 'five' v2" in shown["blocked"]["reason"]
        assert "blocked" in cli(ws, "show", "acme", "j")

        (ws["dir"] / "defs_old" / "five_v2.yaml").write_text(five(2))
        runner.send_signal(signal.SIGHUP)
        wait_until(lambda: listed(ws)["j"]["status"] == "completed", 60, "the job to finish")
    finally:
        runner.send_signal(signal.SIGINT)
        out, _ = runner.communicate(timeout=60)
    assert runner.returncode == 0, out
    assert "job acme/j left untouched, to be retried later" in out
    assert "SIGHUP: definitions reloaded" in out and "five v2" in out
    assert listed(ws)["j"]["blocked"] is None
    history = json.loads(cli(ws, "history", "acme", "j", "--json"))["events"]
    assert "Failed" not in [e["event_type"] for e in history]
    assert json.loads(cli(ws, "show", "acme", "j", "--json"))["blocked"] is None


def test_token_reissue_prints_a_new_token_and_voids_the_old_one(ws: dict[str, Any]) -> None:
    cli(ws, "submit", "acme", "r", "reply")
    ticked = json.loads(cli(ws, "tick", "acme", "r", "--json"))
    old = ticked["resume_tokens"][0]["token"]

    reissued = json.loads(cli(ws, "token", "reissue", "acme", "r", "--by", "ops", "--json"))

    assert reissued["token"] != old and reissued["job"]["status"] == "waiting_event"
    assert reissued["job"]["wait"]["token_nonce"] == reissued["nonce"]
    refused = cli(ws, "resume", "--token", old, code=1)
    assert "superseded" in refused
    cli(ws, "resume", "--token", reissued["token"])
    human = cli(ws, "token", "reissue", "acme", "r", "--by", "ops", code=1)
    assert "not waiting for an event" in human
