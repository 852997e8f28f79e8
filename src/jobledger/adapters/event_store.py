"""The JobStore port on the eventsourcing library: partitions of append-only event tables."""

from __future__ import annotations

import logging
import os
import re
from contextlib import nullcontext
from copy import deepcopy
from dataclasses import replace
from pathlib import Path
from typing import Any, Literal
from urllib.parse import quote
from uuid import UUID

from eventsourcing.application import AggregateNotFoundError, Application
from eventsourcing.domain import OriginatorVersionError
from eventsourcing.persistence import (
    ApplicationRecorder,
    EventStore,
    IntegrityError,
    MapperDeserialisationError,
)

from jobledger.adapters.leases import LeaseTable
from jobledger.adapters.locks import schema_lock
from jobledger.adapters.store_errors import STORE_ERRORS, store_errors
from jobledger.adapters.store_url import StoreLocation
from jobledger.errors import (
    BrokenHistoryError,
    DuplicateKeyError,
    StoreMissingError,
    StoreUnavailableError,
    StoreUnreachableError,
    VersionConflict,
)
from jobledger.job import Job
from jobledger.keys import ConsumedKey

log = logging.getLogger(__name__)

StoreMode = Literal["create", "existing", "read"]
"""``create``: make the store and its tables if missing (the commands that write jobs).
``existing``: the store must exist (a SQLite file is never created). ``read``: the store
must exist and is only read: no lock, no DDL, so a store on read-only media works."""


class LedgerPartition(Application[UUID]):
    """One partition: an eventsourcing application writing its own events table.

    A job and every key that guards it live in the same partition, so one transaction
    covers them: the uniqueness of (originator_id, originator_version) in that table is
    what makes both the version compare-and-swap and the at-most-once keys hold.
    """

    def __init__(
        self, location: StoreLocation, index: int, cache_size: int, *, create: bool = True
    ) -> None:
        self.create_tables = create
        self.table_prefix = f"jobledger_p{index}"
        # The partition's name is its identity in tracking records (one log each).
        self.name = self.table_prefix
        self.store_kind = location.kind
        env = {
            **location.env,
            "AGGREGATE_CACHE_MAXSIZE": str(cache_size) if cache_size else "",
            # Fast-forward: a cached job is brought up to date from the store on every load,
            # so a write by another process is never missed.
            "AGGREGATE_CACHE_FASTFORWARD": "y",
            "IS_SNAPSHOTTING_ENABLED": "y",
        }
        super().__init__(env=env)

    def construct_recorder(self) -> ApplicationRecorder:
        factory: Any = self.factory
        recorder: ApplicationRecorder = factory.application_recorder_class(
            datastore=factory.datastore, events_table_name=f"{self.table_prefix}_events"
        )
        if self.create_tables:
            recorder.create_table()  # type: ignore[attr-defined]
        return recorder

    def construct_snapshot_store(self) -> EventStore[UUID]:
        factory: Any = self.factory
        recorder = factory.aggregate_recorder_class(
            datastore=factory.datastore, events_table_name=f"{self.table_prefix}_snapshots"
        )
        if self.create_tables:
            recorder.create_table()
        return EventStore(mapper=self.mapper, recorder=recorder)

    def has_tables(self, *tables: str) -> bool:
        """Whether these tables (default: this partition's events table) exist in its
        database, asked of the catalog: a missing table and an unreachable server must
        not look alike."""
        factory: Any = self.factory
        names = tables or (f"{self.table_prefix}_events",)
        with factory.datastore.transaction(commit=False) as cursor:
            for name in names:
                if self.store_kind == "sqlite":
                    cursor.execute(
                        "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?", (name,)
                    )
                else:
                    cursor.execute(
                        "SELECT 1 FROM pg_catalog.pg_tables "
                        "WHERE schemaname = %s AND tablename = %s",
                        (factory.datastore.schema, name),
                    )
                if cursor.fetchone() is None:
                    return False
        return True


