"""The hot path of a tick (issue 25 item 2): a job's next tick continues from the object
its last tick committed, neither re-reading what that tick wrote nor copying it, and
still sees every event another writer appended in between (another process, a command).
On SQLite and PostgreSQL."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from jobledger import JobStatus
from jobledger.adapters.event_store import EventSourcedJobStore
from jobledger.domain.identity import job_uuid
from tests.support.engines import CountingExecutor, EngineFactory, store_of

TENANT = "t"


@contextmanager
def rows_read(store: EventSourcedJobStore) -> Iterator[list[int]]:
    """Counts the rows every select of the store's events tables returns."""
    counts: list[int] = []
    recorders = [partition.events.recorder for partition in store.partitions]
    originals = [recorder.select_events for recorder in recorders]

    def counting(select: Any) -> Any:
        def wrapped(*args: Any, **kwargs: Any) -> Sequence[Any]:
            rows = select(*args, **kwargs)
            counts.append(len(rows))
            return rows

        return wrapped

    for recorder, select in zip(recorders, originals, strict=True):
        recorder.select_events = counting(select)
    try:
        yield counts
    finally:
        for recorder, select in zip(recorders, originals, strict=True):
            recorder.select_events = select


def test_each_tick_after_the_first_reads_no_row_its_predecessor_wrote(
    make_engine: EngineFactory,
) -> None:
    engine = make_engine(config={"max_steps_per_tick": 1})
    engine.submit(TENANT, "j", "agent3")
    first = engine.tick(TENANT, "j")
    assert first.steps_executed == 1
    with rows_read(store_of(engine)) as counts:
        for _ in range(3):
            engine.tick(TENANT, "j")
    assert engine.job(TENANT, "j").status == JobStatus.COMPLETED
    # Three ticks, each asking once for what came after the version it kept: nothing.
    assert counts == [0, 0, 0]


def test_a_kept_job_still_sees_what_another_engine_appended(
    make_engine: EngineFactory, executor: CountingExecutor
) -> None:
    worker = make_engine(config={"max_steps_per_tick": 1})
    other = make_engine()
    worker.submit(TENANT, "j", "agent3")
    worker.tick(TENANT, "j")  # step 1 recorded; the worker keeps the job
    other.cancel(TENANT, "j", by="ops", reason="stop")
    report = worker.tick(TENANT, "j")
    assert report.status == JobStatus.CANCELLED and report.steps_executed == 0
    assert sum(executor.calls.values()) == 1


def test_a_kept_job_whose_next_append_is_refused_is_not_kept(
    make_engine: EngineFactory, executor: CountingExecutor
) -> None:
    """A tick whose claim lost a race reloads; what it keeps is the store's job, so the
    next tick neither repeats the step nor writes on top of a refused state."""
    worker = make_engine(config={"max_steps_per_tick": 1})
    other = make_engine(config={"max_steps_per_tick": 1})
    worker.submit(TENANT, "j", "agent3")
    worker.tick(TENANT, "j")
    other.tick(TENANT, "j")  # step 2, by another worker, behind the kept job's back
    worker.tick(TENANT, "j")  # step 3 at the version the store holds
    report = worker.tick(TENANT, "j")
    kept = store_of(worker).kept.take(job_uuid(TENANT, "j"))
    assert kept is not None and kept.status == JobStatus.COMPLETED
    assert kept.version == report.version == len(worker.history(TENANT, "j"))
    assert sorted(executor.calls.values()) == [1, 1, 1]
