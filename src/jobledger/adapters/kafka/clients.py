"""Kafka clients configured for jobledger, and the topics it uses.

kafka-python negotiates the protocol with the broker: ``api_version`` is never set.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from typing import Any

from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer
from kafka.errors import KafkaError

from jobledger.adapters.kafka.settings import KafkaSettings
from jobledger.domain.errors import StoreUnavailableError

log = logging.getLogger(__name__)


class KafkaUnavailableError(StoreUnavailableError):
    """The broker did not take a message (or a commit) in time: an infrastructure error,
    retried like a store error, never a reason to fail a job or to skip a message."""


def producer(
    settings: KafkaSettings,
    *,
    linger_ms: int = 0,
    role: str = "producer",
    max_request_size: int = 1_048_576,
) -> Any:
    """An idempotent producer (acks=all): a retried send is never written twice and the
    messages of one key stay in the order they were sent."""
    request_timeout_ms = min(30_000, settings.send_timeout_ms)
    try:
        return KafkaProducer(
            bootstrap_servers=settings.servers,
            client_id=f"{settings.client_id}-{role}",
            acks="all",
            enable_idempotence=True,
            linger_ms=linger_ms,
            max_block_ms=settings.send_timeout_ms,
            request_timeout_ms=request_timeout_ms,
            delivery_timeout_ms=request_timeout_ms + linger_ms,
            max_request_size=max_request_size,
        )
    except KafkaError as error:
        raise KafkaUnavailableError(
            f"cannot reach Kafka at {settings.bootstrap_servers}: {error!r}"
        ) from error


def consumer(
    settings: KafkaSettings, *, topics: Sequence[str], listener: Any, max_poll_records: int
) -> Any:
    """A consumer-group member that commits by hand, starting from the earliest offset
    when the group has none (ticks published before the first worker are not lost)."""
    try:
        client = KafkaConsumer(
            bootstrap_servers=settings.servers,
            client_id=f"{settings.client_id}-worker",
            group_id=settings.group_id,
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            max_poll_records=max_poll_records,
            session_timeout_ms=settings.session_timeout_ms,
            heartbeat_interval_ms=max(500, settings.session_timeout_ms // 4),
            fetch_max_wait_ms=200,
        )
    except KafkaError as error:
        raise KafkaUnavailableError(
            f"cannot reach Kafka at {settings.bootstrap_servers}: {error!r}"
        ) from error
    try:
        # Metadata first: a member that joins before it knows the topics' partitions is
        # assigned nothing and has to rejoin at once.
        for topic in topics:
            client.partitions_for_topic(topic)
    except KafkaError as error:
        client.close()
        raise KafkaUnavailableError(f"cannot read Kafka topic metadata: {error!r}") from error
    client.subscribe(topics=list(topics), listener=listener)
    return client


def admin(settings: KafkaSettings) -> Any:
    try:
        return KafkaAdminClient(
            bootstrap_servers=settings.servers, client_id=f"{settings.client_id}-admin"
        )
    except KafkaError as error:
        raise KafkaUnavailableError(
            f"cannot reach Kafka at {settings.bootstrap_servers}: {error!r}"
        ) from error


def ensure_topics(settings: KafkaSettings, topics: Iterable[str] | None = None) -> list[str]:
    """Create the topics that do not exist yet (with the configured partitions and
    replication) and wait until each has a leader; returns the ones created."""
    wanted = list(topics) if topics is not None else settings.topics
    client = admin(settings)
    try:
        missing = [t for t in wanted if t not in set(client.list_topics())]
        if missing:
            spec = {name: _topic_spec(settings, name) for name in missing}
            # Another process may create them at the same moment: already-exists is fine.
            client.create_topics(spec, raise_errors=False)
            client.wait_for_topics(missing, timeout_ms=30_000)
            log.info("created Kafka topics %s", ", ".join(missing))
        return missing
    except KafkaError as error:
        raise KafkaUnavailableError(f"cannot create Kafka topics: {error}") from error
    finally:
        client.close()


def _topic_spec(settings: KafkaSettings, name: str) -> dict[str, Any]:
    if name == settings.pause_topic:
        # A switch per subscription, its last state the one that counts: compaction keeps
        # that for ever, and one partition keeps the switches in the order they were set.
        return {
            "num_partitions": 1,
            "replication_factor": settings.replication_factor,
            "configs": {"cleanup.policy": "compact"},
        }
    return {
        "num_partitions": settings.topic_partitions,
        "replication_factor": settings.replication_factor,
    }


def reach_timeouts(settings: KafkaSettings) -> dict[str, int]:
    """A one-shot client's bootstrap and request timeouts: an unreachable broker is an error
    within the configured send timeout, not kafka-python's 30 s default."""
    timeout = min(30_000, settings.send_timeout_ms)
    return {"bootstrap_timeout_ms": timeout, "request_timeout_ms": timeout}
