"""Outside events on both stores: resume tokens, signals, approvals, budgets, cancellation."""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal
from typing import Any

import jwt
import pytest

from jobledger import Engine, FunctionRegistry, JobStatus, Outcome, StepRequest
from jobledger.adapters.clock import FakeClock
from jobledger.adapters.ops import MemoryOps
from jobledger.domain.errors import (
    ApprovalAlreadyDecidedError,
    ExpiredTokenError,
    InvalidPayloadError,
    InvalidTokenError,
    JobFinishedError,
    StaleApprovalError,
    TokenMismatchError,
    TokenReplayedError,
    UnauthorisedDeciderError,
)
from jobledger.domain.steps import ApprovalSpec
from jobledger.engine.engine import SignalOutcome
from tests.support.engines import TOKEN_SECRET, CountingExecutor, EngineFactory
from tests.support.notifiers import Inbox
from tests.support.workflows import DONE, SEND_100, STEP, linear_registry, review, wait_event


def wait_workflow(timeout_ms: int | None = None) -> FunctionRegistry:
    return linear_registry({"wait": [STEP, wait_event("invoice.paid", timeout_ms), DONE]})


def approval_workflow(**spec: Any) -> FunctionRegistry:
    return linear_registry({"gate": [SEND_100, review(ApprovalSpec(**spec)), DONE]})


def event_count(engine: Engine, tenant: str = "t", job: str = "j") -> int:
    return len(engine.history(tenant, job))


@pytest.fixture
def inbox() -> Inbox:
    return Inbox()


@pytest.fixture
def waiting(make_engine: EngineFactory, inbox: Inbox) -> tuple[Engine, str]:
    engine = make_engine(registry=wait_workflow(), notifier=inbox)
    engine.submit("t", "j", "wait")
    engine.run_until_idle()
    assert engine.job("t", "j").status is JobStatus.WAITING_EVENT
    return engine, inbox.tokens["j"].token


# ---- resume tokens --------------------------------------------------------------------


def test_a_token_resumes_the_job_once_and_merges_its_payload(
    waiting: tuple[Engine, str], ops: MemoryOps
) -> None:
    engine, token = waiting

    view = engine.resume(token, {"paid": 120})

    # Runnable, and already held by the claim of the tick the resume woke in this engine
    # (issue 11: folded into the resume, so the tick appends no claim; it was "queued").
    assert view.status is JobStatus.RUNNING and view.worker_id == "w0"
    assert view.state["paid"] == 120
    engine.run_until_idle()
    assert engine.job("t", "j").status is JobStatus.COMPLETED
    resumed = next(h for h in engine.history("t", "j") if h.event_type == "Resumed")
    assert resumed.data["source"] == "token" and resumed.data["payload"] == {"paid": 120}
    assert "job.resumed" in ops.types("j")


def _forge(
    claims_update: dict[str, Any], token: str, key: str = TOKEN_SECRET, kid: str = "k1"
) -> str:
    claims = jwt.decode(token, options={"verify_signature": False})
    claims.update(claims_update)
    return jwt.encode(claims, key, algorithm="HS256", headers={"kid": kid})


@pytest.mark.parametrize(
    ("make_token", "error", "fragment"),
    [
        (
            lambda t: t[:-4] + ("AAAA" if not t.endswith("AAAA") else "BBBB"),
            InvalidTokenError,
            "signature",
        ),
        (
            lambda t: _forge({}, t, key="another-secret-another-secret-0123456"),
            InvalidTokenError,
            "signature",
        ),
        (lambda t: _forge({}, t, kid="k9"), InvalidTokenError, "unknown key id 'k9'"),
        (lambda t: "not-a-jwt", InvalidTokenError, "malformed"),
        (lambda t: _forge({"aud": "elsewhere"}, t), InvalidTokenError, "(?i)audience"),
        (lambda t: _forge({"tid": "other"}, t), TokenMismatchError, "no job 'j' for tenant"),
        (lambda t: _forge({"job": "other-job"}, t), TokenMismatchError, "no job 'other-job'"),
        (lambda t: _forge({"step": 1}, t), TokenMismatchError, "waits at step 2"),
        (
            lambda t: _forge({"evt": "invoice.void"}, t),
            TokenMismatchError,
            "waits for 'invoice.paid'",
        ),
        (lambda t: _forge({"jti": "f" * 32}, t), TokenMismatchError, "not the one issued"),
    ],
    ids=[
        "tampered",
        "forged-key",
        "wrong-kid",
        "malformed",
        "wrong-audience",
        "other-tenant",
        "other-job",
        "wrong-step",
        "wrong-event",
        "other-nonce",
    ],
)
def test_bad_tokens_are_refused_with_their_own_error_and_write_nothing(
    waiting: tuple[Engine, str], make_token: Any, error: type[Exception], fragment: str
) -> None:
    engine, token = waiting
    before = event_count(engine)

    with pytest.raises(error, match=fragment):
        engine.resume(make_token(token), {"paid": 1})

    assert event_count(engine) == before
    assert engine.job("t", "j").status is JobStatus.WAITING_EVENT


