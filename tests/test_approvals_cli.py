"""``jobledger approve --edit/--data``, votes on a quorum request and ``jobledger
reassign``, run for real as subprocesses, on both stores."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.cli import Cli, make_cli

BOARD = """
type: board
version: 1
start: draft
steps:
  draft: {kind: run_interaction_task, params: {task: draft}, next: review}
  review:
    kind: await_approval
    approvers: [alice, bob, carol]
    quorum: 2
    on_approve: publish
  publish: {kind: run_interaction_task, params: {task: publish}, next: done}
  done: {kind: complete}
"""
EDITOR = """
type: editor
version: 1
start: draft
steps:
  draft: {kind: run_interaction_task, params: {task: draft}, next: review}
  review: {kind: await_approval, approvers: [lead], on_approve: publish}
  publish: {kind: run_interaction_task, params: {task: publish}, next: done}
  done: {kind: complete}
"""
APPROVAL = "j1:step:2:approval"


@pytest.fixture
def cli(tmp_path: Path, store_url: str) -> Cli:
    return make_cli(tmp_path, store_url, definitions={"board.yaml": BOARD, "editor.yaml": EDITOR})


def test_votes_reassign_and_the_quorum(cli: Cli) -> None:
    cli.ok("submit", "acme", "j1", "board")
    cli.ok("tick", "acme", "j1")

    out = cli.ok("approve", "acme", "j1", "--by", "alice", "--data", '{"po": "PO-7"}')
    assert out.startswith(f"voted approved (1 of 2 approvals) {APPROVAL} as alice")
    shown = cli.ok("show", "acme", "j1")
    assert f"{APPROVAL} by alice, bob, carol (1 of 2 approvals)" in shown
    refused = cli.fails(1, "approve", "acme", "j1", "--by", "alice")
    assert refused == f"error: 'alice' already voted on approval '{APPROVAL}'"
    back = ("reassign", "acme", "j1", "--to", "alice", "--by", "ops", "--reason", "r")
    refused = cli.fails(1, *back)
    assert "needs 2 approvals and has 1: 0 approver(s) yet to vote cannot reach it" in refused
    out = cli.ok("reassign", "acme", "j1", "--to", "dave", "--by", "ops", "--reason", "bob away")
    assert out.startswith(f"{APPROVAL} reassigned to dave by ops")
    refused = cli.fails(1, "approve", "acme", "j1", "--by", "bob")
    assert refused.startswith(f"error: 'bob' may not decide approval '{APPROVAL}'; allowed: dave")
    out = cli.ok("approve", "acme", "j1", "--by", "dave")
    assert out.startswith(f"approved {APPROVAL} as dave: acme/j1 is now queued")

    job = cli.json("tick", "acme", "j1")["job"]
    assert job["status"] == "completed" and job["state"]["po"] == "PO-7"
    kinds = [e["event_type"] for e in cli.json("history", "acme", "j1")["events"]]
    assert kinds.count("ApprovalVoted") == 2 and "ApprovalReassigned" in kinds


def test_an_approval_with_edits_runs_the_step_with_them(cli: Cli) -> None:
    cli.ok("submit", "acme", "j1", "editor")
    cli.ok("tick", "acme", "j1")
    refused = cli.fails(1, "approve", "acme", "j1", "--by", "lead", "--edit", '{"tone": "x"}')
    assert refused == "error: step 'publish' has no param 'tone' to edit (its params: task)"

    cli.ok("approve", "acme", "j1", "--by", "lead", "--edit", '{"task": "publish_short"}')

    job = cli.json("tick", "acme", "j1")["job"]
    # The executor did the edited task (tests.support.cli.RecordingExecutor).
    assert job["status"] == "completed" and job["state"]["did_publish_short"] is True
    assert "did_publish" not in job["state"]
