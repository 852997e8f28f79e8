"""Step throughput and latency of the embedded engine against the raw commit rate of its database.

For each store (SQLite, PostgreSQL) one engine runs, in this order:

* **sequential**: one job alone, ``--seq-steps`` trivial side-effecting steps
  (``run_interaction_task`` with a no-op executor; the last step completes the job);
* **many jobs** at each K of ``--concurrency`` (default 1, 4, 16, 64): K jobs submitted
  together, ``--total-steps`` steps between them, then advanced until idle.

Each scenario is a ratio to the rate at which the same database, measured in the same run,
commits single-row INSERTs of the size of a stored event (the raw limit):

* SQLite: the engine on a temporary file (its durable settings: WAL, synchronous=FULL);
  the raw baseline is a plain ``sqlite3`` connection on another file in the same
  directory with the same pragmas, one ``BEGIN; INSERT; COMMIT`` per row.
* PostgreSQL: the engine in a fresh schema (``?schema=...``) that this script creates and
  drops; the raw baseline is one psycopg connection's autocommit single-row INSERTs into a
  table of the events table's shape, in the same schema.

With ``--sign`` a second engine on a second store of the same database (another file, or
another schema) signs every event it writes with a throwaway Ed25519 key made at start
(configured as a process configures it: a signing-keys file, ``EngineConfig.signing_keys``),
and each scenario runs on both engines, one right after the other (which goes first
alternates from one scenario to the next, so neither always follows the other's writes),
so the report gives signed steps/s over unsigned steps/s of the same run (issue 16: within
10 %) and counts the rows that carry a signature.

With ``--metrics`` a further engine, on a store of its own, keeps Prometheus metrics (every
ops event counted, no scraper attached: issue 14) and runs each scenario the same way, so
the report gives steps/s with metrics over steps/s without, in the same run. Given with
``--tracing``, the traced engine keeps metrics too: traced over plain is then the
overhead of metrics and tracing together.

Half the raw commits run before the first scenario and half after the last, so a disk
that changed speed mid-run shows up as before/after rates far apart. The run is only as
good as the machine is quiet: the report shows the load average.

How the many-jobs scenarios run: ``Engine.run_until_idle`` with the engine's
``concurrency`` set to K (K ticks at once, one thread each) and its step appends group
committed (issue 11 item 1): a group holds at most ``--batch`` appends (default: the
engine's ``max_batch``). Every report says which mode ran.

Counted, not estimated: commits are the calls to the event and snapshot recorders'
``insert_events`` (one transaction each; the script wraps them on the instances), rows
are ``count(*)`` of the events tables before and after each scenario. Step latency is
from the executor being called to the commit of that step's record returning (p50, p99).

Bytes per step (issue 25, item 3): ``event B/step`` is what the appends handed the store
(each row's state and topic), ``WAL B/step`` what the store's write-ahead log grew by
per step, every table's writes included, over an untimed repeat of the scenario right
after it (the same K, at most 256 steps, at least 8 a job). SQLite: the frames appended
to the -wal file times their size (a page and a 24-byte header); a read transaction held
for the repeat keeps checkpoints from restarting the log, which is also why the repeat
is not the timed run: every checkpoint the engine then tries fails to finish, and costs.
PostgreSQL: ``pg_current_wal_insert_lsn()`` after minus before, the whole server's, so
other clients' writes count too.

Usage::

    python scripts/bench_steps.py                      # both stores, K = 1 4 16 64
    python scripts/bench_steps.py --store sqlite --concurrency 1,16 --total-steps 4000
    python scripts/bench_steps.py --quick --json       # a smoke run: well under 30 s
    python scripts/bench_steps.py --store sqlite --profile 25   # cProfile the ticking
    python scripts/bench_steps.py --sign               # signed vs unsigned, same run
    python scripts/bench_steps.py --metrics            # metrics on vs off, same run
    python scripts/bench_steps.py --tracing            # traced vs untraced, same run
    python scripts/bench_steps.py --metrics --tracing --rounds 15  # both on vs plain, 15 rounds

With ``--tracing`` each scenario runs again, right after, on an engine with a store of
its own that makes OpenTelemetry spans (an SDK tracer provider with no exporter attached:
the cost of tracing itself, not of shipping spans), and the report gives traced steps/s
over untraced (issue 14: the overhead within 10 %). Every engine's store takes one run of
each scenario a round: an engine that took two (traced and not, on one store) would run
on a store growing twice as fast as the plain one's. Needs the otel extra.

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
import signal
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import asdict, dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit
from uuid import UUID

import psycopg
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from psycopg import sql

from jobledger import (
    Engine,
    EngineConfig,
    FunctionRegistry,
    JobStatus,
    Resolution,
    ResolveRequest,
    StepContext,
    StepRequest,
    StepResult,
    WorkflowContext,
    step,
    workflow,
)
from jobledger.adapters.event_store import EventSourcedJobStore
from jobledger.adapters.signing import private_pem
from jobledger.domain.identity import job_uuid
from jobledger.domain.job import Job
from jobledger.orchestration.tracing import Tracer
from jobledger.projections import JobViews
from jobledger.workflows import DefinitionRegistry, WorkflowDefinition, parse_definition
from jobledger.workflows.code import CodeWorkflow
from jobledger.workflows.replayer import replay_code

WORKFLOW = "bench"
TENANT = "bench"
MANY_MODE = "run_until_idle, group commit"
WAL_SAMPLE_STEPS = 256
"""Steps of each scenario's untimed repeat that measures the write-ahead log's growth."""
MANY_MODE_TEXT = (
    "K runnable jobs run at once by Engine.run_until_idle (concurrency K), their step "
    "appends committed together (group commit, at most --batch or max_batch per commit)"
)
TARGETS = {"sqlite": (0.5, 1.5), "postgres": (0.4, 1.5)}
"""Issue 25's targets as (sequential, many jobs at K = 16 and at K = 64) ratios to the raw
rate: a group commit can beat single-row commits."""
TARGET_KS = (16, 64)
"""The many-jobs runs a target applies to (each on its own: K = 64 must not lag K = 16)."""
PROCESSES_TARGET = 1.7
"""Issue 25: steps/s of two processes on one store over one process's, same run."""


# ---- the workload ----------------------------------------------------------------------


class TimingExecutor:
    """A side effect that does nothing (what is measured is the engine's own cost); it
    notes when each job's step began, for the step latency."""

    def __init__(self) -> None:
        self.started: dict[tuple[str, str], float] = {}

    def execute(self, request: StepRequest) -> StepResult:
        self.started[request.job.tenant_id, request.job.job_id] = time.perf_counter()
        return StepResult()


WORK = Resolution("run_interaction_task", JobStatus.QUEUED)
LAST = Resolution("run_interaction_task", JobStatus.COMPLETED)


def bench_registry() -> FunctionRegistry:
    """Side-effecting steps, as many as the job's input says; the last one completes it."""

    def resolve(request: ResolveRequest) -> Resolution:
        return LAST if request.current_step + 1 >= request.state["steps"] else WORK

    registry = FunctionRegistry()
    registry.register(WORKFLOW, 1, resolve)
    return registry


CODE_WORKFLOW = "bench_code"
CODE_STEPS = (10, 100)
"""No-op steps a job runs in the code-vs-declarative scenario (then it completes)."""
CODE_KS = (1, 16)
"""The K each code-vs-declarative pair runs at."""
CODE_TARGET = 0.9
"""Issue 26: a code workflow's steps/s over the same mission's as a definition, same run."""
NOOP_TASK = "noop"


@dataclass(frozen=True)
class Written:
    """A mission of no-op steps as a workflow the engine is handed: written as code, or
    as a definition (what a job of it is submitted with)."""

    how: str
    """``code`` or ``declarative``."""
    workflow: str
    input: dict[str, Any]


