"""A resume (token or signal) and the tick it wakes in this engine read the job from the
store once: the resume hands the job it committed back to the store (``JobStore.keep``),
and the tick's load takes it, asking the store only for events another writer added
since; none here (issue 25, item 5)."""

from __future__ import annotations

from collections import Counter
from typing import Any
from uuid import UUID

import pytest

from jobledger import Engine, FunctionRegistry, JobStatus
from jobledger.domain.errors import TokenReplayedError
from jobledger.domain.identity import job_uuid
from jobledger.domain.job import Job
from jobledger.engine.engine import SignalOutcome
from jobledger.orchestration.ports import JobStore
from tests.support.engines import CountingExecutor, EngineFactory, StoreAround
from tests.support.notifiers import Inbox
from tests.support.workflows import LAST_STEP, STEP, linear_registry, wait_event
from tests.test_hot_path import rows_read

JOB = job_uuid("t", "j")


class CountingReads(StoreAround):
    """The real store, counting what is read of it, by what and for which id."""

    def __init__(self, inner: JobStore) -> None:
        super().__init__(inner)
        self.reads: Counter[tuple[str, UUID]] = Counter()

    def load(self, job_uuid: UUID) -> Job | None:
        self.reads["load", job_uuid] += 1
        return self.inner.load(job_uuid)

    def find_key(self, route: UUID, key_id: UUID) -> Any:
        self.reads["find_key", route] += 1
        return self.inner.find_key(route, key_id)

    def events(self, job_uuid: UUID, **window: Any) -> list[Job.Event]:
        self.reads["events", job_uuid] += 1
        return self.inner.events(job_uuid, **window)

    def of_job(self) -> Counter[str]:
        return Counter({what: n for (what, uuid), n in self.reads.items() if uuid == JOB})


def registry() -> FunctionRegistry:
    return linear_registry({"wait": [STEP, wait_event("go"), LAST_STEP]})


@pytest.fixture
def inbox() -> Inbox:
    return Inbox()


@pytest.fixture
def store(make_engine: EngineFactory, inbox: Inbox) -> tuple[Engine, CountingReads]:
    """An engine whose job waits for ``go`` after its first step, over a counting store."""
    wrapped: list[CountingReads] = []

    def wrap(inner: JobStore) -> CountingReads:
        wrapped.append(CountingReads(inner))
        return wrapped[0]

    engine = make_engine(registry=registry(), notifier=inbox, wrap_store=wrap)
    engine.submit("t", "j", "wait")
    engine.run_until_idle()
    assert engine.job("t", "j").status is JobStatus.WAITING_EVENT
    wrapped[0].reads.clear()
    return engine, wrapped[0]


def test_a_token_resume_and_its_tick_load_the_job_once(
    store: tuple[Engine, CountingReads], inbox: Inbox, executor: CountingExecutor
) -> None:
    engine, reads = store

    with rows_read(reads.inner) as rows:
        engine.resume(inbox.tokens["j"].token, {"paid": 1})
        assert engine.run_until_idle() == 1

    # The resume's load and the tick's; no key lookup (a fresh nonce is asked of the store
    # only when the job refuses the resume). The job was read once: the resume's load
    # read its events, the tick's read no row.
    assert reads.of_job() == Counter({"load": 2})
    assert rows[1:] == [0]
    job = engine.job("t", "j")
    assert job.status is JobStatus.COMPLETED and job.state["paid"] == 1
    assert executor.calls["t/j:step:3"] == 1
    assert engine.verify("t", "j") is None


def test_a_signal_and_its_tick_load_the_job_once(
    store: tuple[Engine, CountingReads], executor: CountingExecutor
) -> None:
    engine, reads = store

    with rows_read(reads.inner) as rows:
        assert engine.signal("t", "j", "go", {"n": 2}, signal_id="s1") is SignalOutcome.RESUMED
        engine.run_until_idle()

    assert reads.of_job() == Counter({"load": 2})
    assert rows[1:] == [0]
    assert engine.job("t", "j").status is JobStatus.COMPLETED
    assert executor.calls["t/j:step:3"] == 1


def test_a_used_token_or_signal_id_is_still_refused(
    store: tuple[Engine, CountingReads], inbox: Inbox
) -> None:
    engine, reads = store
    token = inbox.tokens["j"].token

    # A job that accepts a used key (a signal buffered again) collides with it on append.
    assert engine.signal("t", "j", "later", signal_id="s2") is SignalOutcome.BUFFERED
    assert engine.signal("t", "j", "later", signal_id="s2") is SignalOutcome.DUPLICATE
    types = [entry.event_type for entry in engine.history("t", "j")]
    assert types.count("SignalBuffered") == 1

    engine.resume(token)
    engine.run_until_idle()
    reads.reads.clear()
    # A job that refuses the command (it has moved on) is asked for the key: a replay.
    with pytest.raises(TokenReplayedError):
        engine.resume(token)
    assert reads.of_job()["find_key"] == 1


def test_an_input_from_another_process_before_the_tick_is_seen_by_it(
    store: tuple[Engine, CountingReads],
    make_engine: EngineFactory,
    inbox: Inbox,
    executor: CountingExecutor,
) -> None:
    engine, _ = store
    other = make_engine(registry=registry())  # another process on the same store
    engine.resume(inbox.tokens["j"].token)

    # Lands after the resume, before the tick that starts from the job as resumed.
    other.raise_budget("t", "j", raised_by="ops", reason="more", max_steps=50)
    engine.run_until_idle()

    job = engine.job("t", "j")
    assert job.status is JobStatus.COMPLETED and job.budget["max_steps"] == 50
    assert executor.calls["t/j:step:3"] == 1
    types = [entry.event_type for entry in engine.history("t", "j")]
    assert types.index("BudgetRaised") < types.index("StepRecorded", types.index("Resumed"))
    assert engine.verify("t", "j") is None


def test_this_engines_own_command_before_the_tick_is_seen_by_it(
    store: tuple[Engine, CountingReads], inbox: Inbox, executor: CountingExecutor
) -> None:
    engine, reads = store
    engine.resume(inbox.tokens["j"].token)

    engine.cancel("t", "j", reason="withdrawn", by="support")
    engine.run_until_idle()

    # The cancel took the job the resume handed back; the tick loaded the cancelled job
    # instead of running a step on the resumed one.
    assert reads.of_job()["load"] == 3  # the resume's, the cancel's, the tick's
    assert engine.job("t", "j").status is JobStatus.CANCELLED
    assert executor.calls["t/j:step:3"] == 0


def test_a_cancel_from_another_process_before_the_tick_runs_no_step(
    store: tuple[Engine, CountingReads],
    make_engine: EngineFactory,
    inbox: Inbox,
    executor: CountingExecutor,
) -> None:
    """The tick starts from the job the resume handed back, brought up to date: a cancel
    another process committed in between is seen before any step runs (not discarded
    after a paid side effect)."""
    engine, _ = store
    other = make_engine(registry=registry())
    engine.resume(inbox.tokens["j"].token)
    other.cancel("t", "j", reason="withdrawn", by="support")
    engine.run_until_idle()

    assert engine.job("t", "j").status is JobStatus.CANCELLED
    assert executor.calls["t/j:step:3"] == 0
    types = [entry.event_type for entry in engine.history("t", "j")]
    assert "LateResultDiscarded" not in types
