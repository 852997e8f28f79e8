"""Replay and audit numbers: replay and verify speed, and loading a 100k-event job.

    python scripts/bench_replay.py [--store sqlite|postgres|both] [--events 100000]
                                   [--jobs 10000] [--postgres-url URL] [--json]

Histories are built quickly by driving the Job aggregate directly on a fake clock (claims,
agent steps and branch steps of a looping definition, as the orchestrator records them:
a continuation claim rides after each step) and appending them in batches; no executor
and no per-step commit. Then, on each store:

- load time of one job with ``--events`` events, cold (a fresh store, empty cache), with
  no snapshot and with the snapshots the engine takes every 100 events (the newest one a
  full interval behind the head: the worst case), next to a job with 100 events and no
  snapshot; and time travel (``job_at``) to the middle of the long history;
- replay speed (events/s) of that one long history, and of ``--jobs`` short ones
  (read from the log in batches, replayed against the definition: every step the same);
- verify speed (events/s): every chain in the store recomputed from the stored rows.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any, TypeVar

import psycopg

from jobledger.adapters.clock import FakeClock
from jobledger.adapters.event_store import EventSourcedJobStore
from jobledger.adapters.store_url import parse_store_url
from jobledger.audit import log, tamper, time_travel
from jobledger.audit.replay import replay_job
from jobledger.domain.identity import job_uuid
from jobledger.domain.job import Job
from jobledger.domain.status import JobStatus
from jobledger.domain.steps import ResolveRequest
from jobledger.workflows import WorkflowDefinition, parse_definition, resolve

BENCH = """
type: bench
version: 1
start: work
steps:
  work:
    kind: run_interaction_task
    max_visits: 10000000
    params: {task: work}
    next: check
  check:
    kind: branch
    cases: [{when: {path: n, op: ">=", value: LIMIT}, next: done}]
    default: work
  done: {kind: complete}
"""
BATCH = 2_000
STEPS_PER_TICK = 10
T = TypeVar("T")


def definition(limit: int) -> WorkflowDefinition:
    return parse_definition(BENCH.replace("LIMIT", str(limit)), "bench.yaml")


def build(tenant: str, job_id: str, events: int, clock: FakeClock, flow: WorkflowDefinition) -> Job:
    """A job of at least ``events`` events (or until the flow completes), recorded as
    the orchestrator would, with its pending events not yet collected."""
    job = Job.submit(
        tenant_id=tenant, job_id=job_id, workflow_type="bench", workflow_version=1,
        state={"n": 0}, budget={}, mission_id=None, employee_id=None, correlation_id=None,
        submit_key=None, timestamp=clock.now(),
    )  # fmt: skip
    steps_in_tick = 0
    while job.version < events and not job.status.is_terminal:
        now = clock.now()
        request = ResolveRequest(
            workflow_type="bench", workflow_version=1, budget=job.budget, state=job.state,
            current_step=job.current_step, status=job.status, reason="queue", now=now,
            cursor=job.cursor, visits=job.visits,
        )  # fmt: skip
        resolution = resolve(flow, request)
        if resolution.has_side_effect and job.status is not JobStatus.RUNNING:
            job.claim(
                worker_id="bench", claim_id=uuid.uuid4().hex,
                lease_until=now + timedelta(minutes=5), reason="queue", now=now,
            )  # fmt: skip
            steps_in_tick = 0
        clock.advance(timedelta(milliseconds=3))
        step = job.current_step + 1
        patch = {"n": job.state["n"] + 1} if resolution.step_name == "work" else {}
        job.record_step(
            step_number=step, step_type=resolution.step_type, triggered_by="workflow",
            idempotency_key=job.step_key(step), started_at=now, ended_at=clock.now(),
            output={"ok": True} if patch else {}, state_patch=patch, cost_usd=Decimal(0),
            transition_reason=resolution.transition_reason,
            next_status=resolution.next_status, resume_at=None, wait_event=None,
            worker_id="bench" if resolution.has_side_effect else None,
            step_name=resolution.step_name, next_step=resolution.next_step,
        )  # fmt: skip
        steps_in_tick += 1
        if job.status is JobStatus.QUEUED and steps_in_tick < STEPS_PER_TICK:
            job.claim(
                worker_id="bench", claim_id=job.claim_id or uuid.uuid4().hex,
                lease_until=clock.now() + timedelta(minutes=5), reason="continuation",
                now=clock.now(),
            )  # fmt: skip
    return job


def append(store: EventSourcedJobStore, job: Job) -> None:
    """Append the job's pending events in batches (no snapshots)."""
    partition = store.partition(job.id)
    store.sealing.seal_pending(job)
    pending = list(job.collect_events())
    for start in range(0, len(pending), BATCH):
        partition.events.put(pending[start : start + BATCH])


def timed(action: Callable[[], T]) -> tuple[float, T]:
    started = time.perf_counter()
    result = action()
    return time.perf_counter() - started, result


