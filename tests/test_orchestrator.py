"""The tick state machine, behaviour by behaviour, on both stores."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

import jwt
import pytest

from jobledger import (
    Engine,
    FunctionRegistry,
    JobStatus,
    Outcome,
    Resolution,
    RetryPolicy,
    StepError,
    StepRequest,
    StoreUnavailableError,
    linear_workflow,
)
from jobledger.adapters.clock import FakeClock
from jobledger.adapters.local_queue import LocalQueue
from jobledger.adapters.ops import MemoryOps
from jobledger.domain.identity import job_uuid
from jobledger.domain.steps import IssuedToken
from jobledger.domain.views import JobView
from jobledger.orchestration.ports import ApprovalRequest
from tests.support.engines import TOKEN_SECRET, CountingExecutor, EngineFactory, agent_steps


def registry_of(*steps: Resolution, name: str = "wf") -> FunctionRegistry:
    registry = FunctionRegistry()
    registry.register(name, 1, linear_workflow(list(steps)))
    return registry


def step_records(engine: Engine, tenant: str, job: str) -> list[dict[str, Any]]:
    return [h.data for h in engine.history(tenant, job) if h.event_type == "StepRecorded"]


def pending(engine: Engine) -> list[tuple[datetime, str, str | None]]:
    assert isinstance(engine.queue, LocalQueue)
    return [(due, tick.reason, key) for due, tick, key in engine.queue.pending()]


def test_a_job_runs_to_completion_with_one_append_per_step(
    make_engine: EngineFactory, executor: CountingExecutor, ops: MemoryOps
) -> None:
    engine = make_engine()
    engine.submit("t", "j", "agent3", input={"goal": "x"})

    report = engine.tick("t", "j", "create")

    assert report.outcome is Outcome.ADVANCED
    assert report.status is JobStatus.COMPLETED
    assert report.steps_executed == 4
    assert executor.calls == {"t/j:step:1": 1, "t/j:step:2": 1, "t/j:step:3": 1}
    job = engine.job("t", "j")
    assert job.current_step == 4
    assert job.state == {"goal": "x", "s1": True, "s2": True, "s3": True}
    assert job.total_cost_usd == Decimal("0.30")
    assert job.total_steps_executed == 4
    # One claim to start; every later claim is folded into the step before (issue 11:
    # one event per continuing step, where a Claimed of its own followed each step).
    types = [h.event_type for h in engine.history("t", "j")]
    assert types == ["Submitted", "Claimed"] + ["StepRecorded"] * 4
    keys = [r["idempotency_key"] for r in step_records(engine, "t", "j")]
    assert keys == ["t/j:step:1", "t/j:step:2", "t/j:step:3", "t/j:step:4"]
    assert engine.verify("t", "j") is None
    assert ops.types("j")[-2:] == ["job.completed", "job.tick.ended"]
    started = [e for e in ops.events if e.eventType == "job.step.started"]
    assert started[0].metadata == {
        "stepNumber": 1,
        "reason": "create",
        "idempotencyKey": "t/j:step:1",
    }


def test_ticking_a_finished_job_changes_nothing(
    make_engine: EngineFactory, executor: CountingExecutor
) -> None:
    engine = make_engine()
    engine.submit("t", "j", "agent3")
    engine.run_until_idle()
    version = engine.job("t", "j").version

    report = engine.tick("t", "j", "duplicate-delivery")

    assert report.outcome is Outcome.IDLE
    assert engine.job("t", "j").version == version
    assert sum(executor.calls.values()) == 3


def test_a_claim_held_by_another_worker_is_left_alone(
    make_engine: EngineFactory, executor: CountingExecutor
) -> None:
    first, second = make_engine(), make_engine()
    first.submit("t", "j", "agent3")
    seen: list[Outcome] = []

    def during_step(request: StepRequest) -> None:
        if request.step_number == 1:
            seen.append(second.tick("t", "j", "duplicate").outcome)
        return None

    executor.fail_with = during_step
    first.tick("t", "j")

    assert seen == [Outcome.CLAIM_LOST]
    assert executor.calls["t/j:step:1"] == 1
    assert first.job("t", "j").status is JobStatus.COMPLETED


def test_an_expired_lease_is_taken_over_and_the_step_reruns_with_the_same_key(
    make_engine: EngineFactory, executor: CountingExecutor, clock: FakeClock, ops: MemoryOps
) -> None:
    first, second = make_engine(config={"lease_ms": 1_000}), make_engine()
    first.submit("t", "j", "agent3")
    outcomes: list[Outcome] = []

    def slow_first_step(request: StepRequest) -> None:
        if request.step_number == 1 and executor.calls["t/j:step:1"] == 1:
            clock.advance(timedelta(seconds=2))  # the first worker stalls past its lease
            outcomes.append(second.tick("t", "j", "reconciler").outcome)
        return None

    executor.fail_with = slow_first_step
    report = first.tick("t", "j")

    assert outcomes == [Outcome.ADVANCED]
    # The stalled worker's late result is refused: the key was recorded by the second.
    assert report.outcome is Outcome.DUPLICATE_SKIPPED
    assert executor.calls["t/j:step:1"] == 2
    assert [r["idempotency_key"] for r in step_records(first, "t", "j")].count("t/j:step:1") == 1
    recovered = [e for e in ops.events if e.eventType == "job.step.recovered"]
    assert recovered[0].metadata["previousWorkerId"] == "w0"
    assert "job.step.duplicate_skipped" in ops.types("j")
    assert first.job("t", "j").status is JobStatus.COMPLETED


def test_a_resolution_that_throws_fails_the_job(make_engine: EngineFactory, ops: MemoryOps) -> None:
    registry = FunctionRegistry()

    def broken(request: Any) -> Resolution:
        raise KeyError("missing_field")

    registry.register("broken", 1, broken)
    engine = make_engine(registry=registry)
    engine.submit("t", "j", "broken")

    report = engine.tick("t", "j")

    assert report.outcome is Outcome.FAILED
    job = engine.job("t", "j")
    assert job.status is JobStatus.FAILED
    assert job.last_error is not None and "missing_field" in job.last_error
    failed = engine.history("t", "j")[-1]
    assert failed.event_type == "Failed" and failed.data["cause"] == "definition"
    assert ops.types("j")[-2:] == ["job.failed", "job.tick.ended"]


def test_an_executor_error_fails_the_job_with_the_error(
    make_engine: EngineFactory, executor: CountingExecutor
) -> None:
    engine = make_engine()
    engine.submit("t", "j", "agent3")
    executor.fail_with = lambda r: RuntimeError("tool exploded") if r.step_number == 2 else None

    report = engine.tick("t", "j")

    assert report.outcome is Outcome.FAILED
    job = engine.job("t", "j")
    assert job.status is JobStatus.FAILED
    assert job.last_error == "step 2 failed: tool exploded"
    assert job.current_step == 1  # the failed step is not recorded as done


def test_a_retryable_error_schedules_a_retry_with_backoff(
    make_engine: EngineFactory, executor: CountingExecutor, clock: FakeClock, ops: MemoryOps
) -> None:
    policy = RetryPolicy(max_attempts=3, initial_backoff_ms=10_000, multiplier=2)
    engine = make_engine(
        registry=registry_of(
            Resolution("run_interaction_task", JobStatus.QUEUED, retry_policy=policy),
            Resolution("complete", JobStatus.COMPLETED),
        )
    )
    engine.submit("t", "j", "wf")
    executor.fail_with = lambda r: (
        StepError("rate limited", retryable=True, kind="rate_limit")
        if executor.calls[r.idempotency_key] <= 2
        else None
    )

    first = engine.tick("t", "j")

    assert first.outcome is Outcome.RETRY_SCHEDULED
    job = engine.job("t", "j")
    assert job.status is JobStatus.WAITING_TIME
    assert job.attempt == 1
    assert job.resume_at == clock.now() + timedelta(seconds=10)
    assert [key for _, _, key in pending(engine)] == ["create", "retry:1:1"]

    engine.run_until_idle(wait_for_timers=True)

    job = engine.job("t", "j")
    assert job.status is JobStatus.COMPLETED
    assert executor.calls["t/j:step:1"] == 3
    retries = [h.data for h in engine.history("t", "j") if h.event_type == "RetryScheduled"]
    assert [(r["attempt"], r["error_kind"]) for r in retries] == [
        (1, "rate_limit"),
        (2, "rate_limit"),
    ]
    assert ops.types("j").count("job.step.retry_scheduled") == 2


def test_exhausted_retries_fail_the_job(
    make_engine: EngineFactory, executor: CountingExecutor
) -> None:
    policy = RetryPolicy(max_attempts=2, initial_backoff_ms=1)
    engine = make_engine(
        registry=registry_of(
            Resolution("run_interaction_task", JobStatus.COMPLETED, retry_policy=policy)
        )
    )
    engine.submit("t", "j", "wf")
    executor.fail_with = lambda r: StepError("still down", retryable=True)

    engine.run_until_idle(wait_for_timers=True)

    job = engine.job("t", "j")
    assert job.status is JobStatus.FAILED
    assert executor.calls["t/j:step:1"] == 3
    assert job.last_error == "step 1 failed: still down"


class FailingAppendStore:
    """Wraps a store so the next step-recording append fails like a lost connection."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.fail_next_record = False

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def append(self, job: Any, *keys: Any) -> None:
        records = any(type(e).__name__ == "StepRecorded" for e in job.pending_events)
        if records and self.fail_next_record:
            self.fail_next_record = False
            raise StoreUnavailableError("connection lost")
        self.inner.append(job, *keys)


