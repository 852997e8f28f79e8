"""The tombstones table, and the two transactions that move a job between the store and
its archive: ``bury`` (delete the job's rows, write its tombstone) and ``raise_up``
(write the job's rows back, delete its tombstone). Each is one transaction of the
store's database, so a tombstone never exists without the removal, nor a removal
without its tombstone.

A job's consumed keys (its submit key, token nonces, signal and approval ids) stay in
the store: they keep guarding at-most-once while the job is archived, and a restored
job finds them where they were.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any
from uuid import UUID

from eventsourcing.persistence import Mapper, StoredEvent
from eventsourcing.utils import get_topic

from jobledger.adapters.backends.base import (
    ADMISSION_TABLE,
    LEASE_TABLE,
    TRACKING_TABLE,
    Cursor,
    StoreBackend,
)
from jobledger.domain.errors import RetentionError, VersionConflict
from jobledger.domain.job import Job
from jobledger.domain.retention import Tombstone

TOMBSTONE_TABLE = "jobledger_tombstones"
JOB_TOPICS = get_topic(Job) + ".%"
"""Every job event's topic (keys and snapshots have their own)."""
_COLUMNS = (
    "job_uuid",
    "tenant_id",
    "job_id",
    "workflow_type",
    "status",
    "version",
    "chain_hash",
    "archive_ref",
    "archive_sha256",
    "archived_at",
)
InTransaction = Callable[[Any], None]
"""Work of a layer above (the views' rows of the job) done in the same transaction."""


def create(b: StoreBackend, curs: Cursor) -> None:
    """Store migration 5: one row per archived job."""
    ts = b.timestamp_type
    curs.execute(
        b.sql(
            f"CREATE TABLE IF NOT EXISTS {b.table(TOMBSTONE_TABLE)} (job_uuid TEXT PRIMARY KEY, "
            "tenant_id TEXT NOT NULL, job_id TEXT NOT NULL, workflow_type TEXT NOT NULL, "
            "status TEXT NOT NULL, version INTEGER NOT NULL, chain_hash TEXT NOT NULL, "
            "archive_ref TEXT NOT NULL, archive_sha256 TEXT NOT NULL, "
            f"archived_at {ts} NOT NULL)"
        )
    )


