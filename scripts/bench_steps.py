"""Step throughput of the embedded engine against the raw commit rate of its database.

Runs N jobs of M trivial side-effecting steps (``run_interaction_task`` with a no-op
executor; the last step completes the job) through ``Engine.open(...)`` and
``engine.run_until_idle()``, and compares the steps per second with the rate at which the
same database, measured in the same run, commits single-row INSERTs of the same size as
a stored event:

* SQLite: the engine on a temporary file (its durable settings: WAL, synchronous=FULL);
  the raw baseline is a plain ``sqlite3`` connection on another file in the same
  directory with the same pragmas, one ``BEGIN; INSERT; COMMIT`` per row.
* PostgreSQL: the engine in a fresh schema (``?schema=...``) that this script creates and
  drops; the raw baseline is autocommit single-row INSERTs with psycopg into a table of
  the events table's shape, in the same schema.

A few untimed warm-up jobs run first (they also give the size of a stored event, which
the raw rows copy); then half the raw commits, the timed ticking phase (all jobs are
submitted before it, only ``run_until_idle`` is timed), and the other half of the raw
commits, so a disk that changed speed mid-run shows up as before/after rates far apart.
The run is only as good as the machine is quiet: the report shows the load average.

Every write the engine makes goes through its event recorders, which the script wraps
(on the instances, at run time) to count durable commits (appends), the rows they carry
and the reads, so it can report commits per step. The design aims at ONE durable commit
per side-effecting step in the steady state (the step record and the continuation claim
ride in one append); each tick also opens with one claim-only append, so expect about
1 + 1/max_steps_per_tick commits per step. The throughput aim is
``steps/s >= 0.5 x raw commits/s`` on SQLite.

Usage::

    . .venv/bin/activate
    python scripts/bench_steps.py                       # both stores, 200 jobs x 10 steps
    python scripts/bench_steps.py --store sqlite --jobs 1000 --steps 20
    python scripts/bench_steps.py --postgres-url postgresql://u:p@127.0.0.1/db --json
    python scripts/bench_steps.py --store sqlite --profile 25   # cProfile the ticking

PostgreSQL is skipped, with a message, when neither ``--postgres-url`` nor
``JOBLEDGER_TEST_POSTGRES_URL`` is set (``scripts/postgres-local`` starts a local server
and prints its URL). Progress goes to stderr; the report (text or ``--json``) to stdout.
The exit status is 1 if a job did not complete as expected, 0 otherwise.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import pstats
import shutil
import sqlite3
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import psycopg
from psycopg import sql

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
from jobledger.adapters.event_store import EventSourcedJobStore

WORKFLOW = "bench"
TENANT = "bench"
SQLITE_AIM = 0.5
"""The throughput aim on SQLite: engine steps/s over raw single-insert commits/s."""


# ---- the workload ----------------------------------------------------------------------


class NoopExecutor:
    """A side effect that does nothing: what is measured is the engine's own cost."""

    def execute(self, request: StepRequest) -> StepResult:
        return StepResult()


def bench_registry(steps: int) -> FunctionRegistry:
    """``steps`` side-effecting steps; the last one completes the job."""
    work = [Resolution("run_interaction_task", JobStatus.QUEUED) for _ in range(steps - 1)]
    registry = FunctionRegistry()
    registry.register(
        WORKFLOW,
        1,
        linear_workflow([*work, Resolution("run_interaction_task", JobStatus.COMPLETED)]),
    )
    return registry


# ---- counting what the engine asks of the database -------------------------------------


@dataclass
class StoreCounts:
    """Writes (one transaction each), the rows they carry, and reads, by kind."""

    appends: int = 0
    step_appends: int = 0
    """Appends carrying a StepRecorded: the step's own durable commit."""
    claim_appends: int = 0
    """Appends carrying only a Claimed: the claim that opens a tick."""
    other_appends: int = 0
    snapshot_writes: int = 0
    rows: int = 0
    state_bytes: int = 0
    topic_chars: int = 0
    reads: int = 0

    def add_append(self, stored_events: Sequence[Any]) -> None:
        names = [event.topic.rsplit(".", 1)[-1] for event in stored_events]
        self.appends += 1
        self.rows += len(stored_events)
        self.state_bytes += sum(len(event.state) for event in stored_events)
        self.topic_chars += sum(len(event.topic) for event in stored_events)
        if "StepRecorded" in names:
            self.step_appends += 1
        elif set(names) == {"Claimed"}:
            self.claim_appends += 1
        else:
            self.other_appends += 1


