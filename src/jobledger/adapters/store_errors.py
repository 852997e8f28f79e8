"""One translation of store errors, at the boundary of every store adapter.

Whatever the database or the library raises while an adapter works (a lost connection,
a timeout, a locked file, a dropped table, a closed pool) leaves the adapter as
:class:`StoreUnavailableError`: an infrastructure error that callers retry with
back-off, never a refusal, never a reason to fail a job or dead-letter a tick. A damaged
database is :class:`StoreCorruptError`, the one kind of it that a retry cannot mend. Only
a uniqueness violation is let through as it is: the adapters read it as a duplicate key
or a lost race, which is an answer, not an outage.
"""

from __future__ import annotations

import sqlite3
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from types import ModuleType
from typing import Final

from eventsourcing.persistence import ConnectionPoolClosedError, IntegrityError, PersistenceError

from jobledger.domain.errors import StoreCorruptError, StoreUnavailableError

_STORE_ERRORS: tuple[type[Exception], ...] = (
    PersistenceError,  # the library's translation of the drivers' errors
    ConnectionPoolClosedError,  # not a PersistenceError in eventsourcing
    # The library does not wrap everything: a SQLite connection is opened (and its
    # pragmas run) outside its translation, so a driver's own error can surface too.
    sqlite3.Error,
)
_CONFLICTS: tuple[type[Exception], ...] = (IntegrityError, sqlite3.IntegrityError)
SQLITE_DAMAGED: Final = frozenset({11, 26})
"""SQLITE_CORRUPT (``database disk image is malformed``), SQLITE_NOTADB (``file is not a
database``): primary result codes, which an extended code carries in its low byte."""
POSTGRES_DAMAGED: Final = frozenset({"XX001", "XX002"})
"""data_corrupted, index_corrupted."""
DAMAGED_HINT: Final = "a retry fails the same way: restore it from a backup"


def _psycopg() -> ModuleType | None:
    """The PostgreSQL driver, once loaded. Only a PostgreSQL store imports it (the
    embedded default never does), and until one has, none of its errors can be raised."""
    return sys.modules.get("psycopg")


def store_error_types() -> tuple[type[Exception], ...]:
    """The errors that mean the store failed: the library's, and its drivers' own."""
    return _with_driver(_STORE_ERRORS, "Error")


def conflict_types() -> tuple[type[Exception], ...]:
    """The uniqueness violations, the library's and its drivers': an answer, not an outage."""
    return _with_driver(_CONFLICTS, "IntegrityError")


def _with_driver(errors: tuple[type[Exception], ...], name: str) -> tuple[type[Exception], ...]:
    driver = _psycopg()
    if driver is None:
        return errors
    own: type[Exception] = getattr(driver, name)
    return (*errors, own)


def damaged(error: BaseException) -> bool:
    """Whether ``error``, or a driver's error it was raised from, says the database
    itself is damaged (the library wraps the driver's error as its cause)."""
    driver = _psycopg()
    seen: BaseException | None = error
    while seen is not None:
        if isinstance(seen, sqlite3.DatabaseError):
            code = getattr(seen, "sqlite_errorcode", None)
            if code is not None and code & 0xFF in SQLITE_DAMAGED:
                return True
        pg = driver is not None and isinstance(seen, driver.Error)
        if pg and getattr(seen, "sqlstate", None) in POSTGRES_DAMAGED:
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def store_error(error: Exception, doing: str) -> StoreUnavailableError:
    """What a store error raised while ``doing`` leaves an adapter as."""
    detail = str(error) or type(error).__name__
    if damaged(error):
        return StoreCorruptError(
            f"the store is damaged (found while {doing}: {detail}); {DAMAGED_HINT}"
        )
    return StoreUnavailableError(f"store error while {doing}: {detail}")


@contextmanager
def store_errors(doing: str) -> Iterator[None]:
    """Translate store errors raised inside into StoreUnavailableError (or, for a damaged
    database, StoreCorruptError). Usable as a decorator: ``@store_errors("loading a job")``."""
    try:
        yield
    except conflict_types():
        raise
    except store_error_types() as error:
        raise store_error(error, doing) from error
