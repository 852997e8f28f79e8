"""Repair: retry a failed job, reset one to an earlier step, fork one at a step; on
SQLite and PostgreSQL. Each repair is one event, the steps kept never run again, the
re-run ones run under the keys the README documents, and every chain verifies."""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal

import pytest

from jobledger import (
    Engine,
    FunctionRegistry,
    JobStatus,
    StepContext,
    StepError,
    StepRequest,
    WorkflowContext,
    step,
    workflow,
)
from jobledger.adapters.clock import FakeClock
from jobledger.domain.errors import (
    JobConflictError,
    RepairDivergesError,
    RepairStatusError,
    RepairStepError,
    UnknownJobError,
    UnknownWorkflowError,
)
from jobledger.domain.job import Job
from jobledger.domain.steps import ApprovalSpec
from jobledger.engine.job_commands import SignalOutcome
from jobledger.orchestration.registry import linear_workflow
from jobledger.projections import JobViews
from jobledger.workflows import DefinitionRegistry, parse_definition
from tests import test_children as children
from tests.support.engines import CountingExecutor, EngineFactory, agent_steps, store_of
from tests.support.erasure import ADA, ONBOARDING, PLAINTEXT, Greeter
from tests.support.workflows import DONE, STEP, review, sleep_ms, wait_event
from tests.test_erasure import stored_bytes

T = "acme"
KEY = "acme/j1:step:{}"


def registry() -> FunctionRegistry:
    """agent3 v1; v2 the same steps (a fixed executor), v3 a timer first (diverges at 1);
    gated: a step, a review, a step."""
    found = FunctionRegistry()
    found.register("agent3", 1, linear_workflow(agent_steps(3)))
    found.register("agent3", 2, linear_workflow(agent_steps(3)))
    found.register("agent3", 3, linear_workflow([sleep_ms(10), *agent_steps(3)]))
    found.register("sleepy", 1, linear_workflow([STEP, sleep_ms(3_600_000), STEP, DONE]))
    found.register(
        "gated", 1, linear_workflow([STEP, review(ApprovalSpec(approvers=("ann",))), STEP, DONE])
    )
    return found


@pytest.fixture
def engine(make_engine: EngineFactory) -> Engine:
    return make_engine(registry=registry())


def fail_step(executor: CountingExecutor, number: int) -> None:
    def fail(request: StepRequest) -> Exception | None:
        return StepError("boom", retryable=False) if request.step_number == number else None

    executor.fail_with = fail


def events(engine: Engine, job_id: str = "j1") -> list[Job.Event]:
    return engine.store.events(engine.jobs.load(T, job_id).id)


def kinds(engine: Engine, job_id: str = "j1") -> list[str]:
    return [type(e).__name__ for e in events(engine, job_id)]


def failed_at_3(engine: Engine, executor: CountingExecutor) -> None:
    fail_step(executor, 3)
    engine.submit(T, "j1", "agent3", workflow_version=1)
    engine.run_until_idle()
    assert engine.job(T, "j1").status is JobStatus.FAILED
    executor.fail_with = None


# ---- retry ------------------------------------------------------------------------------


def test_a_retried_job_runs_its_failed_step_again_with_the_same_key(
    engine: Engine, executor: CountingExecutor
) -> None:
    failed_at_3(engine, executor)
    repaired = engine.retry(T, "j1", by="ops", reason="executor fixed")
    assert repaired.job.status is JobStatus.QUEUED
    assert repaired.job.last_error is None
    engine.run_until_idle()

    view = engine.job(T, "j1")
    assert view.status is JobStatus.COMPLETED
    # Steps 1-2 ran once; step 3 twice, under the one key its failed attempt had.
    assert executor.calls == {KEY.format(1): 1, KEY.format(2): 1, KEY.format(3): 2}
    assert view.total_cost_usd == Decimal("0.30")
    names = kinds(engine)
    assert names.count("Failed") == 1 and names.count("Retried") == 1
    assert names.index("Failed") < names.index("Retried")
    retried = next(e for e in events(engine) if isinstance(e, Job.Retried))
    assert (retried.step_number, retried.cause, retried.retried_by) == (3, "step", "ops")
    assert (retried.from_version, retried.to_version) == (1, 1)
    assert engine.verify(T, "j1") is None