class CountingRecorders:
    """Wraps each partition's event and snapshot recorders (on the instances only)."""

    def __init__(self, store: EventSourcedJobStore) -> None:
        self.counts = StoreCounts()
        for partition in store.partitions:
            self._wrap_events(partition.recorder)
            if partition.snapshots is not None:
                self._wrap_snapshots(partition.snapshots.recorder)

    def reset(self) -> StoreCounts:
        counts, self.counts = self.counts, StoreCounts()
        return counts

    def _wrap_events(self, recorder: Any) -> None:
        insert: Callable[..., Any] = recorder.insert_events
        select: Callable[..., Any] = recorder.select_events

        def insert_events(stored_events: Sequence[Any], **kwargs: Any) -> Any:
            result = insert(stored_events, **kwargs)
            self.counts.add_append(stored_events)
            return result

        def select_events(*args: Any, **kwargs: Any) -> Any:
            self.counts.reads += 1
            return select(*args, **kwargs)

        recorder.insert_events = insert_events
        recorder.select_events = select_events

    def _wrap_snapshots(self, recorder: Any) -> None:
        insert: Callable[..., Any] = recorder.insert_events
        select: Callable[..., Any] = recorder.select_events

        def insert_events(stored_events: Sequence[Any], **kwargs: Any) -> Any:
            result = insert(stored_events, **kwargs)
            self.counts.snapshot_writes += 1
            return result

        def select_events(*args: Any, **kwargs: Any) -> Any:
            self.counts.reads += 1
            return select(*args, **kwargs)

        recorder.insert_events = insert_events
        recorder.select_events = select_events


# ---- the engine run --------------------------------------------------------------------


@dataclass
class EngineRun:
    jobs: int
    steps_per_job: int
    max_steps_per_tick: int
    steps: int
    ticks: int
    seconds: float
    cpu_seconds: float
    """CPU time of this process (user + system) during the ticking phase."""
    steps_per_second: float
    cpu_us_per_step: float
    commits: int
    """Durable write transactions during the ticking phase (appends + snapshot writes)."""
    commits_per_step: float
    step_commits: int
    claim_commits: int
    other_commits: int
    snapshot_commits: int
    rows_per_commit: float
    reads_per_step: float
    avg_event_state_bytes: int
    submit_seconds: float
    incomplete_jobs: int
    profile: str | None = None


@dataclass
class RawRun:
    rows: int
    row_state_bytes: int
    seconds: float
    commits_per_second: float
    """Over both halves: rows / seconds."""
    before_per_second: float
    """The half measured just before the engine's ticking phase ..."""
    after_per_second: float
    """... and the half just after: far apart means the machine was noisy."""


RawBench = Callable[[int, bytes, str], float]
"""(rows, state, topic) -> seconds taken to commit that many single-row INSERTs."""