def test_an_infrastructure_error_while_recording_propagates_and_never_fails_the_job(
    make_engine: EngineFactory, executor: CountingExecutor, clock: FakeClock
) -> None:
    engine = make_engine(config={"lease_ms": 1_000}, wrap_store=FailingAppendStore)
    flaky = engine.store
    assert isinstance(flaky, FailingAppendStore)
    engine.submit("t", "j", "agent3")
    flaky.fail_next_record = True

    with pytest.raises(StoreUnavailableError):
        engine.tick("t", "j")

    job = engine.job("t", "j")
    assert job.status is JobStatus.RUNNING  # still ours, not failed
    clock.advance(timedelta(seconds=2))
    assert engine.tick("t", "j", "retry").status is JobStatus.COMPLETED
    # Nothing was written, so step 1 ran again under the same key: at most once recorded.
    assert executor.calls["t/j:step:1"] == 2
    assert [r["step_number"] for r in step_records(engine, "t", "j")] == [1, 2, 3, 4]


def test_the_cost_ceiling_defers_to_the_next_utc_midnight(
    make_engine: EngineFactory, executor: CountingExecutor, clock: FakeClock, ops: MemoryOps
) -> None:
    clock.set(datetime(2026, 3, 1, 15, 0, tzinfo=UTC))
    engine = make_engine(
        config={"cost_ceiling_usd": Decimal("0.25")},
        registry=registry_of(*agent_steps(5)),
    )
    engine.submit("t", "j", "wf")
    engine.submit("other", "j", "wf")

    report = engine.tick("t", "j")

    midnight = datetime(2026, 3, 2, tzinfo=UTC)
    assert report.outcome is Outcome.DEFERRED
    job = engine.job("t", "j")
    assert (job.status, job.current_step, job.resume_at) == (JobStatus.WAITING_TIME, 3, midnight)
    assert sum(executor.calls.values()) == 3  # no step ran once the ceiling was reached
    deferred = engine.history("t", "j")[-1]
    assert deferred.event_type == "CostCeilingDeferred"
    assert deferred.data["spend_usd"] == Decimal("0.30")
    event = next(e for e in ops.events if e.eventType == "job.cost_ceiling_deferred")
    assert event.metadata["resumeAt"] == midnight.isoformat()
    keys = [key for _, tick, key in engine.queue.pending() if tick.tenant_id == "t"]  # type: ignore[attr-defined]
    assert f"ceiling:{int(midnight.timestamp() * 1000)}" in keys
    # Another tenant's spend is its own.
    assert engine.tick("other", "j").outcome is Outcome.DEFERRED
    assert engine.job("other", "j").current_step == 3

    engine.run_until_idle(wait_for_timers=True)

    assert engine.job("t", "j").status is JobStatus.COMPLETED
    assert engine.job("other", "j").status is JobStatus.COMPLETED


