"""Anchor lines on a Kafka topic (``jobledger.anchors``): outside the hands of whoever
operates the store.

The topic has ONE partition: anchor lines are a chain (each carries the sha256 of the line
before it), and Kafka orders records only within a partition, so the line a writer
chains to (the topic's last record) and the order a verifier reads back must be the same
single sequence. Records are kept forever (``retention.ms=-1``): an anchor that ages out
is an anchor a rollback no longer meets. A line counts as anchored only once every
in-sync replica acknowledged it (acks=all, and ``min.insync.replicas`` set so that with a
replication factor of 3 two copies must hold it).
"""

from __future__ import annotations

import time
from typing import Any

from kafka import KafkaAdminClient, KafkaConsumer, TopicPartition
from kafka.errors import KafkaError

from jobledger.adapters.kafka import clients
from jobledger.adapters.kafka.clients import KafkaUnavailableError
from jobledger.adapters.kafka.settings import KafkaSettings

MAX_LINE_BYTES = 64 * 1024 * 1024
"""A line holds every job's head (about 170 bytes each): Kafka's default 1 MB limit would
refuse an anchor of some 6,000 jobs; this topic takes about 390,000."""
TAIL_WINDOW = 1
"""How many records before the end ``last_line`` reads first: lines can be megabytes. It
reads further back only if those are all control records (a transactional writer's)."""


class KafkaAnchorSink:
    """Appends each anchor line as one record of the single-partition anchors topic."""

    def __init__(self, settings: KafkaSettings, topic: str) -> None:
        self.settings = settings
        self.topic = topic
        self.name = f"kafka://{settings.bootstrap_servers}/{topic}"
        self._partition = TopicPartition(topic, 0)

    def ensure_topic(self) -> None:
        """Create the topic if it is missing; refuse one with more than one partition
        (its records would have no single order to chain)."""
        try:
            # Not clients.admin: a broker that is away must fail an anchor within the send
            # timeout, not kafka-python's 30 s bootstrap.
            admin = KafkaAdminClient(
                bootstrap_servers=self.settings.servers,
                client_id=f"{self.settings.client_id}-anchors",
                **clients.reach_timeouts(self.settings),
            )
        except KafkaError as error:
            raise _unreachable(self.settings, error) from error
        try:
            if self.topic not in set(admin.list_topics()):
                replication = self.settings.replication_factor
                spec = {
                    self.topic: {
                        "num_partitions": 1,
                        "replication_factor": replication,
                        "configs": {
                            "retention.ms": "-1",
                            "retention.bytes": "-1",
                            "cleanup.policy": "delete",
                            "min.insync.replicas": str(max(1, replication - 1)),
                            "max.message.bytes": str(MAX_LINE_BYTES),
                        },
                    }
                }
                # Another process may create it at the same moment: already-exists is fine.
                admin.create_topics(spec, raise_errors=False)
                admin.wait_for_topics([self.topic], timeout_ms=30_000)
            partitions = admin.describe_topics([self.topic])[0]["partitions"]
        except KafkaError as error:
            raise KafkaUnavailableError(
                f"cannot create or describe the anchors topic {self.topic!r}: {error!r}"
            ) from error
        finally:
            admin.close()
        if len(partitions) != 1:
            raise KafkaUnavailableError(
                f"the anchors topic {self.topic!r} has {len(partitions)} partitions; anchors "
                "need exactly one (their chain needs one order)"
            )

    def append(self, line: str) -> None:
        """Publish the line and wait for its acknowledgement by every in-sync replica."""
        timeout = self.settings.send_timeout_ms / 1000
        producer = clients.producer(self.settings, role="anchors", max_request_size=MAX_LINE_BYTES)
        try:
            future = producer.send(self.topic, value=line.rstrip("\n").encode(), partition=0)
            producer.flush(timeout=timeout)
            future.get(timeout=timeout)
        except KafkaError as error:
            raise KafkaUnavailableError(
                f"anchor not acknowledged by Kafka on {self.name}: {error!r}"
            ) from error
        finally:
            producer.close(timeout=1)

    def last_line(self) -> str | None:
        with self._consumer() as consumer:
            end = self._end(consumer)
            window = TAIL_WINDOW
            while end > 0:
                start = max(0, end - window)
                records = self._read(consumer, start, end)
                if records:
                    return records[-1]
                if start == 0:
                    return None
                window *= 4
            return None

    def lines(self) -> list[str]:
        with self._consumer() as consumer:
            return self._read(consumer, 0, self._end(consumer))

    # ---- reading -----------------------------------------------------------------------

    def _consumer(self) -> _Consumer:
        return _Consumer(self.settings, self._partition)

    def _end(self, consumer: KafkaConsumer) -> int:
        try:
            return int(consumer.end_offsets([self._partition])[self._partition])
        except KafkaError as error:
            raise KafkaUnavailableError(f"cannot read {self.name}: {error!r}") from error

    def _read(self, consumer: KafkaConsumer, start: int, end: int) -> list[str]:
        """The values of the records at offsets [start, end), in offset order."""
        values: list[str] = []
        deadline = time.monotonic() + self.settings.send_timeout_ms / 1000
        try:
            consumer.seek(self._partition, start)
            while consumer.position(self._partition) < end:
                if time.monotonic() > deadline:
                    raise KafkaUnavailableError(
                        f"timed out reading {self.name} at offset "
                        f"{consumer.position(self._partition)} of {end}"
                    )
                for batch in consumer.poll(timeout_ms=500).values():
                    values += [r.value.decode() for r in batch if r.offset < end]
        except KafkaError as error:
            raise KafkaUnavailableError(f"cannot read {self.name}: {error!r}") from error
        return values


class _Consumer:
    """A consumer assigned the anchors partition (no group: nothing is committed)."""

    def __init__(self, settings: KafkaSettings, partition: TopicPartition) -> None:
        self.settings = settings
        self.partition = partition
        self.client: Any = None

    def __enter__(self) -> Any:
        try:
            self.client = KafkaConsumer(
                bootstrap_servers=self.settings.servers,
                client_id=f"{self.settings.client_id}-anchors",
                enable_auto_commit=False,
                # Reading a mistyped topic must not create it.
                allow_auto_create_topics=False,
                **clients.reach_timeouts(self.settings),
            )
            known = self.client.partitions_for_topic(self.partition.topic)
        except KafkaError as error:
            raise _unreachable(self.settings, error) from error
        if not known:
            self.client.close()
            raise KafkaUnavailableError(
                f"no Kafka topic {self.partition.topic!r} at {self.settings.bootstrap_servers}"
            )
        self.client.assign([self.partition])
        return self.client

    def __exit__(self, *exc: object) -> None:
        self.client.close()


def _unreachable(settings: KafkaSettings, error: KafkaError) -> KafkaUnavailableError:
    return KafkaUnavailableError(f"cannot reach Kafka at {settings.bootstrap_servers}: {error!r}")
