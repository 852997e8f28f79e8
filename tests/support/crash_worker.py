"""A worker process for tests/test_crash_safety.py: ``python -m tests.support.crash_worker --help``.

It opens an engine on a store URL with the system clock and ticks the given jobs until all of
them are terminal, as a scanning reconciler would. Every side effect appends its idempotency
key to a counter file, so the count survives SIGKILL and adds up across processes. It can be
told to hang (and say so through a marker file) inside a step, or right after a step's record
landed, so the test can SIGKILL it at exactly that point.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from jobledger import (
    Engine,
    EngineConfig,
    FunctionRegistry,
    Outcome,
    StepRequest,
    StepResult,
    StoreUnavailableError,
    Tick,
)
from jobledger.adapters.backends.postgres import OneTripRecorder
from jobledger.domain.job import Job
from jobledger.domain.keys import ConsumedKey
from jobledger.orchestration.ports import Append, JobStore, Refusal
from tests.support.engines import StoreAround, StoreWrapper, agent_steps, open_engine
from tests.support.workflows import linear_registry

TENANT = "crash-tenant"


def registry() -> FunctionRegistry:
    """``agentN``: N side-effecting steps, then a pure ``complete`` step (step N + 1)."""
    return linear_registry({f"agent{n}": agent_steps(n) for n in (3, 5)})


def append_line(path: Path, line: str) -> None:
    # One O_APPEND write per line: atomic between processes, and in the page cache (so it
    # survives SIGKILL) as soon as write() returns.
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, f"{line}\n".encode())
    finally:
        os.close(fd)


def read_counts(path: Path) -> Counter[str]:
    if not path.exists():
        return Counter()
    return Counter(path.read_text().splitlines())


def hang(marker: Path) -> None:
    """Tell the test we reached the chosen point, then wait for SIGKILL."""
    marker.touch()
    while True:
        time.sleep(60)


class FileCountingExecutor:
    """Counts each side effect by appending its idempotency key to ``counter``."""

    def __init__(
        self,
        counter: Path,
        *,
        effect_ms: float = 0,
        hang_in_step: int | None = None,
        marker: Path | None = None,
    ) -> None:
        self.counter = counter
        self.effect_ms = effect_ms
        self.hang_in_step = hang_in_step
        self.marker = marker

    def execute(self, request: StepRequest) -> StepResult:
        append_line(self.counter, request.idempotency_key)
        time.sleep(self.effect_ms / 1000)
        if request.step_number == self.hang_in_step:
            assert self.marker is not None
            hang(self.marker)
        return StepResult(
            output={"step": request.step_number}, state_patch={f"s{request.step_number}": True}
        )


class HangAfterRecord(StoreAround):
    """A JobStore that hangs right after the append recording ``step`` has committed."""

    def __init__(self, inner: JobStore, step: int, marker: Path) -> None:
        super().__init__(inner)
        self.step = step
        self.marker = marker

    def append(self, job: Job, *keys: ConsumedKey) -> None:
        records_step = any(
            isinstance(event, Job.StepRecorded) and event.step_number == self.step
            for event in job.pending_events
        )
        self.inner.append(job, *keys)
        if records_step:
            hang(self.marker)


def group_recording(step: int, events: list[object]) -> list[str]:
    """The jobs (uuids) whose record of ``step`` is in these events, when a group's."""
    jobs = sorted(
        {
            str(e.originator_id)
            for e in events
            if isinstance(e, Job.StepRecorded) and e.step_number == step
        }
    )
    return jobs if len(jobs) >= 2 else []


def hang_with(marker: Path, jobs: list[str]) -> None:
    """Name the group's jobs in the marker (written whole before it appears), then hang."""
    partial = marker.with_suffix(".partial")
    partial.write_text(json.dumps(jobs))
    partial.rename(marker)
    while True:
        time.sleep(60)


class HangAfterGroupCommit(StoreAround):
    """A JobStore that hangs right after a group recording ``step`` for several jobs has
    committed, before any of its ticks hears so."""

    def __init__(self, inner: JobStore, step: int, marker: Path) -> None:
        super().__init__(inner)
        self.step = step
        self.marker = marker

    def append_many(self, appends: Sequence[Append]) -> list[Refusal | None]:
        jobs = group_recording(self.step, [e for a in appends for e in a.job.pending_events])
        refused = self.inner.append_many(appends)
        if jobs:
            hang_with(self.marker, jobs)
        return refused


def hang_inside_group_commit(engine: Engine, step: int, marker: Path) -> None:
    """Hang inside the commit of a group recording ``step`` for several jobs: on SQLite
    once its rows are written and before its COMMIT; on PostgreSQL, whose append is one
    autocommit statement, before that statement is sent."""
    store = engine.deps.store
    for partition in store.partitions:
        recorder = partition.events.recorder
        mapper = partition.mapper
        if isinstance(recorder, OneTripRecorder):
            # PostgreSQL's append is one autocommit statement: the last moment the group
            # is written but not committed, seen from the client, is before it is sent.
            hang_before_one_trip(recorder, mapper, step, marker)
            continue
        hook = "_insert_events"
        original = getattr(recorder, hook)

        def hooked(
            curs: Any, stored: Sequence[Any], _o: Any = original, _m: Any = mapper, **kw: Any
        ) -> Any:
            result = _o(curs, stored, **kw)
            jobs = group_recording(step, [_m.to_domain_event(s) for s in stored])
            if jobs:
                hang_with(marker, jobs)
            return result

        setattr(recorder, hook, hooked)