class EventSourcedJobStore:
    """Routes each job to partition hash(job id) % N; N is fixed for the life of a store.

    Every entry point translates store errors (``store_errors``): no driver or library
    error crosses the port, only StoreUnavailableError and the refusals it defines."""

    def __init__(
        self,
        location: StoreLocation,
        *,
        partitions: int = 1,
        cache_size: int = 10_000,
        snapshot_interval: int = 100,
        mode: StoreMode = "create",
    ) -> None:
        self.location = location
        self.snapshot_interval = snapshot_interval
        self.read_only = mode == "read"
        if location.is_sqlite and mode != "create":
            _require_file(location)
        # Concurrent CREATE ... IF NOT EXISTS can still collide in PostgreSQL's catalog, so
        # processes starting together create the tables one at a time. A read takes the
        # advisory lock too (it waits out a creation in progress, and its connection says
        # plainly why a server is unreachable), but never SQLite's: that lock is a file.
        skip_lock = self.read_only and location.is_sqlite
        try:
            with nullcontext() if skip_lock else schema_lock(location):
                if self.read_only:
                    self.partitions = _open(_for_reading(location), partitions, cache_size, False)
                    _require_tables(location, self.partitions)
                else:
                    self.partitions = _open(location, partitions, cache_size, True)
                # The heartbeat-renewed leases: one table per store, in its own database
                # (a reader neither creates it nor needs it).
                self.leases = LeaseTable(getattr(self.partitions[0].factory, "datastore"))  # noqa: B009
                if not self.read_only:
                    self.leases.create_table()
        except STORE_ERRORS as error:
            raise StoreUnreachableError(f"cannot open the {location.kind} store: {error}") from None

    def partition(self, job_uuid: UUID) -> LedgerPartition:
        return self.partitions[job_uuid.int % len(self.partitions)]

    # ---- the JobStore port -------------------------------------------------------------

    @store_errors("loading a job")
    def load(self, job_uuid: UUID) -> Job | None:
        try:
            job: object = self.partition(job_uuid).repository.get(job_uuid)
        except AggregateNotFoundError:
            return None
        except (OriginatorVersionError, MapperDeserialisationError) as error:
            # A gap (a deleted event) or a row that no longer decodes: the job cannot be
            # folded, and nothing may be written on top of it.
            raise BrokenHistoryError(str(job_uuid), _broken_at(error)) from None
        assert isinstance(job, Job)
        return job

    @store_errors("appending")
    def append(self, job: Job, *keys: ConsumedKey) -> None:
        partition = self.partition(job.id)
        version_before = job.version - len(job.pending_events)
        # Straight to the event store: Application.save() would only add runtime
        # Protocol checks (slow) and snapshot/cache work this store does itself.
        events = [*job.collect_events()]
        for key in keys:
            events.extend(key.collect_events())
        try:
            partition.events.put(events)
        except IntegrityError:
            # Telling which collided reads the store again: translated like the rest.
            raise self.conflict(partition, keys) from None
        if version_before == 0:
            self.cache_created(partition, job)
        self.snapshot_if_due(partition, job, version_before)

    @store_errors("reserving a key")
    def reserve_key(self, key: ConsumedKey) -> None:
        partition = self.partition(key.route)
        try:
            partition.events.put(list(key.collect_events()))
        except IntegrityError:
            raise DuplicateKeyError(key.kind, key.key) from None

    def colocated(self, first: UUID, second: UUID) -> bool:
        return self.partition(first) is self.partition(second)

    @store_errors("reading a key")
    def find_key(self, route: UUID, key_id: UUID) -> ConsumedKey | None:
        try:
            key: object = self.partition(route).repository.get(key_id)
        except AggregateNotFoundError:
            return None
        assert isinstance(key, ConsumedKey)
        return key

    @store_errors("reading an event")
    def holds(self, job_uuid: UUID, version: int, chain_hash: str) -> bool:
        found = next(self.partition(job_uuid).events.get(job_uuid, gt=version - 1, limit=1), None)
        return isinstance(found, Job.Event) and found.chain_hash == chain_hash

    @store_errors("reading events")
    def events(self, job_uuid: UUID, *, to_version: int | None = None) -> list[Job.Event]:
        try:
            stored = list(self.partition(job_uuid).events.get(job_uuid, lte=to_version))
        except MapperDeserialisationError as error:
            raise BrokenHistoryError(str(job_uuid), _broken_at(error)) from None
        return [event for event in stored if isinstance(event, Job.Event)]

    # ---- the steps of an append --------------------------------------------------------

    def conflict(
        self, partition: LedgerPartition, keys: tuple[ConsumedKey, ...]
    ) -> DuplicateKeyError | VersionConflict:
        """The append was refused as a whole; say whether a key or the version collided."""
        for key in keys:
            # get() returns a lazy iterator (always truthy): look for an actual event.
            if next(partition.events.get(key.id, limit=1), None) is not None:
                return DuplicateKeyError(key.kind, key.key)
        return VersionConflict("the job was changed by another writer since it was loaded")

    def cache_created(self, partition: LedgerPartition, job: Job) -> None:
        """A job just created goes into the cache as it was committed, so its first tick
        fast-forwards it (one read) instead of rebuilding it (a snapshot read and an event
        read). A copy: the caller may go on changing its own object."""
        cache = partition.repository.cache
        if cache is not None:
            cache.put(job.id, deepcopy(job))

    def snapshot_if_due(self, partition: LedgerPartition, job: Job, version_before: int) -> None:
        """After the commit, so a failed snapshot can never lose an event: it only costs a
        longer replay on the next cold load."""
        interval = self.snapshot_interval
        if not interval or job.version // interval == version_before // interval:
            return
        assert partition.snapshots is not None
        try:
            with store_errors("taking a snapshot"):
                partition.snapshots.put([Job.Snapshot.take(job)])
        except StoreUnavailableError:
            log.warning(
                "snapshot of job %s at version %s failed", job.id, job.version, exc_info=True
            )

    def close(self) -> None:
        for partition in self.partitions:
            partition.close()


