"""Workflows as code (issue 26): step functions, bodies replayed against the history, and
what a body's bugs do to its job. Every test runs on SQLite and on PostgreSQL."""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

import pytest
from pydantic import BaseModel

from jobledger import (
    Engine,
    JobStatus,
    MemoryNotifier,
    RetryPolicy,
    StepContext,
    StepError,
    WorkflowContext,
    step,
    workflow,
)
from jobledger.adapters.clock import FakeClock
from jobledger.adapters.ops import MemoryOps
from jobledger.domain.errors import ConfigError, InvalidPayloadError
from jobledger.domain.identity import job_uuid
from jobledger.workflows.replayer import CodeRegistry, replay_code
from tests.support.engines import EngineFactory

T = "tenant-a"
RAN: list[tuple[str, str]] = []
"""(task, idempotency key) of every step function run, in order."""


class Notes(BaseModel):
    text: str


class Survey(BaseModel):
    words: int


@step
def survey(ctx: StepContext, notes: Notes) -> Survey:
    RAN.append(("survey", ctx.idempotency_key))
    ctx.spend("0.25")
    return Survey(words=len(notes.text.split()))


@step("shout")
async def shout(ctx: StepContext, words: int, times: int = 1) -> str:
    RAN.append(("shout", ctx.idempotency_key))
    return "!" * words * times


@workflow("brief", version=1)
async def brief(wf: WorkflowContext, notes: Notes) -> dict[str, Any]:
    found = await wf.step(survey, notes)
    assert isinstance(found, Survey)  # the declared type comes back, not its JSON
    await wf.sleep(timedelta(hours=1))
    loud = await wf.step(shout, found.words, times=2)
    return {"words": found.words, "loud": loud}


@pytest.fixture(autouse=True)
def _fresh_ran() -> None:
    RAN.clear()


def code_engine(make_engine: EngineFactory, *workflows: Any, **options: Any) -> Engine:
    return make_engine(registry=None, executor=None, workflows=list(workflows), **options)


def registry_of(engine: Engine) -> CodeRegistry:
    registries = engine.registry.registries  # type: ignore[attr-defined]
    return next(r for r in registries if isinstance(r, CodeRegistry))


def test_a_code_workflow_runs_its_steps_typed_and_returns_its_result(
    make_engine: EngineFactory, clock: FakeClock
) -> None:
    engine = code_engine(make_engine, brief)
    engine.submit(T, "j1", "brief", input={"notes": {"text": "one two three"}})
    engine.run_until_idle()
    assert engine.job(T, "j1").status == JobStatus.WAITING_TIME
    clock.advance(timedelta(hours=1, seconds=1))
    engine.run_until_idle()
    job = engine.job(T, "j1")
    assert job.status == JobStatus.COMPLETED, job.last_error
    assert job.state["result"] == {"words": 3, "loud": "!!!!!!"}
    assert str(job.total_cost_usd) == "0.25"
    assert [("survey", f"{T}/j1:step:1"), ("shout", f"{T}/j1:step:3")] == RAN
    steps = [e for e in engine.history(T, "j1") if e.event_type == "StepRecorded"]
    assert [(s.data["step_type"], s.data["step_name"]) for s in steps] == [
        ("run_interaction_task", "survey"),
        ("wait_time", "sleep"),
        ("run_interaction_task", "shout"),
        ("complete", "complete"),
    ]
    assert steps[0].data["output"] == {"result": {"words": 3}}


def test_a_hot_job_replays_its_body_once_and_a_new_worker_replays_it_cold(
    make_engine: EngineFactory, clock: FakeClock
) -> None:
    first = code_engine(make_engine, brief)
    first.submit(T, "j1", "brief", input={"notes": {"text": "a b"}})
    first.run_until_idle()
    assert registry_of(first).cold_replays == 1
    # Another worker (a restart) has no suspended body: it replays the history once,
    # runs no recorded step again, and goes on.
    second = code_engine(make_engine, brief)
    clock.advance(timedelta(hours=2))
    second.tick(T, "j1")  # the timer's tick, delivered to the other worker
    assert second.job(T, "j1").status == JobStatus.COMPLETED
    assert registry_of(second).cold_replays == 1
    assert [task for task, _ in RAN] == ["survey", "shout"]


