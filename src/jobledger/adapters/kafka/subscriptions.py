"""A subscription's message made a job (or a signal): what the worker does with a
message of a topic a :class:`~jobledger.domain.subscription.Subscription` reads.

The worker commits the message's offset only once this returns, so a job is durable
before its message counts as read; a worker killed in between leaves the message to be
read again, and the submit's idempotency key (the signal's id) finds what the first
delivery made. A message that cannot become a job raises :class:`MalformedMessage` with
its reason, and the worker dead-letters it: its partition moves on.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any, Protocol

from jobledger.adapters.kafka.dead_letters import REDRIVE_ORIGIN
from jobledger.adapters.kafka.messages import MalformedMessage
from jobledger.domain.errors import (
    IdempotencyKeyReusedError,
    InvalidPayloadError,
    JobConflictError,
    JobFinishedError,
    UnknownJobError,
    UnknownWorkflowError,
)
from jobledger.domain.event_routes import KAFKA_TOPIC
from jobledger.domain.subscription import (
    Message,
    Subscription,
    SubscriptionMessageError,
    render,
)
from jobledger.domain.views import JobView


class SubmittingEngine(Protocol):
    """What a subscription needs of the engine (``jobledger.Engine`` is one)."""

    def submission(
        self,
        tenant_id: str,
        job_id: str | None,
        workflow_type: str,
        *,
        workflow_version: int | None = None,
        input: Mapping[str, Any] | None = None,
        budget: Mapping[str, Any] | None = None,
        idempotency_key: str | None = None,
        correlation_id: str | None = None,
        priority: int | None = None,
    ) -> Any: ...

    def signal(
        self,
        tenant_id: str,
        job_id: str,
        event_name: str,
        payload: Mapping[str, Any] | None = None,
        *,
        signal_id: str,
    ) -> str: ...

    def job(self, tenant_id: str, job_id: str) -> JobView: ...


def message_of(record: Any) -> Message:
    """The record with its value read as JSON; one that is not JSON is malformed."""
    value = record.value
    if not value:
        raise MalformedMessage("empty", "the message has no value")
    try:
        document = json.loads(value)
    except UnicodeDecodeError as error:
        raise MalformedMessage("not_utf8", str(error)) from None
    except ValueError as error:
        raise MalformedMessage("not_json", str(error)) from None
    except RecursionError:
        raise MalformedMessage("not_json", "the JSON is nested too deeply to read") from None
    headers = tuple(record.headers or ())
    topic, partition, offset = _first_read(record, headers)
    return Message(
        topic=topic,
        partition=partition,
        offset=offset,
        key=record.key,
        headers=headers,
        value=document,
    )


def _first_read(record: Any, headers: tuple[tuple[str, bytes], ...]) -> tuple[str, int, int]:
    """Where the message was first read: a redriven dead letter says so in
    ``jobledger.redrive.origin``, so it keeps the identity (and the templates their
    values) of its first delivery, and makes the job that delivery would have made, once."""
    found = [value for name, value in headers if name == REDRIVE_ORIGIN]
    if not found:
        return record.topic, record.partition, record.offset
    text = found[-1].decode("utf-8", "replace")
    topic, _, rest = text.rpartition(":")
    topic, _, partition = topic.rpartition(":")
    if not (re.fullmatch(KAFKA_TOPIC, topic) and partition.isdigit() and rest.isdigit()):
        raise MalformedMessage(
            "origin", f"header {REDRIVE_ORIGIN} {text!r} is not TOPIC:PARTITION:OFFSET"
        )
    return topic, int(partition), int(rest)


def handle(engine: SubmittingEngine, subscription: Subscription, record: Any) -> str:
    """Submit the message's job (or deliver its signal); the outcome, for the worker's
    counts: ``submitted``, ``found`` (a delivery again), or the signal's outcome."""
    message = message_of(record)
    try:
        if subscription.action == "submit":
            return _submit(engine, subscription, message)
        return _signal(engine, subscription, message)
    except SubscriptionMessageError as refused:
        raise MalformedMessage(refused.reason, refused.detail) from None


def _submit(engine: SubmittingEngine, subscription: Subscription, message: Message) -> str:
    identity = subscription.identity(message)
    tenant_id = subscription.tenant_of(message)
    assert subscription.workflow is not None  # the model requires it for a submit
    correlation = subscription.correlation_id
    try:
        submitted = engine.submission(
            tenant_id,
            subscription.job_id_of(message, identity),
            subscription.workflow,
            workflow_version=subscription.workflow_version,
            input=subscription.input_of(message),
            idempotency_key=subscription.dedupe_id(identity),
            correlation_id=None if correlation is None else render(correlation, message),
            priority=subscription.priority,
            budget=subscription.budget,
        )
    except IdempotencyKeyReusedError as error:
        # The business key names a job submitted with other values: not this message's.
        raise MalformedMessage("key_reused", str(error)) from None
    except JobConflictError as error:
        raise MalformedMessage("job_conflict", str(error)) from None
    except UnknownWorkflowError as error:
        raise MalformedMessage("unknown_workflow", str(error)) from None
    except InvalidPayloadError as error:
        raise MalformedMessage("invalid", str(error)) from None
    return "submitted" if submitted.created else "found"


def _signal(engine: SubmittingEngine, subscription: Subscription, message: Message) -> str:
    identity = subscription.identity(message)
    tenant_id = subscription.tenant_of(message)
    assert subscription.job_id is not None and subscription.event is not None
    try:
        return engine.signal(
            tenant_id,
            render(subscription.job_id, message),
            render(subscription.event, message),
            subscription.input_of(message),
            signal_id=subscription.dedupe_id(identity),
        )
    except UnknownJobError as error:
        raise MalformedMessage("unknown_job", str(error)) from None
    except JobFinishedError as error:
        raise MalformedMessage("job_finished", str(error)) from None
    except InvalidPayloadError as error:
        raise MalformedMessage("invalid", str(error)) from None
