"""Metrics scraped from running processes (issue 14): ``jobledger run --metrics-port 0``
while jobs run, the other long-running commands' ports, and what only Kafka shows: the
workers' consumer lag, dead-lettered messages and the outbox's lag, on a real broker.
On SQLite and PostgreSQL."""

from __future__ import annotations

import signal
import subprocess
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from kafka import KafkaProducer

from jobledger import EngineConfig, StepRequest, StepResult, Tick
from jobledger.adapters.kafka import job_key
from jobledger.adapters.kafka.messages import encode_tick
from jobledger.adapters.kafka.publisher import KafkaEventPublisher
from jobledger.adapters.kafka.worker import KafkaWorker
from jobledger.adapters.metrics import Metrics
from jobledger.adapters.ops import MemoryOps
from jobledger.projections.outbox import Outbox
from tests.support.cli import JOBLEDGER, Cli, announced, make_cli
from tests.support.engines import TOKEN_SECRET, default_registry, open_engine
from tests.support.kafka_broker import KafkaTopics, wait_for
from tests.support.scrape import Samples, names, parse, scrape, total, value

TENANT = "acme"


@pytest.fixture
def cli(tmp_path: Path, store_url: str) -> Cli:
    return make_cli(tmp_path, store_url)


@contextmanager
def serving(cli: Cli, *command: str) -> Iterator[tuple[subprocess.Popen[str], str]]:
    """``jobledger COMMAND --metrics-port 0``, and the URL it says it serves metrics at."""
    process = subprocess.Popen(
        [str(JOBLEDGER), *command, "--metrics-port", "0", "--config", str(cli.config)],
        cwd=cli.tmp,
        env={**cli.env, "PYTHONUNBUFFERED": "1"},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        yield process, metrics_url(process)
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate(timeout=30)


def metrics_url(process: subprocess.Popen[str]) -> str:
    pattern = r"metrics: (http://127\.0\.0\.1:\d+/metrics)"
    return announced(process, pattern, "the process did not say where it serves metrics")


def stopped(process: subprocess.Popen[str]) -> None:
    process.send_signal(signal.SIGTERM)
    _, err = process.communicate(timeout=60)
    assert process.returncode == 0, err


def scraped_until(url: str, holds: Callable[[Samples], bool], what: str) -> Samples:
    found: list[Samples] = []

    def check() -> bool:
        found[:] = [scrape(url)]
        return holds(found[0])

    wait_for(check, 60, what, interval=0.2)
    return found[0]


def test_a_running_runner_s_metrics_move_while_jobs_run(cli: Cli) -> None:
    with serving(cli, "run") as (process, url):
        before = scrape(url)
        assert value(before, "jobledger_steps_total", workflow="ticket", outcome="completed") == 0
        for n in range(3):
            cli.ok("submit", TENANT, f"t{n}", "ticket")
        # Each ticket runs its triage and opens its payment wait.
        s = scraped_until(
            url,
            lambda s: value(s, "jobledger_jobs", status="waiting_event") == 3,
            "three tickets waiting for payment, in the status view",
        )
        assert value(s, "jobledger_steps_total", workflow="ticket", outcome="completed") == 6
        assert value(s, "jobledger_step_duration_seconds_count", workflow="ticket") == 6
        assert value(s, "jobledger_cost_usd_total") == pytest.approx(0.3)
        assert total(s, "jobledger_ticks_total") >= 3
        assert value(s, "jobledger_reconciler_pass_duration_seconds_count") >= 1
        # Submitted by another process: the reconciler found their ticks lost.
        assert value(s, "jobledger_reconciler_enqueued_jobs_total") >= 3
        assert value(s, "jobledger_jobs_ready") == 0
        assert "jobledger_projection_lag_seconds" in names(s)

        cli.ok("signal", TENANT, "t0", "invoice.paid", "--id", "paid-t0")
        s = scraped_until(
            url,
            lambda s: value(s, "jobledger_jobs", status="awaiting_approval") == 1,
            "t0 paid and awaiting its approval",
        )
        assert value(s, "jobledger_steps_total", workflow="ticket", outcome="completed") == 7
        stopped(process)


@pytest.mark.parametrize(
    ("command", "family"),
    [
        (("worker",), "jobledger_jobs"),
        (("projections", "run"), "jobledger_projection_lag_events"),
        (("reconcile",), "jobledger_reconciler_pass_duration_seconds_count"),
    ],
)
def test_each_long_running_command_serves_its_metrics(
    cli: Cli, command: tuple[str, ...], family: str
) -> None:
    cli.ok("submit", TENANT, "t", "ticket")
    with serving(cli, *command) as (process, url):
        scraped_until(url, lambda s: family in names(s), f"{family} served")
        stopped(process)


def test_metrics_are_not_served_by_one_reconcile_pass(cli: Cli) -> None:
    error = cli.fails(2, "reconcile", "--once", "--metrics-port", "0")
    assert "--metrics-port" in error and "--once" in error


# ---- Kafka: consumer lag, the dead-letter topic and the outbox ---------------------------


class Gate:
    """Holds the job named ``held`` in its first step until opened."""

    def __init__(self, held: str) -> None:
        self.held = held
        self.opened = threading.Event()
        self.entered = threading.Event()

    def execute(self, request: StepRequest) -> StepResult:
        if request.job.job_id == self.held:
            self.entered.set()
            assert self.opened.wait(60)
        return StepResult(cost_usd="0.05")


def test_consumer_lag_dead_letters_and_outbox_lag_on_a_real_broker(
    store_url: str, kafka_topics: KafkaTopics
) -> None:
    gate = Gate("slow")
    config = EngineConfig(
        store_url=store_url, token_secret=TOKEN_SECRET, worker_id="w0", **kafka_topics.config()
    )
    engine = open_engine(
        registry=default_registry(), executor=gate, config=config, ops=MemoryOps(), metrics=True
    )
    metrics = engine.deps.metrics
    assert isinstance(metrics, Metrics)
    engine.submit(TENANT, "slow", "agent3")  # its tick is on the ticks topic
    raw = KafkaProducer(bootstrap_servers=kafka_topics.bootstrap)
    ghost = encode_tick(Tick(TENANT, "ghost"), dedupe_key=None, enqueued_at_ms=0)
    for value_ in (b"{not json", ghost, ghost):  # behind the slow job, on its partition
        raw.send(kafka_topics.ticks, key=job_key(TENANT, "slow"), value=value_)
    raw.flush()
    raw.close()

    worker = KafkaWorker(engine, kafka_topics.settings())
    metrics.watch_consumers([worker], kafka_topics.group, {})
    thread = threading.Thread(target=worker.run, daemon=True)
    thread.start()
    try:
        assert gate.entered.wait(60), "the slow job never started"
        s = scraped_until_local(
            metrics, lambda s: total(s, "jobledger_kafka_consumer_lag") == 4, "the lag of 4"
        )
        lagging = [
            dict(labels)
            for (name, labels), v in s.items()
            if name == "jobledger_kafka_consumer_lag" and v == 4
        ]
        assert [(lag["topic"], lag["group"]) for lag in lagging] == [
            (kafka_topics.ticks, kafka_topics.group)
        ]
        gate.opened.set()
        s = scraped_until_local(
            metrics,
            lambda s: (
                total(s, "jobledger_dlq_messages_total") == 3
                and total(s, "jobledger_kafka_consumer_lag") == 0
            ),
            "the poison dead-lettered and the partition caught up",
        )
        ticks = kafka_topics.ticks
        assert value(s, "jobledger_dlq_messages_total", topic=ticks, reason="not_json") == 1
        assert value(s, "jobledger_dlq_messages_total", topic=ticks, reason="unknown_job") == 2
    finally:
        gate.opened.set()
        worker.stop()
        thread.join(timeout=30)

    publisher = KafkaEventPublisher(kafka_topics.settings())
    outbox = Outbox(engine.deps.store, publisher)
    metrics.watch_log_reader("outbox", outbox)
    s = parse(metrics.render().decode())
    written = sum(lag.last_event for lag in outbox.lag())
    assert total(s, "jobledger_projection_lag_events", reader="outbox") == written > 0
    assert total(s, "jobledger_projection_lag_seconds", reader="outbox") > 0
    outbox.publish_pending()
    s = parse(metrics.render().decode())
    assert total(s, "jobledger_projection_lag_events", reader="outbox") == 0
    assert total(s, "jobledger_projection_lag_seconds", reader="outbox") == 0
    publisher.close()
    engine.close()


def scraped_until_local(metrics: Metrics, holds: Callable[[Samples], bool], what: str) -> Samples:
    found: list[Samples] = []

    def check() -> bool:
        found[:] = [parse(metrics.render().decode())]
        return holds(found[0])

    wait_for(check, 60, what, interval=0.1)
    return found[0]
