"""Dead letters over a real broker: list, show and filter them, redrive them (once, unless
forced; the --all guard), a tick dead-lettered for a job that did not exist yet and
redriven after its submit, a double redrive that runs no step and delivers no signal twice
(both stores), a redrive killed mid-way (fault injection at each write, and a real
SIGKILL) then run again, and the same over the CLI and the HTTP API (admins only)."""

from __future__ import annotations

from collections import Counter
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from kafka import KafkaProducer

from jobledger.adapters.kafka.dead_letters import (
    DeadLetters,
    LetterFilter,
    Selection,
)
from jobledger.adapters.kafka.messages import encode_tick, job_key
from jobledger.domain.errors import DeadLetterError, UnknownDeadLetterError
from jobledger.orchestration.ports import Tick
from tests.support.kafka_broker import KafkaTopics, headers, read_topic

TENANT = "acme"


def dead_letter(
    topics: KafkaTopics,
    producer: Any,
    *,
    kind: str = "ticks",
    job: str = "j",
    reason: str = "unknown_job",
    at: datetime | None = None,
    value: bytes | None = None,
) -> None:
    """A letter as the worker writes it (worker.dead_letter's headers)."""
    source = topics.ticks if kind == "ticks" else topics.signals
    dlq = topics.ticks_dlq if kind == "ticks" else topics.signals_dlq
    moment = at or datetime.now(UTC)
    body = value or encode_tick(Tick(TENANT, job, "create"), dedupe_key=None, enqueued_at_ms=0)
    producer.send(
        dlq,
        key=job_key(TENANT, job),
        value=body,
        headers=[
            ("traceparent", b"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"),
            ("jobledger.dlq.reason", reason.encode()),
            ("jobledger.dlq.error", f"{reason} for {job}".encode()),
            ("jobledger.dlq.topic", source.encode()),
            ("jobledger.dlq.partition", b"0"),
            ("jobledger.dlq.offset", b"7"),
            ("jobledger.dlq.worker", b"w0"),
            ("jobledger.dlq.at", moment.isoformat().encode()),
        ],
    )


def raw_producer(topics: KafkaTopics) -> Any:
    return KafkaProducer(bootstrap_servers=topics.bootstrap, acks="all", linger_ms=5)


# ---- reading ---------------------------------------------------------------------------


def test_letters_are_listed_shown_and_filtered(kafka_topics: KafkaTopics) -> None:
    producer = raw_producer(kafka_topics)
    old = datetime(2026, 1, 1, tzinfo=UTC)
    dead_letter(kafka_topics, producer, job="a", at=old)
    dead_letter(kafka_topics, producer, job="b", reason="invalid")
    dead_letter(kafka_topics, producer, kind="signals", job="a", reason="job_finished")
    producer.flush()
    letters = DeadLetters(kafka_topics.settings())

    every = letters.read()
    assert [(x.id.kind, x.key_text, x.reason) for x in every] == [
        ("ticks", "acme/a", "unknown_job"),
        ("ticks", "acme/b", "invalid"),
        ("signals", "acme/a", "job_finished"),
    ]
    assert all(not x.redriven for x in every)
    shown = letters.get(str(every[1].id))
    assert shown.document()["source_topic"] == kafka_topics.ticks
    assert shown.document()["headers"] == {
        "traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    }
    assert shown.error == "invalid for b"

    def keys(**criteria: Any) -> list[str | None]:
        return [x.key_text for x in letters.read(LetterFilter(**criteria))]

    assert keys(reason="invalid") == ["acme/b"]
    assert keys(topic="signals") == ["acme/a"]
    assert keys(topic=kafka_topics.ticks) == ["acme/a", "acme/b"]
    assert keys(key="acme/a") == ["acme/a", "acme/a"]
    assert keys(key="acme/*", reason="job_finished") == ["acme/a"]
    assert keys(since=old + timedelta(days=1)) == ["acme/b", "acme/a"]
    assert keys(until=old + timedelta(days=1)) == ["acme/a"]

    with pytest.raises(UnknownDeadLetterError, match="no dead letter 'ticks:0:999'"):
        letters.get("ticks:0:999")
    for bad in ("ticks:0", "queue:0:1", "ticks:x:1", "ticks:-1:2"):
        with pytest.raises(DeadLetterError, match="bad dead letter id"):
            letters.get(bad)
    with pytest.raises(DeadLetterError, match=r"unknown topic 'jobledger\.other'"):
        letters.read(LetterFilter(topic="jobledger.other"))


# ---- redriving ---------------------------------------------------------------------------


def test_a_redrive_sends_the_original_back_once_and_again_only_when_forced(
    kafka_topics: KafkaTopics,
) -> None:
    producer = raw_producer(kafka_topics)
    dead_letter(kafka_topics, producer, job="a")
    dead_letter(kafka_topics, producer, job="b", reason="invalid")
    producer.flush()
    letters = DeadLetters(kafka_topics.settings())
    a, b = letters.read()

    # Naming nothing takes every letter: refused without --all, nothing sent.
    with pytest.raises(DeadLetterError, match="--all"):
        letters.redrive(Selection(), by="ops")
    with pytest.raises(UnknownDeadLetterError):
        letters.redrive(Selection(ids=(str(a.id), "ticks:0:999")), by="ops")
    dry = letters.redrive(Selection(every=True), by="ops", dry_run=True)
    assert (dry.matched, dry.sent, dry.dry_run) == (2, [str(a.id), str(b.id)], True)
    assert read_topic(kafka_topics.bootstrap, kafka_topics.ticks) == []

    first = letters.redrive(Selection(ids=(str(a.id),)), by="ops")
    assert (first.sent, first.skipped) == ([str(a.id)], [])
    (sent,) = read_topic(kafka_topics.bootstrap, kafka_topics.ticks, at_least=1)
    assert (sent.key, sent.value) == (a.key, a.value)
    sent_headers = headers(sent)
    assert sent_headers["jobledger.redrive.of"] == str(a.id)
    assert sent_headers["jobledger.redrive.count"] == "1"
    assert "traceparent" in sent_headers and "jobledger.dlq.reason" not in sent_headers

    shown = letters.get(str(a.id))
    assert shown.redriven and shown.redrives[0].by == "ops"
    # The marker is no letter of its own.
    assert [str(x.id) for x in letters.read()] == [str(a.id), str(b.id)]

    again = letters.redrive(Selection(every=True), by="ops")
    assert (again.sent, again.skipped) == ([str(b.id)], [str(a.id)])
    forced = letters.redrive(Selection(ids=(str(a.id),)), by="ops2", force=True)
    assert forced.sent == [str(a.id)]
    sent_all = read_topic(kafka_topics.bootstrap, kafka_topics.ticks, at_least=3)
    counts = Counter(
        (headers(r)["jobledger.redrive.of"], headers(r)["jobledger.redrive.count"])
        for r in sent_all
    )
    assert counts == {(str(a.id), "1"): 1, (str(b.id), "1"): 1, (str(a.id), "2"): 1}
    assert [r.by for r in letters.get(str(a.id)).redrives] == ["ops", "ops2"]
