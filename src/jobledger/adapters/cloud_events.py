"""A job event as a CloudEvent 1.0 on Kafka (the CloudEvents Kafka protocol binding), by
the ``cloudevents`` library (the ``cloudevents`` extra).

- ``id``: the job's UUID and the event's version (``<uuid>/<version>``): the same event
  sent again (the outbox delivers at least once) has the same id, so consumers dedupe by it;
- ``source``: ``jobledger/<tenant>/<workflow type>``; ``type``: ``jobledger.job.<Event>``
  (``jobledger.job.StepRecorded``); ``subject``: the job id; ``time``: the event's time;
- extensions: ``jobledgertenant``, ``jobledgerjobversion`` (a string, as a binary-mode
  header carries it), ``jobledgerchainhash`` and, for a signed event, ``jobledgersigner``;
- data (``application/json``): the event as the events topic carries it
  (:func:`jobledger.projections.outbox.encode_event`: personal values sealed, never in the
  clear). Binary mode sends exactly those bytes as the value; structured mode embeds them.

The Kafka key is the job (``tenant/job``), so a job's events stay in order on the topic.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any, Literal
from urllib.parse import quote

from jobledger.domain.errors import ConfigError

if TYPE_CHECKING:
    from cloudevents.core.v1.event import CloudEvent

EVENT_TYPE_PREFIX = "jobledger.job."
DATA_CONTENT_TYPE = "application/json"


@dataclass(frozen=True)
class JobEventFacts:
    """What a CloudEvent says about one job event, gathered by the outbox."""

    tenant_id: str
    job_id: str
    workflow: str
    job_uuid: str
    version: int
    event_type: str
    """The short name: ``StepRecorded``."""
    time: datetime
    chain_hash: str
    signer: str | None
    value: bytes
    """The event as the events topic carries it (sealed canonical JSON)."""


@dataclass(frozen=True)
class CloudEventMessage:
    key: bytes
    value: bytes
    headers: list[tuple[str, bytes]]


def event_id(job_uuid: str, version: int) -> str:
    return f"{job_uuid}/{version}"


def require_library() -> None:
    """Raise a configuration error unless the ``cloudevents`` library is installed: routes
    are refused at start-up rather than failing the outbox at its first routed event."""
    try:
        import cloudevents.core.bindings.kafka  # noqa: F401
    except ImportError as error:
        raise ConfigError(
            "event_routes need the cloudevents library: pip install 'jobledger[cloudevents]'"
            f" ({error})"
        ) from None


def cloud_event_message(
    facts: JobEventFacts, mode: Literal["structured", "binary"]
) -> CloudEventMessage:
    """The Kafka message of one job event in the binding's structured or binary mode."""
    # The library is an extra: imported only where routes are configured.
    from cloudevents.core.bindings import kafka
    from cloudevents.core.formats.json import JSONFormat

    key = f"{facts.tenant_id}/{facts.job_id}".encode()
    if mode == "binary":
        event = _cloud_event(facts, facts.value)
        message = kafka.to_binary(event, JSONFormat(), lambda _: key)
    else:
        data: dict[str, Any] = json.loads(facts.value)
        message = kafka.to_structured(_cloud_event(facts, data), JSONFormat(), lambda _: key)
    return CloudEventMessage(key, message.value, list(message.headers.items()))


def _cloud_event(facts: JobEventFacts, data: dict[str, Any] | bytes) -> CloudEvent:
    from cloudevents.core.v1.event import CloudEvent

    attributes: dict[str, Any] = {
        "id": event_id(facts.job_uuid, facts.version),
        "source": f"jobledger/{quote(facts.tenant_id, safe='')}/{quote(facts.workflow, safe='')}",
        "type": EVENT_TYPE_PREFIX + facts.event_type,
        "subject": facts.job_id,
        "time": facts.time,
        "datacontenttype": DATA_CONTENT_TYPE,
        "jobledgertenant": facts.tenant_id,
        "jobledgerjobversion": str(facts.version),
        "jobledgerchainhash": facts.chain_hash,
    }
    if facts.signer is not None:
        attributes["jobledgersigner"] = facts.signer
    return CloudEvent(attributes, data)
