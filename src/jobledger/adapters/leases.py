"""The Leases port: one row per running job, renewed in place by its worker's heartbeat.

Every write is ONE conditional upsert, so the database serialises a heartbeat and a
take-over of the same job: whichever lands first decides, and the other sees its row.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any
from uuid import UUID

from eventsourcing.postgres import PostgresDatastore
from eventsourcing.sqlite import SQLiteDatastore
from psycopg.sql import SQL, Identifier

from jobledger.adapters.store_errors import store_errors
from jobledger.ports import Lease

LEASE_TABLE = "jobledger_leases"

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

    def __init__(self, datastore: SQLiteDatastore | PostgresDatastore) -> None:
        self.datastore = datastore
        self.is_sqlite = isinstance(datastore, SQLiteDatastore)

    @property
    def table(self) -> str:
        if isinstance(self.datastore, PostgresDatastore):
            return f"{Identifier(self.datastore.schema).as_string()}.{LEASE_TABLE}"
        return LEASE_TABLE

    def create_table(self) -> None:
        """Untranslated: the store that opens this table says what failed."""
        ts = "TEXT" if self.is_sqlite else "TIMESTAMPTZ"
        self._run(
            f"CREATE TABLE IF NOT EXISTS {self.table} (job_uuid TEXT PRIMARY KEY, "
            "claim_id TEXT NOT NULL, worker_id TEXT NOT NULL, epoch INTEGER NOT NULL, "
            f"lease_until {ts} NOT NULL)",
            {},
        )

    # ---- the Leases port ---------------------------------------------------------------

    def renew(self, lease: Lease) -> bool:
        return self._upsert(lease, _RENEW, {})

    def take_over(self, lease: Lease, *, from_claim: str, now: datetime) -> Lease | None:
        params = {"now": self.ts(now), "from_claim": from_claim}
        if self._upsert(lease, _TAKE_OVER, params):
            return None
        # Refused: the row in the way (a take-over never deletes, so it is there).
        return self.get(lease.job_uuid)

    def get(self, job_uuid: UUID) -> Lease | None:
        rows = self._execute(
            f"SELECT {_COLUMNS} FROM {self.table} WHERE job_uuid = :job_uuid",
            {"job_uuid": str(job_uuid)},
            fetch=True,
        )
        if not rows:
            return None
        row = dict(rows[0])
        until = row["lease_until"]
        return Lease(
            job_uuid=UUID(row["job_uuid"]),
            claim_id=row["claim_id"],
            worker_id=row["worker_id"],
            epoch=row["epoch"],
            lease_until=datetime.fromisoformat(until) if isinstance(until, str) else until,
        )

    # ---- SQL -----------------------------------------------------------------------------

    def ts(self, value: datetime) -> datetime | str:
        # SQLite: fixed-width UTC ISO text, the format the status view compares with.
        return value.astimezone(UTC).isoformat(timespec="microseconds") if self.is_sqlite else value

    def _upsert(self, lease: Lease, condition: str, extra: Mapping[str, Any]) -> bool:
        statement = _UPSERT.format(
            table=f"{self.table} AS l",
            greatest="max" if self.is_sqlite else "GREATEST",
            condition=condition,
        )
        params = {
            "job_uuid": str(lease.job_uuid),
            "claim_id": lease.claim_id,
            "worker_id": lease.worker_id,
            "epoch": lease.epoch,
            "lease_until": self.ts(lease.lease_until),
            **extra,
        }
        return bool(self._execute(statement, params, fetch=True))

    def _execute(
        self, statement: str, params: Mapping[str, Any], *, fetch: bool = False
    ) -> list[Any]:
        with store_errors("using the lease table"):
            return self._run(statement, params, fetch=fetch)

    def _run(self, statement: str, params: Mapping[str, Any], *, fetch: bool = False) -> list[Any]:
        with self.datastore.transaction(commit=True) as curs:
            if self.is_sqlite:
                curs.execute(statement, params)
            else:
                # Assembled from this module's literals only, never from input.
                curs.execute(SQL(_pg_params(statement)), params)
            return list(curs.fetchall()) if fetch else []


def _pg_params(statement: str) -> str:
    for name in ("job_uuid", "claim_id", "worker_id", "epoch", "lease_until", "now", "from_claim"):
        statement = statement.replace(f":{name}", f"%({name})s")
    return statement
