"""The kit to test workflows (jobledger.testing), used as a user would use it: a code
workflow with steps, a sleep, an event wait with a timeout, an approval that expires in
two days, a map over child workflows and a retrying step, tested on a skipping clock."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path

import pytest
from pydantic import BaseModel

from jobledger import (
    ChildResult,
    FunctionRegistry,
    JobStatus,
    Resolution,
    RetryPolicy,
    StepContext,
    StepError,
    StepRequest,
    StepResult,
    WorkflowContext,
    linear_workflow,
    step,
    workflow,
)
from jobledger.testing import (
    DEFAULT_START,
    StepCall,
    WorkflowTestEnv,
    WorkflowTestError,
    assert_steps,
    workflow_envs,
)

pytest_plugins = ["pytester"]

DAY = timedelta(days=1)


class Survey(BaseModel):
    words: int


class Brief(BaseModel):
    text: str
    checked: bool
    at: datetime


@step
def survey(ctx: StepContext, notes: str) -> Survey:
    ctx.spend("0.10")
    return Survey(words=len(notes.split()))


@step
def draft(survey: Survey, checked: bool) -> str:
    return f"{survey.words} words" + (", fact-checked" if checked else "")


@workflow("mission", version=1)
async def mission(wf: WorkflowContext, notes: str) -> Brief:
    found = await wf.step(survey, notes)
    await wf.sleep(DAY)
    check = await wf.wait_event("factcheck.done", timeout=timedelta(days=7))
    text = await wf.step(draft, found, checked=check is not None)
    decision = await wf.approval(approvers=["reviewer"], expires=timedelta(days=2))
    if not decision.approved:
        wf.fail(f"brief {decision.decision}")
    return Brief(text=text, checked=check is not None, at=wf.now())


@workflow("approval_only", version=1)
async def approval_only(wf: WorkflowContext) -> str:
    decision = await wf.approval(approvers=["reviewer"], expires=timedelta(days=2))
    return decision.decision


@workflow("nap", version=1)
async def nap(wf: WorkflowContext) -> list[str]:
    woken = []
    for _ in range(3):
        await wf.sleep(DAY)
        woken.append(wf.now().isoformat())
    return woken


@step
def count_words(text: str) -> int:
    return len(text.split())


@workflow("paragraph", version=1)
async def paragraph(wf: WorkflowContext, text: str) -> int:
    await wf.sleep(timedelta(hours=1))
    counted: int = await wf.step(count_words, text)
    return counted


@workflow("book", version=1)
async def book(wf: WorkflowContext, paragraphs: list[str]) -> int:
    children: list[ChildResult] = await wf.map(paragraph, paragraphs)
    return sum(child.result for child in children)


@step(retry=RetryPolicy(max_attempts=3, initial_backoff_ms=60_000))
def flaky(url: str) -> str:
    return url.upper()


@workflow("fetch", version=1)
async def fetch(wf: WorkflowContext, url: str) -> str:
    fetched: str = await wf.step(flaky, url)
    return fetched


@pytest.fixture
def env() -> Iterator[WorkflowTestEnv]:
    with WorkflowTestEnv([mission, approval_only, nap, book, paragraph, fetch]) as made:
        yield made


def test_a_mission_runs_to_its_result_on_skipped_time(env: WorkflowTestEnv) -> None:
    job = env.start(mission, {"notes": "one two three"})
    assert job.status is JobStatus.WAITING_TIME
    assert env.now() == DEFAULT_START  # start runs what is due; the clock does not move

    env.run_until(job, status="waiting_event")
    assert env.now() == DEFAULT_START + DAY  # the sleep's end, not the wait's timeout
    env.resume(job, {"source": "desk"})
    assert job.status is JobStatus.AWAITING_APPROVAL
    env.approve(job, by="reviewer", comment="fine")

    assert job.result() == Brief(text="3 words, fact-checked", checked=True, at=env.now())
    assert_steps(job, ["survey", "sleep", "wait_event", "draft", "approval", "complete"])
    assert job.steps()[0].result == {"words": 3}
    assert job.steps()[0].cost_usd == Decimal("0.10")
    assert job.state["source"] == "desk"
    assert "ApprovalDecided" in job.event_types()


def test_skipping_to_the_timer_does_not_expire_a_later_approval(env: WorkflowTestEnv) -> None:
    waiting = env.start(approval_only)  # expires on day 2
    job = env.start(mission, {"notes": "a"})  # sleeps one day, then waits for an event
    env.run_until(job, status="waiting_event")
    assert env.now() == DEFAULT_START + DAY
    assert waiting.status is JobStatus.AWAITING_APPROVAL
    assert waiting.approval is not None
    assert waiting.approval.request.expires_at == DEFAULT_START + 2 * DAY

    # What the kit avoids: the engine's own drain sleeps through every due moment.
    env.engine.run_until_idle(wait_for_timers=True)
    assert waiting.result() == "expired"


def test_run_until_a_moment_stops_there(env: WorkflowTestEnv) -> None:
    job = env.start(mission, {"notes": "a b"})
    halfway = DEFAULT_START + timedelta(hours=12)
    env.run_until(until=halfway)
    assert env.now() == halfway
    assert job.status is JobStatus.WAITING_TIME

    env.run_until(until=DEFAULT_START + 3 * DAY)
    assert env.now() == DEFAULT_START + 3 * DAY
    assert job.status is JobStatus.WAITING_EVENT  # its timeout is on day 8


def test_advance_runs_each_timer_at_its_own_moment(env: WorkflowTestEnv) -> None:
    job = env.start(nap)
    env.advance(timedelta(days=5))
    assert env.now() == DEFAULT_START + timedelta(days=5)
    assert job.result() == [(DEFAULT_START + n * DAY).isoformat() for n in (1, 2, 3)]


def test_an_event_wait_that_times_out_goes_on_without_the_event(env: WorkflowTestEnv) -> None:
    job = env.start(mission, {"notes": "a b c d"})
    env.run_until(job, status="awaiting_approval")
    assert env.now() == DEFAULT_START + timedelta(days=8)  # the day's sleep, then 7 days
    env.approve(job, by="reviewer")
    assert job.result().text == "4 words"


def test_a_signal_ends_the_wait_and_a_rejection_fails_the_job(env: WorkflowTestEnv) -> None:
    job = env.start(mission, {"notes": "a"})
    env.signal(job, "factcheck.done", {"by": "desk"})  # kept until the wait opens
    env.run_until(job, status="awaiting_approval")
    assert env.now() == DEFAULT_START + DAY
    env.reject(job, by="reviewer", comment="too short")
    assert job.status is JobStatus.FAILED
    assert job.last_error is not None and "brief rejected" in job.last_error
    with pytest.raises(WorkflowTestError, match=r"no result: .* is failed"):
        job.result()


def test_an_unanswered_approval_expires_when_the_test_skips_to_it(env: WorkflowTestEnv) -> None:
    job = env.start(approval_only)
    env.run_until(job, status="completed")
    assert env.now() == DEFAULT_START + timedelta(days=2)
    assert job.result() == "expired"


def test_run_until_says_why_a_status_can_never_be_reached(env: WorkflowTestEnv) -> None:
    job = env.start(mission, {"notes": "a"})
    with pytest.raises(WorkflowTestError, match=r"never be completed: .*failed.*brief expired"):
        env.run_until(job, status="completed")

    waiting = env.start(approval_only, job_id="no-expiry")
    env.approve(waiting, by="reviewer")
    with pytest.raises(WorkflowTestError, match=r"never be awaiting_approval: .* is completed"):
        env.run_until(waiting, status="awaiting_approval")


def test_run_until_says_when_nothing_is_due_any_more() -> None:
    @workflow("forever", version=1)
    async def forever(wf: WorkflowContext) -> None:
        await wf.wait_event("never")  # no timeout: only the test can end it

    with WorkflowTestEnv([forever]) as env:
        job = env.start(forever)
        with pytest.raises(WorkflowTestError, match=r"nothing is due .* waiting for event 'never'"):
            env.run_until(job, status="completed")
        with pytest.raises(WorkflowTestError, match="not met by"):
            env.run_until(job, status="completed", until=env.now() + DAY)
        assert env.now() == DEFAULT_START + DAY
        with pytest.raises(WorkflowTestError, match="no approval is open"):
            env.approve(job, by="reviewer")
        assert [t.event_name for t in job.tokens()] == ["never"]
        env.signal(job, "never")  # its token lapsed with the day skipped: a signal still works
        assert job.status is JobStatus.COMPLETED


def test_a_fake_replaces_a_step_and_records_its_calls(env: WorkflowTestEnv) -> None:
    fake = env.fake(survey, returns=Survey(words=99))
    job = env.start(mission, {"notes": "a b"}, job_id="faked")
    env.run_until(job, status="waiting_event")
    env.resume(job)
    env.approve(job, by="reviewer")
    assert job.result().text == "99 words, fact-checked"
    assert fake.calls == [
        StepCall(
            tenant_id="test",
            job_id="faked",
            step_number=1,
            idempotency_key="test/faked:step:1",
            attempt=0,
            args={"notes": "a b"},
        )
    ]
    assert job.steps()[0].cost_usd == 0  # the real function's spend() never ran


def test_a_fake_returning_the_wrong_type_fails_the_step_naming_it(env: WorkflowTestEnv) -> None:
    env.fake(survey, returns={"words": "many"})
    job = env.start(mission, {"notes": "a"})
    assert job.status is JobStatus.FAILED
    assert job.last_error is not None
    assert "step 'survey' returned a value that is not its declared Survey" in job.last_error
    assert "'words'" in job.last_error


def test_a_retrying_step_is_retried_after_its_backoff(env: WorkflowTestEnv) -> None:
    def fail_first(call: StepCall) -> str:
        if call.attempt == 0:
            raise StepError("busy", retryable=True)
        return f"fetched {call.args['url']}"

    fake = env.fake(flaky, side_effect=fail_first)
    job = env.start(fetch, {"url": "a"})
    assert job.status is JobStatus.WAITING_TIME
    env.run_until(job, status="completed")
    assert env.now() == DEFAULT_START + timedelta(minutes=1)  # the backoff, skipped exactly
    assert [c.attempt for c in fake.calls] == [0, 1]
    assert len({c.idempotency_key for c in fake.calls}) == 1
    assert job.result() == "fetched a"


def test_a_step_that_always_raises_fails_the_job(env: WorkflowTestEnv) -> None:
    fake = env.fake(flaky, raises=StepError("gone", retryable=True))
    job = env.start(fetch, {"url": "a"})
    with pytest.raises(WorkflowTestError, match=r"never be completed: .*gone"):
        env.run_until(job, status="completed")
    assert [c.attempt for c in fake.calls] == [0, 1, 2, 3]  # max_attempts retries
    assert env.now() == DEFAULT_START + timedelta(minutes=1 + 2 + 4)  # the backoffs


def test_a_map_over_child_workflows_joins_their_results(env: WorkflowTestEnv) -> None:
    counting = env.fake(count_words, side_effect=lambda call: len(call.args["text"]))
    job = env.start(book, {"paragraphs": ["ab", "cde", "f"]})
    assert job.status is JobStatus.WAITING_CHILDREN
    children = job.children()
    assert [c.status for c in children] == [JobStatus.WAITING_TIME] * 3
    env.run_until(job, status="completed")
    assert env.now() == DEFAULT_START + timedelta(hours=1)  # the children's sleeps
    assert job.result() == 6
    assert [c.result() for c in children] == [2, 3, 1]
    assert sorted(c.job_id for c in counting.calls) == sorted(c.job_id for c in children)


def test_fakes_refuse_steps_no_workflow_runs(env: WorkflowTestEnv) -> None:
    @step
    def stray() -> None:
        return None

    with pytest.raises(ValueError, match="runs step 'stray'"):
        env.fake(stray)
    with pytest.raises(ValueError, match="exactly one of"):
        env.fake(survey, returns=1, raises=StepError("x"))
    with pytest.raises(WorkflowTestError, match="'survey' was never called"):
        env.fake(survey).last_call  # noqa: B018 (the property raises)


def test_due_jobs_are_ticked_when_no_tick_was_queued_for_them() -> None:
    # scan_only: the engine queues no timer tick and leaves due jobs to the reconciler;
    # the environment ticks what is due itself, as the reconciler would.
    with WorkflowTestEnv([nap], config={"resume_mode": "scan_only"}) as env:
        job = env.start(nap)
        env.run_until(job, status="completed")
        assert env.now() == DEFAULT_START + 3 * DAY


def test_the_shells_jobledger_variables_do_not_reach_the_engine(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("JOBLEDGER_TRANSPORT", "kafka")
    monkeypatch.setenv("JOBLEDGER_TOKEN_SECRET", "short")
    with WorkflowTestEnv([nap]) as env:
        job = env.start(nap)
        env.run_until(job, status="completed")
        assert env.engine.config.transport == "local"


class Echo:
    """The one-executor way: an executor that serves every run step."""

    def execute(self, request: StepRequest) -> StepResult:
        return StepResult(output={"step": request.step_number}, state_patch={"echoed": True})


def test_a_registry_and_an_executor_serve_as_in_engine_open() -> None:
    registry = FunctionRegistry()
    steps = [
        Resolution("run_interaction_task", JobStatus.QUEUED),
        Resolution("wait_time", JobStatus.WAITING_TIME, resume_delay_ms=60_000),
        Resolution("complete", JobStatus.COMPLETED),
    ]
    registry.register("linear", 1, linear_workflow(steps))
    with WorkflowTestEnv(registry=registry, executor=Echo()) as env:
        job = env.start("linear", {"goal": "g"})
        env.run_until(job, status="completed")
        assert env.now() == DEFAULT_START + timedelta(minutes=1)
        assert [s.type for s in job.steps()] == ["run_interaction_task", "wait_time", "complete"]
        assert job.result() == {"goal": "g", "echoed": True}  # a non-code job's final state


class Notes(BaseModel):
    notes: str


def test_inputs_may_be_models_and_the_clock_may_start_elsewhere() -> None:
    @workflow("noted", version=1)
    async def noted(wf: WorkflowContext, notes: Notes, at: datetime) -> str:
        return f"{notes.notes} at {at.isoformat()}"

    start = datetime(2030, 6, 1, 9, 0, tzinfo=UTC)
    with WorkflowTestEnv([mission, noted], start=start, tenant="acme") as env:
        job = env.start(mission, Notes(notes="x y"), job_id="m1")  # its fields by name
        assert (job.tenant_id, job.job_id) == ("acme", "m1")
        env.run_until(job, status="waiting_event")
        assert env.now() == start + DAY
        assert env.handle("m1").status is JobStatus.WAITING_EVENT
        typed = env.start(noted, {"notes": Notes(notes="z"), "at": start})  # dumped as JSON
        assert typed.result() == f"z at {start.isoformat()}"


def test_the_store_is_deleted_when_the_environment_closes() -> None:
    with WorkflowTestEnv([nap]) as env:
        url = env.engine.config.store_url
        store = Path(url.removeprefix("sqlite:///"))
        assert store.exists()
    assert not store.parent.exists()


def test_workflow_envs_closes_every_environment_it_built() -> None:
    with workflow_envs() as build:
        made = [build([nap]), build([nap], tenant="other")]
        stores = [Path(e.engine.config.store_url.removeprefix("sqlite:///")) for e in made]
        assert all(store.exists() for store in stores)
    assert not any(store.parent.exists() for store in stores)


def test_run_until_needs_a_condition(env: WorkflowTestEnv) -> None:
    job = env.start(nap)
    with pytest.raises(TypeError, match="needs status="):
        env.run_until(job)
    with pytest.raises(TypeError, match="needs the job's handle"):
        env.run_until(status="completed")
    with pytest.raises(ValueError, match="forward only"):
        env.advance(-1)


def test_run_until_a_predicate(env: WorkflowTestEnv) -> None:
    job = env.start(nap)
    env.run_until(predicate=lambda: job.steps()[-1].number == 2)
    assert env.now() == DEFAULT_START + DAY
    assert job.step_names() == ["sleep", "sleep"]


PLUGIN_TEST = """
from datetime import timedelta
from pathlib import Path

from jobledger import WorkflowContext, workflow
from jobledger.testing import DEFAULT_START

STORES = []


@workflow("nap", version=1)
async def nap(wf: WorkflowContext) -> str:
    await wf.sleep(timedelta(hours=2))
    return "rested"


def test_a_nap(jobledger_env):
    env = jobledger_env([nap])
    job = env.start(nap)
    env.run_until(job, status="completed")
    assert job.result() == "rested"
    assert env.now() == DEFAULT_START + timedelta(hours=2)
    STORES.append(Path(env.engine.config.store_url.removeprefix("sqlite:///")))


def test_the_last_tests_store_is_gone(jobledger_env):
    assert STORES and not STORES[0].exists()
    first, second = jobledger_env([nap]), jobledger_env([nap], tenant="other")
    assert first.start(nap).tenant_id != second.start(nap).tenant_id
"""


def test_the_pytest_plugin_gives_the_jobledger_env_fixture(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_nap=PLUGIN_TEST)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")  # the entry point's plugin
    result.assert_outcomes(passed=2)
