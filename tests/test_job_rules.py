"""The rules that belong to the job are the job's: its commands refuse with the errors
callers see (jobledger.domain.errors), whoever calls them, and write nothing when they do."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest

from jobledger.domain.errors import (
    JobFinishedError,
    JobNotWaitingError,
    StaleApprovalError,
    TokenMismatchError,
    UnauthorisedDeciderError,
)
from jobledger.domain.job import Job
from jobledger.domain.status import JobStatus

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def submitted() -> Job:
    return Job.submit(
        tenant_id="t",
        job_id="j",
        workflow_type="w",
        workflow_version=1,
        state={},
        budget={},
        mission_id=None,
        employee_id=None,
        correlation_id=None,
        submit_key=None,
        timestamp=T0,
    )


def step(job: Job, status: JobStatus, wait_event: dict[str, object] | None = None) -> None:
    job.record_step(
        step_number=job.current_step + 1,
        step_type="s",
        triggered_by="workflow",
        idempotency_key=f"k{job.current_step + 1}",
        started_at=T0,
        ended_at=T0,
        output={},
        state_patch={},
        cost_usd=Decimal(0),
        transition_reason="",
        next_status=status,
        resume_at=None,
        wait_event=wait_event,
        worker_id=None,
    )


def waiting() -> Job:
    """At step 2, waiting for ``paid`` under the token of nonce n1."""
    job = submitted()
    step(job, JobStatus.QUEUED)
    wait: dict[str, object] = {
        "name": "paid",
        "nonce": "n1",
        "token_sha256": "h1",
        "expires_at": (T0 + timedelta(days=1)).isoformat(),
        "on_timeout": None,
    }
    step(job, JobStatus.WAITING_EVENT, wait)
    return job


def gated(approvers: list[str]) -> Job:
    job = submitted()
    step(job, JobStatus.AWAITING_APPROVAL)
    job.request_approval(
        approval_id="a1",
        attempt=1,
        action_sha256="act",
        approvers=approvers,
        expires_at=T0 + timedelta(hours=1),
        on_approve=None,
        on_reject=None,
        on_expire=None,
        now=T0,
    )
    return job


def cancelled() -> Job:
    job = submitted()
    job.cancel(reason="r", cancelled_by="ops", now=T0)
    return job


def resume(job: Job, **overrides: object) -> None:
    fields: dict[str, object] = {
        "step_number": 2,
        "event_name": "paid",
        "nonce": "n1",
        "token_sha256": "h1",
        "payload": {},
        "now": T0,
    }
    job.resume_by_token(**{**fields, **overrides})  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"step_number": 1}, "the token is for step 1; the job waits at step 2"),
        ({"event_name": "other"}, "the token is for event 'other'; the job waits for 'paid'"),
        ({"nonce": "n0"}, "not the one issued for this wait"),
        ({"token_sha256": "h0"}, "not the one issued for this wait"),
    ],
)
def test_a_token_must_fit_the_wait_the_job_is_in(
    overrides: dict[str, object], message: str
) -> None:
    job = waiting()
    with pytest.raises(TokenMismatchError, match=message):
        resume(job, **overrides)
    assert job.status is JobStatus.WAITING_EVENT and not job.pending_events[3:]
    resume(job)
    assert job.status is JobStatus.QUEUED


def test_tokens_of_a_finished_or_moving_job_are_refused() -> None:
    with pytest.raises(JobFinishedError, match="is cancelled; its tokens are void"):
        resume(cancelled())
    with pytest.raises(JobNotWaitingError, match="is queued, not waiting for an event"):
        resume(submitted())
    with pytest.raises(JobFinishedError, match="its tokens are void"):
        cancelled().open_wait()


def test_a_decision_must_fit_the_open_request() -> None:
    def decide(job: Job, **overrides: object) -> None:
        fields: dict[str, object] = {
            "approval_id": "a1",
            "decision": "approved",
            "decided_by": "ann",
            "comment": None,
            "action_sha256": None,
            "now": T0,
        }
        job.decide_approval(**{**fields, **overrides})  # type: ignore[arg-type]

    with pytest.raises(StaleApprovalError, match="the open one is 'a1'"):
        decide(gated([]), approval_id="a0")
    with pytest.raises(StaleApprovalError, match="changed since it was shown"):
        decide(gated([]), action_sha256="other")
    with pytest.raises(StaleApprovalError, match="expired at"):
        decide(gated([]), now=T0 + timedelta(hours=2))
    with pytest.raises(UnauthorisedDeciderError, match="'eve' may not decide"):
        decide(gated(["ann"]), decided_by="eve")
    with pytest.raises(StaleApprovalError, match="is queued, not awaiting approval"):
        decide(submitted())
    with pytest.raises(JobFinishedError, match="approvals are void"):
        decide(cancelled())
    job = gated(["ann"])
    decide(job)
    assert job.status is JobStatus.QUEUED


def test_a_signal_resumes_a_waiting_job_or_is_kept_and_a_finished_job_refuses_it() -> None:
    job = waiting()
    assert job.deliver_signal(signal_id="s0", event_name="other", payload={}, now=T0) is False
    assert [m.signal_id for m in job.inbox] == ["s0"]
    assert job.deliver_signal(signal_id="s1", event_name="paid", payload={}, now=T0) is True
    assert job.status is JobStatus.QUEUED
    with pytest.raises(JobFinishedError, match="signal not delivered"):
        cancelled().deliver_signal(signal_id="s", event_name="e", payload={}, now=T0)


def test_a_finished_job_refuses_every_change_with_job_finished() -> None:
    with pytest.raises(JobFinishedError, match="job 'j' is already cancelled"):
        cancelled().cancel(reason="r", cancelled_by="ops", now=T0)
    with pytest.raises(JobFinishedError, match="job 'j' is already cancelled"):
        cancelled().raise_budget(raised_by="ops", reason="r", budget={}, now=T0)
    with pytest.raises(JobFinishedError, match="job 'j' is already cancelled"):
        cancelled().fail(error="e", cause="step", now=T0)
    with pytest.raises(JobFinishedError, match="job 'j' is already cancelled"):
        cancelled().migrate(
            to_version=2,
            forced=False,
            migrated_by=None,
            reason=None,
            replay_verdict="safe",
            now=T0,
        )
