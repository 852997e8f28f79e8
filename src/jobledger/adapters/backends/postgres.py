"""PostgreSQL: a schema of a database; advisory locks; LISTEN/NOTIFY for new events."""

from __future__ import annotations

import re
import threading
import time
import zlib
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from datetime import UTC, datetime
from typing import Any

import psycopg
from eventsourcing.persistence import InterfaceError, OperationalError, StoredEvent
from eventsourcing.postgres import PostgresApplicationRecorder, PostgresDatastore
from eventsourcing.utils import retry
from psycopg.sql import SQL, Composed, Identifier, Literal
from psycopg.types.numeric import Int8

from jobledger.adapters.backends.base import PARAM, Cursor, StoreBackend, Waiter

SCRUB_LOCK_TIMEOUT_SECONDS = 5
"""How long a scrub waits for other transactions when the store sets no lock timeout (as
long as SQLite's busy timeout by default)."""
SCRUB_RETRY_SECONDS = 0.2
KEPT = re.compile(r"(\d+)")


def _none_kept(notices: Sequence[tuple[str, str]], name: str) -> bool:
    """Whether VACUUM VERBOSE's report on table ``name`` (its notices' primary message and
    detail) says it kept no dead row: the detail begins ``N dead row versions cannot be
    removed yet``. A report not found, or not read, is not taken for one that says none."""
    for primary, detail in notices:
        if name in primary and (found := KEPT.match(detail)):
            return int(found.group(1)) == 0
    return False