def test_a_retry_on_a_newer_version_that_replays_the_same_moves_the_job(
    engine: Engine, executor: CountingExecutor
) -> None:
    failed_at_3(engine, executor)
    repaired = engine.retry(T, "j1", by="ops", reason="v2 fixes step 3", to_version=2)
    assert repaired.job.workflow_version == 2
    assert repaired.replay_verdict == "2 recorded step(s) replay the same"
    engine.run_until_idle()
    assert engine.job(T, "j1").status is JobStatus.COMPLETED
    assert executor.calls[KEY.format(1)] == 1


def test_a_retry_on_a_version_that_diverges_is_refused_with_the_diff(
    engine: Engine, executor: CountingExecutor
) -> None:
    failed_at_3(engine, executor)
    before = engine.job(T, "j1").version
    with pytest.raises(RepairDivergesError, match="diverges at step 1: recorded"):
        engine.retry(T, "j1", by="ops", reason="try v3", to_version=3)
    with pytest.raises(UnknownWorkflowError):
        engine.retry(T, "j1", by="ops", reason="try v9", to_version=9)
    assert engine.job(T, "j1").version == before


def test_only_a_failed_job_that_failed_before_recording_is_retried(
    engine: Engine, executor: CountingExecutor
) -> None:
    engine.submit(T, "done", "agent3", workflow_version=1)
    engine.submit(T, "stopped", "agent3", workflow_version=1)
    engine.cancel(T, "stopped", "no", "ops")
    engine.run_until_idle()
    versions = {j: engine.job(T, j).version for j in ("done", "stopped")}
    with pytest.raises(RepairStatusError, match="is completed: only a failed job"):
        engine.retry(T, "done", by="ops", reason="again")
    with pytest.raises(RepairStatusError, match="was cancelled"):
        engine.retry(T, "stopped", by="ops", reason="again")
    with pytest.raises(UnknownJobError):
        engine.retry("other", "done", by="ops", reason="another tenant's job")
    assert {j: engine.job(T, j).version for j in versions} == versions


def test_a_retried_job_that_fails_again_is_retried_again(
    engine: Engine, executor: CountingExecutor
) -> None:
    failed_at_3(engine, executor)
    fail_step(executor, 3)
    engine.retry(T, "j1", by="ops", reason="first try")
    engine.run_until_idle()
    assert engine.job(T, "j1").status is JobStatus.FAILED
    executor.fail_with = None
    engine.retry(T, "j1", by="ops", reason="second try", to_version=2)
    engine.run_until_idle()
    assert engine.job(T, "j1").status is JobStatus.COMPLETED
    assert kinds(engine).count("Retried") == 2
    assert executor.calls[KEY.format(3)] == 3
    # The replay of the history skips the failures the retries reopened.
    assert engine.replay(T, "j1", version=2).safe


# ---- reset ------------------------------------------------------------------------------


def test_a_completed_job_reset_to_step_1_runs_the_later_steps_under_new_keys(
    engine: Engine, executor: CountingExecutor
) -> None:
    engine.submit(T, "j1", "agent3", workflow_version=1, input={"x": 1})
    engine.run_until_idle()
    repaired = engine.reset(T, "j1", 1, by="ops", reason="redo from step 2")
    assert repaired.job.status is JobStatus.QUEUED
    assert repaired.job.current_step == 1
    assert dict(repaired.job.state) == {"x": 1, "s1": True}
    engine.run_until_idle()

    view = engine.job(T, "j1")
    assert view.status is JobStatus.COMPLETED
    assert view.current_step == 4
    assert executor.calls == {
        KEY.format(1): 1,
        KEY.format(2): 1,
        KEY.format(3): 1,
        KEY.format(2) + "@e1": 1,
        KEY.format(3) + "@e1": 1,
    }
    assert view.total_cost_usd == Decimal("0.50")  # what was spent stays spent
    reset = next(e for e in events(engine) if isinstance(e, Job.Reset))
    assert (reset.step_number, reset.epoch, reset.reset_by) == (1, 1, "ops")
    assert kinds(engine).count("Reset") == 1
    assert engine.verify(T, "j1") is None
    # A second reset is a second epoch.
    engine.reset(T, "j1", 2, by="ops", reason="again")
    engine.run_until_idle()
    assert executor.calls[KEY.format(3) + "@e2"] == 1
    assert engine.replay(T, "j1", version=2).safe


