"""One row per step (issue 11 item 2), on both stores.

A step that leaves the job running under its tick's claim is ONE event: the continuation
claim is folded into its ``StepRecorded``, and its key is the record's own identity (no
key row). A resume folds the claim of the tick it wakes, so resume -> next step recorded
is two commits. Histories written before (a ``Claimed`` per continuation, a key row per
step) still load, fold, verify and replay: see also tests/test_stored_formats.py.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any

import pytest

from jobledger import Engine, JobStatus, Outcome, linear_workflow
from jobledger.adapters.clock import FakeClock
from jobledger.domain.errors import DuplicateKeyError, VersionConflict
from jobledger.domain.identity import job_uuid
from jobledger.domain.job import Job
from jobledger.domain.keys import KeyKind
from jobledger.orchestration.ports import Append
from jobledger.orchestration.registry import FunctionRegistry
from tests.support.engines import EngineFactory, default_registry, store_of
from tests.support.notifiers import Inbox
from tests.support.workflows import LAST_STEP, wait_event

WAIT_THEN_RUN = "wait-then-run"


@contextmanager
def counting_commits(engine: Engine) -> Iterator[list[list[str]]]:
    """Each commit of the events tables while inside, as the topics of its rows."""
    commits: list[list[str]] = []
    recorders = [partition.recorder for partition in store_of(engine).partitions]
    originals = [recorder.insert_events for recorder in recorders]

    def counted(insert: Callable[..., Any]) -> Callable[..., Any]:
        def insert_events(stored: Sequence[Any], **kwargs: Any) -> Any:
            result = insert(stored, **kwargs)
            commits.append([event.topic.rsplit(".", 1)[-1] for event in stored])
            return result

        return insert_events

    for recorder, insert in zip(recorders, originals, strict=True):
        recorder.insert_events = counted(insert)  # type: ignore[method-assign]
    try:
        yield commits
    finally:
        for recorder, insert in zip(recorders, originals, strict=True):
            recorder.insert_events = insert  # type: ignore[method-assign]


def stored_rows(engine: Engine) -> list[str]:
    """The topic of every row of the events tables, in log order."""
    return [
        record.topic.rsplit(":", 1)[-1]
        for partition in store_of(engine).partitions
        for record in partition.recorder.select_notifications(start=1, limit=10_000)
    ]


def test_a_continuing_step_is_one_row_and_one_commit(make_engine: EngineFactory) -> None:
    engine = make_engine()
    engine.submit("t", "j", "agent3", input={"goal": "x"})
    before = len(stored_rows(engine))
    with counting_commits(engine) as commits:
        report = engine.tick("t", "j", "create")
    assert report.outcome is Outcome.ADVANCED and report.status is JobStatus.COMPLETED
    # The tick's opening claim, then one row per step: no continuation Claimed, no key row.
    assert commits == [["Claimed"]] + [["StepRecorded"]] * 4
    assert stored_rows(engine)[before:] == ["Job.Claimed"] + ["Job.StepRecorded"] * 4
    events = engine.store.events(job_uuid("t", "j"))
    claimed = events[1]
    assert isinstance(claimed, Job.Claimed)
    steps = [e for e in events if isinstance(e, Job.StepRecorded)]
    # Steps 1-3 hand the job on under the tick's claim; the last one finishes it.
    assert [s.claim_id for s in steps] == [claimed.claim_id] * 3 + [None]
    assert [s.claimed_by for s in steps] == ["w0"] * 3 + [None]
    for step in steps[:3]:
        assert step.lease_until == step.ended_at + timedelta(milliseconds=15_000)
    assert engine.verify("t", "j") is None


def test_the_folded_claim_is_held_as_a_claimed_one_would_be(
    make_engine: EngineFactory, clock: FakeClock
) -> None:
    """A tick that spends its step budget mid-job leaves the job queued (no claim folded);
    one that goes on leaves it running under its claim, with that lease: the status view
    and the reconciler read exactly what a separate Claimed gave them."""
    engine = make_engine(config={"max_steps_per_tick": 2})
    engine.submit("t", "j", "agent3")
    engine.tick("t", "j", "create")
    steps = [e for e in engine.store.events(job_uuid("t", "j")) if isinstance(e, Job.StepRecorded)]
    assert [s.claim_id is not None for s in steps] == [True, False]
    job = engine.store.load(job_uuid("t", "j"))
    assert job is not None and job.status is JobStatus.QUEUED and job.claim_id is None
    # Fold the first step alone: the job runs under the claim the step carries.
    first = engine.store.events(job_uuid("t", "j"), to_version=3)
    folded: Job | None = None
    for event in first:
        folded = event.mutate(folded)
    assert folded is not None and folded.status is JobStatus.RUNNING
    assert (folded.claim_id, folded.worker_id, folded.lease_until) == (
        steps[0].claim_id,
        "w0",
        steps[0].lease_until,
    )
    assert engine.job("t", "j").lease_until is None
    engine.run_until_idle()
    assert engine.job("t", "j").status is JobStatus.COMPLETED


def wait_registry() -> FunctionRegistry:
    registry = default_registry()
    registry.register(WAIT_THEN_RUN, 1, linear_workflow([wait_event("go"), LAST_STEP]))
    return registry


@pytest.mark.parametrize("how", ["token", "signal"])
def test_resume_to_next_step_recorded_is_two_commits(make_engine: EngineFactory, how: str) -> None:
    inbox = Inbox()
    engine = make_engine(registry=wait_registry(), notifier=inbox)
    engine.submit("t", "j", WAIT_THEN_RUN)
    engine.run_until_idle()
    assert engine.job("t", "j").status is JobStatus.WAITING_EVENT
    with counting_commits(engine) as commits:
        if how == "token":
            engine.resume(inbox.tokens["j"].token)
        else:
            engine.signal("t", "j", "go", signal_id="s-1")
        engine.run_until_idle()
    # The resume with its key and the claim of the tick it wakes; then the step.
    assert commits == [["Resumed", "Consumed"], ["StepRecorded"]]
    assert engine.job("t", "j").status is JobStatus.COMPLETED
    resumed = next(e for e in engine.store.events(job_uuid("t", "j")) if isinstance(e, Job.Resumed))
    assert resumed.claimed_by == "w0" and resumed.claim_id is not None
    assert engine.verify("t", "j") is None
    # Replay rebuilds the request the woken tick resolved (running, under the resume's
    # claim, for the tick's reason) and agrees with every recorded decision.
    report = engine.replay("t", "j")
    assert report.safe, report.verdict


def test_a_resume_taken_by_an_engine_that_runs_no_steps_leaves_the_job_queued(
    make_engine: EngineFactory,
) -> None:
    """A one-shot command (no executor) folds no claim: the job stays queued for whichever
    worker takes it, instead of being held off until a lease lapses."""
    inbox = Inbox()
    worker = make_engine(registry=wait_registry(), notifier=inbox)
    worker.submit("t", "j", WAIT_THEN_RUN)
    worker.run_until_idle()
    command = make_engine(registry=wait_registry(), executor=None)
    command.resume(inbox.tokens["j"].token)
    job = command.job("t", "j")
    assert job.status is JobStatus.QUEUED and job.worker_id is None
    worker.tick("t", "j", "resumed")
    assert worker.job("t", "j").status is JobStatus.COMPLETED


def recorded_on(job: Job, at: datetime) -> None:
    """Step ``current_step + 1`` recorded on ``job`` (not yet appended)."""
    job.record_step(
        step_number=job.current_step + 1,
        step_type="run_interaction_task",
        triggered_by="test",
        idempotency_key=job.step_key(job.current_step + 1),
        started_at=at,
        ended_at=at,
        output={},
        state_patch={},
        cost_usd=Decimal(0),
        transition_reason="",
        next_status=JobStatus.QUEUED,
        resume_at=None,
        wait_event=None,
        worker_id="w",
    )


def test_a_second_record_of_a_step_is_a_duplicate_key_named_from_the_step_itself(
    make_engine: EngineFactory, clock: FakeClock
) -> None:
    """No key row guards a step: the store tells a step it already holds (DuplicateKeyError,
    kind step) from a job that only moved on (VersionConflict), on ``append`` and in a
    group (``append_many``) alike."""
    engine = make_engine()
    engine.submit("t", "j", "agent3")
    store = engine.store
    uuid = job_uuid("t", "j")
    first, second, third = (store.load(uuid) for _ in range(3))
    assert first is not None and second is not None and third is not None
    recorded_on(first, clock.now())
    store.append(first)
    recorded_on(second, clock.now())
    with pytest.raises(DuplicateKeyError) as refused:
        store.append(second)
    assert (refused.value.kind, refused.value.key) == (KeyKind.STEP, "t/j:step:1")
    # Moved on by something else than a step: a version conflict, not a duplicate.
    moved, stale = store.load(uuid), store.load(uuid)
    assert moved is not None and stale is not None
    moved.cancel(reason="r", cancelled_by="ops", now=clock.now())
    store.append(moved)
    recorded_on(stale, clock.now())
    with pytest.raises(VersionConflict):
        store.append(stale)
    recorded_on(third, clock.now())
    (refusal,) = store.append_many([Append(third, ())])
    assert isinstance(refusal, DuplicateKeyError) and refusal.kind is KeyKind.STEP