def hang_before_one_trip(recorder: OneTripRecorder, mapper: Any, step: int, marker: Path) -> None:
    original = recorder.insert_events

    def hooked(stored: Sequence[Any], **kw: Any) -> Any:
        jobs = group_recording(step, [mapper.to_domain_event(s) for s in stored])
        if jobs:
            hang_with(marker, jobs)
        return original(stored, **kw)

    recorder.insert_events = hooked  # type: ignore[method-assign]


def run_grouped(engine: Engine, jobs: list[str], deadline: float) -> Counter[str]:
    """What a worker's loop does: every unfinished job's tick on the local queue, all run
    by ``run_until_idle`` (many at once, their steps group-committed), until all are
    terminal."""
    outcomes: Counter[str] = Counter()
    pending = list(jobs)
    while pending:
        if time.monotonic() > deadline:
            raise SystemExit(f"deadline passed with jobs still unfinished: {pending}")
        for job_id in pending:
            engine.queue.enqueue(Tick(TENANT, job_id, "reconcile"), dedupe_key="worker")
        outcomes["ticks"] += engine.run_until_idle(wait_for_timers=True)
        pending = [j for j in pending if not engine.job(TENANT, j).status.is_terminal]
    return outcomes


def run(engine: Engine, jobs: list[str], deadline: float) -> Counter[str]:
    """Tick every unfinished job in turn until all are terminal; count the outcomes."""
    outcomes: Counter[str] = Counter()
    pending = list(jobs)
    while pending:
        if time.monotonic() > deadline:
            raise SystemExit(f"deadline passed with jobs still unfinished: {pending}")
        advanced = False
        for job_id in list(pending):
            try:
                report = engine.tick(TENANT, job_id, "reconcile")
            except StoreUnavailableError:
                # What Engine.handle does with an infrastructure error: try again later.
                outcomes["store_unavailable"] += 1
                continue
            outcomes[str(report.outcome)] += 1
            advanced |= report.outcome is Outcome.ADVANCED
            if report.status.is_terminal:
                pending.remove(job_id)
        if not advanced:
            time.sleep(0.002)
    return outcomes


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--store", required=True, help="store URL")
    parser.add_argument("--jobs", required=True, help="comma-separated job ids")
    parser.add_argument("--counter", required=True, type=Path, help="side-effect counter file")
    parser.add_argument("--worker-id", required=True)
    parser.add_argument("--lease-ms", type=int, help="the claim's lease (default: the engine's)")
    parser.add_argument("--max-steps-per-tick", type=int, default=10)
    parser.add_argument("--effect-ms", type=float, default=0, help="how long a side effect takes")
    parser.add_argument("--hang-in-step", type=int, help="hang inside this step's side effect")
    parser.add_argument("--hang-after-record", type=int, help="hang once this step is recorded")
    parser.add_argument(
        "--hang-in-group-commit",
        type=int,
        help="hang inside the commit of a group recording this step for several jobs",
    )
    parser.add_argument(
        "--hang-after-group-commit",
        type=int,
        help="hang once a group recording this step for several jobs has committed",
    )
    parser.add_argument(
        "--grouped", action="store_true", help="run all jobs at once (run_until_idle)"
    )
    parser.add_argument("--concurrency", type=int, default=1)
    parser.add_argument("--max-batch-wait-ms", type=float, default=2.0)
    parser.add_argument("--marker", type=Path, help="touched when the worker hangs")
    parser.add_argument("--ready", type=Path, help="touched once the engine is open")
    parser.add_argument("--go", type=Path, help="wait for this file before ticking")
    parser.add_argument("--timeout", type=float, default=45.0)
    args = parser.parse_args(argv)
    deadline = time.monotonic() + args.timeout

    lease = {} if args.lease_ms is None else {"lease_ms": args.lease_ms}
    config = EngineConfig(
        store_url=args.store,
        worker_id=args.worker_id,
        max_steps_per_tick=args.max_steps_per_tick,
        concurrency=args.concurrency,
        max_batch_wait_ms=args.max_batch_wait_ms,
        **lease,
    )
    executor = FileCountingExecutor(
        args.counter, effect_ms=args.effect_ms, hang_in_step=args.hang_in_step, marker=args.marker
    )
    wrap_store: StoreWrapper | None = None
    if args.hang_after_record is not None:
        step: int = args.hang_after_record
        marker: Path = args.marker
        wrap_store = lambda store: HangAfterRecord(store, step, marker)  # noqa: E731
    if args.hang_after_group_commit is not None:
        group_step: int = args.hang_after_group_commit
        wrap_store = lambda store: HangAfterGroupCommit(store, group_step, args.marker)  # noqa: E731
    with open_engine(
        registry=registry(), executor=executor, config=config, wrap_store=wrap_store
    ) as engine:
        if args.hang_in_group_commit is not None:
            hang_inside_group_commit(engine, args.hang_in_group_commit, args.marker)
        if args.ready is not None:
            args.ready.touch()
        while args.go is not None and not args.go.exists():
            if time.monotonic() > deadline:
                raise SystemExit("never told to go")
            time.sleep(0.005)
        loop = run_grouped if args.grouped else run
        outcomes = loop(engine, args.jobs.split(","), deadline)
    json.dump(dict(outcomes), sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