def test_a_step_argument_that_does_not_fit_is_refused_naming_the_field(
    make_engine: EngineFactory,
) -> None:
    @workflow("bad_args", version=1)
    async def bad_args(wf: WorkflowContext) -> None:
        await wf.step(shout, "many")

    engine = code_engine(make_engine, bad_args)
    engine.submit(T, "j1", "bad_args")
    engine.run_until_idle()
    job = engine.job(T, "j1")
    assert job.status == JobStatus.FAILED
    assert "step 'shout'" in (job.last_error or "") and "field 'words'" in (job.last_error or "")
    assert RAN == []


def test_an_input_that_does_not_fit_the_body_is_refused_at_submit(
    make_engine: EngineFactory,
) -> None:
    engine = code_engine(make_engine, brief)
    with pytest.raises(InvalidPayloadError, match="notes"):
        engine.submit(T, "j1", "brief", input={"notes": {"txt": "typo"}})
    assert engine.jobs.fetch(T, "j1") is None


def test_a_body_that_raises_fails_the_job_with_its_traceback(make_engine: EngineFactory) -> None:
    @workflow("broken", version=1)
    async def broken(wf: WorkflowContext, notes: Notes) -> None:
        await wf.step(survey, notes)
        raise KeyError("no such section")

    engine = code_engine(make_engine, broken)
    engine.submit(T, "j1", "broken", input={"notes": {"text": "x"}})
    engine.run_until_idle()
    job = engine.job(T, "j1")
    assert job.status == JobStatus.FAILED
    error = job.last_error or ""
    assert "KeyError" in error and "no such section" in error and "Traceback" in error
    assert "test_code_workflows.py" in error  # the body's own frame, not the engine's


def test_a_body_raising_a_retryable_step_error_retries_under_its_policy(
    make_engine: EngineFactory, clock: FakeClock
) -> None:
    tries: list[int] = []

    @workflow("flaky_body", version=1, retry=RetryPolicy(max_attempts=3, initial_backoff_ms=1_000))
    async def flaky_body(wf: WorkflowContext) -> str:
        tries.append(1)
        if len(tries) < 3:
            raise StepError("upstream busy", retryable=True, kind="busy")
        return "done"

    engine = code_engine(make_engine, flaky_body)
    engine.submit(T, "j1", "flaky_body")
    engine.run_until_idle(wait_for_timers=True)
    job = engine.job(T, "j1")
    assert job.status == JobStatus.COMPLETED, job.last_error
    assert job.state["result"] == "done"
    kinds = [e.event_type for e in engine.history(T, "j1")]
    assert kinds.count("RetryScheduled") == 2


def test_a_return_value_that_cannot_be_recorded_fails_the_job_saying_so(
    make_engine: EngineFactory,
) -> None:
    @workflow("unrecordable", version=1)
    async def unrecordable(wf: WorkflowContext) -> Any:
        return object()

    engine = code_engine(make_engine, unrecordable)
    engine.submit(T, "j1", "unrecordable")
    engine.run_until_idle()
    job = engine.job(T, "j1")
    assert job.status == JobStatus.FAILED
    assert "cannot record" in (job.last_error or "")


def test_a_step_whose_output_is_too_large_fails_naming_the_step(
    make_engine: EngineFactory,
) -> None:
    @step
    def huge() -> str:
        return "x" * 2_000_000

    @workflow("too_big", version=1)
    async def too_big(wf: WorkflowContext) -> None:
        await wf.step(huge)

    engine = code_engine(make_engine, too_big)
    engine.submit(T, "j1", "too_big")
    engine.run_until_idle()
    job = engine.job(T, "j1")
    assert job.status == JobStatus.FAILED
    assert "step output" in (job.last_error or "")


def test_a_runaway_loop_is_bounded_by_max_visits_and_says_so(make_engine: EngineFactory) -> None:
    @step
    def poll() -> bool:
        return False

    @workflow("runaway", version=1, max_visits=5)
    async def runaway(wf: WorkflowContext) -> None:
        while not await wf.step(poll):
            pass

    engine = code_engine(make_engine, runaway)
    engine.submit(T, "j1", "runaway")
    engine.run_until_idle()
    job = engine.job(T, "j1")
    assert job.status == JobStatus.FAILED
    assert "max_visits=5" in (job.last_error or "")
    assert job.total_steps_executed == 6  # five polls, then the failing step


def test_awaiting_anything_but_a_wf_command_fails_the_job_saying_why(
    make_engine: EngineFactory,
) -> None:
    import asyncio

    @workflow("awaits_io", version=1)
    async def awaits_io(wf: WorkflowContext) -> None:
        await asyncio.sleep(0)

    engine = code_engine(make_engine, awaits_io)
    engine.submit(T, "j1", "awaits_io")
    engine.run_until_idle()
    job = engine.job(T, "j1")
    assert job.status == JobStatus.FAILED
    assert "may await only wf.* commands" in (job.last_error or "")


