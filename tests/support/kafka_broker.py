"""Kafka for the tests: ONE real broker per test run, per-test topics, and readers.

``kafka_bootstrap`` (session) uses JOBLEDGER_TEST_KAFKA_BOOTSTRAP when it is set (what
scripts/test exports), otherwise starts a broker with scripts/kafka-local for this run
and stops it at the end. A broker that cannot start skips the Kafka tests locally; in CI
(CI=true or JOBLEDGER_REQUIRE_SERVICES=1) it fails them.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import pytest
from kafka import KafkaAdminClient, KafkaConsumer, TopicPartition

from jobledger.adapters.kafka import KafkaSettings, ensure_topics
from jobledger.adapters.kafka.worker import KafkaWorker
from tests.support import ROOT

KAFKA_LOCAL = ROOT / "scripts" / "kafka-local"
REQUIRED = os.environ.get("JOBLEDGER_REQUIRE_SERVICES") == "1" or os.environ.get("CI") == "true"
PARTITIONS = 4

# kafka-python is chatty about the moments a fresh topic or group is not ready yet.
logging.getLogger("kafka").setLevel(logging.ERROR)


def _unavailable(message: str) -> None:
    if REQUIRED:
        pytest.fail(f"Kafka is required here (CI): {message}", pytrace=False)
    pytest.skip(f"Kafka unavailable: {message}")


def _reachable(bootstrap: str) -> str | None:
    try:
        client = KafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=10_000)
    except Exception as error:
        return repr(error)
    try:
        client.list_topics()
    except Exception as error:
        return repr(error)
    finally:
        client.close()
    return None


@pytest.fixture(scope="session")
def kafka_bootstrap(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    unavailable = os.environ.get("JOBLEDGER_TEST_KAFKA_UNAVAILABLE")
    if unavailable:  # scripts/test already tried and said why
        _unavailable(unavailable)
    given = os.environ.get("JOBLEDGER_TEST_KAFKA_BOOTSTRAP")
    if given:
        problem = _reachable(given)
        if problem is not None:
            _unavailable(f"JOBLEDGER_TEST_KAFKA_BOOTSTRAP={given} is not reachable: {problem}")
        yield given
        return
    data_dir = tmp_path_factory.mktemp("kafka")
    env = {**os.environ, "PYTHON": sys.executable}
    command = [str(KAFKA_LOCAL), "start", "--data-dir", str(data_dir)]
    try:
        started = subprocess.run(command, capture_output=True, text=True, env=env, timeout=900)
    except (OSError, subprocess.TimeoutExpired) as error:
        _unavailable(f"scripts/kafka-local start: {error!r}")
        raise AssertionError("unreachable") from error
    if started.returncode != 0 or not started.stdout.strip():
        _unavailable(
            f"scripts/kafka-local start exited {started.returncode}:\n{started.stderr[-4000:]}"
        )
    bootstrap = started.stdout.strip().splitlines()[-1]
    try:
        yield bootstrap
    finally:
        subprocess.run(
            [str(KAFKA_LOCAL), "stop", "--data-dir", str(data_dir)],
            capture_output=True,
            env=env,
            timeout=120,
        )


@dataclass(frozen=True)
class KafkaTopics:
    """One test's own topics and consumer group on the shared broker."""

    bootstrap: str
    prefix: str

    @property
    def ticks(self) -> str:
        return f"{self.prefix}.ticks"

    @property
    def ticks_dlq(self) -> str:
        return f"{self.prefix}.ticks.dlq"

    @property
    def signals(self) -> str:
        return f"{self.prefix}.signals"

    @property
    def signals_dlq(self) -> str:
        return f"{self.prefix}.signals.dlq"

    @property
    def events(self) -> str:
        return f"{self.prefix}.events"

    @property
    def group(self) -> str:
        return f"{self.prefix}.workers"

    def config(self) -> dict[str, Any]:
        """EngineConfig fields for this test's topics."""
        return {
            "transport": "kafka",
            "kafka_bootstrap_servers": self.bootstrap,
            "kafka_ticks_topic": self.ticks,
            "kafka_ticks_dlq_topic": self.ticks_dlq,
            "kafka_signals_topic": self.signals,
            "kafka_signals_dlq_topic": self.signals_dlq,
            "kafka_events_topic": self.events,
            "kafka_group_id": self.group,
            "kafka_topic_partitions": PARTITIONS,
            "kafka_session_timeout_ms": 6_000,
        }

    def env(self) -> dict[str, str]:
        """The same, as JOBLEDGER_* variables for a worker process."""
        return {f"JOBLEDGER_{k.upper()}": str(v) for k, v in self.config().items()}

    def settings(self) -> KafkaSettings:
        return KafkaSettings(
            bootstrap_servers=self.bootstrap,
            ticks_topic=self.ticks,
            ticks_dlq_topic=self.ticks_dlq,
            signals_topic=self.signals,
            signals_dlq_topic=self.signals_dlq,
            events_topic=self.events,
            group_id=self.group,
            topic_partitions=PARTITIONS,
            session_timeout_ms=6_000,
            worker_id="test",
        )