def measure(
    url: str, args: argparse.Namespace, label: str, raw: RawBench
) -> tuple[EngineRun, RawRun]:
    """Warm the engine up, then: raw baseline, the timed ticking phase, raw baseline."""
    config = EngineConfig(
        store_url=url, worker_id="bench", max_steps_per_tick=args.max_steps_per_tick
    )
    engine = Engine.open(
        url, registry=bench_registry(args.steps), executor=NoopExecutor(), config=config
    )
    try:
        assert isinstance(engine.store, EventSourcedJobStore)
        counter = CountingRecorders(engine.store)

        # Warm-up: imports, caches, prepared statements; and the size of a stored event.
        for n in range(args.warmup_jobs):
            engine.submit("warmup", f"warmup-{n}", WORKFLOW)
        counter.reset()
        engine.run_until_idle()
        warm = counter.reset()
        state = raw_payload(round(warm.state_bytes / max(1, warm.rows)))
        topic = "jobledger.job:Job.StepRecorded".ljust(
            round(warm.topic_chars / max(1, warm.rows)), "_"
        )

        half = args.raw_rows // 2
        before = raw(half, state, topic)

        job_ids = [f"job-{n:06d}" for n in range(args.jobs)]
        started = time.perf_counter()
        with Progress(f"{label}: submit", len(job_ids)) as progress:
            for job_id in job_ids:
                engine.submit(TENANT, job_id, WORKFLOW)
                progress.advance(1)
        submit_seconds = time.perf_counter() - started
        counter.reset()

        profiler = cProfile.Profile() if args.profile else None
        cpu_started = time.process_time()
        ticks, seconds = tick_until_idle(engine, args, label, profiler)
        cpu_seconds = time.process_time() - cpu_started
        counts = counter.reset()

        after = raw(args.raw_rows - half, state, topic)
        incomplete = sum(
            1
            for job_id in job_ids
            if (view := engine.job(TENANT, job_id)).status is not JobStatus.COMPLETED
            or view.total_steps_executed != args.steps
        )
    finally:
        engine.close()

    steps = args.jobs * args.steps
    commits = counts.appends + counts.snapshot_writes
    run = EngineRun(
        jobs=args.jobs,
        steps_per_job=args.steps,
        max_steps_per_tick=args.max_steps_per_tick,
        steps=steps,
        ticks=ticks,
        seconds=seconds,
        cpu_seconds=cpu_seconds,
        steps_per_second=steps / seconds,
        cpu_us_per_step=1e6 * cpu_seconds / steps,
        commits=commits,
        commits_per_step=commits / steps,
        step_commits=counts.step_appends,
        claim_commits=counts.claim_appends,
        other_commits=counts.other_appends,
        snapshot_commits=counts.snapshot_writes,
        rows_per_commit=counts.rows / max(1, counts.appends),
        reads_per_step=counts.reads / steps,
        avg_event_state_bytes=round(counts.state_bytes / max(1, counts.rows)),
        submit_seconds=submit_seconds,
        incomplete_jobs=incomplete,
        profile=profile_text(profiler, args.profile) if profiler else None,
    )
    raw_run = RawRun(
        rows=args.raw_rows,
        row_state_bytes=len(state),
        seconds=before + after,
        commits_per_second=args.raw_rows / (before + after),
        before_per_second=half / before if half else 0.0,
        after_per_second=(args.raw_rows - half) / after,
    )
    return run, raw_run


