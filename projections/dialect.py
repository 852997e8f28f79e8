"""What differs between SQLite and PostgreSQL for the views: types, parameters, names,
the eventsourcing tracking recorder, and how to wait for new events."""

from __future__ import annotations

import re
import threading
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from datetime import UTC, datetime
from typing import Any, Protocol

from eventsourcing.persistence import TrackingRecorder
from eventsourcing.postgres import PostgresDatastore, PostgresTrackingRecorder
from eventsourcing.sqlite import (
    SQLiteCursor,
    SQLiteDatastore,
    SQLiteTrackingRecorder,
    SQLiteTransaction,
)
from psycopg.sql import SQL, Identifier

_PARAM = re.compile(r"(?<!:):([a-z_][a-z0-9_]*)")


class Cursor(Protocol):
    def execute(self, statement: Any, params: Any = ...) -> Any: ...
    def fetchall(self) -> Sequence[Any]: ...
    def fetchone(self) -> Any: ...


class Dialect:
    """SQL is written once with ``:name`` parameters and ``{table}`` names."""

    timestamp_type: str
    big_int: str

    def __init__(self, tracking: TrackingRecorder) -> None:
        self.tracking = tracking

    def table(self, name: str) -> str:
        raise NotImplementedError

    def sql(self, statement: str) -> Any:
        raise NotImplementedError

    def ts(self, value: datetime | None) -> Any:
        raise NotImplementedError

    def transaction(self) -> AbstractContextManager[Any]:
        raise NotImplementedError

    def reader(self) -> AbstractContextManager[Any]:
        raise NotImplementedError

    def waiter(self, channels: Sequence[str]) -> Waiter:
        raise NotImplementedError

    def row(self, row: Any) -> dict[str, Any]:
        return dict(row)

    def columns(self, curs: Cursor, name: str) -> set[str]:
        """The column names of table ``name`` as it exists now."""
        raise NotImplementedError


class Waiter:
    """Polling: SQLite has no notifications, so the runner looks again every interval."""

    def __init__(self) -> None:
        self.woken = threading.Event()

    def wait(self, timeout: float) -> None:
        self.woken.wait(timeout)
        self.woken.clear()

    def close(self) -> None:
        self.woken.set()


class SQLiteDialect(Dialect):
    timestamp_type = "TEXT"
    big_int = "INTEGER"

    def __init__(self, datastore: SQLiteDatastore) -> None:
        super().__init__(SQLiteTrackingRecorder(datastore))
        self.datastore = datastore

    def table(self, name: str) -> str:
        return name

    def sql(self, statement: str) -> str:
        return statement

    def ts(self, value: datetime | None) -> str | None:
        # Fixed-width UTC ISO text sorts in time order, which the indexes rely on.
        return None if value is None else value.astimezone(UTC).isoformat(timespec="microseconds")

    @contextmanager
    def transaction(self) -> Iterator[Any]:
        """BEGIN IMMEDIATE: a batch reads the view rows it then rewrites, and a deferred
        transaction upgrading to a writer fails at once (no busy wait) if another
        connection wrote in between."""
        with (
            self.datastore.get_connection(commit=True) as connection,
            _ImmediateTransaction(connection, commit=True) as curs,
        ):
            yield curs

    def reader(self) -> AbstractContextManager[Any]:
        return self.datastore.transaction(commit=False)

    def waiter(self, channels: Sequence[str]) -> Waiter:
        return Waiter()

    def columns(self, curs: Cursor, name: str) -> set[str]:
        curs.execute(f"PRAGMA table_info({name})")
        return {self.row(r)["name"] for r in curs.fetchall()}


class _ImmediateTransaction(SQLiteTransaction):
    def __enter__(self) -> SQLiteCursor:
        cursor = self.connection.cursor()
        cursor.execute("BEGIN IMMEDIATE")
        return cursor


class PostgresDialect(Dialect):
    timestamp_type = "TIMESTAMPTZ"
    big_int = "BIGINT"

    def __init__(self, datastore: PostgresDatastore) -> None:
        super().__init__(
            PostgresTrackingRecorder(datastore, tracking_table_name="jobledger_view_tracking")
        )
        self.datastore = datastore

    def table(self, name: str) -> str:
        return f"{Identifier(self.datastore.schema).as_string()}.{name}"

    def sql(self, statement: str) -> SQL:
        # Every statement is assembled from this package's literals, never from input.
        return SQL(_PARAM.sub(r"%(\1)s", statement))

    def ts(self, value: datetime | None) -> datetime | None:
        return value

    def transaction(self) -> AbstractContextManager[Any]:
        return self.datastore.transaction(commit=True)

    def reader(self) -> AbstractContextManager[Any]:
        return self.datastore.transaction(commit=False)

    def waiter(self, channels: Sequence[str]) -> Waiter:
        return ListenWaiter(self.datastore, channels)

    def columns(self, curs: Cursor, name: str) -> set[str]:
        curs.execute(
            SQL(
                "SELECT column_name FROM information_schema.columns "
                "WHERE table_schema = %(schema)s AND table_name = %(name)s"
            ),
            {"schema": self.datastore.schema, "name": name},
        )
        return {self.row(r)["column_name"] for r in curs.fetchall()}


class ListenWaiter(Waiter):
    """LISTEN on the partitions' channels: a commit wakes the runner at once; the poll
    interval stays as a fallback, so a missed notification only costs latency."""

    def __init__(self, datastore: PostgresDatastore, channels: Sequence[str]) -> None:
        super().__init__()
        self.datastore = datastore
        self.channels = list(channels)
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._listen, name="jobledger-listen", daemon=True)
        self.thread.start()

    def _listen(self) -> None:
        while not self.stopped.is_set():
            try:
                with self.datastore.get_connection() as conn:
                    for channel in self.channels:
                        conn.execute(SQL("LISTEN {0}").format(Identifier(channel)))
                    while not self.stopped.is_set():
                        for _ in conn.notifies(timeout=0.5, stop_after=1):
                            self.woken.set()
            except Exception:
                self.woken.set()
                self.stopped.wait(1.0)

    def close(self) -> None:
        self.stopped.set()
        super().close()
        self.thread.join(timeout=5)


def fetch(dialect: Dialect, statement: str, params: dict[str, Any]) -> Iterator[dict[str, Any]]:
    with dialect.reader() as curs:
        curs.execute(dialect.sql(statement), params)
        rows = curs.fetchall()
    return (dialect.row(r) for r in rows)
