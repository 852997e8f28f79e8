"""The event mapper: stored enums come back as their enums.

JSON keeps a ``StrEnum`` as its plain string, so the stored bytes (and the chain hashes
over them) are those of the string, as they always were; reading gives the string back.
An event class names such fields in ``stored_enums`` and they are typed again here, the
one place every stored event is decoded (loads, the log's readers, verify).
"""

from __future__ import annotations

from typing import Any
from uuid import UUID

from eventsourcing.domain import DomainEventProtocol
from eventsourcing.persistence import Mapper, MapperDeserialisationError, StoredEvent


class EnumMapper(Mapper[UUID]):
    def to_domain_event(self, stored_event: StoredEvent) -> DomainEventProtocol[UUID]:
        event = super().to_domain_event(stored_event)
        enums = getattr(type(event), "stored_enums", None)
        if enums:
            state: dict[str, Any] = vars(event)
            for name, enum in enums.items():
                value = state.get(name)
                if value is None:
                    continue
                try:
                    # The event is frozen; its state is set as the library itself does.
                    state[name] = enum(value)
                except ValueError:
                    # Worded as the library words its own, which names the version.
                    raise MapperDeserialisationError(
                        f"Failed to deserialise state of stored event with topic "
                        f"'{stored_event.topic}', originator_id '{stored_event.originator_id}' "
                        f"and originator_version {stored_event.originator_version}: "
                        f"{name} {value!r} is not a {enum.__name__}"
                    ) from None
        return event
