"""The outbox's publisher: job events to the events topic (and the routed ones to their
topics), acknowledged before tracking."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

from kafka.errors import KafkaError

from jobledger.adapters.kafka import clients
from jobledger.adapters.kafka.clients import KafkaUnavailableError
from jobledger.adapters.kafka.settings import KafkaSettings
from jobledger.orchestration.ports import OutboxMessage


class KafkaEventPublisher:
    """Sends a batch, flushes, and checks every acknowledgement: ``publish`` returns only
    when the broker holds every message (the outbox then records its position). The
    producer is idempotent with acks=all, so one key's messages stay in send order even
    when a send is retried."""

    def __init__(self, settings: KafkaSettings) -> None:
        self.settings = settings
        self._producer: Any = None
        self._lock = threading.Lock()

    def publish(self, messages: Sequence[OutboxMessage]) -> None:
        with self._lock:
            if self._producer is None:
                self._producer = clients.producer(self.settings, linger_ms=5, role="outbox")
            producer = self._producer
            try:
                futures = [
                    producer.send(
                        message.topic or self.settings.events_topic,
                        key=message.key,
                        value=message.value,
                        headers=message.headers,
                    )
                    for message in messages
                ]
                producer.flush(timeout=self.settings.send_timeout_ms / 1000)
                for future in futures:
                    future.get(timeout=self.settings.send_timeout_ms / 1000)
            except KafkaError as error:
                # Start over with a fresh producer: the batch is published again whole.
                self._producer = None
                producer.close(timeout=1)
                raise KafkaUnavailableError(
                    f"events not published to {self._topics(messages)}: {error!r}"
                ) from error

    def _topics(self, messages: Sequence[OutboxMessage]) -> str:
        topics = dict.fromkeys(m.topic or self.settings.events_topic for m in messages)
        return ", ".join(topics)

    def close(self) -> None:
        with self._lock:
            producer, self._producer = self._producer, None
        if producer is not None:
            producer.close(timeout=5)
