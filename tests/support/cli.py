"""The CLI tests' helpers: :class:`Cli` runs the real ``jobledger`` console script in a
clean environment, and :class:`RecordingExecutor` is the step executor it loads through
``executor = "tests.support.cli:RecordingExecutor"`` (the repository root is on its
PYTHONPATH).

Each side effect appends its idempotency key to the file named by CLI_SUPPORT_EFFECTS, so
the test can count them across processes.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from jobledger import StepError, StepRequest, StepResult
from tests.support import pythonpath
from tests.support.engines import TOKEN_SECRET

EFFECTS_VARIABLE = "CLI_SUPPORT_EFFECTS"
FAIL_VARIABLE = "CLI_SUPPORT_FAIL"
"""Comma-separated tasks whose steps raise a StepError (after their effect is written)."""


class RecordingExecutor:
    def execute(self, request: StepRequest) -> StepResult:
        task = str(request.resolution.params.get("task", request.step_type))
        path = os.environ.get(EFFECTS_VARIABLE)
        if path:
            with open(path, "a", encoding="utf-8") as effects:
                effects.write(f"{request.idempotency_key}\n")
        if task in os.environ.get(FAIL_VARIABLE, "").split(","):
            raise StepError(f"{task} failed", retryable=False)
        return StepResult(output={"task": task}, state_patch={f"did_{task}": True}, cost_usd="0.10")


JOBLEDGER = Path(sys.executable).parent / "jobledger"


def run_jobledger(
    *args: str, cwd: Path | None = None, **env: str
) -> subprocess.CompletedProcess[str]:
    """``jobledger ARGS`` as a user runs it: no JOBLEDGER_* settings but ``env``'s, a
    120-column terminal, this checkout importable."""
    environment = {k: v for k, v in os.environ.items() if not k.startswith("JOBLEDGER_")}
    environment.update(COLUMNS="120", PYTHONPATH=pythonpath(), **env)
    return subprocess.run(
        [str(JOBLEDGER), *args],
        capture_output=True,
        text=True,
        env=environment,
        cwd=cwd,
        timeout=60,
    )


NOTE = """
type: note
version: 1
start: write
steps:
  write: {kind: run_interaction_task, params: {task: write}, next: done}
  done: {kind: complete}
"""
"""One agent step, ``write`` (the CLI tests' plainest definition)."""


TICKET = """
type: ticket
version: 1
start: triage
steps:
  triage: {kind: run_interaction_task, params: {task: triage}, next: payment}
  payment: {kind: wait_event, event: invoice.paid, next: review}
  review:
    kind: await_approval
    approvers: [lead]
    on_approve: publish
    on_reject: rejected
  publish: {kind: run_interaction_task, params: {task: publish}, next: done}
  done: {kind: complete}
  rejected: {kind: fail, reason: rejected by the lead}
"""


@dataclass
class Cli:
    """Runs ``jobledger ARGS --config FILE`` in a clean environment."""

    tmp: Path
    config: Path | None
    env: dict[str, str]

    def __call__(self, *args: str, config: bool = True) -> subprocess.CompletedProcess[str]:
        use_config = config and self.config is not None
        command = [str(JOBLEDGER), *args, *(["--config", str(self.config)] if use_config else [])]
        result = subprocess.run(
            command, capture_output=True, text=True, env=self.env, cwd=self.tmp, timeout=60
        )
        assert "Traceback" not in result.stderr, result.stderr
        return result

    def ok(self, *args: str) -> str:
        result = self(*args)
        assert result.returncode == 0, f"{args}: {result.stderr}"
        return result.stdout

    def json(self, *args: str) -> Any:
        return json.loads(self.ok(*args, "--json"))

    def fails(self, code: int, *args: str, config: bool = True) -> str:
        """The command exits with ``code``; returns its stderr, with rich's boxes undone."""
        result = self(*args, config=config)
        assert result.returncode == code, (args, result.returncode, result.stdout, result.stderr)
        assert result.stdout == "" or code == 2
        return " ".join(result.stderr.replace("│", " ").split())

    def effects(self) -> Counter[str]:
        path = self.tmp / "effects.log"
        return Counter(path.read_text().splitlines()) if path.exists() else Counter()


def make_cli(
    tmp_path: Path,
    store_url: str,
    *,
    definitions: dict[str, str] | None = None,
    executor: str = "tests.support.cli:RecordingExecutor",
    settings: str = "",
) -> Cli:
    """A config file with ``definitions`` (file name: YAML; default the ticket), the
    ``executor`` and any further TOML ``settings`` lines."""
    directory = tmp_path / "definitions"
    directory.mkdir()
    for name, text in (definitions or {"ticket.yaml": TICKET}).items():
        (directory / name).write_text(text)
    config = tmp_path / "jobledger.toml"
    config.write_text(
        f'store_url = "{store_url}"\n'
        'definitions = "definitions"\n'
        f'executor = "{executor}"\n'
        f'token_secret = "{TOKEN_SECRET}"\n'
        'worker_id = "cli-worker"\n' + settings
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("JOBLEDGER_")}
    env.update(
        # The caller's path after the checkout's: a worktree's src/ must win over the installed one.
        PYTHONPATH=pythonpath(),
        COLUMNS="200",
        CLI_SUPPORT_EFFECTS=str(tmp_path / "effects.log"),
    )
    return Cli(tmp_path, config, env)


def announced(process: subprocess.Popen[str], pattern: str, what: str) -> str:
    """The first group of ``pattern`` in the first stdout line of ``process`` that has it
    (the URL a server says it chose); the process is killed and its stderr shown if it
    never says so within a minute."""
    assert process.stdout is not None
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        line = process.stdout.readline()
        if not line:
            break
        found = re.search(pattern, line)
        if found:
            return found.group(1)
    process.kill()
    _, err = process.communicate(timeout=30)
    raise AssertionError(f"{what}: {err}")
