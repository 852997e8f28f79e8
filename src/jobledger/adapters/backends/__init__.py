"""One backend class per kind of store, chosen from the parsed store URL."""

from __future__ import annotations

from jobledger.adapters.backends.base import (
    ADMISSION_TABLE,
    LEASE_TABLE,
    STEP_RATE_TABLE,
    Cursor,
    Migration,
    StoreBackend,
    TrackingConflict,
    Waiter,
)
from jobledger.adapters.backends.sqlite import SQLiteBackend, scratch_backend
from jobledger.adapters.store_url import StoreLocation


def backend_for(location: StoreLocation) -> StoreBackend:
    """The backend of the store at ``location`` (not yet attached to an open store)."""
    if location.kind == SQLiteBackend.kind:
        return SQLiteBackend(location)
    # Imported here: psycopg and eventsourcing.postgres load only for a PostgreSQL store.
    from jobledger.adapters.backends.postgres import PostgresBackend

    return PostgresBackend(location)


__all__ = [
    "ADMISSION_TABLE",
    "LEASE_TABLE",
    "STEP_RATE_TABLE",
    "Cursor",
    "Migration",
    "StoreBackend",
    "TrackingConflict",
    "Waiter",
    "backend_for",
    "scratch_backend",
]
