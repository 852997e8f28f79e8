"""Fair admission, measured (never asserted: tests/test_fairness.py asserts the order).

On the in-process queue with real worker lanes (``run_until_idle``), per store:

- **fairness**: tenant A submits ``--backlog`` jobs of a one-step no-op workflow, then
  tenant B submits 3; the workers start. Reported: how fast the backlog was submitted,
  B's time to first step (from the start of the run) and how many of A's jobs started
  before each of B's, with the admission gate (``--window``) and without it (window 0:
  every tick queued at submit, and the in-process queue hands due ticks out a tenant at
  a time; on Kafka, whose partitions are first in first out, only the window helps).
- **one tenant**: ``--jobs`` jobs of one tenant, no limits, with a window
  (``--one-tenant-window``) and without (the default): submit rate, jobs run per
  second, and one job's latency from submit to completed (p50 of ``--latency-jobs``
  jobs run one at a time): what the window costs a tenant alone.

PostgreSQL is skipped when neither ``--postgres-url`` nor ``JOBLEDGER_TEST_POSTGRES_URL``
is set. ``--quick`` is a smoke run of seconds.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.support.fairness import RunRecorder, registry

from bench_steps import fresh_schema, percentile, positive, with_query
from jobledger import Engine, EngineConfig

STEPS = {"noop": 1, "agent3": 3}


@contextmanager
def store_urls(store: str, directory: Path, postgres_url: str | None) -> Iterator[str]:
    """A fresh store of that kind per call."""
    if store == "sqlite":
        path = Path(tempfile.mkdtemp(dir=directory)) / "fair.db"
        yield f"sqlite:///{path}"
        return
    assert postgres_url is not None
    with fresh_schema(postgres_url) as schema:
        yield with_query(postgres_url, schema=schema)


def open_engine(url: str, recorder: RunRecorder, **config: Any) -> Engine:
    settings = EngineConfig(store_url=url, worker_id="bench", **config)
    return Engine.open(registry=registry(), executor=recorder, config=settings)


def fairness(url: str, backlog: int, window: int, concurrency: int) -> dict[str, Any]:
    recorder = RunRecorder(STEPS)
    engine = open_engine(url, recorder, admission_window=window, concurrency=concurrency)
    try:
        began = time.perf_counter()
        for n in range(backlog):
            engine.submit("big", f"a{n}", "noop")
        submit_s = time.perf_counter() - began
        small = [f"b{n}" for n in range(3)]
        for job in small:
            engine.submit("small", job, "noop")
        started = time.monotonic()
        run_began = time.perf_counter()
        engine.run_until_idle()
        run_s = time.perf_counter() - run_began
    finally:
        engine.close()
    order = recorder.first_steps
    return {
        "window": window,
        "backlog": backlog,
        "submitted_per_second": round(backlog / submit_s, 1),
        "small_first_step_ms": [
            round((recorder.first_step_at[("small", job)] - started) * 1000, 1) for job in small
        ],
        "big_started_before_small": [order.index(("small", job)) for job in small],
        "jobs_per_second": round((backlog + 3) / run_s, 1),
    }


def one_tenant(url: str, jobs: int, latency_jobs: int, window: int) -> dict[str, Any]:
    recorder = RunRecorder(STEPS)
    engine = open_engine(url, recorder, admission_window=window)
    try:
        latencies = []
        for n in range(latency_jobs):
            began = time.perf_counter()
            engine.submit("solo", f"l{n}", "noop")
            engine.run_until_idle()
            latencies.append((time.perf_counter() - began) * 1000)
        began = time.perf_counter()
        for n in range(jobs):
            engine.submit("solo", f"j{n}", "noop")
        submit_s = time.perf_counter() - began
        began = time.perf_counter()
        engine.run_until_idle()
        run_s = time.perf_counter() - began
    finally:
        engine.close()
    return {
        "window": window,
        "jobs": jobs,
        "submitted_per_second": round(jobs / submit_s, 1),
        "jobs_per_second": round(jobs / run_s, 1),
        "p50_submit_to_completed_ms": round(percentile(latencies, 0.5), 2),
        "p99_submit_to_completed_ms": round(percentile(latencies, 0.99), 2),
    }


def bench(store: str, args: argparse.Namespace, directory: Path) -> dict[str, Any]:
    result: dict[str, Any] = {"store": store, "fairness": [], "one_tenant": []}
    for window in (args.window, 0):
        with store_urls(store, directory, args.postgres_url) as url:
            result["fairness"].append(fairness(url, args.backlog, window, args.concurrency))
    for window in (args.one_tenant_window, 0):
        with store_urls(store, directory, args.postgres_url) as url:
            result["one_tenant"].append(one_tenant(url, args.jobs, args.latency_jobs, window))
    return result


def print_text(results: list[dict[str, Any]]) -> None:
    for result in results:
        print(f"== {result['store']}")
        for run in result["fairness"]:
            gate = f"window {run['window']}" if run["window"] else "no gate"
            print(
                f"fairness ({gate}): {run['backlog']} jobs of A submitted at "
                f"{run['submitted_per_second']}/s; B's 3 jobs first stepped at "
                f"{run['small_first_step_ms']} ms, after {run['big_started_before_small']} "
                f"of A's; {run['jobs_per_second']} jobs/s"
            )
        for run in result["one_tenant"]:
            gate = f"window {run['window']}" if run["window"] else "no gate"
            print(
                f"one tenant ({gate}): submit {run['submitted_per_second']}/s, run "
                f"{run['jobs_per_second']} jobs/s, submit -> completed p50 "
                f"{run['p50_submit_to_completed_ms']} ms, "
                f"p99 {run['p99_submit_to_completed_ms']} ms"
            )


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--store", choices=("sqlite", "postgres", "both"), default="both")
    parser.add_argument("--backlog", type=positive, default=10_000, help="tenant A's jobs")
    parser.add_argument("--window", type=positive, default=16, help="the fairness run's window")
    parser.add_argument("--concurrency", type=positive, default=16)
    parser.add_argument("--jobs", type=positive, default=2_000, help="the one-tenant run's jobs")
    parser.add_argument("--latency-jobs", type=positive, default=200)
    parser.add_argument(
        "--one-tenant-window", type=positive, default=64, help="the one-tenant run's window"
    )
    parser.add_argument(
        "--postgres-url",
        default=os.environ.get("JOBLEDGER_TEST_POSTGRES_URL"),
        help="default: $JOBLEDGER_TEST_POSTGRES_URL",
    )
    parser.add_argument("--dir", type=Path, default=None, help="where SQLite files go")
    parser.add_argument("--quick", action="store_true", help="a smoke run of seconds")
    parser.add_argument("--json", action="store_true", help="one JSON document on stdout")
    args = parser.parse_args(argv)
    if args.quick:
        args.backlog, args.jobs, args.latency_jobs = 200, 100, 10
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    stores = ["sqlite", "postgres"] if args.store == "both" else [args.store]
    skipped = {}
    if "postgres" in stores and not args.postgres_url:
        stores.remove("postgres")
        skipped["postgres"] = "no --postgres-url and JOBLEDGER_TEST_POSTGRES_URL is unset"
    with tempfile.TemporaryDirectory(dir=args.dir) as directory:
        results = [bench(store, args, Path(directory)) for store in stores]
    if args.json:
        print(json.dumps({"quick": args.quick, "results": results, "skipped": skipped}))
    else:
        print_text(results)
        for store, why in skipped.items():
            print(f"{store}: skipped ({why})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
