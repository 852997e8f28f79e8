"""The HTTP API's cost: submit and signal through the API against the same calls on the
in-process Engine, measured in the same run, on SQLite and PostgreSQL.

For each store one engine serves the API with a real uvicorn server on a loopback port
(the ``ApiServer`` that ``jobledger run --http`` runs), authenticated by an API key, the
rate limit off. For each number of concurrent clients K of ``--clients`` (default 1, 8):

* **submit**: ``--requests`` new jobs, split between K threads, each submitting one job
  after another: ``Engine.submit`` in-process, then ``POST /v1/jobs/{tenant}`` (one
  keep-alive connection per thread);
* **signal**: those jobs, each waiting for the event ``go`` (run there, untimed), are
  each sent one signal: ``Engine.signal``, then ``POST /v1/jobs/{tenant}/{job}/signals``.

Reported per operation, way and K: requests/s (requests over the wall time of the K
threads), p50 and p99 latency of one request (from the call to its answer), and the
API's requests/s as a ratio to the engine's. Then the live stream: one client follows a
job's events (``GET /v1/jobs/{tenant}/{job}/events``) while another engine appends
``--sse-events`` events one at a time; the latency from each append's return to the
event's arrival (p50, p99; issue 13's bound: 100 ms on PostgreSQL, the poll interval on
SQLite).

Usage::

    python scripts/bench_http.py                         # both stores, 2000 requests, K = 1 8
    python scripts/bench_http.py --store sqlite --clients 1,4,16 --requests 5000
    python scripts/bench_http.py --quick --json          # a smoke run: seconds

PostgreSQL is skipped when neither ``--postgres-url`` nor ``JOBLEDGER_TEST_POSTGRES_URL``
is set. Progress goes to stderr; the report (text or ``--json``) to stdout. The exit
status is 1 if a request failed (a signal counts only if it resumed its job), else 0.
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import random
import shutil
import socket
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path

import httpx

from bench_steps import Progress, fresh_schema, k_list, percentile, positive, with_query
from jobledger import (
    Engine,
    EngineConfig,
    FunctionRegistry,
    JobStatus,
    Resolution,
    linear_workflow,
)
from jobledger.api.auth import key_sha256
from jobledger.api.server import ApiServer, serve_engine
from jobledger.api.settings import ApiSettings

TENANT = "bench"
WORKFLOW = "bench-http"
EVENT = "go"
API_KEY = "jlk-bench-http-0123456789abcdef"
SSE_BOUND_MS = {"postgres": 100.0}
SQLITE_POLL_SECONDS = 0.2


def registry() -> FunctionRegistry:
    """Wait for ``go``, then complete (no side effect: the engine's own cost is measured)."""
    registry = FunctionRegistry()
    registry.register(
        WORKFLOW,
        1,
        linear_workflow(
            [
                Resolution("wait_event", JobStatus.WAITING_EVENT, wait_event_name=EVENT),
                Resolution("complete", JobStatus.COMPLETED),
            ]
        ),
    )
    return registry


# ---- one way of calling, K clients ----------------------------------------------------------


@dataclass
class Figures:
    requests: int
    requests_per_second: float
    p50_ms: float
    p99_ms: float
    failed: int


@dataclass
class Scenario:
    op: str
    """``submit`` or ``signal``."""
    clients: int
    engine: Figures
    http: Figures
    http_to_engine: float
    """The API's requests/s over the engine's."""


Call = Callable[[str], bool]
"""Make one request for a job id; whether it succeeded."""


def drive(
    label: str, job_ids: Sequence[str], clients: int, call_for: Callable[[], Call]
) -> Figures:
    """``job_ids`` split between ``clients`` threads, each with its own caller
    (``call_for()``: e.g. its own connection), one request after another."""
    shares = [job_ids[n::clients] for n in range(clients)]
    latencies: list[list[float]] = [[] for _ in shares]
    failures = [0] * clients
    callers = [call_for() for _ in shares]
    start = threading.Barrier(clients + 1)
    progress = Progress(label, len(job_ids))

    def work(n: int) -> None:
        call, mine, took = callers[n], shares[n], latencies[n]
        start.wait()
        for job_id in mine:
            began = time.perf_counter()
            ok = call(job_id)
            took.append(time.perf_counter() - began)
            failures[n] += not ok
            progress.advance(1)

    threads = [threading.Thread(target=work, args=(n,)) for n in range(clients)]
    for thread in threads:
        thread.start()
    start.wait()
    began = time.perf_counter()
    for thread in threads:
        thread.join()
    elapsed = time.perf_counter() - began
    progress.draw(final=True)
    samples = [s for each in latencies for s in each] or [0.0]
    return Figures(
        requests=len(job_ids),
        requests_per_second=len(job_ids) / elapsed if elapsed > 0 else 0.0,
        p50_ms=1e3 * percentile(samples, 0.50),
        p99_ms=1e3 * percentile(samples, 0.99),
        failed=sum(failures),
    )


class Bench:
    def __init__(self, url: str, label: str, directory: Path, args: argparse.Namespace) -> None:
        self.label = label
        self.args = args
        config = EngineConfig(store_url=url, worker_id="bench", token_secret="x" * 40)
        self.engine = Engine.open(url, registry=registry(), config=config)
        keys = directory / "keys.json"
        entry = {"sha256": key_sha256(API_KEY), "subject": "bench", "tenants": [TENANT]}
        keys.write_text(json.dumps({"keys": [{**entry, "roles": ["operator", "auditor"]}]}))
        settings = ApiSettings(
            host="127.0.0.1",
            port=0,
            api_keys_file=keys,
            rate_limit_per_minute=0,
            sse_poll_seconds=SQLITE_POLL_SECONDS,
            sse_heartbeat_seconds=0.5,
        )
        self.server: ApiServer = serve_engine(self.engine, settings)
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        if not self.server.started.wait(30):
            raise RuntimeError("the API server did not start")

    def close(self) -> None:
        self.server.stop()
        self.thread.join(30)
        self.engine.close()

    def client(self) -> httpx.Client:
        """A keep-alive connection that sends without Nagle (as curl, Go and browsers do:
        httpx writes a POST's headers and body apart, and would wait for a delayed ACK)."""
        headers = {"Authorization": f"Bearer {API_KEY}"}
        nodelay = [(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)]
        transport = httpx.HTTPTransport(socket_options=nodelay)
        return httpx.Client(
            base_url=self.server.url, headers=headers, timeout=60, transport=transport
        )

    # ---- the callers ------------------------------------------------------------------------

    def engine_submit(self) -> Call:
        def call(job_id: str) -> bool:
            self.engine.submit(TENANT, job_id, WORKFLOW)
            return True

        return call

    def http_submit(self) -> Call:
        http = self.client()

        def call(job_id: str) -> bool:
            body = {"job_id": job_id, "workflow_type": WORKFLOW}
            return http.post(f"/v1/jobs/{TENANT}", json=body).status_code == 201

        return call

    def engine_signal(self) -> Call:
        def call(job_id: str) -> bool:
            outcome = self.engine.signal(TENANT, job_id, EVENT, signal_id=f"s-{job_id}")
            return outcome.value == "resumed"

        return call

    def http_signal(self) -> Call:
        http = self.client()

        def call(job_id: str) -> bool:
            body = {"event": EVENT, "signal_id": f"s-{job_id}"}
            answer = http.post(f"/v1/jobs/{TENANT}/{job_id}/signals", json=body)
            return answer.status_code == 200 and answer.json()["outcome"] == "resumed"

        return call

    # ---- the scenarios ------------------------------------------------------------------------

    def warm_up(self) -> None:
        """Imports, caches, prepared statements, the server's first connections: untimed."""
        ids = [f"warm-{n}" for n in range(self.args.warmup)]
        for submit, signal in ((self.engine_submit, self.engine_signal),
                               (self.http_submit, self.http_signal)):  # fmt: skip
            batch = [f"{submit.__name__}-{job_id}" for job_id in ids]
            drive(f"{self.label}: warm-up", batch, 1, submit)
            self.engine.run_until_idle()
            drive(f"{self.label}: warm-up", batch, 1, signal)
        self.engine.run_until_idle()

    def run(self, clients: int) -> list[Scenario]:
        figures: dict[tuple[str, str], Figures] = {}
        for way, submit, signal in (("engine", self.engine_submit, self.engine_signal),
                                    ("http", self.http_submit, self.http_signal)):  # fmt: skip
            ids = [f"{way}-k{clients}-{n:06d}" for n in range(self.args.requests)]
            label = f"{self.label} K={clients} {way}"
            figures["submit", way] = drive(f"{label} submit", ids, clients, submit)
            self.engine.run_until_idle()  # each job now waits for the event (untimed)
            figures["signal", way] = drive(f"{label} signal", ids, clients, signal)
            self.engine.run_until_idle()  # and completes (untimed)
        return [
            Scenario(
                op=op,
                clients=clients,
                engine=figures[op, "engine"],
                http=figures[op, "http"],
                http_to_engine=ratio(figures[op, "http"], figures[op, "engine"]),
            )
            for op in ("submit", "signal")
        ]

    def sse(self, writer: Engine) -> SseFigures:
        """Append one event at a time with ``writer`` (another engine on the store) while a
        client follows the job's stream; each append's return to the event's arrival."""
        job_id = "sse"
        writer.submit(TENANT, job_id, WORKFLOW)
        arrivals: queue.Queue[tuple[str, float]] = queue.Queue()
        with self.client() as http, follow(http, f"/v1/jobs/{TENANT}/{job_id}/events", arrivals):
            arrivals.get(timeout=30)  # Submitted: the stream is open
            samples = []
            pace = random.Random(13)
            with Progress(f"{self.label}: live events", self.args.sse_events) as progress:
                for n in range(self.args.sse_events):
                    writer.raise_budget(
                        TENANT, job_id, raised_by="bench", reason=f"r{n}", max_steps=10 + n
                    )
                    appended = time.perf_counter()
                    version, arrived = arrivals.get(timeout=30)
                    if version != str(n + 2):
                        raise RuntimeError(f"expected v{n + 2} on the stream, got v{version}")
                    samples.append(max(0.0, arrived - appended))
                    progress.advance(1)
                    # Appends at random moments: on SQLite, one right after the poll that
                    # brought the last event would always wait a whole interval.
                    time.sleep(pace.uniform(0.0, SQLITE_POLL_SECONDS))
        return SseFigures(
            events=len(samples),
            p50_ms=1e3 * percentile(samples, 0.50),
            p99_ms=1e3 * percentile(samples, 0.99),
            max_ms=1e3 * max(samples),
            bound_ms=SSE_BOUND_MS.get(self.label, 1e3 * SQLITE_POLL_SECONDS),
        )


@dataclass
class SseFigures:
    events: int
    p50_ms: float
    p99_ms: float
    max_ms: float
    bound_ms: float


@contextmanager
def follow(
    http: httpx.Client, path: str, arrivals: queue.Queue[tuple[str, float]]
) -> Iterator[None]:
    """Read the stream in a thread: each message's id and arrival time go to ``arrivals``."""
    done = threading.Event()

    def read() -> None:
        with http.stream("GET", path) as response:
            for line in response.iter_lines():
                if done.is_set():
                    return
                if line.startswith("id: "):
                    arrivals.put((line[4:], time.perf_counter()))

    thread = threading.Thread(target=read, daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()  # the reader stops at the next line (a heartbeat at the latest)
        thread.join(10)


def ratio(http: Figures, engine: Figures) -> float:
    return (
        http.requests_per_second / engine.requests_per_second if engine.requests_per_second else 0.0
    )


# ---- per store ------------------------------------------------------------------------------


@dataclass
class StoreResult:
    store: str
    scenarios: list[Scenario]
    sse: SseFigures
    load_average: tuple[float, float, float]


def measure(url: str, label: str, directory: Path, args: argparse.Namespace) -> StoreResult:
    load = os.getloadavg()
    bench = Bench(url, label, directory, args)
    writer = Engine.open(url, registry=registry(), config=EngineConfig(store_url=url))
    try:
        bench.warm_up()
        scenarios = [s for clients in args.clients for s in bench.run(clients)]
        sse = bench.sse(writer)
    finally:
        writer.close()
        bench.close()
    return StoreResult(label, scenarios, sse, load)


def bench_sqlite(args: argparse.Namespace) -> StoreResult:
    directory = Path(tempfile.mkdtemp(prefix="jobledger-bench-", dir=args.dir))
    try:
        return measure(f"sqlite:///{directory / 'jobs.db'}", "sqlite", directory, args)
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def bench_postgres(args: argparse.Namespace, base_url: str) -> StoreResult:
    directory = Path(tempfile.mkdtemp(prefix="jobledger-bench-", dir=args.dir))
    try:
        with fresh_schema(base_url) as schema:
            return measure(with_query(base_url, schema=schema), "postgres", directory, args)
    finally:
        shutil.rmtree(directory, ignore_errors=True)


# ---- output ---------------------------------------------------------------------------------


def print_text(results: list[StoreResult]) -> None:
    print(
        f"{'store':<10}{'op':<8}{'K':>4}  {'way':<7}{'req/s':>9}{'p50 ms':>9}{'p99 ms':>9}"
        f"{'failed':>8}  http/engine"
    )
    for r in results:
        for s in r.scenarios:
            for way, f in (("engine", s.engine), ("http", s.http)):
                share = f"{s.http_to_engine:.2f}" if way == "http" else ""
                print(
                    f"{r.store:<10}{s.op:<8}{s.clients:>4}  {way:<7}{f.requests_per_second:>9.0f}"
                    f"{f.p50_ms:>9.2f}{f.p99_ms:>9.2f}{f.failed:>8}  {share}"
                )
        e = r.sse
        met = "met" if e.p50_ms <= e.bound_ms else "NOT met"
        print(
            f"{r.store:<10}live events over SSE: {e.events} events, p50 {e.p50_ms:.1f} ms, "
            f"p99 {e.p99_ms:.1f} ms, max {e.max_ms:.1f} ms (bound {e.bound_ms:.0f} ms: {met})"
        )
        print(f"{'':<10}load average {r.load_average[0]:.2f} {r.load_average[1]:.2f}")


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description="submit and signal through the HTTP API against the in-process engine."
    )
    parser.add_argument("--store", choices=("sqlite", "postgres", "both"), default="both")
    parser.add_argument(
        "--requests", type=positive, default=2000, help="requests per scenario (default 2000)"
    )
    parser.add_argument(
        "--clients", type=k_list, default=[1, 8], help="concurrent clients, e.g. 1,8 (default)"
    )
    parser.add_argument(
        "--warmup", type=positive, default=50, help="untimed warm-up requests (default 50)"
    )
    parser.add_argument(
        "--sse-events", type=positive, default=100, help="live events timed (default 100)"
    )
    parser.add_argument(
        "--postgres-url",
        default=os.environ.get("JOBLEDGER_TEST_POSTGRES_URL"),
        help="default: $JOBLEDGER_TEST_POSTGRES_URL",
    )
    parser.add_argument("--dir", help="where the SQLite temp files go (default: system temp)")
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    parser.add_argument(
        "--quick", action="store_true", help="a smoke run: 40 requests, K = 1 and 4"
    )
    args = parser.parse_args(argv)
    if args.quick:
        args.requests, args.clients, args.warmup, args.sse_events = 40, [1, 4], 5, 10
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
        report = {"results": [asdict(r) for r in results], "skipped": skipped, "quick": args.quick}
        print(json.dumps(report, indent=2))
    else:
        print_text(results)
    failed = sum(f.failed for r in results for s in r.scenarios for f in (s.engine, s.http))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
