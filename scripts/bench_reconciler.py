"""How long the reconciler's questions take as the status view grows.

    python scripts/bench_reconciler.py [--store sqlite|postgres|both] [--jobs 100000 1000000]
                                       [--due 100] [--postgres-url URL] [--json]

For each size it fills the job status view with that many rows (bulk SQL, not events:
the question is the query, not the fold), of which ``--due`` are due now (timers,
lapsed leases, lost queued ticks) and the rest are due in the future, finished, or
parked. Then it times a full reconciler pass (every status it asks about) and reports the
median of several passes. With the ``(status, due_at)`` index the time should follow the
number of due jobs, not the number of jobs.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import tempfile
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg

from jobledger.adapters.event_store import EventSourcedJobStore
from jobledger.adapters.locks import lock_for
from jobledger.adapters.ops import MemoryOps
from jobledger.adapters.store_url import parse_store_url
from jobledger.orchestration.ports import Tick
from jobledger.orchestration.reconciler import Reconciler
from jobledger.projections import JobViews
from jobledger.projections.status import COLUMNS

NOW = datetime(2026, 6, 1, 12, 0, tzinfo=UTC)
CHUNK = 20_000
PASSES = 7


class CountingQueue:
    def __init__(self) -> None:
        self.ticks = 0

    def enqueue(self, tick: Tick, *, delay_ms: int = 0, dedupe_key: str | None = None) -> None:
        self.ticks += 1


class FixedClock:
    def now(self) -> datetime:
        return NOW

    def sleep(self, seconds: float) -> None:
        pass


def row(n: int, due: bool, rng: random.Random) -> dict[str, Any]:
    """A status row: due ones spread over the due statuses, the rest never due now."""
    if due:
        status = ("waiting_time", "running", "queued", "waiting_event")[n % 4]
        moment = NOW - timedelta(minutes=5 + rng.randrange(60))
    else:
        status = rng.choice(("completed", "completed", "waiting_time", "running", "failed"))
        moment = NOW + timedelta(hours=1 + rng.randrange(1_000))
    values: dict[str, Any] = {
        "job_uuid": str(uuid.UUID(int=rng.getrandbits(128))),
        "tenant_id": f"tenant-{n % 50}",
        "job_id": f"job-{n}",
        "workflow_type": "bench",
        "workflow_version": 1,
        "status": status,
        "current_step": 3,
        "next_step": None,
        "resume_at": moment if status.startswith("waiting") else None,
        "lease_until": moment if status == "running" else None,
        "worker_id": None,
        "wait_event": None,
        "pending_approval": None,
        "cost_micros": 0,
        "steps_executed": 3,
        "last_error": None,
        "created_at": NOW - timedelta(days=1),
        "updated_at": moment if status == "queued" else NOW - timedelta(days=1),
        "version": 7,
    }
    terminal = status in ("completed", "failed")
    values["due_at"] = None if terminal else moment
    return values


def fill(views: JobViews, jobs: int, due: int) -> None:
    d = views.backend
    rng = random.Random(jobs)
    due_rows = set(rng.sample(range(jobs), due))
    names = [*COLUMNS, "due_at"]
    statement = d.sql(
        f"INSERT INTO {d.table('jobledger_job_status')} ({', '.join(names)}) "
        f"VALUES ({', '.join(':' + n for n in names)})"
    )
    for start in range(0, jobs, CHUNK):
        batch = []
        for n in range(start, min(jobs, start + CHUNK)):
            values = row(n, n in due_rows, rng)
            for name in ("resume_at", "lease_until", "created_at", "updated_at", "due_at"):
                values[name] = d.ts(values[name])
            batch.append(values)
        with d.transaction() as curs:
            curs.executemany(statement, batch)
        print(f"  filled {min(jobs, start + CHUNK):>9,} / {jobs:,}", file=sys.stderr, end="\r")
    print(file=sys.stderr)
    with d.transaction() as curs:
        curs.execute(d.sql("ANALYZE"))


def time_passes(views: JobViews, url: str) -> tuple[float, int]:
    """Median of several passes; the lock is taken before timing (its connection set-up
    is a one-off per reconciler, not part of a pass)."""
    reconciler = Reconciler(
        views=views,
        queue=CountingQueue(),
        clock=FixedClock(),
        lock=lock_for(parse_store_url(url), "bench"),
        ops=MemoryOps(),
        lost_tick_after=timedelta(seconds=30),
    )
    assert reconciler.lock.try_acquire()
    timings, found = [], 0
    try:
        for _ in range(PASSES):
            reconciler.sent.clear()  # every pass finds and enqueues the due jobs afresh
            started = time.perf_counter()
            result = reconciler.reconcile()
            timings.append(time.perf_counter() - started)
            found = result.scanned
    finally:
        reconciler.stop()
    return statistics.median(timings), found


def measure(url: str, jobs: int, due: int) -> dict[str, Any]:
    store = EventSourcedJobStore(parse_store_url(url))
    try:
        views = JobViews(store)
        fill(views, jobs, due)
        seconds, found = time_passes(views, url)
    finally:
        store.close()
    return {"jobs": jobs, "due": due, "found": found, "pass_ms": round(seconds * 1000, 2)}


def sqlite_url(directory: str, jobs: int) -> str:
    return f"sqlite:///{Path(directory) / f'bench-{jobs}.db'}"


def postgres_schema(base: str, jobs: int) -> str:
    schema = f"bench_reconciler_{jobs}"
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
    parser.add_argument("--jobs", type=int, nargs="+", default=[100_000, 1_000_000])
    parser.add_argument("--due", type=int, default=100)
    parser.add_argument("--postgres-url", default=os.environ.get("JOBLEDGER_TEST_POSTGRES_URL"))
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    results: list[dict[str, Any]] = []
    if args.store in ("sqlite", "both"):
        with tempfile.TemporaryDirectory() as directory:
            for jobs in args.jobs:
                print(f"sqlite, {jobs:,} jobs", file=sys.stderr)
                results.append(
                    {"store": "sqlite", **measure(sqlite_url(directory, jobs), jobs, args.due)}
                )
    if args.store in ("postgres", "both"):
        if not args.postgres_url:
            print(
                "postgres skipped: no --postgres-url or JOBLEDGER_TEST_POSTGRES_URL",
                file=sys.stderr,
            )
        for jobs in args.jobs if args.postgres_url else []:
            print(f"postgres, {jobs:,} jobs", file=sys.stderr)
            schema = postgres_schema(args.postgres_url, jobs)
            try:
                url = f"{args.postgres_url}?schema={schema}"
                results.append({"store": "postgres", **measure(url, jobs, args.due)})
            finally:
                drop_schema(args.postgres_url, schema)
    if args.json:
        print(json.dumps(results, indent=2))
        return
    print(f"{'store':<10} {'jobs':>10} {'due':>6} {'found':>6} {'pass (ms)':>10}")
    for r in results:
        print(f"{r['store']:<10} {r['jobs']:>10,} {r['due']:>6} {r['found']:>6} {r['pass_ms']:>10}")


if __name__ == "__main__":
    main()
