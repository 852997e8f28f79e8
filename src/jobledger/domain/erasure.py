"""Personal data and its erasure: which values of a job are personal, and what is left of
them once their data subject's key is destroyed.

A workflow definition names the personal values of its jobs as dotted paths into the job's
state (``personal_data: [customer.email, customer.name]``). The store seals every value at
one of those paths, wherever an event carries state (the submitted input, a step's output
and state patch, a signal's or resume's payload), with a key held outside the log
(``FieldSealer``); erasing destroys the key, and the sealed values read as :data:`ERASED`.
The chain hashes the sealed form, so it verifies before and after.
"""

from __future__ import annotations

import unicodedata
from collections.abc import Callable, Iterable, Mapping, Sequence
from copy import deepcopy
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Final, Protocol

from jobledger.domain.errors import InvalidPayloadError

ERASED: Final = "[erased]"
"""What a personal value reads as once its key is gone."""

STATE_FIELDS: Final[Mapping[str, tuple[str, ...]]] = {
    "Job.Submitted": ("state",),
    "Job.StepRecorded": ("output", "state_patch"),
    "Job.SignalBuffered": ("payload",),
    "Job.Resumed": ("payload",),
    "Job.Reset": ("state",),
    "Job.ApprovalVoted": ("data",),
    "Job.ApprovalDecided": ("data",),
}
"""The fields of each event type that carry job state (its paths apply inside them)."""


MAX_SUBJECT_LENGTH: Final = 200


def check_subject(subject: object) -> str:
    """A data subject is a non-empty string of at most 200 characters, no control
    characters. The error never repeats it: it may itself be personal."""
    if not isinstance(subject, str) or not subject.strip() or len(subject) > MAX_SUBJECT_LENGTH:
        raise InvalidPayloadError(
            f"a data subject must be a non-empty string of at most {MAX_SUBJECT_LENGTH} characters"
        )
    if any(unicodedata.category(c) in ("Cc", "Cf", "Zl", "Zp") for c in subject):
        raise InvalidPayloadError("a data subject must not contain control characters")
    return subject


def split(path: str) -> tuple[str, ...]:
    return tuple(path.split("."))


def path_problem(path: object) -> str | None:
    """Why ``path`` is not a dotted path into job state, or None when it is one."""
    if not isinstance(path, str) or not path:
        return "must be a non-empty dotted path such as customer.email"
    if any(not part or part != part.strip() for part in path.split(".")):
        return f"{path!r} has an empty or padded segment (write segments joined by single dots)"
    return None


def value_at(document: Mapping[str, Any], path: Sequence[str]) -> tuple[bool, Any]:
    """(True, the value at ``path`` in ``document``), or (False, None) when it is not there."""
    node: Any = document
    for part in path:
        if not isinstance(node, Mapping) or part not in node:
            return False, None
        node = node[part]
    return True, node


def changed_at(
    document: Mapping[str, Any], paths: Iterable[str], change: Callable[[str, Any], Any]
) -> dict[str, Any]:
    """A copy of ``document`` with the value at each of ``paths`` that it holds changed by
    ``change(path, value)``."""
    copy = deepcopy(dict(document))
    for path in paths:
        *parents, last = split(path)
        node: Any = copy
        for part in parents:
            node = node.get(part) if isinstance(node, dict) else None
        if isinstance(node, dict) and last in node:
            node[last] = change(path, node[last])
    return copy


def replaced(document: Mapping[str, Any], paths: Iterable[str], value: Any) -> dict[str, Any]:
    """A copy of ``document`` with ``value`` at each of ``paths`` that it holds."""
    return changed_at(document, paths, lambda _path, _old: value)


def erased_paths(document: Mapping[str, Any], paths: Iterable[str]) -> list[str]:
    """The ``paths`` whose value in ``document`` reads as :data:`ERASED`."""
    return [p for p in paths if value_at(document, split(p)) == (True, ERASED)]


@dataclass(frozen=True)
class KeyState:
    """What the key store knows of one key."""

    held: bool
    """The key is there: the values sealed with it still open."""
    subject: bool
    """A data subject's key, shared by the subject's jobs (False: one job's own key)."""
    erased_at: datetime | None
    """When it was destroyed by an erasure; None when it never was."""
    shredded: bool
    """Its bytes are gone from the database's files too (False: never erased, or its
    shred is pending)."""


@dataclass(frozen=True)
class Erasure:
    """What the key store recorded of a data subject's erasure."""

    key_ids: tuple[str, ...]
    erased_at: datetime
    shredded: bool
    """Every key's bytes are gone from the database's files (False: a shred is pending)."""


class SubjectKeys(Protocol):
    """The keys personal values are sealed with, held outside the log, one per data
    subject of a tenant (or one per job without a subject). Its adapter lives in the
    store's database (``adapters.subject_keys``)."""

    def key_for(self, tenant_id: str, subject: str | None, job_id: str) -> str:
        """The key id of the subject's key (made on first use; a fresh key per job when
        ``subject`` is None), noting that the job holds values sealed with it."""

    def keys_of(self, tenant_id: str, subject: str) -> dict[str, list[str]]:
        """The subject's live key ids, each with the jobs sealed with it."""

    def jobs_of(self, key_ids: Sequence[str]) -> dict[str, list[str]]:
        """The jobs sealed with each of these keys, held or destroyed."""

    def erasure(self, tenant_id: str, subject: str) -> Erasure | None:
        """The erasure of the subject's keys; None when they never were erased."""

    def destroy(self, tenant_id: str, subject: str, key_ids: Sequence[str], at: datetime) -> bool:
        """Delete the keys for good, note that the subject was erased, and shred them
        (:meth:`shred`): whether that is done."""

    def key_state(self, tenant_id: str, key_id: str) -> KeyState:
        """Whether the tenant's key ``key_id`` is held, whose it is, when it was erased."""

    def destroy_job_key(self, tenant_id: str, job_id: str, key_id: str, at: datetime) -> bool:
        """Delete a job's own key for good, note that the job was erased, and shred it
        (:meth:`shred`): whether that is done."""

    def shred(self, at: datetime) -> bool:
        """Rid the database's files of the bytes of every key destroyed and not yet
        shredded, waiting a bounded time for other connections' transactions that keep
        the old pages. True when done; False when one still does (pending: the next
        call finishes it)."""


def unreadable_fields(
    event_type: str, fields: Mapping[str, Any], paths: Iterable[str]
) -> list[str]:
    """The personal values of an event that read as erased, as ``field.path``."""
    found: list[str] = []
    for name in STATE_FIELDS.get(event_type, ()):
        value = fields.get(name)
        if isinstance(value, Mapping):
            found.extend(f"{name}.{path}" for path in erased_paths(value, paths))
    return found
