"""Where issue 27's parts meet, on SQLite and PostgreSQL: a reset or a retry of a job
whose approval was a quorum or carried an edit, repairs and bulk actions on an archived
job, the archive and restore of a reset and forked job, and a reassigned quorum request
cancelled in bulk. Each ends with the store verifying."""

from __future__ import annotations

from pathlib import Path

import pytest

from jobledger import Engine, JobStatus, StepError, StepRequest, StepResult
from jobledger.adapters.clock import FakeClock
from jobledger.audit import tamper
from jobledger.audit.archive import DirectoryArchive, read_directory_ref
from jobledger.audit.archived import with_tombstones
from jobledger.domain.batch import Outcome
from jobledger.domain.errors import (
    ApprovalAlreadyDecidedError,
    JobArchivedError,
    JobFinishedError,
    StaleApprovalError,
)
from jobledger.projections.job_views import JobViews
from tests.support.approvals import Recorder, approvals_registry
from tests.support.cli import make_cli
from tests.support.engines import CountingExecutor, EngineFactory, store_of, writes
from tests.support.http import ApiServer, problem
from tests.support.retention import archiver, due_later, raw_rows

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


# ---- 3. repairs and bulk actions on an archived job ---------------------------------------


def archive(engine: Engine, clock: FakeClock, archive_dir: Path, *job_ids: str) -> None:
    """Archive those finished jobs of tenant acme (a job submitted after them holds the
    newest event of the log, which is never archived)."""
    engine.submit("tail", "newest", "agent3")
    rows = [row for row in due_later(engine, clock) if row.job_id in job_ids]
    run = archiver(engine).run(DirectoryArchive(archive_dir), rows, clock.now())
    assert sorted(t.job_id for t in run.archived) == sorted(job_ids)


def failed_job(engine: Engine, executor: CountingExecutor, job_id: str = "j") -> None:
    def fail(request: StepRequest) -> Exception | None:
        return StepError("boom", retryable=False) if request.step_number == 3 else None

    executor.fail_with = fail
    engine.submit("acme", job_id, "agent3")
    engine.run_until_idle()
    executor.fail_with = None
    assert engine.job("acme", job_id).status is JobStatus.FAILED


def test_an_archived_job_is_not_repaired_or_cancelled_and_nothing_is_written(
    engine: Engine, executor: CountingExecutor, clock: FakeClock, tmp_path: Path
) -> None:
    failed_job(engine, executor)
    archive(engine, clock, tmp_path / "archive", "j")
    before = writes(engine)

    refusals = {
        "retry": lambda: engine.retry("acme", "j", by="ops", reason="fixed"),
        "reset": lambda: engine.reset("acme", "j", 1, by="ops", reason="again"),
        "fork": lambda: engine.fork("acme", "j", 1, new_job_id="f", by="ops", reason="copy"),
        "cancel": lambda: engine.cancel("acme", "j", by="ops", reason="stop"),
    }
    for name, refused in refusals.items():
        with pytest.raises(JobArchivedError, match="was archived to dir:"):
            refused()
        assert writes(engine) == before, name
    assert engine.jobs.fetch("acme", "f") is None


def test_an_archived_job_is_a_410_for_each_repair_over_http(
    engine: Engine, api: ApiServer, executor: CountingExecutor, clock: FakeClock, tmp_path: Path
) -> None:
    failed_job(engine, executor)
    archive(engine, clock, tmp_path / "archive", "j")
    before = writes(engine)
    asks = {
        "retry": {"reason": "fixed"},
        "reset": {"step": 1, "reason": "again"},
        "fork": {"step": 1, "new_job_id": "f", "reason": "copy"},
    }
    with api.as_role("operator", sub="olga") as http:
        for action, body in asks.items():
            gone = problem(http.post(f"/v1/jobs/acme/j/{action}", json=body), 410)
            assert "was archived" in gone["detail"], action
    assert writes(engine) == before