def test_an_expired_token_is_refused(waiting: tuple[Engine, str], clock: FakeClock) -> None:
    engine, token = waiting
    clock.advance(timedelta(days=2))  # ttl is one day
    before = event_count(engine)

    with pytest.raises(ExpiredTokenError, match="expired at"):
        engine.resume(token)

    assert event_count(engine) == before


def test_a_replayed_token_is_refused_and_changes_nothing(waiting: tuple[Engine, str]) -> None:
    engine, token = waiting
    engine.resume(token, {"paid": 1})
    before = engine.job("t", "j")

    with pytest.raises(TokenReplayedError, match="already used"):
        engine.resume(token, {"paid": 999})

    assert engine.job("t", "j") == before


def test_a_token_for_another_callers_tenant_is_refused(waiting: tuple[Engine, str]) -> None:
    engine, token = waiting
    with pytest.raises(TokenMismatchError, match="another tenant"):
        engine.resume(token, tenant_id="intruder")


def test_an_oversized_resume_payload_is_refused(make_engine: EngineFactory, inbox: Inbox) -> None:
    engine = make_engine(
        registry=wait_workflow(), notifier=inbox, config={"max_payload_bytes": 100}
    )
    engine.submit("t", "j", "wait")
    engine.run_until_idle()
    before = event_count(engine)

    with pytest.raises(InvalidPayloadError, match="over the limit of 100"):
        engine.resume(inbox.tokens["j"].token, {"blob": "x" * 200})

    assert event_count(engine) == before


def test_tokens_signed_with_a_retired_key_still_verify_after_rotation(
    make_engine: EngineFactory, inbox: Inbox, store_url: str, clock: FakeClock
) -> None:
    engine = make_engine(registry=wait_workflow(), notifier=inbox)
    engine.submit("t", "j", "wait")
    engine.run_until_idle()
    rotated = make_engine(
        registry=wait_workflow(),
        config={
            "token_secret": "rotated-secret-rotated-secret-0123456789",
            "token_key_id": "k2",
            "token_previous_keys": {"k1": TOKEN_SECRET},
        },
    )

    # Resumed (and held by the claim of the tick it woke: issue 11; it was "queued").
    assert rotated.resume(inbox.tokens["j"].token).status is JobStatus.RUNNING


def test_a_wait_that_times_out_without_a_next_step_fails_the_job(
    make_engine: EngineFactory, inbox: Inbox, clock: FakeClock, ops: MemoryOps
) -> None:
    engine = make_engine(registry=wait_workflow(timeout_ms=60_000), notifier=inbox)
    engine.submit("t", "j", "wait")
    engine.run_until_idle()

    engine.run_until_idle(wait_for_timers=True)

    job = engine.job("t", "j")
    assert job.status is JobStatus.FAILED
    assert job.last_error == "timed out waiting for 'invoice.paid'"
    assert "job.waiting_event.timed_out" in ops.types("j")
    with pytest.raises(JobFinishedError):
        engine.resume(inbox.tokens["j"].token)


# ---- signals --------------------------------------------------------------------------


def test_a_signal_resumes_a_waiting_job_and_is_idempotent_by_id(
    waiting: tuple[Engine, str],
) -> None:
    engine, _ = waiting

    first = engine.signal("t", "j", "invoice.paid", {"paid": 5}, signal_id="sig-1")
    again = engine.signal("t", "j", "invoice.paid", {"paid": 6}, signal_id="sig-1")

    assert (first, again) == (SignalOutcome.RESUMED, SignalOutcome.DUPLICATE)
    assert engine.job("t", "j").state["paid"] == 5
    engine.run_until_idle()
    assert engine.job("t", "j").status is JobStatus.COMPLETED


def test_a_signal_that_arrives_before_the_wait_is_kept_and_consumed_when_it_opens(
    make_engine: EngineFactory, executor: CountingExecutor, inbox: Inbox
) -> None:
    engine = make_engine(registry=wait_workflow(), notifier=inbox)
    engine.submit("t", "j", "wait")

    early = engine.signal("t", "j", "invoice.paid", {"paid": 7}, signal_id="early")
    assert early is SignalOutcome.BUFFERED
    assert engine.job("t", "j").buffered_signals == 1

    engine.run_until_idle()

    job = engine.job("t", "j")
    assert job.status is JobStatus.COMPLETED
    assert job.state["paid"] == 7
    assert job.buffered_signals == 0
    assert "j" not in inbox.tokens  # never told anyone to wait: the event was already here
    types = [h.event_type for h in engine.history("t", "j")]
    assert types.count("SignalBuffered") == 1 and types.count("Resumed") == 1