def cold_load(url: str, job: uuid.UUID, repeat: int = 3) -> float:
    """Median seconds to load a job on a fresh store (no aggregate cache)."""
    timings = []
    for _ in range(repeat):
        store = EventSourcedJobStore(parse_store_url(url), cache_size=0)
        try:
            seconds, loaded = timed(lambda: store.load(job))  # noqa: B023 - run at once
            assert loaded is not None
            timings.append(seconds)
        finally:
            store.close()
    return sorted(timings)[len(timings) // 2]


def measure(url: str, events: int, jobs: int) -> dict[str, Any]:
    clock = FakeClock(datetime(2026, 1, 1, tzinfo=UTC))
    loop = definition(10**9)
    store = EventSourcedJobStore(parse_store_url(url), cache_size=0)
    result: dict[str, Any] = {}
    try:
        print(f"  building a {events:,}-event history", file=sys.stderr)
        seconds, long_job = timed(lambda: build("bench", "long", events, clock, loop))
        result["build_events_per_s"] = round(long_job.version / seconds)
        append(store, long_job)
        short = build("bench", "short", 100, clock, loop)
        append(store, short)

        long_uuid = job_uuid("bench", "long")
        result["history_events"] = long_job.version
        result["load_100_events_ms"] = round(cold_load(url, short.id) * 1000, 2)
        result["load_long_no_snapshot_ms"] = round(cold_load(url, long_uuid) * 1000, 1)
        # Now the snapshots the engine would have taken (every snapshot_interval events).
        append_snapshots(store, long_uuid, long_job.version)
        result["load_long_with_snapshots_ms"] = round(cold_load(url, long_uuid) * 1000, 2)
        middle = long_job.version // 2 + 7
        seconds, _ = timed(lambda: time_travel.job_at(store, long_uuid, version=middle))
        result["job_at_middle_ms"] = round(seconds * 1000, 2)

        read_s, long_events = timed(lambda: store.events(long_uuid))
        replay_s, report = timed(lambda: replay_job(long_events, loop))
        assert report.safe, report.verdict
        result["read_long_events_per_s"] = round(len(long_events) / read_s)
        result["replay_long_events_per_s"] = round(len(long_events) / replay_s)
        seconds, check = timed(lambda: tamper.verify_one(store, long_uuid))
        assert check.intact
        result["verify_long_events_per_s"] = round(check.events / seconds)

        print(f"  building {jobs:,} short histories", file=sys.stderr)
        few = definition(3)
        pending: list[Any] = []
        for n in range(jobs):
            short = build("bench", f"j{n}", 10**6, clock, few)
            store.sealing.seal_pending(short)
            pending.extend(short.collect_events())
            if len(pending) >= BATCH:
                store.partitions[0].events.put(pending)
                pending = []
        if pending:
            store.partitions[0].events.put(pending)
        uuids = [job_uuid("bench", f"j{n}") for n in range(jobs)]

        def replay_all() -> int:
            count = 0
            for _, records in log.read_jobs(store, uuids):
                replayed = replay_job(log.events_of(records), few)
                assert replayed.safe
                count += replayed.events
            return count

        seconds, replayed_events = timed(replay_all)
        result["jobs"] = jobs
        result["jobs_events"] = replayed_events
        result["replay_jobs_events_per_s"] = round(replayed_events / seconds)
        seconds, verified = timed(lambda: tamper.verify_store(store))
        assert verified.intact
        result["verify_store_events"] = verified.events
        result["verify_store_events_per_s"] = round(verified.events / seconds)
    finally:
        store.close()
    return result


def append_snapshots(store: EventSourcedJobStore, job: uuid.UUID, head: int) -> None:
    """Snapshots every snapshot_interval events, as the engine takes them after commits
    (folded once, front to back), but none at the head itself: a load then folds a
    snapshot and a full interval of events after it, the worst case."""
    partition = store.partition(job)
    assert partition.snapshots is not None
    interval = store.snapshot_interval
    folded: Job | None = None
    snapshots = []
    for event in store.events(job):
        folded = event.mutate(folded)
        assert folded is not None
        if folded.version % interval == 0 and folded.version < head:
            snapshots.append(Job.Snapshot.take(folded))
    for start in range(0, len(snapshots), BATCH):
        partition.snapshots.put(snapshots[start : start + BATCH])
    assert snapshots and head - snapshots[-1].originator_version <= interval


def postgres_schema(base: str) -> str:
    schema = "bench_replay"
    with psycopg.connect(base, autocommit=True) as conn:
        conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
        conn.execute(f"CREATE SCHEMA {schema}")
    return schema


def drop_schema(base: str, schema: str) -> None:
    with psycopg.connect(base, autocommit=True) as conn:
        conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--store", choices=("sqlite", "postgres", "both"), default="both")
    parser.add_argument("--events", type=int, default=100_000)
    parser.add_argument("--jobs", type=int, default=10_000)
    parser.add_argument("--postgres-url", default=os.environ.get("JOBLEDGER_TEST_POSTGRES_URL"))
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    results: list[dict[str, Any]] = []
    if args.store in ("sqlite", "both"):
        print("sqlite", file=sys.stderr)
        with tempfile.TemporaryDirectory() as directory:
            url = f"sqlite:///{Path(directory) / 'bench.db'}"
            results.append({"store": "sqlite", **measure(url, args.events, args.jobs)})
    if args.store in ("postgres", "both"):
        if not args.postgres_url:
            print(
                "postgres skipped: no --postgres-url or JOBLEDGER_TEST_POSTGRES_URL",
                file=sys.stderr,
            )
        else:
            print("postgres", file=sys.stderr)
            schema = postgres_schema(args.postgres_url)
            try:
                url = f"{args.postgres_url}?schema={schema}"
                results.append({"store": "postgres", **measure(url, args.events, args.jobs)})
            finally:
                drop_schema(args.postgres_url, schema)
    if args.json:
        print(json.dumps(results, indent=2))
        return
    for r in results:
        print(f"{r['store']}:")
        for key, value in r.items():
            if key != "store":
                print(
                    f"  {key:<32} {value:>12,}"
                    if isinstance(value, int)
                    else f"  {key:<32} {value:>12}"
                )


if __name__ == "__main__":
    main()
