"""One translation of store errors, at the boundary of every store adapter.

Whatever the database or the library raises while an adapter works (a lost connection,
a timeout, a locked file, a dropped table, a closed pool) leaves the adapter as
:class:`StoreUnavailableError`: an infrastructure error that callers retry with
back-off, never a refusal, never a reason to fail a job or dead-letter a tick. Only a
uniqueness violation is let through as it is: the adapters read it as a duplicate key
or a lost race, which is an answer, not an outage.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager

import psycopg
from eventsourcing.persistence import ConnectionPoolClosedError, IntegrityError, PersistenceError

from jobledger.errors import StoreUnavailableError

STORE_ERRORS: tuple[type[Exception], ...] = (
    PersistenceError,  # the library's translation of the drivers' errors
    ConnectionPoolClosedError,  # not a PersistenceError in eventsourcing
    # The library does not wrap everything: a SQLite connection is opened (and its
    # pragmas run) outside its translation, so a driver's own error can surface too.
    sqlite3.Error,
    psycopg.Error,
)
CONFLICTS: tuple[type[Exception], ...] = (
    IntegrityError,
    sqlite3.IntegrityError,
    psycopg.IntegrityError,
)


@contextmanager
def store_errors(doing: str) -> Iterator[None]:
    """Translate store errors raised inside into StoreUnavailableError. Usable as a
    decorator: ``@store_errors("loading a job")``."""
    try:
        yield
    except CONFLICTS:
        raise
    except STORE_ERRORS as error:
        detail = str(error) or type(error).__name__
        raise StoreUnavailableError(f"store error while {doing}: {detail}") from error
