"""The batches view: one row per bulk action, with its counts, what ``batches list`` reads
and what finds the batches a dead runner left unfinished."""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from datetime import datetime
from typing import Any

from jobledger.adapters.backends import Cursor, StoreBackend
from jobledger.domain.batch import Batch, Outcome

TABLE = "jobledger_batches"


@dataclass
class BatchRow:
    batch_uuid: str
    tenant_id: str
    batch_id: str
    action: str
    by_whom: str
    reason: str
    total: int
    applied: int
    skipped: int
    failed: int
    finished: bool
    created_at: datetime
    updated_at: datetime
    version: int


COLUMNS = [f.name for f in fields(BatchRow)]
_MOMENTS = ("created_at", "updated_at")


def create_statements(d: StoreBackend) -> list[str]:
    t, ts = d.table(TABLE), d.timestamp_type
    return [
        f"CREATE TABLE IF NOT EXISTS {t} ("
        "batch_uuid TEXT PRIMARY KEY, tenant_id TEXT NOT NULL, batch_id TEXT NOT NULL, "
        "action TEXT NOT NULL, by_whom TEXT NOT NULL, reason TEXT NOT NULL, "
        "total INTEGER NOT NULL, applied INTEGER NOT NULL, skipped INTEGER NOT NULL, "
        "failed INTEGER NOT NULL, finished INTEGER NOT NULL, "
        f"created_at {ts} NOT NULL, updated_at {ts} NOT NULL, version INTEGER NOT NULL)",
        f"CREATE INDEX IF NOT EXISTS jobledger_batches_tenant ON {t} (tenant_id, created_at)",
        f"CREATE INDEX IF NOT EXISTS jobledger_batches_open ON {t} (finished)",
    ]


def apply(d: StoreBackend, curs: Cursor, event: Batch.Event) -> None:
    curs.execute(
        d.sql(f"SELECT * FROM {d.table(TABLE)} WHERE batch_uuid = :batch_uuid"),
        {"batch_uuid": str(event.originator_id)},
    )
    found = curs.fetchone()
    row = None if found is None else row_from(d.row(found))
    if row is not None and row.version >= event.originator_version:
        return  # already folded: a replayed batch of notifications changes nothing
    folded = fold(row, event)
    if folded is not None:
        save(d, curs, folded)


def fold(row: BatchRow | None, event: Batch.Event) -> BatchRow | None:
    if isinstance(event, Batch.Created):
        return BatchRow(
            batch_uuid=str(event.originator_id),
            tenant_id=event.tenant_id,
            batch_id=event.batch_id,
            action=event.action,
            by_whom=event.by,
            reason=event.reason,
            total=len(event.job_ids),
            applied=0,
            skipped=0,
            failed=0,
            finished=False,
            created_at=event.timestamp,
            updated_at=event.timestamp,
            version=event.originator_version,
        )
    if row is None:
        return None
    if isinstance(event, Batch.JobDone):
        column = str(Outcome(event.outcome))  # each outcome's count is named as it is
        setattr(row, column, getattr(row, column) + 1)
    elif isinstance(event, Batch.Finished):
        row.finished = True
    row.updated_at, row.version = event.timestamp, event.originator_version
    return row


def save(d: StoreBackend, curs: Cursor, row: BatchRow) -> None:
    values = asdict(row)
    for name in _MOMENTS:
        values[name] = d.ts(values[name])
    values["finished"] = int(row.finished)
    updates = ", ".join(f"{n} = excluded.{n}" for n in COLUMNS if n != "batch_uuid")
    curs.execute(
        d.sql(
            f"INSERT INTO {d.table(TABLE)} ({', '.join(COLUMNS)}) "
            f"VALUES ({', '.join(':' + n for n in COLUMNS)}) "
            f"ON CONFLICT (batch_uuid) DO UPDATE SET {updates}"
        ),
        values,
    )


def row_from(data: dict[str, Any]) -> BatchRow:
    values = {name: data[name] for name in COLUMNS}
    for name in _MOMENTS:
        if isinstance(values[name], str):
            values[name] = datetime.fromisoformat(values[name])
    values["finished"] = bool(values["finished"])
    return BatchRow(**values)


def of_tenant(d: StoreBackend, tenant_id: str, limit: int) -> list[BatchRow]:
    """The tenant's batches, newest first."""
    statement = (
        f"SELECT * FROM {d.table(TABLE)} WHERE tenant_id = :tenant_id "
        "ORDER BY created_at DESC, batch_id DESC LIMIT :limit"
    )
    return [row_from(r) for r in d.fetch(statement, {"tenant_id": tenant_id, "limit": limit})]


def unfinished(d: StoreBackend) -> list[BatchRow]:
    """Every batch not finished yet, of any tenant, oldest first: a runner resumes them."""
    statement = f"SELECT * FROM {d.table(TABLE)} WHERE finished = 0 ORDER BY created_at"
    return [row_from(r) for r in d.fetch(statement)]
