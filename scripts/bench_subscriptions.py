"""Subscriptions at scale: messages of your own topic turned into started jobs, per second,
by 1 and 2 worker processes sharing the consumer group, on SQLite and on PostgreSQL.

For each store and each worker-process count (default 1 and 2), on a fresh store and
fresh topics (the subscribed topic has ``--partitions`` partitions, default 12):

1. ``jobledger worker --transport kafka --processes N`` starts (the real command: one
   parent, N consumer-group members, each running ``--concurrency`` ticks at once) with
   one subscription set through ``JOBLEDGER_SUBSCRIPTIONS``: every message of the topic
   submits a job of a one-step workflow (a no-op agent step, then complete), its identity
   the message's position (the default). The script waits until the group is stable
   with N members, then sends ``--warmup`` messages untimed (the workers' first store
   connections and fetches) and waits for their jobs' first steps.
2. Latency: ``--latency-messages`` messages at ``--rate`` per second (open loop, each
   waiting for the broker's ack, so no queue builds up). For each message: the time of
   its job's first ``StepRecorded`` event minus the message's Kafka timestamp (set by
   the producer when it sent it, in whole ms): p50 and p99.
3. Throughput: ``--messages`` messages sent at once (async, one flush). Messages per
   second = messages / (the first of them made a job -> the last job's first step
   recorded), both read from the jobs' events: the window starts at the earliest
   ``Submitted`` of the burst (the first message consumed, its submit made durable)
   and ends at the latest first ``StepRecorded``. The burst's latencies are given too:
   they are mostly the queue the burst built.

Every figure is also a ratio to the raw single-row commit rate of the same database
measured in the same run (half the raw commits before the first run, half after the
last, as ``scripts/bench_steps.py`` does: far apart, the machine was noisy). The broker,
the database, the workers and this script share the machine: the report gives the load
average and the share of the CPUs busy during each burst.

Usage::

    . .venv/bin/activate
    python scripts/bench_subscriptions.py                       # both stores, 1 and 2 processes
    python scripts/bench_subscriptions.py --store postgres --messages 4000 --json
    python scripts/bench_subscriptions.py --quick               # a smoke run

Kafka: ``--bootstrap``, else JOBLEDGER_KAFKA_BOOTSTRAP_SERVERS or
JOBLEDGER_TEST_KAFKA_BOOTSTRAP, else a broker started for the run with
``scripts/kafka-local start --data-dir ...`` (and stopped after). PostgreSQL:
``--postgres-url``, else JOBLEDGER_TEST_POSTGRES_URL; without either it is skipped with a
message. Progress goes to stderr, the report (a table, or ``--json``) to stdout. The exit
status is 1 if a job did not complete, 0 otherwise.
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
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from kafka import KafkaAdminClient, KafkaProducer
from kafka.errors import KafkaError

from bench_kafka import kafka as broker
from bench_steps import (
    NOOP_EXECUTOR,
    CpuSample,
    Progress,
    RawBench,
    RawRun,
    chain_definition,
    cpu_busy,
    cpu_sample,
    fresh_schema,
    k_list,
    percentile,
    positive,
    raw_payload,
    raw_postgres,
    raw_sqlite,
    with_query,
)
from jobledger import Engine, EngineConfig, JobStatus
from jobledger.adapters.event_store import EventSourcedJobStore
from jobledger.adapters.kafka import KafkaSettings, ensure_topics
from jobledger.domain.subscription import Subscription
from jobledger.workflows import DefinitionRegistry, parse_definition

TENANT = "bench"
WORKFLOW = "one"
DEFINITION = chain_definition(1, WORKFLOW)
"""A no-op agent step, then complete: the job started is the one whose step is recorded."""
TARGET_TWO_PROCESSES = 1.7
"""Two worker processes' messages/s over one's (issue 25's aim for processes)."""
QUICK = {"messages": 60, "latency_messages": 10, "warmup": 4, "raw_rows": 200}


def note(message: str) -> None:
    print(f"bench_subscriptions: {message}", file=sys.stderr, flush=True)


# ---- one run: N worker processes on a fresh store and fresh topics ---------------------


@dataclass(frozen=True)
class Sent:
    """A message on the broker: where it is and its Kafka timestamp (ms)."""

    partition: int
    offset: int
    timestamp_ms: int


@dataclass
class Run:
    processes: int
    partitions_per_process: list[int]
    """How many of the subscribed topic's partitions each worker process was assigned."""
    messages: int
    seconds: float
    """The burst's first job made -> its last job's first step recorded."""
    messages_per_second: float
    burst_p50_ms: float
    burst_p99_ms: float
    latency_messages: int
    rate_per_s: float
    p50_ms: float
    """At ``rate``: Kafka timestamp -> the job's first StepRecorded."""
    p99_ms: float
    max_ms: float
    cpu_busy: float | None
    """The machine's CPUs busy over the burst (every process, the broker's and the
    database's too), 0 to 1; None where /proc/stat is missing."""
    incomplete_jobs: int
    ratio: float = 0.0
    """messages/s over the raw single-row commits/s of the same run."""


@dataclass(frozen=True)
class Topics:
    """One run's own topics and consumer group."""

    prefix: str
    bootstrap: str
    partitions: int

    @property
    def subscribed(self) -> str:
        return f"{self.prefix}.orders"

    @property
    def group(self) -> str:
        return f"{self.prefix}.workers"

    def fields(self) -> dict[str, Any]:
        return {
            "transport": "kafka",
            "kafka_bootstrap_servers": self.bootstrap,
            "kafka_ticks_topic": f"{self.prefix}.ticks",
            "kafka_ticks_dlq_topic": f"{self.prefix}.ticks.dlq",
            "kafka_signals_topic": f"{self.prefix}.signals",
            "kafka_signals_dlq_topic": f"{self.prefix}.signals.dlq",
            "kafka_events_topic": f"{self.prefix}.events",
            "kafka_group_id": self.group,
            "kafka_topic_partitions": self.partitions,
        }


def subscription_of(topics: Topics) -> Subscription:
    return Subscription(name="orders", topic=topics.subscribed, tenant=TENANT, workflow=WORKFLOW)


def worker_env(url: str, topics: Topics) -> dict[str, str]:
    """The worker processes' settings: the store, the topics, and the subscription as
    ``JOBLEDGER_SUBSCRIPTIONS`` (a JSON list), as an operator would set them."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("JOBLEDGER_")}
    env.update({f"JOBLEDGER_{k.upper()}": str(v) for k, v in topics.fields().items()})
    subscription = subscription_of(topics).model_dump(mode="json", exclude_none=True)
    env["JOBLEDGER_SUBSCRIPTIONS"] = json.dumps([subscription])
    env["JOBLEDGER_STORE_URL"] = url
    return env


def run_processes(
    url: str, label: str, count: int, args: argparse.Namespace, bootstrap: str
) -> Run:
    topics = Topics(f"benchsub{uuid.uuid4().hex[:8]}", bootstrap, args.partitions)
    subscription = subscription_of(topics)
    config = EngineConfig(store_url=url, subscriptions=[subscription], **topics.fields())
    ensure_topics(KafkaSettings.of(config))  # every topic with --partitions partitions
    home = Path(tempfile.mkdtemp(prefix="jobledger-bench-subs-", dir=args.dir))
    try:
        (home / "definitions").mkdir()
        (home / "definitions" / "one.yaml").write_text(DEFINITION)
        (home / "bench_noop.py").write_text(NOOP_EXECUTOR)
        (home / "jobledger.toml").write_text(
            'definitions = "definitions"\nexecutor = "bench_noop:Noop"\n'
            f"concurrency = {args.concurrency}\n"
        )
        registry = DefinitionRegistry([parse_definition(DEFINITION, "one.yaml")])
        with Engine.open(url, registry=registry) as engine:
            return time_processes(engine, url, label, count, args, topics, home)
    finally:
        shutil.rmtree(home, ignore_errors=True)
        delete_topics(bootstrap, KafkaSettings.of(config).topics)


def time_processes(
    engine: Engine,
    url: str,
    label: str,
    count: int,
    args: argparse.Namespace,
    topics: Topics,
    home: Path,
) -> Run:
    subscription = subscription_of(topics)
    command = [sys.executable, "-m", "jobledger", "worker", "--transport", "kafka"]
    command += ["--processes", str(count), "--config", str(home / "jobledger.toml")]
    command += ["--log-level", "warning"]
    env = worker_env(url, topics)
    producer = KafkaProducer(bootstrap_servers=topics.bootstrap, acks="all", linger_ms=5)
    with (home / "worker.log").open("wb") as log:
        parent = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=home)
    try:
        shares = wait_group(topics, count, parent, home)
        started = Started(engine, parent, home)
        note(f"{label}, {count} process(es): {args.warmup} warm-up messages, not timed")
        warm = [send(producer, topics, n) for n in range(args.warmup)]
        started.wait(warm, f"{label}: warm-up")
        note(f"{label}, {count} process(es): {args.latency_messages} messages at {args.rate}/s")
        steady = send_at_rate(producer, topics, args.latency_messages, args.rate)
        started.wait(steady, f"{label}: at {args.rate}/s")
        burst = send_burst(producer, topics, args.messages)
        cpu = started.wait(burst, f"{label}: {count} process(es), burst")
    finally:
        producer.close()
        parent.send_signal(signal.SIGTERM)
        parent.wait(timeout=120)
    return figures(engine, subscription, count, args, (steady, burst), cpu, shares)


def figures(
    engine: Engine,
    subscription: Subscription,
    count: int,
    args: argparse.Namespace,
    sent: tuple[list[Sent], list[Sent]],
    cpu: list[CpuSample],
    shares: list[int],
) -> Run:
    steady, burst = sent
    at_rate = [moments(engine, subscription, each) for each in steady]
    timed = [moments(engine, subscription, each) for each in burst]
    begun = min(submitted for submitted, _ in timed)
    ended = max(first_step for _, first_step in timed)
    ms = latencies_ms(steady, at_rate)
    queued = latencies_ms(burst, timed)
    incomplete = sum(
        1
        for sent in [*steady, *burst]
        if engine.job(TENANT, job_id(subscription, sent)).status is not JobStatus.COMPLETED
    )
    return Run(
        processes=count,
        partitions_per_process=shares,
        messages=len(burst),
        seconds=ended - begun,
        messages_per_second=len(burst) / (ended - begun),
        burst_p50_ms=percentile(queued, 0.50),
        burst_p99_ms=percentile(queued, 0.99),
        latency_messages=len(steady),
        rate_per_s=args.rate,
        p50_ms=percentile(ms, 0.50),
        p99_ms=percentile(ms, 0.99),
        max_ms=max(ms),
        cpu_busy=cpu_busy(cpu, begun, ended),
        incomplete_jobs=incomplete,
    )


def latencies_ms(sent: list[Sent], moments: list[tuple[float, float]]) -> list[float]:
    """Each message's Kafka timestamp -> its job's first step recorded, in ms."""
    return [
        1000 * first_step - each.timestamp_ms
        for each, (_, first_step) in zip(sent, moments, strict=True)
    ]


def job_id(subscription: Subscription, sent: Sent) -> str:
    """The job a message made: the derived id of its position (the subscription sets
    neither a job id nor a business key)."""
    return subscription.derived_job_id(f"{subscription.topic}:{sent.partition}:{sent.offset}")


def moments(engine: Engine, subscription: Subscription, sent: Sent) -> tuple[float, float]:
    """(submitted, first step recorded) of the message's job: its events' own times, in
    seconds since the epoch."""
    history = engine.history(TENANT, job_id(subscription, sent))
    submitted = next(e.timestamp for e in history if e.event_type == "Submitted")
    first_step = next(e.timestamp for e in history if e.event_type == "StepRecorded")
    return submitted.timestamp(), first_step.timestamp()


# ---- sending -----------------------------------------------------------------------------


def send(producer: KafkaProducer, topics: Topics, n: int) -> Sent:
    """One message, once the broker acknowledged it."""
    future = producer.send(topics.subscribed, key=f"order-{n}".encode(), value=order(n))
    return sent_of(future.get(timeout=30))


def order(n: int) -> bytes:
    return json.dumps({"order": f"o-{n}", "amount": n % 100, "lines": [{"sku": "lamp"}]}).encode()


def sent_of(metadata: Any) -> Sent:
    return Sent(metadata.partition, metadata.offset, metadata.timestamp)


def send_at_rate(producer: KafkaProducer, topics: Topics, count: int, rate: float) -> list[Sent]:
    """Open loop: message i is sent at start + i / rate, each waiting for its ack."""
    sent = []
    start = time.monotonic()
    for i in range(count):
        time.sleep(max(0.0, start + i / rate - time.monotonic()))
        sent.append(send(producer, topics, i))
    return sent


def send_burst(producer: KafkaProducer, topics: Topics, count: int) -> list[Sent]:
    futures = [
        producer.send(topics.subscribed, key=f"order-{n}".encode(), value=order(n))
        for n in range(count)
    ]
    producer.flush()
    return [sent_of(future.get(timeout=30)) for future in futures]


# ---- waiting -----------------------------------------------------------------------------


def wait_group(
    topics: Topics, members: int, parent: subprocess.Popen[bytes], home: Path, timeout: float = 120
) -> list[int]:
    """Until the consumer group is stable with ``members`` members (every worker process
    has its partitions: a member joining later would move them mid-burst); then how many
    of the subscribed topic's partitions each member has, fewest first."""
    admin = KafkaAdminClient(bootstrap_servers=topics.bootstrap)
    deadline = time.monotonic() + timeout
    try:
        while True:
            group = described(admin, topics.group)
            joined = group.get("members", [])
            if group.get("group_state") == "Stable" and len(joined) == members:
                return sorted(subscribed_partitions(member, topics) for member in joined)
            if parent.poll() is not None:
                raise SystemExit(f"the workers exited: {(home / 'worker.log').read_text()[-2000:]}")
            if time.monotonic() > deadline:
                raise SystemExit(f"the group did not reach {members} members: {group}")
            time.sleep(0.2)
    finally:
        admin.close()


def described(admin: KafkaAdminClient, group: str) -> dict[str, Any]:
    """The group as the broker describes it; empty while its coordinator is not ready (a
    broker just started has not made its offsets topic yet)."""
    try:
        found: dict[str, Any] = admin.describe_groups([group]).get(group, {})
    except KafkaError:
        return {}
    return found


def subscribed_partitions(member: dict[str, Any], topics: Topics) -> int:
    assigned = member["member_assignment"]["assigned_partitions"]
    return sum(len(a["partitions"]) for a in assigned if a["topic"] == topics.subscribed)


class Started:
    """Counts the jobs whose first step is recorded, asking the events tables."""

    def __init__(self, engine: Engine, parent: subprocess.Popen[bytes], home: Path) -> None:
        assert isinstance(engine.store, EventSourcedJobStore)
        self.backend = engine.store.backend
        self.tables = [self.backend.table(p.events_table) for p in engine.store.partitions]
        self.parent = parent
        self.home = home
        self.before = 0

    def count(self) -> int:
        return sum(
            int(row["n"])
            for table in self.tables
            for row in self.backend.fetch(
                f"SELECT count(DISTINCT originator_id) AS n FROM {table} WHERE topic LIKE :step",
                {"step": "%.StepRecorded"},
            )
        )

    def wait(self, sent: list[Sent], label: str, timeout: float = 600) -> list[CpuSample]:
        """Until every message sent has its job's first step; the CPU sampled meanwhile."""
        target = self.before + len(sent)
        samples: list[CpuSample] = []
        deadline = time.monotonic() + timeout
        with Progress(label, len(sent)) as progress:
            while (done := self.count()) < target:
                progress.update(done - self.before)
                if (sample := cpu_sample()) is not None:
                    samples.append(sample)
                if self.parent.poll() is not None:
                    log = (self.home / "worker.log").read_text()[-2000:]
                    raise SystemExit(f"the workers exited {self.parent.returncode}: {log}")
                if time.monotonic() > deadline:
                    raise SystemExit(f"{label}: only {done - self.before} of {len(sent)} started")
                time.sleep(0.05)
            progress.update(done - self.before)
        if (sample := cpu_sample()) is not None:
            samples.append(sample)
        self.before = target
        return samples


def delete_topics(bootstrap: str, names: list[str]) -> None:
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        admin.delete_topics(names)
    except Exception:
        pass  # best effort: a broker the run started is thrown away anyway
    finally:
        admin.close()


# ---- per store ---------------------------------------------------------------------------


@dataclass
class StoreResult:
    store: str
    raw: RawRun
    partitions: int
    concurrency: int
    runs: list[Run]
    two_vs_one: float | None
    """Two processes' messages/s over one's (None unless both ran)."""
    target: float
    load_average: tuple[float, float, float]
    cpus: int


def measure(
    urls: Callable[[], AbstractContextManager[str]],
    label: str,
    raw: RawBench,
    args: argparse.Namespace,
    bootstrap: str,
) -> StoreResult:
    """Each process count on a fresh store (``urls()``), between the raw commits' halves."""
    load = os.getloadavg()
    state = raw_payload(815)  # a stored step's size (issue 25's measure)
    topic = "jobledger.job:Job.StepRecorded"
    half = args.raw_rows // 2
    before = raw(half, state, topic)
    runs = []
    for count in args.workers:
        with urls() as url:
            runs.append(run_processes(url, label, count, args, bootstrap))
    after = raw(args.raw_rows - half, state, topic)
    raw_run = RawRun.of(args.raw_rows, state, before, after)
    for each in runs:
        each.ratio = each.messages_per_second / raw_run.commits_per_second
    rates = {each.processes: each.messages_per_second for each in runs}
    return StoreResult(
        store=label,
        raw=raw_run,
        partitions=args.partitions,
        concurrency=args.concurrency,
        runs=runs,
        two_vs_one=rates[2] / rates[1] if {1, 2} <= rates.keys() else None,
        target=TARGET_TWO_PROCESSES,
        load_average=load,
        cpus=os.cpu_count() or 1,
    )


def measure_sqlite(args: argparse.Namespace, bootstrap: str) -> StoreResult:
    directory = Path(tempfile.mkdtemp(prefix="jobledger-bench-", dir=args.dir))
    files = iter(range(1_000))

    @contextmanager
    def urls() -> Iterator[str]:
        yield f"sqlite:///{directory / f'subs-{next(files)}.db'}"

    try:
        return measure(urls, "sqlite", raw_sqlite(directory / "raw.db"), args, bootstrap)
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def measure_postgres(args: argparse.Namespace, base_url: str, bootstrap: str) -> StoreResult:
    @contextmanager
    def urls() -> Iterator[str]:
        with fresh_schema(base_url) as schema:
            yield with_query(base_url, schema=schema)

    with fresh_schema(base_url) as raw_schema:
        raw = raw_postgres(base_url, raw_schema)
        return measure(urls, "postgres", raw, args, bootstrap)


# ---- output ------------------------------------------------------------------------------


def print_text(results: list[StoreResult]) -> None:
    for r in results:
        load = ", ".join(f"{x:.2f}" for x in r.load_average)
        print(
            f"\n== {r.store}: subscribed messages -> started jobs ({r.partitions} partitions, "
            f"concurrency {r.concurrency} a process; load {load} on {r.cpus} CPUs)\n"
            f"raw: {r.raw.commits_per_second:,.0f} single-row commits/s "
            f"({r.raw.before_per_second:,.0f}/s before, {r.raw.after_per_second:,.0f}/s after)"
        )
        print(
            f"{'processes':>9}{'partitions':>12}{'messages':>10}{'seconds':>9}{'msgs/s':>9}"
            f"{'x raw':>7}{'p50 ms':>9}{'p99 ms':>9}{'(at /s)':>9}{'burst p50':>11}"
            f"{'burst p99':>11}{'CPUs busy':>11}"
        )
        for run in r.runs:
            busy = "-" if run.cpu_busy is None else f"{100 * run.cpu_busy:.0f} %"
            shares = "+".join(map(str, run.partitions_per_process))
            print(
                f"{run.processes:>9}{shares:>12}{run.messages:>10}{run.seconds:>9.2f}"
                f"{run.messages_per_second:>9,.0f}{run.ratio:>7.2f}{run.p50_ms:>9.1f}"
                f"{run.p99_ms:>9.1f}{run.rate_per_s:>9g}{run.burst_p50_ms:>11,.0f}"
                f"{run.burst_p99_ms:>11,.0f}{busy:>11}"
            )
        if r.two_vs_one is not None:
            met = "met" if r.two_vs_one >= r.target else "NOT met"
            print(f"2 processes / 1: {r.two_vs_one:.2f}x ({met}: >= {r.target})")


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--store", choices=("sqlite", "postgres", "both"), default="both")
    parser.add_argument(
        "--workers",
        type=k_list,
        default=[1, 2],
        metavar="N,N,...",
        help="worker processes of each run (default 1,2)",
    )
    parser.add_argument(
        "--messages", type=positive, default=2000, help="the burst's messages (default 2000)"
    )
    parser.add_argument(
        "--latency-messages",
        type=positive,
        default=200,
        help="messages sent at --rate for the latency (default 200)",
    )
    parser.add_argument(
        "--rate", type=float, default=20.0, help="the latency phase's messages/s (default 20)"
    )
    parser.add_argument(
        "--warmup", type=positive, default=20, help="untimed messages first (default 20)"
    )
    parser.add_argument(
        "--partitions",
        type=positive,
        default=12,
        help="partitions of the subscribed topic (and the run's other topics; default 12)",
    )
    parser.add_argument(
        "--concurrency", type=positive, default=16, help="ticks at once a process (default 16)"
    )
    parser.add_argument(
        "--raw-rows", type=positive, default=2000, help="raw baseline commits (default 2000)"
    )
    parser.add_argument("--bootstrap", help="Kafka bootstrap servers (else a broker is started)")
    parser.add_argument(
        "--postgres-url",
        default=os.environ.get("JOBLEDGER_TEST_POSTGRES_URL"),
        help="default: $JOBLEDGER_TEST_POSTGRES_URL",
    )
    parser.add_argument("--dir", help="where the SQLite temp files go (default: system temp)")
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    parser.add_argument(
        "--quick",
        action="store_true",
        help=f"a smoke run ({QUICK['messages']} messages, noisy figures)",
    )
    args = parser.parse_args(argv)
    if args.quick:
        for name, value in QUICK.items():
            setattr(args, name, value)
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.ERROR)
    # kafka-python logs a harmless socket race on close at ERROR: keep the report clean.
    logging.getLogger("kafka").setLevel(logging.CRITICAL)
    results: list[StoreResult] = []
    skipped: dict[str, str] = {}
    with broker(args.bootstrap, say=note) as bootstrap:
        if args.store in ("sqlite", "both"):
            results.append(measure_sqlite(args, bootstrap))
        if args.store in ("postgres", "both"):
            if args.postgres_url:
                results.append(measure_postgres(args, args.postgres_url, bootstrap))
            else:
                skipped["postgres"] = "no --postgres-url and JOBLEDGER_TEST_POSTGRES_URL is unset"
                note(f"postgres: skipped ({skipped['postgres']})")
    if args.json:
        report = {"quick": args.quick, "results": [asdict(r) for r in results], "skipped": skipped}
        print(json.dumps(report, indent=2))
    else:
        print_text(results)
    return 1 if any(run.incomplete_jobs for r in results for run in r.runs) else 0


if __name__ == "__main__":
    sys.exit(main())
