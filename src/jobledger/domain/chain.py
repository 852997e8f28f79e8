"""Tamper evidence: every job event carries sha256(previous hash + canonical bytes of itself)."""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from typing import Any, Final
from uuid import UUID

import orjson

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
    fast = _fast_canonical(document)
    return fast.decode() if fast is not None else _stdlib_canonical(document)


def canonical_bytes(event_type: str, fields: Mapping[str, Any]) -> bytes:
    """Sorted-key compact JSON of the event's type and fields, chain hash excluded: the
    bytes a row stores (``adapters.sealing``) and the chain hashes, encoded once."""
    body = {k: v for k, v in fields.items() if k != CHAIN_FIELD}
    document = {"type": event_type, "fields": body}
    fast = _fast_canonical(document)
    return fast if fast is not None else _stdlib_canonical(document).encode()


def _stdlib_canonical(document: Mapping[str, Any]) -> str:
    """The definition of the canonical form: every stored chain hash was made from it."""
    return json.dumps(
        document, sort_keys=True, separators=(",", ":"), default=_default, ensure_ascii=False
    )


_ORJSON_OPTIONS: Final = orjson.OPT_SORT_KEYS | orjson.OPT_PASSTHROUGH_DATETIME
# Where orjson's bytes can differ from the definition: floats of exponent -5 to -9, which
# json.dumps writes as 1e-05 (two-digit exponent) and orjson as 0.00001 or 1e-5. Found as
# number tokens (a one-digit negative exponent after a digit, closing the token; 0.0000
# opening one after ``:``, ``,`` or ``[``), so ids like "...7e-5a..." do not match; a
# string that looks like one just sends its document the definition's way. Searched for
# by their literal part first: a regex without a literal prefix scans ~20x slower.
_ONE_DIGIT_EXPONENT: Final = re.compile(rb"e-\d[,\]}]")
_SMALL_FIXED: Final = re.compile(rb"0\.0000")
_NUMBER_OPENERS: Final = (b":", b",", b"[", b":-", b",-", b"[-")


def _float_forms_differ(encoded: bytes) -> bool:
    for found in _ONE_DIGIT_EXPONENT.finditer(encoded):
        if encoded[found.start() - 1 : found.start()].isdigit():
            return True
    for found in _SMALL_FIXED.finditer(encoded):
        if encoded[max(0, found.start() - 2) : found.start()].endswith(_NUMBER_OPENERS):
            return True
    return False


def _fast_canonical(document: Mapping[str, Any]) -> bytes | None:
    """The canonical bytes by orjson, ~10x faster than json.dumps, or None when this
    document may not come out byte-identical to ``_stdlib_canonical`` (a float of the forms
    above; what orjson refuses: integers beyond 64 bits, non-string keys, lone surrogates,
    types neither knows, which the definition then accepts or refuses as it always did).
    Datetimes pass through to ``_default`` (orjson's own form differs); UUIDs orjson
    writes as str(uuid) does, and sorts keys by code point like sort_keys."""
    try:
        encoded = orjson.dumps(document, default=_default, option=_ORJSON_OPTIONS)
    except orjson.JSONEncodeError:
        return None
    return None if _float_forms_differ(encoded) else encoded


# orjson reads an integer past 64 bits as a float, silently; the longest it reads whole
# has 20 digits. A run of 19 or more digits anywhere (inside a string too: that only
# costs the slower parse) sends the document to json.loads, which keeps every integer.
_LONG_DIGITS: Final = re.compile(rb"\d{19}")


def parse(data: bytes) -> Any:
    """The JSON value of canonical bytes (a stored row, an export's body), every integer
    kept whole: orjson where it reads the document exactly, json.loads where not."""
    if _LONG_DIGITS.search(data) is None:
        return orjson.loads(data)
    return json.loads(data)


def link(previous_hash: str, event_type: str, fields: Mapping[str, Any]) -> str:
    return link_bytes(previous_hash, canonical_bytes(event_type, fields))


def link_bytes(previous_hash: str, body: bytes) -> str:
    """The chain hash of an event whose canonical bytes are ``body``."""
    digest = hashlib.sha256(previous_hash.encode())
    digest.update(body)
    return digest.hexdigest()


@dataclass(frozen=True)
class Sealed:
    """An event as its row stores it: the canonical bytes the chain hashed (personal values
    sealed), the chain hash, and the writer's signature over it (None: unsigned)."""

    body: bytes
    chain_hash: str
    signature: str | None = None
    signer: str | None = None


SEALED_ATTRIBUTE: Final = "sealed"
"""Where an event written or read in the stored format carries its ``Sealed`` form (not
a dataclass field: never hashed, compared or stored as a field)."""


def attached(event: object) -> Sealed | None:
    found = vars(event).get(SEALED_ATTRIBUTE)
    return found if isinstance(found, Sealed) else None


def attach(event: object, sealed: Sealed) -> None:
    """Give a (frozen) event its stored form and the chain hash in it."""
    state = vars(event)
    state[SEALED_ATTRIBUTE] = sealed
    state[CHAIN_FIELD] = sealed.chain_hash


def sealed_form(event: object) -> Sealed:
    """The stored form of an event: the one it carries, or, for an event read from a row
    of the format before it (no personal values sealed, unsigned), its canonical bytes."""
    found = attached(event)
    if found is not None:
        return found
    body = canonical_bytes(type(event).__qualname__, event_fields(event))
    return Sealed(body, str(vars(event).get(CHAIN_FIELD, "")))


def holds_at(previous_hash: str, event: object, version: int) -> bool:
    """Whether ``event`` is the link after ``previous_hash`` at ``version``: its stored
    bytes (the bytes as written, when it has them) hash to its chain hash."""
    found = attached(event)
    if found is None:
        # Every field the row decoded to: a field added to an old row is an edit too.
        fields = dict(vars(event))
        fields["originator_version"] = version
        return fields.get(CHAIN_FIELD) == link(previous_hash, type(event).__qualname__, fields)
    # The body names its own version: a row moved to another one no longer matches.
    return (
        vars(event).get("originator_version") == version
        and link_bytes(previous_hash, found.body) == found.chain_hash
    )


def event_fields(event: object) -> dict[str, Any]:
    """The fields the event was stored with. A field added to an event class later (with a
    default) is absent from the events stored before it, and they hash as they were written;
    one the event class stores only when set (``stored_when_set``) is absent while None."""
    assert dataclasses.is_dataclass(event)
    stored = vars(event)
    when_set: frozenset[str] = getattr(event, "stored_when_set", frozenset())
    event_class: type = type(event)
    return {
        name: stored[name]
        for name in _field_names(event_class)
        if name in stored and not (name in when_set and stored[name] is None)
    }


@functools.cache
def _field_names(event_class: type) -> tuple[str, ...]:
    """An event class's field names, in order: asked for every event sealed or verified."""
    return tuple(f.name for f in dataclasses.fields(event_class))


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
        if not holds_at(previous, event, version):
            return BrokenLink(version, event_type, "chain hash does not match the event")
        previous = fields[CHAIN_FIELD]
        expected_version += 1
    return None