def test_a_reset_opens_an_approval_after_the_step_again(
    engine: Engine, executor: CountingExecutor
) -> None:
    engine.submit(T, "g", "gated")
    engine.run_until_idle()
    first = engine.job(T, "g").pending_approval_id
    assert first == "g:step:2:approval"
    engine.decide(T, "g", first, "approve", "ann")
    engine.run_until_idle()
    assert engine.job(T, "g").status is JobStatus.COMPLETED

    engine.reset(T, "g", 1, by="ops", reason="review again")
    engine.run_until_idle()
    view = engine.job(T, "g")
    assert view.status is JobStatus.AWAITING_APPROVAL
    assert view.pending_approval_id == "g:step:2@e1:approval"
    # The new request is a new key: deciding it does not collide with the first decision.
    engine.decide(T, "g", "g:step:2@e1:approval", "approve", "ann")
    engine.run_until_idle()
    assert engine.job(T, "g").status is JobStatus.COMPLETED
    assert engine.verify(T, "g") is None


def test_a_reset_to_a_step_out_of_range_writes_nothing(
    engine: Engine, executor: CountingExecutor
) -> None:
    failed_at_3(engine, executor)
    before = engine.job(T, "j1").version
    for number in (-1, 3, 9):
        with pytest.raises(RepairStepError, match=f"cannot be reset to step {number}"):
            engine.reset(T, "j1", number, by="ops", reason="bad step")
    assert engine.job(T, "j1").version == before
    # A failed job may be reset to its last recorded step: the failed step, new key.
    engine.reset(T, "j1", 2, by="ops", reason="new key for step 3")
    engine.run_until_idle()
    assert executor.calls[KEY.format(3) + "@e1"] == 1


def test_a_reset_on_a_version_that_diverges_before_the_step_is_refused(
    engine: Engine,
) -> None:
    engine.submit(T, "j1", "agent3", workflow_version=1)
    engine.run_until_idle()
    before = engine.job(T, "j1").version
    with pytest.raises(RepairDivergesError, match="diverges at step 1"):
        engine.reset(T, "j1", 2, by="ops", reason="v3", to_version=3)
    assert engine.job(T, "j1").version == before
    # Reset to 0 keeps no step: any version replays the (empty) prefix the same.
    assert engine.reset(T, "j1", 0, by="ops", reason="v3", to_version=3).job.workflow_version == 3
    engine.run_until_idle()
    assert engine.job(T, "j1").status is JobStatus.COMPLETED


# ---- fork -------------------------------------------------------------------------------


