"""The JobStore port on the eventsourcing library: partitions of append-only event tables."""

from __future__ import annotations

import contextlib
import logging
import re
from collections.abc import Iterable, Sequence
from copy import deepcopy
from datetime import datetime
from typing import Any, Literal, TypeVar, cast
from uuid import UUID

from eventsourcing.application import AggregateNotFoundError, Application
from eventsourcing.domain import CanMutateProtocol, OriginatorVersionError
from eventsourcing.persistence import (
    ApplicationRecorder,
    EventStore,
    IntegrityError,
    Mapper,
    MapperDeserialisationError,
)

from jobledger.adapters.backends import StoreBackend, backend_for
from jobledger.adapters.backends.migrations import COMPONENT, STORE_MIGRATIONS
from jobledger.adapters.kept_jobs import KeptJobs
from jobledger.adapters.leases import LeaseTable
from jobledger.adapters.mapper import SealedMapper
from jobledger.adapters.sealing import SealingPipeline
from jobledger.adapters.store_errors import damaged, store_error, store_error_types, store_errors
from jobledger.adapters.store_url import StoreLocation
from jobledger.adapters.tombstones import TOMBSTONE_TABLE, InTransaction, Tombstones
from jobledger.domain.batch import Batch
from jobledger.domain.errors import (
    BrokenHistoryError,
    DuplicateKeyError,
    StoreMissingError,
    StoreUnavailableError,
    StoreUnreachableError,
    VersionConflict,
)
from jobledger.domain.job import Job
from jobledger.domain.keys import ConsumedKey, KeyKind
from jobledger.domain.retention import Tombstone
from jobledger.domain.schedule import Schedule
from jobledger.orchestration.ports import Append, EventSigner, FieldSealer, Refusal

log = logging.getLogger(__name__)

StoreMode = Literal["create", "existing", "read"]
"""``create``: make the store and its tables if missing (the commands that write jobs).
``existing``: the store must exist (a SQLite file is never created). ``read``: the store
must exist and is only read: no lock, no DDL, so a store on read-only media works."""
Aggregated = TypeVar("Aggregated")
_Folded = TypeVar("_Folded", Job, Schedule, Batch)
CanMutate = CanMutateProtocol[Any]


def project(aggregate: Aggregated | None, events: Iterable[CanMutate]) -> Aggregated | None:
    """eventsourcing's ``project_aggregate`` without its check of each event against a
    runtime Protocol: about 12 µs an event on Python 3.11, and a load replays every event
    since the last snapshot (each of a worker's ticks loads its job)."""
    for event in events:
        aggregate = event.mutate(aggregate)
    return aggregate


