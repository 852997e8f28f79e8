"""Resume latency: from ``resume(token)`` or ``signal()`` to the job's next step recorded.

In-process, on SQLite and PostgreSQL (the same stores and raw baselines as
``bench_steps.py``): ``--jobs`` jobs each open a wait for an event (their first step),
then, one job at a time, the clock starts, the job is resumed (by its token, or by a
signal naming the event), ``Engine.run_until_idle`` runs its next step, and the clock stops
when that step's record is committed. Reported: p50 and p99 per way of resuming, the
commits, rows and reads from the resume to that step's record (counted at the events
tables' recorders, as ``bench_steps.py`` counts them), and each target beside its figure
(issue 25: p50 <= 1.0 ms on SQLite, <= 2.0 ms on PostgreSQL, and <= 0.5x LangGraph's).

LangGraph, on the same store kinds in the same run (the ``bench`` extra:
``pip install -e '.[bench]'``): a graph whose node ``ask`` calls ``interrupt()`` and
whose next node ``after`` does nothing, checkpointed durably (``durability="sync"``) by
``langgraph-checkpoint-sqlite``'s ``SqliteSaver`` on a file with the engine's settings
(WAL, ``synchronous=FULL``), and by ``langgraph-checkpoint-postgres``'s ``PostgresSaver``
in a fresh schema. Timed the same way: from ``graph.invoke(Command(resume=...))`` to the
commit of the checkpoint written after ``after`` ran. Without the extra the report says
so and the LangGraph targets are not judged.

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
import importlib
import json
import os
import shutil
import sqlite3
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, TypedDict
from uuid import UUID

import psycopg
from psycopg.rows import dict_row

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
TARGET_VS_LANGGRAPH = 0.5
"""Our p50 over LangGraph's ``Command(resume)`` p50 on the same store kind, at most."""
LANGGRAPH_MODULES = (
    "langgraph.graph",
    "langgraph.checkpoint.sqlite",
    "langgraph.checkpoint.postgres",
)
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
    reads_per_resume: float
    """Selects of the events tables that returned rows, from the resume to the next step's
    record: none when the engine holds the job (its wait's tick handed it back, and the
    resume hands it on to the tick it wakes)."""
    empty_reads_per_resume: float
    """Selects that found nothing: the resume's and the tick's look for events newer than
    the job they took."""
    cpu_us_per_resume: float
    """CPU time of this process (every thread) per resume and its step: a figure a busy
    machine disturbs less than the wall-clock ones."""
    incomplete_jobs: int


@dataclass
class LangGraphLatency:
    """LangGraph's ``invoke(Command(resume=...))`` to the next node's checkpoint."""

    samples: int
    p50_ms: float
    p99_ms: float
    max_ms: float
    saver: str


@dataclass
class StoreResult:
    store: str
    kinds: list[Latencies]
    target_p50_ms: float
    load_average: tuple[float, float, float]
    langgraph: LangGraphLatency | None = None
    langgraph_missing: str | None = None
    """Why LangGraph was not measured (the bench extra is not installed)."""


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


# ---- LangGraph, on the same kind of store --------------------------------------------


def langgraph_missing() -> str | None:
    """Why LangGraph cannot be measured here, or None."""
    for module in LANGGRAPH_MODULES:
        try:
            importlib.import_module(module)
        except ImportError as error:
            return f"{error.name} is not installed (pip install -e '.[bench]')"
    return None


def langgraph_resumes(saver: Any, label: str, args: argparse.Namespace) -> LangGraphLatency:
    """Each thread runs to its ``interrupt()``; then, timed one at a time, it is resumed
    and the clock stops when the checkpoint written after the next node ran commits."""
    from langgraph.graph import END, START, StateGraph
    from langgraph.types import Command, interrupt

    class State(TypedDict, total=False):
        answer: str
        steps: int

    def ask(state: State) -> State:
        return {"answer": interrupt("go?")}

    def after(state: State) -> State:
        return {"steps": state.get("steps", 0) + 1}

    builder = StateGraph(State)
    builder.add_node("ask", ask)
    builder.add_node("after", after)
    builder.add_edge(START, "ask")
    builder.add_edge("ask", "after")
    builder.add_edge("after", END)
    written: list[float] = []
    put = saver.put

    def timed_put(*put_args: Any, **put_kwargs: Any) -> Any:
        result = put(*put_args, **put_kwargs)
        written.append(time.perf_counter())
        return result

    saver.put = timed_put
    graph = builder.compile(checkpointer=saver)
    samples: list[float] = []
    total = args.warmup_jobs + args.jobs
    with Progress(f"{label}: LangGraph resumes", total) as progress:
        for n in range(total):
            config: Any = {"configurable": {"thread_id": f"{label}-{n}"}}
            graph.invoke({"steps": 0}, config, durability="sync")
            written.clear()
            started = time.perf_counter()
            final = graph.invoke(Command(resume="go"), config, durability="sync")
            if final.get("steps") != 1:
                raise SystemExit(f"LangGraph thread {n} did not run its next node: {final}")
            if n >= args.warmup_jobs:
                samples.append(written[-1] - started)
            progress.advance(1)
    return LangGraphLatency(
        samples=len(samples),
        p50_ms=1e3 * percentile(samples, 0.50),
        p99_ms=1e3 * percentile(samples, 0.99),
        max_ms=1e3 * max(samples),
        saver=type(saver).__name__,
    )