def tick_until_idle(
    engine: Engine, args: argparse.Namespace, label: str, profiler: cProfile.Profile | None
) -> tuple[int, float]:
    """``run_until_idle`` in slices, so progress can be shown; returns (ticks, seconds)."""
    total_steps = args.jobs * args.steps
    expected_ticks = args.jobs * -(-args.steps // args.max_steps_per_tick)
    chunk = max(1, expected_ticks // 50)
    ticks = 0
    elapsed = 0.0
    with Progress(f"{label}: tick", total_steps) as progress:
        while True:
            started = time.perf_counter()
            if profiler is not None:
                profiler.enable()
            handled = engine.run_until_idle(max_ticks=chunk)
            if profiler is not None:
                profiler.disable()
            elapsed += time.perf_counter() - started
            ticks += handled
            progress.update(min(ticks * args.max_steps_per_tick, total_steps))
            if handled < chunk:
                return ticks, elapsed


def profile_text(profiler: cProfile.Profile, top: int) -> str:
    out = io.StringIO()
    stats = pstats.Stats(profiler, stream=out)
    stats.sort_stats("tottime").print_stats(top)
    stats.sort_stats("cumulative").print_stats(top)
    return out.getvalue()


# ---- the raw baselines -----------------------------------------------------------------


def raw_payload(state_bytes: int) -> bytes:
    """Hex digits: incompressible enough that neither store shrinks the row."""
    return os.urandom(state_bytes // 2 + 1).hex().encode()[:state_bytes]


def raw_sqlite(path: Path) -> RawBench:
    """Single-row BEGIN/INSERT/COMMIT on a plain sqlite3 connection: WAL, synchronous=FULL."""

    def bench(rows: int, state: bytes, topic: str) -> float:
        connection = sqlite3.connect(path, isolation_level=None)
        try:
            mode = connection.execute("PRAGMA journal_mode=WAL").fetchone()[0]
            assert str(mode).lower() == "wal", mode
            connection.execute("PRAGMA synchronous=FULL")
            connection.execute(
                "CREATE TABLE IF NOT EXISTS raw_events (originator_id TEXT, "
                "originator_version INTEGER, topic TEXT, state BLOB, "
                "PRIMARY KEY (originator_id, originator_version))"
            )
            originator = uuid.uuid4().hex
            insert = "INSERT INTO raw_events VALUES (?, ?, ?, ?)"
            with Progress("sqlite: raw commits", rows) as progress:
                started = time.perf_counter()
                for version in range(1, rows + 1):
                    connection.execute("BEGIN")
                    connection.execute(insert, (originator, version, topic, state))
                    connection.execute("COMMIT")
                    progress.advance(1)
                return time.perf_counter() - started
        finally:
            connection.close()

    return bench


def raw_postgres(base_url: str, schema: str) -> RawBench:
    """Autocommit single-row INSERTs with psycopg into a table shaped like the events."""
    table = sql.Identifier(schema, "raw_events")

    def bench(rows: int, state: bytes, topic: str) -> float:
        with psycopg.connect(base_url, autocommit=True) as connection:
            connection.execute(
                sql.SQL(
                    "CREATE TABLE IF NOT EXISTS {} (originator_id uuid NOT NULL, "
                    "originator_version bigint NOT NULL, topic text, state bytea, "
                    "notification_id bigserial UNIQUE, "
                    "PRIMARY KEY (originator_id, originator_version))"
                ).format(table)
            )
            originator = uuid.uuid4()
            insert = sql.SQL(
                "INSERT INTO {} (originator_id, originator_version, topic, state) "
                "VALUES (%s, %s, %s, %s)"
            ).format(table)
            with Progress("postgres: raw commits", rows) as progress:
                started = time.perf_counter()
                for version in range(1, rows + 1):
                    connection.execute(insert, (originator, version, topic, state), prepare=True)
                    progress.advance(1)
                return time.perf_counter() - started

    return bench


# ---- per store -------------------------------------------------------------------------


@dataclass
class StoreResult:
    store: str
    engine: EngineRun
    raw: RawRun
    ratio: float
    """Engine steps/s over raw single-insert commits/s."""
    aim: float | None
    meets_aim: bool | None
    us_per_step: float
    us_per_raw_commit: float
    overhead_us_per_step: float
    """Time per step not explained by its commits at the raw commit rate."""
    load_average: tuple[float, float, float]
    """1/5/15-minute load when this store's run began: high means noisy numbers."""
    cpus: int


def bench_sqlite(args: argparse.Namespace) -> StoreResult:
    load = os.getloadavg()
    directory = Path(tempfile.mkdtemp(prefix="jobledger-bench-", dir=args.dir))
    try:
        url = f"sqlite:///{directory / 'jobs.db'}"
        engine, raw = measure(url, args, "sqlite", raw_sqlite(directory / "raw.db"))
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    return result("sqlite", engine, raw, SQLITE_AIM, load)


def bench_postgres(args: argparse.Namespace, base_url: str) -> StoreResult:
    load = os.getloadavg()
    with fresh_schema(base_url) as schema:
        url = with_query(base_url, schema=schema)
        engine, raw = measure(url, args, "postgres", raw_postgres(base_url, schema))
    return result("postgres", engine, raw, None, load)


def result(
    store: str,
    engine: EngineRun,
    raw: RawRun,
    aim: float | None,
    load: tuple[float, float, float],
) -> StoreResult:
    ratio = engine.steps_per_second / raw.commits_per_second
    us_per_step = 1e6 / engine.steps_per_second
    us_per_raw_commit = 1e6 / raw.commits_per_second
    return StoreResult(
        store=store,
        engine=engine,
        raw=raw,
        ratio=ratio,
        aim=aim,
        meets_aim=None if aim is None else ratio >= aim,
        us_per_step=us_per_step,
        us_per_raw_commit=us_per_raw_commit,
        overhead_us_per_step=us_per_step - engine.commits_per_step * us_per_raw_commit,
        load_average=load,
        cpus=os.cpu_count() or 1,
    )


@contextmanager
def fresh_schema(base_url: str) -> Iterator[str]:
    schema = f"bench_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(base_url, autocommit=True) as connection:
        connection.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(schema)))
    try:
        yield schema
    finally:
        with psycopg.connect(base_url, autocommit=True) as connection:
            connection.execute(sql.SQL("DROP SCHEMA {} CASCADE").format(sql.Identifier(schema)))


def with_query(url: str, **params: str) -> str:
    parts = urlsplit(url)
    query = [(k, v) for k, v in parse_qsl(parts.query) if k not in params]
    return urlunsplit(parts._replace(query=urlencode([*query, *params.items()])))


# ---- progress and output ---------------------------------------------------------------


class Progress:
    """A one-line counter on stderr, redrawn at most ten times a second (tty only)."""

    def __init__(self, label: str, total: int) -> None:
        self.label = label
        self.total = total
        self.done = 0
        self.started = time.perf_counter()
        self.drawn = 0.0
        self.live = sys.stderr.isatty()

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *_: object) -> None:
        self.draw(final=True)

    def advance(self, n: int) -> None:
        self.update(self.done + n)

    def update(self, done: int) -> None:
        self.done = done
        now = time.perf_counter()
        if self.live and now - self.drawn >= 0.1:
            self.drawn = now
            self.draw()

    def draw(self, *, final: bool = False) -> None:
        seconds = time.perf_counter() - self.started
        rate = self.done / seconds if seconds > 0 else 0.0
        line = f"{self.label}: {self.done}/{self.total} ({rate:,.0f}/s, {seconds:.1f}s)"
        if self.live:
            sys.stderr.write(f"\r\033[K{line}" + ("\n" if final else ""))
        elif final:
            sys.stderr.write(line + "\n")
        sys.stderr.flush()