class Tombstones:
    """The tombstones of one store, and the moves in and out of its partitions."""

    def __init__(self, backend: StoreBackend) -> None:
        self.backend = backend

    # ---- reading ---------------------------------------------------------------------

    def get(self, job_uuid: UUID) -> Tombstone | None:
        rows = self.backend.fetch(
            f"SELECT * FROM {self.backend.table(TOMBSTONE_TABLE)} WHERE job_uuid = :job_uuid",
            {"job_uuid": str(job_uuid)},
        )
        return _tombstone(rows[0]) if rows else None

    def all(self, tenant_id: str | None = None) -> list[Tombstone]:
        statement = f"SELECT * FROM {self.backend.table(TOMBSTONE_TABLE)}"
        params: dict[str, Any] = {}
        if tenant_id is not None:
            statement += " WHERE tenant_id = :tenant_id"
            params["tenant_id"] = tenant_id
        rows = self.backend.fetch(statement + " ORDER BY tenant_id, job_id", params)
        return [_tombstone(row) for row in rows]

    # ---- the two moves ---------------------------------------------------------------

    def bury(
        self,
        tombstone: Tombstone,
        tables: tuple[str, str],
        readers: tuple[str, str],
        also: InTransaction | None = None,
    ) -> None:
        """Delete the job's events and snapshots (``tables``), its lease and admission
        rows, then write its tombstone: one transaction. Refused (nothing written) when
        the job moved past the tombstone's head, or when a reader of the log (``readers``:
        the views, then the outbox) has not passed the job's last event yet: removed
        before the outbox published it, an event would never reach the events topic."""
        b = self.backend
        events, snapshots = tables
        with b.transaction() as curs:
            b.hold_appends(curs, events)  # nothing appended to the job after its head is read
            version, last = self._head(curs, events, tombstone.job_uuid)
            if version != tombstone.version:
                raise VersionConflict(
                    f"job {tombstone.job_id!r} of tenant {tombstone.tenant_id!r} is at "
                    f"v{version}, not v{tombstone.version} as archived: archive it again"
                )
            self._check_read(curs, readers, last, tombstone)
            if b.reuses_positions and last == self._newest(curs, events):
                # SQLite gives a new row the position after the newest one: deleting the
                # newest would hand its position again, to an event readers have passed.
                raise RetentionError(
                    f"job {tombstone.job_id!r} of tenant {tombstone.tenant_id!r} holds the "
                    "newest event of its log: it is archived once another event follows"
                )
            target = {"id": b.uuid(tombstone.job_uuid), "job": str(tombstone.job_uuid)}
            curs.execute(b.sql(f"DELETE FROM {b.table(events)} WHERE originator_id = :id"), target)
            curs.execute(
                b.sql(f"DELETE FROM {b.table(snapshots)} WHERE originator_id = :id"), target
            )
            for table in (LEASE_TABLE, ADMISSION_TABLE):
                curs.execute(b.sql(f"DELETE FROM {b.table(table)} WHERE job_uuid = :job"), target)
            if also is not None:
                also(curs)
            curs.execute(
                b.sql(
                    f"INSERT INTO {b.table(TOMBSTONE_TABLE)} ({', '.join(_COLUMNS)}) "
                    f"VALUES ({', '.join(':' + c for c in _COLUMNS)})"
                ),
                _row(b, tombstone),
            )

    def raise_up(
        self,
        tombstone: Tombstone,
        events: Sequence[Job.Event],
        mapper: Mapper[UUID],
        table: str,
        also: InTransaction | None = None,
    ) -> None:
        """Write the job's events back as they are (the stored bytes the mapper makes of
        them: nothing is sealed, hashed or signed again) and delete its tombstone: one
        transaction. Refused when the tombstone is gone (restored already) or the events
        do not end at its head."""
        b = self.backend
        last = events[-1]
        if (last.originator_version, last.chain_hash) != (tombstone.version, tombstone.chain_hash):
            raise RetentionError(
                f"the archive of job {tombstone.job_id!r} ends at v{last.originator_version} "
                f"{last.chain_hash}, its tombstone at v{tombstone.version} "
                f"{tombstone.chain_hash}: nothing restored"
            )
        stored = [mapper.to_stored_event(event) for event in events]
        with b.transaction() as curs:
            job = {"job": str(tombstone.job_uuid)}
            curs.execute(
                b.sql(f"SELECT 1 AS found FROM {b.table(TOMBSTONE_TABLE)} WHERE job_uuid = :job"),
                job,
            )
            if curs.fetchone() is None:
                raise RetentionError(
                    f"job {tombstone.job_id!r} of tenant {tombstone.tenant_id!r} has no "
                    "tombstone (restored already?): nothing restored"
                )
            if self._head(curs, table, tombstone.job_uuid)[0]:
                raise RetentionError(
                    f"job {tombstone.job_id!r} of tenant {tombstone.tenant_id!r} is in the "
                    "store again (submitted anew since it was archived): nothing restored"
                )
            curs.execute(
                b.sql(f"DELETE FROM {b.table(TOMBSTONE_TABLE)} WHERE job_uuid = :job"), job
            )
            b.hold_appends(curs, table)
            for row in stored:
                curs.execute(
                    b.sql(
                        f"INSERT INTO {b.table(table)} "
                        "(originator_id, originator_version, topic, state) "
                        "VALUES (:id, :version, :topic, :state)"
                    ),
                    _stored(b, row),
                )
            if also is not None:
                also(curs)

    # ---- the checks ------------------------------------------------------------------

    def _head(self, curs: Cursor, events: str, job_uuid: UUID) -> tuple[int, int]:
        """The job's last version and the position of its last event in the log."""
        b = self.backend
        curs.execute(
            b.sql(
                f"SELECT MAX(originator_version) AS version, MAX({b.position_column}) AS last "
                f"FROM {b.table(events)} WHERE originator_id = :id AND topic LIKE :topics"
            ),
            {"id": b.uuid(job_uuid), "topics": JOB_TOPICS},
        )
        row = b.row(curs.fetchone())
        return int(row["version"] or 0), int(row["last"] or 0)

    def _newest(self, curs: Cursor, events: str) -> int:
        b = self.backend
        curs.execute(b.sql(f"SELECT MAX({b.position_column}) AS newest FROM {b.table(events)}"))
        return int(b.row(curs.fetchone())["newest"] or 0)

    def _check_read(
        self, curs: Cursor, readers: tuple[str, str], last: int, tombstone: Tombstone
    ) -> None:
        views, outbox = readers
        if self.backend.position(views, curs) < last:
            raise RetentionError(
                f"the job views have not folded job {tombstone.job_id!r} of tenant "
                f"{tombstone.tenant_id!r} to its end yet: catch them up, then archive"
            )
        # No outbox row: no outbox has ever read this store (no events topic to feed).
        curs.execute(
            self.backend.sql(
                f"SELECT position FROM {self.backend.table(TRACKING_TABLE)} WHERE name = :name"
            ),
            {"name": outbox},
        )
        found = curs.fetchone()
        if found is not None and int(self.backend.row(found)["position"]) < last:
            raise RetentionError(
                f"job {tombstone.job_id!r} of tenant {tombstone.tenant_id!r} has events the "
                "outbox has not published yet: not archived until they are"
            )


def _row(b: StoreBackend, t: Tombstone) -> dict[str, Any]:
    return {
        "job_uuid": str(t.job_uuid),
        "tenant_id": t.tenant_id,
        "job_id": t.job_id,
        "workflow_type": t.workflow_type,
        "status": t.status,
        "version": t.version,
        "chain_hash": t.chain_hash,
        "archive_ref": t.archive_ref,
        "archive_sha256": t.archive_sha256,
        "archived_at": b.ts(t.archived_at),
    }


def _stored(b: StoreBackend, row: StoredEvent) -> dict[str, Any]:
    return {
        "id": b.uuid(UUID(str(row.originator_id))),
        "version": row.originator_version,
        "topic": row.topic,
        "state": row.state,
    }


def _tombstone(row: dict[str, Any]) -> Tombstone:
    archived_at = row["archived_at"]
    if isinstance(archived_at, str):
        archived_at = datetime.fromisoformat(archived_at)
    return Tombstone(
        job_uuid=UUID(str(row["job_uuid"])),
        tenant_id=str(row["tenant_id"]),
        job_id=str(row["job_id"]),
        workflow_type=str(row["workflow_type"]),
        status=str(row["status"]),
        version=int(row["version"]),
        chain_hash=str(row["chain_hash"]),
        archive_ref=str(row["archive_ref"]),
        archive_sha256=str(row["archive_sha256"]),
        archived_at=archived_at,
    )
