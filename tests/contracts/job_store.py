"""The JobStore port's promises (jobledger.orchestration.ports.JobStore)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from uuid import uuid4

import pytest

from jobledger.domain.errors import DuplicateKeyError, VersionConflict
from jobledger.domain.identity import job_uuid
from jobledger.domain.job import Job
from jobledger.domain.keys import ConsumedKey, KeyKind
from jobledger.domain.status import JobStatus
from jobledger.orchestration.ports import Append, JobStore

AT = datetime(2026, 1, 1, tzinfo=UTC)


def submitted(job_id: str = "j", tenant_id: str = "t") -> Job:
    return Job.submit(
        tenant_id=tenant_id,
        job_id=job_id,
        workflow_type="agent3",
        workflow_version=1,
        state={"n": 1},
        budget={},
        mission_id=None,
        employee_id=None,
        correlation_id=None,
        submit_key=None,
        timestamp=AT,
    )


def consumed(job: Job, kind: str, key: str) -> ConsumedKey:
    return ConsumedKey.consume(
        kind=kind,
        key=key,
        tenant_id=job.tenant_id,
        job_id=job.job_id,
        job_uuid=job.id,
        timestamp=AT,
    )


def buffer(job: Job, signal_id: str) -> None:
    job.buffer_signal(signal_id=signal_id, event_name="paid", payload={}, now=AT)


class JobStoreContract:
    """Subclasses provide a ``store`` fixture: an empty store of their kind."""

    def test_an_unknown_job_is_none_and_has_no_events(self, store: JobStore) -> None:
        assert store.load(uuid4()) is None
        assert store.events(uuid4()) == []

    def test_an_appended_job_loads_back_at_its_version_with_its_events_in_order(
        self, store: JobStore
    ) -> None:
        store.append(submitted())
        job = store.load(job_uuid("t", "j"))
        assert job is not None
        assert (job.version, job.status, job.tenant_id, job.job_id) == (
            1,
            JobStatus.QUEUED,
            "t",
            "j",
        )
        job.cancel(reason="no longer needed", cancelled_by="ops", now=AT + timedelta(seconds=1))
        store.append(job)

        again = store.load(job.id)
        assert again is not None and (again.version, again.status) == (2, JobStatus.CANCELLED)
        assert [type(e).__name__ for e in store.events(job.id)] == ["Submitted", "Cancelled"]
        assert [type(e).__name__ for e in store.events(job.id, to_version=1)] == ["Submitted"]

    def test_events_read_a_range_of_versions(self, store: JobStore) -> None:
        job = submitted()
        for n in range(5):
            job.raise_budget(
                raised_by="ops", reason=f"r{n}", budget={}, now=AT + timedelta(seconds=n)
            )
        store.append(job)

        def versions(**window: int) -> list[int]:
            return [e.originator_version for e in store.events(job.id, **window)]

        assert versions() == [1, 2, 3, 4, 5, 6]
        assert versions(after=2, limit=2) == [3, 4]
        assert versions(after=4) == [5, 6]
        assert versions(after=1, to_version=3) == [2, 3]
        assert versions(after=6) == []

    def test_an_append_on_a_stale_load_is_a_version_conflict_and_writes_nothing(
        self, store: JobStore
    ) -> None:
        store.append(submitted())
        first, second = store.load(job_uuid("t", "j")), store.load(job_uuid("t", "j"))
        assert first is not None and second is not None
        first.cancel(reason="first", cancelled_by="a", now=AT)
        store.append(first)
        second.cancel(reason="second", cancelled_by="b", now=AT)

        with pytest.raises(VersionConflict):
            store.append(second)
        (_, cancelled) = store.events(first.id)
        assert isinstance(cancelled, Job.Cancelled) and cancelled.reason == "first"

    def test_holds_names_exactly_the_stored_event(self, store: JobStore) -> None:
        job = submitted()
        store.append(job)
        (stored,) = store.events(job.id)
        assert store.holds(job.id, 1, stored.chain_hash)
        assert not store.holds(job.id, 1, "0" * 64)
        assert not store.holds(job.id, 2, stored.chain_hash)
        assert not store.holds(uuid4(), 1, stored.chain_hash)

    def test_a_key_is_consumed_with_its_change_in_one_append_and_never_twice(
        self, store: JobStore
    ) -> None:
        job = submitted()
        store.append(job)
        buffer(job, "s1")
        store.append(job, consumed(job, KeyKind.SIGNAL, "s1"))
        record = store.find_key(job.id, consumed(job, KeyKind.SIGNAL, "s1").id)
        assert record is not None
        assert (record.kind, record.key, record.job_id, record.job_uuid) == (
            KeyKind.SIGNAL,
            "s1",
            "j",
            job.id,
        )

        again = store.load(job.id)
        assert again is not None
        buffer(again, "s1")
        with pytest.raises(DuplicateKeyError):
            store.append(again, consumed(again, KeyKind.SIGNAL, "s1"))
        # All or nothing: the change the key guarded was not written either.
        assert len(store.events(job.id)) == 2
        loaded = store.load(job.id)
        assert loaded is not None and loaded.version == 2

    def test_an_unused_key_is_not_found(self, store: JobStore) -> None:
        job = submitted()
        store.append(job)
        assert store.find_key(job.id, consumed(job, KeyKind.SIGNAL, "never").id) is None

    def test_a_reserved_key_is_found_where_its_id_routes_and_is_unique(
        self, store: JobStore
    ) -> None:
        key = consumed(submitted("j1"), KeyKind.SUBMIT, "order-7")
        store.reserve_key(key)
        found = store.find_key(key.route, key.id)
        assert found is not None and (found.kind, found.key, found.job_id) == (
            KeyKind.SUBMIT,
            "order-7",
            "j1",
        )
        with pytest.raises(DuplicateKeyError):
            store.reserve_key(consumed(submitted("j2"), KeyKind.SUBMIT, "order-7"))

    def test_colocated_is_an_equivalence_and_holds_for_a_job_and_its_keys(
        self, store: JobStore
    ) -> None:
        job = submitted()
        a, b = uuid4(), uuid4()
        assert store.colocated(a, a)
        assert store.colocated(a, b) == store.colocated(b, a)
        # A job-scoped key lives beside its job: one append covers both (the test above).
        assert store.colocated(job.id, consumed(job, KeyKind.SIGNAL, "s").route)

    # ---- append_many: a group of appends in one commit ---------------------------------

    def test_append_many_writes_every_append_of_the_group_with_its_keys(
        self, store: JobStore
    ) -> None:
        jobs = [submitted(f"g{n}") for n in range(3)]
        assert store.append_many([Append(job) for job in jobs]) == [None, None, None]
        for job in jobs:
            buffer(job, "s1")
        keys = [consumed(job, KeyKind.SIGNAL, "s1") for job in jobs]
        assert store.append_many([Append(j, (k,)) for j, k in zip(jobs, keys, strict=True)]) == [
            None,
            None,
            None,
        ]
        for job, key in zip(jobs, keys, strict=True):
            loaded = store.load(job.id)
            assert loaded is not None and loaded.version == 2 and not job.pending_events
            assert store.find_key(job.id, key.id) is not None

    def test_a_stale_append_is_left_out_and_reported_and_the_others_are_written(
        self, store: JobStore
    ) -> None:
        first, stale, third = (submitted(f"g{n}") for n in range(3))
        store.append_many([Append(first), Append(stale), Append(third)])
        behind = store.load(stale.id)
        assert behind is not None
        stale.cancel(reason="wins", cancelled_by="ops", now=AT)
        store.append(stale)
        for job in (first, behind, third):
            buffer(job, "s1")

        refused = store.append_many([Append(first), Append(behind), Append(third)])

        assert refused[0] is None and refused[2] is None
        assert isinstance(refused[1], VersionConflict)
        assert [type(e).__name__ for e in store.events(stale.id)] == ["Submitted", "Cancelled"]
        for job in (first, third):
            assert [type(e).__name__ for e in store.events(job.id)][-1] == "SignalBuffered"

    def test_an_append_whose_key_was_used_is_left_out_whole_and_the_others_are_written(
        self, store: JobStore
    ) -> None:
        jobs = [submitted(f"g{n}") for n in range(3)]
        store.append_many([Append(job) for job in jobs])
        used = store.load(jobs[1].id)
        assert used is not None
        buffer(used, "s1")
        store.append(used, consumed(used, KeyKind.SIGNAL, "s1"))
        for job in jobs:
            buffer(job, "s1")

        refused = store.append_many(
            [Append(job, (consumed(job, KeyKind.SIGNAL, "s1"),)) for job in jobs]
        )

        assert refused[0] is None and refused[2] is None
        assert isinstance(refused[1], DuplicateKeyError)
        # All or nothing per append: the change the refused key guarded was not written.
        assert len(store.events(jobs[1].id)) == 2
        for job in (jobs[0], jobs[2]):
            assert len(store.events(job.id)) == 2

    def test_a_key_is_consumed_once_even_by_two_appends_of_one_group(self, store: JobStore) -> None:
        job = submitted()
        store.append(job)
        twin = store.load(job.id)
        assert twin is not None
        other = submitted("other")
        store.append(other)
        buffer(job, "s1")
        buffer(other, "s2")
        key = consumed(job, KeyKind.SIGNAL, "s1")
        again = ConsumedKey.consume(
            kind=KeyKind.SIGNAL,
            key="s1",
            tenant_id="t",
            job_id="j",
            job_uuid=job.id,
            timestamp=AT,
        )
        buffer(twin, "s1")

        refused = store.append_many([Append(job, (key,)), Append(other), Append(twin, (again,))])

        assert refused[0] is None and refused[1] is None
        assert isinstance(refused[2], DuplicateKeyError)
        assert len(store.events(job.id)) == 2 and len(store.events(other.id)) == 2
