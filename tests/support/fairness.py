"""Helpers of the fairness tests (tests/test_fairness.py, tests/test_fairness_kafka.py,
scripts/bench_fairness.py): a no-op workflow, and an executor that records when each
job runs, in this process or, through a file, in worker processes."""

from __future__ import annotations

import os
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Iterable
from pathlib import Path

from jobledger import FunctionRegistry, StepRequest, StepResult
from tests.support.crash_worker import append_line
from tests.support.engines import agent_steps
from tests.support.workflows import linear_registry

NOOP_DEFINITION = (
    "type: noop\nversion: 1\nstart: work\nsteps:\n"
    "  work: {kind: run_interaction_task, next: done}\n"
    "  done: {kind: complete}\n"
)
"""One side-effecting step that does nothing, then complete (for `jobledger worker`)."""


def registry() -> FunctionRegistry:
    """``noop``: one side-effecting step; ``agent3``: three."""
    return linear_registry({"noop": agent_steps(1), "agent3": agent_steps(3)})


class RunRecorder:
    """Records each job's first step in order, and how many jobs of each tenant (and
    workflow) were between their first step's start and their last step's end at once:
    a job the executor sees running is one the gate admitted, so that peak can never
    exceed a limit the gate keeps."""

    def __init__(self, steps: dict[str, int], effect_s: float = 0.0) -> None:
        self.steps = steps
        self.effect_s = effect_s
        self.lock = threading.Lock()
        self.first_steps: list[tuple[str, str]] = []
        self.first_step_at: dict[tuple[str, str], float] = {}
        self.active: Counter[str] = Counter()
        self.peak: Counter[str] = Counter()

    def execute(self, request: StepRequest) -> StepResult:
        job = request.job
        scopes = (job.tenant_id, f"{job.tenant_id}/{job.workflow_type}")
        with self.lock:
            if request.step_number == 1:
                self.first_steps.append((job.tenant_id, job.job_id))
                self.first_step_at[(job.tenant_id, job.job_id)] = time.monotonic()
                for scope in scopes:
                    self.active[scope] += 1
                    self.peak[scope] = max(self.peak[scope], self.active[scope])
        time.sleep(self.effect_s)
        with self.lock:
            if request.step_number == self.steps[job.workflow_type]:
                for scope in scopes:
                    self.active[scope] -= 1
        return StepResult(output={"step": request.step_number})


class FileRunRecorder:
    """The executor of `jobledger worker` processes (``JOBLEDGER_EXECUTOR``): each step
    of the one-step ``noop`` workflow appends ``begin``/``end`` lines with the tenant,
    the job and the wall-clock nanoseconds to ``JOBLEDGER_TEST_RUNS`` (one atomic append
    each, readable after a SIGKILL)."""

    def __init__(self) -> None:
        self.path = Path(os.environ["JOBLEDGER_TEST_RUNS"])
        self.effect_s = float(os.environ.get("JOBLEDGER_TEST_EFFECT_MS", "2")) / 1000

    def execute(self, request: StepRequest) -> StepResult:
        job = request.job
        append_line(self.path, f"begin {job.tenant_id} {job.job_id} {time.time_ns()}")
        time.sleep(self.effect_s)
        append_line(self.path, f"end {job.tenant_id} {job.job_id} {time.time_ns()}")
        return StepResult(output={"step": request.step_number})


def runs(path: Path) -> list[tuple[str, str, str, int]]:
    """The lines a FileRunRecorder wrote: (begin|end, tenant, job, ns), in time order."""
    if not path.exists():
        return []
    lines = [line.split(" ") for line in path.read_text().splitlines() if line]
    return sorted(((k, t, j, int(ns)) for k, t, j, ns in lines), key=lambda r: r[3])


def peak_running(records: Iterable[tuple[str, str, str, int]]) -> dict[str, int]:
    """Per tenant, the most jobs between a begin and its end at once. A job whose worker
    was killed mid-step never ends in the file: it counts until its re-run begins."""
    active: dict[str, set[str]] = defaultdict(set)
    peak: Counter[str] = Counter()
    for kind, tenant, job, _ in records:
        if kind == "begin":
            active[tenant].add(job)
            peak[tenant] = max(peak[tenant], len(active[tenant]))
        else:
            active[tenant].discard(job)
    return dict(peak)