class LedgerPartition(Application[UUID]):
    """One partition: an eventsourcing application writing its own events table.

    A job and every key that guards it live in the same partition, so one transaction
    covers them: the uniqueness of (originator_id, originator_version) in that table is
    what makes both the version compare-and-swap and the at-most-once keys hold.
    """

    def __init__(
        self,
        location: StoreLocation,
        index: int,
        cache_size: int,
        *,
        backend: StoreBackend,
        create: bool = True,
        sealer: FieldSealer | None = None,
    ) -> None:
        self.create_tables = create
        self.sealer = sealer
        # Chooses the recorder of the events table (a faster one where the database has it).
        self.backend = backend
        self.table_prefix = f"jobledger_p{index}"
        # The partition's name is its identity in tracking records (one log each).
        self.name = self.table_prefix
        self.events_table = f"{self.table_prefix}_events"
        env = {
            **location.env,
            "AGGREGATE_CACHE_MAXSIZE": str(cache_size) if cache_size else "",
            # Fast-forward: a cached job is brought up to date from the store on every load,
            # so a write by another process is never missed.
            "AGGREGATE_CACHE_FASTFORWARD": "y",
            "IS_SNAPSHOTTING_ENABLED": "y",
        }
        super().__init__(env=env)

    def construct_mapper(self) -> Mapper[UUID]:
        return SealedMapper(self.construct_transcoder(), self.sealer)

    def construct_recorder(self) -> ApplicationRecorder:
        factory: Any = self.factory
        recorder_class = self.backend.application_recorder_class(factory.application_recorder_class)
        recorder: ApplicationRecorder = recorder_class(
            datastore=factory.datastore, events_table_name=self.events_table
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
        sealer: FieldSealer | None = None,
        signer: EventSigner | None = None,
    ) -> None:
        self.location = location
        self.sealing = SealingPipeline(sealer, signer)
        """Hashes, seals and signs every job event this store writes."""
        self.snapshot_interval = snapshot_interval
        self.kept = KeptJobs(cache_size)
        """Jobs their last user handed back (``keep``): the next load takes the object."""
        self.read_only = mode == "read"
        self.backend: StoreBackend = backend_for(location)
        """Everything that differs between SQLite and PostgreSQL."""
        if mode != "create":
            self.backend.require_exists()
        try:
            if mode == "create":
                self.backend.create_home()
            with self.backend.opening_lock(read_only=self.read_only):
                opened = self.backend.for_reading() if self.read_only else location
                self.partitions = _open(
                    opened, partitions, cache_size, not self.read_only, self.backend, sealer
                )
                self.backend.attach(getattr(self.partitions[0].factory, "datastore"))  # noqa: B009
                if self.read_only:
                    self._require_tables()
                    self.backend.check_schema(COMPONENT, STORE_MIGRATIONS)
                else:
                    # A writer brings the store's own tables up to this release (a store
                    # of an earlier one included); a store of a later one is refused.
                    self.backend.migrate(COMPONENT, STORE_MIGRATIONS)
                # The heartbeat-renewed leases: one table per store, in its own database.
                self.leases = LeaseTable(self.backend)
                self.tombstones = Tombstones(self.backend)
        except store_error_types() as error:
            if damaged(error):
                raise store_error(error, f"opening the {location.kind} store") from None
            raise StoreUnreachableError(f"cannot open the {location.kind} store: {error}") from None

    def _require_tables(self) -> None:
        events = [partition.events_table for partition in self.partitions]
        if not self.backend.has_tables(*events):
            raise StoreMissingError(f"no store {self.backend.describe()} (no jobledger tables)")

    def partition(self, job_uuid: UUID) -> LedgerPartition:
        return self.partitions[job_uuid.int % len(self.partitions)]

    # ---- the JobStore port -------------------------------------------------------------

    @store_errors("loading a job")
    def load(self, job_uuid: UUID) -> Job | None:
        kept = self.kept.take(job_uuid)
        if kept is not None:
            return self._fast_forward(kept)
        return self._fold(job_uuid, Job)

    def keep(self, job: Job) -> None:
        self.kept.keep(job)

    @store_errors("appending")
    def append(self, job: Job, *keys: ConsumedKey) -> None:
        partition = self.partition(job.id)
        version_before = job.version - len(job.pending_events)
        self.sealing.seal_pending(job)
        # Straight to the event store: Application.save() would only add runtime
        # Protocol checks (slow) and snapshot/cache work this store does itself.
        steps = [*job.collect_events()]
        events = [*steps]
        for key in keys:
            events.extend(key.collect_events())
        try:
            partition.events.put(events)
        except IntegrityError:
            # Telling which collided reads the store again: translated like the rest.
            raise self.conflict(partition, keys, steps) from None
        if version_before == 0:
            self.cache_created(partition, job)
        self.snapshot_if_due(partition, job, version_before)

    @store_errors("appending a group")
    def append_many(self, appends: Sequence[Append]) -> list[Exception | None]:
        results: list[Exception | None] = [None] * len(appends)
        by_partition: dict[int, list[int]] = {}
        for index, one in enumerate(appends):
            by_partition.setdefault(id(self.partition(one.job.id)), []).append(index)
        for indices in by_partition.values():
            partition = self.partition(appends[indices[0]].job.id)
            self.commit_group(partition, appends, indices, results)
        return results

    def commit_group(
        self,
        partition: LedgerPartition,
        appends: Sequence[Append],
        indices: list[int],
        results: list[Exception | None],
    ) -> None:
        """One partition's appends in one transaction. A refused transaction writes
        nothing; the appends whose version slot or key is taken are named, reported and
        left out, and the rest are tried again: each round leaves out at least one, so
        this ends. When none can be named (a race this store does not expect: its rows
        are never deleted), each append is tried alone, as ``append`` would."""
        pending = self.refuse_within_group(appends, indices, results)
        pending = self.seal_group(appends, pending, results)
        while pending:
            group = [appends[i] for i in pending]
            try:
                partition.events.put([e for one in group for e in _pending(one)])
            except IntegrityError:
                refused = {i: self.refusal(partition, appends[i]) for i in pending}
                named = {i: r for i, r in refused.items() if r is not None}
                if not named:
                    for i in pending:
                        results[i] = self.append_alone(appends[i])
                    return
                for i, refusal in named.items():
                    results[i] = refusal
                    _spend(appends[i])
                pending = [i for i in pending if i not in named]
                continue
            for one in group:
                version_before = one.job.version - len(one.job.pending_events)
                _spend(one)
                if version_before == 0:
                    self.cache_created(partition, one.job)
                self.snapshot_if_due(partition, one.job, version_before)
            return

    def seal_group(
        self, appends: Sequence[Append], indices: list[int], results: list[Exception | None]
    ) -> list[int]:
        """Each append's events sealed on its own: one that cannot be (a value the
        canonical form refuses, no signing key for its time) is left out with the error
        ``append`` would have raised, and the others are written without it."""
        sealed = []
        for i in indices:
            try:
                self.sealing.seal_pending(appends[i].job)
            except Exception as error:  # handed to that append's own tick, as append raises it
                results[i] = error
                _spend(appends[i])
                continue
            sealed.append(i)
        return sealed

    def refuse_within_group(
        self, appends: Sequence[Append], indices: list[int], results: list[Exception | None]
    ) -> list[int]:
        """Two appends of one group for the same job, or consuming the same key: the
        first is kept, the later one is refused as if the first had committed before it."""
        jobs: set[UUID] = set()
        keys: set[UUID] = set()
        kept = []
        for i in indices:
            one = appends[i]
            used = next((k for k in one.keys if k.id in keys), None)
            if used is not None:
                results[i] = DuplicateKeyError(used.kind, used.key)
            elif one.job.id in jobs:
                results[i] = VersionConflict("another append of the same group moved the job")
            else:
                jobs.add(one.job.id)
                keys.update(k.id for k in one.keys)
                kept.append(i)
                continue
            _spend(one)
        return kept

    def refusal(self, partition: LedgerPartition, one: Append) -> Refusal | None:
        """Why the store would refuse this append now, if it would."""
        refused = self.conflict(partition, one.keys, one.job.pending_events)
        if isinstance(refused, DuplicateKeyError):
            return refused
        if not one.job.pending_events:
            return None
        first = one.job.pending_events[0]
        taken = next(
            partition.events.get(one.job.id, gt=first.originator_version - 1, limit=1), None
        )
        return refused if taken is not None else None

    def append_alone(self, one: Append) -> Refusal | None:
        try:
            self.append(one.job, *one.keys)
        except (DuplicateKeyError, VersionConflict) as refused:
            return refused
        return None

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
            key: object = self.partition(route).repository.get(key_id, projector_func=project)
        except AggregateNotFoundError:
            return None
        assert isinstance(key, ConsumedKey)
        return key

    @store_errors("reading an event")
    def holds(self, job_uuid: UUID, version: int, chain_hash: str) -> bool:
        found = next(self.partition(job_uuid).events.get(job_uuid, gt=version - 1, limit=1), None)
        return isinstance(found, Job.Event) and found.chain_hash == chain_hash

    @store_errors("loading a schedule")
    def load_schedule(self, schedule_uuid: UUID) -> Schedule | None:
        return self._fold(schedule_uuid, Schedule)

    @store_errors("appending to a schedule")
    def append_schedule(self, schedule: Schedule) -> None:
        events = schedule.collect_events()
        try:
            self.partition(schedule.id).events.put(events)
        except IntegrityError:
            raise VersionConflict("the schedule was changed by another writer") from None

    @store_errors("loading a batch")
    def load_batch(self, batch_uuid: UUID) -> Batch | None:
        return self._fold(batch_uuid, Batch)

    @store_errors("appending to a batch")
    def append_batch(self, batch: Batch) -> None:
        try:
            self.partition(batch.id).events.put(batch.collect_events())
        except IntegrityError:
            raise VersionConflict("the batch was changed by another writer") from None

    @store_errors("reading a schedule's events")
    def schedule_events(self, schedule_uuid: UUID) -> list[Schedule.Event]:
        stored = self.partition(schedule_uuid).events.get(schedule_uuid)
        return [event for event in stored if isinstance(event, Schedule.Event)]

    @store_errors("reading events")
    def events(
        self,
        job_uuid: UUID,
        *,
        after: int = 0,
        to_version: int | None = None,
        limit: int | None = None,
    ) -> list[Job.Event]:
        window = self.partition(job_uuid).events.get(
            job_uuid, gt=after or None, lte=to_version, limit=limit
        )
        try:
            stored = list(window)
        except MapperDeserialisationError as error:
            raise BrokenHistoryError(str(job_uuid), _broken_at(error)) from None
        return [event for event in stored if isinstance(event, Job.Event)]

    def _fast_forward(self, job: Job) -> Job:
        """A kept job brought up to date: the events another writer (another process, or
        a command of this one that loaded the job cold) appended after its version."""
        newer = self.partition(job.id).events.get(job.id, gt=job.version)
        try:
            folded = project(job, cast("Iterable[CanMutate]", newer))
        except (OriginatorVersionError, MapperDeserialisationError) as error:
            raise BrokenHistoryError(str(job.id), _broken_at(error)) from None
        assert isinstance(folded, Job)
        return folded

    def _fold(self, uuid: UUID, kind: type[_Folded]) -> _Folded | None:
        try:
            found: object = self.partition(uuid).repository.get(uuid, projector_func=project)
        except AggregateNotFoundError:
            return None
        except (OriginatorVersionError, MapperDeserialisationError) as error:
            # A gap (a deleted event) or a row that no longer decodes: the history cannot
            # be folded, and nothing may be written on top of it.
            raise BrokenHistoryError(str(uuid), _broken_at(error)) from None
        assert isinstance(found, kind)
        return found

    # ---- the steps of an append --------------------------------------------------------

    def conflict(
        self, partition: LedgerPartition, keys: tuple[ConsumedKey, ...], events: Sequence[object]
    ) -> DuplicateKeyError | VersionConflict:
        """The append was refused as a whole; say whether a key or the version collided."""
        for key in keys:
            # get() returns a lazy iterator (always truthy): look for an actual event.
            if next(partition.events.get(key.id, limit=1), None) is not None:
                return DuplicateKeyError(key.kind, key.key)
        recorded = self.step_recorded_since(partition, events)
        if recorded is not None:
            return DuplicateKeyError(KeyKind.STEP, recorded)
        return VersionConflict("the job was changed by another writer since it was loaded")

    def step_recorded_since(
        self, partition: LedgerPartition, events: Sequence[object]
    ) -> str | None:
        """The key of a step among ``events`` that the store already holds, if any. A step
        key is no row of its own (it is derived from the step's record): step n is only
        appended on a fold at step n-1, so a record of it can only sit at or after the
        version the refused append was written at."""
        steps = {
            e.step_number: e.idempotency_key for e in events if isinstance(e, Job.StepRecorded)
        }
        if not steps:
            return None
        first = events[0]
        assert isinstance(first, Job.Event)
        stored = partition.events.get(first.originator_id, gt=first.originator_version - 1)
        for event in stored:
            if isinstance(event, Job.StepRecorded) and event.step_number in steps:
                return steps[event.step_number]
        return None

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
        if job.personal_data:
            # A snapshot holds the job's state in plaintext and an erasure could not reach
            # it: a job with personal data is folded from its (sealed) events instead.
            return
        assert partition.snapshots is not None
        try:
            with store_errors("taking a snapshot"):
                partition.snapshots.put([Job.Snapshot.take(job)])
        except StoreUnavailableError:
            log.warning(
                "snapshot of job %s at version %s failed", job.id, job.version, exc_info=True
            )

    # ---- archived jobs (see adapters.tombstones) ----------------------------------------

    @store_errors("reading a tombstone")
    def tombstone(self, job_uuid: UUID) -> Tombstone | None:
        # A store of a release before tombstones, opened to read, has no table of them.
        if self.read_only and not self.backend.has_tables(TOMBSTONE_TABLE):
            return None
        return self.tombstones.get(job_uuid)

    @store_errors("reading the tombstones")
    def tombstones_of(self, tenant_id: str | None = None) -> list[Tombstone]:
        if self.read_only and not self.backend.has_tables(TOMBSTONE_TABLE):
            return []
        return self.tombstones.all(tenant_id)

    @store_errors("archiving a job")
    def remove_archived(self, tombstone: Tombstone, also: InTransaction | None = None) -> None:
        partition = self.partition(tombstone.job_uuid)
        tables = (partition.events_table, f"{partition.table_prefix}_snapshots")
        readers = (partition.name, f"{partition.name}.outbox")
        self.tombstones.bury(tombstone, tables, readers, also)
        self._forget(partition, tombstone.job_uuid)

    @store_errors("restoring a job")
    def restore_archived(
        self,
        tombstone: Tombstone,
        events: Sequence[Job.Event],
        also: InTransaction | None = None,
    ) -> None:
        partition = self.partition(tombstone.job_uuid)
        self.tombstones.raise_up(tombstone, events, partition.mapper, partition.events_table, also)
        self._forget(partition, tombstone.job_uuid)

    def _forget(self, partition: LedgerPartition, job_uuid: UUID) -> None:
        """This process's copies of a job that left (or came back to) the store."""
        self.kept.drop(job_uuid)
        cache = partition.repository.cache
        if cache is not None:
            with contextlib.suppress(KeyError):
                cache.get(job_uuid, evict=True)

    @store_errors("reading the store's clock")
    def clock(self) -> datetime:
        """The store's own clock (``StoreTimeClock`` keeps every process on it)."""
        return self.backend.clock()

    def close(self) -> None:
        for partition in self.partitions:
            partition.close()


_STORED_VERSION = re.compile(r"originator_version (\d+)")


def _pending(one: Append) -> list[Any]:
    """The events an append writes, left pending until its transaction has committed."""
    return [*one.job.pending_events, *(e for key in one.keys for e in key.pending_events)]


def _spend(one: Append) -> None:
    """Written, or refused: either way the append's events are no longer pending."""
    one.job.collect_events()
    for key in one.keys:
        key.collect_events()


def _broken_at(error: OriginatorVersionError | MapperDeserialisationError) -> int:
    """The first version that cannot be folded."""
    if isinstance(error, OriginatorVersionError):
        return int(error.args[1])  # (the version found, the version expected)
    found = _STORED_VERSION.search(str(error))  # eventsourcing names it only in the text
    return int(found.group(1)) if found else 0


# ---- opening ----------------------------------------------------------------------------


def _open(
    location: StoreLocation,
    partitions: int,
    cache_size: int,
    create: bool,
    backend: StoreBackend,
    sealer: FieldSealer | None,
) -> list[LedgerPartition]:
    return [
        LedgerPartition(location, index, cache_size, create=create, backend=backend, sealer=sealer)
        for index in range(partitions)
    ]
