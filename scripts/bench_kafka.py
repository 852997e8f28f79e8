"""End-to-end tick latency and throughput over a real Kafka broker, on PostgreSQL.

For each worker count (default: 1 and 2), in a fresh PostgreSQL schema and fresh topics:

1. N one-step jobs are submitted without a tick (``run_interaction_task`` with a no-op
   executor that records the step and completes the job in ONE append).
2. W worker processes start (``KafkaWorker``, the consumer ``jobledger worker
   --transport kafka`` runs), each its own process, and join the group; then
   ``--warmup-ticks`` ticks run untimed (the publisher's producer, the workers' first
   store connections and fetches: else the first few ticks are the whole p99).
3. Latency: ticks are published one by one at ``--rate`` per second (open loop, so the
   queue stays short) through ``KafkaQueue`` (each waits for the broker's ack). The
   script notes the wall-clock time just before each publish; the worker notes when the
   engine began the tick and when the tick's step was recorded (the append committed),
   before the offset is committed. Latency = recorded - published, p50 / p95 / p99 /
   max, split into delivery (published -> the tick begun in the worker: producer, broker,
   consumer) and the tick itself (begun -> recorded: the store's reads and commits).
4. Throughput: ``--burst`` ticks are published as fast as the producer goes (async,
   one flush); ticks/s = burst / (last step recorded - first tick published).

Each target is printed beside its figure (issue 25): enqueue -> step p50 <= 5 ms and p99
<= 25 ms, and, when 1 and 2 workers both ran, 2 workers' ticks/s >= 1.7x one worker's.

Every tick records exactly one step, so ticks/s is also steps/s. The broker, PostgreSQL,
the workers and this script share the machine: on a 2-core box the figures are what two
cores give for all of them together (the report shows the load average).

Usage::

    . .venv/bin/activate
    python scripts/bench_kafka.py                      # 1 and 2 workers
    python scripts/bench_kafka.py --workers 1 2 4 --burst 4000 --json
    python scripts/bench_kafka.py --quick              # 100 latency ticks, a burst of 500

Kafka: ``--bootstrap``, else JOBLEDGER_KAFKA_BOOTSTRAP_SERVERS or
JOBLEDGER_TEST_KAFKA_BOOTSTRAP, else a broker started for the run with
``scripts/kafka-local`` (and stopped after). PostgreSQL: ``--postgres-url``, else
JOBLEDGER_TEST_POSTGRES_URL, else ``scripts/postgres-local``. Progress goes to stderr,
the report to stdout.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import psycopg

from jobledger import (
    Engine,
    EngineConfig,
    FunctionRegistry,
    JobStatus,
    Resolution,
    StepRequest,
    StepResult,
    Tick,
    linear_workflow,
)
from jobledger.adapters.kafka import KafkaQueue, KafkaSettings, ensure_topics, job_key
from jobledger.adapters.kafka.messages import TickMessage, encode_tick
from jobledger.adapters.kafka.worker import KafkaWorker
from jobledger.orchestration.orchestrator import TickReport

ROOT = Path(__file__).resolve().parent.parent
TENANT = "bench"
WORKFLOW = "one"
TARGET_P50_MS = 5.0
TARGET_P99_MS = 25.0
TARGET_TWO_WORKERS = 1.7
"""Two worker processes' burst ticks/s over one worker's, at least."""


def registry() -> FunctionRegistry:
    one = FunctionRegistry()
    one.register(
        WORKFLOW, 1, linear_workflow([Resolution("run_interaction_task", JobStatus.COMPLETED)])
    )
    return one


class NoOp:
    def execute(self, request: StepRequest) -> StepResult:
        return StepResult()


class Dropped:
    """A queue that drops every tick: jobs are submitted without one."""

    def enqueue(self, tick: Tick, *, delay_ms: int = 0, dedupe_key: str | None = None) -> None:
        return None


def note(message: str) -> None:
    print(f"bench_kafka: {message}", file=sys.stderr, flush=True)


# ---- the worker process ----------------------------------------------------------------


class TimedTicks:
    """The engine as the worker uses it, noting (wall clock, ms) when each tick begins."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.begun: dict[str, float] = {}

    def __getattr__(self, name: str) -> Any:
        return getattr(self.engine, name)

    def run_tick(self, tick: Tick) -> TickReport:
        self.begun[tick.job_id] = time.time() * 1000
        return self.engine.run_tick(tick)