def code_and_declared(
    executor: TimingExecutor,
) -> tuple[CodeWorkflow, list[CodeWorkflow | WorkflowDefinition]]:
    """The code workflow (``steps`` no-op steps, from its input) and, for each of
    ``CODE_STEPS``, the same mission as a definition. Both run the one ``noop`` step
    function, so what differs is only how the next step is found: replaying the body,
    or reading the definition."""

    @step(NOOP_TASK)
    def noop(ctx: StepContext) -> None:
        executor.started[ctx.tenant_id, ctx.job_id] = time.perf_counter()

    @workflow(CODE_WORKFLOW, version=1)
    async def chain(wf: WorkflowContext, steps: int) -> None:
        for _ in range(steps):
            await wf.step(noop)

    declared = [
        parse_definition(chain_definition(n, declared_type(n), task=NOOP_TASK), f"chain{n}.yaml")
        for n in CODE_STEPS
    ]
    return chain, [chain, *declared]


def declared_type(steps: int) -> str:
    return f"bench_chain{steps}"


def written(how: str, steps: int) -> Written:
    if how == "code":
        return Written(how, CODE_WORKFLOW, {"steps": steps})
    return Written(how, declared_type(steps), {})


# ---- counting what the engine asks of the database -------------------------------------


@dataclass
class StoreCounts:
    """Writes (one transaction each), the rows they carry, reads, and step latencies."""

    appends: int = 0
    step_appends: int = 0
    """Appends carrying a StepRecorded: the steps' durable commits (a group's is one)."""
    steps_recorded: int = 0
    """StepRecorded events those appends carried."""
    claim_appends: int = 0
    """Appends carrying only a Claimed: the claim that opens a tick."""
    other_appends: int = 0
    snapshot_writes: int = 0
    rows: int = 0
    state_bytes: int = 0
    topic_chars: int = 0
    signed_rows: int = 0
    """Rows whose stored state carries a signature (the row format's ``"signer":``)."""
    reads: int = 0
    """Selects of the events or snapshots tables that returned rows (history read)."""
    empty_reads: int = 0
    """Selects that found nothing: a kept job's look for newer events, a key asked for."""
    latencies: list[float] = field(default_factory=list)
    """Seconds from the executor's call to the step's commit returning."""

    def count_read(self, rows: Sequence[Any]) -> None:
        if rows:
            self.reads += 1
        else:
            self.empty_reads += 1

    def add_append(self, stored_events: Sequence[Any]) -> bool:
        """Count one append; True when it recorded a step."""
        names = [event.topic.rsplit(".", 1)[-1] for event in stored_events]
        self.appends += 1
        self.rows += len(stored_events)
        self.state_bytes += sum(len(event.state) for event in stored_events)
        self.topic_chars += sum(len(event.topic) for event in stored_events)
        self.signed_rows += sum(b'"signer":' in event.state for event in stored_events)
        if "StepRecorded" in names:
            self.step_appends += 1
            self.steps_recorded += names.count("StepRecorded")
            return True
        if set(names) == {"Claimed"}:
            self.claim_appends += 1
        else:
            self.other_appends += 1
        return False


class CountingRecorders:
    """Wraps each partition's event and snapshot recorders (on the instances only)."""

    def __init__(self, store: EventSourcedJobStore, executor: TimingExecutor) -> None:
        self.counts = StoreCounts()
        self.lock = threading.Lock()
        self.executor = executor
        self.jobs: dict[UUID, tuple[str, str]] = {}
        """Job uuid -> (tenant, job id), filled at submit so the hot path only looks up."""
        self.step_committed: Callable[[UUID, float], None] | None = None
        for partition in store.partitions:
            self._wrap_events(partition.recorder)
            if partition.snapshots is not None:
                self._wrap_snapshots(partition.snapshots.recorder)

    def track(self, tenant_id: str, job_id: str) -> None:
        self.jobs[job_uuid(tenant_id, job_id)] = (tenant_id, job_id)

    def reset(self) -> StoreCounts:
        counts, self.counts = self.counts, StoreCounts()
        return counts

    def _wrap_events(self, recorder: Any) -> None:
        insert: Callable[..., Any] = recorder.insert_events
        select: Callable[..., Any] = recorder.select_events

        def insert_events(stored_events: Sequence[Any], **kwargs: Any) -> Any:
            result = insert(stored_events, **kwargs)
            now = time.perf_counter()
            with self.lock:  # the ticks' threads commit (claims, groups) side by side
                if self.counts.add_append(stored_events):
                    self._step_latency(stored_events, now)
            return result

        def select_events(*args: Any, **kwargs: Any) -> Any:
            found = select(*args, **kwargs)
            with self.lock:
                self.counts.count_read(found)
            return found

        recorder.insert_events = insert_events
        recorder.select_events = select_events

    def _step_latency(self, stored_events: Sequence[Any], now: float) -> None:
        """Every step a commit recorded (a group commit records many)."""
        for event in stored_events:
            if event.topic.endswith("StepRecorded"):
                job = self.jobs.get(event.originator_id, ("", ""))
                started = self.executor.started.pop(job, None)
                if started is not None:
                    self.counts.latencies.append(now - started)
                if self.step_committed is not None:
                    self.step_committed(event.originator_id, now)

    def _wrap_snapshots(self, recorder: Any) -> None:
        insert: Callable[..., Any] = recorder.insert_events
        select: Callable[..., Any] = recorder.select_events

        def insert_events(stored_events: Sequence[Any], **kwargs: Any) -> Any:
            result = insert(stored_events, **kwargs)
            with self.lock:
                self.counts.snapshot_writes += 1
            return result

        def select_events(*args: Any, **kwargs: Any) -> Any:
            found = select(*args, **kwargs)
            with self.lock:
                self.counts.count_read(found)
            return found

        recorder.insert_events = insert_events
        recorder.select_events = select_events


def count_rows(store: EventSourcedJobStore) -> int:
    """Rows in every partition's events table, asked of the database itself."""
    backend = store.backend
    total = 0
    for partition in store.partitions:
        table = backend.table(partition.events_table)
        [row] = backend.fetch(f"SELECT count(*) AS n FROM {table}", {})
        total += int(row["n"])
    return total


def percentile(samples: Sequence[float], fraction: float) -> float:
    """Nearest-rank percentile (no interpolation: every figure is a measured one)."""
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, max(0, round(fraction * len(ordered)) - 1))]


# ---- how many bytes the store's write-ahead log grew by ----------------------------------


class WalMeter:
    """The bytes a store's write-ahead log grows by over a scenario (every table's writes:
    events, snapshots, leases, admission, tracking), measured around the timed run."""

    def start(self) -> None:
        raise NotImplementedError

    def stop(self) -> int:
        """The bytes the log grew by."""
        raise NotImplementedError