def test_event_waits_time_out_to_none_and_approvals_return_the_decision(
    make_engine: EngineFactory, clock: FakeClock
) -> None:
    notifier = MemoryNotifier()

    @workflow("gated", version=1)
    async def gated(wf: WorkflowContext) -> dict[str, Any]:
        first = await wf.wait_event("first", timeout=timedelta(days=1))
        second = await wf.wait_event("second", timeout=timedelta(days=1))
        decision = await wf.approval(approvers=["ann"], expires=timedelta(days=2))
        if not decision.approved:
            wf.fail(f"not approved: {decision.decision}")
        return {"first": first, "second": second, "by": decision.decided_by}

    engine = code_engine(make_engine, gated, notifier=notifier)
    engine.submit(T, "j1", "gated")
    engine.run_until_idle()
    engine.resume(notifier.tokens[-1][1].token, {"n": 1})
    engine.run_until_idle()
    clock.advance(timedelta(days=1, seconds=1))  # "second" times out
    engine.run_until_idle()
    job = engine.job(T, "j1")
    assert job.status == JobStatus.AWAITING_APPROVAL
    engine.decide(T, "j1", job.pending_approval_id or "", "approved", "ann")
    engine.run_until_idle()
    job = engine.job(T, "j1")
    assert job.status == JobStatus.COMPLETED, job.last_error
    assert job.state["result"] == {"first": {"n": 1}, "second": None, "by": "ann"}


def test_an_expired_approval_reaches_the_body_which_decides_what_follows(
    make_engine: EngineFactory, clock: FakeClock
) -> None:
    @workflow("expiring", version=1)
    async def expiring(wf: WorkflowContext) -> str:
        decision = await wf.approval(expires=timedelta(days=2))
        return decision.decision

    engine = code_engine(make_engine, expiring)
    engine.submit(T, "j1", "expiring")
    engine.run_until_idle()
    clock.advance(timedelta(days=2, seconds=1))
    engine.run_until_idle()
    job = engine.job(T, "j1")
    assert job.status == JobStatus.COMPLETED
    assert job.state["result"] == "expired"


@workflow("count_words", version=1)
async def count_words(wf: WorkflowContext, text: str) -> int:
    return len(text.split())


def test_map_runs_code_children_and_hands_back_their_results(make_engine: EngineFactory) -> None:
    @workflow("fan", version=1)
    async def fan(wf: WorkflowContext) -> list[int]:
        results = await wf.map(count_words, ["a b", "c", "d e f"])
        return [r.result for r in results if r.completed]

    engine = code_engine(make_engine, fan, count_words)
    engine.submit(T, "j1", "fan")
    engine.run_until_idle()
    job = engine.job(T, "j1")
    assert job.status == JobStatus.COMPLETED, job.last_error
    assert job.state["result"] == [2, 1, 3]


def test_now_random_and_uuid_replay_the_same_after_a_restart(
    make_engine: EngineFactory, clock: FakeClock
) -> None:
    @workflow("dice", version=1)
    async def dice(wf: WorkflowContext) -> dict[str, Any]:
        before = (wf.now().isoformat(), wf.random().random(), str(wf.uuid()))
        await wf.sleep(60)
        after = (wf.now().isoformat(), wf.random().random(), str(wf.uuid()))
        return {"before": before, "after": after}

    hot = code_engine(make_engine, dice)
    hot.submit(T, "j1", "dice")
    hot.run_until_idle()
    clock.advance(timedelta(minutes=2))
    hot.run_until_idle()  # the job goes on in the engine that holds its suspended body
    job = hot.job(T, "j1")
    assert job.status == JobStatus.COMPLETED, job.last_error
    first = job.state["result"]
    # A cold replay of the finished history (another worker's) recomputes the same values.
    restarted = code_engine(make_engine, dice)
    events = restarted.store.events(job_uuid(T, "j1"))
    assert replay_code(dice, events).output == {"result": first}
    assert first["before"] != first["after"]


