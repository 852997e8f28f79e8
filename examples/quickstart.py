"""Submit a job on the embedded default (a SQLite file) and run it to completion.

    python examples/quickstart.py [path/to/store.db]

An agent step (here: counting words in a local text, with a per-step cost), a durable
timer, and completion. Run it twice with the same file: the second run finds the job
already completed and runs nothing again.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

from jobledger import (
    Engine,
    EngineConfig,
    FunctionRegistry,
    JobStatus,
    Resolution,
    StepRequest,
    StepResult,
    linear_workflow,
)

TEXT = "Durable jobs record every step once and never run a recorded step again."


class WordCounter:
    """A deterministic stand-in for an agent turn: real work on local data, with a cost."""

    def execute(self, request: StepRequest) -> StepResult:
        words = TEXT.split()
        return StepResult(
            output={"words": len(words), "idempotency_key": request.idempotency_key},
            state_patch={"longest_word": max(words, key=len)},
            cost_usd="0.0125",
        )


def main() -> None:
    path = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(tempfile.mkdtemp()) / "jobs.db"
    registry = FunctionRegistry()
    registry.register(
        "summarise",
        1,
        linear_workflow(
            [
                Resolution("run_interaction_task", JobStatus.QUEUED, transition_reason="agent"),
                Resolution(
                    "wait_time",
                    JobStatus.WAITING_TIME,
                    resume_delay_ms=300,
                    transition_reason="cool-down timer",
                ),
                Resolution("complete", JobStatus.COMPLETED, transition_reason="done"),
            ]
        ),
    )
    config = EngineConfig(store_url=f"sqlite:///{path}", worker_id="quickstart")
    with Engine.open(registry=registry, executor=WordCounter(), config=config) as engine:
        job = engine.submit("acme", "job-1", "summarise", input={"source": "TEXT"})
        print(f"submitted {job.tenant_id}/{job.job_id}: {job.status} (store {path})")
        engine.run_until_idle(wait_for_timers=True)
        for entry in engine.history("acme", "job-1"):
            detail = entry.data.get("next_status") or entry.data.get("reason") or ""
            print(
                f"  v{entry.version:<3} {entry.timestamp:%H:%M:%S.%f}  {entry.event_type:<14}"
                f" {detail}"
            )
        job = engine.job("acme", "job-1")
        print(
            f"{job.status} after {job.current_step} steps, cost ${job.total_cost_usd}, "
            f"state {job.state}, chain intact: {engine.verify('acme', 'job-1') is None}"
        )
        if job.status is not JobStatus.COMPLETED:
            raise SystemExit(1)


if __name__ == "__main__":
    main()