def test_a_signal_for_a_finished_job_is_refused(make_engine: EngineFactory) -> None:
    engine = make_engine()
    engine.submit("t", "j", "agent3")
    engine.run_until_idle()

    with pytest.raises(JobFinishedError, match="completed"):
        engine.signal("t", "j", "late", signal_id="s")


# ---- approvals ------------------------------------------------------------------------


def _awaiting(make_engine: EngineFactory, inbox: Inbox, **spec: Any) -> tuple[Engine, str]:
    engine = make_engine(registry=approval_workflow(**spec), notifier=inbox)
    engine.submit("t", "j", "gate")
    engine.run_until_idle()
    assert engine.job("t", "j").status is JobStatus.AWAITING_APPROVAL
    return engine, inbox.approvals["j"].approval_id


def test_an_approval_lets_the_job_go_on_and_records_who_and_why(
    make_engine: EngineFactory, inbox: Inbox
) -> None:
    engine, approval_id = _awaiting(make_engine, inbox, approvers=("alice",))
    request = inbox.approvals["j"]
    assert (request.step_number, request.attempt, len(request.action_sha256)) == (2, 1, 64)

    engine.decide("t", "j", approval_id, "approve", "alice", "looks right")
    engine.run_until_idle()

    assert engine.job("t", "j").status is JobStatus.COMPLETED
    decided = next(h.data for h in engine.history("t", "j") if h.event_type == "ApprovalDecided")
    assert (decided["decision"], decided["decided_by"], decided["comment"]) == (
        "approved",
        "alice",
        "looks right",
    )


def test_a_rejection_without_a_rejection_path_fails_the_job(
    make_engine: EngineFactory, inbox: Inbox
) -> None:
    engine, approval_id = _awaiting(make_engine, inbox)

    engine.decide("t", "j", approval_id, "reject", "bob", "too expensive")

    job = engine.job("t", "j")
    assert job.status is JobStatus.FAILED
    assert job.last_error == "rejected by bob: too expensive"


@pytest.mark.parametrize(
    ("call", "error", "fragment"),
    [
        (
            lambda e, a: e.decide("t", "j", a, "approve", "mallory"),
            UnauthorisedDeciderError,
            "'mallory' may not decide",
        ),
        (
            lambda e, a: e.decide("t", "j", "j:step:1:approval", "approve", "alice"),
            StaleApprovalError,
            "not the open request",
        ),
        (
            lambda e, a: e.decide("t", "j", a, "approve", "alice", action_sha256="0" * 64),
            StaleApprovalError,
            "action to approve changed",
        ),
        (
            lambda e, a: e.decide("t", "j", a, "maybe", "alice"),
            InvalidPayloadError,
            "approve or reject",
        ),
    ],
    ids=["unauthorised", "stale-request", "changed-action", "bad-decision"],
)
def test_bad_decisions_are_refused_and_write_nothing(
    make_engine: EngineFactory, inbox: Inbox, call: Any, error: type[Exception], fragment: str
) -> None:
    engine, approval_id = _awaiting(make_engine, inbox, approvers=("alice",))
    before = event_count(engine)

    with pytest.raises(error, match=fragment):
        call(engine, approval_id)

    assert event_count(engine) == before


def test_a_second_decision_on_the_same_request_is_refused(
    make_engine: EngineFactory, inbox: Inbox
) -> None:
    engine, approval_id = _awaiting(make_engine, inbox)
    engine.decide("t", "j", approval_id, "approve", "alice")
    before = event_count(engine)

    with pytest.raises(ApprovalAlreadyDecidedError):
        engine.decide("t", "j", approval_id, "reject", "bob")

    assert event_count(engine) == before


def test_an_unanswered_approval_expires(
    make_engine: EngineFactory, inbox: Inbox, ops: MemoryOps
) -> None:
    engine, approval_id = _awaiting(make_engine, inbox, expires_ms=3_600_000)

    engine.run_until_idle(wait_for_timers=True)

    job = engine.job("t", "j")
    assert job.status is JobStatus.FAILED
    assert job.last_error == f"approval {approval_id} expired undecided"
    assert "job.approval.expired" in ops.types("j")


