"""SQLite, the embedded default: one file; flock files beside it for locks; polling for
new events (SQLite has no notifications)."""

from __future__ import annotations

import fcntl
import os
import sqlite3
import threading
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import quote
from uuid import UUID, uuid4

from eventsourcing.persistence import OperationalError, StoredEvent
from eventsourcing.sqlite import (
    SQLiteApplicationRecorder,
    SQLiteCursor,
    SQLiteDatastore,
    SQLiteTransaction,
)

from jobledger.adapters.backends.base import Cursor, StoreBackend
from jobledger.adapters.store_url import StoreLocation
from jobledger.domain.errors import StoreMissingError

PAGE_SIZE = 1024
"""The page size of a new store's file. WAL logs whole pages, and a step dirties at least
its row's page and a leaf of the events' (job, version) index, a different leaf for
each job of a group commit: at 1 KiB a step logs about half the bytes it did at
SQLite's default of 4 KiB (``scripts/bench_steps.py``, WAL B/step). A larger event
spills into overflow pages, logged once each."""


class SQLiteBackend(StoreBackend):
    kind = "sqlite"
    timestamp_type = "TEXT"
    big_int = "INTEGER"
    greatest = "max"
    position_column = "rowid"
    reuses_positions = True
    skip_locked = ""
    old_tracking_table = "tracking"

    datastore: SQLiteDatastore

    def attach(self, datastore: Any) -> None:
        assert isinstance(datastore, SQLiteDatastore)
        self.datastore = datastore

    def application_recorder_class(self, default: type[Any]) -> type[Any]:
        return LeanAppendRecorder

    @property
    def path(self) -> str:
        return self.location.env["SQLITE_DBNAME"]

    def require_exists(self) -> None:
        """Only the commands that write jobs create a SQLite store: for the others a
        missing file is a mistake (a typo must not audit as an empty, intact store)."""
        if not os.path.isfile(self.path):
            raise StoreMissingError(f"no store at {self.path} (no such file)")

    def describe(self) -> str:
        return f"at {self.path}"

    def for_reading(self) -> StoreLocation:
        """A file in a directory we cannot write (read-only media, an evidence copy) is
        opened ``mode=ro&immutable=1``: SQLite could not create the WAL index beside it,
        and immutable tells it no other process changes the file, so it needs none.
        Elsewhere an ordinary connection that writes nothing leaves no trace (its WAL
        files go on close)."""
        path = Path(self.path).resolve()
        if os.access(path.parent, os.W_OK) and os.access(path, os.W_OK):
            return self.location
        uri = f"file:{quote(path.as_posix())}?mode=ro&immutable=1"
        return replace(self.location, env={**self.location.env, "SQLITE_DBNAME": uri})

    def create_home(self) -> None:
        """A new file is made here, before the library opens it, with pages of
        ``PAGE_SIZE`` bytes and in WAL mode: the page size is fixed once the first page
        is written (the library's switch to WAL writes it). An existing file is left as
        it is."""
        with self.schema_lock():
            if os.path.exists(self.path) and os.path.getsize(self.path) > 0:
                return
            try:
                connection = sqlite3.connect(self.path, isolation_level=None)
                try:
                    connection.execute(f"PRAGMA page_size = {PAGE_SIZE}")
                    connection.execute("PRAGMA journal_mode = WAL")
                finally:
                    connection.close()
            except sqlite3.Error as error:  # a store error, as the library's open would raise
                raise OperationalError(f"cannot create {self.path}: {error}") from None

    def opening_lock(self, *, read_only: bool) -> AbstractContextManager[None]:
        # A read never takes the lock: it is a file, and the store may be on read-only media.
        return nullcontext() if read_only else self.schema_lock()

    @contextmanager
    def schema_lock(self) -> Iterator[None]:
        """A blocking flock beside the file (switching a new file to WAL fails at once,
        without waiting, if another process is doing the same)."""
        path = f"{self.path}.schema.lock"
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as error:  # a read-only directory, say: a store error, not a crash
            raise OperationalError(f"cannot open the lock file {path}: {error.strerror}") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)  # closing the descriptor releases the lock

    def lock(self, name: str) -> FileLock:
        return FileLock(Path(f"{self.path}.{name}.lock"))

    # ---- statements ----------------------------------------------------------------------

    def table(self, name: str) -> str:
        return name

    def sql(self, statement: str) -> str:
        return statement  # the sqlite3 module takes :name parameters as they are

    def ts(self, value: datetime | None) -> str | None:
        # Fixed-width UTC ISO text sorts in time order, which the indexes rely on.
        return None if value is None else value.astimezone(UTC).isoformat(timespec="microseconds")

    def clock(self) -> datetime:
        """SQLite has no server: the store's clock is the host's, as SQLite reads it
        (to the millisecond)."""
        (row,) = self.fetch("SELECT strftime('%Y-%m-%d %H:%M:%f', 'now') AS now")
        return datetime.fromisoformat(row["now"]).replace(tzinfo=UTC)

    def uuid(self, value: UUID) -> str:
        return value.hex  # how the library writes an originator id in a SQLite table

    @contextmanager
    def transaction(self) -> Iterator[Any]:
        """BEGIN IMMEDIATE: a batch reads the rows it then rewrites, and a deferred
        transaction upgrading to a writer fails at once (no busy wait) if another
        connection wrote in between."""
        with (
            self.datastore.get_connection(commit=True) as connection,
            _ImmediateTransaction(connection, commit=True) as curs,
        ):
            yield curs

    def serialise(self, curs: Cursor, name: str) -> None:
        """Nothing: its BEGIN IMMEDIATE already serialises every writer."""

    def hold_appends(self, curs: Cursor, table: str) -> None:
        """Nothing: BEGIN IMMEDIATE already holds every other writer off."""

    def reader(self) -> AbstractContextManager[Any]:
        return self.datastore.transaction(commit=False)

    def secure_delete(self, curs: Cursor) -> None:
        """A deleted row's bytes are zeroed in its page, not left in the free space."""
        curs.execute("PRAGMA secure_delete = ON")

    def scrub(self, name: str) -> bool:
        """The write-ahead log still holds the pages as they were before the delete: a
        checkpoint copies the zeroed pages into the file and truncates the log. A reader
        whose snapshot predates the delete keeps both: the checkpoint waits for it as
        long as the connection's busy timeout, then answers busy (its first column)."""
        with self.datastore.get_connection(commit=True) as connection:
            cursor = connection.cursor()
            cursor.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            busy, _, _ = cursor.fetchone()
        return not busy

    def columns(self, curs: Cursor, name: str) -> set[str]:
        curs.execute(f"PRAGMA table_info({name})")
        return {self.row(r)["name"] for r in curs.fetchall()}

    def table_exists(self, curs: Cursor, name: str) -> bool:
        curs.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?", (name,))
        return curs.fetchone() is not None


