"""At-most-once keys as event identities.

Each use of a key is the first (and only) event of a tiny aggregate whose id is derived from
the key. It is appended in the same atomic write as the change it guards, so a second use
collides on the store's (originator_id, originator_version) uniqueness and writes nothing.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from enum import StrEnum
from typing import ClassVar
from uuid import UUID

from eventsourcing.domain import Aggregate

from jobledger.domain.identity import job_key_uuid, key_uuid
from jobledger.domain.stored_topics import keep_stored_topics


class KeyKind(StrEnum):
    """What a key guards. Stored as its string (in the key's event and, through
    ``jobledger.domain.identity``, in the key's id), so the values never change."""

    STEP = "step"
    """Rows of this kind are only read: a step's key is now its record's own identity
    (the store names a second record of step n as a duplicate of it). Stores written
    before kept one key row per step, and still hold them."""
    SUBMIT = "submit"
    TOKEN = "token"
    SIGNAL = "signal"
    APPROVAL = "approval"
    BATCH = "batch"
    """A bulk action's mark on each job it acted on, the key being the batch id: consumed
    in the same append as the action, so a resumed batch never acts on a job twice."""


JOB_SCOPED = frozenset({KeyKind.TOKEN, KeyKind.SIGNAL, KeyKind.APPROVAL, KeyKind.BATCH})
"""Kinds used once per job. A submit key is used once per tenant; a step key names its
job itself (and its id must not change, or a re-run step of a stored job would not
collide with its record)."""


def key_id(kind: KeyKind, tenant_id: str, job_id: str, key: str) -> UUID:
    if kind in JOB_SCOPED:
        return job_key_uuid(tenant_id, job_id, kind, key)
    return key_uuid(tenant_id, kind, key)


class ConsumedKey(Aggregate):
    """The record that one key was used, by which job, for what."""

    kind: KeyKind
    key: str
    tenant_id: str
    job_id: str
    job_uuid: UUID

    def __init__(self) -> None:
        """State is set by the ``Consumed`` event."""

    @property
    def route(self) -> UUID:
        """Where the key lives: beside its job, so one append covers both, except a submit
        key, which must be unique per tenant whatever the job id and so lives where its
        own id hashes to."""
        return self.id if self.kind is KeyKind.SUBMIT else self.job_uuid

    class Consumed(Aggregate.Created):
        kind: KeyKind
        stored_enums: ClassVar[Mapping[str, type[StrEnum]]] = {"kind": KeyKind}
        """Fields stored as an enum's string, typed again when read (``adapters.mapper``)."""
        key: str
        tenant_id: str
        job_id: str
        job_uuid: UUID

        def apply(self, aggregate: object) -> None:
            assert isinstance(aggregate, ConsumedKey)
            aggregate.kind = KeyKind(self.kind)
            aggregate.key = self.key
            aggregate.tenant_id = self.tenant_id
            aggregate.job_id = self.job_id
            aggregate.job_uuid = self.job_uuid

    @classmethod
    def consume(
        cls,
        *,
        kind: KeyKind,
        key: str,
        tenant_id: str,
        job_id: str,
        job_uuid: UUID,
        timestamp: datetime,
    ) -> ConsumedKey:
        return cls._create(
            cls.Consumed,
            id=key_id(kind, tenant_id, job_id, key),
            kind=kind,
            key=key,
            tenant_id=tenant_id,
            job_id=job_id,
            job_uuid=job_uuid,
            timestamp=timestamp,
        )


keep_stored_topics("jobledger.keys", ConsumedKey)
