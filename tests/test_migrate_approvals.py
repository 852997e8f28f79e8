"""A job migrated while it awaits approval: the open request follows the new version's
approvers and routes, or the migration says why it cannot move the job."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from jobledger import JobStatus, StepRequest, StepResult
from jobledger.audit.errors import MigrationRefusedError
from jobledger.domain.errors import UnauthorisedDeciderError
from jobledger.workflows import DefinitionRegistry
from tests.support.engines import EngineFactory

EXAMPLES = Path(__file__).resolve().parent.parent / "examples" / "definitions"
NO_GATE_V3 = """
type: research_mission
version: 3
start: plan
steps:
  plan: {kind: run_interaction_task, params: {task: plan_research}, next: research}
  research: {kind: run_interaction_task, params: {task: gather_sources}, next: draft}
  draft: {kind: run_interaction_task, params: {task: write_report}, next: score}
  score: {kind: run_interaction_task, params: {task: self_review}, next: check}
  check:
    kind: branch
    cases: [{when: {path: review.score, op: ">=", value: 0.8}, next: review}]
    default: done
  review: {kind: run_interaction_task, params: {task: auto_review}, next: done}
  done: {kind: complete}
"""


class Researcher:
    def execute(self, request: StepRequest) -> StepResult:
        task = request.resolution.params["task"]
        patch = {"review": {"score": 0.9}} if task == "self_review" else {}
        return StepResult(output={"task": task}, state_patch=patch)


@pytest.fixture
def definitions(tmp_path: Path) -> Path:
    directory = tmp_path / "definitions"
    directory.mkdir()
    for name in ("research_mission.v1.yaml", "research_mission.v2.yaml"):
        shutil.copy(EXAMPLES / name, directory / name)
    (directory / "research_mission.v3.yaml").write_text(NO_GATE_V3)
    return directory


def awaiting_review(make_engine: EngineFactory, definitions: Path):  # type: ignore[no-untyped-def]
    engine = make_engine(
        registry=DefinitionRegistry.from_directory(definitions), executor=Researcher()
    )
    engine.submit("t", "j", "research_mission", workflow_version=1, input={"question": "?"})
    engine.run_until_idle()
    assert engine.job("t", "j").status is JobStatus.AWAITING_APPROVAL
    return engine


def test_a_forced_migration_moves_the_open_approval_to_the_new_approvers_and_routes(
    make_engine: EngineFactory, definitions: Path
) -> None:
    engine = awaiting_review(make_engine, definitions)
    approval = engine.job("t", "j").pending_approval_id
    assert approval is not None
    with pytest.raises(UnauthorisedDeciderError):  # v1's review is the research lead's
        engine.decide("t", "j", approval, "approve", "editor")
    view, report = engine.migrate("t", "j", 2, force=True, by="ops", reason="v2 adds an editor")
    assert not report.safe and view.workflow_version == 2
    assert view.pending_approval_id == approval  # the same request, bound to the same action
    events = [e.event_type for e in engine.history("t", "j")]
    assert events[-2:] == ["Migrated", "ApprovalRerouted"]  # one append
    rerouted = engine.history("t", "j")[-1].data
    assert rerouted["approval"]["approvers"] == ["research-lead", "editor"]
    assert rerouted["approval"]["on_approve"] == "cool_off"
    assert rerouted["reason"] == "migrated from v1 to v2"
    engine.decide("t", "j", approval, "approve", "editor", "fine by me")
    engine.run_until_idle()
    job = engine.job("t", "j")
    assert job.status is JobStatus.WAITING_TIME and job.next_step == "publish"  # v2's route
    assert engine.verify("t", "j") is None


def test_a_version_that_does_not_gate_the_step_cannot_take_a_job_awaiting_approval(
    make_engine: EngineFactory, definitions: Path
) -> None:
    engine = awaiting_review(make_engine, definitions)
    before = engine.job("t", "j").version
    with pytest.raises(MigrationRefusedError) as refused:
        engine.migrate("t", "j", 3, force=True, by="ops", reason="automate the review")
    message = str(refused.value)
    assert "awaits approval" in message and "which v3 does not gate with an approval" in message
    assert "decide it first" in message
    assert engine.job("t", "j").version == before  # nothing written
