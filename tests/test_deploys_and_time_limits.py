"""Issue 9, items 5 and 6, on both stores: a worker missing a job's pinned definition never
fails it (it says why and retries), and time limits and resume tokens follow the wait."""

from __future__ import annotations

import logging
from datetime import timedelta
from types import SimpleNamespace

import pytest

from jobledger import Engine, FunctionRegistry, JobStatus, Outcome, Resolution, linear_workflow
from jobledger.adapters.clock import FakeClock
from jobledger.adapters.event_store import EventSourcedJobStore
from jobledger.adapters.local_queue import LocalQueue
from jobledger.adapters.locks import lock_for
from jobledger.adapters.ops import MemoryOps
from jobledger.adapters.store_url import parse_store_url
from jobledger.audit.export import consumed_keys
from jobledger.domain.errors import JobNotWaitingError, TokenMismatchError, WorkflowNotDeployedError
from jobledger.domain.identity import job_uuid
from jobledger.domain.steps import ApprovalSpec, IssuedToken
from jobledger.domain.views import JobView
from jobledger.orchestration.ports import ApprovalRequest, Tick
from jobledger.orchestration.reconciler import Reconciler
from jobledger.projections import JobViews
from jobledger.runtime.embedded_runner import EmbeddedRunner
from tests.support.engines import CountingExecutor, EngineFactory, agent_steps
from tests.support.notifiers import Inbox as InboxOfJobs
from tests.support.workflows import DONE, linear_registry, sleep_ms, wait_event

HOUR = 3_600_000
DAY = 24 * HOUR


class Inbox:
    def __init__(self) -> None:
        self.tokens: list[IssuedToken] = []

    def waiting_for_event(self, job: JobView, event_name: str, token: IssuedToken) -> None:
        self.tokens.append(token)

    def approval_requested(self, job: JobView, request: ApprovalRequest) -> None:
        pass


def views_of(engine: Engine) -> JobViews:
    assert isinstance(engine.store, EventSourcedJobStore)
    return JobViews(engine.store)


def five(*versions: int) -> FunctionRegistry:
    registry = FunctionRegistry()
    for version in versions:
        registry.register("five", version, linear_workflow(agent_steps(2)))
    return registry


# ---- 5. deploys never fail a job --------------------------------------------------------


def test_a_worker_without_the_pinned_version_leaves_the_job_untouched_and_says_why(
    make_engine: EngineFactory,
    ops: MemoryOps,
    executor: CountingExecutor,
    caplog: pytest.LogCaptureFixture,
) -> None:
    new = make_engine(registry=five(1, 2))
    new.submit("t", "j", "five", workflow_version=2)
    old = make_engine(registry=five(1))
    runner = EmbeddedRunner(old)  # wires the worker's notes of blocked jobs into the views

    with caplog.at_level(logging.WARNING, logger="jobledger"):
        assert old.handle(Tick("t", "j", "create")) is None
    with pytest.raises(WorkflowNotDeployedError, match=r"'five' v2 \(known: v1\)"):
        old.tick("t", "j")

    job = old.job("t", "j")
    assert (job.status, job.version, job.last_error) == (JobStatus.QUEUED, 1, None)
    assert [e.event_type for e in old.history("t", "j")] == ["Submitted"]
    assert executor.calls == {}
    blocked = [e for e in ops.events if e.eventType == "job.deployment_blocked"]
    assert blocked and "unknown workflow 'five' v2 (known: v1)" in blocked[0].metadata["reason"]
    assert any("five' v2" in r.getMessage() and r.levelname == "WARNING" for r in caplog.records)
    views = runner.views
    views.catch_up()
    note = views.blocked_notes(views.jobs())
    assert len(note) == 1
    only = next(iter(note.values()))
    assert "unknown workflow 'five' v2 (known: v1)" in only.reason
    assert only.worker_id == old.config.worker_id and only.version == 1

    # Once a worker that knows v2 runs it, the job goes on and the note no longer applies.
    assert new.tick("t", "j").status is JobStatus.COMPLETED
    views.catch_up()
    assert views.blocked_notes(views.jobs()) == {}


