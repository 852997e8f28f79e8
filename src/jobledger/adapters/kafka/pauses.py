"""Pausing a subscription: a durable switch every worker of the group obeys, no restart.

The switches live on a compacted topic of one partition, ``<kafka_group_id>.paused``,
keyed by subscription name; a name's last record is its state, a JSON document
``{"paused", "by", "at", "reason"}``. ``jobledger subscriptions pause`` and ``resume``
write one. Each worker reads the topic to its end before it joins the group, then polls it
once a loop (an assigned consumer of its own, outside the group: reading it commits
nothing), and pauses the partitions it holds of the paused subscriptions' topics
(``consumer.pause``). A paused partition is not fetched: its messages stay on the topic
and its committed offset where it was, so resuming goes on from the first message not
made a job of, skipping none. Kafka forgets a partition's pause when the partition is
assigned again, so the worker pauses it again as it is assigned (worker.py).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from kafka import KafkaConsumer, TopicPartition
from kafka.errors import KafkaError

from jobledger.adapters.kafka import clients
from jobledger.adapters.kafka.clients import KafkaUnavailableError
from jobledger.adapters.kafka.settings import KafkaSettings
from jobledger.domain.errors import ConfigError

log = logging.getLogger(__name__)

RECHECK_SECONDS = 5.0
"""How often a worker looks again for a pause topic that did not exist yet."""


@dataclass(frozen=True)
class PauseState:
    """A subscription's switch as last set: paused or not, by whom, when, why."""

    paused: bool
    by: str
    at: str
    reason: str | None = None

    def document(self) -> dict[str, Any]:
        return {"paused": self.paused, "by": self.by, "at": self.at, "reason": self.reason}

    @classmethod
    def parse(cls, value: bytes) -> PauseState:
        """A record's value; a ValueError saying what is wrong with one that is not a
        switch (written by hand, say)."""
        document = json.loads(value)
        if not isinstance(document, dict) or not isinstance(document.get("paused"), bool):
            raise ValueError('expected a JSON object with "paused": true or false')
        reason = document.get("reason")
        return cls(
            paused=document["paused"],
            by=str(document.get("by", "")),
            at=str(document.get("at", "")),
            reason=None if reason is None else str(reason),
        )


class PauseBoard:
    """The switches as one reader sees them: read to the end by :meth:`open`, then kept
    current by :meth:`refresh`. A topic that does not exist yet pauses nothing."""

    def __init__(self, settings: KafkaSettings) -> None:
        self.settings = settings
        self.states: dict[str, PauseState] = {}
        self._consumer: Any = None
        self._partition: TopicPartition | None = None
        self._looked_at = 0.0

    @property
    def exists(self) -> bool:
        """Whether the pause topic was found (on the last look)."""
        return self._partition is not None

    @property
    def paused(self) -> frozenset[str]:
        """The names of the subscriptions paused now."""
        return frozenset(name for name, state in self.states.items() if state.paused)

    def open(self) -> PauseBoard:
        try:
            self._consumer = KafkaConsumer(
                bootstrap_servers=self.settings.servers,
                client_id=f"{self.settings.client_id}-pauses",
                enable_auto_commit=False,
                # A group id mistyped in one process must not create a topic of switches.
                allow_auto_create_topics=False,
                fetch_max_wait_ms=100,
                **clients.reach_timeouts(self.settings),
            )
        except KafkaError as error:
            raise KafkaUnavailableError(
                f"cannot reach Kafka at {self.settings.bootstrap_servers}: {error!r}"
            ) from error
        try:
            self._assign()
            self._read_to_end()
        except (KafkaError, KafkaUnavailableError) as error:
            self.close()
            raise KafkaUnavailableError(
                f"cannot read the pause topic {self.settings.pause_topic!r}: {error!r}"
            ) from error
        return self

    def refresh(self) -> None:
        """What was set since the last look, without waiting (a worker calls it each
        loop); a broker away keeps the switches as they were."""
        try:
            if self._partition is None:
                if time.monotonic() - self._looked_at < RECHECK_SECONDS:
                    return
                self._assign()
                if self._partition is None:
                    return
            for records in self._consumer.poll(timeout_ms=0).values():
                self._apply(records)
        except KafkaError as error:
            log.warning("could not read the pause topic; switches kept as they were: %r", error)

    def close(self) -> None:
        consumer, self._consumer = self._consumer, None
        if consumer is not None:
            consumer.close()

    def _assign(self) -> None:
        self._looked_at = time.monotonic()
        topic = self.settings.pause_topic
        if not self._consumer.partitions_for_topic(topic):
            return
        self._partition = TopicPartition(topic, 0)
        self._consumer.assign([self._partition])
        self._consumer.seek_to_beginning(self._partition)

    def _read_to_end(self) -> None:
        partition = self._partition
        if partition is None:
            return
        end = self._consumer.end_offsets([partition])[partition]
        timeout = self.settings.send_timeout_ms / 1000
        deadline = time.monotonic() + timeout
        while self._consumer.position(partition) < end:
            if time.monotonic() > deadline:
                raise KafkaUnavailableError("the pause topic stopped answering mid-read")
            for records in self._consumer.poll(timeout_ms=200).values():
                deadline = time.monotonic() + timeout
                self._apply(records)

    def _apply(self, records: list[Any]) -> None:
        for record in records:
            if record.key is None:
                continue  # not a switch: every switch is keyed by its subscription
            name = record.key.decode("utf-8", "replace")
            if record.value is None:
                self.states.pop(name, None)  # a tombstone: never set
                continue
            try:
                self.states[name] = PauseState.parse(record.value)
            except ValueError as error:
                log.warning(
                    "pause topic: the record for %r at offset %d is not a switch (%s); "
                    "the switch stays as it was",
                    name,
                    record.offset,
                    error,
                )


def read_pauses(settings: KafkaSettings) -> Mapping[str, PauseState]:
    """Every switch as last set (a name never set is missing)."""
    board = PauseBoard(settings).open()
    board.close()
    return board.states


def set_pause(
    settings: KafkaSettings, name: str, *, paused: bool, by: str, reason: str | None
) -> PauseState | None:
    """Set subscription ``name``'s switch, once the broker acknowledged it; the state it
    had before (None: never set). ``name`` must be a configured subscription."""
    settings.subscription(name)
    board = PauseBoard(settings).open()
    board.close()
    if not board.exists:
        if not settings.create_topics:
            raise ConfigError(
                f"the pause topic {settings.pause_topic!r} does not exist and "
                "kafka_create_topics is off: create it (one partition, cleanup.policy=compact)"
            )
        clients.ensure_topics(settings, [settings.pause_topic])
    state = PauseState(paused, by, datetime.now(UTC).isoformat(), reason)
    producer = clients.producer(settings, role="pauses")
    try:
        future = producer.send(
            settings.pause_topic,
            key=name.encode(),
            value=json.dumps(state.document()).encode(),
        )
        future.get(timeout=settings.send_timeout_ms / 1000)
    except KafkaError as error:
        raise KafkaUnavailableError(
            f"the pause switch was not acknowledged by Kafka: {error!r}"
        ) from error
    finally:
        producer.close(timeout=5)
    return board.states.get(name)
