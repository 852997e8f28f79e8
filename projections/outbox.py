"""The event outbox: every job event, published to the events topic in log order.

It reads each partition's notification log with the follower the views use, and keeps
its own tracking position per partition (``<partition>.outbox``). The position is
moved only after the publisher says every message of the batch was acknowledged, so a
crash never loses an event: the next start publishes again from the tracked position.
Duplicates are possible after a crash, and they carry the same position (and job
version) so consumers can drop them.

A message: key ``tenant/job``; headers ``tenant``, ``job``, ``job_uuid``,
``event_type``, ``job_version``, ``log`` (the partition), ``position`` (the event's
notification id in that log) and, for a traced job, its W3C ``traceparent`` (and
``tracestate``); value the canonical JSON of the event as stored, with its
chain hash, ``{"type": "Job.StepRecorded", "fields": {...}}`` (and ``signature``,
``signer`` when signed): personal values travel sealed, never in the clear.
:func:`decode_event` turns a value back into the domain event, so a consumer can fold
job state (and verify the hash chain) from the topic alone: apply an event when its
``job_version`` is the next one for its job, drop it when it is older.

Event routes (:class:`~jobledger.domain.event_routes.EventRoute`) send each event that
matches one to that route's topic too, as a CloudEvent (:mod:`jobledger.adapters.cloud_events`),
in the same batch: the position moves only after every copy was acknowledged.
"""

from __future__ import annotations

import json
import logging
from collections import OrderedDict
from collections.abc import Sequence
from datetime import datetime
from typing import Any
from uuid import UUID

import orjson
from eventsourcing.persistence import Notification, Tracking

from jobledger.adapters import cloud_events
from jobledger.adapters.event_store import EventSourcedJobStore, LedgerPartition
from jobledger.adapters.follower import Lag, LogFollower, TrackedReader, lag
from jobledger.adapters.store_errors import store_errors
from jobledger.domain import chain, event_decoding
from jobledger.domain.chain import Sealed
from jobledger.domain.errors import StoreUnavailableError
from jobledger.domain.event_routes import EventRoute
from jobledger.domain.job import Job
from jobledger.orchestration.ports import EventPublisher, Lock, OutboxMessage
from jobledger.orchestration.tracing import trace_headers

log = logging.getLogger(__name__)

BATCH = 500
_NAMES_CACHED = 100_000
_Names = tuple[str, str, dict[str, str] | None, str]
"""A job's tenant, id, trace context and workflow type, as its Submitted event holds them."""


class OutboxTracking(TrackedReader):
    """Where the outbox is in each partition's log: ``<partition>.outbox``."""

    def tracking_name(self, partition: LedgerPartition) -> str:
        return f"{partition.name}.outbox"


