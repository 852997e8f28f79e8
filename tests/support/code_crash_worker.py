"""Code workflows for tests/test_code_crash_safety.py, and a worker process that runs them:
``python -m tests.support.code_crash_worker --help``.

The workflows are built in Python and handed to ``Engine.open(workflows=[...])``, as a user's
worker would. Every side effect appends its idempotency key to the file
``JOBLEDGER_TEST_COUNTER`` names (read when the step runs, so the test's own engine and the
worker processes count into the same file, and the count survives SIGKILL). The worker can
be told to SIGKILL itself at an exact point:

- ``JOBLEDGER_TEST_KILL_IN_STEP=n``: inside the step ``effect(n, ...)``, after its side
  effect, before the engine can record it;
- ``--kill-after-record n``: right after the append that records step ``n`` has committed,
  before the tick replays the body for the step that follows.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
import time
from collections import Counter
from collections.abc import Sequence

from jobledger import (
    Engine,
    EngineConfig,
    StepContext,
    StoreUnavailableError,
    Tick,
    WorkflowContext,
    step,
    workflow,
)
from jobledger.adapters.kafka import KafkaSettings
from jobledger.adapters.kafka.worker import KafkaWorker
from jobledger.domain.job import Job
from jobledger.domain.keys import ConsumedKey
from jobledger.orchestration.ports import Append, JobStore, Refusal
from tests.support.crash_worker import append_line
from tests.support.engines import StoreAround, StoreWrapper, open_engine

TENANT = "code-crash"
COUNTER_ENV = "JOBLEDGER_TEST_COUNTER"
KILL_IN_STEP_ENV = "JOBLEDGER_TEST_KILL_IN_STEP"
STEPS = 3
"""``chain`` runs this many ``effect`` steps."""
ITEMS = (1, 2, 3, 4)
"""``fan_out`` maps ``one`` over these items."""


def die() -> None:
    """SIGKILL this process: no handler, no finally, no flush runs."""
    os.kill(os.getpid(), signal.SIGKILL)


@step
def effect(ctx: StepContext, n: int, total: int = 0) -> int:
    """The side effect: count the key, then (if told to) die before the record."""
    append_line(os.environ[COUNTER_ENV], ctx.idempotency_key)  # type: ignore[arg-type]
    if os.environ.get(KILL_IN_STEP_ENV) == str(n):
        die()
    return total + 10 * n


@workflow("chain", version=1)
async def chain(wf: WorkflowContext, steps: int = STEPS) -> int:
    """``steps`` effects, each fed the one before's result: 10 + 20 + 30 = 60 for three."""
    total = 0
    for n in range(1, steps + 1):
        total = await wf.step(effect, n, total)
    return total


@workflow("one", version=1)
async def one(wf: WorkflowContext, n: int) -> int:
    return int(await wf.step(effect, n))


@workflow("fan_out", version=1)
async def fan_out(wf: WorkflowContext) -> int:
    """One child per item, all joined: 10 * (1 + 2 + 3 + 4) = 100."""
    children = await wf.map(one, list(ITEMS))
    if not all(child.completed for child in children):
        wf.fail(f"a child did not complete: {children}")
    return sum(int(child.result) for child in children)


WORKFLOWS = [chain, one, fan_out]


def records_step(step_number: int, events: Sequence[object]) -> bool:
    return any(isinstance(e, Job.StepRecorded) and e.step_number == step_number for e in events)


class DieAfterRecord(StoreAround):
    """A JobStore whose process dies right after the append recording ``step`` committed."""

    def __init__(self, inner: JobStore, step_number: int) -> None:
        super().__init__(inner)
        self.step_number = step_number

    def append(self, job: Job, *keys: ConsumedKey) -> None:
        fatal = records_step(self.step_number, job.pending_events)
        self.inner.append(job, *keys)
        if fatal:
            die()

    def append_many(self, appends: Sequence[Append]) -> list[Refusal | None]:
        fatal = records_step(self.step_number, [e for a in appends for e in a.job.pending_events])
        refused = self.inner.append_many(appends)
        if fatal:
            die()
        return refused


def run_local(engine: Engine, jobs: list[str], deadline: float) -> Counter[str]:
    """Tick the given jobs (and, through the engine's local queue, the children they
    spawn) until all of them are terminal."""
    outcomes: Counter[str] = Counter()
    pending = list(jobs)
    while pending:
        if time.monotonic() > deadline:
            raise SystemExit(f"deadline passed with jobs still unfinished: {pending}")
        for job_id in pending:
            engine.queue.enqueue(Tick(TENANT, job_id, "reconcile"), dedupe_key="worker")
        try:
            outcomes["ticks"] += engine.run_until_idle(wait_for_timers=True)
        except StoreUnavailableError:
            outcomes["store_unavailable"] += 1
        pending = [j for j in pending if not engine.job(TENANT, j).status.is_terminal]
        time.sleep(0.01)
    return outcomes


def open_worker(config: EngineConfig, kill_after_record: int | None) -> Engine:
    wrap_store: StoreWrapper | None = None
    if kill_after_record is not None:
        number = kill_after_record
        wrap_store = lambda store: DieAfterRecord(store, number)  # noqa: E731
    return open_engine(workflows=WORKFLOWS, config=config, wrap_store=wrap_store)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--store", help="store URL (default: JOBLEDGER_STORE_URL)")
    parser.add_argument("--jobs", default="", help="comma-separated job ids (local mode)")
    parser.add_argument("--kafka", action="store_true", help="run a Kafka worker instead")
    parser.add_argument("--kill-after-record", type=int, help="die once this step is recorded")
    parser.add_argument("--timeout", type=float, default=45.0)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    logging.getLogger("kafka").setLevel(logging.ERROR)
    store = {} if args.store is None else {"store_url": args.store}
    config = EngineConfig(**store)  # everything else from JOBLEDGER_* variables
    with open_worker(config, args.kill_after_record) as engine:
        if args.kafka:
            worker = KafkaWorker(engine, KafkaSettings.of(config))
            signal.signal(signal.SIGTERM, lambda *_: worker.stop())
            worker.run()
            return 0
        deadline = time.monotonic() + args.timeout
        outcomes = run_local(engine, args.jobs.split(","), deadline)
    json.dump(dict(outcomes), sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
