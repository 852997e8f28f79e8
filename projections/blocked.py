"""Jobs a worker could not run as deployed, and why: what ``show`` and ``list`` say about
a job that is left untouched (a worker without its pinned definition, its executor or a
token secret).

Not a view of the log: a deployment problem is not something that happened to the job,
so it is kept out of the job's history. Workers write a note when they refuse a tick; a
note applies while the job is still at the version it names, so nothing has to clear it
(the first append of a worker that can run the job makes it stale).
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from jobledger.adapters.backends import Cursor, StoreBackend
from jobledger.domain.identity import job_uuid
from jobledger.orchestration.ports import BlockedNote

TABLE = "jobledger_blocked_jobs"


def create_statements(d: StoreBackend) -> list[str]:
    ts = d.timestamp_type
    return [
        f"CREATE TABLE IF NOT EXISTS {d.table(TABLE)} ("
        "job_uuid TEXT PRIMARY KEY, tenant_id TEXT NOT NULL, job_id TEXT NOT NULL, "
        "version INTEGER NOT NULL, reason TEXT NOT NULL, worker_id TEXT NOT NULL, "
        f"noticed_at {ts} NOT NULL)"
    ]


def save(d: StoreBackend, curs: Cursor, note: BlockedNote) -> None:
    names = ["job_uuid", "tenant_id", "job_id", "version", "reason", "worker_id", "noticed_at"]
    updates = ", ".join(f"{n} = excluded.{n}" for n in names if n != "job_uuid")
    curs.execute(
        d.sql(
            f"INSERT INTO {d.table(TABLE)} ({', '.join(names)}) "
            f"VALUES ({', '.join(':' + n for n in names)}) "
            f"ON CONFLICT (job_uuid) DO UPDATE SET {updates}"
        ),
        {
            "job_uuid": str(job_uuid(note.tenant_id, note.job_id)),
            "tenant_id": note.tenant_id,
            "job_id": note.job_id,
            "version": note.version,
            "reason": note.reason,
            "worker_id": note.worker_id,
            "noticed_at": d.ts(note.noticed_at),
        },
    )


def current(d: StoreBackend, jobs: Sequence[tuple[str, int]]) -> dict[str, BlockedNote]:
    """The notes that still apply to ``jobs`` (job uuid, version), by job uuid."""
    if not jobs:
        return {}
    names = [f"u{n}" for n in range(len(jobs))]
    statement = (
        f"SELECT * FROM {d.table(TABLE)} WHERE job_uuid IN ({', '.join(':' + n for n in names)})"
    )
    params = {name: uuid for name, (uuid, _) in zip(names, jobs, strict=True)}
    versions = dict(jobs)
    return {
        row["job_uuid"]: _note(row)
        for row in d.fetch(statement, params)
        if versions.get(row["job_uuid"]) == row["version"]
    }


def _note(row: dict[str, Any]) -> BlockedNote:
    noticed = row["noticed_at"]
    return BlockedNote(
        tenant_id=row["tenant_id"],
        job_id=row["job_id"],
        version=row["version"],
        reason=row["reason"],
        worker_id=row["worker_id"],
        noticed_at=datetime.fromisoformat(noticed) if isinstance(noticed, str) else noticed,
    )
