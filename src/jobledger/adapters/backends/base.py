"""What every store backend does, written once; what differs between databases is left
to one subclass per store (:mod:`.sqlite`, :mod:`.postgres`), chosen by
:func:`jobledger.adapters.backends.backend_for` from the parsed store URL.

A backend owns everything that depends on the database: table names, parameters and
types in SQL, transactions, the store's locks, the wait for new events, the readers'
tracking positions, and the numbered migrations of jobledger's own tables.
"""

from __future__ import annotations

import re
import threading
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, ClassVar, Protocol
from uuid import UUID

from jobledger.adapters.store_url import StoreLocation
from jobledger.domain.errors import StoreSchemaError
from jobledger.orchestration.ports import Lock

SCHEMA_TABLE = "jobledger_schema"
"""One row per migration applied: (component, version, what it did, when)."""
TRACKING_TABLE = "jobledger_tracking"
"""One row per reader of the log and partition: the last position it has processed."""
LEASE_TABLE = "jobledger_leases"
ADMISSION_TABLE = "jobledger_admission"
"""One row per job queued for admission or admitted and not yet ended."""
STEP_RATE_TABLE = "jobledger_step_rates"
"""One row per step-rate scope: the next moment a step may take."""

PARAM = re.compile(r"(?<!:):([a-z_][a-z0-9_]*)")
"""A ``:name`` parameter (not a ``::type`` cast)."""


class Cursor(Protocol):
    def execute(self, statement: Any, params: Any = ...) -> Any: ...
    def fetchall(self) -> Sequence[Any]: ...
    def fetchone(self) -> Any: ...


class TrackingConflict(Exception):
    """Another reader tracked this log past the position this one started from."""


@dataclass(frozen=True)
class Migration:
    """One numbered change of a component's tables, applied once, in one transaction with
    the row that records it. ``apply`` gets the backend and the open cursor."""

    version: int
    does: str
    apply: Callable[[StoreBackend, Cursor], None]


class Waiter:
    """Polling: woken only by ``close`` (or the interval running out)."""

    def __init__(self) -> None:
        self.woken = threading.Event()

    def wait(self, timeout: float) -> None:
        self.woken.wait(timeout)
        self.woken.clear()

    def close(self) -> None:
        self.woken.set()


