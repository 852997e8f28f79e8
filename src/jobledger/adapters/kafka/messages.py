"""What travels on the tick and signal topics: compact JSON values, keyed by tenant/job;
a tick enqueued in a traced span carries its W3C ``traceparent`` (``tracestate``) header.

A value that is not UTF-8 JSON of the right shape raises :class:`MalformedMessage` with a
short machine-readable reason; the worker sends such a message to the dead-letter topic.
"""

from __future__ import annotations

import json
import unicodedata
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from jobledger.orchestration.ports import Tick
from jobledger.orchestration.tracing import trace_context

TICK_SCHEMA = "jobledger.tick/1"
SIGNAL_SCHEMA = "jobledger.signal/1"
MAX_ID_LENGTH = 200


class MalformedMessage(Exception):
    """A message no retry can make right: dead-lettered with ``reason`` in its headers."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


def job_key(tenant_id: str, job_id: str) -> bytes:
    """The message key of everything about one job: Kafka's partitioner hashes it, so a
    job's ticks (and its events) stay on one partition, in order."""
    return f"{tenant_id}/{job_id}".encode()


def _dumps(document: dict[str, Any]) -> bytes:
    return json.dumps(document, separators=(",", ":"), ensure_ascii=False).encode()


# ---- ticks -------------------------------------------------------------------------------


@dataclass(frozen=True)
class TickMessage:
    tick: Tick
    dedupe_key: str | None
    enqueued_at_ms: int | None
    """Wall-clock milliseconds when the tick was published (for latency figures)."""


def encode_tick(tick: Tick, *, dedupe_key: str | None, enqueued_at_ms: int) -> bytes:
    # claim_id is not sent: it only lets an in-process retry keep its own claim.
    return _dumps(
        {
            "schema": TICK_SCHEMA,
            "tenant_id": tick.tenant_id,
            "job_id": tick.job_id,
            "reason": tick.reason,
            "dedupe_key": dedupe_key,
            "enqueued_at_ms": enqueued_at_ms,
        }
    )


def decode_tick(
    value: bytes | None, headers: Iterable[tuple[str, bytes]] | None = None
) -> TickMessage:
    document = _object(value)
    _schema(document, TICK_SCHEMA)
    tenant_id = _id(document, "tenant_id")
    job_id = _id(document, "job_id")
    reason = document.get("reason", "queue")
    if not isinstance(reason, str) or not reason:
        raise MalformedMessage("bad_field", "reason must be a non-empty string")
    dedupe_key = document.get("dedupe_key")
    if dedupe_key is not None and not isinstance(dedupe_key, str):
        raise MalformedMessage("bad_field", "dedupe_key must be a string or null")
    enqueued = document.get("enqueued_at_ms")
    if enqueued is not None and (not isinstance(enqueued, int) or isinstance(enqueued, bool)):
        raise MalformedMessage("bad_field", "enqueued_at_ms must be an integer")
    tick = Tick(tenant_id, job_id, reason, trace_context=trace_context(headers))
    return TickMessage(tick, dedupe_key, enqueued)


# ---- signals -----------------------------------------------------------------------------


@dataclass(frozen=True)
class SignalMessage:
    """An outside event for a job: delivered with Engine.signal, idempotent by signal id."""

    tenant_id: str
    job_id: str
    event: str
    signal_id: str
    payload: dict[str, Any]

    @property
    def key(self) -> bytes:
        return job_key(self.tenant_id, self.job_id)

    def encode(self) -> bytes:
        return _dumps(
            {
                "schema": SIGNAL_SCHEMA,
                "tenant_id": self.tenant_id,
                "job_id": self.job_id,
                "event": self.event,
                "signal_id": self.signal_id,
                "payload": self.payload,
            }
        )


def decode_signal(value: bytes | None) -> SignalMessage:
    document = _object(value)
    _schema(document, SIGNAL_SCHEMA)
    payload = document.get("payload", {})
    if payload is None:
        payload = {}
    if not isinstance(payload, dict):
        raise MalformedMessage("bad_field", "payload must be a JSON object")
    return SignalMessage(
        tenant_id=_id(document, "tenant_id"),
        job_id=_id(document, "job_id"),
        event=_id(document, "event"),
        signal_id=_id(document, "signal_id"),
        payload=payload,
    )


# ---- shared checks -----------------------------------------------------------------------


def _object(value: bytes | None) -> dict[str, Any]:
    if value is None or not value:
        raise MalformedMessage("empty", "the message has no value")
    try:
        text = value.decode("utf-8")
    except UnicodeDecodeError as error:
        raise MalformedMessage("not_utf8", str(error)) from None
    try:
        document = json.loads(text)
    except ValueError as error:
        raise MalformedMessage("not_json", str(error)) from None
    except RecursionError:
        raise MalformedMessage("not_json", "the JSON is nested too deeply to read") from None
    if not isinstance(document, dict):
        kind = type(document).__name__
        raise MalformedMessage("not_object", f"expected a JSON object, got {kind}")
    return document


def _schema(document: dict[str, Any], expected: str) -> None:
    # A message without a schema is read as the current one; another schema is refused.
    schema = document.get("schema", expected)
    if schema != expected:
        raise MalformedMessage("unknown_schema", f"schema {schema!r}, expected {expected!r}")


def _id(document: dict[str, Any], name: str) -> str:
    value = document.get(name)
    if value is None:
        raise MalformedMessage("missing_field", f"{name} is missing")
    if not isinstance(value, str) or not value or len(value) > MAX_ID_LENGTH:
        raise MalformedMessage(
            "bad_field", f"{name} must be a non-empty string of at most {MAX_ID_LENGTH} characters"
        )
    if any(unicodedata.category(c) in ("Cc", "Cf", "Zl", "Zp") for c in value):
        raise MalformedMessage("bad_field", f"{name} must not contain control characters")
    return value
