"""Subscriptions on the real broker: one job per message of a user's topic, the offset
committed once the job is durable, dead letters with their reason that never block a
partition, order per key, and messages delivered as signals to the jobs they name.

Every test runs on SQLite and on PostgreSQL (the ``store_url`` fixture)."""

from __future__ import annotations

import json
import re
from dataclasses import replace
from typing import Any

import pytest

from jobledger import Engine, JobStatus
from jobledger.adapters.kafka.worker import KafkaWorker
from jobledger.domain.errors import UnknownJobError
from jobledger.domain.subscription import Subscription
from tests.support.kafka_broker import (
    KafkaTopics,
    committed_offsets,
    end_offsets,
    headers,
    read_topic,
    running,
    wait_for,
)
from tests.support.subscriptions import open_engine, send, settings_of

TENANT = "acme"
ORDER_SCHEMA = {
    "type": "object",
    "required": ["order", "amount"],
    "properties": {"order": {"type": "string"}, "amount": {"type": "number", "minimum": 0}},
}


def orders(topics: KafkaTopics, **fields: Any) -> Subscription:
    return Subscription(
        **{
            "name": "orders",
            "topic": f"{topics.prefix}.orders",
            "tenant": "{header.tenant}",
            "tenants": (TENANT, "globex"),
            "workflow": "fulfil",
            "key": "{value.order}",
            "input_schema": ORDER_SCHEMA,
            **fields,
        }
    )


def payments(topics: KafkaTopics) -> Subscription:
    return Subscription(
        name="payments",
        topic=f"{topics.prefix}.payments",
        action="signal",
        tenant="{value.tenant}",
        job_id="{value.job}",
        event="paid",
        input="value.payment",
    )


def test_each_message_becomes_one_job_and_its_offset_is_committed_after_it(
    store_url: str, kafka_topics: KafkaTopics
) -> None:
    subscription = orders(kafka_topics)
    engine = open_engine(store_url, kafka_topics, subscription)
    settings = settings_of(kafka_topics, subscription)
    batch = [
        (f"o-{n}".encode(), {"order": f"o-{n}", "amount": n}, {"tenant": TENANT}) for n in range(8)
    ]
    # The same order again (a producer's retry): the business key finds its job.
    batch.append((b"o-3", {"order": "o-3", "amount": 3}, {"tenant": TENANT}))
    send(kafka_topics, subscription.topic, batch)
    committed: list[Any] = []

    def job_exists_before_commit(record: Any) -> None:
        identity = json.loads(record.value)["order"]
        job_id = subscription.derived_job_id(identity)
        assert engine.job(TENANT, job_id).workflow_type == "fulfil"
        committed.append(record.offset)

    worker = KafkaWorker(engine, settings, after_effect=job_exists_before_commit)
    with running(worker):
        wait_for(lambda: len(committed) == 9, 60, "every message handled")
        jobs = [subscription.derived_job_id(f"o-{n}") for n in range(8)]
        wait_for(
            lambda: all(engine.job(TENANT, j).status is JobStatus.COMPLETED for j in jobs),
            60,
            "every job completed",
        )
    for n, job_id in enumerate(jobs):
        view = engine.job(TENANT, job_id)
        assert view.state["order"] == f"o-{n}"
        assert view.state["amount"] == n
    assert worker.stats.outcomes["orders_submitted"] == 8
    assert worker.stats.outcomes["orders_found"] == 1
    assert committed_offsets(kafka_topics.bootstrap, kafka_topics.group, subscription.topic) == (
        end_offsets(kafka_topics.bootstrap, subscription.topic)
    )
    engine.close()


def test_bad_messages_are_dead_lettered_with_their_reason_and_the_partition_moves_on(
    store_url: str, kafka_topics: KafkaTopics
) -> None:
    subscription = orders(kafka_topics)
    engine = open_engine(store_url, kafka_topics, subscription)
    settings = settings_of(kafka_topics, subscription)
    key = b"one-partition"  # every message on one partition: a stuck one would block the rest
    bad = [
        (key, b"{not json", {"tenant": TENANT}),
        (key, {"order": "o-x", "amount": 1}, {"tenant": "initech"}),
        (key, {"order": "o-y", "amount": 1}, {}),
        (key, {"order": "o-z", "amount": -5}, {"tenant": TENANT}),
        (key, {"amount": 2}, {"tenant": TENANT}),
        (key, [1, 2], {"tenant": TENANT}),
    ]
    good = (key, {"order": "o-ok", "amount": 9}, {"tenant": "globex"})
    send(kafka_topics, subscription.topic, [*bad, good])
    worker = KafkaWorker(engine, settings)
    with running(worker):
        letters = read_topic(kafka_topics.bootstrap, subscription.dead_letter_topic, at_least=6)
        job_id = subscription.derived_job_id("o-ok")
        wait_for(lambda: _exists(engine, "globex", job_id), 60, "the good message's job")
    reasons = [headers(letter)["jobledger.dlq.reason"] for letter in letters]
    assert reasons == [
        "not_json",
        "tenant_not_allowed",
        "template",
        "schema",
        "template",
        "template",
    ]
    details = [headers(letter)["jobledger.dlq.error"] for letter in letters]
    assert "initech" in details[1]
    assert "{header.tenant}" in details[2]
    assert "amount" in details[3] and "minimum" in details[3]
    assert [letter.value for letter in letters[1:2]] == [json.dumps(bad[1][1]).encode()]
    assert headers(letters[1])["tenant"] == "initech", "the message's own headers are kept"
    assert not _exists(engine, "initech", subscription.derived_job_id("o-x"))
    assert worker.stats.dead_lettered == 6
    assert committed_offsets(kafka_topics.bootstrap, kafka_topics.group, subscription.topic) == (
        end_offsets(kafka_topics.bootstrap, subscription.topic)
    )
    engine.close()


