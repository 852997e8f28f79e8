"""Store outages for tests, injected below the adapters.

The database goes away the way a real one does: the driver's own error (sqlite3's or
psycopg's ``OperationalError``) is raised where the eventsourcing library asks its
connection pool for a connection. Everything above the pool (the library's recorders,
then jobledger's adapters) runs for real, so a test sees what the adapters' error
translation makes of it, not what a patched port says.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from typing import Any

import eventsourcing.utils
import psycopg
import pytest

from jobledger.adapters.backends.base import LEASE_TABLE
from jobledger.adapters.event_store import EventSourcedJobStore


class Outage:
    def __init__(self, store: EventSourcedJobStore, monkeypatch: pytest.MonkeyPatch) -> None:
        self.down = False
        self.ended = False
        self.refused = 0
        """Connections refused while down."""
        self.monkeypatch = monkeypatch
        # The library retries a failed PostgreSQL call 10 times, 0.2 s apart, before it
        # gives up; it still does, but without the waits (the outage outlasts them).
        monkeypatch.setattr(eventsourcing.utils, "sleep", lambda _: None)
        for partition in store.partitions:
            pool = getattr(partition.factory, "datastore").pool  # noqa: B009 - untyped
            # The SQLite pool hands out connections with get_connection(); psycopg_pool's
            # with connection() (a context manager the library enters inside its try).
            name = "get_connection" if store.backend.kind == "sqlite" else "connection"
            monkeypatch.setattr(pool, name, self._guard(getattr(pool, name), store.backend.kind))

    def _guard(self, get: Callable[..., Any], kind: str) -> Callable[..., Any]:
        def guarded(*args: Any, **kwargs: Any) -> Any:
            if self.down:
                self.refused += 1
                if kind == "sqlite":
                    raise sqlite3.OperationalError("disk I/O error")
                raise psycopg.OperationalError(
                    "connection failed: server closed the connection unexpectedly"
                )
            return get(*args, **kwargs)

        return guarded

    def begin_on(self, target: object, method: str) -> None:
        """Take the store away the first time ``target.method`` is called (that call
        then fails like every other until ``end``)."""
        original = getattr(target, method)
        armed = [True]

        def starting(*args: Any, **kwargs: Any) -> Any:
            if armed:
                armed.clear()
                self.down = True
            return original(*args, **kwargs)

        self.monkeypatch.setattr(target, method, starting)

    def during(self, target: object, method: str) -> None:
        """Take the store away for every call of ``target.method`` (and only then),
        until ``end``: an outage that always strikes at the same point of a tick."""
        original = getattr(target, method)

        def failing(*args: Any, **kwargs: Any) -> Any:
            if self.ended:
                return original(*args, **kwargs)
            self.down = True
            try:
                return original(*args, **kwargs)
            finally:
                self.down = False

        self.monkeypatch.setattr(target, method, failing)

    def end(self) -> None:
        self.down = False
        self.ended = True


class DiskFull:
    """The disk fills: every write is refused as a full disk refuses it, reads go on.

    On SQLite the driver's own ``database or disk is full`` is raised where the library
    takes the writer's connection (every write, the lease rows' included, takes it). On
    PostgreSQL the server itself refuses: a trigger on the event and lease tables raises
    SQLSTATE 53100 (``disk_full``), which reaches the library's recorder as psycopg's
    ``DiskFull`` through its real insert path, retries included."""

    def __init__(self, store: EventSourcedJobStore, monkeypatch: pytest.MonkeyPatch) -> None:
        self.store = store
        self.full = self.filled = False
        self.refused = 0
        """SQLite writes refused while full (the server counts its own)."""
        monkeypatch.setattr(eventsourcing.utils, "sleep", lambda _: None)  # as in Outage
        if store.backend.kind == "sqlite":
            for partition in store.partitions:
                pool = getattr(partition.factory, "datastore").pool  # noqa: B009 - untyped
                monkeypatch.setattr(pool, "get_connection", self._guard(pool.get_connection))

    def _guard(self, get: Callable[..., Any]) -> Callable[..., Any]:
        def guarded(*args: Any, **kwargs: Any) -> Any:
            if self.full and kwargs.get("is_writer"):
                self.refused += 1
                raise sqlite3.OperationalError("database or disk is full")
            return get(*args, **kwargs)

        return guarded

    def fill_once(self) -> None:
        """Fill the disk, unless it was filled before (and maybe freed since)."""
        if self.filled:
            return
        self.filled = self.full = True
        if self.store.backend.kind != "sqlite":
            self._server(_FILL)

    def free(self) -> None:
        self.full = False
        if self.store.backend.kind != "sqlite":
            self._server(_FREE)

    def _server(self, statements: str) -> None:
        backend = self.store.backend
        tables = [p.events_table for p in self.store.partitions] + [LEASE_TABLE]
        with backend.transaction() as curs:
            for table in tables:
                curs.execute(
                    statements.format(schema=backend.table(""), table=backend.table(table))
                )


_FILL = """
CREATE OR REPLACE FUNCTION {schema}jobledger_test_disk_full() RETURNS trigger
LANGUAGE plpgsql AS $$ BEGIN
  RAISE EXCEPTION 'could not extend file: No space left on device' USING ERRCODE = 'disk_full';
END $$;
CREATE TRIGGER jobledger_test_disk_full BEFORE INSERT OR UPDATE ON {table}
FOR EACH STATEMENT EXECUTE FUNCTION {schema}jobledger_test_disk_full();
"""
_FREE = "DROP TRIGGER IF EXISTS jobledger_test_disk_full ON {table};"