class SQLiteWal(WalMeter):
    """Frames appended to the -wal file, times their size (a page and its 24-byte header).

    A checkpoint lets the next writer start the log over, which would hide the frames
    before it; so a read transaction opened at the start keeps its snapshot for the whole
    run: no checkpoint may copy past it, and the log only grows. The checkpoint the run
    held off is made at its end."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.reader: sqlite3.Connection | None = None
        self.frames = 0
        self.page_size = 0

    def start(self) -> None:
        self.reader = sqlite3.connect(self.path, isolation_level=None)
        self.reader.execute("BEGIN")
        self.reader.execute("SELECT count(*) FROM sqlite_master").fetchone()  # the snapshot
        self.page_size = int(self.reader.execute("PRAGMA page_size").fetchone()[0])
        self.frames = self._frames("PASSIVE")

    def stop(self) -> int:
        grown = self._frames("PASSIVE") - self.frames
        assert self.reader is not None
        self.reader.close()
        self._frames("TRUNCATE")
        return grown * (self.page_size + 24)

    def _frames(self, mode: str) -> int:
        """Frames in the log now (a checkpoint reports them; PASSIVE copies what it may)."""
        connection = sqlite3.connect(self.path, isolation_level=None, timeout=30)
        try:
            _, frames, _ = connection.execute(f"PRAGMA wal_checkpoint({mode})").fetchone()
            return int(frames)
        finally:
            connection.close()


class PostgresWal(WalMeter):
    """The server's WAL insert position before and after: the whole cluster's WAL, so
    another client writing at the same time counts too (run on a quiet server)."""

    def __init__(self, backend: Any) -> None:
        self.backend = backend
        self.before = ""

    def start(self) -> None:
        self.before = self._lsn()

    def stop(self) -> int:
        [row] = self.backend.fetch(
            "SELECT pg_wal_lsn_diff(pg_current_wal_insert_lsn(), CAST(:before AS pg_lsn)) AS n",
            {"before": self.before},
        )
        return int(row["n"])

    def _lsn(self) -> str:
        [row] = self.backend.fetch("SELECT CAST(pg_current_wal_insert_lsn() AS text) AS lsn")
        return str(row["lsn"])


def wal_meter(store: EventSourcedJobStore) -> WalMeter:
    if store.location.kind == "sqlite":
        return SQLiteWal(store.location.env["SQLITE_DBNAME"])
    return PostgresWal(store.backend)


# ---- the scenarios ---------------------------------------------------------------------


@dataclass
class Scenario:
    name: str
    """``sequential`` (one job alone) or ``many`` (K jobs at once)."""
    mode: str
    concurrency: int
    """K: jobs runnable at once."""
    batch: int | None
    """``--batch`` as asked (None: the engine's ``max_batch``)."""
    batch_applied: bool
    jobs: int
    steps_per_job: int
    steps: int
    seconds: float
    steps_per_second: float
    cpu_us_per_step: float
    """CPU time of this process (user + system) per step."""
    commits: int
    """Durable write transactions (appends + snapshot writes)."""
    commits_per_step: float
    step_commits: int
    claim_commits: int
    other_commits: int
    snapshot_commits: int
    rows: int
    """Rows the events tables gained (count(*) after minus before)."""
    rows_per_step: float
    event_bytes_per_step: float
    """Stored bytes of the rows the appends wrote (state and topic), per step."""
    wal_bytes: int
    """Bytes the store's write-ahead log grew by over the run (see ``WalMeter``)."""
    wal_bytes_per_step: float
    signed_rows: int
    """Event rows written with a signature (every one on the signed engine, none else)."""
    reads_per_step: float
    p50_step_ms: float
    p99_step_ms: float
    incomplete_jobs: int
    ratio: float = 0.0
    """steps/s over the raw single-row commits/s of the same run."""
    signed: bool = False
    signed_vs_unsigned: float | None = None
    """On the signed engine's scenario: its steps/s over the unsigned one's, same K."""
    metrics: bool = False
    metrics_vs_off: float | None = None
    """On the metered engine's scenario: its steps/s over the plain one's, same K."""
    traced: bool = False
    traced_vs_untraced: float | None = None
    """On a ``--tracing`` run: its steps/s over the untraced run's, same K."""
    traced_cpu_vs_untraced: float | None = None
    """On a ``--tracing`` run: its CPU per step over the untraced run's, same K (steps/s
    hides CPU behind commit waits; this does not)."""
    rounds: int = 1
    """Runs pooled into these figures (``--rounds``)."""
    round_ratios: list[float] = field(default_factory=list)
    """On a ``--tracing`` run: traced over untraced steps/s of each round, in order."""
    profile: str | None = None
    written: str | None = None
    """The code-vs-declarative scenario's side: ``code`` or ``declarative``."""


@dataclass
class CodeComparison:
    """One mission of ``steps_per_job`` no-op steps run as code and as a definition, one
    right after the other on the same engine and store (which goes first alternates)."""

    noop_steps: int
    """No-op steps a job runs (its completion is one more recorded step)."""
    concurrency: int
    code: Scenario
    declarative: Scenario
    code_vs_declarative: float
    target: float = CODE_TARGET


@dataclass
class ColdReplay:
    """One cold replay of a finished code job's history (its body fed every recorded
    step, from the start, as after a restart), against one step's cost."""

    steps: int
    """No-op steps the job ran."""
    events: int
    read_ms: float
    """Reading its events from the store."""
    replay_ms: float
    """Replaying the body against them (``replay_code``; median of 5)."""
    step_ms: float
    """One step's cost: the job's own run, wall time per recorded step."""
    replay_vs_step: float
    """``replay_ms`` over ``step_ms``."""


class Bench:
    """One engine on one store, and the counters wrapped around it."""

    def __init__(
        self,
        url: str,
        label: str,
        args: argparse.Namespace,
        signing_keys: Path | None = None,
        *,
        metrics: bool = False,
        traced: bool = False,
    ) -> None:
        self.label = (
            label
            + (" signed" if signing_keys else "")
            + (" metrics" if metrics else "")
            + (" traced" if traced else "")
        )
        self.signed = signing_keys is not None
        self.metrics = metrics
        self.traced = traced
        self.args = args
        self.executor = TimingExecutor()
        batch = {} if args.batch is None else {"max_batch": args.batch}
        config = EngineConfig(
            store_url=url,
            worker_id="bench",
            max_steps_per_tick=args.max_steps_per_tick,
            concurrency=1,
            signing_keys=signing_keys,
            **batch,
        )
        self.code, workflows = code_and_declared(self.executor)
        self.engine = Engine.open(
            url,
            registry=bench_registry(),
            workflows=workflows if args.code else [],
            executor=self.executor,
            config=config,
            metrics=metrics,
            tracer=sdk_tracer() if traced else None,
        )
        assert isinstance(self.engine.store, EventSourcedJobStore)
        self.store = self.engine.store
        self.counter = CountingRecorders(self.store, self.executor)
        self.submitted = 0

    def close(self) -> None:
        self.engine.close()

    def warm_up(self) -> tuple[bytes, str]:
        """Imports, caches, prepared statements; and the size of a stored event."""
        for n in range(self.args.warmup_jobs):
            self.submit(f"warmup-{n}", self.args.max_steps_per_tick)
        self.counter.reset()
        self.engine.run_until_idle()
        warm = self.counter.reset()
        state = raw_payload(round(warm.state_bytes / max(1, warm.rows)))
        topic = "jobledger.job:Job.StepRecorded".ljust(
            round(warm.topic_chars / max(1, warm.rows)), "_"
        )
        return state, topic

    def submit(self, job_id: str, steps: int, mission: Written | None = None) -> None:
        if mission is None:
            self.engine.submit(TENANT, job_id, WORKFLOW, input={"steps": steps})
        else:
            self.engine.submit(TENANT, job_id, mission.workflow, input=mission.input)
        self.counter.track(TENANT, job_id)

    def run(
        self,
        name: str,
        concurrency: int,
        steps_per_job: int,
        mission: Written | None = None,
        jobs: int | None = None,
    ) -> Scenario:
        """Submit ``jobs`` jobs (``concurrency`` by default; untimed), then tick them all
        until idle (timed), ``concurrency`` ticks at once. ``mission``: a job's workflow
        and input (the bench's own ``steps_per_job`` steps by default)."""
        prefix = f"{name}-{concurrency}-{self.submitted}"
        job_ids = [f"{prefix}-{n:05d}" for n in range(jobs or concurrency)]
        for job_id in job_ids:
            self.submit(job_id, steps_per_job, mission)
        self.submitted += 1
        rows_before = count_rows(self.store)
        self.counter.reset()
        profiler = cProfile.Profile() if self.args.profile else None
        cpu_started = time.process_time()
        steps = len(job_ids) * steps_per_job
        label = f"{self.label}: {name} K={concurrency}"
        seconds = self.tick_until_idle(label, steps, concurrency, profiler)
        cpu_seconds = time.process_time() - cpu_started
        counts = self.counter.reset()
        rows = count_rows(self.store) - rows_before
        incomplete = sum(
            1
            for job_id in job_ids
            if (view := self.engine.job(TENANT, job_id)).status is not JobStatus.COMPLETED
            or view.total_steps_executed != steps_per_job
        )
        commits = counts.appends + counts.snapshot_writes
        latencies = counts.latencies or [0.0]
        # The WAL is sampled for the bench's own workload only (a mission's is not asked).
        wal_bytes, wal_steps = (
            self.wal_sample(f"{prefix}-wal", concurrency, steps_per_job)
            if mission is None
            else (0, steps)
        )
        return Scenario(
            name=name,
            mode="one job" if name == "sequential" else MANY_MODE,
            concurrency=concurrency,
            batch=self.args.batch,
            batch_applied=name != "sequential",
            jobs=len(job_ids),
            steps_per_job=steps_per_job,
            steps=steps,
            seconds=seconds,
            steps_per_second=steps / seconds,
            cpu_us_per_step=1e6 * cpu_seconds / steps,
            commits=commits,
            commits_per_step=commits / steps,
            step_commits=counts.step_appends,
            claim_commits=counts.claim_appends,
            other_commits=counts.other_appends,
            snapshot_commits=counts.snapshot_writes,
            rows=rows,
            rows_per_step=rows / steps,
            event_bytes_per_step=(counts.state_bytes + counts.topic_chars) / steps,
            wal_bytes=wal_bytes,
            wal_bytes_per_step=wal_bytes / wal_steps,
            signed_rows=counts.signed_rows,
            reads_per_step=counts.reads / steps,
            p50_step_ms=1e3 * percentile(latencies, 0.50),
            p99_step_ms=1e3 * percentile(latencies, 0.99),
            incomplete_jobs=incomplete,
            profile=profile_text(profiler, self.args.profile) if profiler else None,
            signed=self.signed,
            metrics=self.metrics,
            traced=self.traced,
            written=None if mission is None else mission.how,
        )

    def code_vs_declarative(self, noop_steps: int, concurrency: int, rounds: int) -> CodeComparison:
        """The mission as code and as a definition, ``rounds`` times each, the one going
        first alternating, pooled; as many jobs as make ``--total-steps``."""
        steps_per_job = noop_steps + 1
        jobs = max(concurrency, self.args.total_steps // steps_per_job)
        runs: dict[str, list[Scenario]] = {"code": [], "declarative": []}
        for round_number in range(rounds):
            order = ["code", "declarative"][:: 1 if round_number % 2 == 0 else -1]
            for how in order:
                mission = written(how, noop_steps)
                runs[how].append(
                    self.run(f"{how}{noop_steps}", concurrency, steps_per_job, mission, jobs)
                )
        code, declarative = pooled(runs["code"]), pooled(runs["declarative"])
        return CodeComparison(
            noop_steps=noop_steps,
            concurrency=concurrency,
            code=code,
            declarative=declarative,
            code_vs_declarative=code.steps_per_second / declarative.steps_per_second,
        )

    def cold_replay(self, steps: int) -> ColdReplay:
        """Run one code job of ``steps`` no-op steps (timed: one step's cost), then read
        its history up to the step before its completion and replay the body against it
        cold, as a worker that never ran it would."""
        job_id = f"replay-{steps}-{self.submitted}"
        self.submitted += 1
        self.submit(job_id, steps + 1, written("code", steps))
        started = time.perf_counter()
        self.engine.run_until_idle()
        step_seconds = (time.perf_counter() - started) / (steps + 1)
        uuid_ = job_uuid(TENANT, job_id)
        completed = [
            e.originator_version
            for e in self.store.events(uuid_)
            if isinstance(e, Job.StepRecorded) and e.step_type == "complete"
        ]
        if len(completed) != 1:
            raise SystemExit(f"the {steps}-step code job did not complete: {completed}")
        read_started = time.perf_counter()
        events = self.store.events(uuid_, to_version=completed[0] - 1)
        read_seconds = time.perf_counter() - read_started
        timings = []
        for _ in range(5):
            replay_started = time.perf_counter()
            resolution = replay_code(self.code, events)
            timings.append(time.perf_counter() - replay_started)
        if resolution.next_status is not JobStatus.COMPLETED:
            raise SystemExit(f"the cold replay did not end where the job did: {resolution}")
        replay_seconds = statistics.median(timings)
        return ColdReplay(
            steps=steps,
            events=len(events),
            read_ms=1e3 * read_seconds,
            replay_ms=1e3 * replay_seconds,
            step_ms=1e3 * step_seconds,
            replay_vs_step=replay_seconds / step_seconds,
        )

    def wal_sample(self, prefix: str, concurrency: int, steps_per_job: int) -> tuple[int, int]:
        """The write-ahead log's growth over a short repeat of the scenario (the same K,
        at most ``WAL_SAMPLE_STEPS`` steps, at least 8 a job), untimed: SQLite's meter holds
        a reader open, which keeps every checkpoint the engine tries from finishing, and a
        timed run under it would be slowed by them. Returns the bytes and the steps."""
        per_job = min(steps_per_job, max(8, WAL_SAMPLE_STEPS // concurrency))
        for n in range(concurrency):
            self.engine.submit(TENANT, f"{prefix}-{n:05d}", WORKFLOW, input={"steps": per_job})
        wal = wal_meter(self.store)
        wal.start()
        self.engine.run_until_idle(concurrency=concurrency)
        wal_bytes = wal.stop()
        return wal_bytes, concurrency * per_job

    def tick_until_idle(
        self, label: str, steps: int, concurrency: int, profiler: cProfile.Profile | None
    ) -> float:
        """``run_until_idle`` in slices, ``concurrency`` (K) ticks at once, so progress can
        be shown; returns the seconds."""
        # Each slice drains the ticks in flight: slices of at least 4 K ticks keep the
        # K jobs overlapping for all but a sliver of the run.
        chunk = max(4 * concurrency, steps // (50 * self.args.max_steps_per_tick))
        elapsed = 0.0
        with Progress(label, steps) as progress:
            while True:
                started = time.perf_counter()
                if profiler is not None:
                    profiler.enable()
                handled = self.engine.run_until_idle(max_ticks=chunk, concurrency=concurrency)
                if profiler is not None:
                    profiler.disable()
                elapsed += time.perf_counter() - started
                progress.update(min(steps, self.counter.counts.steps_recorded))
                if handled < chunk:
                    return elapsed


def profile_text(profiler: cProfile.Profile, top: int) -> str:
    out = io.StringIO()
    stats = pstats.Stats(profiler, stream=out)
    stats.sort_stats("tottime").print_stats(top)
    stats.sort_stats("cumulative").print_stats(top)
    return out.getvalue()


# ---- the raw baselines -----------------------------------------------------------------


RawBench = Callable[[int, bytes, str], float]
"""(rows, state, topic) -> seconds taken to commit that many single-row INSERTs."""


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
class RawRun:
    rows: int
    row_state_bytes: int
    seconds: float
    commits_per_second: float
    """Over both halves: rows / seconds."""
    before_per_second: float
    """The half measured just before the first scenario ..."""
    after_per_second: float
    """... and the half just after the last: far apart means the machine was noisy."""

    @classmethod
    def of(cls, rows: int, state: bytes, before: float, after: float) -> RawRun:
        """``rows`` commits, half of them (rounded down) taking ``before`` seconds, the
        rest ``after``."""
        half = rows // 2
        return cls(
            rows=rows,
            row_state_bytes=len(state),
            seconds=before + after,
            commits_per_second=rows / (before + after),
            before_per_second=half / before if half else 0.0,
            after_per_second=(rows - half) / after,
        )


@dataclass
class StoreResult:
    store: str
    raw: RawRun
    scenarios: list[Scenario]
    targets: dict[str, float]
    """Issue 25's ratios: ``sequential`` and ``many`` (each of K = 16 and K = 64)."""
    signed: list[Scenario]
    """With ``--sign``: each scenario again on the engine that signs (else empty)."""
    metrics: list[Scenario]
    """With ``--metrics``: each scenario again on the engine that keeps metrics."""
    traced: list[Scenario]
    """With ``--tracing``: each scenario again with spans made (else empty)."""
    code: list[CodeComparison]
    """With ``--code``: each mission as code and as a definition (else empty)."""
    replay: ColdReplay | None
    """With ``--code``: the cold replay of a ``--replay-steps`` code job."""
    load_average: tuple[float, float, float]
    """1/5/15-minute load when this store's run began: high means noisy numbers."""
    cpus: int


def throwaway_signing_keys(directory: Path) -> Path:
    """A signing-keys file of one fresh key, valid from long before this run on."""
    (directory / "bench.pem").write_bytes(private_pem(Ed25519PrivateKey.generate()))
    entry = {"id": "bench", "private_key_file": "bench.pem", "not_after": None}
    entry["not_before"] = datetime(2000, 1, 1, tzinfo=UTC).isoformat()
    path = directory / "signing-keys.json"
    path.write_text(json.dumps([entry]))
    return path


def both(benches: list[Bench], run: tuple[str, int, int], *, first_signed: bool) -> list[Scenario]:
    """The scenario on each engine (the plain one first, or with ``first_signed`` the
    others, in reverse: alternated, so that none always runs after the others' writes)."""
    order = benches[::-1] if first_signed else benches
    done = {id(bench): bench.run(*run) for bench in order}
    return [done[id(bench)] for bench in benches]


def measure(
    url: str,
    label: str,
    raw: RawBench,
    args: argparse.Namespace,
    signed_url: str | None = None,
    metrics_url: str | None = None,
    traced_url: str | None = None,
) -> StoreResult:
    """The scenarios (and, given ``signed_url``, each again on an engine that signs, given
    ``metrics_url`` on one that keeps metrics, and given ``traced_url`` on one that traces,
    and keeps metrics too with ``metrics_url``, right after the plain run) between the two
    halves of the raw commits. Each engine has a store of its own that takes one run of
    each scenario a round, so none runs on a store the others' rounds made bigger."""
    load = os.getloadavg()
    keys = Path(tempfile.mkdtemp(prefix="jobledger-bench-keys-", dir=args.dir))
    benches = [Bench(url, label, args)]
    traced_bench: Bench | None = None

    def every_engine() -> list[Bench]:
        return [*benches, *([traced_bench] if traced_bench else [])]

    try:
        if signed_url is not None:
            benches.append(Bench(signed_url, label, args, throwaway_signing_keys(keys)))
        if metrics_url is not None:
            benches.append(Bench(metrics_url, label, args, metrics=True))
        if traced_url is not None:
            traced_bench = Bench(
                traced_url, label, args, metrics=metrics_url is not None, traced=True
            )
        state, topic = benches[0].warm_up()
        for other in every_engine()[1:]:
            other.warm_up()
        half = args.raw_rows // 2
        before = raw(half, state, topic)
        runs = [("sequential", 1, args.seq_steps)]
        runs += [("many", k, max(1, -(-args.total_steps // k))) for k in args.concurrency]
        done_rounds: list[list[list[Scenario]]] = [[] for _ in runs]
        traced_rounds: list[list[Scenario]] = [[] for _ in runs]
        # With --metrics too, the traced engine keeps metrics as well: traced over plain
        # is then the cost of both together, the figure issue 14 budgets.
        for round_number in range(args.rounds):
            for n, each in enumerate(runs):
                # Traced first every other scenario and round: never always in the same
                # moment of a machine's load.
                flip = (n + round_number) % 2 == 1
                if traced_bench is not None and flip:
                    traced_rounds[n].append(traced_bench.run(*each))
                done_rounds[n].append(both(benches, each, first_signed=flip))
                if traced_bench is not None and not flip:
                    traced_rounds[n].append(traced_bench.run(*each))
        code = [
            benches[0].code_vs_declarative(steps, k, args.rounds)
            for steps in CODE_STEPS
            for k in CODE_KS
            if args.code
        ]
        replay = benches[0].cold_replay(args.replay_steps) if args.code else None
        after = raw(args.raw_rows - half, state, topic)
    finally:
        for bench in every_engine():
            bench.close()
        shutil.rmtree(keys, ignore_errors=True)
    # Each scenario's rounds pooled, per engine (plain, then signed or metered).
    done = [[pooled(list(runs)) for runs in zip(*rounds, strict=True)] for rounds in done_rounds]
    traced = [pooled(rounds) for rounds in traced_rounds if rounds]
    scenarios = [pair[0] for pair in done]
    for n, traced_run in enumerate(traced):
        plain_rounds = [engines[0] for engines in done_rounds[n]]
        traced_run.round_ratios = [
            t.steps_per_second / u.steps_per_second
            for t, u in zip(traced_rounds[n], plain_rounds, strict=True)
        ]
    signed = [s for pair in done for s in pair[1:] if s.signed]
    for unsigned, signed_run in zip(scenarios, signed, strict=False):
        signed_run.signed_vs_unsigned = signed_run.steps_per_second / unsigned.steps_per_second
    metered = [s for pair in done for s in pair[1:] if s.metrics]
    for plain, metered_run in zip(scenarios, metered, strict=False):
        metered_run.metrics_vs_off = metered_run.steps_per_second / plain.steps_per_second
    for untraced, traced_run in zip(scenarios, traced, strict=False):
        traced_run.traced_vs_untraced = traced_run.steps_per_second / untraced.steps_per_second
        traced_run.traced_cpu_vs_untraced = traced_run.cpu_us_per_step / untraced.cpu_us_per_step
    raw_run = RawRun.of(args.raw_rows, state, before, after)
    written_runs = [s for c in code for s in (c.code, c.declarative)]
    for scenario in [*scenarios, *signed, *metered, *traced, *written_runs]:
        scenario.ratio = scenario.steps_per_second / raw_run.commits_per_second
    sequential, many = TARGETS[label]
    return StoreResult(
        store=label,
        raw=raw_run,
        scenarios=scenarios,
        signed=signed,
        metrics=metered,
        traced=traced,
        code=code,
        replay=replay,
        targets={"sequential": sequential, "many": many},
        load_average=load,
        cpus=os.cpu_count() or 1,
    )


def pooled(rounds: list[Scenario]) -> Scenario:
    """A scenario's rounds as one run: counts, seconds and CPU summed, so each rate is over
    all of them; the step latencies are the median round's."""
    if len(rounds) == 1:
        return rounds[0]
    steps = sum(s.steps for s in rounds)
    seconds = sum(s.seconds for s in rounds)
    commits = sum(s.commits for s in rounds)
    rows = sum(s.rows for s in rounds)
    profiles = [s.profile for s in rounds if s.profile]
    return replace(
        rounds[0],
        jobs=sum(s.jobs for s in rounds),
        steps=steps,
        seconds=seconds,
        steps_per_second=steps / seconds,
        cpu_us_per_step=sum(s.cpu_us_per_step * s.steps for s in rounds) / steps,
        commits=commits,
        commits_per_step=commits / steps,
        step_commits=sum(s.step_commits for s in rounds),
        claim_commits=sum(s.claim_commits for s in rounds),
        other_commits=sum(s.other_commits for s in rounds),
        snapshot_commits=sum(s.snapshot_commits for s in rounds),
        rows=rows,
        rows_per_step=rows / steps,
        event_bytes_per_step=sum(s.event_bytes_per_step * s.steps for s in rounds) / steps,
        wal_bytes=sum(s.wal_bytes for s in rounds),
        # Each round's WAL figure is from its own sample repeat, not its timed steps.
        wal_bytes_per_step=sum(s.wal_bytes_per_step for s in rounds) / len(rounds),
        signed_rows=sum(s.signed_rows for s in rounds),
        reads_per_step=sum(s.reads_per_step * s.steps for s in rounds) / steps,
        p50_step_ms=statistics.median(s.p50_step_ms for s in rounds),
        p99_step_ms=statistics.median(s.p99_step_ms for s in rounds),
        incomplete_jobs=sum(s.incomplete_jobs for s in rounds),
        profile="\n".join(profiles) or None,
        rounds=len(rounds),
    )


def sdk_tracer() -> Tracer:
    """OpenTelemetry spans, every one recorded by an SDK provider with no exporter
    attached: the cost of tracing itself, not of shipping spans."""
    from opentelemetry.sdk.trace import TracerProvider

    from jobledger.adapters.otel import OtelTracer

    return OtelTracer(TracerProvider())


def bench_sqlite(args: argparse.Namespace) -> StoreResult:
    directory = Path(tempfile.mkdtemp(prefix="jobledger-bench-", dir=args.dir))
    try:
        url = f"sqlite:///{directory / 'jobs.db'}"
        signed = f"sqlite:///{directory / 'signed.db'}" if args.sign else None
        metered = f"sqlite:///{directory / 'metrics.db'}" if args.metrics else None
        traced = f"sqlite:///{directory / 'traced.db'}" if args.tracing else None
        raw = raw_sqlite(directory / "raw.db")
        return measure(url, "sqlite", raw, args, signed, metered, traced)
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def bench_postgres(args: argparse.Namespace, base_url: str) -> StoreResult:
    signed_store = fresh_schema(base_url) if args.sign else nullcontext(None)
    metered_store = fresh_schema(base_url) if args.metrics else nullcontext(None)
    traced_store = fresh_schema(base_url) if args.tracing else nullcontext(None)
    with (
        fresh_schema(base_url) as schema,
        signed_store as signed_schema,
        metered_store as metered_schema,
        traced_store as traced_schema,
    ):
        url = with_query(base_url, schema=schema)
        signed = with_query(base_url, schema=signed_schema) if signed_schema else None
        metered = with_query(base_url, schema=metered_schema) if metered_schema else None
        traced = with_query(base_url, schema=traced_schema) if traced_schema else None
        raw = raw_postgres(base_url, schema)
        return measure(url, "postgres", raw, args, signed, metered, traced)


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


# ---- several processes on one store ----------------------------------------------------


NOOP_EXECUTOR = """from jobledger import StepResult


class Noop:
    def execute(self, request):
        return StepResult()
"""


@dataclass
class ProcessesRun:
    """``jobledger run --processes N`` working off one backlog on a store of its own."""

    processes: int
    jobs: int
    steps: int
    """Steps recorded after the first one (the window is first record to last)."""
    seconds: float
    steps_per_second: float
    cpu_busy: float | None
    """The machine's CPUs busy over that window, all processes counted (the database
    server's too), 0 to 1 (from /proc/stat; None where there is none): near 1, the run
    was bound by the machine's cores, not by the engine's sharing."""
    ratio: float = 0.0
    """steps/s over the raw single-row commits/s of the same run."""


@dataclass
class ProcessesResult:
    store: str
    raw: RawRun
    concurrency: int
    """Ticks at once in each process (its ``concurrency``)."""
    runs: list[ProcessesRun]
    two_vs_one: float | None
    """Two processes' steps/s over one's (None unless both ran)."""
    target: float
    load_average: tuple[float, float, float]
    cpus: int


def chain_definition(steps: int, workflow_type: str = "chain", task: str | None = None) -> str:
    """``workflow_type``: ``steps`` no-op agent steps (naming ``task``, if given), then
    complete."""
    lines = [f"type: {workflow_type}", "version: 1", "start: s1", "steps:"]
    params = "" if task is None else f", params: {{task: {task}}}"
    for n in range(1, steps + 1):
        following = f"s{n + 1}" if n < steps else "done"
        lines.append(f"  s{n}: {{kind: run_interaction_task, next: {following}{params}}}")
    lines.append("  done: {kind: complete}")
    return "\n".join(lines) + "\n"


def run_processes(url: str, label: str, count: int, args: argparse.Namespace) -> ProcessesRun:
    """Submit the backlog (untimed), start ``jobledger run --processes count`` on it, and
    time it from the first step's record to the last's."""
    home = Path(tempfile.mkdtemp(prefix="jobledger-bench-procs-", dir=args.dir))
    try:
        definition = chain_definition(args.process_steps)
        (home / "definitions").mkdir()
        (home / "definitions" / "chain.yaml").write_text(definition)
        (home / "bench_noop.py").write_text(NOOP_EXECUTOR)
        config = home / "jobledger.toml"
        config.write_text(
            f'store_url = "{url}"\ndefinitions = "definitions"\n'
            'executor = "bench_noop:Noop"\n'
            f"concurrency = {args.process_concurrency}\n"
            f"max_steps_per_tick = {args.max_steps_per_tick}\n"
        )
        registry = DefinitionRegistry([parse_definition(definition, "chain.yaml")])
        with Engine.open(url, registry=registry) as engine:
            for n in range(args.process_jobs):
                engine.submit(TENANT, f"procs-{n:05d}", "chain")
            return time_processes(engine, label, count, args, home, config)
    finally:
        shutil.rmtree(home, ignore_errors=True)


def time_processes(
    engine: Engine,
    label: str,
    count: int,
    args: argparse.Namespace,
    home: Path,
    config: Path,
) -> ProcessesRun:
    steps_per_job = args.process_steps + 1  # the last, pure step completes the job
    total = args.process_jobs * steps_per_job
    env = {k: v for k, v in os.environ.items() if not k.startswith("JOBLEDGER_")}
    command = [sys.executable, "-m", "jobledger", "run", "--processes", str(count)]
    command += ["--config", str(config), "--log-level", "warning"]
    with (home / "run.log").open("wb") as log:
        parent = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=home)
    try:
        with Progress(f"{label}: {count} process(es)", total) as progress:
            cpu = wait_done(engine, parent, args.process_jobs, progress)
    finally:
        parent.send_signal(signal.SIGTERM)
        parent.wait(timeout=120)
    # Timed by the steps' own records (the store's clock), not by when the views showed
    # them: a view folds in batches, and a short run can land in one.
    moments = sorted(
        entry.timestamp
        for n in range(args.process_jobs)
        for entry in engine.history(TENANT, f"procs-{n:05d}")
        if entry.event_type == "StepRecorded"
    )
    steps = len(moments) - 1  # those recorded after the first
    seconds = (moments[-1] - moments[0]).total_seconds()
    busy = cpu_busy(cpu, moments[0].timestamp(), moments[-1].timestamp())
    return ProcessesRun(count, args.process_jobs, steps, seconds, steps / seconds, busy)


CpuSample = tuple[float, int, int]
"""(wall time, busy jiffies, all jiffies) of the whole machine."""


def cpu_sample() -> CpuSample | None:
    try:
        with open("/proc/stat", encoding="ascii") as stat:
            jiffies = [int(n) for n in stat.readline().split()[1:]]
    except OSError:
        return None
    idle = jiffies[3] + jiffies[4]  # idle and iowait
    return time.time(), sum(jiffies) - idle, sum(jiffies)


def cpu_busy(samples: list[CpuSample], start: float, end: float) -> float | None:
    """The busy share of the machine's CPUs between the samples nearest inside the window."""
    inside = [sample for sample in samples if start <= sample[0] <= end]
    if len(inside) < 2:
        return None
    (_, busy0, all0), (_, busy1, all1) = inside[0], inside[-1]
    return (busy1 - busy0) / (all1 - all0) if all1 > all0 else None


def wait_done(
    engine: Engine, parent: subprocess.Popen[bytes], jobs: int, progress: Progress
) -> list[CpuSample]:
    """Poll the status view (steps recorded, jobs completed) until every job completed;
    the machine's CPU use sampled at each poll."""
    assert isinstance(engine.store, EventSourcedJobStore)
    backend = JobViews(engine.store).backend  # made by now: the views' tables exist
    table = backend.table("jobledger_job_status")
    query = (
        "SELECT coalesce(sum(steps_executed), 0) AS steps, "
        f"coalesce(sum(CASE WHEN status = 'completed' THEN 1 ELSE 0 END), 0) AS done FROM {table}"
    )
    samples: list[CpuSample] = []
    while True:
        if (sample := cpu_sample()) is not None:
            samples.append(sample)
        [row] = backend.fetch(query)
        progress.update(int(row["steps"]))
        if int(row["done"]) == jobs:
            return samples
        if parent.poll() is not None:
            raise RuntimeError(f"jobledger run --processes exited with {parent.returncode}")
        time.sleep(0.05)


def measure_processes(
    urls: Callable[[], AbstractContextManager[str]],
    label: str,
    raw: RawBench,
    args: argparse.Namespace,
) -> ProcessesResult:
    """Each process count on a fresh store (``urls()``), between the two halves of the
    raw commits."""
    load = os.getloadavg()
    state = raw_payload(815)  # a stored step's size (issue 25's measure)
    topic = "jobledger.job:Job.StepRecorded"
    half = args.raw_rows // 2
    before = raw(half, state, topic)
    runs = []
    for count in args.processes:
        with urls() as url:
            runs.append(run_processes(url, label, count, args))
    after = raw(args.raw_rows - half, state, topic)
    raw_run = RawRun.of(args.raw_rows, state, before, after)
    for each in runs:
        each.ratio = each.steps_per_second / raw_run.commits_per_second
    by_count = {each.processes: each.steps_per_second for each in runs}
    two_vs_one = by_count[2] / by_count[1] if {1, 2} <= by_count.keys() else None
    return ProcessesResult(
        store=label,
        raw=raw_run,
        concurrency=args.process_concurrency,
        runs=runs,
        two_vs_one=two_vs_one,
        target=PROCESSES_TARGET,
        load_average=load,
        cpus=os.cpu_count() or 1,
    )


def processes_sqlite(args: argparse.Namespace) -> ProcessesResult:
    directory = Path(tempfile.mkdtemp(prefix="jobledger-bench-", dir=args.dir))
    files = iter(range(1_000))

    @contextmanager
    def urls() -> Iterator[str]:
        yield f"sqlite:///{directory / f'procs-{next(files)}.db'}"

    try:
        return measure_processes(urls, "sqlite", raw_sqlite(directory / "raw.db"), args)
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def processes_postgres(args: argparse.Namespace, base_url: str) -> ProcessesResult:
    @contextmanager
    def urls() -> Iterator[str]:
        with fresh_schema(base_url) as schema:
            yield with_query(base_url, schema=schema)

    with fresh_schema(base_url) as raw_schema:
        raw = raw_postgres(base_url, raw_schema)
        return measure_processes(urls, "postgres", raw, args)


def print_processes(results: list[ProcessesResult]) -> None:
    for r in results:
        load = ", ".join(f"{x:.2f}" for x in r.load_average)
        print(
            f"\n== {r.store}: processes on one store, local transport "
            f"(concurrency {r.concurrency} each; load {load} on {r.cpus} CPUs)\n"
            f"raw: {r.raw.commits_per_second:,.0f} single-row commits/s "
            f"({r.raw.before_per_second:,.0f}/s before, {r.raw.after_per_second:,.0f}/s after)"
        )
        for run in r.runs:
            busy = "" if run.cpu_busy is None else f", CPUs {100 * run.cpu_busy:.0f} % busy"
            print(
                f"{run.processes} process(es): {run.steps:>7} steps in {run.seconds:6.2f} s, "
                f"{run.steps_per_second:>8,.0f} steps/s, {run.ratio:.2f}x raw{busy}"
            )
        if r.two_vs_one is not None:
            ratio = r.two_vs_one
            print(f"target two processes / one: {ratio:.2f}, {verdict(ratio, r.target)}")


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


def verdict(ratio: float, aim: float) -> str:
    return f"{'met' if ratio >= aim else 'NOT met'} (>= {aim})"


def print_text(results: list[StoreResult], batch: int | None) -> None:
    print(f"many-jobs mode: {MANY_MODE_TEXT}" + (f"; --batch {batch}" if batch else ""))
    header = (
        f"{'scenario':<18}{'steps':>7}{'steps/s':>10}{'ratio':>7}{'commits/step':>14}"
        f"{'rows/step':>11}{'p50 ms':>9}{'p99 ms':>9}{'cpu us/step':>13}"
        f"{'event B/step':>14}{'WAL B/step':>12}"
    )
    for r in results:
        raw = r.raw
        load = ", ".join(f"{x:.2f}" for x in r.load_average)
        print(
            f"\n== {r.store} (load {load} on {r.cpus} CPUs)\n"
            f"raw: {raw.commits_per_second:,.0f} single-row commits/s of {raw.row_state_bytes} B "
            f"({raw.before_per_second:,.0f}/s before, {raw.after_per_second:,.0f}/s after)"
        )
        print(header)
        for s in r.scenarios + r.signed + r.metrics + r.traced:
            name = "sequential" if s.name == "sequential" else f"many K={s.concurrency}"
            name += " signed" if s.signed else ""
            name += " metrics" if s.metrics else ""
            name += " traced" if s.traced else ""
            print(
                f"{name:<18}{s.steps:>7}{s.steps_per_second:>10,.0f}{s.ratio:>7.2f}"
                f"{s.commits_per_step:>14.3f}{s.rows_per_step:>11.2f}{s.p50_step_ms:>9.3f}"
                f"{s.p99_step_ms:>9.3f}{s.cpu_us_per_step:>13,.0f}"
                f"{s.event_bytes_per_step:>14,.0f}{s.wal_bytes_per_step:>12,.0f}"
            )
            if s.incomplete_jobs:
                print(f"  !! {s.incomplete_jobs} jobs did not complete {s.steps_per_job} steps")
            if s.profile:
                print(s.profile, file=sys.stderr)
        for s in r.signed:
            name = "sequential" if s.name == "sequential" else f"many K={s.concurrency}"
            print(
                f"signed/unsigned {name}: {s.signed_vs_unsigned:.3f} "
                f"({s.signed_rows} of {s.rows} rows signed; aim >= 0.90)"
            )
        for s in r.metrics:
            name = "sequential" if s.name == "sequential" else f"many K={s.concurrency}"
            print(f"metrics on/off {name}: {s.metrics_vs_off:.3f} (aim >= 0.90)")
        if r.traced:
            what = "metrics and tracing on" if r.traced[0].metrics else "tracing on"
            print(f"{what} vs plain, same run (issue 14: overhead < 10 % of steps/s):")
        for s in r.traced:
            name = "sequential" if s.name == "sequential" else f"many K={s.concurrency}"
            assert s.traced_vs_untraced is not None and s.traced_cpu_vs_untraced is not None
            print(
                f"  {name:<12} steps/s overhead {100 * (1 - s.traced_vs_untraced):5.1f} % "
                f"(ratio {s.traced_vs_untraced:.3f}, {verdict(s.traced_vs_untraced, 0.9)}); "
                f"CPU/step {100 * (s.traced_cpu_vs_untraced - 1):+6.1f} %"
            )
            if s.rounds > 1:
                spread = ", ".join(f"{ratio:.2f}" for ratio in s.round_ratios)
                median = statistics.median(s.round_ratios)
                print(f"  {'':<12} {s.rounds} rounds, ratio median {median:.3f} ({spread})")
        print_code(r)
        sequential = r.scenarios[0]
        print(
            f"target sequential: {sequential.ratio:.2f}x raw, "
            f"{verdict(sequential.ratio, r.targets['sequential'])}"
        )
        for s in r.scenarios[1:]:
            if s.concurrency in TARGET_KS:
                print(
                    f"target many K={s.concurrency}: {s.ratio:.2f}x raw, "
                    f"{verdict(s.ratio, r.targets['many'])}"
                )


def print_code(r: StoreResult) -> None:
    if r.code:
        print(
            "code workflow vs the same mission as a definition, same run and store "
            f"(issue 26: >= {CODE_TARGET}x of declarative):"
        )
    for c in r.code:
        code, declared = c.code, c.declarative
        print(
            f"  {c.noop_steps:>3} steps/job K={c.concurrency:<3} "
            f"code {code.steps_per_second:>7,.0f} steps/s ({code.ratio:.2f}x raw, "
            f"{code.cpu_us_per_step:,.0f} cpu us/step, "
            f"{code.reads_per_step:.2f} reads/step), declarative "
            f"{declared.steps_per_second:>7,.0f} ({declared.ratio:.2f}x raw, "
            f"{declared.cpu_us_per_step:,.0f} cpu us/step, {declared.reads_per_step:.2f} "
            f"reads/step): {c.code_vs_declarative:.2f}x of declarative, "
            f"{verdict(c.code_vs_declarative, c.target)}"
        )
        for s in (code, declared):
            if s.incomplete_jobs:
                print(f"  !! {s.incomplete_jobs} {s.written} jobs did not complete")
    if r.replay is not None:
        replay = r.replay
        print(
            f"cold replay of a {replay.steps}-step code workflow: {replay.replay_ms:.1f} ms "
            f"({replay.events} events, read in {replay.read_ms:.1f} ms), "
            f"{replay.replay_vs_step:.1f}x one step's cost ({replay.step_ms:.3f} ms)"
        )


# ---- main ------------------------------------------------------------------------------


def positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def k_list(text: str) -> list[int]:
    try:
        return [positive(part) for part in text.split(",") if part.strip()]
    except ValueError as error:
        raise argparse.ArgumentTypeError(f"a comma-separated list of K >= 1: {error}") from None


QUICK = {
    "seq_steps": 60,
    "total_steps": 128,
    "raw_rows": 200,
    "warmup_jobs": 2,
    "process_jobs": 32,
    "process_steps": 10,
    "replay_steps": 200,
}


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description="Engine steps/s and step latency vs the raw single-row commit rate of the "
        "same database, for one job alone and for K jobs at once.",
    )
    parser.add_argument("--store", choices=("sqlite", "postgres", "both"), default="both")
    parser.add_argument(
        "--concurrency",
        type=k_list,
        default=[1, 4, 16, 64],
        metavar="K,K,...",
        help="jobs runnable at once in the many-jobs runs (default 1,4,16,64)",
    )
    parser.add_argument(
        "--batch",
        type=positive,
        default=None,
        help="the most step appends one group commit writes (default: the engine's max_batch)",
    )
    parser.add_argument(
        "--seq-steps", type=positive, default=1000, help="steps of the lone job (default 1000)"
    )
    parser.add_argument(
        "--total-steps",
        type=positive,
        default=2000,
        help="steps shared by the K jobs of each many-jobs run (default 2000)",
    )
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
        "--sign",
        action="store_true",
        help="also run each scenario on an engine that signs every event (a throwaway "
        "Ed25519 key), and report signed steps/s over unsigned",
    )
    parser.add_argument(
        "--metrics",
        action="store_true",
        help="also run each scenario on an engine that keeps Prometheus metrics (no scraper), "
        "and report steps/s with metrics over without",
    )
    parser.add_argument(
        "--tracing",
        action="store_true",
        help="also run each scenario with OpenTelemetry spans made and no exporter "
        "attached, and report traced steps/s over untraced (needs the otel extra)",
    )
    parser.add_argument(
        "--code",
        action="store_true",
        help="also run a mission of 10 and of 100 no-op steps a job written as a code "
        f"workflow and as a definition, at K = {', '.join(map(str, CODE_KS))}, and report code "
        "steps/s over declarative (issue 26: >= 0.9); and time the cold replay of a "
        "--replay-steps code job",
    )
    parser.add_argument(
        "--replay-steps",
        type=positive,
        default=1000,
        help="no-op steps of the --code cold-replay job (default 1000)",
    )
    parser.add_argument(
        "--rounds",
        type=positive,
        default=1,
        metavar="N",
        help="run every scenario N times, the engines' order alternating each round, and "
        "pool the rounds (default 1; a shared machine's load varies: use 5 or more for "
        "the --metrics/--tracing overhead)",
    )
    parser.add_argument(
        "--processes",
        type=k_list,
        default=[],
        metavar="N,N,...",
        help="also run a backlog with `jobledger run --processes N` for each N (e.g. 1,2), "
        "each on a fresh store, and report steps/s, the ratio to raw and 2 over 1 "
        "processes (issue 25: >= 1.7 on PostgreSQL)",
    )
    parser.add_argument(
        "--processes-only",
        action="store_true",
        help="with --processes: run only that scenario",
    )
    parser.add_argument(
        "--process-jobs",
        type=positive,
        default=128,
        help="jobs of the --processes backlog (default 128)",
    )
    parser.add_argument(
        "--process-steps",
        type=positive,
        default=40,
        help="no-op steps of each --processes job (default 40)",
    )
    parser.add_argument(
        "--process-concurrency",
        type=positive,
        default=16,
        help="ticks at once in each --processes process (default 16)",
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="a smoke run (few steps and raw commits; finishes in seconds, noisy figures)",
    )
    parser.add_argument(
        "--profile",
        type=int,
        default=0,
        metavar="N",
        help="cProfile the ticking, print the top N functions to stderr "
        "(slows the engine; its numbers are then not comparable)",
    )
    args = parser.parse_args(argv)
    if args.quick:
        for name, value in QUICK.items():
            setattr(args, name, value)
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    results: list[StoreResult] = []
    processes: list[ProcessesResult] = []
    skipped: dict[str, str] = {}
    engines = not (args.processes and args.processes_only)
    if args.store in ("sqlite", "both"):
        results += [bench_sqlite(args)] if engines else []
        processes += [processes_sqlite(args)] if args.processes else []
    if args.store in ("postgres", "both"):
        if args.postgres_url:
            results += [bench_postgres(args, args.postgres_url)] if engines else []
            processes += [processes_postgres(args, args.postgres_url)] if args.processes else []
        else:
            skipped["postgres"] = "no --postgres-url and JOBLEDGER_TEST_POSTGRES_URL is unset"
            print(f"postgres: skipped ({skipped['postgres']})", file=sys.stderr)
    if args.json:
        report = {
            "many_jobs_mode": MANY_MODE,
            "many_jobs_mode_text": MANY_MODE_TEXT,
            "quick": args.quick,
            "signed": args.sign,
            "metrics": args.metrics,
            "traced": args.tracing,
            "code": args.code,
            "results": [asdict(r) for r in results],
            "processes": [asdict(r) for r in processes],
            "skipped": skipped,
        }
        print(json.dumps(report, indent=2))
    else:
        print_text(results, args.batch)
        print_processes(processes)
    written_runs = [s for r in results for c in r.code for s in (c.code, c.declarative)]
    every = [s for r in results for s in r.scenarios + r.traced] + written_runs
    return 1 if any(s.incomplete_jobs for s in every) else 0


if __name__ == "__main__":
    sys.exit(main())
