"""Resume latency: from ``resume(token)`` or ``signal()`` to the job's next step recorded.

In-process, on SQLite and PostgreSQL (the same stores and raw baselines as
``bench_steps.py``): ``--jobs`` jobs each open a wait for an event (their first step),
then, one job at a time, the clock starts, the job is resumed (by its token, or by a
signal naming the event), ``Engine.run_until_idle`` runs its next step, and the clock stops
when that step's record is committed. Reported: p50 and p99 per way of resuming, the
commits and rows from the resume to that step's record (counted at the events tables'
recorders, as ``bench_steps.py`` counts them), and the issue 11 targets (p50 <= 1.0 ms on
SQLite, <= 2.0 ms on PostgreSQL).

Usage::

    python scripts/bench_resume.py                    # both stores, 200 resumes of each kind
    python scripts/bench_resume.py --store sqlite --jobs 1000 --json
    python scripts/bench_resume.py --quick            # a smoke run: seconds

PostgreSQL is skipped when neither ``--postgres-url`` nor ``JOBLEDGER_TEST_POSTGRES_URL``
is set. Progress goes to stderr; the report (text or ``--json``) to stdout. The exit status
is 1 if a job did not finish as expected.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from uuid import UUID

from bench_steps import (
    TENANT,
    WORKFLOW,
    CountingRecorders,
    Progress,
    TimingExecutor,
    fresh_schema,
    percentile,
    positive,
    with_query,
)
from jobledger import (
    Engine,
    EngineConfig,
    FunctionRegistry,
    JobStatus,
    JobView,
    Resolution,
    linear_workflow,
)
from jobledger.domain.identity import job_uuid
from jobledger.domain.steps import IssuedToken
from jobledger.orchestration.ports import ApprovalRequest

EVENT = "go"
TARGET_MS = {"sqlite": 1.0, "postgres": 2.0}
SECRET = "bench-resume-secret-bench-resume-secret"


class TokenInbox:
    """The notifier: keeps each waiting job's resume token."""

    def __init__(self) -> None:
        self.tokens: dict[str, str] = {}

    def waiting_for_event(self, job: JobView, event_name: str, token: IssuedToken) -> None:
        self.tokens[job.job_id] = token.token

    def approval_requested(self, job: JobView, request: ApprovalRequest) -> None:
        raise AssertionError("the bench workflow asks for no approval")


def resume_registry() -> FunctionRegistry:
    """Wait for ``go``, then one side-effecting step that completes the job."""
    registry = FunctionRegistry()
    registry.register(
        WORKFLOW,
        1,
        linear_workflow(
            [
                Resolution("wait_event", JobStatus.WAITING_EVENT, wait_event_name=EVENT),
                Resolution("run_interaction_task", JobStatus.COMPLETED),
            ]
        ),
    )
    return registry


@dataclass
class Latencies:
    kind: str
    """``token`` (Engine.resume) or ``signal`` (Engine.signal)."""
    samples: int
    p50_ms: float
    p99_ms: float
    max_ms: float
    commits_per_resume: float
    """Commits of the events tables from the resume to the next step's record, inclusive."""
    rows_per_resume: float
    incomplete_jobs: int


@dataclass
class StoreResult:
    store: str
    kinds: list[Latencies]
    target_p50_ms: float
    load_average: tuple[float, float, float]


def measure(url: str, label: str, args: argparse.Namespace) -> StoreResult:
    load = os.getloadavg()
    inbox = TokenInbox()
    executor = TimingExecutor()
    config = EngineConfig(store_url=url, worker_id="bench", token_secret=SECRET)
    engine = Engine.open(
        url, registry=resume_registry(), executor=executor, config=config, notifier=inbox
    )
    try:
        counter = CountingRecorders(engine.deps.store, executor)
        committed: dict[UUID, float] = {}
        counter.step_committed = committed.__setitem__
        kinds = []
        for kind in ("token", "signal"):
            # Warm-up first (imports, caches, prepared statements), untimed.
            run_kind(engine, inbox, counter, committed, f"warm-{kind}", kind, args.warmup_jobs)
            kinds.append(run_kind(engine, inbox, counter, committed, label, kind, args.jobs))
    finally:
        engine.close()
    return StoreResult(label, kinds, TARGET_MS[label], load)


