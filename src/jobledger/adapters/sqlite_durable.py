"""SQLite as the embedded default: WAL journal, and every commit synced to disk."""

from __future__ import annotations

from eventsourcing.sqlite import (
    SQLiteConnection,
    SQLiteConnectionPool,
    SQLiteDatastore,
    SQLiteFactory,
)
from eventsourcing.utils import Environment, EnvType


class DurableConnectionPool(SQLiteConnectionPool):
    def _create_connection(self) -> SQLiteConnection:
        connection = super()._create_connection()
        # Most builds default to FULL already; a build that defaults to NORMAL in WAL mode
        # could lose the last commits on power loss, so we never rely on the default.
        connection.cursor().execute("PRAGMA synchronous=FULL")
        return connection


class DurableSQLiteFactory(SQLiteFactory):
    def __init__(self, env: Environment | EnvType | None):
        super().__init__(env)
        self.datastore = _durable(self.datastore)


def _durable(datastore: SQLiteDatastore) -> SQLiteDatastore:
    old = datastore.pool
    old.close()
    datastore.pool = DurableConnectionPool(db_name=old.db_name, lock_timeout=old.lock_timeout)
    return datastore
