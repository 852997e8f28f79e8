"""The Leases port: one row per running job, renewed in place by its worker's heartbeat.

Every write is ONE conditional upsert, so the database serialises a heartbeat and a
take-over of the same job: whichever lands first decides, and the other sees its row.
The table is made by the store's migrations (:mod:`jobledger.adapters.backends`).
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any
from uuid import UUID

from jobledger.adapters.backends import LEASE_TABLE, StoreBackend
from jobledger.adapters.store_errors import store_errors
from jobledger.orchestration.ports import Lease

_COLUMNS = "job_uuid, claim_id, worker_id, epoch, lease_until"
_UPSERT = (
    f"INSERT INTO {{table}} ({_COLUMNS}) "
    "VALUES (:job_uuid, :claim_id, :worker_id, :epoch, :lease_until) "
    "ON CONFLICT (job_uuid) DO UPDATE SET claim_id = excluded.claim_id, "
    "worker_id = excluded.worker_id, epoch = {greatest}(l.epoch, excluded.epoch), "
    "lease_until = excluded.lease_until WHERE {condition} RETURNING job_uuid"
)
# A heartbeat extends its own claim's row, or replaces the row of an older claim (a
# finished step's, or a take-over that lost its append). A row with a newer epoch and
# another claim is a take-over of this claim: the heartbeat has lost.
_RENEW = "l.claim_id = excluded.claim_id OR l.epoch < excluded.epoch"
# A take-over is refused by a live row that is the old claim's heartbeat, or another
# take-over under way at this version; a lapsed row, or a stale one of an older claim,
# gives way. Its own claim's row (a retried tick) is its own.
_TAKE_OVER = (
    "l.claim_id = excluded.claim_id OR l.lease_until <= :now "
    "OR (l.epoch < excluded.epoch AND l.claim_id <> :from_claim)"
)


class LeaseTable:
    """``jobledger_leases`` in the store's own database (SQLite file or PostgreSQL schema)."""

    def __init__(self, backend: StoreBackend) -> None:
        self.backend = backend

    # ---- the Leases port ---------------------------------------------------------------

    def renew(self, lease: Lease) -> bool:
        return self._upsert(lease, _RENEW, {})

    def take_over(self, lease: Lease, *, from_claim: str, now: datetime) -> Lease | None:
        params = {"now": self.backend.ts(now), "from_claim": from_claim}
        if self._upsert(lease, _TAKE_OVER, params):
            return None
        # Refused: the row in the way (a take-over never deletes, so it is there).
        return self.get(lease.job_uuid)

    def get(self, job_uuid: UUID) -> Lease | None:
        table = self.backend.table(LEASE_TABLE)
        with store_errors("using the lease table"):
            rows = self.backend.fetch(
                f"SELECT {_COLUMNS} FROM {table} WHERE job_uuid = :job_uuid",
                {"job_uuid": str(job_uuid)},
            )
        if not rows:
            return None
        row = rows[0]
        until = row["lease_until"]
        return Lease(
            job_uuid=UUID(row["job_uuid"]),
            claim_id=row["claim_id"],
            worker_id=row["worker_id"],
            epoch=row["epoch"],
            lease_until=datetime.fromisoformat(until) if isinstance(until, str) else until,
        )

    # ---- SQL -----------------------------------------------------------------------------

    def _upsert(self, lease: Lease, condition: str, extra: Mapping[str, Any]) -> bool:
        b = self.backend
        statement = _UPSERT.format(
            table=f"{b.table(LEASE_TABLE)} AS l", greatest=b.greatest, condition=condition
        )
        params = {
            "job_uuid": str(lease.job_uuid),
            "claim_id": lease.claim_id,
            "worker_id": lease.worker_id,
            "epoch": lease.epoch,
            "lease_until": b.ts(lease.lease_until),
            **extra,
        }
        with store_errors("using the lease table"), b.transaction() as curs:
            curs.execute(b.sql(statement), params)
            return bool(curs.fetchall())