# ---- budgets, ceilings, cancellation --------------------------------------------------


def test_a_job_over_its_step_budget_is_parked_until_the_budget_is_raised(
    make_engine: EngineFactory, executor: CountingExecutor, ops: MemoryOps
) -> None:
    engine = make_engine()
    engine.submit("t", "j", "agent3", budget={"max_steps": 2})

    report = engine.tick("t", "j")

    assert report.outcome is Outcome.PARKED
    job = engine.job("t", "j")
    assert (job.status, job.current_step) == (JobStatus.BUDGET_EXCEEDED, 2)
    assert job.last_error == "budget max_steps reached: 2 of 2"
    assert engine.tick("t", "j").outcome is Outcome.IDLE

    engine.raise_budget("t", "j", raised_by="ops-lead", reason="worth it", max_steps=10)
    engine.run_until_idle()

    assert engine.job("t", "j").status is JobStatus.COMPLETED
    raised = next(h.data for h in engine.history("t", "j") if h.event_type == "BudgetRaised")
    assert (raised["raised_by"], raised["budget"]["max_steps"]) == ("ops-lead", 10)


def test_a_parked_job_fails_at_its_deadline(
    make_engine: EngineFactory, executor: CountingExecutor
) -> None:
    engine = make_engine()
    engine.submit("t", "j", "agent3", budget={"max_cost_usd": "0.15", "deadline_seconds": 3600})

    engine.run_until_idle(wait_for_timers=True)

    job = engine.job("t", "j")
    assert job.status is JobStatus.FAILED
    assert job.last_error is not None and job.last_error.startswith("deadline")
    assert sum(executor.calls.values()) == 2  # parked after 0.20 >= 0.15


def test_an_invalid_budget_is_refused(make_engine: EngineFactory) -> None:
    engine = make_engine()
    with pytest.raises(InvalidPayloadError, match="max_steps"):
        engine.submit("t", "j", "agent3", budget={"max_steps": 0})
    with pytest.raises(InvalidPayloadError, match="max_stepz"):
        engine.submit("t", "j", "agent3", budget={"max_stepz": 3})


def test_a_tenant_override_of_the_cost_ceiling_applies_to_that_tenant_only(
    make_engine: EngineFactory, executor: CountingExecutor
) -> None:
    engine = make_engine(
        config={"cost_ceiling_usd": "100", "tenant_cost_ceilings_usd": {"frugal": "0.05"}}
    )
    engine.submit("frugal", "j", "agent3")
    engine.submit("rich", "j", "agent3")

    assert engine.tick("frugal", "j").outcome is Outcome.DEFERRED
    assert engine.tick("rich", "j").status is JobStatus.COMPLETED
    assert engine.job("frugal", "j").current_step == 1


def test_a_step_result_that_arrives_after_cancel_is_discarded_and_recorded(
    make_engine: EngineFactory, executor: CountingExecutor, ops: MemoryOps
) -> None:
    engine = make_engine()
    engine.submit("t", "j", "agent3")

    def cancel_midway(request: StepRequest) -> None:
        if request.step_number == 2:
            engine.cancel("t", "j", reason="customer withdrew", by="support")

    executor.fail_with = cancel_midway
    report = engine.tick("t", "j")

    assert report.outcome is Outcome.DISCARDED
    job = engine.job("t", "j")
    assert (job.status, job.current_step) == (JobStatus.CANCELLED, 1)
    types = [h.event_type for h in engine.history("t", "j")]
    assert types[-2:] == ["Cancelled", "LateResultDiscarded"]
    assert engine.history("t", "j")[-1].data["idempotency_key"] == "t/j:step:2"
    with pytest.raises(JobFinishedError):
        engine.cancel("t", "j", reason="again", by="support")
    assert engine.verify("t", "j") is None


def test_cancel_voids_open_tokens(waiting: tuple[Engine, str]) -> None:
    engine, token = waiting
    engine.cancel("t", "j", reason="stop", by="ops")

    with pytest.raises(JobFinishedError, match="cancelled"):
        engine.resume(token)


def test_costs_accrue_on_the_job_and_the_tenant_day(
    make_engine: EngineFactory, executor: CountingExecutor, clock: FakeClock
) -> None:
    engine = make_engine()
    engine.submit("t", "a", "agent3")
    engine.submit("t", "b", "agent3")
    engine.run_until_idle()

    assert engine.job("t", "a").total_cost_usd == Decimal("0.30")
    day = clock.now().replace(hour=0, minute=0, second=0, microsecond=0)
    assert engine.orchestrator.cost is not None
    assert engine.orchestrator.cost.tenant_day_spend_usd("t", day) == Decimal("0.60")