def test_one_keys_messages_become_jobs_in_their_order(
    store_url: str, kafka_topics: KafkaTopics
) -> None:
    subscription = orders(kafka_topics, key=None, tenant=TENANT, tenants=None)
    engine = open_engine(store_url, kafka_topics, subscription)
    settings = replace(settings_of(kafka_topics, subscription))
    batch = [(b"customer-7", {"order": f"o-{n}", "amount": n}, {}) for n in range(12)]
    send(kafka_topics, subscription.topic, batch)
    seen: list[int] = []
    worker = KafkaWorker(
        engine,
        settings,
        concurrency=4,
        after_effect=lambda r: seen.append(json.loads(r.value)["amount"]),
    )
    with running(worker):
        wait_for(lambda: len(seen) == 12, 60, "every message handled")
    assert seen == list(range(12))
    engine.close()


def test_messages_are_delivered_as_signals_to_the_jobs_they_name(
    store_url: str, kafka_topics: KafkaTopics
) -> None:
    subscription = payments(kafka_topics)
    engine = open_engine(store_url, kafka_topics, subscription)
    settings = settings_of(kafka_topics, subscription)
    engine.submit(TENANT, "pay-1", "payment")
    engine.submit("globex", "pay-2", "payment")
    worker = KafkaWorker(engine, settings)
    with running(worker):
        wait_for(
            lambda: (
                engine.job(TENANT, "pay-1").status is JobStatus.WAITING_EVENT
                and engine.job("globex", "pay-2").status is JobStatus.WAITING_EVENT
            ),
            60,
            "both jobs wait for the payment",
        )
        paid = {"tenant": TENANT, "job": "pay-1", "payment": {"amount": 12}}
        send(
            kafka_topics,
            subscription.topic,
            [
                (b"pay-1", paid, {}),
                # acme's topic names globex's job under acme: no such job there.
                (b"pay-2", {"tenant": TENANT, "job": "pay-2", "payment": {}}, {}),
                (b"pay-3", {"tenant": TENANT, "job": "pay-1"}, {}),
            ],
        )
        wait_for(
            lambda: engine.job(TENANT, "pay-1").status is JobStatus.COMPLETED,
            60,
            "the paid job completed",
        )
        send(kafka_topics, subscription.topic, [(b"pay-1", paid, {})])  # too late
        letters = read_topic(kafka_topics.bootstrap, subscription.dead_letter_topic, at_least=3)
    reasons = sorted(headers(letter)["jobledger.dlq.reason"] for letter in letters)
    assert reasons == ["input", "job_finished", "unknown_job"]
    assert engine.job("globex", "pay-2").status is JobStatus.WAITING_EVENT
    history = engine.history(TENANT, "pay-1")
    resumed = [e.data for e in history if e.event_type == "Resumed"]
    assert len(resumed) == 1
    assert resumed[0]["payload"] == {"amount": 12}
    # The first message of its key, so the first of its partition: its position names it.
    assert re.fullmatch(rf"sub:payments:{subscription.topic}:\d+:0", resumed[0]["signal_id"])

    engine.close()


def _exists(engine: Engine, tenant: str, job_id: str) -> bool:
    try:
        engine.job(tenant, job_id)
    except UnknownJobError:
        return False
    return True


def test_a_worker_refuses_a_subscription_whose_workflow_is_not_deployed(
    store_url: str, kafka_topics: KafkaTopics
) -> None:
    from jobledger.domain.errors import ConfigError
    from jobledger.runtime.supervisor import Services, Supervisor

    subscription = orders(kafka_topics, workflow="nope")
    engine = open_engine(store_url, kafka_topics, subscription)
    with pytest.raises(ConfigError, match="workflow 'nope' is not deployed"):
        Supervisor(engine, Services(workers=1))
    engine.close()
