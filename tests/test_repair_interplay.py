"""Where issue 27's parts meet, on SQLite and PostgreSQL: a reset or a retry of a job
whose approval was a quorum or carried an edit, repairs and bulk actions on an archived
job, the archive and restore of a reset and forked job, and a reassigned quorum request
cancelled in bulk. Each ends with the store verifying."""

from __future__ import annotations

import pytest

from jobledger import Engine, JobStatus, StepError, StepRequest, StepResult
from jobledger.audit import tamper
from jobledger.domain.errors import (
    ApprovalAlreadyDecidedError,
    StaleApprovalError,
)
from tests.support.approvals import Recorder, approvals_registry
from tests.support.engines import EngineFactory, store_of, writes

T = "t"


class FailingOnce(Recorder):
    """The approvals' executor whose ``pay`` step raises a bug on its first run."""

    def __init__(self) -> None:
        super().__init__()
        self.runs: list[dict[str, object]] = []

    def execute(self, request: StepRequest) -> StepResult:
        if request.resolution.step_name == "pay":
            self.runs.append(dict(request.resolution.params))
            if len(self.runs) == 1:
                raise StepError("payment gateway bug", retryable=False)
        return super().execute(request)


@pytest.fixture
def recorder() -> FailingOnce:
    return FailingOnce()


@pytest.fixture
def approvals(make_engine: EngineFactory, recorder: FailingOnce) -> Engine:
    return make_engine(registry=approvals_registry(), executor=recorder)


def awaiting(engine: Engine, workflow: str, job_id: str = "j") -> str:
    engine.submit(T, job_id, workflow)
    engine.run_until_idle()
    view = engine.job(T, job_id)
    assert view.status is JobStatus.AWAITING_APPROVAL and view.pending_approval_id is not None
    return view.pending_approval_id


def data(engine: Engine, event_type: str, job_id: str = "j") -> list[dict[str, object]]:
    return [h.data for h in engine.history(T, job_id) if h.event_type == event_type]


def intact(engine: Engine) -> None:
    assert tamper.verify_store(store_of(engine)).intact


# ---- 1. a reset reopens a quorum approval with no votes -----------------------------------


def test_a_reset_reopens_a_quorum_approval_empty_and_the_old_votes_do_not_count(
    approvals: Engine, recorder: FailingOnce
) -> None:
    first = awaiting(approvals, "payout")
    approvals.decide(T, "j", first, "approve", "alice")
    approvals.decide(T, "j", first, "approve", "bob")
    approvals.run_until_idle()
    assert approvals.job(T, "j").status is JobStatus.FAILED  # pay's first run raised

    approvals.reset(T, "j", 1, by="ops", reason="review again")
    approvals.run_until_idle()

    view = approvals.job(T, "j")
    assert view.status is JobStatus.AWAITING_APPROVAL
    again = view.pending_approval_id
    assert again is not None and again != first and "@e1" in again
    gate = approvals.jobs.load(T, "j").pending_approval
    assert gate is not None and gate.votes == () and gate.progress == "0 of 2 approvals"
    # The old request was decided and is closed: no vote on it lands, not even a new voter's.
    before = writes(approvals)
    for voter in ("alice", "carol"):
        with pytest.raises(ApprovalAlreadyDecidedError):
            approvals.decide(T, "j", first, "approve", voter)
    assert writes(approvals) == before

    approvals.decide(T, "j", again, "approve", "alice")
    assert approvals.job(T, "j").status is JobStatus.AWAITING_APPROVAL  # one vote of two
    approvals.decide(T, "j", again, "approve", "carol")
    approvals.run_until_idle()
    assert approvals.job(T, "j").status is JobStatus.COMPLETED
    decided = data(approvals, "ApprovalDecided")
    assert [d["decided_by"] for d in decided] == ["alice, bob", "alice, carol"]
    assert approvals.verify(T, "j") is None
    intact(approvals)