class RecordingNotifier:
    def __init__(self) -> None:
        self.tokens: list[tuple[str, IssuedToken]] = []
        self.approvals: list[tuple[str, int]] = []

    def waiting_for_event(self, job: JobView, event_name: str, token: IssuedToken) -> None:
        self.tokens.append((event_name, token))

    def approval_requested(self, job: JobView, request: ApprovalRequest) -> None:
        self.approvals.append((job.job_id, request.step_number))


def test_waiting_for_an_event_issues_a_signed_token_and_stores_only_its_hash(
    make_engine: EngineFactory, ops: MemoryOps
) -> None:
    notifier = RecordingNotifier()
    engine = make_engine(
        notifier=notifier,
        registry=registry_of(
            Resolution("run_interaction_task", JobStatus.QUEUED),
            Resolution("wait_event", JobStatus.WAITING_EVENT, wait_event_name="invoice.paid"),
        ),
    )
    engine.submit("t", "j", "wf")

    engine.tick("t", "j")

    job = engine.job("t", "j")
    assert (job.status, job.wait_event_name) == (JobStatus.WAITING_EVENT, "invoice.paid")
    [(name, token)] = notifier.tokens
    assert name == "invoice.paid"
    claims = jwt.decode(
        token.token,
        TOKEN_SECRET,
        algorithms=["HS256"],
        audience="jobledger.resume",
        options={"verify_exp": False},
    )
    assert (claims["tid"], claims["job"], claims["step"], claims["evt"]) == (
        "t",
        "j",
        2,
        "invoice.paid",
    )
    assert claims["jti"] == token.nonce
    assert jwt.get_unverified_header(token.token)["kid"] == "k1"
    wait = step_records(engine, "t", "j")[-1]["wait_event"]
    assert wait["nonce"] == token.nonce and wait["token_sha256"] == token.token_sha256
    assert all(token.token not in str(h.data) for h in engine.history("t", "j"))
    event = next(e for e in ops.events if e.eventType == "job.waiting_event")
    assert event.metadata["waitEventName"] == "invoice.paid"