class Outbox(OutboxTracking):
    def __init__(
        self,
        store: EventSourcedJobStore,
        publisher: EventPublisher,
        *,
        lock: Lock | None = None,
        batch: int = BATCH,
        routes: Sequence[EventRoute] = (),
    ) -> None:
        super().__init__(store)
        self.publisher = publisher
        self.lock = lock
        self.routes = tuple(routes)
        if self.routes:
            cloud_events.require_library()
        self.follower = LogFollower(store, self, batch=batch)
        self.published = 0
        self._names: OrderedDict[UUID, _Names] = OrderedDict()

    @store_errors("publishing the outbox")
    def publish_pending(self) -> int:
        """Publish everything appended so far (if this instance holds the outbox lock:
        one publisher at a time keeps each job's events in order on the topic).
        Returns how many events were published."""
        if self.lock is not None and not self.lock.try_acquire():
            return 0
        before = self.published
        self.follower.catch_up()
        return self.published - before

    def process(self, partition: LedgerPartition, notifications: Sequence[Notification]) -> None:
        """Publish a batch, then (only after the broker acknowledged all of it) move the
        position: a crash in between publishes the batch again, never loses it."""
        after = self.position(partition)
        messages = []
        for notification in notifications:
            event = partition.mapper.to_domain_event(notification)
            if isinstance(event, Job.Event):
                messages.append(self.message(partition.name, notification.id, event))
                messages += self.routed(partition.name, notification.id, event)
        if messages:
            self.publisher.publish(messages)  # every message acknowledged, or it raises
        tracking = Tracking(self.tracking_name(partition), notifications[-1].id)
        with self.tracked(partition) as (curs, _):
            self.track(curs, tracking, after=after)
        self.published += sum(message.topic is None for message in messages)

    def lag(self) -> list[Lag]:
        return self.follower.lag()

    def pending_since(self) -> dict[str, datetime | None]:
        return self.follower.pending_since()

    # ---- one message -------------------------------------------------------------------

    def message(self, log_name: str, position: int, event: Job.Event) -> OutboxMessage:
        tenant_id, job_id, trace, _ = self.names(event)
        event_type = type(event).__qualname__
        headers = [
            ("tenant", tenant_id.encode()),
            ("job", job_id.encode()),
            ("job_uuid", str(event.originator_id).encode()),
            ("event_type", event_type.rpartition(".")[2].encode()),
            ("job_version", str(event.originator_version).encode()),
            ("log", log_name.encode()),
            ("position", str(position).encode()),
            *trace_headers(trace),
        ]
        return OutboxMessage(
            key=f"{tenant_id}/{job_id}".encode(),
            value=encode_event(event),
            headers=headers,
            log=log_name,
            position=position,
        )

    def routed(self, log_name: str, position: int, event: Job.Event) -> list[OutboxMessage]:
        """The event as a CloudEvent to each routed topic whose route it matches."""
        if not self.routes:
            return []
        tenant_id, job_id, _, workflow = self.names(event)
        event_type = type(event).__name__
        routes = [route for route in self.routes if route.matches(workflow, event_type)]
        if not routes:
            return []
        value = encode_event(event)
        sealed = chain.sealed_form(event)
        facts = cloud_events.JobEventFacts(
            tenant_id=tenant_id,
            job_id=job_id,
            workflow=workflow,
            job_uuid=str(event.originator_id),
            version=event.originator_version,
            event_type=event_type,
            time=event.timestamp,
            chain_hash=sealed.chain_hash,
            signer=sealed.signer,
            value=value,
        )
        messages = []
        for route in routes:
            cloud = cloud_events.cloud_event_message(facts, route.mode)
            messages.append(
                OutboxMessage(
                    key=cloud.key,
                    value=cloud.value,
                    headers=cloud.headers,
                    log=log_name,
                    position=position,
                    topic=route.topic,
                )
            )
        return messages

    def names(self, event: Job.Event) -> _Names:
        """The job's tenant, id, trace context and workflow type (only Submitted carries
        them; later events are looked up once per job and cached)."""
        job = event.originator_id
        if isinstance(event, Job.Submitted):
            names = _names(event)
        elif job in self._names:
            self._names.move_to_end(job)
            return self._names[job]
        else:
            first = self.store.events(job, to_version=1)
            if not first or not isinstance(first[0], Job.Submitted):
                raise StoreUnavailableError(f"job {job} has no Submitted event to name it by")
            names = _names(first[0])
        self._names[job] = names
        if len(self._names) > _NAMES_CACHED:
            self._names.popitem(last=False)
        return names


def _names(submitted: Job.Submitted) -> _Names:
    return (
        submitted.tenant_id,
        submitted.job_id,
        submitted.trace_context,
        submitted.workflow_type,
    )


def outbox_lag(store: EventSourcedJobStore) -> list[Lag]:
    """Per partition: the last event, the last one published, how far behind."""
    return lag(store, OutboxTracking(store))


class OutboxRunner(LogFollower):
    """Keeps the outbox publishing: woken by new events the way the store's backend can;
    backs off on a store or broker error and resumes from the tracked position."""

    what = "outbox pass"

    def __init__(self, outbox: Outbox, *, poll_interval: float = 0.2) -> None:
        super().__init__(
            outbox.store, outbox, batch=outbox.follower.batch, poll_interval=poll_interval
        )
        self.outbox = outbox

    def follow(self) -> None:
        self.outbox.publish_pending()

    def stopped(self) -> None:
        if self.outbox.lock is not None:
            self.outbox.lock.release()


# ---- the value: the event's stored form, and back ----------------------------------------


def encode_event(event: Job.Event) -> bytes:
    """The canonical JSON of the event as stored: its type and fields as the chain hashed
    them (personal values sealed: the topic never carries them in the clear) plus the
    chain hash in the fields, and the writer's ``signature`` and ``signer`` when signed."""
    sealed = chain.sealed_form(event)
    document: dict[str, Any] = orjson.loads(sealed.body)
    document["fields"][chain.CHAIN_FIELD] = sealed.chain_hash
    if sealed.signature is not None:
        document["signature"] = sealed.signature
        document["signer"] = sealed.signer
    return chain.canonical_json(document).encode()


def decode_event(value: bytes) -> Job.Event:
    """The domain event a message's value holds (fields typed back: times, amounts,
    the job's UUID; personal values still sealed), as a consumer folding job state from
    the topic needs it, with its stored form so its chain (and signature) can be checked."""
    document = json.loads(value)
    kind = document["type"]
    cls = event_decoding.event_class(kind) if kind.startswith("Job.") else None
    if cls is None:
        raise ValueError(f"not a job event type: {kind!r}")
    fields = dict(document["fields"])
    chain_hash = str(fields.get(chain.CHAIN_FIELD, ""))
    event = event_decoding.rebuild(cls, fields)
    body = chain.canonical_bytes(kind, fields)
    chain.attach(event, Sealed(body, chain_hash, document.get("signature"), document.get("signer")))
    return event
