"""The Lock port: a file lock beside a SQLite store, a PostgreSQL advisory lock."""

from __future__ import annotations

import fcntl
import os
import threading
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psycopg
from eventsourcing.persistence import OperationalError

from jobledger.adapters.store_url import StoreLocation


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


@contextmanager
def schema_lock(location: StoreLocation) -> Iterator[None]:
    """Hold a lock while creating tables: an advisory lock on PostgreSQL, a blocking flock
    beside a SQLite file (switching a new file to WAL fails at once, without waiting, if
    another process is doing the same)."""
    if location.is_sqlite:
        path = f"{location.env['SQLITE_DBNAME']}.schema.lock"
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as error:  # a read-only directory, say: a store error, not a crash
            raise OperationalError(f"cannot open the lock file {path}: {error.strerror}") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)  # closing the descriptor releases the lock
        return
    try:
        conn = psycopg.connect(_conninfo(location), autocommit=True)
    except psycopg.Error as error:
        raise OperationalError(str(error)) from error
    with conn:
        key = _key(location, "schema")
        conn.execute("SELECT pg_advisory_lock(%s)", (key,))
        try:
            yield
        finally:
            conn.execute("SELECT pg_advisory_unlock(%s)", (key,))


def _conninfo(location: StoreLocation) -> str:
    env = location.env
    return psycopg.conninfo.make_conninfo(
        dbname=env["POSTGRES_DBNAME"],
        host=env["POSTGRES_HOST"],
        port=env["POSTGRES_PORT"],
        user=env["POSTGRES_USER"],
        password=env["POSTGRES_PASSWORD"],
        connect_timeout=env.get("POSTGRES_CONNECT_TIMEOUT", "5"),
    )


def _key(location: StoreLocation, name: str) -> int:
    return zlib.crc32(f"{location.env.get('POSTGRES_SCHEMA', 'public')}/{name}".encode())


class AdvisoryLock:
    """A session-level pg_advisory_lock on a connection of its own: the server releases
    it when that session ends, however the holder died."""

    def __init__(self, location: StoreLocation, name: str) -> None:
        self.conninfo = _conninfo(location)
        self.key = _key(location, name)
        self._conn: psycopg.Connection[tuple[object, ...]] | None = None
        self._mutex = threading.Lock()

    def try_acquire(self) -> bool:
        with self._mutex:
            if self._conn is not None and not self._conn.closed:
                return True
            conn = psycopg.connect(self.conninfo, autocommit=True)
            row = conn.execute("SELECT pg_try_advisory_lock(%s)", (self.key,)).fetchone()
            if not (row and row[0]):
                conn.close()
                return False
            self._conn = conn
            return True

    def release(self) -> None:
        with self._mutex:
            if self._conn is not None:
                self._conn.close()  # ending the session releases the lock
                self._conn = None


def lock_for(location: StoreLocation, name: str) -> FileLock | AdvisoryLock:
    if location.is_sqlite:
        return FileLock(Path(f"{location.env['SQLITE_DBNAME']}.{name}.lock"))
    return AdvisoryLock(location, name)