def test_a_continuation_on_a_worker_that_lost_the_version_is_not_failed(
    make_engine: EngineFactory, store_url: str
) -> None:
    """A registry swapped mid-job (a reload without v2) blocks the job, never fails it."""
    engine = make_engine(registry=five(1, 2), config={"max_steps_per_tick": 1})
    engine.submit("t", "j", "five", workflow_version=2)
    engine.tick("t", "j")
    engine.use_registry(five(1))

    with pytest.raises(WorkflowNotDeployedError):
        engine.tick("t", "j")
    assert engine.job("t", "j").status is JobStatus.QUEUED

    engine.use_registry(five(1, 2))
    engine.run_until_idle()
    assert engine.job("t", "j").status is JobStatus.COMPLETED


def pinned(*versions: int) -> FunctionRegistry:
    """v2 (and only v2) opens an event wait, then an approval, then runs a step."""
    registry = FunctionRegistry()
    for version in versions:
        gate = [
            Resolution("wait_event", JobStatus.WAITING_EVENT, wait_event_name="reply"),
            Resolution("await_approval", JobStatus.AWAITING_APPROVAL, approval=ApprovalSpec()),
        ]
        registry.register("pinned", version, linear_workflow([*gate, *agent_steps(1)]))
    return registry


def resumed_by(how: str, worker: Engine, inbox: InboxOfJobs) -> None:
    if how == "signal":
        worker.signal("t", "j", "reply", signal_id="s1")
    elif how == "token":
        worker.resume(inbox.tokens["j"].token)
    else:
        worker.decide("t", "j", inbox.approvals["j"].approval_id, "approve", "alice")


@pytest.mark.parametrize("how", ["signal", "token", "approval"])
def test_a_worker_without_the_pinned_version_never_claims_the_job_it_wakes(
    make_engine: EngineFactory, executor: CountingExecutor, how: str
) -> None:
    """A signal, a token or a decision sent through a worker that lacks the job's pinned
    version lands, and the job it wakes is left queued for a worker that has it: no
    claim of one that can never run it (issue 29, item 12)."""
    inbox = InboxOfJobs()
    new = make_engine(registry=pinned(1, 2), notifier=inbox)
    new.submit("t", "j", "pinned", workflow_version=2)
    new.run_until_idle()
    if how == "approval":
        new.signal("t", "j", "reply", signal_id="s1")
        new.run_until_idle()
    old = make_engine(registry=pinned(1))

    resumed_by(how, old, inbox)
    woken = old.job("t", "j")
    old.run_until_idle()  # its tick: blocked, not run

    job = old.job("t", "j")
    assert (woken.status, woken.worker_id) == (JobStatus.QUEUED, None)
    assert (job.status, job.version) == (JobStatus.QUEUED, woken.version)
    # A worker that has v2 takes it at once: no claim_lost while a lease lapses.
    report = new.tick("t", "j")
    after = JobStatus.COMPLETED if how == "approval" else JobStatus.AWAITING_APPROVAL
    assert (report.outcome, report.status) == (Outcome.ADVANCED, after)
    assert executor.calls == ({"t/j:step:3": 1} if how == "approval" else {})


def test_a_worker_without_the_pinned_version_never_takes_over_a_lapsed_lease(
    make_engine: EngineFactory, clock: FakeClock
) -> None:
    """The take-over of a job whose worker died mid-step starts by taking its lease row:
    a worker that lacks the version must not take it (it would keep the job from the
    workers that have it until that lease lapsed too)."""
    new = make_engine(registry=five(1, 2))
    new.submit("t", "j", "five", workflow_version=2)
    dead = new.store.load(job_uuid("t", "j"))
    assert dead is not None
    lease = clock.now() + timedelta(seconds=15)
    dead.claim(worker_id="gone", claim_id="c0", lease_until=lease, reason="create", now=clock.now())
    new.store.append(dead)
    clock.advance(timedelta(minutes=1))
    old = make_engine(registry=five(1))

    with pytest.raises(WorkflowNotDeployedError, match=r"'five' v2 \(known: v1\)"):
        old.tick("t", "j")

    assert [e.event_type for e in old.history("t", "j")] == ["Submitted", "Claimed"]
    report = new.tick("t", "j")
    assert (report.outcome, report.status) == (Outcome.ADVANCED, JobStatus.COMPLETED)


# ---- 6. time limits follow the wait -----------------------------------------------------


