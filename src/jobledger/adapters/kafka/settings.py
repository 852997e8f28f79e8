"""What the Kafka adapters need from :class:`~jobledger.config.EngineConfig`."""

from __future__ import annotations

import re
from dataclasses import dataclass

from jobledger.config import EngineConfig
from jobledger.domain.errors import ConfigError, UnknownSubscriptionError
from jobledger.domain.event_routes import KAFKA_TOPIC, EventRoute
from jobledger.domain.subscription import Subscription


@dataclass(frozen=True)
class KafkaSettings:
    bootstrap_servers: str = "localhost:9092"
    ticks_topic: str = "jobledger.ticks"
    ticks_dlq_topic: str = "jobledger.ticks.dlq"
    signals_topic: str = "jobledger.signals"
    signals_dlq_topic: str = "jobledger.signals.dlq"
    events_topic: str = "jobledger.events"
    group_id: str = "jobledger-workers"
    client_id: str = "jobledger"
    create_topics: bool = True
    topic_partitions: int = 12
    replication_factor: int = 1
    session_timeout_ms: int = 10_000
    send_timeout_ms: int = 15_000
    worker_id: str = "jobledger"
    event_routes: tuple[EventRoute, ...] = ()
    """The outbox's routes of job events to your topics, as CloudEvents."""
    subscriptions: tuple[Subscription, ...] = ()
    """Your topics whose messages the workers make jobs (or signals) of."""

    def __post_init__(self) -> None:
        for route in self.event_routes:
            if route.topic == self.events_topic:
                # CloudEvents there would mix with the events in their stored form.
                raise ConfigError(
                    f"event_routes: topic {route.topic!r} is the events topic "
                    "(kafka_events_topic): route to a topic of your own"
                )
        if self.subscriptions and not re.fullmatch(KAFKA_TOPIC, self.pause_topic):
            raise ConfigError(
                f"kafka_group_id {self.group_id!r} names the subscriptions' pause topic "
                f"{self.pause_topic!r}, which is not a legal Kafka topic name: use letters, "
                "digits, '.', '_' and '-'"
            )
        self._check_subscriptions()

    def _check_subscriptions(self) -> None:
        """Each subscription reads a topic of the user's own that no other subscription
        reads, and its dead letters go to a topic of its own."""
        own = {*self.own_topics, self.pause_topic}
        readers: dict[str, str] = {}
        for subscription in self.subscriptions:
            for key, topic in (
                ("topic", subscription.topic),
                ("dlq_topic", subscription.dead_letter_topic),
            ):
                if topic in own:
                    raise ConfigError(
                        f"subscription {subscription.name!r}: {key} {topic!r} is one of "
                        "jobledger's own topics: name a topic of your own"
                    )
            if subscription.topic in readers:
                # One consumer group reads a topic once: which subscription would get it?
                raise ConfigError(
                    f"subscriptions {readers[subscription.topic]!r} and {subscription.name!r} "
                    f"both read topic {subscription.topic!r}"
                )
            readers[subscription.topic] = subscription.name
        self._check_dead_letter_topics()

    def _check_dead_letter_topics(self) -> None:
        """A subscription's dead-letter topic is its own: its letters are redriven to its
        topic, so a topic shared with another subscription (as its source or its dead
        letters) would send them to the wrong one."""
        sources = {s.topic: s.name for s in self.subscriptions}
        seen: dict[str, str] = {}
        for subscription in self.subscriptions:
            topic = subscription.dead_letter_topic
            other = seen.get(topic) or sources.get(topic)
            if other is not None:
                raise ConfigError(
                    f"subscriptions {other!r} and {subscription.name!r} share topic "
                    f"{topic!r}: give each subscription a dead-letter topic of its own"
                )
            seen[topic] = subscription.name

    @classmethod
    def of(cls, config: EngineConfig) -> KafkaSettings:
        # The group and these settings name their fields alike.
        return cls(
            **dict(config.kafka),
            worker_id=config.worker_id,
            event_routes=tuple(config.outbox.event_routes),
            subscriptions=tuple(config.subscribing.subscriptions),
        )

    @property
    def servers(self) -> list[str]:
        return [s.strip() for s in self.bootstrap_servers.split(",") if s.strip()]

    @property
    def own_topics(self) -> list[str]:
        return [
            self.ticks_topic,
            self.ticks_dlq_topic,
            self.signals_topic,
            self.signals_dlq_topic,
            self.events_topic,
        ]

    @property
    def pause_topic(self) -> str:
        """The subscriptions' pause switches (see pauses.py): one per consumer group."""
        return f"{self.group_id}.paused"

    @property
    def topics(self) -> list[str]:
        """Every topic jobledger makes when it is missing (``create_topics``)."""
        return list(
            dict.fromkeys(
                [
                    *self.own_topics,
                    *(route.topic for route in self.event_routes),
                    *(s.topic for s in self.subscriptions),
                    *(s.dead_letter_topic for s in self.subscriptions),
                    *([self.pause_topic] if self.subscriptions else []),
                ]
            )
        )

    def subscription(self, name: str) -> Subscription:
        """The subscription of that name; an unknown one is named with the known ones."""
        for subscription in self.subscriptions:
            if subscription.name == name:
                return subscription
        raise UnknownSubscriptionError(name, [s.name for s in self.subscriptions])

    def subscription_for(self, topic: str) -> Subscription | None:
        return next((s for s in self.subscriptions if s.topic == topic), None)

    def dlq_for(self, topic: str) -> str:
        subscription = self.subscription_for(topic)
        if subscription is not None:
            return subscription.dead_letter_topic
        return self.signals_dlq_topic if topic == self.signals_topic else self.ticks_dlq_topic