@pytest.fixture
def kafka_topics(kafka_bootstrap: str) -> Iterator[KafkaTopics]:
    topics = KafkaTopics(kafka_bootstrap, f"t{uuid.uuid4().hex[:10]}")
    ensure_topics(topics.settings())
    yield topics
    admin = KafkaAdminClient(bootstrap_servers=kafka_bootstrap)
    try:
        admin.delete_topics(topics.settings().topics, raise_errors=False)
    except Exception:
        pass  # best effort: the broker is thrown away at the end of the run
    finally:
        admin.close()


# ---- reading what is on the broker ---------------------------------------------------


def read_topic(bootstrap: str, topic: str, *, at_least: int = 0, timeout: float = 30) -> list[Any]:
    """Every record on ``topic`` from the beginning (waiting until there are at least
    ``at_least``), in partition order then offset order."""
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
    try:
        partitions = [TopicPartition(topic, p) for p in consumer.partitions_for_topic(topic)]
        consumer.assign(partitions)
        consumer.seek_to_beginning(*partitions)
        records: list[Any] = []
        deadline = time.monotonic() + timeout
        while True:
            ends = consumer.end_offsets(partitions)
            while any(consumer.position(tp) < ends[tp] for tp in partitions):
                for batch in consumer.poll(timeout_ms=500).values():
                    records.extend(batch)
                if time.monotonic() > deadline:
                    break
            if len(records) >= at_least or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        return sorted(records, key=lambda r: (r.partition, r.offset))
    finally:
        consumer.close()


def end_offsets(bootstrap: str, topic: str) -> dict[int, int]:
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
    try:
        partitions = [TopicPartition(topic, p) for p in consumer.partitions_for_topic(topic)]
        return {tp.partition: offset for tp, offset in consumer.end_offsets(partitions).items()}
    finally:
        consumer.close()


def committed_offsets(bootstrap: str, group: str, topic: str) -> dict[int, int]:
    """The group's committed offset per partition of ``topic`` (0 where none)."""
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        offsets = admin.list_group_offsets(group).get(group, {})
    finally:
        admin.close()
    found = {tp.partition: meta.offset for tp, meta in offsets.items() if tp.topic == topic}
    return {p: max(0, found.get(p, 0)) for p in range(PARTITIONS)}


def headers(record: Any) -> dict[str, str]:
    return {name: value.decode() for name, value in record.headers or []}


def wait_for(condition: Any, timeout: float, message: str, interval: float = 0.1) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s: {message}")
        time.sleep(interval)


@contextmanager
def running(worker: KafkaWorker) -> Iterator[KafkaWorker]:
    """The worker polling on a thread of its own; stopped, and its thread gone, after."""
    thread = threading.Thread(target=worker.run, daemon=True)
    thread.start()
    try:
        yield worker
    finally:
        worker.stop()
        thread.join(timeout=30)
        assert not thread.is_alive()
