"""Tamper evidence: every job event carries sha256(previous hash + canonical bytes of itself)."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from typing import Any
from uuid import UUID

GENESIS = ""
CHAIN_FIELD = "chain_hash"


def _default(value: object) -> object:
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, (UUID, Decimal)):
        return str(value)
    raise TypeError(f"not canonicalisable: {type(value).__name__}")


def canonical_json(document: Mapping[str, Any]) -> str:
    """THE canonical form (the chain hashes it; export lines and outbox values are it):
    sorted keys, no spaces, UTF-8 as is; times ISO 8601, amounts and ids as strings."""
    return json.dumps(
        document, sort_keys=True, separators=(",", ":"), default=_default, ensure_ascii=False
    )


def canonical_bytes(event_type: str, fields: Mapping[str, Any]) -> bytes:
    """Sorted-key compact JSON of the event's type and fields, chain hash excluded."""
    body = {k: v for k, v in fields.items() if k != CHAIN_FIELD}
    return canonical_json({"type": event_type, "fields": body}).encode()


def link(previous_hash: str, event_type: str, fields: Mapping[str, Any]) -> str:
    digest = hashlib.sha256(previous_hash.encode())
    digest.update(canonical_bytes(event_type, fields))
    return digest.hexdigest()


def event_fields(event: object) -> dict[str, Any]:
    """The fields the event was stored with. A field added to an event class later (with a
    default) is absent from the events stored before it, and they hash as they were written."""
    assert dataclasses.is_dataclass(event)
    stored = vars(event)
    return {f.name: stored[f.name] for f in dataclasses.fields(event) if f.name in stored}


@dataclass(frozen=True)
class BrokenLink:
    version: int
    event_type: str
    reason: str


def verify(events: Iterable[object]) -> BrokenLink | None:
    """Recompute a job's chain from its stored events; return the first broken link."""
    previous = GENESIS
    expected_version = 1
    for event in events:
        fields = event_fields(event)
        event_type = type(event).__qualname__
        version = int(fields["originator_version"])
        if version != expected_version:
            return BrokenLink(version, event_type, f"expected version {expected_version}")
        if fields.get(CHAIN_FIELD) != link(previous, event_type, fields):
            return BrokenLink(version, event_type, "chain hash does not match the event")
        previous = fields[CHAIN_FIELD]
        expected_version += 1
    return None
