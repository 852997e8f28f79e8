"""Approvals people give over HTTP, on both stores: votes on a quorum request and their
progress, approve with edits and with data, reassign (operator), each refusal a problem
that writes nothing."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from jobledger import JobStatus
from jobledger.api.auth import Role
from jobledger.engine.engine import Engine
from tests.support.approvals import Recorder, approvals_registry
from tests.support.engines import EngineFactory
from tests.support.http import ApiServer, problem, start_api


@pytest.fixture
def recorder() -> Recorder:
    return Recorder()


@pytest.fixture
def engine(make_engine: EngineFactory, recorder: Recorder) -> Engine:
    return make_engine(registry=approvals_registry(), executor=recorder)


@pytest.fixture
def api(engine: Engine, tmp_path: Path) -> Iterator[ApiServer]:
    with start_api(engine, tmp_path) as server:
        yield server


def awaiting(engine: Engine, workflow: str) -> str:
    engine.submit("acme", "j", workflow)
    engine.run_until_idle()
    approval = engine.job("acme", "j").pending_approval_id
    assert approval is not None
    return f"/v1/jobs/acme/j/approvals/{approval}"


def count(engine: Engine) -> int:
    return len(engine.history("acme", "j"))


def test_votes_show_their_progress_and_the_quorum_decides(api: ApiServer, engine: Engine) -> None:
    path = awaiting(engine, "payout")
    with (
        api.as_role(Role.APPROVER, sub="alice") as alice,
        api.as_role(Role.APPROVER, sub="bob") as bob,
    ):
        voted = alice.post(path, json={"decision": "approve", "data": {"po": "PO-9"}})
        card = bob.get(path).json()
        again = alice.post(path, json={"decision": "approve"})
        decided = bob.post(path, json={"decision": "approve"})
    assert voted.status_code == 200, voted.text
    assert voted.json()["status"] == "awaiting_approval"
    assert voted.json()["pending_approval"]["votes"] == [
        {"voter": "alice", "decision": "approved", "data": {"po": "PO-9"}}
    ]
    assert card["quorum"] == 2 and card["approvers"] == ["alice", "bob", "carol"]
    assert [(v["voter"], v["decision"]) for v in card["votes"]] == [("alice", "approved")]
    assert problem(again, 409)["error"] == "AlreadyVotedError"
    assert decided.status_code == 200, decided.text
    assert decided.json()["state"]["po"] == "PO-9"
    engine.run_until_idle()
    assert engine.job("acme", "j").status is JobStatus.COMPLETED


def test_an_approval_with_edits_over_http_runs_the_step_with_them(
    api: ApiServer, engine: Engine, recorder: Recorder
) -> None:
    path = awaiting(engine, "refund")
    with api.as_role(Role.APPROVER, sub="alice") as alice:
        shown = alice.get(path).json()
        refused = alice.post(path, json={"decision": "approve", "edit": {"iban": "DE00"}})
        before = count(engine)
        not_json = alice.post(path, json={"decision": "approve", "edit": ["amount"]})
        ok = alice.post(
            path,
            json={
                "decision": "approve",
                "action_sha256": shown["action_sha256"],
                "edit": {"amount": 75},
            },
        )
    assert "no param 'iban' to edit" in problem(refused, 400)["detail"]
    assert "edit: Input should be a valid dictionary" in problem(not_json, 400)["detail"]
    assert count(engine) == before + 1  # the approval's one decision, nothing refused
    assert ok.status_code == 200, ok.text
    engine.run_until_idle()
    assert recorder.params["pay"] == {"task": "pay", "amount": 75, "currency": "EUR"}


def test_an_operator_reassigns_and_only_the_new_approver_decides(
    api: ApiServer, engine: Engine
) -> None:
    path = awaiting(engine, "refund")
    body = {"approvers": ["dave"], "reason": "alice is on leave"}
    with (
        api.as_role(Role.OPERATOR, sub="ops") as ops,
        api.as_role(Role.APPROVER, sub="alice") as alice,
        api.as_role(Role.APPROVER, sub="dave") as dave,
    ):
        by_approver = alice.post(f"{path}/reassign", json=body)
        nobody = ops.post(f"{path}/reassign", json={"approvers": [], "reason": "x"})
        moved = ops.post(f"{path}/reassign", json=body)
        card = dave.get(path).json()
        inbox = dave.get("/v1/approvals").json()
        old = alice.post(path, json={"decision": "approve"})
        new = dave.post(path, json={"decision": "approve"})
    problem(by_approver, 403)
    problem(nobody, 400)
    assert moved.status_code == 200, moved.text
    assert moved.json()["pending_approval"]["approvers"] == ["dave"]
    assert card["approvers"] == ["dave"]
    assert [a["job_id"] for a in inbox] == ["j"]
    assert problem(old, 403)["error"] == "UnauthorisedDeciderError"
    assert new.status_code == 200, new.text
    reassigned = [h for h in engine.history("acme", "j") if h.event_type == "ApprovalReassigned"]
    assert reassigned[0].data["reassigned_by"] == "ops"