def test_a_fork_starts_after_the_step_with_the_state_then_and_its_own_keys(
    engine: Engine, executor: CountingExecutor
) -> None:
    engine.submit(T, "j1", "agent3", workflow_version=1, input={"x": 1})
    engine.run_until_idle()
    repaired = engine.fork(
        T, "j1", 2, new_job_id="f1", by="ops", reason="try x=2", input_patch={"x": 2}
    )
    assert repaired.job.job_id == "f1"
    assert dict(repaired.job.state) == {"x": 2, "s1": True, "s2": True}
    assert repaired.job.current_step == 2
    engine.run_until_idle()

    fork = engine.job(T, "f1")
    assert fork.status is JobStatus.COMPLETED
    # The fork ran step 3 and on, under its own job id's keys; nothing ran for steps 1-2.
    assert executor.calls["acme/f1:step:3"] == 1
    assert not [k for k in executor.calls if k.startswith("acme/f1:step:1")]
    assert fork.total_cost_usd == Decimal("0.10")
    started = [e for e in events(engine, "f1") if isinstance(e, Job.ForkedFrom)]
    assert [(e.origin_job_id, e.step_number) for e in started] == [("j1", 2)]
    named = [e for e in events(engine) if isinstance(e, Job.Forked)]
    assert [(e.fork_job_id, e.step_number) for e in named] == [("f1", 2)]
    assert engine.verify(T, "j1") is None and engine.verify(T, "f1") is None

    # The same fork asked again is the same fork, named once.
    again = engine.fork(T, "j1", 2, new_job_id="f1", by="ops", reason="try x=2")
    assert again.job.job_id == "f1"
    assert kinds(engine).count("Forked") == 1
    with pytest.raises(JobConflictError, match="not a fork of job 'j1' at step 1"):
        engine.fork(T, "j1", 1, new_job_id="f1", by="ops", reason="other step")


def test_a_fork_at_a_step_out_of_range_writes_nothing(engine: Engine) -> None:
    engine.submit(T, "j1", "agent3", workflow_version=1)
    engine.run_until_idle()
    before = engine.job(T, "j1").version
    for number in (0, 5):
        with pytest.raises(RepairStepError, match=f"cannot be forked at step {number}"):
            engine.fork(T, "j1", number, new_job_id="f1", by="ops", reason="bad")
    with pytest.raises(UnknownJobError):
        engine.fork(T, "nope", 1, new_job_id="f2", by="ops", reason="no origin")
    assert engine.job(T, "j1").version == before
    with pytest.raises(UnknownJobError):
        engine.job(T, "f1")


# ---- code workflows ---------------------------------------------------------------------

RAN: list[str] = []


@step
def first(ctx: StepContext) -> int:
    RAN.append(ctx.idempotency_key)
    return 1


@step
def second(ctx: StepContext, value: int) -> int:
    RAN.append(ctx.idempotency_key)
    return value + 1


@workflow("coded", version=1)
async def coded(wf: WorkflowContext) -> int:
    one = await wf.step(first)
    two: int = await wf.step(second, one)
    return await wf.step(second, two)


def test_a_code_workflow_reset_replays_its_body_from_the_steps_kept(
    make_engine: EngineFactory,
) -> None:
    RAN.clear()
    engine = make_engine(registry=None, executor=None, workflows=[coded])
    engine.submit(T, "c", "coded")
    engine.run_until_idle()
    assert engine.job(T, "c").status is JobStatus.COMPLETED
    # The same engine keeps the body suspended: a reset must not feed it on from there.
    engine.reset(T, "c", 1, by="ops", reason="again")
    engine.run_until_idle()
    view = engine.job(T, "c")
    assert view.status is JobStatus.COMPLETED
    assert RAN == [
        "acme/c:step:1",
        "acme/c:step:2",
        "acme/c:step:3",
        "acme/c:step:2@e1",
        "acme/c:step:3@e1",
    ]
    assert engine.replay(T, "c").safe
    with pytest.raises(RepairStatusError, match="runs a code workflow"):
        engine.fork(T, "c", 1, new_job_id="cf", by="ops", reason="no")


# ---- map steps and their children -------------------------------------------------------


def test_a_reset_parent_spawns_new_children_and_the_superseded_ones_are_cancelled(
    make_engine: EngineFactory,
) -> None:
    engine = children.engine_for(make_engine, children.parent())
    engine.submit(T, "m1", "mission", input={"topics": ["a", "slow"], "brief": "x"})
    engine.run_until_idle()
    assert engine.job(T, "m1").status is JobStatus.WAITING_CHILDREN
    assert engine.job(T, "m1.1.1").status is JobStatus.WAITING_EVENT

    # A child is repaired through its parent only.
    with pytest.raises(RepairStatusError, match="is a child of job 'm1'"):
        engine.reset(T, "m1.1.1", 0, by="ops", reason="no")
    engine.reset(T, "m1", 0, by="ops", reason="other topics")
    engine.run_until_idle()
    assert engine.job(T, "m1.1.1").status is JobStatus.CANCELLED  # superseded, still running
    assert engine.job(T, "m1.1@e1.0").status is JobStatus.COMPLETED
    assert engine.job(T, "m1.1@e1.1").status is JobStatus.WAITING_EVENT
    engine.signal(T, "m1.1@e1.1", "never", {}, signal_id="s1")
    engine.run_until_idle()
    parent = engine.job(T, "m1")
    assert parent.status is JobStatus.COMPLETED
    assert [f["job_id"] for f in parent.state["findings"]] == ["m1.1@e1.0", "m1.1@e1.1"]
    assert engine.verify(T, "m1") is None


