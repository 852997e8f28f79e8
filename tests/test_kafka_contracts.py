"""The port contracts an adapter needs a Kafka broker for: KafkaQueue runs the Queue
contract (tests/contracts/queue.py). Skipped locally without a broker; CI runs it."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from jobledger.adapters.kafka.messages import decode_tick
from jobledger.adapters.kafka.queue import KafkaQueue
from jobledger.orchestration.ports import Queue, Tick
from tests.contracts.queue import QueueContract
from tests.support.kafka_broker import KafkaTopics, read_topic


class TestKafkaQueue(QueueContract):
    dedupes = False

    @pytest.fixture
    def queue(self, kafka_topics: KafkaTopics) -> Iterator[KafkaQueue]:
        self.topics = kafka_topics
        queue = KafkaQueue(kafka_topics.settings())
        yield queue
        queue.close()

    def delivered(self, queue: Queue, *, at_least: int) -> list[Tick]:
        # What a consumer of the ticks topic receives: one job's ticks share a key, so a
        # partition, so their order (read_topic returns partition order, then offsets).
        records = read_topic(self.topics.bootstrap, self.topics.ticks, at_least=at_least)
        return [decode_tick(record.value).tick for record in records]

    def test_a_delayed_tick_is_left_to_the_reconciler(self, queue: KafkaQueue) -> None:
        queue.enqueue(Tick("t", "j", "timer"), delay_ms=60_000)
        assert (queue.left_to_reconciler, queue.published) == (1, 0)

    def test_the_dedupe_key_travels_with_the_tick(self, queue: KafkaQueue) -> None:
        queue.enqueue(Tick("t", "j", "retry"), dedupe_key="retry:2")
        (record,) = read_topic(self.topics.bootstrap, self.topics.ticks, at_least=1)
        assert decode_tick(record.value).dedupe_key == "retry:2"