class StoreBackend(ABC):
    """SQL is written once with ``:name`` parameters; :meth:`table` names a table and
    :meth:`sql` turns a statement into what the driver takes. Statements are assembled
    from jobledger's own literals only, never from input.

    The backend is made from the location alone (locks, file checks); the statements
    need the datastore of the open store, given by :meth:`attach`."""

    kind: ClassVar[str]
    timestamp_type: ClassVar[str]
    big_int: ClassVar[str]
    greatest: ClassVar[str]
    """The SQL function of the larger of two values."""
    skip_locked: ClassVar[str]
    position_column: ClassVar[str]
    """The column of an events table holding a row's position in the log."""
    reuses_positions: ClassVar[bool]
    """Whether a row appended after the newest rows were deleted may take their positions
    again (SQLite's rowid: the newest plus one)."""
    """What a SELECT that claims rows ends with so that concurrent claimers pass each
    other's rows by (empty where one writer at a time already serialises them)."""

    def __init__(self, location: StoreLocation) -> None:
        self.location = location

    # ---- opening -------------------------------------------------------------------------

    @abstractmethod
    def attach(self, datastore: Any) -> None:
        """The eventsourcing datastore of the open store, for every statement."""

    @abstractmethod
    def require_exists(self) -> None:
        """Raise StoreMissingError if the store was never created (checked before
        opening, where the driver would create it)."""

    @abstractmethod
    def describe(self) -> str:
        """Where the store is, for errors: ``at PATH`` or ``in schema ... of ...``."""

    def for_reading(self) -> StoreLocation:
        """The location to open when only reading."""
        return self.location

    @abstractmethod
    def create_home(self) -> None:
        """Make the place a new store lives in, when a command that writes creates it."""

    @abstractmethod
    def opening_lock(self, *, read_only: bool) -> AbstractContextManager[None]:
        """Held while a store is opened and its tables created or migrated."""

    @abstractmethod
    def schema_lock(self) -> AbstractContextManager[None]:
        """Held while tables are created or migrated: one process at a time."""

    @abstractmethod
    def lock(self, name: str) -> Lock:
        """A named lock of this store that the holder's death releases."""

    # ---- statements ----------------------------------------------------------------------

    @abstractmethod
    def table(self, name: str) -> str:
        """The name to write in SQL for jobledger table ``name``."""

    @abstractmethod
    def sql(self, statement: str) -> Any:
        """A statement with ``:name`` parameters, as the driver takes it."""

    @abstractmethod
    def ts(self, value: datetime | None) -> Any:
        """A moment as this store keeps it."""

    @abstractmethod
    def clock(self) -> datetime:
        """The store's own clock, now (UTC): the one time every process keeps."""

    def uuid(self, value: UUID) -> Any:
        """An originator id as the library keeps it in an events table."""
        return value

    @abstractmethod
    def transaction(self) -> AbstractContextManager[Any]:
        """A writing transaction (commits on leaving, rolls back on an error)."""

    @abstractmethod
    def serialise(self, curs: Cursor, name: str) -> None:
        """Make the writing transaction of ``curs`` wait for any other that called this
        with ``name``, until it ends."""

    @abstractmethod
    def reader(self) -> AbstractContextManager[Any]:
        """A transaction that only reads."""

    def row(self, row: Any) -> dict[str, Any]:
        return dict(row)

    @abstractmethod
    def columns(self, curs: Cursor, name: str) -> set[str]:
        """The column names of table ``name`` as it exists now."""

    @abstractmethod
    def table_exists(self, curs: Cursor, name: str) -> bool:
        """Asked of the catalog: a missing table and an unreachable server must not look
        alike."""

    def has_tables(self, *names: str) -> bool:
        with self.reader() as curs:
            return all(self.table_exists(curs, name) for name in names)

    def fetch(self, statement: str, params: dict[str, Any] | None = None) -> list[dict[str, Any]]:
        with self.reader() as curs:
            curs.execute(self.sql(statement), params or {})
            return [self.row(r) for r in curs.fetchall()]

    # ---- deleting for good -------------------------------------------------------------------

    @abstractmethod
    def secure_delete(self, curs: Cursor) -> None:
        """Have the rows this transaction deletes overwritten in the database's pages,
        where the database can."""

    @abstractmethod
    def scrub(self, name: str) -> bool:
        """After deleting rows of table ``name`` for good: rid the database's files of
        the copies it keeps beyond the live pages, waiting at most the store's lock
        timeout for other connections. True when done; False when another connection's
        transaction still keeps them (a later call finishes it)."""

    # ---- waiting for new events ----------------------------------------------------------

    def waiter(self, recorders: Sequence[object]) -> Waiter:
        """Wakes a follower when the log may hold new events (``recorders``: the
        partitions' application recorders)."""
        return Waiter()

    # ---- appending ------------------------------------------------------------------------

    def application_recorder_class(self, default: type[Any]) -> type[Any]:
        """The recorder of a partition's events table: the library's (``default``) unless
        this database has a faster one that keeps its guarantees."""
        return default

    @abstractmethod
    def hold_appends(self, curs: Cursor, table: str) -> None:
        """Hold off every other append to events table ``table`` until this transaction
        ends (the recorder's own lock): a transaction that deletes a job's rows or inserts
        rows itself (an archive, a restore) takes it first."""

    def append_functions(self, curs: Cursor) -> Sequence[Any]:
        """The statements that create the server-side code the recorder of
        :meth:`application_recorder_class` calls (none: it needs none)."""
        return ()

    # ---- tracking: how far each reader of the log has processed it --------------------------

    def position(self, name: str, curs: Cursor | None = None) -> int:
        statement = f"SELECT position FROM {self.table(TRACKING_TABLE)} WHERE name = :name"
        if curs is None:
            rows = self.fetch(statement, {"name": name})
            return int(rows[0]["position"]) if rows else 0
        curs.execute(self.sql(statement), {"name": name})
        found = curs.fetchone()
        return 0 if found is None else int(self.row(found)["position"])

    def track(self, curs: Cursor, name: str, *, old: int, new: int) -> None:
        """Move ``name`` from ``old`` to ``new`` in the caller's transaction: a
        compare-and-swap, so of two readers that started from the same position only the
        first to commit moves it; the other gets TrackingConflict (and rolls back)."""
        t = self.table(TRACKING_TABLE)
        curs.execute(
            self.sql(
                f"INSERT INTO {t} AS t (name, position) VALUES (:name, :new) "
                "ON CONFLICT (name) DO UPDATE SET position = excluded.position "
                "WHERE t.position = :old RETURNING position"
            ),
            {"name": name, "old": old, "new": new},
        )
        if curs.fetchone() is None:
            raise TrackingConflict(f"{name} was tracked past {old} by another reader")

    def forget(self, curs: Cursor, names: Sequence[str]) -> None:
        for name in names:
            curs.execute(
                self.sql(f"DELETE FROM {self.table(TRACKING_TABLE)} WHERE name = :name"),
                {"name": name},
            )

    # ---- migrations ----------------------------------------------------------------------

    def schema_version(self, component: str) -> int:
        """The last migration of ``component`` applied to this store (0: none, or a store
        made before versions were recorded)."""
        with self.reader() as curs:
            return self._version(curs, component)

    def check_schema(self, component: str, migrations: Sequence[Migration]) -> int:
        """The store's version of ``component``; refuses a store newer than this code
        (it may hold tables or rows this release would misread). Applies nothing."""
        found = self.schema_version(component)
        known = _latest(migrations)
        if found > known:
            raise StoreSchemaError(
                f"the store {self.describe()} has {component} schema version {found}, newer "
                f"than this jobledger knows ({known}): upgrade jobledger to use it"
            )
        return found

    def migrate(self, component: str, migrations: Sequence[Migration]) -> list[int]:
        """Apply the migrations of ``component`` the store lacks, in order, each in one
        transaction with its schema row; the caller holds :meth:`schema_lock`. Returns
        the versions applied."""
        found = self.check_schema(component, migrations)
        if found < _latest(migrations):
            with self.transaction() as curs:
                curs.execute(
                    self.sql(
                        f"CREATE TABLE IF NOT EXISTS {self.table(SCHEMA_TABLE)} ("
                        "component TEXT NOT NULL, version INTEGER NOT NULL, does TEXT NOT NULL, "
                        "applied_at TEXT NOT NULL, PRIMARY KEY (component, version))"
                    )
                )
        applied = []
        for migration in sorted(migrations, key=lambda m: m.version):
            if migration.version <= found:
                continue
            with self.transaction() as curs:
                migration.apply(self, curs)
                curs.execute(
                    self.sql(
                        f"INSERT INTO {self.table(SCHEMA_TABLE)} "
                        "(component, version, does, applied_at) "
                        "VALUES (:component, :version, :does, :applied_at)"
                    ),
                    {
                        "component": component,
                        "version": migration.version,
                        "does": migration.does,
                        "applied_at": datetime.now(UTC).isoformat(timespec="seconds"),
                    },
                )
            applied.append(migration.version)
        return applied

    def _version(self, curs: Cursor, component: str) -> int:
        if not self.table_exists(curs, SCHEMA_TABLE):
            return 0
        curs.execute(
            self.sql(
                f"SELECT MAX(version) AS version FROM {self.table(SCHEMA_TABLE)} "
                "WHERE component = :component"
            ),
            {"component": component},
        )
        found = curs.fetchone()
        return int(self.row(found)["version"] or 0) if found is not None else 0

    @property
    @abstractmethod
    def old_tracking_table(self) -> str:
        """Where releases before the tracking table kept the views' positions (the
        library's tracking recorder's table), for the migration that carries them over."""


def _latest(migrations: Sequence[Migration]) -> int:
    return max((m.version for m in migrations), default=0)