def run_kind(
    engine: Engine,
    inbox: TokenInbox,
    counter: CountingRecorders,
    committed: dict[UUID, float],
    label: str,
    kind: str,
    jobs: int,
) -> Latencies:
    job_ids = [f"{label}-{kind}-{n:05d}" for n in range(jobs)]
    for job_id in job_ids:
        engine.submit(TENANT, job_id, WORKFLOW)
        counter.track(TENANT, job_id)
    engine.run_until_idle()  # every job now waits for the event
    resume = resumer(engine, inbox, kind)
    samples: list[float] = []
    commits = rows = 0
    with Progress(f"{label}: {kind} resumes", jobs) as progress:
        for job_id in job_ids:
            uuid = job_uuid(TENANT, job_id)
            committed.clear()
            counter.reset()
            started = time.perf_counter()
            resume(job_id)
            engine.run_until_idle()
            done = committed.get(uuid)
            counts = counter.reset()  # the job completes with that step: nothing after it
            commits, rows = commits + counts.appends, rows + counts.rows
            if done is not None:
                samples.append(done - started)
            progress.advance(1)
    incomplete = sum(
        1 for job_id in job_ids if engine.job(TENANT, job_id).status is not JobStatus.COMPLETED
    )
    samples = samples or [0.0]
    return Latencies(
        kind=kind,
        samples=len(samples),
        p50_ms=1e3 * percentile(samples, 0.50),
        p99_ms=1e3 * percentile(samples, 0.99),
        max_ms=1e3 * max(samples),
        commits_per_resume=commits / jobs,
        rows_per_resume=rows / jobs,
        incomplete_jobs=incomplete,
    )


def resumer(engine: Engine, inbox: TokenInbox, kind: str) -> Callable[[str], object]:
    if kind == "token":
        return lambda job_id: engine.resume(inbox.tokens[job_id])
    return lambda job_id: engine.signal(TENANT, job_id, EVENT, signal_id=f"s-{job_id}")


def bench_sqlite(args: argparse.Namespace) -> StoreResult:
    directory = Path(tempfile.mkdtemp(prefix="jobledger-bench-", dir=args.dir))
    try:
        return measure(f"sqlite:///{directory / 'jobs.db'}", "sqlite", args)
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def bench_postgres(args: argparse.Namespace, base_url: str) -> StoreResult:
    with fresh_schema(base_url) as schema:
        return measure(with_query(base_url, schema=schema), "postgres", args)


def print_text(results: list[StoreResult]) -> None:
    print(
        f"{'store':<10}{'resume by':<11}{'samples':>8}{'p50 ms':>9}{'p99 ms':>9}"
        f"{'max ms':>9}{'commits':>9}{'rows':>7}  target"
    )
    for r in results:
        for k in r.kinds:
            met = "met" if k.p50_ms <= r.target_p50_ms else "NOT met"
            print(
                f"{r.store:<10}{k.kind:<11}{k.samples:>8}{k.p50_ms:>9.3f}{k.p99_ms:>9.3f}"
                f"{k.max_ms:>9.3f}{k.commits_per_resume:>9.2f}{k.rows_per_resume:>7.2f}"
                f"  p50 <= {r.target_p50_ms} ms: {met}"
            )
            if k.incomplete_jobs:
                print(f"  !! {k.incomplete_jobs} jobs did not complete")


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description="resume(token) and signal() -> next step recorded: p50/p99, in-process."
    )
    parser.add_argument("--store", choices=("sqlite", "postgres", "both"), default="both")
    parser.add_argument(
        "--jobs", type=positive, default=200, help="resumes of each kind (default 200)"
    )
    parser.add_argument(
        "--warmup-jobs", type=positive, default=10, help="untimed warm-up resumes (default 10)"
    )
    parser.add_argument(
        "--postgres-url",
        default=os.environ.get("JOBLEDGER_TEST_POSTGRES_URL"),
        help="default: $JOBLEDGER_TEST_POSTGRES_URL",
    )
    parser.add_argument("--dir", help="where the SQLite temp files go (default: system temp)")
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    parser.add_argument("--quick", action="store_true", help="a smoke run: 20 resumes of each")
    args = parser.parse_args(argv)
    if args.quick:
        args.jobs, args.warmup_jobs = 20, 3
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    results: list[StoreResult] = []
    skipped: dict[str, str] = {}
    if args.store in ("sqlite", "both"):
        results.append(bench_sqlite(args))
    if args.store in ("postgres", "both"):
        if args.postgres_url:
            results.append(bench_postgres(args, args.postgres_url))
        else:
            skipped["postgres"] = "no --postgres-url and JOBLEDGER_TEST_POSTGRES_URL is unset"
            print(f"postgres: skipped ({skipped['postgres']})", file=sys.stderr)
    if args.json:
        print(json.dumps({"results": [asdict(r) for r in results], "skipped": skipped}, indent=2))
    else:
        print_text(results)
    return 1 if any(k.incomplete_jobs for r in results for k in r.kinds) else 0


if __name__ == "__main__":
    sys.exit(main())
