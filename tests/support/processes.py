"""What tests/test_processes.py runs in its worker processes: a chain workflow, and the
executor that notes which process ran each side effect.

Each side effect appends ``PID KEY`` to the file named by PROCESSES_EFFECTS (one
O_APPEND write: atomic between processes, and kept through SIGKILL), after
PROCESSES_EFFECT_MS milliseconds of work, so a backlog takes long enough to be shared.
"""

from __future__ import annotations

import os
import time
from collections import Counter
from pathlib import Path

from jobledger import StepRequest, StepResult
from tests.support.crash_worker import append_line

EFFECTS_VARIABLE = "PROCESSES_EFFECTS"
EFFECT_MS_VARIABLE = "PROCESSES_EFFECT_MS"
STEPS = 5
"""Side-effecting steps of the ``chain`` workflow (step STEPS + 1 completes it)."""


def chain_definition(steps: int = STEPS) -> str:
    """``chain``: ``steps`` agent steps one after another, then complete."""
    lines = ["type: chain", "version: 1", "start: s1", "steps:"]
    for n in range(1, steps + 1):
        following = f"s{n + 1}" if n < steps else "done"
        step = f"{{kind: run_interaction_task, params: {{n: {n}}}, next: {following}}}"
        lines.append(f"  s{n}: {step}")
    lines.append("  done: {kind: complete}")
    return "\n".join(lines) + "\n"


class PidRecordingExecutor:
    def execute(self, request: StepRequest) -> StepResult:
        time.sleep(float(os.environ.get(EFFECT_MS_VARIABLE, "0")) / 1000)
        append_line(Path(os.environ[EFFECTS_VARIABLE]), f"{os.getpid()} {request.idempotency_key}")
        return StepResult()


def effects_by_pid(path: Path) -> dict[int, Counter[str]]:
    """Each process's side effects: pid -> idempotency key -> times run."""
    found: dict[int, Counter[str]] = {}
    for line in path.read_text().splitlines() if path.exists() else []:
        pid, key = line.split(" ", 1)
        found.setdefault(int(pid), Counter())[key] += 1
    return found
