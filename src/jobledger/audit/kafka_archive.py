"""Archives on a Kafka topic: one message a job, keyed ``tenant/job``, its value the
job's export. The reference a tombstone keeps is ``kafka:<topic>/<partition>@<offset>``:
a restore or a verify reads that one message back, whatever else the topic holds.

A topic cannot be reconciled as a directory is: a run that crashed after its send and
before its transaction left a message no tombstone names, and the next run sends the
job again. Such a message is never read (no reference names it); the topic is created
with no time or size retention, so a named one is kept.
"""

from __future__ import annotations

import re
import time
from typing import Any
from uuid import UUID

from kafka import KafkaConsumer, TopicPartition
from kafka.errors import KafkaError

from jobledger.adapters.kafka import clients
from jobledger.adapters.kafka.settings import KafkaSettings
from jobledger.audit.archive import (
    DIR_PREFIX,
    ArchiveUnreachableError,
    Reader,
    read_directory_ref,
    sha256,
)
from jobledger.domain.errors import RetentionError

PREFIX = "kafka:"
MAX_ARCHIVE_BYTES = 10 * 1024 * 1024
"""The largest archive a message carries (the topic is made to take it)."""
_REF = re.compile(r"^kafka:(?P<topic>[A-Za-z0-9._-]{1,249})/(?P<partition>\d+)@(?P<offset>\d+)$")


class KafkaArchive:
    def __init__(self, settings: KafkaSettings, topic: str) -> None:
        self.settings = settings
        self.topic = topic
        self._producer: Any = None
        self._ensure_topic()

    def _ensure_topic(self) -> None:
        admin = clients.admin(self.settings)
        try:
            if self.topic not in set(admin.list_topics()):
                spec = {
                    self.topic: {
                        "num_partitions": self.settings.topic_partitions,
                        "replication_factor": self.settings.replication_factor,
                        "configs": {
                            "retention.ms": "-1",
                            "retention.bytes": "-1",
                            "max.message.bytes": str(MAX_ARCHIVE_BYTES),
                        },
                    }
                }
                admin.create_topics(spec, raise_errors=False)
                admin.wait_for_topics([self.topic], timeout_ms=30_000)
        except KafkaError as error:
            raise RetentionError(
                f"cannot create the archive topic {self.topic!r}: {error}"
            ) from None
        finally:
            admin.close()

    def write(self, job_uuid: UUID, key: str, data: bytes) -> str:
        """Send, wait for every in-sync replica's acknowledgement, read it back."""
        timeout = self.settings.send_timeout_ms / 1000
        if self._producer is None:
            self._producer = clients.producer(
                self.settings, role="archive", max_request_size=MAX_ARCHIVE_BYTES
            )
        try:
            sent = self._producer.send(self.topic, key=key.encode(), value=data)
            self._producer.flush(timeout=timeout)
            meta = sent.get(timeout=timeout)
        except KafkaError as error:
            raise RetentionError(f"the archive of {key} was not acknowledged: {error!r}") from None
        ref = f"{PREFIX}{self.topic}/{meta.partition}@{meta.offset}"
        if sha256(read_kafka_ref(self.settings, ref)) != sha256(data):
            raise RetentionError(f"the archive {ref} does not read back as sent")
        return ref

    def close(self) -> None:
        if self._producer is not None:
            self._producer.close(timeout=1)


def read_kafka_ref(settings: KafkaSettings, ref: str) -> bytes:
    """The value of the one message ``ref`` names."""
    found = _REF.match(ref)
    if found is None:
        raise ArchiveUnreachableError(f"not a Kafka archive reference: {ref!r}")
    partition = TopicPartition(found["topic"], int(found["partition"]))
    offset = int(found["offset"])
    deadline = time.monotonic() + settings.send_timeout_ms / 1000
    try:
        consumer = KafkaConsumer(
            bootstrap_servers=settings.servers,
            client_id=f"{settings.client_id}-archive",
            enable_auto_commit=False,
            allow_auto_create_topics=False,
            fetch_max_bytes=MAX_ARCHIVE_BYTES,
            max_partition_fetch_bytes=MAX_ARCHIVE_BYTES,
        )
    except KafkaError as error:
        raise ArchiveUnreachableError(f"cannot reach Kafka for {ref}: {error!r}") from None
    try:
        consumer.assign([partition])
        consumer.seek(partition, offset)
        while time.monotonic() < deadline:
            for batch in consumer.poll(timeout_ms=500).values():
                for record in batch:
                    if record.offset == offset:
                        return bytes(record.value)
    except KafkaError as error:
        raise ArchiveUnreachableError(f"cannot read {ref}: {error!r}") from None
    finally:
        consumer.close()
    raise ArchiveUnreachableError(f"no message at {ref}")


def archive_reader(settings: KafkaSettings) -> Reader:
    """Reads a directory's or a topic's archive, by its reference (or a file's path)."""

    def read(ref: str) -> bytes:
        if ref.startswith(PREFIX):
            return read_kafka_ref(settings, ref)
        # A directory's reference, or the file's path as it is.
        return read_directory_ref(ref if ref.startswith(DIR_PREFIX) else DIR_PREFIX + ref)

    return read
