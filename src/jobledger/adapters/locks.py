"""The Lock port: a file lock beside a SQLite store, a PostgreSQL advisory lock (each
kept by its store's backend)."""

from __future__ import annotations

from jobledger.adapters.backends import backend_for
from jobledger.adapters.store_url import StoreLocation
from jobledger.orchestration.ports import Lock


def lock_for(location: StoreLocation, name: str) -> Lock:
    """The store's lock called ``name``: whoever holds it dying releases it."""
    return backend_for(location).lock(name)