class PostgresBackend(StoreBackend):
    kind = "postgresql"
    timestamp_type = "TIMESTAMPTZ"
    big_int = "BIGINT"
    greatest = "GREATEST"
    position_column = "notification_id"
    reuses_positions = False
    skip_locked = "FOR UPDATE SKIP LOCKED"
    old_tracking_table = "jobledger_view_tracking"

    datastore: PostgresDatastore

    def attach(self, datastore: Any) -> None:
        assert isinstance(datastore, PostgresDatastore)
        self.datastore = datastore

    @property
    def schema(self) -> str:
        return self.location.env.get("POSTGRES_SCHEMA", "public")

    def require_exists(self) -> None:
        """Nothing to check before connecting: a server never creates a database on
        connection, and a missing schema or table is found once open."""

    def describe(self) -> str:
        env = self.location.env
        return (
            f"in schema {self.schema!r} of database {env['POSTGRES_DBNAME']!r} on "
            f"{env['POSTGRES_HOST']}"
        )

    def create_home(self) -> None:
        """A ``?schema=`` that does not exist yet is created: a writer asked for a store
        there. (A reader is told there is no store, and which schema it looked in.)"""
        if self.schema == "public":
            return
        try:
            with psycopg.connect(self.conninfo(), autocommit=True) as conn:
                conn.execute(SQL("CREATE SCHEMA IF NOT EXISTS {}").format(Identifier(self.schema)))
        except psycopg.Error as error:
            raise OperationalError(
                f"cannot create schema {self.schema!r}: {error} (create it, or have a role "
                "with CREATE on the database run a command that writes)"
            ) from error

    def opening_lock(self, *, read_only: bool) -> AbstractContextManager[None]:
        # A read takes it too: it waits out a creation in progress, and its connection
        # says plainly why a server is unreachable.
        return self.schema_lock()

    @contextmanager
    def schema_lock(self) -> Iterator[None]:
        """Concurrent CREATE ... IF NOT EXISTS can still collide in PostgreSQL's catalog,
        so processes create tables one at a time, under an advisory lock."""
        try:
            conn = psycopg.connect(self.conninfo(), autocommit=True)
        except psycopg.Error as error:
            raise OperationalError(str(error)) from error
        with conn:
            key = self.lock_key("schema")
            conn.execute("SELECT pg_advisory_lock(%s)", (key,))
            try:
                yield
            finally:
                conn.execute("SELECT pg_advisory_unlock(%s)", (key,))

    def lock(self, name: str) -> AdvisoryLock:
        return AdvisoryLock(self.conninfo(), self.lock_key(name))

    def conninfo(self) -> str:
        env = self.location.env
        return psycopg.conninfo.make_conninfo(
            dbname=env["POSTGRES_DBNAME"],
            host=env["POSTGRES_HOST"],
            port=env["POSTGRES_PORT"],
            user=env["POSTGRES_USER"],
            password=env["POSTGRES_PASSWORD"],
            connect_timeout=env.get("POSTGRES_CONNECT_TIMEOUT", "5"),
        )

    def lock_key(self, name: str) -> int:
        return zlib.crc32(f"{self.schema}/{name}".encode())

    # ---- statements ----------------------------------------------------------------------

    def table(self, name: str) -> str:
        return f"{Identifier(self.schema).as_string()}.{name}"

    def sql(self, statement: str) -> SQL:
        # Every statement is assembled from jobledger's literals, never from input.
        return SQL(PARAM.sub(r"%(\1)s", statement))

    def ts(self, value: datetime | None) -> datetime | None:
        return value

    def clock(self) -> datetime:
        """The server's clock as it reads the statement (``now()`` would be the start
        of the transaction)."""
        (row,) = self.fetch("SELECT clock_timestamp() AS now")
        moment: datetime = row["now"]
        return moment.astimezone(UTC)

    def transaction(self) -> AbstractContextManager[Any]:
        return self.datastore.transaction(commit=True)

    def serialise(self, curs: Cursor, name: str) -> None:
        curs.execute("SELECT pg_advisory_xact_lock(%s)", (self.lock_key(name),))

    def secure_delete(self, curs: Cursor) -> None:
        """Nothing: PostgreSQL has no such setting; :meth:`scrub` rewrites the table."""

    def scrub(self, name: str) -> bool:
        """A deleted row stays in the table's files as a dead tuple until a vacuum; VACUUM
        FULL writes the live rows to new files and drops the old ones (the server's WAL
        and its backups keep their copies: wrap the keys with a master key for those).
        It waits for the table's lock (another transaction that read the table holds
        one) at most the store's lock timeout, and it copies a dead row that a running
        transaction's snapshot may still see (its report says how many it kept): then it
        is run again, until that timeout has passed."""
        seconds = self.datastore.lock_timeout or SCRUB_LOCK_TIMEOUT_SECONDS
        deadline = time.monotonic() + seconds
        vacuum = SQL("VACUUM (FULL, VERBOSE) {}").format(SQL(self.table(name)))
        notices: list[tuple[str, str]] = []
        with psycopg.connect(self.conninfo(), autocommit=True) as conn:
            # A notice's fields are only readable during the callback.
            conn.add_notice_handler(
                lambda d: notices.append((d.message_primary or "", d.message_detail or ""))
            )
            conn.execute(SQL("SET lock_timeout = {}").format(Literal(f"{seconds}s")))
            while True:
                notices.clear()
                try:
                    conn.execute(vacuum)
                except psycopg.errors.LockNotAvailable:
                    return False
                if _none_kept(notices, name):
                    return True
                if time.monotonic() >= deadline:
                    return False
                time.sleep(SCRUB_RETRY_SECONDS)

    def reader(self) -> AbstractContextManager[Any]:
        return self.datastore.transaction(commit=False)

    def columns(self, curs: Cursor, name: str) -> set[str]:
        curs.execute(
            SQL(
                "SELECT column_name FROM information_schema.columns "
                "WHERE table_schema = %(schema)s AND table_name = %(name)s"
            ),
            {"schema": self.schema, "name": name},
        )
        return {self.row(r)["column_name"] for r in curs.fetchall()}

    def table_exists(self, curs: Cursor, name: str) -> bool:
        curs.execute(
            SQL(
                "SELECT 1 FROM pg_catalog.pg_tables "
                "WHERE schemaname = %(schema)s AND tablename = %(name)s"
            ),
            {"schema": self.schema, "name": name},
        )
        return curs.fetchone() is not None

    # ---- waiting for new events ----------------------------------------------------------

    def waiter(self, recorders: Sequence[object]) -> Waiter:
        # The library's recorders NOTIFY on a channel per events table.
        channels = [str(getattr(r, "channel_name")) for r in recorders]  # noqa: B009
        return ListenWaiter(self.datastore, channels)

    # ---- appending in one round trip -----------------------------------------------------

    def application_recorder_class(self, default: type[Any]) -> type[Any]:
        return OneTripRecorder

    def hold_appends(self, curs: Cursor, table: str) -> None:
        """The recorder's lock (ids committed in the order drawn, so a reader of the log
        never passes one a slower transaction commits later; and no event appended to a
        job between an archive's check of its head and its delete) and its notification."""
        curs.execute(SQL("LOCK TABLE {} IN EXCLUSIVE MODE").format(SQL(self.table(table))))
        curs.execute(SQL("NOTIFY {}").format(Identifier(table.replace(".", "_"))))

    def append_functions(self, curs: Cursor) -> list[Composed]:
        """One append function per partition events table of the schema (their number is
        fixed for the life of a store: the tables all exist when the store is migrated)."""
        curs.execute(
            SQL(
                "SELECT tablename FROM pg_catalog.pg_tables WHERE schemaname = %(schema)s "
                "AND tablename ~ '^jobledger_p[0-9]+_events$'"
            ),
            {"schema": self.schema},
        )
        tables = sorted(self.row(r)["tablename"] for r in curs.fetchall())
        return [append_function(self.schema, t, self.datastore.originator_id_type) for t in tables]


def append_function_name(table: str) -> str:
    return f"{table}_append"