def test_awaiting_approval_notifies_and_parks_the_job(
    make_engine: EngineFactory, ops: MemoryOps
) -> None:
    notifier = RecordingNotifier()
    engine = make_engine(
        notifier=notifier,
        registry=registry_of(
            Resolution("run_interaction_task", JobStatus.QUEUED),
            Resolution("await_approval", JobStatus.AWAITING_APPROVAL),
        ),
    )
    engine.submit("t", "j", "wf")

    engine.run_until_idle()

    assert engine.job("t", "j").status is JobStatus.AWAITING_APPROVAL
    assert notifier.approvals == [("j", 2)]
    assert "job.awaiting_approval" in ops.types("j")
    assert engine.tick("t", "j").outcome is Outcome.IDLE


def test_short_waits_continue_inline_and_long_ones_are_enqueued(
    make_engine: EngineFactory, clock: FakeClock, ops: MemoryOps
) -> None:
    engine = make_engine(
        config={"inline_resume_max_delay_ms": 1_000},
        registry=registry_of(
            Resolution("wait_time", JobStatus.WAITING_TIME, resume_delay_ms=500),
            Resolution("run_interaction_task", JobStatus.QUEUED),
            Resolution("wait_time", JobStatus.WAITING_TIME, resume_delay_ms=60_000),
            Resolution("complete", JobStatus.COMPLETED),
        ),
    )
    engine.submit("t", "j", "wf")
    start = clock.now()

    report = engine.tick("t", "j")

    assert report.status is JobStatus.WAITING_TIME
    assert report.steps_executed == 3
    assert clock.now() - start >= timedelta(milliseconds=500)  # the short timer was honoured
    assert "job.waiting_time.inline_continued" in ops.types("j")
    [(due, reason, key)] = [p for p in pending(engine) if p[1] != "create"]
    assert (reason, key) == ("waiting_time_resume", "3:t/j:step:3")
    assert due == engine.job("t", "j").resume_at


def test_scan_only_leaves_timers_to_the_reconciler(
    make_engine: EngineFactory, executor: CountingExecutor
) -> None:
    engine = make_engine(config={"resume_mode": "scan_only"})
    engine.submit("t", "j", "timer")

    engine.run_until_idle()

    assert engine.job("t", "j").status is JobStatus.WAITING_TIME
    assert pending(engine) == []