def worker_main(results: Path) -> int:
    """One worker process: handles ticks; per tick appends 'job begun_ms recorded_ms'."""
    logging.basicConfig(level=logging.ERROR)
    config = EngineConfig()
    fd = os.open(results, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    with Engine.open(registry=registry(), executor=NoOp(), config=config) as engine:
        timed = TimedTicks(engine)

        def observe(message: TickMessage, report: TickReport | None) -> None:
            done = time.time() * 1000
            job = message.tick.job_id
            os.write(fd, f"{job} {timed.begun.pop(job, done):.3f} {done:.3f}\n".encode())

        worker = KafkaWorker(timed, KafkaSettings.of(config), on_tick=observe)
        ready = results.with_suffix(f".ready.{os.getpid()}")

        def say_ready() -> None:
            if worker.joined.wait(120):
                ready.touch()

        threading.Thread(target=say_ready, daemon=True).start()
        signal.signal(signal.SIGTERM, lambda *_: worker.stop())
        worker.run()
    return 0


# ---- one measurement -------------------------------------------------------------------


@dataclass
class Figures:
    workers: int
    latency_ticks: int
    rate_per_s: float
    p50_ms: float
    p95_ms: float
    p99_ms: float
    max_ms: float
    delivery_p50_ms: float
    """Published -> the tick begun in the worker."""
    tick_p50_ms: float
    """The tick begun -> its step recorded."""
    burst_ticks: int
    ticks_per_s: float
    load_average: float


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))
    return ordered[index]


def measure(workers: int, args: argparse.Namespace, bootstrap: str, pg: str) -> Figures:
    prefix = f"bench{uuid.uuid4().hex[:8]}"
    fields = {
        "transport": "kafka",
        "kafka_bootstrap_servers": bootstrap,
        "kafka_ticks_topic": f"{prefix}.ticks",
        "kafka_ticks_dlq_topic": f"{prefix}.ticks.dlq",
        "kafka_signals_topic": f"{prefix}.signals",
        "kafka_signals_dlq_topic": f"{prefix}.signals.dlq",
        "kafka_events_topic": f"{prefix}.events",
        "kafka_group_id": f"{prefix}.workers",
        "kafka_topic_partitions": args.partitions,
    }
    with fresh_schema(pg) as url, tempfile.TemporaryDirectory() as tmp:
        config = EngineConfig(store_url=url, worker_id="bench", **fields)
        settings = KafkaSettings.of(config)
        ensure_topics(settings)
        warm, timed = args.warmup_ticks, args.warmup_ticks + args.latency_ticks
        total = timed + args.burst
        note(f"{workers} worker(s): submitting {total} jobs")
        with Engine.open(registry=registry(), config=config, queue=Dropped()) as engine:
            for n in range(total):
                engine.submit(TENANT, f"job-{n}", WORKFLOW)
        results = Path(tmp) / "results"
        env = {
            **os.environ,
            **{f"JOBLEDGER_{k.upper()}": str(v) for k, v in fields.items()},
            "JOBLEDGER_STORE_URL": url,
        }
        procs = [
            subprocess.Popen(
                [sys.executable, __file__, "--worker", str(results)],
                env={**env, "JOBLEDGER_WORKER_ID": f"bench-{n}"},
            )
            for n in range(workers)
        ]
        try:
            deadline = time.monotonic() + 60
            while len(list(Path(tmp).glob("results.ready.*"))) < workers:
                if time.monotonic() > deadline:
                    raise SystemExit("the workers did not join the group")
                time.sleep(0.1)
            time.sleep(2.0)  # let the group settle (every member's assignment in place)

            queue = KafkaQueue(settings)
            note(f"warm-up: {warm} ticks at {args.rate}/s, not timed")
            publish_at_rate(queue, range(warm), args.rate)
            wait_lines(results, warm)
            note(f"latency: {args.latency_ticks} ticks at {args.rate}/s")
            published = publish_at_rate(queue, range(warm, timed), args.rate)
            wait_lines(results, timed)
            handled = read_lines(results)[warm:]
            latencies = [done - published[job] for job, _, done in handled]
            deliveries = [begun - published[job] for job, begun, _ in handled]
            ticks = [done - begun for _, begun, done in handled]

            note(f"throughput: {args.burst} ticks at once")
            producer = queue.producer()
            first = time.time() * 1000
            for n in range(timed, total):
                tick = Tick(TENANT, f"job-{n}", "bench")
                value = encode_tick(tick, dedupe_key=None, enqueued_at_ms=int(time.time() * 1000))
                producer.send(settings.ticks_topic, key=job_key(TENANT, tick.job_id), value=value)
            producer.flush()
            wait_lines(results, total)
            burst = read_lines(results)[timed:]
            last = max(done for _, _, done in burst)
            queue.close()
        finally:
            for proc in procs:
                proc.terminate()
            for proc in procs:
                proc.wait(timeout=60)
        check_all_completed(url, total)
    return Figures(
        workers=workers,
        latency_ticks=args.latency_ticks,
        rate_per_s=args.rate,
        p50_ms=round(percentile(latencies, 0.50), 1),
        p95_ms=round(percentile(latencies, 0.95), 1),
        p99_ms=round(percentile(latencies, 0.99), 1),
        max_ms=round(max(latencies), 1),
        delivery_p50_ms=round(percentile(deliveries, 0.50), 1),
        tick_p50_ms=round(percentile(ticks, 0.50), 1),
        burst_ticks=args.burst,
        ticks_per_s=round(args.burst / ((last - first) / 1000), 1),
        load_average=round(os.getloadavg()[0], 2),
    )