def test_a_job_mid_step_is_not_repaired_and_a_deadline_failure_is_forked_not_retried(
    engine: Engine, executor: CountingExecutor, clock: FakeClock
) -> None:
    refusals: list[str] = []

    def reset_mid_step(request: StepRequest) -> Exception | None:
        if request.step_number == 2:
            with pytest.raises(RepairStatusError) as refused:
                engine.reset(T, "j1", 0, by="ops", reason="now")
            refusals.append(str(refused.value))
        return None

    executor.fail_with = reset_mid_step
    engine.submit(T, "j1", "agent3", workflow_version=1)
    engine.run_until_idle()
    assert refusals and "is running a step (worker w0" in refusals[0]
    assert "Reset" not in kinds(engine)

    engine.submit(T, "late", "sleepy", budget={"deadline_seconds": 60})
    engine.run_until_idle()
    clock.advance(timedelta(seconds=61))
    engine.run_until_idle(wait_for_timers=True)
    assert engine.job(T, "late").status is JobStatus.FAILED
    with pytest.raises(RepairStatusError, match=r"past its deadline .*: retried, it would"):
        engine.retry(T, "late", by="ops", reason="again")
    with pytest.raises(RepairStatusError, match=r"past its deadline .*: reset, it would"):
        engine.reset(T, "late", 1, by="ops", reason="again")
    fork = engine.fork(T, "late", 1, new_job_id="late-2", by="ops", reason="a new deadline")
    assert fork.job.budget.get("deadline_at") is None  # the workflow's defaults: none
    engine.run_until_idle(wait_for_timers=True)
    assert engine.job(T, "late-2").status is JobStatus.COMPLETED


def test_a_reset_seals_the_personal_state_it_restarts_from_and_such_a_job_is_not_forked(
    make_engine: EngineFactory, store_url: str
) -> None:
    definitions = DefinitionRegistry([parse_definition(ONBOARDING, "onboarding.yaml")])
    engine = make_engine(registry=definitions, executor=Greeter())
    engine.submit("acme", "ada", "onboarding", input=ADA, data_subject="ada")
    engine.run_until_idle()
    engine.reset("acme", "ada", 1, by="ops", reason="confirm again")
    assert engine.job("acme", "ada").state["customer"]["email"] == ADA["customer"]["email"]
    stored = stored_bytes(store_url, engine)
    assert b"Reset" in stored and not any(value in stored for value in PLAINTEXT)
    with pytest.raises(RepairStatusError, match="holds personal data"):
        engine.fork("acme", "ada", 1, new_job_id="ada-2", by="ops", reason="no")
    assert engine.verify("acme", "ada") is None


def test_a_reset_opens_a_wait_again_and_a_signal_id_used_before_stays_used(
    make_engine: EngineFactory,
) -> None:
    waiting = FunctionRegistry()
    waiting.register("waiter", 1, linear_workflow([STEP, wait_event("go"), STEP, DONE]))
    engine = make_engine(registry=waiting)
    engine.submit(T, "w", "waiter")
    engine.run_until_idle()
    assert engine.signal(T, "w", "go", {"n": 1}, signal_id="s1") is SignalOutcome.RESUMED
    engine.run_until_idle()
    assert engine.job(T, "w").status is JobStatus.COMPLETED

    engine.reset(T, "w", 1, by="ops", reason="wait again")
    engine.run_until_idle()
    assert engine.job(T, "w").status is JobStatus.WAITING_EVENT
    assert engine.signal(T, "w", "go", {"n": 2}, signal_id="s1") is SignalOutcome.DUPLICATE
    assert engine.signal(T, "w", "go", {"n": 2}, signal_id="s2") is SignalOutcome.RESUMED
    engine.run_until_idle()
    view = engine.job(T, "w")
    assert view.status is JobStatus.COMPLETED and view.state["n"] == 2


