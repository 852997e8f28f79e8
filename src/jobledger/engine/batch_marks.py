"""The mark a bulk action leaves on each job it acts on: the key ``(BATCH, batch id)``,
consumed in the same append as the job's own event.

The commands on jobs know nothing of batches: the bulk runner says, around one command,
which job it acts on for which batch, and the append of that job (and no other job the
command touches on the way, a parent told of its child, say) carries the mark. So an
action and its mark land together or not at all, and a second attempt collides.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from datetime import datetime
from uuid import UUID

from jobledger.domain.identity import job_uuid
from jobledger.domain.job import Job
from jobledger.domain.keys import ConsumedKey, KeyKind, key_id


@dataclass(frozen=True)
class _Acting:
    batch_id: str
    job_uuid: UUID


_ACTING: ContextVar[_Acting | None] = ContextVar("jobledger_batch_acting", default=None)


@contextmanager
def acting_for(batch_id: str, tenant_id: str, job_id: str) -> Iterator[None]:
    """Within this block, the append of job ``job_id`` consumes the batch's mark."""
    token = _ACTING.set(_Acting(batch_id, job_uuid(tenant_id, job_id)))
    try:
        yield
    finally:
        _ACTING.reset(token)


def marks(job: Job, now: datetime) -> list[ConsumedKey]:
    """The mark to consume with this append of ``job``: none outside a batch's action."""
    acting = _ACTING.get()
    if acting is None or acting.job_uuid != job.id:
        return []
    consumed = ConsumedKey.consume(
        kind=KeyKind.BATCH,
        key=acting.batch_id,
        tenant_id=job.tenant_id,
        job_id=job.job_id,
        job_uuid=job.id,
        timestamp=now,
    )
    return [consumed]


def mark_id(batch_id: str, tenant_id: str, job_id: str) -> UUID:
    """Where the store keeps the mark (beside the job: ``find_key(job uuid, this)``)."""
    return key_id(KeyKind.BATCH, tenant_id, job_id, batch_id)