def publish_at_rate(queue: KafkaQueue, jobs: range, rate: float) -> dict[str, float]:
    """Publish job-n's tick for each n, open loop at ``rate`` per second, each waiting for
    the broker's ack; returns when each was published (wall clock, ms, just before)."""
    published: dict[str, float] = {}
    start = time.monotonic()
    for i, n in enumerate(jobs):
        time.sleep(max(0.0, start + i / rate - time.monotonic()))
        published[f"job-{n}"] = time.time() * 1000
        queue.publish(Tick(TENANT, f"job-{n}", "bench"))
    return published


def read_lines(path: Path) -> list[tuple[str, float, float]]:
    """(job, tick begun, step recorded) per tick handled, in the order written."""
    if not path.exists():
        return []
    handled = []
    for line in path.read_text().splitlines():
        job, begun, recorded = line.split()
        handled.append((job, float(begun), float(recorded)))
    return handled


def wait_lines(path: Path, count: int, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while len(read_lines(path)) < count:
        if time.monotonic() > deadline:
            raise SystemExit(f"only {len(read_lines(path))} of {count} ticks were handled")
        time.sleep(0.05)


def check_all_completed(url: str, total: int) -> None:
    with Engine.open(registry=registry(), config=EngineConfig(store_url=url)) as engine:
        unfinished = [
            n
            for n in range(total)
            if engine.job(TENANT, f"job-{n}").status is not JobStatus.COMPLETED
        ]
    if unfinished:
        raise SystemExit(f"{len(unfinished)} jobs did not complete")


# ---- services --------------------------------------------------------------------------


@contextmanager
def fresh_schema(base_url: str) -> Iterator[str]:
    schema = f"bench_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(base_url, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {schema}")
    try:
        separator = "&" if "?" in base_url else "?"
        yield f"{base_url}{separator}schema={schema}"
    finally:
        with psycopg.connect(base_url, autocommit=True) as conn:
            conn.execute(f"DROP SCHEMA {schema} CASCADE")