def waits_for_event(timeout_ms: int | None = None) -> FunctionRegistry:
    return linear_registry({"wait": [wait_event("reply", timeout_ms), DONE]})


def long_timer(hours: int) -> FunctionRegistry:
    return linear_registry({"nap": [sleep_ms(hours * HOUR), DONE]})


def test_a_job_waiting_for_an_event_fails_at_its_deadline(
    make_engine: EngineFactory, store_url: str, clock: FakeClock, ops: MemoryOps
) -> None:
    engine = make_engine(registry=waits_for_event())
    engine.submit("t", "j", "wait", budget={"deadline_seconds": 2})
    engine.run_until_idle()
    assert engine.job("t", "j").status is JobStatus.WAITING_EVENT
    views = views_of(engine)
    views.catch_up()
    row = views.jobs()[0]
    deadline = engine.job("t", "j").budget["deadline_at"]
    assert row.due_at is not None and row.due_at.isoformat() == deadline

    queue = LocalQueue(clock)
    reconciler = Reconciler(
        views=views,
        queue=queue,
        clock=clock,
        lock=lock_for(parse_store_url(store_url), "reconciler"),
        ops=ops,
    )
    assert reconciler.reconcile().enqueued == 0
    clock.advance(timedelta(seconds=3))
    assert reconciler.reconcile().enqueued == 1
    reconciler.stop()
    worker = make_engine(registry=waits_for_event(), queue=queue)  # fed by the reconciler
    worker.run_until_idle()

    job = worker.job("t", "j")
    assert job.status is JobStatus.FAILED
    assert job.last_error is not None and job.last_error.startswith("deadline")


def test_a_long_timer_with_a_shorter_deadline_fails_at_the_deadline(
    make_engine: EngineFactory, clock: FakeClock
) -> None:
    engine = make_engine(registry=long_timer(10))
    started = clock.now()
    engine.submit("t", "j", "nap", budget={"deadline_seconds": 3600})

    engine.run_until_idle(wait_for_timers=True)

    job = engine.job("t", "j")
    assert job.status is JobStatus.FAILED
    assert job.completed_at is not None
    assert job.completed_at - started < timedelta(hours=2)


def test_a_parked_job_is_due_at_its_deadline_in_the_status_view(
    make_engine: EngineFactory,
) -> None:
    engine = make_engine()
    engine.submit("t", "j", "agent3", budget={"max_steps": 1, "deadline_seconds": 60})
    assert engine.tick("t", "j").outcome is Outcome.PARKED
    views = views_of(engine)
    views.catch_up()
    row = views.jobs()[0]
    assert (
        row.due_at is not None
        and row.due_at.isoformat() == engine.job("t", "j").budget["deadline_at"]
    )


def test_a_resume_token_lives_as_long_as_its_wait(
    make_engine: EngineFactory, clock: FakeClock
) -> None:
    inbox = Inbox()
    engine = make_engine(registry=waits_for_event(timeout_ms=7 * DAY), notifier=inbox)
    engine.submit("t", "j", "wait")
    engine.run_until_idle()
    token = inbox.tokens[-1]
    timeout_at = engine.job("t", "j").resume_at
    assert timeout_at is not None and token.expires_at >= timeout_at

    clock.advance(timedelta(days=3))  # well past the default 24 h token lifetime
    assert (
        engine.resume(token.token, {"ok": True}).status is JobStatus.RUNNING
    )  # resumed, held by the woken tick (issue 11)


def test_a_reissued_token_replaces_the_old_one_in_one_append(
    make_engine: EngineFactory, clock: FakeClock
) -> None:
    inbox = Inbox()
    engine = make_engine(registry=waits_for_event(), notifier=inbox)
    engine.submit("t", "j", "wait")
    engine.run_until_idle()
    old = inbox.tokens[-1]
    before = engine.job("t", "j").version

    new = engine.reissue_token("t", "j", by="ops-lead")

    assert new.nonce != old.nonce and inbox.tokens[-1] == new
    assert engine.job("t", "j").version == before + 1
    reissued = engine.history("t", "j")[-1]
    assert reissued.event_type == "ResumeTokenReissued"
    assert reissued.data["nonce"] == new.nonce and reissued.data["reissued_by"] == "ops-lead"
    assert reissued.data["previous_nonce"] == old.nonce
    with pytest.raises(TokenMismatchError, match="superseded"):
        engine.resume(old.token)
    assert (
        engine.resume(new.token).status is JobStatus.RUNNING
    )  # resumed, held by the woken tick (issue 11)
    with pytest.raises(JobNotWaitingError):
        engine.reissue_token("t", "j", by="ops-lead")
    # The reissue is part of the audit like any event: the chain holds, replay agrees,
    # and an export carries the voided nonce as a consumed key.
    engine.run_until_idle()
    assert engine.job("t", "j").status is JobStatus.COMPLETED
    assert engine.verify("t", "j") is None
    assert engine.replay("t", "j").safe
    events = engine.store.events(engine.orchestrator.load(Tick("t", "j")).id)
    keys = {(k.kind, k.key) for k in consumed_keys(events)}
    assert {("token", old.nonce), ("token", new.nonce)} <= keys