def test_a_batch_made_before_its_job_was_archived_skips_it_with_the_reason(
    engine: Engine, executor: CountingExecutor, clock: FakeClock, tmp_path: Path
) -> None:
    failed_job(engine, executor, "gone")
    engine.submit("acme", "waiting", "wait")
    engine.run_until_idle()
    batch = engine.bulk.start(
        "acme", "cancel", {"all": True}, by="ops", reason="clean up", batch_id="b1"
    )
    assert batch.total == 2
    archive(engine, clock, tmp_path / "archive", "gone")

    done = engine.bulk.run("acme", "b1")

    outcomes = {o.job_id: o for o in done.outcomes}
    assert outcomes["gone"].outcome is Outcome.SKIPPED
    assert "was archived" in outcomes["gone"].detail
    assert outcomes["waiting"].outcome is Outcome.APPLIED
    assert (done.applied, done.skipped, done.failed, done.finished) == (1, 1, 0, True)
    # A query made now does not match the archived job at all.
    assert engine.bulk.preview("acme", "cancel", {"all": True}).count == 1
    intact(engine)


# ---- 4. archive and restore of a reset and forked job -------------------------------------


def test_a_reset_and_forked_job_is_archived_and_restored_byte_for_byte(
    engine: Engine, executor: CountingExecutor, clock: FakeClock, tmp_path: Path, store_url: str
) -> None:
    engine.submit("acme", "j", "agent3")
    engine.run_until_idle()
    engine.reset("acme", "j", 1, by="ops", reason="again")
    engine.run_until_idle()
    engine.fork("acme", "j", 2, new_job_id="f", by="ops", reason="a variant")
    engine.run_until_idle()
    assert {engine.job("acme", j).status for j in ("j", "f")} == {JobStatus.COMPLETED}
    kinds = [h.event_type for h in engine.history("acme", "j")]
    assert {"Reset", "Forked"} <= set(kinds)
    before = raw_rows(engine, "acme", "j")

    archive(engine, clock, tmp_path / "archive", "j")

    # The fork stays, naming an origin that is now a tombstone: the store verifies,
    # the archive link by link, and so does `jobledger verify` from the command line.
    assert engine.verify("acme", "f") is None
    report = tamper.verify_store(store_of(engine))
    full = with_tombstones(store_of(engine), report, None, read_directory_ref)
    assert full.intact
    assert "archive verified" in str({c.label: c.archived for c in full.jobs}["acme/j"])
    verified = make_cli(tmp_path, store_url).json("verify", "--all")
    assert verified["intact"] is True

    archiver(engine).restore("acme", "j", read_directory_ref, None)
    assert raw_rows(engine, "acme", "j") == before
    assert engine.verify("acme", "j") is None
    # Restored, it is repaired as before it left: a next reset runs under epoch 2.
    engine.reset("acme", "j", 1, by="ops", reason="once more")
    engine.run_until_idle()
    assert executor.calls["acme/j:step:2@e2"] == 1
    intact(engine)


# ---- 5. a reassigned quorum request, cancelled in bulk -------------------------------------


def test_a_reassigned_quorum_request_cancelled_in_bulk_closes_and_verifies(
    approvals: Engine,
) -> None:
    approval_id = awaiting(approvals, "payout")
    approvals.decide(T, "j", approval_id, "approve", "alice")
    approvals.reassign(T, "j", approval_id, ["dave", "erin"], by="ops", reason="team change")

    done = approvals.bulk.bulk(T, "cancel", {"workflow_type": "payout"}, by="ops", reason="off")

    assert (done.applied, done.skipped, done.failed) == (1, 0, 0)
    assert approvals.job(T, "j").status is JobStatus.CANCELLED
    before = writes(approvals)
    with pytest.raises(JobFinishedError, match="approvals are void"):
        approvals.decide(T, "j", approval_id, "approve", "erin")
    assert writes(approvals) == before
    views = JobViews(store_of(approvals))
    views.catch_up()
    assert views.pending_approvals(T) == []
    kinds = [h.event_type for h in approvals.history(T, "j")]
    assert kinds[-2:] == ["ApprovalReassigned", "Cancelled"]
    assert approvals.verify(T, "j") is None
    assert approvals.replay(T, "j").safe
    intact(approvals)
