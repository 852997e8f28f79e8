"""Approvals people give, on both stores: a quorum of named approvers (one vote each),
approve with edits (the next step runs with them), answer with data, reassign; all bound
to the request's step, attempt and action hash."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from jobledger import (
    Engine,
    FunctionRegistry,
    JobStatus,
    Resolution,
    WorkflowContext,
    workflow,
)
from jobledger.domain.approval_answers import answer_sha256
from jobledger.domain.errors import (
    AlreadyVotedError,
    ApprovalAlreadyDecidedError,
    InvalidPayloadError,
    StaleApprovalError,
    UnauthorisedDeciderError,
)
from jobledger.domain.job import Job
from jobledger.domain.keys import ConsumedKey
from jobledger.domain.steps import ApprovalSpec
from jobledger.orchestration.ports import JobStore
from jobledger.testing import WorkflowTestEnv
from jobledger.workflows.definition import DefinitionError
from jobledger.workflows.loader import parse_definition
from tests.support import pythonpath
from tests.support.approvals import Recorder, approvals_registry
from tests.support.engines import EngineFactory, StoreAround
from tests.support.notifiers import Inbox
from tests.support.workflows import DONE, SEND_100, linear_registry, review

TENANT = "t"
VOTER = [sys.executable, "-m", "tests.support.vote_worker"]


@pytest.fixture
def recorder() -> Recorder:
    return Recorder()


@pytest.fixture
def engine(make_engine: EngineFactory, recorder: Recorder) -> Engine:
    return make_engine(registry=approvals_registry(), executor=recorder)


def awaiting(engine: Engine, workflow: str, job_id: str = "j") -> str:
    engine.submit(TENANT, job_id, workflow)
    engine.run_until_idle()
    view = engine.job(TENANT, job_id)
    assert view.status is JobStatus.AWAITING_APPROVAL and view.pending_approval_id is not None
    return view.pending_approval_id


def events(engine: Engine, event_type: str, job_id: str = "j") -> list[dict[str, Any]]:
    return [h.data for h in engine.history(TENANT, job_id) if h.event_type == event_type]


def count(engine: Engine, job_id: str = "j") -> int:
    return len(engine.history(TENANT, job_id))


def gate(engine: Engine, job_id: str = "j") -> Any:
    job = engine.jobs.load(TENANT, job_id)
    return job.pending_approval


# ---- quorum ------------------------------------------------------------------------------


def test_two_of_three_approve_one_vote_each_and_the_job_goes_on(engine: Engine) -> None:
    approval_id = awaiting(engine, "payout")
    requested = events(engine, "ApprovalRequested")[0]
    assert requested["quorum"] == 2

    engine.decide(TENANT, "j", approval_id, "approve", "alice", "fine by me")
    assert engine.job(TENANT, "j").status is JobStatus.AWAITING_APPROVAL
    assert gate(engine).progress == "1 of 2 approvals"
    assert events(engine, "ApprovalDecided") == []

    engine.decide(TENANT, "j", approval_id, "approve", "carol")
    engine.run_until_idle()

    assert engine.job(TENANT, "j").status is JobStatus.COMPLETED
    votes = events(engine, "ApprovalVoted")
    assert [(v["voted_by"], v["decision"]) for v in votes] == [
        ("alice", "approved"),
        ("carol", "approved"),
    ]
    for vote in votes:  # each vote is bound as the request is
        bound = (vote["step_number"], vote["attempt"], vote["action_sha256"])
        assert bound == (requested["step_number"], requested["attempt"], requested["action_sha256"])
    decided = events(engine, "ApprovalDecided")
    assert [(d["decision"], d["decided_by"]) for d in decided] == [("approved", "alice, carol")]
    assert engine.verify(TENANT, "j") is None
    assert engine.replay(TENANT, "j").safe  # the quorum replays as recorded


def test_a_second_vote_by_the_same_approver_is_refused_and_writes_nothing(
    engine: Engine,
) -> None:
    approval_id = awaiting(engine, "payout")
    engine.decide(TENANT, "j", approval_id, "approve", "alice")
    before = count(engine)

    with pytest.raises(AlreadyVotedError, match="'alice' already voted"):
        engine.decide(TENANT, "j", approval_id, "reject", "alice")

    assert count(engine) == before


def test_someone_not_named_is_refused(engine: Engine) -> None:
    approval_id = awaiting(engine, "payout")
    before = count(engine)

    with pytest.raises(UnauthorisedDeciderError, match="'mallory' may not decide"):
        engine.decide(TENANT, "j", approval_id, "approve", "mallory")

    assert count(engine) == before


def test_the_request_is_rejected_once_the_quorum_can_no_longer_be_reached(
    engine: Engine,
) -> None:
    approval_id = awaiting(engine, "payout")

    engine.decide(TENANT, "j", approval_id, "reject", "alice", "too much")
    # Bob and carol may still make two approvals.
    assert engine.job(TENANT, "j").status is JobStatus.AWAITING_APPROVAL
    engine.decide(TENANT, "j", approval_id, "reject", "bob", "agreed")
    engine.run_until_idle()

    job = engine.job(TENANT, "j")
    assert job.status is JobStatus.FAILED and job.last_error == "declined"
    decided = events(engine, "ApprovalDecided")[0]
    assert (decided["decision"], decided["decided_by"]) == ("rejected", "alice, bob")
    assert decided["next_step"] == "declined"
    with pytest.raises(ApprovalAlreadyDecidedError):
        engine.decide(TENANT, "j", approval_id, "approve", "carol")


def test_a_vote_on_a_changed_action_or_another_request_is_stale(engine: Engine) -> None:
    approval_id = awaiting(engine, "payout")
    before = count(engine)

    with pytest.raises(StaleApprovalError, match="action to approve changed"):
        engine.decide(TENANT, "j", approval_id, "approve", "alice", action_sha256="0" * 64)
    with pytest.raises(StaleApprovalError, match="not the open request"):
        engine.decide(TENANT, "j", "j:step:9:approval", "approve", "alice")

    assert count(engine) == before


def test_the_votes_data_is_merged_into_the_state_in_vote_order(engine: Engine) -> None:
    approval_id = awaiting(engine, "payout")

    engine.decide(TENANT, "j", approval_id, "approve", "alice", data={"po": "PO-1", "by": "a"})
    engine.decide(TENANT, "j", approval_id, "approve", "bob", data={"by": "b"})

    assert engine.job(TENANT, "j").state["po"] == "PO-1"
    assert engine.job(TENANT, "j").state["by"] == "b"
    votes = events(engine, "ApprovalVoted")
    assert votes[0]["data_sha256"] == answer_sha256({"po": "PO-1", "by": "a"})
    decided = events(engine, "ApprovalDecided")[0]
    assert decided["data"] == {"po": "PO-1", "by": "b"}
    assert decided["data_sha256"] == answer_sha256({"po": "PO-1", "by": "b"})


# ---- edits and data ----------------------------------------------------------------------


def test_an_approval_with_edits_runs_the_next_step_with_them(
    engine: Engine, recorder: Recorder
) -> None:
    approval_id = awaiting(engine, "refund")
    shown = events(engine, "ApprovalRequested")[0]["action_sha256"]

    engine.decide(
        TENANT, "j", approval_id, "approve", "alice", action_sha256=shown, edit={"amount": 80}
    )
    engine.run_until_idle()

    assert engine.job(TENANT, "j").status is JobStatus.COMPLETED
    # The executor saw the edited params; the ones not edited are as defined.
    assert recorder.params["pay"] == {"task": "pay", "amount": 80, "currency": "EUR"}
    decided = events(engine, "ApprovalDecided")[0]
    assert decided["edit"] == {"amount": 80}
    assert decided["edit_sha256"] == answer_sha256({"amount": 80})
    # Replay applies the recorded edit as the tick did: the job replays the same.
    assert engine.replay(TENANT, "j").safe
    assert engine.verify(TENANT, "j") is None


def test_an_approval_without_edits_runs_the_step_as_defined(
    engine: Engine, recorder: Recorder
) -> None:
    approval_id = awaiting(engine, "refund")

    engine.decide(TENANT, "j", approval_id, "approve", "alice")
    engine.run_until_idle()

    assert recorder.params["pay"] == {"task": "pay", "amount": 100, "currency": "EUR"}
    decided = events(engine, "ApprovalDecided")[0]
    # Stored as before these fields existed: the same bytes, the same chain hash.
    assert not {"edit", "edit_sha256", "data", "data_sha256"} & set(decided)
    assert "quorum" not in events(engine, "ApprovalRequested")[0]


def test_an_answer_with_data_lands_in_the_state_for_the_next_steps(engine: Engine) -> None:
    approval_id = awaiting(engine, "refund")

    engine.decide(TENANT, "j", approval_id, "approve", "alice", data={"ticket": {"id": 7}})

    assert engine.job(TENANT, "j").state["ticket"] == {"id": 7}
    decided = events(engine, "ApprovalDecided")[0]
    assert decided["data"] == {"ticket": {"id": 7}}
    assert decided["data_sha256"] == answer_sha256({"ticket": {"id": 7}})


@pytest.mark.parametrize(
    ("workflow", "options", "fragment"),
    [
        ("refund", {"edit": {"iban": "X"}}, "no param 'iban' to edit"),
        ("refund", {"edit": {}}, "edit changes one param or more"),
        ("refund", {"edit": ["amount"]}, "must be a JSON object"),
        ("refund", {"edit": {"amount": "9" * 300_000}}, "over the limit"),
        ("refund", {"data": {"x": float("nan")}}, "not serialisable"),
        ("refund", {"decision": "reject", "edit": {"amount": 1}}, "not a rejection"),
        ("payout", {"edit": {"amount": 1}}, "takes no edits"),
    ],
    ids=["unknown-param", "empty", "not-object", "too-large", "bad-data", "reject", "quorum"],
)
def test_bad_edits_and_data_are_refused_and_write_nothing(
    engine: Engine, workflow: str, options: dict[str, Any], fragment: str
) -> None:
    approval_id = awaiting(engine, workflow)
    before = count(engine)
    answer = {k: v for k, v in options.items() if k != "decision"}

    with pytest.raises(InvalidPayloadError, match=fragment):
        decision = options.get("decision", "approve")
        engine.decide(TENANT, "j", approval_id, decision, "alice", **answer)

    assert count(engine) == before


def test_an_edit_by_someone_not_named_is_refused_as_unauthorised_first(engine: Engine) -> None:
    approval_id = awaiting(engine, "refund")
    before = count(engine)

    with pytest.raises(UnauthorisedDeciderError, match="'mallory' may not decide"):
        engine.decide(TENANT, "j", approval_id, "approve", "mallory", edit={"iban": "X"})

    assert count(engine) == before


def test_an_edit_of_a_step_no_definition_describes_is_refused(
    make_engine: EngineFactory,
) -> None:
    gate = review(ApprovalSpec(approvers=("alice",), on_approve="pay"))
    engine = make_engine(registry=linear_registry({"coded": [gate, SEND_100, DONE]}))
    approval_id = awaiting(engine, "coded")

    with pytest.raises(InvalidPayloadError, match="step 'pay' has no declarative definition"):
        engine.decide(TENANT, "j", approval_id, "approve", "alice", edit={"send": "$1"})


# ---- reassign ----------------------------------------------------------------------------


def test_a_reassigned_request_is_decided_by_the_new_approver_only(engine: Engine) -> None:
    approval_id = awaiting(engine, "refund")

    engine.reassign(TENANT, "j", approval_id, ["dave"], by="ops", reason="alice is away")

    with pytest.raises(UnauthorisedDeciderError, match="'alice' may not decide"):
        engine.decide(TENANT, "j", approval_id, "approve", "alice")
    engine.decide(TENANT, "j", approval_id, "approve", "dave")
    engine.run_until_idle()
    assert engine.job(TENANT, "j").status is JobStatus.COMPLETED
    moved = events(engine, "ApprovalReassigned")[0]
    assert (moved["approvers"], moved["previous_approvers"]) == (["dave"], ["alice"])
    assert (moved["reassigned_by"], moved["reason"]) == ("ops", "alice is away")


def test_the_new_approvers_are_notified_of_a_reassigned_request(
    make_engine: EngineFactory, recorder: Recorder
) -> None:
    inbox = Inbox()
    engine = make_engine(registry=approvals_registry(), executor=recorder, notifier=inbox)
    approval_id = awaiting(engine, "refund")
    assert inbox.approvals["j"].approvers == ("alice",)

    engine.reassign(TENANT, "j", approval_id, ["dave", "erin"], by="ops", reason="away")

    request = inbox.approvals["j"]
    assert (request.approval_id, request.approvers) == (approval_id, ("dave", "erin"))


def test_votes_cast_before_a_reassignment_stay_counted(engine: Engine) -> None:
    approval_id = awaiting(engine, "payout")
    engine.decide(TENANT, "j", approval_id, "approve", "alice")

    engine.reassign(TENANT, "j", approval_id, ["dave", "erin"], by="ops", reason="team change")
    engine.decide(TENANT, "j", approval_id, "approve", "erin")

    decided = events(engine, "ApprovalDecided")[0]
    assert (decided["decision"], decided["decided_by"]) == ("approved", "alice, erin")


@pytest.mark.parametrize(
    ("approvers", "fragment"),
    [
        ([], "one approver or more"),
        (["dave", "dave"], "more than once"),
        (["dave"], "cannot reach it"),
        (["alice", "bob", "carol"], "already theirs"),
    ],
    ids=["nobody", "twice", "quorum-out-of-reach", "unchanged"],
)
def test_a_bad_reassignment_is_refused_and_writes_nothing(
    engine: Engine, approvers: list[str], fragment: str
) -> None:
    approval_id = awaiting(engine, "payout")
    before = count(engine)

    with pytest.raises(InvalidPayloadError, match=fragment):
        engine.reassign(TENANT, "j", approval_id, approvers, by="ops", reason="why not")

    assert count(engine) == before


def test_a_reassignment_of_a_decided_request_is_stale(engine: Engine) -> None:
    approval_id = awaiting(engine, "refund")
    engine.decide(TENANT, "j", approval_id, "approve", "alice")

    with pytest.raises(StaleApprovalError):
        engine.reassign(TENANT, "j", approval_id, ["dave"], by="ops", reason="late")


# ---- definitions and snapshots -----------------------------------------------------------


@pytest.mark.parametrize(
    ("step", "fragment"),
    [
        ("{kind: await_approval, approvers: [a], quorum: 2, on_approve: done}", "quorum 2"),
        ("{kind: await_approval, quorum: 1, on_approve: done}", "quorum 1"),
        ("{kind: await_approval, approvers: [a, a], on_approve: done}", "more than once"),
    ],
    ids=["too-few", "nobody-named", "repeated"],
)
def test_a_quorum_the_approvers_cannot_reach_is_a_definition_error(
    step: str, fragment: str
) -> None:
    text = f"type: x\nversion: 1\nstart: g\nsteps:\n  g: {step}\n  done: {{kind: complete}}\n"
    with pytest.raises(DefinitionError, match=fragment):
        parse_definition(text, "x.yaml")


def test_a_quorum_its_approvers_cannot_reach_fails_a_function_registrys_job(
    make_engine: EngineFactory,
) -> None:
    def unreachable(_: object) -> Resolution:
        return review(ApprovalSpec(approvers=("alice",), quorum=2))

    engine = make_engine(registry=FunctionRegistry({("odd", 1): unreachable}))
    engine.submit(TENANT, "j", "odd")
    engine.run_until_idle()

    job = engine.job(TENANT, "j")
    assert job.status is JobStatus.FAILED
    assert "quorum of 2 needs 1 to 1" in (job.last_error or "")


def test_a_snapshot_keeps_the_votes_and_the_edit(engine: Engine) -> None:
    approval_id = awaiting(engine, "payout")
    engine.decide(TENANT, "j", approval_id, "approve", "alice", data={"po": 1})
    job = engine.jobs.load(TENANT, "j")

    restored = Job.Snapshot.take(job).mutate(None)

    assert restored.pending_approval == job.pending_approval
    assert restored.pending_approval is not None and restored.pending_approval.votes
    edited = awaiting(engine, "refund", "k")
    engine.decide(TENANT, "k", edited, "approve", "alice", edit={"amount": 5})
    kept = engine.jobs.load(TENANT, "k")
    assert Job.Snapshot.take(kept).mutate(None).approved_edit == kept.approved_edit


# ---- crashes -----------------------------------------------------------------------------


class Crash(BaseException):
    """The process dies here: not an Exception, so nothing in the engine can catch it."""


class CrashAtVote(StoreAround):
    """Dies at the append of the vote by ``voter``: before it commits, or right after."""

    def __init__(self, inner: JobStore, voter: str, after_commit: bool) -> None:
        super().__init__(inner)
        self.voter = voter
        self.after_commit = after_commit

    def append(self, job: Job, *keys: ConsumedKey) -> None:
        votes = [e for e in job.pending_events if isinstance(e, Job.ApprovalVoted)]
        fatal = any(vote.voted_by == self.voter for vote in votes)
        if fatal and not self.after_commit:
            raise Crash
        self.inner.append(job, *keys)
        if fatal:
            raise Crash


@pytest.mark.parametrize("after_commit", [False, True], ids=["before-commit", "after-commit"])
@pytest.mark.parametrize("voter", ["alice", "bob"], ids=["first-vote", "deciding-vote"])
def test_a_crash_at_a_vote_leaves_the_vote_and_its_decision_whole_or_absent(
    make_engine: EngineFactory, recorder: Recorder, voter: str, after_commit: bool
) -> None:
    engine = make_engine(registry=approvals_registry(), executor=recorder)
    approval_id = awaiting(engine, "payout")
    if voter == "bob":
        engine.decide(TENANT, "j", approval_id, "approve", "alice")
    crashing = make_engine(
        registry=approvals_registry(),
        executor=recorder,
        wrap_store=lambda store: CrashAtVote(store, voter, after_commit),
    )

    with pytest.raises(Crash):
        crashing.decide(TENANT, "j", approval_id, "approve", voter)

    restarted = make_engine(registry=approvals_registry(), executor=recorder)
    voters = [v["voted_by"] for v in events(restarted, "ApprovalVoted")]
    decided = events(restarted, "ApprovalDecided")
    assert voters.count(voter) == (1 if after_commit else 0)
    # The vote that settles the request and its decision are one append.
    assert len(decided) == (1 if voter == "bob" and after_commit else 0)
    if not after_commit:
        restarted.decide(TENANT, "j", approval_id, "approve", voter)  # voted again, once
    elif voter == "alice":
        with pytest.raises(AlreadyVotedError):
            restarted.decide(TENANT, "j", approval_id, "approve", voter)
    if voter == "alice":
        restarted.decide(TENANT, "j", approval_id, "approve", "carol")
    # The tick the crashed decision would have enqueued, as the reconciler delivers it.
    restarted.tick(TENANT, "j", "reconcile")
    restarted.run_until_idle()
    assert restarted.job(TENANT, "j").status is JobStatus.COMPLETED
    assert len(events(restarted, "ApprovalDecided")) == 1
    assert restarted.verify(TENANT, "j") is None


@pytest.mark.parametrize("hang", ["before", "after"])
def test_a_voter_killed_with_sigkill_at_the_deciding_vote_leaves_it_whole_or_absent(
    make_engine: EngineFactory, recorder: Recorder, store_url: str, tmp_path: Path, hang: str
) -> None:
    engine = make_engine(registry=approvals_registry(), executor=recorder)
    approval_id = awaiting(engine, "payout")
    engine.decide(TENANT, "j", approval_id, "approve", "alice")
    marker = tmp_path / "hanging"
    vote = ["--tenant", TENANT, "--job", "j", "--approval", approval_id, "--voter", "bob"]
    voter = subprocess.Popen(
        [*VOTER, "--store", store_url, *vote, "--hang", hang, "--marker", str(marker)],
        env={**os.environ, "PYTHONPATH": pythonpath()},
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 60
        while not marker.exists():
            assert voter.poll() is None, voter.communicate()[1]
            assert time.monotonic() < deadline, "the voter never reached its append"
            time.sleep(0.05)
    finally:
        voter.send_signal(signal.SIGKILL)
        voter.wait(timeout=30)

    landed = hang == "after"
    voters = [v["voted_by"] for v in events(engine, "ApprovalVoted")]
    assert voters == (["alice", "bob"] if landed else ["alice"])
    assert len(events(engine, "ApprovalDecided")) == (1 if landed else 0)
    if not landed:
        engine.decide(TENANT, "j", approval_id, "approve", "bob")
    engine.tick(TENANT, "j", "reconcile")
    engine.run_until_idle()
    assert engine.job(TENANT, "j").status is JobStatus.COMPLETED
    assert engine.verify(TENANT, "j") is None


# ---- code workflows ----------------------------------------------------------------------


def test_a_code_workflows_approval_takes_a_quorum_and_hands_the_body_the_data(
    make_engine: EngineFactory,
) -> None:
    @workflow("board_code", version=1)
    async def board(wf: WorkflowContext) -> dict[str, Any]:
        decision = await wf.approval(approvers=["ann", "bob", "cy"], quorum=2)
        return {"by": decision.decided_by, "data": decision.data}

    engine = make_engine(registry=None, workflows=[board], executor=None)
    approval_id = awaiting(engine, "board_code")
    engine.decide(TENANT, "j", approval_id, "approve", "ann", data={"seat": 4})
    assert engine.job(TENANT, "j").status is JobStatus.AWAITING_APPROVAL
    engine.decide(TENANT, "j", approval_id, "approve", "cy")
    engine.run_until_idle()

    job = engine.job(TENANT, "j")
    assert job.status is JobStatus.COMPLETED, job.last_error
    assert job.state["result"] == {"by": "ann, cy", "data": {"seat": 4}}
    with pytest.raises(ValueError, match="quorum of 4 needs 1 to 1"):
        WorkflowContext.approval(None, approvers=["ann"], quorum=4)  # type: ignore[arg-type]


def test_an_edit_of_a_code_workflows_approval_is_refused(make_engine: EngineFactory) -> None:
    @workflow("gate_code", version=1)
    async def gate(wf: WorkflowContext) -> str:
        return (await wf.approval(approvers=["ann"])).decision

    engine = make_engine(registry=None, workflows=[gate], executor=None)
    approval_id = awaiting(engine, "gate_code")
    before = count(engine)

    with pytest.raises(InvalidPayloadError, match="no declarative definition"):
        engine.decide(TENANT, "j", approval_id, "approve", "ann", edit={"approvers": []})

    assert count(engine) == before


def test_the_testing_kit_votes_and_answers_with_data() -> None:
    @workflow("kit_board", version=1)
    async def board(wf: WorkflowContext) -> Any:
        decision = await wf.approval(approvers=["ann", "bob"], quorum=2)
        return decision.data

    with WorkflowTestEnv([board]) as env:
        job = env.start(board, {})
        env.approve(job, by="ann", data={"seat": 1})
        assert job.status == "awaiting_approval"
        env.approve(job, by="bob", data={"row": 2})
        assert job.result() == {"seat": 1, "row": 2}
