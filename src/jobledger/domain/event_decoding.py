"""Typed job events from their canonical JSON fields: the one decoder of the stored rows
(format v2), export lines and outbox values.

JSON has no times, amounts, ids or enums: the canonical form writes them as strings
(``chain.canonical_bytes``), and each is typed back here by the type the event class
declares for the field, so an event read back equals the one written.
"""

from __future__ import annotations

import typing
from collections.abc import Callable, Mapping
from dataclasses import MISSING, fields
from datetime import datetime
from decimal import Decimal
from enum import StrEnum
from types import NoneType, UnionType
from typing import Any, Final
from uuid import UUID

from jobledger.domain import chain
from jobledger.domain.job import Job

BASE_FIELDS: Final = ("originator_id", "originator_version", "timestamp", chain.CHAIN_FIELD)
"""Every event's own identity, time and hash (not part of an export line's ``data``)."""

Converter = Callable[[Any], Any]


def event_class(type_name: str) -> type[Job.Event] | None:
    """The job event class named ``Job.StepRecorded`` (or ``StepRecorded``), if any."""
    owner, _, name = type_name.rpartition(".")
    if owner not in ("", "Job"):
        return None
    found = getattr(Job, name, None)
    return found if isinstance(found, type) and issubclass(found, Job.Event) else None


def field_types(cls: type[Job.Event]) -> dict[str, Any]:
    """The event's own fields (not id, version, time or hash) and their types."""
    return {name: hint for name, hint in _hints(cls).items() if name not in BASE_FIELDS}


def optional_fields(cls: type[Job.Event]) -> set[str]:
    """Fields with a default: added to the class later, absent from older events."""
    return {f.name for f in fields(cls) if f.default is not MISSING}


def typed_fields(cls: type[Job.Event], document: Mapping[str, Any]) -> dict[str, Any]:
    """The canonical fields of a ``cls`` event (id, version, time, its own fields, and the
    chain hash when given) typed back. Raises ValueError (or ArithmeticError) on a value
    that is not of its field's type."""
    state = dict(document)
    for name, convert in _plan(cls):
        value = state.get(name)
        if value is not None:
            state[name] = convert(value)
    return state


def make(cls: type[Job.Event], state: dict[str, Any]) -> Job.Event:
    """The (frozen) event holding ``state``, set as the library sets a stored one."""
    event = object.__new__(cls)
    object.__setattr__(event, "__dict__", state)
    return event


def rebuild(cls: type[Job.Event], document: Mapping[str, Any]) -> Job.Event:
    return make(cls, typed_fields(cls, document))


def typed(hint: Any, value: Any) -> Any:
    """One value as the type ``hint`` names (times, amounts, ids, enums; JSON as is)."""
    if value is None:
        return None
    convert = _converter(hint)
    return value if convert is None else convert(value)


# ---- the plan per event class ----------------------------------------------------------

_HINTS: dict[type, dict[str, Any]] = {}
_PLANS: dict[type, list[tuple[str, Converter]]] = {}


def _hints(cls: type[Job.Event]) -> dict[str, Any]:
    known = _HINTS.get(cls)
    if known is None:
        hints = typing.get_type_hints(cls)
        known = {f.name: hints.get(f.name, Any) for f in fields(cls)}
        _HINTS[cls] = known
    return known


def _plan(cls: type[Job.Event]) -> list[tuple[str, Converter]]:
    """Only the fields that need typing: most are JSON already."""
    known = _PLANS.get(cls)
    if known is None:
        known = []
        for name, hint in _hints(cls).items():
            convert = _UUID if name == "originator_id" else _converter(hint)
            if convert is not None:
                known.append((name, convert))
        _PLANS[cls] = known
    return known


def _converter(hint: Any) -> Converter | None:
    union = typing.get_origin(hint) in (typing.Union, UnionType)
    options = set(typing.get_args(hint)) - {NoneType} if union else {hint}
    if datetime in options:
        return _datetime
    if Decimal in options:
        return _decimal
    if UUID in options:
        return _UUID
    enums = [o for o in options if isinstance(o, type) and issubclass(o, StrEnum)]
    if enums:
        return enums[0]
    return None


def _datetime(value: Any) -> datetime:
    return value if isinstance(value, datetime) else datetime.fromisoformat(str(value))


def _decimal(value: Any) -> Decimal:
    if isinstance(value, bool) or not isinstance(value, str | int | Decimal):
        raise ValueError(f"not an amount: {value!r}")
    return Decimal(str(value))


def _UUID(value: Any) -> UUID:
    return value if isinstance(value, UUID) else UUID(str(value))
