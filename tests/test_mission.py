"""A whole mission on declarative definitions, on both stores, with a fake clock."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

from jobledger import Engine, JobStatus, StepRequest, StepResult
from jobledger.adapters.clock import FakeClock
from jobledger.domain.steps import IssuedToken
from jobledger.domain.views import JobView
from jobledger.orchestration.ports import ApprovalRequest
from jobledger.workflows import DefinitionRegistry, load_definitions
from tests.support.engines import EngineFactory

MISSION_V1 = """
type: mission
version: 1
start: research
steps:
  research:
    kind: run_interaction_task
    params: {task: research}
    next: cool_off
  cool_off:
    kind: wait_time
    delay: {days: 3}
    next: payment
  payment:
    kind: wait_event
    event: invoice.paid
    timeout: {days: 7}
    on_timeout: gave_up
    next: draft
  draft:
    kind: run_interaction_task
    max_visits: 3
    params: {task: draft}
    next: review
  review:
    kind: await_approval
    approvers: [lead]
    expires: {days: 2}
    on_approve: publish
    on_reject: draft
    on_expire: gave_up
  publish:
    kind: run_interaction_task
    params: {task: publish}
    next: done
  done:
    kind: complete
  gave_up:
    kind: fail
    reason: the mission ran out of time
"""

# v2 drops the approval gate: the draft is published directly.
MISSION_V2 = (
    MISSION_V1.replace("version: 1", "version: 2")
    .replace("    next: review\n", "    next: publish\n")
    .split("  review:\n")[0]
    + MISSION_V1.split("  on_expire: gave_up\n")[1]
)


class AgentTurn:
    """Deterministic agent work with a cost per step."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def execute(self, request: StepRequest) -> StepResult:
        self.calls.append(request.idempotency_key)
        task = request.resolution.params["task"]
        return StepResult(output={"task": task}, state_patch={f"did_{task}": True}, cost_usd="0.40")


class Inbox:
    def __init__(self) -> None:
        self.tokens: list[IssuedToken] = []
        self.approvals: list[ApprovalRequest] = []

    def waiting_for_event(self, job: JobView, event_name: str, token: IssuedToken) -> None:
        self.tokens.append(token)

    def approval_requested(self, job: JobView, request: ApprovalRequest) -> None:
        self.approvals.append(request)


def registry(tmp_path: Path, *documents: str) -> DefinitionRegistry:
    for n, text in enumerate(documents):
        (tmp_path / f"mission.{n}.yaml").write_text(text)
    return DefinitionRegistry.from_directory(tmp_path)


def test_a_mission_with_a_timer_an_event_an_approval_loop_and_the_cost_ceiling(
    make_engine: EngineFactory, clock: FakeClock, tmp_path: Path
) -> None:
    clock.set(datetime(2026, 5, 4, 22, 0, tzinfo=UTC))
    agent, inbox = AgentTurn(), Inbox()
    engine: Engine = make_engine(
        registry=registry(tmp_path, MISSION_V1),
        executor=agent,
        notifier=inbox,
        config={"cost_ceiling_usd": "0.80"},
    )
    engine.submit("acme", "m1", "mission", input={"topic": "tides"})

    engine.run_until_idle()  # research, then a three-day timer
    assert engine.job("acme", "m1").status is JobStatus.WAITING_TIME
    clock.advance(timedelta(days=3))
    engine.run_until_idle()
    assert engine.job("acme", "m1").status is JobStatus.WAITING_EVENT

    engine.resume(inbox.tokens[0].token, {"invoice": "INV-7"})
    engine.run_until_idle()  # draft, then the review gate
    first = inbox.approvals[-1]
    engine.decide("acme", "m1", first.approval_id, "reject", "lead", "cite sources")
    engine.run_until_idle()  # draft again: the day's spend reaches the 0.80 ceiling
    second = inbox.approvals[-1]
    assert second.approval_id != first.approval_id and second.attempt == 2
    engine.decide("acme", "m1", second.approval_id, "approve", "lead", "ship it")

    report = engine.tick("acme", "m1", "approval_decided")  # publish is costly: deferred
    assert engine.job("acme", "m1").status is JobStatus.WAITING_TIME
    assert report.outcome == "deferred"
    midnight = engine.job("acme", "m1").resume_at
    assert midnight is not None and (midnight.hour, midnight.minute) == (0, 0)

    clock.set(midnight)
    engine.run_until_idle()

    job = engine.job("acme", "m1")
    assert job.status is JobStatus.COMPLETED
    assert job.state["invoice"] == "INV-7" and job.state["did_publish"] is True
    assert job.workflow_version == 1
    assert len(agent.calls) == len(set(agent.calls)) == 4  # no step ran twice
    audit = [
        (h.event_type, h.data.get("step_type") or h.data.get("decision") or h.data.get("source"))
        for h in engine.history("acme", "m1")
        if h.event_type != "Claimed"
    ]
    assert audit == [
        ("Submitted", None),
        ("StepRecorded", "run_interaction_task"),
        ("StepRecorded", "wait_time"),
        ("StepRecorded", "wait_event"),
        ("Resumed", "token"),
        ("StepRecorded", "run_interaction_task"),
        ("StepRecorded", "await_approval"),
        ("ApprovalRequested", None),
        ("ApprovalDecided", "rejected"),
        ("StepRecorded", "run_interaction_task"),
        ("StepRecorded", "await_approval"),
        ("ApprovalRequested", None),
        ("ApprovalDecided", "approved"),
        ("CostCeilingDeferred", None),
        ("StepRecorded", "run_interaction_task"),
        ("StepRecorded", "complete"),
    ]
    assert engine.verify("acme", "m1") is None


def test_jobs_waiting_on_v1_finish_on_v1_after_v2_is_loaded(
    make_engine: EngineFactory, clock: FakeClock, tmp_path: Path
) -> None:
    v1_dir, both_dir = tmp_path / "v1", tmp_path / "both"
    v1_dir.mkdir()
    both_dir.mkdir()
    inbox = Inbox()
    old = make_engine(registry=registry(v1_dir, MISSION_V1), executor=AgentTurn(), notifier=inbox)
    old.submit("acme", "waiting", "mission")
    old.run_until_idle()
    clock.advance(timedelta(days=3))
    old.run_until_idle()
    assert old.job("acme", "waiting").status is JobStatus.WAITING_EVENT

    # A deploy: the new engine knows v1 and v2; new jobs take v2, old ones stay pinned.
    new = make_engine(
        registry=registry(both_dir, MISSION_V1, MISSION_V2), executor=AgentTurn(), notifier=inbox
    )
    assert new.submit("acme", "fresh", "mission").workflow_version == 2
    new.resume(inbox.tokens[0].token)
    new.run_until_idle()

    job = new.job("acme", "waiting")
    assert (job.workflow_version, job.status) == (1, JobStatus.AWAITING_APPROVAL)


def test_the_example_definitions_load() -> None:
    examples = Path(__file__).resolve().parent.parent / "examples" / "definitions"
    loaded = {(d.type, d.version) for d in load_definitions(examples)}
    assert ("research_mission", 1) in loaded and ("research_mission", 2) in loaded
