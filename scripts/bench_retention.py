"""Archive and restore rate: finished jobs archived to a directory, then restored.

    python scripts/bench_retention.py [--store sqlite|postgres|both] [--jobs 500]
                                      [--postgres-url URL] [--dir DIR] [--quick] [--json]

On each store: ``--jobs`` jobs of three agent steps each (six events: submitted, the
steps, completed) are run to the end on a fake clock; a later job keeps the newest event
of the log (on SQLite the job holding it waits for a later run). Then one archive run
takes them all to a directory (each job's export written, fsynced, renamed and read back,
then its rows removed with its tombstone in one transaction), and every job is restored
from its archive. Reported: jobs and events, the archive's bytes, seconds and jobs/s for
each half.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
import uuid
from datetime import timedelta
from pathlib import Path
from typing import Any

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
from jobledger.adapters.clock import FakeClock
from jobledger.adapters.event_store import EventSourcedJobStore
from jobledger.audit.archive import DirectoryArchive, read_directory_ref
from jobledger.domain.retention import RetentionPolicy
from jobledger.projections.job_views import JobViews
from jobledger.projections.retention import Archiver, Scope

STEP = Resolution("run_interaction_task", JobStatus.QUEUED)
DONE = Resolution("complete", JobStatus.COMPLETED)
POSTGRES_URL = "postgresql://jobledger:jobledger@127.0.0.1:5432/jobledger_test"


class NoOp:
    def execute(self, request: StepRequest) -> StepResult:
        return StepResult(output={"step": request.step_number})


def measure(store_url: str, jobs: int, directory: Path) -> dict[str, Any]:
    registry = FunctionRegistry()
    registry.register("bench", 1, linear_workflow([STEP, STEP, STEP, DONE]))
    clock = FakeClock()
    config = EngineConfig(store_url=store_url, worker_id="bench")
    with Engine.open(config=config, registry=registry, executor=NoOp(), clock=clock) as engine:
        for n in range(jobs):
            engine.submit("bench", f"j{n}", "bench")
        engine.run_until_idle()
        engine.submit("bench", "later", "bench")
        store = engine.deps.store
        assert isinstance(store, EventSourcedJobStore)
        archiver = Archiver(store, JobViews(store))
        now = clock.now() + timedelta(days=2)
        rows = archiver.due(Scope(RetentionPolicy(default_days=1)), now)
        started = time.perf_counter()
        run = archiver.run(DirectoryArchive(directory / "archive"), rows, now)
        archived = time.perf_counter()
        for tombstone in run.archived:
            archiver.restore(tombstone.tenant_id, tombstone.job_id, read_directory_ref, None)
        restored = time.perf_counter()
    done = len(run.archived)
    return {
        "jobs": done,
        "events": sum(t.version for t in run.archived),
        "skipped": len(run.skipped),
        "archive_bytes": run.bytes,
        "archive_seconds": round(archived - started, 3),
        "archive_jobs_per_second": round(done / (archived - started), 1),
        "restore_seconds": round(restored - archived, 3),
        "restore_jobs_per_second": round(done / (restored - archived), 1),
    }


def store_url(kind: str, directory: Path, postgres_url: str) -> str:
    if kind == "sqlite":
        return f"sqlite:///{directory / 'bench.db'}"
    separator = "&" if "?" in postgres_url else "?"
    return f"{postgres_url}{separator}schema=bench_retention_{uuid.uuid4().hex[:8]}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--store", choices=["sqlite", "postgres", "both"], default="sqlite")
    parser.add_argument("--jobs", type=int, default=500)
    parser.add_argument(
        "--postgres-url", default=os.environ.get("JOBLEDGER_TEST_POSTGRES_URL", POSTGRES_URL)
    )
    parser.add_argument("--dir", type=Path, default=None, help="where the files go")
    parser.add_argument("--quick", action="store_true", help="20 jobs: a smoke run")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    jobs = 20 if args.quick else args.jobs
    kinds = ["sqlite", "postgres"] if args.store == "both" else [args.store]
    report: dict[str, Any] = {"quick": args.quick}
    for kind in kinds:
        with tempfile.TemporaryDirectory(dir=args.dir) as scratch:
            url = store_url(kind, Path(scratch), args.postgres_url)
            report[kind] = measure(url, jobs, Path(scratch))
    if args.json:
        json.dump(report, sys.stdout)
        print()
        return
    for kind in kinds:
        r = report[kind]
        print(
            f"{kind}: {r['jobs']} jobs ({r['events']} events, {r['archive_bytes']} bytes "
            f"archived): archive {r['archive_seconds']} s ({r['archive_jobs_per_second']} "
            f"jobs/s), restore {r['restore_seconds']} s ({r['restore_jobs_per_second']} jobs/s)"
        )


if __name__ == "__main__":
    main()