def test_votes_cast_before_a_reset_of_an_open_quorum_request_are_not_carried_over(
    approvals: Engine,
) -> None:
    first = awaiting(approvals, "payout")
    approvals.decide(T, "j", first, "approve", "alice")

    approvals.reset(T, "j", 1, by="ops", reason="the draft changed")
    approvals.run_until_idle()

    again = approvals.job(T, "j").pending_approval_id
    assert again is not None and again != first
    before = writes(approvals)
    with pytest.raises(StaleApprovalError):
        approvals.decide(T, "j", first, "approve", "bob")  # the old request, still undecided
    assert writes(approvals) == before
    # alice's vote was on the old request: one more vote does not reach the quorum.
    approvals.decide(T, "j", again, "approve", "bob")
    assert approvals.job(T, "j").status is JobStatus.AWAITING_APPROVAL
    approvals.decide(T, "j", again, "approve", "alice")
    assert data(approvals, "ApprovalDecided")[0]["decided_by"] == "bob, alice"
    assert approvals.verify(T, "j") is None


def test_an_edit_decided_before_a_reset_does_not_reach_the_re_run(
    approvals: Engine, recorder: FailingOnce
) -> None:
    first = awaiting(approvals, "refund")
    approvals.decide(T, "j", first, "approve", "alice", edit={"amount": 80})
    approvals.run_until_idle()
    assert recorder.runs == [{"task": "pay", "amount": 80, "currency": "EUR"}]

    approvals.reset(T, "j", 1, by="ops", reason="ask again")
    approvals.run_until_idle()
    again = approvals.job(T, "j").pending_approval_id
    assert again is not None and again != first
    approvals.decide(T, "j", again, "approve", "alice")
    approvals.run_until_idle()

    assert approvals.job(T, "j").status is JobStatus.COMPLETED
    assert recorder.runs[-1] == {"task": "pay", "amount": 100, "currency": "EUR"}
    assert approvals.replay(T, "j").safe
    assert approvals.verify(T, "j") is None


# ---- 2. a retry keeps the approver's edit -------------------------------------------------


def test_a_retried_step_after_an_approval_with_edits_runs_with_the_edit(
    approvals: Engine, recorder: FailingOnce
) -> None:
    approval_id = awaiting(approvals, "refund")
    approvals.decide(T, "j", approval_id, "approve", "alice", edit={"amount": 80})
    approvals.run_until_idle()
    assert approvals.job(T, "j").status is JobStatus.FAILED

    approvals.retry(T, "j", by="ops", reason="gateway fixed")
    approvals.run_until_idle()

    assert approvals.job(T, "j").status is JobStatus.COMPLETED
    edited = {"task": "pay", "amount": 80, "currency": "EUR"}
    assert recorder.runs == [edited, edited]
    assert approvals.replay(T, "j").safe
    assert approvals.verify(T, "j") is None


def test_a_reset_that_keeps_the_decision_with_edits_re_runs_the_step_with_them(
    approvals: Engine, recorder: FailingOnce
) -> None:
    approval_id = awaiting(approvals, "refund")
    approvals.decide(T, "j", approval_id, "approve", "alice", edit={"amount": 80})
    approvals.run_until_idle()
    assert approvals.job(T, "j").status is JobStatus.FAILED

    # Reset to the approval's own step: its decision (and so its edit) stays recorded.
    approvals.reset(T, "j", 2, by="ops", reason="re-run the payment")
    approvals.run_until_idle()

    assert approvals.job(T, "j").status is JobStatus.COMPLETED
    edited = {"task": "pay", "amount": 80, "currency": "EUR"}
    assert recorder.runs == [edited, edited]
    assert approvals.replay(T, "j").safe
    assert approvals.verify(T, "j") is None


def test_a_fork_after_a_decision_with_edits_runs_the_step_with_them(
    approvals: Engine, recorder: FailingOnce
) -> None:
    approval_id = awaiting(approvals, "refund")
    approvals.decide(T, "j", approval_id, "approve", "alice", edit={"amount": 80})
    approvals.run_until_idle()

    approvals.fork(T, "j", 2, new_job_id="f", by="ops", reason="pay from a copy")
    approvals.run_until_idle()

    assert approvals.job(T, "f").status is JobStatus.COMPLETED
    assert recorder.runs[-1] == {"task": "pay", "amount": 80, "currency": "EUR"}
    assert approvals.replay(T, "f").safe
    assert approvals.verify(T, "f") is None