@contextmanager
def kafka(given: str | None, say: Callable[[str], None] = note) -> Iterator[str]:
    found = (
        given
        or os.environ.get("JOBLEDGER_KAFKA_BOOTSTRAP_SERVERS")
        or os.environ.get("JOBLEDGER_TEST_KAFKA_BOOTSTRAP")
    )
    if found:
        yield found
        return
    data = tempfile.mkdtemp(prefix="bench-kafka-")
    env = {**os.environ, "PYTHON": sys.executable}
    say("starting a broker with scripts/kafka-local")
    script = str(ROOT / "scripts" / "kafka-local")
    started = subprocess.run(
        [script, "start", "--data-dir", data], env=env, capture_output=True, text=True
    )
    if started.returncode != 0:
        raise SystemExit(f"scripts/kafka-local start failed:\n{started.stderr}")
    try:
        yield started.stdout.strip().splitlines()[-1]
    finally:
        subprocess.run([script, "stop", "--data-dir", data], env=env, capture_output=True)
        shutil.rmtree(data, ignore_errors=True)


def postgres(given: str | None) -> str:
    found = given or os.environ.get("JOBLEDGER_TEST_POSTGRES_URL")
    if found:
        return found
    started = subprocess.run(
        [str(ROOT / "scripts" / "postgres-local")], capture_output=True, text=True
    )
    if started.returncode != 0:
        raise SystemExit(f"no PostgreSQL: scripts/postgres-local failed:\n{started.stderr}")
    return started.stdout.strip()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    parser.add_argument(
        "--warmup-ticks",
        type=int,
        default=20,
        help="untimed ticks first: the producer's and the workers' first connections",
    )
    parser.add_argument("--latency-ticks", type=int, default=500)
    parser.add_argument("--rate", type=float, default=50.0, help="latency phase ticks/s")
    parser.add_argument("--burst", type=int, default=3000)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--bootstrap", help="Kafka bootstrap servers")
    parser.add_argument("--postgres-url")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--quick", action="store_true", help="100 latency ticks, a burst of 500")
    parser.add_argument("--worker", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.quick:
        args.latency_ticks, args.burst = 100, 500
    if args.worker is not None:
        return worker_main(args.worker)
    logging.basicConfig(level=logging.ERROR)
    # kafka-python logs a harmless socket race on close at ERROR: keep the report clean.
    logging.getLogger("kafka").setLevel(logging.CRITICAL)
    pg = postgres(args.postgres_url)
    with kafka(args.bootstrap) as bootstrap:
        figures = [measure(n, args, bootstrap, pg) for n in args.workers]
    scaling = two_workers_over_one(figures)
    if args.json:
        report = {"figures": [asdict(f) for f in figures], "two_workers_over_one": scaling}
        print(json.dumps(report, indent=2))
        return 0
    print(f"Kafka tick latency and throughput on PostgreSQL ({os.cpu_count()} CPUs)")
    print(
        "workers  p50 ms  p95 ms  p99 ms  max ms  delivery p50  tick p50  (at rate/s)  "
        "burst ticks/s  load  targets"
    )
    for f in figures:
        targets = (
            f"p50 <= {TARGET_P50_MS} ms: {met(f.p50_ms <= TARGET_P50_MS)}; "
            f"p99 <= {TARGET_P99_MS} ms: {met(f.p99_ms <= TARGET_P99_MS)}"
        )
        print(
            f"{f.workers:>7}  {f.p50_ms:>6}  {f.p95_ms:>6}  {f.p99_ms:>6}  {f.max_ms:>6}  "
            f"{f.delivery_p50_ms:>12}  {f.tick_p50_ms:>8}  {f.rate_per_s:>11}  "
            f"{f.ticks_per_s:>13}  {f.load_average:>4}  {targets}"
        )
    if scaling is not None:
        judged = met(scaling >= TARGET_TWO_WORKERS)
        print(
            f"2 workers / 1 worker, burst ticks/s: {scaling:.2f}x "
            f"(>= {TARGET_TWO_WORKERS}x: {judged})"
        )
    return 0


def met(ok: bool) -> str:
    return "met" if ok else "NOT met"


def two_workers_over_one(figures: list[Figures]) -> float | None:
    """Two worker processes' burst ticks/s over one's, when both ran."""
    rates = {f.workers: f.ticks_per_s for f in figures}
    if 1 not in rates or 2 not in rates:
        return None
    return round(rates[2] / rates[1], 2)


if __name__ == "__main__":
    sys.exit(main())