def test_a_definition_naming_an_unserved_task_is_refused_when_the_engine_is_built(
    make_engine: EngineFactory,
) -> None:
    from jobledger import parse_definition

    definition = parse_definition(
        json.dumps(
            {
                "type": "needs_tasks",
                "version": 1,
                "start": "a",
                "steps": {
                    "a": {
                        "kind": "run_interaction_task",
                        "params": {"task": "survey"},
                        "next": "b",
                    },
                    "b": {
                        "kind": "run_interaction_task",
                        "params": {"task": "nobody"},
                        "next": "c",
                    },
                    "c": {"kind": "complete"},
                },
            }
        ),
        "needs_tasks.json",
    )
    with pytest.raises(ConfigError, match="'nobody'"):
        code_engine(make_engine, definition, tasks=[survey])


def test_a_definition_runs_step_functions_and_saves_their_results(
    make_engine: EngineFactory,
) -> None:
    from jobledger import parse_definition

    definition = parse_definition(
        json.dumps(
            {
                "type": "declared",
                "version": 1,
                "start": "a",
                "steps": {
                    "a": {
                        "kind": "run_interaction_task",
                        "params": {"task": "survey", "notes": {"text": "x y"}, "save_as": "survey"},
                        "next": "b",
                    },
                    "b": {"kind": "complete"},
                },
            }
        ),
        "declared.json",
    )
    engine = code_engine(make_engine, definition, tasks=[survey])
    engine.submit(T, "j1", "declared")
    engine.run_until_idle()
    job = engine.job(T, "j1")
    assert job.status == JobStatus.COMPLETED, job.last_error
    assert job.state["survey"] == {"words": 2}


def test_a_workflow_is_submitted_by_itself_at_its_own_version(make_engine: EngineFactory) -> None:
    @workflow("count_words", version=2)
    async def count_words_v2(wf: WorkflowContext, text: str) -> int:
        return len(text.split()) * 10

    engine = code_engine(make_engine, count_words, count_words_v2)
    engine.submit(T, "old", count_words, input={"text": "a b"})
    engine.submit(T, "new", "count_words", input={"text": "a b"})  # the newest version
    engine.run_until_idle()
    assert engine.job(T, "old").workflow_version == 1
    assert engine.job(T, "old").state["result"] == 2
    assert engine.job(T, "new").state["result"] == 20
    with pytest.raises(InvalidPayloadError, match="as v2"):
        engine.submit(T, "bad", count_words, workflow_version=2)


def test_ops_events_name_the_code_workflows_steps(
    make_engine: EngineFactory, ops: MemoryOps
) -> None:
    engine = code_engine(make_engine, count_words)
    engine.submit(T, "j1", "count_words", input={"text": "a b c"})
    engine.run_until_idle()
    assert engine.job(T, "j1").state["result"] == 3
    completed = [e for e in ops.events if e.eventType == "job.step.completed"]
    assert completed and completed[-1].metadata["stepType"] == "complete"


def test_a_step_that_returns_what_it_cannot_record_fails_naming_the_step(
    make_engine: EngineFactory,
) -> None:
    @step
    def opaque() -> Any:
        return object()

    @workflow("opaque_flow", version=1)
    async def opaque_flow(wf: WorkflowContext) -> None:
        await wf.step(opaque)

    engine = code_engine(make_engine, opaque_flow)
    engine.submit(T, "j1", "opaque_flow")
    engine.run_until_idle()
    job = engine.job(T, "j1")
    assert job.status == JobStatus.FAILED
    assert "step 'opaque' returned a value that is not its declared" in (job.last_error or "")


def test_a_step_retries_under_its_policy_and_sees_its_attempt_and_heartbeat(
    make_engine: EngineFactory,
) -> None:
    seen: list[tuple[int, bool, str]] = []

    @step("fetch", retry=RetryPolicy(max_attempts=3, initial_backoff_ms=10))
    def fetch(ctx: StepContext) -> int:
        seen.append((ctx.attempt, ctx.heartbeat(), ctx.idempotency_key))
        if ctx.attempt < 2:
            raise StepError("rate limited", retryable=True, kind="rate_limit")
        return ctx.attempt

    @workflow("fetching", version=1)
    async def fetching(wf: WorkflowContext) -> int:
        return int(await wf.step(fetch))

    engine = code_engine(make_engine, fetching)
    engine.submit(T, "j1", "fetching")
    engine.run_until_idle(wait_for_timers=True)
    job = engine.job(T, "j1")
    assert job.status == JobStatus.COMPLETED, job.last_error
    assert job.state["result"] == 2
    # One idempotency key across the retries: the step is the same step each time.
    assert seen == [
        (0, True, f"{T}/j1:step:1"),
        (1, True, f"{T}/j1:step:1"),
        (2, True, f"{T}/j1:step:1"),
    ]
