"""The seams of a step, on both stores: inputs that land while it runs, and a commit whose
acknowledgement was lost. A finished step is recorded once and never re-run unless its
worker died."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from decimal import Decimal
from typing import Any

import pytest
from eventsourcing.persistence import OperationalError
from eventsourcing.sqlite import SQLiteDatastore

from jobledger import Engine, FunctionRegistry, JobStatus, Outcome, StepRequest, StepResult
from jobledger.domain.errors import VersionConflict
from jobledger.domain.identity import job_uuid, step_key
from jobledger.domain.job import Job
from jobledger.engine.engine import SignalOutcome
from tests.support.engines import CountingExecutor, EngineFactory
from tests.support.workflows import DONE, STEP, linear_registry, wait_event

JOB = "job-1"
TENANT = "acme"


def step_then_wait_registry() -> FunctionRegistry:
    """A paid step, then a wait for ``go``, then a second paid step."""
    return linear_registry({"mission": [STEP, wait_event("go"), STEP, DONE]})


class InputDuringStep(CountingExecutor):
    """Runs ``during`` on another thread while step 1's side effect is in progress, and
    finishes the step only once that input has landed in the store."""

    def __init__(self, during: Callable[[], Any]) -> None:
        super().__init__()
        self.during = during
        self.results: list[Any] = []
        self.errors: list[BaseException] = []

    def execute(self, request: StepRequest) -> StepResult:
        result = super().execute(request)
        if request.step_number == 1:
            worker = threading.Thread(target=self.run_input)
            worker.start()
            worker.join(timeout=30)
            assert not worker.is_alive(), "the concurrent input never finished"
        return result

    def run_input(self) -> None:
        try:
            self.results.append(self.during())
        except BaseException as error:  # reported by the test, not lost on the thread
            self.errors.append(error)


def engines(
    make_engine: EngineFactory, during: Callable[[Engine], Any]
) -> tuple[Engine, InputDuringStep]:
    """A worker engine whose step 1 sees ``during`` applied by a second engine."""
    registry = step_then_wait_registry()
    outsider = make_engine(registry=registry)
    executor = InputDuringStep(lambda: during(outsider))
    worker = make_engine(registry=registry, executor=executor)
    worker.submit(TENANT, JOB, "mission")
    return worker, executor


def event_types(engine: Engine) -> list[str]:
    return [entry.event_type for entry in engine.history(TENANT, JOB)]


def test_a_signal_during_a_step_keeps_the_step_and_opens_the_wait_at_once(
    make_engine: EngineFactory,
) -> None:
    worker, executor = engines(
        make_engine, lambda other: other.signal(TENANT, JOB, "go", {"paid": 1}, signal_id="e1")
    )
    report = worker.tick(TENANT, JOB)

    assert executor.errors == [] and executor.results == [SignalOutcome.BUFFERED]
    assert report.outcome is Outcome.ADVANCED
    assert report.status is JobStatus.COMPLETED  # no lease to wait out: one tick did it all
    assert executor.calls == {step_key(TENANT, JOB, 1): 1, step_key(TENANT, JOB, 3): 1}
    history = event_types(worker)
    # The signal landed between the claim and the step; the step was recorded on top of it
    # and the wait it opened was resumed by the kept signal in the same append.
    claimed = history.index("Claimed")
    assert history[claimed + 1 : claimed + 3] == ["SignalBuffered", "StepRecorded"]
    assert history.count("StepRecorded") == 4 and "LateResultDiscarded" not in history
    resumed = [e for e in worker.history(TENANT, JOB) if e.event_type == "Resumed"]
    assert [e.data["source"] for e in resumed] == ["early_signal"]
    assert worker.job(TENANT, JOB).state["paid"] == 1
    assert worker.verify(TENANT, JOB) is None
    # Replay folds the input that landed mid-step as the engine did: same decisions.
    replayed = worker.replay(TENANT, JOB)
    assert replayed.safe and replayed.verdict == "completed: replays the same; nothing to migrate"


def test_a_budget_raise_during_a_step_keeps_the_step(make_engine: EngineFactory) -> None:
    worker, executor = engines(
        make_engine,
        lambda other: other.raise_budget(
            TENANT, JOB, raised_by="ops", reason="worth it", max_cost_usd="50"
        ),
    )
    report = worker.tick(TENANT, JOB)

    assert executor.errors == []
    assert report.outcome is Outcome.ADVANCED and report.status is JobStatus.WAITING_EVENT
    assert executor.calls == {step_key(TENANT, JOB, 1): 1}
    job = worker.job(TENANT, JOB)
    assert job.current_step == 2 and Decimal(job.budget["max_cost_usd"]) == Decimal(50)
    assert "BudgetRaised" in event_types(worker)


def test_many_signals_during_a_step_are_all_kept_and_the_step_recorded_once(
    make_engine: EngineFactory,
) -> None:
    def burst(other: Engine) -> list[SignalOutcome]:
        return [
            other.signal(TENANT, JOB, f"other-{n}", {"n": n}, signal_id=f"s{n}") for n in range(8)
        ]

    worker, executor = engines(make_engine, burst)
    report = worker.tick(TENANT, JOB)

    assert executor.errors == [] and executor.results == [[SignalOutcome.BUFFERED] * 8]
    assert report.status is JobStatus.WAITING_EVENT
    assert executor.calls == {step_key(TENANT, JOB, 1): 1}
    assert event_types(worker).count("SignalBuffered") == 8


def test_a_cancel_during_a_step_still_discards_its_result(make_engine: EngineFactory) -> None:
    worker, executor = engines(
        make_engine, lambda other: other.cancel(TENANT, JOB, reason="withdrawn", by="support")
    )
    report = worker.tick(TENANT, JOB)

    assert executor.errors == []
    assert report.outcome is Outcome.DISCARDED and report.status is JobStatus.CANCELLED
    history = event_types(worker)
    assert history[-2:] == ["Cancelled", "LateResultDiscarded"]
    assert "StepRecorded" not in history


# ---- a commit whose acknowledgement was lost ------------------------------------------------


class LostAcknowledgement:
    """The first commit of an append holding a step lands in the store, then the caller
    hears OperationalError, as when the connection drops before the COMMIT's reply. On
    PostgreSQL the library retries the insert by itself; on SQLite the error reaches the
    engine."""

    def __init__(self, engine: Engine) -> None:
        self.armed = False
        self.fired = 0
        store: Any = engine.store
        for partition in store.partitions:
            self.wrap(partition.recorder)

    def wrap(self, recorder: Any) -> None:
        insert, datastore = recorder.insert_events, recorder.datastore

        def insert_events(stored_events: Any, **kwargs: Any) -> Any:
            if not self.fired and any("StepRecorded" in e.topic for e in stored_events):
                self.armed = True
            return insert(stored_events, **kwargs)

        recorder.insert_events = insert_events
        if isinstance(datastore, SQLiteDatastore):
            # SQLite's append hands its writer connection back to the pool once committed.
            pool = datastore.pool
            put_connection = pool.put_connection

            def handed_back(conn: Any) -> None:
                put_connection(conn)
                self.lose_acknowledgement()

            pool.put_connection = handed_back
            return
        open_connection = datastore.get_connection

        @contextmanager
        def connection(*args: Any, **kwargs: Any) -> Iterator[Any]:
            with open_connection(*args, **kwargs) as conn:
                yield conn
            self.lose_acknowledgement()

        datastore.get_connection = connection

    def lose_acknowledgement(self) -> None:
        if self.armed:  # the transaction committed; its acknowledgement is lost
            self.armed = False
            self.fired += 1
            raise OperationalError("server closed the connection unexpectedly")


def test_a_step_whose_commit_acknowledgement_was_lost_is_recognised_as_its_own(
    make_engine: EngineFactory, executor: CountingExecutor
) -> None:
    engine = make_engine()
    engine.submit(TENANT, JOB, "agent3")
    lost = LostAcknowledgement(engine)

    engine.run_until_idle(wait_for_timers=True)

    assert lost.fired == 1
    job = engine.job(TENANT, JOB)
    assert job.status is JobStatus.COMPLETED, job
    assert executor.calls == {step_key(TENANT, JOB, n): 1 for n in (1, 2, 3)}
    history = engine.history(TENANT, JOB)
    assert [e.event_type for e in history].count("StepRecorded") == 4
    assert engine.verify(TENANT, JOB) is None


def test_a_refused_append_that_is_not_ours_is_still_a_conflict(
    make_engine: EngineFactory,
) -> None:
    """The recognition compares the stored event's chain hash with ours: another writer's
    event at the same version is a conflict, never taken for our own."""
    engine = make_engine()
    engine.submit(TENANT, JOB, "agent3")
    stale = engine.store.load(job_uuid(TENANT, JOB))
    assert stale is not None
    engine.cancel(TENANT, JOB, reason="first", by="a")
    stale.cancel(reason="second", cancelled_by="b", now=stale.modified_on)
    with pytest.raises(VersionConflict):
        engine.store.append(stale)
    assert [e.event_type for e in engine.history(TENANT, JOB)] == ["Submitted", "Cancelled"]
    stored = engine.store.events(stale.id)[-1]
    assert isinstance(stored, Job.Cancelled)
    assert engine.store.holds(stale.id, 2, stored.chain_hash)
    assert not engine.store.holds(stale.id, 2, stale.chain_head)  # the refused one
    assert not engine.store.holds(stale.id, 3, stored.chain_hash)