_STORED_VERSION = re.compile(r"originator_version (\d+)")


def _broken_at(error: OriginatorVersionError | MapperDeserialisationError) -> int:
    """The first version that cannot be folded."""
    if isinstance(error, OriginatorVersionError):
        return int(error.args[1])  # (the version found, the version expected)
    found = _STORED_VERSION.search(str(error))  # eventsourcing names it only in the text
    return int(found.group(1)) if found else 0


# ---- opening ----------------------------------------------------------------------------


def _open(
    location: StoreLocation, partitions: int, cache_size: int, create: bool
) -> list[LedgerPartition]:
    return [
        LedgerPartition(location, index, cache_size, create=create) for index in range(partitions)
    ]


def _require_file(location: StoreLocation) -> None:
    """Only the commands that write jobs create a SQLite store: for the others a missing
    file is a mistake (a typo must not audit as an empty, intact store)."""
    path = location.env["SQLITE_DBNAME"]
    if not os.path.isfile(path):
        raise StoreMissingError(f"no store at {path} (no such file)")


def _require_tables(location: StoreLocation, partitions: list[LedgerPartition]) -> None:
    if all(partition.has_tables() for partition in partitions):
        return
    if location.is_sqlite:
        raise StoreMissingError(
            f"no store at {location.env['SQLITE_DBNAME']} (no jobledger tables)"
        )
    env = location.env
    schema = env.get("POSTGRES_SCHEMA", "public")
    raise StoreMissingError(
        f"no store in schema {schema!r} of database {env['POSTGRES_DBNAME']!r} on "
        f"{env['POSTGRES_HOST']} (no jobledger tables)"
    )


def _for_reading(location: StoreLocation) -> StoreLocation:
    """A SQLite file in a directory we cannot write (read-only media, an evidence copy) is
    opened ``mode=ro&immutable=1``: SQLite could not create the WAL index beside it, and
    immutable tells it no other process changes the file, so it needs none. Elsewhere an
    ordinary connection that writes nothing leaves no trace (its WAL files go on close)."""
    if not location.is_sqlite:
        return location
    path = Path(location.env["SQLITE_DBNAME"]).resolve()
    if os.access(path.parent, os.W_OK) and os.access(path, os.W_OK):
        return location
    uri = f"file:{quote(path.as_posix())}?mode=ro&immutable=1"
    return replace(location, env={**location.env, "SQLITE_DBNAME": uri})