def test_an_early_tick_for_a_timer_rearms_it(make_engine: EngineFactory) -> None:
    engine = make_engine()
    engine.submit("t", "j", "timer")
    engine.run_until_idle()
    restarted = make_engine()  # a restart: the in-process queue lost the pending timer
    assert pending(restarted) == []

    assert restarted.tick("t", "j", "redelivery").outcome is Outcome.IDLE

    [(due, reason, _)] = pending(restarted)
    assert (due, reason) == (restarted.job("t", "j").resume_at, "waiting_time_resume")


def test_burst_continuation_hands_the_rest_back_to_the_queue(
    make_engine: EngineFactory, ops: MemoryOps
) -> None:
    engine = make_engine(config={"max_steps_per_tick": 2}, registry=registry_of(*agent_steps(4)))
    engine.submit("t", "j", "wf")
    engine.queue.pop_due()  # type: ignore[attr-defined]

    report = engine.tick("t", "j")

    assert (report.steps_executed, report.status) == (2, JobStatus.QUEUED)
    assert [(reason, key) for _, reason, key in pending(engine)] == [
        ("burst_continuation", "burst:2")
    ]
    assert "job.burst_continued" in ops.types("j")
    engine.run_until_idle()
    assert engine.job("t", "j").status is JobStatus.COMPLETED


def test_a_cold_engine_loads_a_long_job_from_its_snapshot(
    make_engine: EngineFactory, executor: CountingExecutor
) -> None:
    engine = make_engine(config={"snapshot_interval": 5}, registry=registry_of(*agent_steps(12)))
    engine.submit("t", "j", "wf", input={"x": 1})
    engine.run_until_idle()
    warm = engine.job("t", "j")

    cold = make_engine(
        config={"snapshot_interval": 5, "cache_size": 0}, registry=registry_of(*agent_steps(12))
    )
    job = cold.job("t", "j")

    assert job == warm
    assert job.status is JobStatus.COMPLETED
    partition = cold.store.partitions[0]  # type: ignore[attr-defined]
    snapshots = list(partition.snapshots.get(job_uuid("t", "j")))
    # Each append that crosses a multiple of the interval leaves a snapshot behind it
    # (the versions of one event per continuing step; [6, 10, 16, 20, 26] with two).
    assert [snap.originator_version for snap in snapshots] == [5, 10, 15]


def test_jobs_spread_over_several_partitions_each_keep_their_guarantees(
    make_engine: EngineFactory, executor: CountingExecutor
) -> None:
    engine = make_engine(config={"partitions": 3})
    for n in range(12):
        engine.submit("t", f"j{n}", "agent3")

    engine.run_until_idle()

    store = engine.store
    used = {store.partition(job_uuid("t", f"j{n}")).table_prefix for n in range(12)}  # type: ignore[attr-defined]
    assert used == {"jobledger_p0", "jobledger_p1", "jobledger_p2"}
    assert all(engine.job("t", f"j{n}").status is JobStatus.COMPLETED for n in range(12))
    assert set(executor.calls.values()) == {1}
    assert len(executor.calls) == 36


def test_configuration_comes_from_jobledger_environment_variables(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from jobledger import EngineConfig

    monkeypatch.setenv("JOBLEDGER_MAX_STEPS_PER_TICK", "7")
    monkeypatch.setenv("JOBLEDGER_COST_CEILING_USD", "12.50")
    monkeypatch.setenv("JOBLEDGER_RESUME_MODE", "scan_only")

    config = EngineConfig()

    assert (
        config.ticks.max_steps_per_tick,
        config.limits.cost_ceiling_usd,
        config.ticks.resume_mode,
    ) == (
        7,
        Decimal("12.50"),
        "scan_only",
    )
    monkeypatch.setenv("JOBLEDGER_RESUME_MODE", "sometimes")
    with pytest.raises(ValueError, match="resume_mode"):
        EngineConfig()


def test_a_missing_executor_is_a_deployment_error_that_never_fails_the_job(
    make_engine: EngineFactory, executor: CountingExecutor
) -> None:
    from jobledger import ConfigError

    bare = make_engine(executor=None)
    bare.submit("t", "j", "agent3")

    with pytest.raises(ConfigError, match="needs a step executor"):
        bare.tick("t", "j")

    job = bare.job("t", "j")
    assert (job.status, job.version) == (JobStatus.QUEUED, 1)  # no claim, no failure
    assert make_engine().tick("t", "j").status is JobStatus.COMPLETED
