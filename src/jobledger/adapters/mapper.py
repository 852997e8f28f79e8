"""The event mapper: job events to and from their stored rows, in both formats.

Writing: a job event carries the stored form the sealing pipeline made for it
(``adapters.sealing``) and its row is those bytes, never encoded a second time; a job
event without one was not written through the pipeline and is refused. Keys and
snapshots are eventsourcing's transcoder's, as they always were.

Reading: a v2 row (``{"chain_hash":"``) is decoded by the one typed decoder
(``event_decoding``), then its sealed personal values opened (``FieldSealer.open``), and its
stored form attached to the event (``event.sealed``) for verify, export and the outbox.
A row of the format before it (the transcoder's, ``{"timestamp":``) decodes as it did;
JSON keeps a ``StrEnum`` as its plain string, and an event class names such fields in
``stored_enums`` to have them typed again here.
"""

from __future__ import annotations

from typing import Any
from uuid import UUID

from eventsourcing.domain import DomainEventProtocol
from eventsourcing.persistence import (
    Mapper,
    MapperDeserialisationError,
    StoredEvent,
    Transcoder,
)
from eventsourcing.utils import get_topic, resolve_topic

from jobledger.adapters import sealing
from jobledger.domain import chain, event_decoding
from jobledger.domain.identity import job_uuid
from jobledger.domain.job import Job
from jobledger.orchestration.ports import FieldSealer


class UnsealedEventError(ValueError):
    """A job event reached the store without going through the sealing pipeline."""


class SealedMapper(Mapper[UUID]):
    def __init__(self, transcoder: Transcoder, sealer: FieldSealer | None = None) -> None:
        super().__init__(transcoder)
        self.sealer: FieldSealer = sealer if sealer is not None else sealing.NoSealing()

    def to_stored_event(self, domain_event: DomainEventProtocol[UUID]) -> StoredEvent:
        if not isinstance(domain_event, Job.Event):
            return super().to_stored_event(domain_event)
        sealed = chain.attached(domain_event)
        if sealed is None:
            raise UnsealedEventError(
                f"job event {type(domain_event).__qualname__} v{domain_event.originator_version}"
                " was not sealed: job events are written through the store's sealing pipeline"
            )
        return StoredEvent(
            originator_id=domain_event.originator_id,
            originator_version=domain_event.originator_version,
            topic=get_topic(type(domain_event)),
            state=sealing.row_bytes(sealed),
        )

    def to_domain_event(self, stored_event: StoredEvent) -> DomainEventProtocol[UUID]:
        event = self.decode(stored_event)
        if isinstance(event, Job.Event):
            # A row moved to another job is never that job's event: refused here, for
            # every reader (load, history, stream, verify, export).
            row_job = stored_event.originator_id
            why = moved(row_job if isinstance(row_job, UUID) else UUID(row_job), event)
            if why is not None:
                raise MovedRowError(stored_event, why)
        return event

    def decode(self, stored_event: StoredEvent) -> DomainEventProtocol[UUID]:
        state = bytes(stored_event.state)
        try:
            if sealing.is_row(state):
                return self.read_sealed(stored_event, state)
        except (ValueError, ArithmeticError, TypeError, KeyError) as error:
            raise _undecodable(stored_event, str(error)) from None
        event = super().to_domain_event(stored_event)
        enums = getattr(type(event), "stored_enums", None)
        if enums:
            _type_enums(stored_event, vars(event), enums)
        return event

    def read_sealed(self, stored_event: StoredEvent, state: bytes) -> Job.Event:
        sealed, document = sealing.read_row(state)
        cls = resolve_topic(stored_event.topic)
        if not (isinstance(cls, type) and issubclass(cls, Job.Event)):
            raise ValueError(f"{stored_event.topic} is not a job event")
        if document.get("type") != cls.__qualname__:
            raise ValueError(f"the row holds a {document.get('type')!r}, its topic names {cls}")
        fields = document["fields"]
        if not isinstance(fields, dict):
            raise ValueError("the event's fields are not an object")
        # Id and version as the body has them (the hash covers them): a row moved to
        # another version does not fold, and verify names where it belongs.
        typed = event_decoding.typed_fields(cls, fields)
        event = event_decoding.make(cls, self.sealer.open(typed))
        chain.attach(event, sealed)
        return event


class MovedRowError(MapperDeserialisationError):
    """A stored row holds another job's event: its body (hashed and signed) names
    another job than the row it is stored under."""

    def __init__(self, stored_event: StoredEvent, why: str) -> None:
        super().__init__(_undecodable(stored_event, why).args[0])
        self.why = why


def moved(row_job: UUID, event: Job.Event) -> str | None:
    """Why the event is not the job's it is stored under, or None: the job it names
    (the body's ``originator_id``, which its chain hash and signature cover) and, in a
    ``Submitted``, the tenant and job that give it, must both be the row's job."""
    fields = vars(event)
    named = fields.get("originator_id")
    if named != row_job:
        other = (
            f"{event.tenant_id}/{event.job_id} ({named})"
            if isinstance(event, Job.Submitted)
            else f"job {named}"
        )
        return (
            f"the row stored under job {row_job} holds v{fields.get('originator_version')} "
            f"of another job, {other}: rows were moved between jobs"
        )
    if isinstance(event, Job.Submitted) and job_uuid(event.tenant_id, event.job_id) != row_job:
        return (
            f"the row stored under job {row_job} submits another job, "
            f"{event.tenant_id}/{event.job_id}: rows were moved between jobs"
        )
    return None


def _type_enums(stored_event: StoredEvent, state: dict[str, Any], enums: Any) -> None:
    for name, enum in enums.items():
        value = state.get(name)
        if value is None:
            continue
        try:
            # The event is frozen; its state is set as the library itself does.
            state[name] = enum(value)
        except ValueError:
            raise _undecodable(stored_event, f"{name} {value!r} is not a {enum.__name__}") from None


def _undecodable(stored_event: StoredEvent, why: str) -> MapperDeserialisationError:
    # Worded as the library words its own, which names the version.
    return MapperDeserialisationError(
        f"Failed to deserialise state of stored event with topic "
        f"'{stored_event.topic}', originator_id '{stored_event.originator_id}' "
        f"and originator_version {stored_event.originator_version}: {why}"
    )