def langgraph_sqlite(directory: Path, args: argparse.Namespace) -> LangGraphLatency:
    from langgraph.checkpoint.sqlite import SqliteSaver

    connection = sqlite3.connect(directory / "langgraph.db", check_same_thread=False)
    try:
        # The engine's durability: WAL, every commit synced.
        connection.execute("PRAGMA journal_mode=WAL")
        connection.execute("PRAGMA synchronous=FULL")
        return langgraph_resumes(SqliteSaver(connection), "sqlite", args)
    finally:
        connection.close()


def langgraph_postgres(base_url: str, args: argparse.Namespace) -> LangGraphLatency:
    from langgraph.checkpoint.postgres import PostgresSaver

    with (
        fresh_schema(base_url) as schema,
        psycopg.connect(
            base_url,
            autocommit=True,
            prepare_threshold=0,
            row_factory=dict_row,
            options=f"-c search_path={schema}",
        ) as connection,
    ):
        saver = PostgresSaver(connection)
        saver.setup()
        return langgraph_resumes(saver, "postgres", args)


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
    commits = rows = reads = empty = 0
    cpu = time.process_time()
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
            reads += counts.reads
            empty += counts.empty_reads
            if done is not None:
                samples.append(done - started)
            progress.advance(1)
    cpu = time.process_time() - cpu
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
        reads_per_resume=reads / jobs,
        empty_reads_per_resume=empty / jobs,
        cpu_us_per_resume=1e6 * cpu / jobs,
        incomplete_jobs=incomplete,
    )


def resumer(engine: Engine, inbox: TokenInbox, kind: str) -> Callable[[str], object]:
    if kind == "token":
        return lambda job_id: engine.resume(inbox.tokens[job_id])
    return lambda job_id: engine.signal(TENANT, job_id, EVENT, signal_id=f"s-{job_id}")


def bench_sqlite(args: argparse.Namespace) -> StoreResult:
    directory = Path(tempfile.mkdtemp(prefix="jobledger-bench-", dir=args.dir))
    try:
        result = measure(f"sqlite:///{directory / 'jobs.db'}", "sqlite", args)
        result.langgraph_missing = missing = langgraph_missing()
        if missing is None:
            result.langgraph = langgraph_sqlite(directory, args)
        return result
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def bench_postgres(args: argparse.Namespace, base_url: str) -> StoreResult:
    with fresh_schema(base_url) as schema:
        result = measure(with_query(base_url, schema=schema), "postgres", args)
    result.langgraph_missing = missing = langgraph_missing()
    if missing is None:
        result.langgraph = langgraph_postgres(base_url, args)
    return result


def print_text(results: list[StoreResult]) -> None:
    print(
        f"{'store':<10}{'resume by':<11}{'samples':>8}{'p50 ms':>9}{'p99 ms':>9}"
        f"{'max ms':>9}{'commits':>9}{'rows':>7}{'reads':>7}{'empty':>7}{'CPU us':>8}  targets"
    )
    for r in results:
        lg = r.langgraph
        for k in r.kinds:
            print(
                f"{r.store:<10}{k.kind:<11}{k.samples:>8}{k.p50_ms:>9.3f}{k.p99_ms:>9.3f}"
                f"{k.max_ms:>9.3f}{k.commits_per_resume:>9.2f}{k.rows_per_resume:>7.2f}"
                f"{k.reads_per_resume:>7.2f}{k.empty_reads_per_resume:>7.2f}"
                f"{k.cpu_us_per_resume:>8.0f}  "
                f"p50 <= {r.target_p50_ms} ms: "
                f"{met(k.p50_ms <= r.target_p50_ms)}; {versus_langgraph(k, lg)}"
            )
            if k.incomplete_jobs:
                print(f"  !! {k.incomplete_jobs} jobs did not complete")
        if lg is not None:
            print(
                f"{r.store:<10}{'LangGraph':<11}{lg.samples:>8}{lg.p50_ms:>9.3f}"
                f"{lg.p99_ms:>9.3f}{lg.max_ms:>9.3f}  Command(resume) -> next node's "
                f"checkpoint ({lg.saver}, durability=sync)"
            )
        else:
            print(f"{r.store:<10}LangGraph not measured: {r.langgraph_missing}")


def met(ok: bool) -> str:
    return "met" if ok else "NOT met"


def versus_langgraph(ours: Latencies, langgraph: LangGraphLatency | None) -> str:
    if langgraph is None:
        return f"vs LangGraph <= {TARGET_VS_LANGGRAPH}x: not measured"
    ratio = ours.p50_ms / langgraph.p50_ms
    judged = met(ratio <= TARGET_VS_LANGGRAPH)
    return f"vs LangGraph {ratio:.2f}x (<= {TARGET_VS_LANGGRAPH}x: {judged})"


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
