"""At-most-once keys as event identities.

Each use of a key is the first (and only) event of a tiny aggregate whose id is derived from
the key. It is appended in the same atomic write as the change it guards, so a second use
collides on the store's (originator_id, originator_version) uniqueness and writes nothing.
"""

from __future__ import annotations

from datetime import datetime
from uuid import UUID

from eventsourcing.domain import Aggregate

from jobledger.identity import key_uuid


class KeyKind:
    STEP = "step"
    SUBMIT = "submit"
    TOKEN = "token"
    SIGNAL = "signal"
    APPROVAL = "approval"


class ConsumedKey(Aggregate):
    """The record that one key was used, by which job, for what."""

    kind: str
    key: str
    tenant_id: str
    job_id: str
    job_uuid: UUID

    def __init__(self) -> None:
        """State is set by the ``Consumed`` event."""

    class Consumed(Aggregate.Created):
        kind: str
        key: str
        tenant_id: str
        job_id: str
        job_uuid: UUID

        def apply(self, aggregate: object) -> None:
            assert isinstance(aggregate, ConsumedKey)
            aggregate.kind = self.kind
            aggregate.key = self.key
            aggregate.tenant_id = self.tenant_id
            aggregate.job_id = self.job_id
            aggregate.job_uuid = self.job_uuid

    @classmethod
    def consume(
        cls,
        *,
        kind: str,
        key: str,
        tenant_id: str,
        job_id: str,
        job_uuid: UUID,
        timestamp: datetime,
    ) -> ConsumedKey:
        return cls._create(
            cls.Consumed,
            id=key_uuid(tenant_id, kind, key),
            kind=kind,
            key=key,
            tenant_id=tenant_id,
            job_id=job_id,
            job_uuid=job_uuid,
            timestamp=timestamp,
        )
