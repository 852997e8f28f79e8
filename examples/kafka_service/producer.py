"""Sends the example's messages, as the shop's other services would.

    python producer.py orders     # 4 orders (one sent twice), 1 that fails its schema,
                                  # 1 for a tenant the subscription does not allow
    python producer.py payments   # a payment for each good order (one sent twice)
    python producer.py letters    # the dead letters, with their reasons

The topics are the ones jobledger.toml beside this file subscribes; the broker is
JOBLEDGER_KAFKA_BOOTSTRAP_SERVERS (default localhost:9092), as for jobledger itself.
"""

from __future__ import annotations

import json
import os
import sys
import tomllib
from pathlib import Path
from typing import Any

from kafka import KafkaConsumer, KafkaProducer, TopicPartition

CONFIG = Path(__file__).resolve().parent / "jobledger.toml"

Message = tuple[str, dict[str, Any]]
"""(tenant, value): the tenant goes in the ``tenant`` header."""


def order(tenant: str, order_id: str, sku: str, quantity: int, total: str) -> Message:
    line = {"sku": sku, "quantity": quantity}
    return tenant, {
        "order_id": order_id,
        "customer": "c-" + order_id.removeprefix("o-"),
        "lines": [line],
        "total": total,
    }


def payment(tenant: str, payment_id: str, order_id: str, amount: str) -> Message:
    return tenant, {"payment_id": payment_id, "order_id": order_id, "amount": amount}


ORDERS = [
    order("acme", "o-1001", "lamp", 2, "25.00"),
    order("acme", "o-1002", "desk", 1, "180.00"),
    order("globex", "o-2001", "chair", 4, "96.00"),
    # The first order again (a producer's retry): it finds the job the first one made.
    order("acme", "o-1001", "lamp", 2, "25.00"),
    # Dead-lettered: a line of no units fails the schema; initech is not an allowed tenant.
    order("acme", "o-1003", "rug", 0, "40.00"),
    order("initech", "o-3001", "stapler", 1, "9.00"),
]
PAYMENTS = [
    payment("acme", "p-1", "o-1001", "25.00"),
    payment("acme", "p-2", "o-1002", "180.00"),
    payment("globex", "p-3", "o-2001", "96.00"),
    # Sent twice: the signal's id (its payment id) makes the second a duplicate.
    payment("acme", "p-1", "o-1001", "25.00"),
]


def subscriptions() -> dict[str, dict[str, Any]]:
    with CONFIG.open("rb") as file:
        return {s["name"]: s for s in tomllib.load(file)["subscriptions"]}


def bootstrap() -> str:
    return os.environ.get("JOBLEDGER_KAFKA_BOOTSTRAP_SERVERS", "localhost:9092")


def send(topic: str, messages: list[Message]) -> None:
    producer = KafkaProducer(bootstrap_servers=bootstrap(), acks="all")
    for tenant, value in messages:
        # Keyed by order: one order's messages stay in order on one partition.
        producer.send(
            topic,
            key=value["order_id"].encode(),
            value=json.dumps(value).encode(),
            headers=[("tenant", tenant.encode())],
        )
        print(f"{topic}: {tenant} {value['order_id']}")
    producer.flush()
    producer.close()


def letters() -> None:
    """Every dead letter of both subscriptions, read from the beginning (no group)."""
    consumer = KafkaConsumer(bootstrap_servers=bootstrap(), enable_auto_commit=False)
    for subscription in subscriptions().values():
        topic = subscription.get("dlq_topic", f"{subscription['topic']}.dlq")
        partitions = [TopicPartition(topic, p) for p in consumer.partitions_for_topic(topic) or ()]
        consumer.assign(partitions)
        consumer.seek_to_beginning(*partitions)
        ends = consumer.end_offsets(partitions)
        while any(consumer.position(tp) < ends[tp] for tp in partitions):
            for records in consumer.poll(timeout_ms=1000).values():
                for record in records:
                    headers = {k: v.decode() for k, v in record.headers}
                    reason, error = headers["jobledger.dlq.reason"], headers["jobledger.dlq.error"]
                    print(f"{topic}: {record.key.decode()} {reason}: {error}")
    consumer.close()


def main(argv: list[str]) -> int:
    if argv == ["orders"]:
        send(subscriptions()["orders"]["topic"], ORDERS)
    elif argv == ["payments"]:
        send(subscriptions()["payments"]["topic"], PAYMENTS)
    elif argv == ["letters"]:
        letters()
    else:
        print("usage: python producer.py orders|payments|letters", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
