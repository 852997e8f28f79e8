"""What the subscription tests share: an engine with subscriptions on a test's own topics,
the worker's settings for them (topics made), messages sent with keys and headers, and
whether the group committed a topic to its end."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

from kafka import KafkaProducer

from jobledger import Engine, EngineConfig, FunctionRegistry
from jobledger.adapters.kafka import ensure_topics
from jobledger.adapters.kafka.settings import KafkaSettings
from jobledger.adapters.ops import MemoryOps
from jobledger.domain.subscription import Subscription
from tests.support.engines import TOKEN_SECRET, CountingExecutor, StoreWrapper
from tests.support.engines import open_engine as build_engine
from tests.support.kafka_broker import KafkaTopics, committed_offsets, end_offsets
from tests.support.workflows import DONE, STEP, linear_registry, wait_event

Sent = tuple[bytes, Any, dict[str, str]]
"""A message to send: its key, its value (JSON-encoded unless bytes) and its headers."""


def registry() -> FunctionRegistry:
    """``fulfil``: two side-effecting steps; ``payment``: one, a wait for ``paid``, one."""
    return linear_registry(
        {"fulfil": [STEP, STEP, DONE], "payment": [STEP, wait_event("paid"), STEP, DONE]}
    )


def open_engine(
    store_url: str,
    topics: KafkaTopics,
    *subscriptions: Subscription,
    wrap_store: StoreWrapper | None = None,
    **config: Any,
) -> Engine:
    settings = EngineConfig(
        store_url=store_url,
        worker_id="w0",
        token_secret=TOKEN_SECRET,
        subscriptions=list(subscriptions),
        **{**topics.config(), **config},
    )
    return build_engine(
        registry=registry(),
        executor=CountingExecutor(),
        config=settings,
        ops=MemoryOps(),
        wrap_store=wrap_store,
    )


def settings_of(topics: KafkaTopics, *subscriptions: Subscription) -> KafkaSettings:
    """The worker's settings with these subscriptions, their topics made."""
    settings = replace(topics.settings(), subscriptions=subscriptions)
    ensure_topics(settings)
    return settings


def send(topics: KafkaTopics, topic: str, messages: list[Sent]) -> None:
    producer = KafkaProducer(bootstrap_servers=topics.bootstrap, acks="all")
    try:
        for key, value, message_headers in messages:
            raw = value if isinstance(value, bytes) else json.dumps(value).encode()
            producer.send(
                topic,
                key=key,
                value=raw,
                headers=[(k, v.encode()) for k, v in message_headers.items()],
            )
        producer.flush()
    finally:
        producer.close()


def all_committed(topics: KafkaTopics, topic: str) -> bool:
    """The group's committed offsets of ``topic`` are its end offsets."""
    committed = committed_offsets(topics.bootstrap, topics.group, topic)
    return committed == end_offsets(topics.bootstrap, topic)