def test_a_snapshot_taken_after_a_reset_or_a_fork_keeps_the_epoch_and_the_origin(
    make_engine: EngineFactory, executor: CountingExecutor
) -> None:
    config = {"snapshot_interval": 2, "cache_size": 0}
    engine = make_engine(registry=registry(), config=config)
    engine.submit(T, "j1", "agent3", workflow_version=1)
    engine.run_until_idle()
    engine.reset(T, "j1", 1, by="ops", reason="again")
    engine.run_until_idle()
    engine.fork(T, "j1", 2, new_job_id="f1", by="ops", reason="variant")
    engine.run_until_idle()

    cold = make_engine(registry=registry(), config=config)  # folds from the snapshots
    for job_id in ("j1", "f1"):
        uuid = cold.jobs.load(T, job_id).id
        snapshots = store_of(cold).partition(uuid).snapshots
        assert snapshots is not None and list(snapshots.get(uuid)), job_id
    assert (cold.jobs.load(T, "j1").epoch, cold.jobs.load(T, "f1").epoch) == (1, 0)
    assert cold.jobs.load(T, "j1").step_key(3) == KEY.format(3) + "@e1"
    assert cold.jobs.load(T, "f1").forked_from == {"job_id": "j1", "step_number": 2}
    assert cold.jobs.load(T, "j1").forked_from is None
    cold.reset(T, "j1", 2, by="ops", reason="once more")
    cold.run_until_idle()
    assert executor.calls[KEY.format(3) + "@e2"] == 1


def test_a_job_whose_wait_timed_out_is_reset_to_the_step_before_the_wait(
    make_engine: EngineFactory, clock: FakeClock
) -> None:
    waiting = FunctionRegistry()
    waiting.register("waiter", 1, linear_workflow([STEP, wait_event("go", 1000), STEP, DONE]))
    engine = make_engine(registry=waiting)
    engine.submit(T, "w", "waiter")
    engine.run_until_idle()
    clock.advance(timedelta(seconds=2))
    engine.run_until_idle(wait_for_timers=True)
    assert engine.job(T, "w").status is JobStatus.FAILED  # timed out waiting after step 2
    with pytest.raises(RepairStatusError, match="failed by wait_timeout"):
        engine.retry(T, "w", by="ops", reason="no")
    with pytest.raises(RepairStepError, match="steps allowed: 0 to 1"):
        engine.reset(T, "w", 2, by="ops", reason="nowhere to go from the timed-out wait")
    engine.reset(T, "w", 1, by="ops", reason="wait again")
    engine.run_until_idle()
    assert engine.job(T, "w").status is JobStatus.WAITING_EVENT


def test_a_reset_closes_the_open_approval_in_the_approvals_view_until_it_is_asked_again(
    engine: Engine,
) -> None:
    engine.submit(T, "g", "gated")
    engine.run_until_idle()
    views = JobViews(store_of(engine))
    views.catch_up()
    assert [a["approval_id"] for a in views.pending_approvals(T)] == ["g:step:2:approval"]
    engine.reset(T, "g", 0, by="ops", reason="from the start")
    views.catch_up()
    assert views.pending_approvals(T) == []
    engine.run_until_idle()
    views.catch_up()
    assert [a["approval_id"] for a in views.pending_approvals(T)] == ["g:step:2@e1:approval"]
    [row] = [row for row in views.jobs(limit=10) if row.job_id == "g"]
    assert (row.status, row.pending_approval) == ("awaiting_approval", "g:step:2@e1:approval")
