"""The numbered migrations of the store's own tables (the ``store`` component).

The events and snapshots tables of the partitions are the eventsourcing library's: its
recorders create (and upgrade) them. These are jobledger's tables beside them. Version 1
is the schema as it was before versions were recorded, written ``IF NOT EXISTS`` so a
store made by an earlier release adopts it; every later change is a new number.
"""

from __future__ import annotations

from jobledger.adapters import tombstones
from jobledger.adapters.backends.base import (
    ADMISSION_TABLE,
    LEASE_TABLE,
    STEP_RATE_TABLE,
    TRACKING_TABLE,
    Cursor,
    Migration,
    StoreBackend,
)

COMPONENT = "store"


def _leases(b: StoreBackend, curs: Cursor) -> None:
    curs.execute(
        b.sql(
            f"CREATE TABLE IF NOT EXISTS {b.table(LEASE_TABLE)} (job_uuid TEXT PRIMARY KEY, "
            "claim_id TEXT NOT NULL, worker_id TEXT NOT NULL, epoch INTEGER NOT NULL, "
            f"lease_until {b.timestamp_type} NOT NULL)"
        )
    )


def _tracking(b: StoreBackend, curs: Cursor) -> None:
    """The readers' positions move from the library's tracking table (one per store
    kind, written through its private insert) to a table of ours, compare-and-swapped."""
    curs.execute(
        b.sql(
            f"CREATE TABLE IF NOT EXISTS {b.table(TRACKING_TABLE)} ("
            f"name TEXT PRIMARY KEY, position {b.big_int} NOT NULL)"
        )
    )
    if not b.table_exists(curs, b.old_tracking_table):
        return
    # Only jobledger's readers (a partition's name, or with ``.outbox``): the library
    # keeps a row of its own there.
    curs.execute(
        b.sql(
            f"INSERT INTO {b.table(TRACKING_TABLE)} (name, position) "
            "SELECT application_name, MAX(notification_id) "
            f"FROM {b.table(b.old_tracking_table)} WHERE application_name LIKE :readers "
            "GROUP BY application_name ON CONFLICT (name) DO NOTHING"
        ),
        {"readers": "jobledger_p%"},
    )


def _append_functions(b: StoreBackend, curs: Cursor) -> None:
    """PostgreSQL: one function per partition events table that appends in one round trip
    (see ``OneTripRecorder``). Nothing on SQLite, whose appends are in-process."""
    for statement in b.append_functions(curs):
        curs.execute(statement)


def _admission(b: StoreBackend, curs: Cursor) -> None:
    """The admission gate's queue (state 0 waiting, 1 admitted, 2 admitted and parked in
    a wait) and the step-rate buckets."""
    t = b.table(ADMISSION_TABLE)
    curs.execute(
        b.sql(
            f"CREATE TABLE IF NOT EXISTS {t} (job_uuid TEXT PRIMARY KEY, "
            "tenant_id TEXT NOT NULL, job_id TEXT NOT NULL, workflow_type TEXT NOT NULL, "
            f"priority INTEGER NOT NULL, rank {b.big_int} NOT NULL, state INTEGER NOT NULL, "
            f"admitted_at {b.timestamp_type})"
        )
    )
    # A pass's questions: each group's best waiting jobs, and what is admitted.
    curs.execute(
        b.sql(
            f"CREATE INDEX IF NOT EXISTS jobledger_admission_queue ON {t} "
            "(state, tenant_id, workflow_type, rank)"
        )
    )
    curs.execute(
        b.sql(
            f"CREATE TABLE IF NOT EXISTS {b.table(STEP_RATE_TABLE)} ("
            f"scope TEXT PRIMARY KEY, next_at {b.big_int} NOT NULL)"
        )
    )


STORE_MIGRATIONS = (
    Migration(1, "the lease table", _leases),
    Migration(2, "the readers' tracking table, positions carried over", _tracking),
    Migration(3, "the partitions' one-round-trip append functions", _append_functions),
    Migration(4, "the admission gate's queue and the step-rate buckets", _admission),
    Migration(5, "the tombstones of archived jobs", tombstones.create),
)
