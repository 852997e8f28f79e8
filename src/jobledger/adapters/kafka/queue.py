"""The Queue port on Kafka: ticks published to the ticks topic, keyed by tenant/job."""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from kafka.errors import KafkaError

from jobledger.adapters.kafka import clients
from jobledger.adapters.kafka.clients import KafkaUnavailableError
from jobledger.adapters.kafka.messages import encode_tick, job_key
from jobledger.adapters.kafka.settings import KafkaSettings
from jobledger.orchestration.ports import Tick
from jobledger.orchestration.tracing import trace_headers

log = logging.getLogger(__name__)


class KafkaQueue:
    """Publishes each tick and waits for the broker's acknowledgement, so a tick is
    durable when ``enqueue`` returns: a worker that enqueues a continuation and then
    commits its own offset can never lose the continuation.

    There are no delay topics. A tick with ``delay_ms > 0`` (a timer, a retry back-off,
    a lease to wait out) is not published: the job's due moment is in the status view
    and the reconciler publishes the tick when it comes due.

    Kafka keeps no set of pending ticks, so a dedupe key cannot suppress a second tick;
    it travels in the message (with the reason) and a duplicate tick is a harmless
    re-delivery: claims and step keys make every tick idempotent.
    """

    def __init__(self, settings: KafkaSettings) -> None:
        self.settings = settings
        self._producer: Any = None
        self._lock = threading.Lock()
        self.published = 0
        self.left_to_reconciler = 0

    def enqueue(self, tick: Tick, *, delay_ms: int = 0, dedupe_key: str | None = None) -> None:
        if delay_ms > 0:
            with self._lock:
                self.left_to_reconciler += 1
            return
        self.publish(tick, dedupe_key=dedupe_key)

    def publish(self, tick: Tick, *, dedupe_key: str | None = None) -> None:
        """Send now and block until acknowledged; KafkaUnavailableError if it was not."""
        value = encode_tick(tick, dedupe_key=dedupe_key, enqueued_at_ms=int(time.time() * 1000))
        try:
            future = self.producer().send(
                self.settings.ticks_topic,
                key=job_key(tick.tenant_id, tick.job_id),
                value=value,
                headers=trace_headers(tick.trace_context),
            )
            future.get(timeout=self.settings.send_timeout_ms / 1000)
        except KafkaError as error:
            raise KafkaUnavailableError(
                f"tick for {tick.tenant_id}/{tick.job_id} was not published to "
                f"{self.settings.ticks_topic}: {error!r}"
            ) from error
        with self._lock:
            self.published += 1

    def producer(self) -> Any:
        """Created on first use: an engine that never enqueues never connects."""
        with self._lock:
            if self._producer is None:
                self._producer = clients.producer(self.settings, role="ticks")
            return self._producer

    def close(self) -> None:
        with self._lock:
            producer, self._producer = self._producer, None
        if producer is not None:
            try:
                producer.flush(timeout=self.settings.send_timeout_ms / 1000)
            finally:
                producer.close(timeout=5)
