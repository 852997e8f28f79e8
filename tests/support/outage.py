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