def test_a_status_view_from_an_older_release_gains_the_deadline_and_is_folded_again(
    make_engine: EngineFactory,
) -> None:
    engine = make_engine(registry=waits_for_event())
    engine.submit("t", "j", "wait", budget={"deadline_seconds": 60})
    engine.run_until_idle()
    views = views_of(engine)
    views.catch_up()
    d = views.backend
    with d.transaction() as curs:  # the table as the previous release created it
        curs.execute(
            d.sql(f"ALTER TABLE {d.table('jobledger_job_status')} DROP COLUMN deadline_at")
        )
        # ... which recorded no schema versions
        curs.execute(d.sql(f"DELETE FROM {d.table('jobledger_schema')} WHERE component = 'views'"))

    upgraded = views_of(engine)
    upgraded.catch_up()

    row = upgraded.jobs()[0]
    assert row.deadline_at is not None
    assert row.deadline_at.isoformat() == engine.job("t", "j").budget["deadline_at"]
    assert row.due_at == row.deadline_at


def test_a_status_view_without_mission_and_correlation_ids_gains_them_folded_again(
    make_engine: EngineFactory,
) -> None:
    engine = make_engine(registry=waits_for_event())
    engine.submit("t", "j", "wait", mission_id="m-1", correlation_id="c-1")
    engine.run_until_idle()
    views = views_of(engine)
    views.catch_up()
    d = views.backend
    with d.transaction() as curs:  # the table as the release before the ids made it
        for column in ("mission_id", "correlation_id"):
            table = d.table("jobledger_job_status")
            curs.execute(d.sql(f"ALTER TABLE {table} DROP COLUMN {column}"))
        curs.execute(  # that release recorded no later version either
            d.sql(
                f"DELETE FROM {d.table('jobledger_schema')} "
                "WHERE component = 'views' AND version >= 3"
            )
        )

    upgraded = views_of(engine)
    upgraded.catch_up()

    [row] = upgraded.jobs(mission_id="m-1")
    assert (row.job_id, row.correlation_id) == ("j", "c-1")


def test_a_kafka_worker_without_the_version_commits_the_tick_and_leaves_the_job(
    make_engine: EngineFactory, ops: MemoryOps
) -> None:
    """No broker needed: the worker's handling of one message. Rewinding would stall the
    partition behind the job; the reconciler publishes its tick again while it is due."""
    from jobledger.adapters.kafka import KafkaSettings
    from jobledger.adapters.kafka.messages import encode_tick
    from jobledger.adapters.kafka.worker import KafkaWorker

    make_engine(registry=five(1, 2)).submit("t", "j", "five", workflow_version=2)
    old = make_engine(registry=five(1))
    views = views_of(old)
    old.note_blocked_in(views)
    settings = KafkaSettings.of(old.config)
    worker = KafkaWorker(old, settings)
    record = SimpleNamespace(
        topic=settings.ticks_topic,
        partition=0,
        offset=7,
        key=b"t/j",
        headers=[],
        value=encode_tick(Tick("t", "j", "create"), dedupe_key=None, enqueued_at_ms=0),
    )

    assert worker.process(record) is True  # done with: its offset may be committed

    assert [e.event_type for e in old.history("t", "j")] == ["Submitted"]
    assert "job.deployment_blocked" in ops.types("j")
    views.catch_up()
    assert "'five' v2" in next(iter(views.blocked_notes(views.jobs()).values())).reason