def append_function(schema: str, table: str, originator_id_type: str) -> Composed:
    """The library's append (lock, notify, insert; see PostgresApplicationRecorder) as one
    server-side call: in an autocommit statement it is one transaction and one round trip.

    The EXCLUSIVE table lock stays, taken before the insert draws notification ids and
    held to the commit, so ids are committed in the order they were drawn and a reader
    of the log never passes an id that a slower transaction commits later. (The
    library's own POSTGRES_ENABLE_DB_FUNCTIONS function drops that lock.)"""
    return SQL(
        "CREATE OR REPLACE FUNCTION {schema}.{function}(p_lock_timeout text, "
        "p_ids {id_type}[], p_versions bigint[], p_topics text[], p_states bytea[]) "
        "RETURNS SETOF bigint LANGUAGE plpgsql AS $body$ BEGIN "
        "PERFORM set_config('lock_timeout', p_lock_timeout, true); "
        "LOCK TABLE {schema}.{table} IN EXCLUSIVE MODE; "
        "NOTIFY {channel}; "
        "RETURN QUERY INSERT INTO {schema}.{table} "
        "(originator_id, originator_version, topic, state) "
        "SELECT * FROM unnest(p_ids, p_versions, p_topics, p_states) "
        "RETURNING notification_id; "
        "END $body$"
    ).format(
        schema=Identifier(schema),
        function=Identifier(append_function_name(table)),
        id_type=Identifier(originator_id_type),
        table=Identifier(table),
        # The library's channel: the table's name (see ListenWaiter).
        channel=Identifier(table.replace(".", "_")),
    )


SCALAR_ROWS = 64
"""The most rows an append binds one parameter each (four per row)."""


class OneTripRecorder(PostgresApplicationRecorder):
    """A partition's events, appended by one call of its append function (made by store
    migration 3): one round trip and one statement instead of the library's pipelined
    BEGIN, SET LOCAL lock_timeout, LOCK TABLE, NOTIFY, INSERT and COMMIT.

    Nothing else changes: a duplicate (originator_id, originator_version) still fails as
    an IntegrityError (the store reads it as a conflict), a lock not granted within
    POSTGRES_LOCK_TIMEOUT as an OperationalError (retried here as the library does, then
    a StoreUnavailableError)."""

    def __init__(self, datastore: PostgresDatastore, *, events_table_name: str) -> None:
        super().__init__(datastore, events_table_name=events_table_name)
        self.lock_timeout = f"{datastore.lock_timeout}s"
        self._call = SQL("SELECT id FROM {schema}.{function}(%b, {{}}::{id_type}[], ").format(
            schema=Identifier(datastore.schema),
            function=Identifier(append_function_name(events_table_name)),
            id_type=Identifier(datastore.originator_id_type),
        )
        self._statements: dict[int, bytes] = {}

    def append_statement(self, rows: int) -> bytes:
        """The call for ``rows`` events, made once per count, its parameters in binary
        (%b: the states go as they are, not hex-escaped). Up to ``SCALAR_ROWS`` rows each
        column is an ARRAY of scalar parameters: psycopg binds scalars for less than it
        takes to dump lists as arrays (it looks into each list to choose the array's
        type), and a step appends one or two rows. More (an import, a big group) go as
        four array parameters, as PostgreSQL allows at most 65,535 parameters."""
        if rows > SCALAR_ROWS:
            rows = 0
        statement = self._statements.get(rows)
        if statement is None:
            array = "ARRAY[" + ", ".join(["%b"] * rows) + "]" if rows else "%b"
            call = self._call.as_string(None).replace("{}", array)
            statement = (
                f"{call}{array}::bigint[], {array}::text[], {array}::bytea[]) AS id"
            ).encode()
            self._statements[rows] = statement
        return statement

    def create_table(self) -> None:
        """The table, and its append function beside it: a partition added after store
        migration 3 made the others' (a store opened with more partitions) gets its own
        when its table is made, never a table nothing can append to."""
        super().create_table()
        function = append_function(
            self.datastore.schema, self.events_table_name, self.datastore.originator_id_type
        )
        with self.datastore.transaction(commit=True) as curs:
            curs.execute(function)

    @retry((InterfaceError, OperationalError), max_attempts=10, wait=0.2)
    def insert_events(
        self, stored_events: Sequence[StoredEvent], **kwargs: Any
    ) -> Sequence[int] | None:
        statement = self.append_statement(len(stored_events))
        ids = [e.originator_id for e in stored_events]
        # Int8: one parameter type whatever the version's size, so one prepared statement.
        versions = [Int8(e.originator_version) for e in stored_events]
        topics = [e.topic for e in stored_events]
        states = [e.state for e in stored_events]
        params: list[Any] = [self.lock_timeout]
        if len(stored_events) > SCALAR_ROWS:
            params += [ids, versions, topics, states]
        else:
            params += [*ids, *versions, *topics, *states]
        with self.datastore.get_connection() as conn, conn.cursor() as curs:
            # Prepared on each pooled connection at its first use: later calls only bind.
            curs.execute(statement, params, prepare=True)
            return [row["id"] for row in curs.fetchall()]


class ListenWaiter(Waiter):
    """LISTEN on the partitions' channels: a commit wakes the follower at once; the poll
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


class AdvisoryLock:
    """A session-level pg_advisory_lock on a connection of its own: the server releases
    it when that session ends, however the holder died."""

    def __init__(self, conninfo: str, key: int) -> None:
        self.conninfo = conninfo
        self.key = key
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