def print_text(results: list[StoreResult]) -> None:
    for r in results:
        e, raw = r.engine, r.raw
        if r.aim is None:
            aim = "(no aim set for this store)"
        else:
            aim = f"aim >= {r.aim}: {'MET' if r.meets_aim else 'NOT MET'}"
        load = ", ".join(f"{x:.2f}" for x in r.load_average)
        lines = [
            f"== {r.store}: {e.jobs} jobs x {e.steps_per_job} steps, "
            f"max {e.max_steps_per_tick} steps/tick (load {load} on {r.cpus} CPUs)",
            f"  engine   {e.steps_per_second:>9,.0f} steps/s    {e.steps} steps, {e.ticks} ticks "
            f"in {e.seconds:.2f}s: {r.us_per_step:,.0f} us/step, "
            f"{e.cpu_us_per_step:,.0f} us of it CPU in this process",
            f"  raw      {raw.commits_per_second:>9,.0f} commits/s  {raw.rows} single-row commits "
            f"of {raw.row_state_bytes} B: {r.us_per_raw_commit:,.0f} us/commit "
            f"({raw.before_per_second:,.0f}/s before, {raw.after_per_second:,.0f}/s after)",
            f"  ratio    {r.ratio:>9.2f}              {aim}",
            f"  commits  {e.commits_per_step:>9.3f} per step   {e.commits} = "
            f"{e.step_commits} step + {e.claim_commits} tick-opening claim + "
            f"{e.other_commits} other + {e.snapshot_commits} snapshot",
            f"  overhead {r.overhead_us_per_step:>9,.0f} us/step    beyond "
            f"{e.commits_per_step:.2f} raw commits per step",
            f"  rows     {e.rows_per_commit:>9.2f} per commit "
            f"avg event {e.avg_event_state_bytes} B; {e.reads_per_step:.2f} reads per step",
        ]
        if e.incomplete_jobs:
            lines.append(f"  !! {e.incomplete_jobs} jobs did not complete {e.steps_per_job} steps")
        print("\n".join(lines))
        if e.profile:
            print(e.profile, file=sys.stderr)


# ---- main ------------------------------------------------------------------------------


def positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description="Engine steps/s vs the raw single-insert commit rate of the same database.",
    )
    parser.add_argument("--store", choices=("sqlite", "postgres", "both"), default="both")
    parser.add_argument("--jobs", type=positive, default=200, help="jobs (default 200)")
    parser.add_argument("--steps", type=positive, default=10, help="steps per job (default 10)")
    parser.add_argument(
        "--max-steps-per-tick", type=positive, default=10, help="engine budget (default 10)"
    )
    parser.add_argument(
        "--raw-rows", type=positive, default=2000, help="raw baseline commits (default 2000)"
    )
    parser.add_argument(
        "--postgres-url",
        default=os.environ.get("JOBLEDGER_TEST_POSTGRES_URL"),
        help="default: $JOBLEDGER_TEST_POSTGRES_URL",
    )
    parser.add_argument(
        "--warmup-jobs", type=positive, default=5, help="untimed warm-up jobs (default 5)"
    )
    parser.add_argument("--dir", help="where the SQLite temp files go (default: system temp)")
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    parser.add_argument(
        "--profile",
        type=int,
        default=0,
        metavar="N",
        help="cProfile the ticking phase, print the top N functions to stderr "
        "(slows the engine run; its numbers are then not comparable)",
    )
    return parser.parse_args(argv)


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
        report = {"results": [asdict(r) for r in results], "skipped": skipped}
        print(json.dumps(report, indent=2))
    else:
        print_text(results)
    return 1 if any(r.engine.incomplete_jobs for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
