"""How each subscription stands, as ``jobledger subscriptions list`` prints it: paused or
not, the consumer group's lag on its topic, and its dead letters not redriven yet.

The lag is read from what the group committed, not from a worker: per partition, the
messages between the committed offset (else the partition's first, where a group without
one starts) and the partition's end. A paused subscription's lag grows as its topic does.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from kafka import KafkaAdminClient, KafkaConsumer, TopicPartition
from kafka.errors import KafkaError

from jobledger.adapters.kafka import clients
from jobledger.adapters.kafka.clients import KafkaUnavailableError
from jobledger.adapters.kafka.dead_letters import DeadLetters
from jobledger.adapters.kafka.pauses import PauseState, read_pauses
from jobledger.adapters.kafka.settings import KafkaSettings
from jobledger.domain.subscription import Subscription


@dataclass(frozen=True)
class PartitionLag:
    partition: int
    end: int
    """The partition's end offset: the offset its next message gets."""
    committed: int | None
    """The group's committed offset (None: the group committed none)."""
    lag: int

    def document(self) -> dict[str, Any]:
        return {
            "partition": self.partition,
            "end": self.end,
            "committed": self.committed,
            "lag": self.lag,
        }


@dataclass(frozen=True)
class SubscriptionStatus:
    subscription: Subscription
    pause: PauseState | None
    """The switch as last set (None: never set)."""
    partitions: tuple[PartitionLag, ...]
    """Empty when the topic does not exist (yet)."""
    dead_letters: int
    """Letters on its dead-letter topic not redriven yet."""

    @property
    def paused(self) -> bool:
        return self.pause is not None and self.pause.paused

    @property
    def lag(self) -> int:
        return sum(each.lag for each in self.partitions)

    def document(self) -> dict[str, Any]:
        subscription = self.subscription
        return {
            "name": subscription.name,
            "topic": subscription.topic,
            "action": subscription.action,
            "workflow": subscription.workflow,
            "paused": self.paused,
            "pause": None if self.pause is None else self.pause.document(),
            "lag": self.lag,
            "partitions": [each.document() for each in self.partitions],
            "dead_letter_topic": subscription.dead_letter_topic,
            "dead_letters": self.dead_letters,
        }


def statuses(settings: KafkaSettings) -> list[SubscriptionStatus]:
    """Every configured subscription, in the order configured."""
    if not settings.subscriptions:
        return []
    pauses = read_pauses(settings)  # first: an unreachable broker fails fast here
    lags = group_lag(settings, [s.topic for s in settings.subscriptions])
    waiting = DeadLetters(settings).waiting()
    return [
        SubscriptionStatus(
            subscription,
            pauses.get(subscription.name),
            tuple(lags.get(subscription.topic, ())),
            waiting[subscription.name],
        )
        for subscription in settings.subscriptions
    ]


def group_lag(settings: KafkaSettings, topics: Sequence[str]) -> dict[str, list[PartitionLag]]:
    """Per topic (one that does not exist is left out): the group's lag per partition."""
    committed = _committed(settings)
    try:
        consumer = KafkaConsumer(
            bootstrap_servers=settings.servers,
            client_id=f"{settings.client_id}-lag",
            enable_auto_commit=False,
            allow_auto_create_topics=False,
            **clients.reach_timeouts(settings),
        )
    except KafkaError as error:
        raise _unreachable(settings, error) from error
    try:
        partitions = [
            TopicPartition(topic, p)
            for topic in topics
            for p in sorted(consumer.partitions_for_topic(topic) or ())
        ]
        ends = consumer.end_offsets(partitions) if partitions else {}
        starts = consumer.beginning_offsets(partitions) if partitions else {}
    except KafkaError as error:
        raise KafkaUnavailableError(f"cannot read the subscriptions' offsets: {error!r}") from error
    finally:
        consumer.close()
    found: dict[str, list[PartitionLag]] = {}
    for tp in partitions:
        at = committed.get(tp)
        behind = ends[tp] - (starts[tp] if at is None else max(at, starts[tp]))
        found.setdefault(tp.topic, []).append(
            PartitionLag(tp.partition, ends[tp], at, max(0, behind))
        )
    return found


def _committed(settings: KafkaSettings) -> Mapping[TopicPartition, int]:
    """The group's committed offsets (-1, none, left out)."""
    try:
        admin = KafkaAdminClient(
            bootstrap_servers=settings.servers,
            client_id=f"{settings.client_id}-lag",
            **clients.reach_timeouts(settings),
        )
    except KafkaError as error:
        raise _unreachable(settings, error) from error
    try:
        offsets = admin.list_group_offsets(settings.group_id).get(settings.group_id, {})
    except KafkaError as error:
        raise KafkaUnavailableError(
            f"cannot read the offsets of group {settings.group_id!r}: {error!r}"
        ) from error
    finally:
        admin.close()
    return {tp: meta.offset for tp, meta in offsets.items() if meta.offset >= 0}


def _unreachable(settings: KafkaSettings, error: KafkaError) -> KafkaUnavailableError:
    return KafkaUnavailableError(f"cannot reach Kafka at {settings.bootstrap_servers}: {error!r}")