def scratch_backend() -> SQLiteBackend:
    """A SQLite database of this process's own, in memory, gone when the process ends:
    for tables a store opened to read cannot take (its views, folded there from its log).
    It is never locked across processes: none but this one can see it."""
    name = f"file:jobledger-scratch-{uuid4().hex}?mode=memory&cache=shared"
    backend = SQLiteBackend(StoreLocation("sqlite", {"SQLITE_DBNAME": name}))
    backend.attach(SQLiteDatastore(name))
    return backend


class LeanAppendRecorder(SQLiteApplicationRecorder):
    """The library's recorder, its append taken straight from the pool's writer
    connection: the library's path wraps each append in five context managers (three
    of them generators) around the same checkout, BEGIN, INSERTs and COMMIT, which cost
    a no-op step more than the INSERTs. The pool's writer interlock, the statements and
    the error translation (``SQLiteTransaction``) are the library's own."""

    def insert_events(
        self, stored_events: Sequence[StoredEvent], **kwargs: Any
    ) -> Sequence[int] | None:
        pool = self.datastore.pool
        connection = pool.get_connection(is_writer=True)
        try:
            with SQLiteTransaction(connection, commit=True) as curs, curs:
                return self._insert_events(curs, stored_events, **kwargs)
        finally:
            pool.put_connection(connection)


class _ImmediateTransaction(SQLiteTransaction):
    def __enter__(self) -> SQLiteCursor:
        cursor = self.connection.cursor()
        cursor.execute("BEGIN IMMEDIATE")
        return cursor


class FileLock:
    """flock on a file next to the database: the kernel drops it when the holder dies."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._fd: int | None = None
        self._mutex = threading.Lock()

    def try_acquire(self) -> bool:
        with self._mutex:
            if self._fd is not None:
                return True
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                return False
            self._fd = fd
            return True

    def release(self) -> None:
        with self._mutex:
            if self._fd is not None:
                fcntl.flock(self._fd, fcntl.LOCK_UN)
                os.close(self._fd)
                self._fd = None
