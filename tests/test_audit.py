"""Replay and audit through the engine API, on SQLite and on PostgreSQL: time travel,
replay with a decision diff, migration, tamper evidence with anchors, export and import."""

from __future__ import annotations

import io
import json
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any
from uuid import UUID

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from jobledger import (
    Engine,
    InvalidPayloadError,
    JobStatus,
    Resolution,
    ResolveRequest,
    UnknownWorkflowError,
    linear_workflow,
)
from jobledger.adapters.clock import FakeClock
from jobledger.adapters.event_store import EventSourcedJobStore
from jobledger.adapters.signing import Ed25519Signer, Keyring, SigningKey, Window
from jobledger.audit import export as exporting
from jobledger.audit import log, tamper, verifier
from jobledger.audit.anchors import FileAnchorSink, read_anchors
from jobledger.audit.errors import (
    AnchorRefusedError,
    ImportRefusedError,
    MigrationRefusedError,
    NoSuchVersionError,
    ReplayError,
)
from jobledger.audit.replay import Resolver, replay_job
from jobledger.audit.time_travel import fold
from jobledger.domain import chain
from jobledger.domain.errors import (
    ApprovalAlreadyDecidedError,
    BrokenHistoryError,
    IdempotencyKeyReusedError,
)
from jobledger.domain.identity import job_uuid
from jobledger.domain.job import Job
from jobledger.engine.engine import SignalOutcome
from jobledger.orchestration.registry import FunctionRegistry
from jobledger.projections import JobViews
from jobledger.workflows import DefinitionRegistry, WorkflowDefinition, resolve
from tests import independent_verifier
from tests.support.audit import (
    MISSION_V1,
    RawEvents,
    RecordingRegistry,
    ScoringAgent,
    definition,
    mission,
)
from tests.support.engines import EngineFactory, default_registry
from tests.support.evidence import edit_event, fix_manifest, rehash
from tests.support.workflows import DONE, STEP, sleep_ms

T = "acme"


def store_of(engine: Engine) -> EventSourcedJobStore:
    assert isinstance(engine.store, EventSourcedJobStore)
    return engine.store


# ---- a mission through every path ---------------------------------------------------------


def run_missions(make_engine: EngineFactory, clock: FakeClock, registry: Any) -> Engine:
    """Seven jobs, each down another path of the mission: a wait that times out and an
    approval that expires; signal, timer and approval; a rejection back into the loop; a
    signal that came early; bursts of two steps per tick; a retried step; a worker that
    died holding a claim. Each job's input names it."""
    engine = make_engine(registry=registry, executor=ScoringAgent())

    def submit(job: str, on: Engine = engine, **extra: Any) -> None:
        on.submit(T, job, "mission", input={"job": job}, **extra)

    submit("timeout")
    engine.run_until_idle()
    clock.advance(timedelta(days=2, seconds=1))
    engine.run_until_idle()  # timed out -> chase -> review
    clock.advance(timedelta(days=3, seconds=1))
    engine.run_until_idle()  # the approval expired -> the 'expired' fail step

    for job in ("happy", "rejected"):
        submit(job, idempotency_key=f"key-{job}")
        engine.run_until_idle()
        assert engine.signal(T, job, "invoice.paid", {"paid": 10}, signal_id=f"s-{job}") == (
            SignalOutcome.RESUMED
        )
        engine.run_until_idle()
    clock.advance(timedelta(hours=1))
    engine.run_until_idle()  # both timers -> review
    for job, verdict in (("happy", "approve"), ("rejected", "reject")):
        approval = engine.job(T, job).pending_approval_id
        assert approval is not None
        engine.decide(T, job, approval, verdict, "lead", "ok" if verdict == "approve" else "no")
    engine.run_until_idle()

    submit("early")
    assert engine.signal(T, "early", "invoice.paid", signal_id="s-early") == (
        SignalOutcome.BUFFERED
    )
    engine.run_until_idle()

    burst = make_engine(
        registry=registry, executor=ScoringAgent(), config={"max_steps_per_tick": 2}
    )
    submit("burst", on=burst)
    burst.run_until_idle()

    retrying = make_engine(registry=registry, executor=ScoringAgent(fail_once={"revise"}))
    submit("retry", on=retrying)
    retrying.run_until_idle()
    clock.advance(timedelta(seconds=2))
    retrying.run_until_idle()

    submit("recovered")
    dead = engine.store.load(job_uuid(T, "recovered"))
    assert dead is not None
    now = clock.now()
    dead.claim(
        worker_id="dead", claim_id="c-dead", lease_until=now + timedelta(minutes=1),
        reason="queue", now=now,
    )  # fmt: skip
    engine.store.append(dead)
    clock.advance(timedelta(minutes=2))
    engine.tick(T, "recovered", "reconciler")
    return engine


MISSION_JOBS = ("timeout", "happy", "rejected", "early", "burst", "retry", "recovered")


def test_replay_against_its_own_definition_rebuilds_every_request_the_engine_resolved(
    make_engine: EngineFactory, clock: FakeClock
) -> None:
    live = RecordingRegistry(DefinitionRegistry([definition(MISSION_V1)]))
    engine = run_missions(make_engine, clock, live)
    statuses = {job: engine.job(T, job).status for job in MISSION_JOBS}
    assert statuses == {
        "timeout": JobStatus.FAILED,
        "happy": JobStatus.COMPLETED,
        "rejected": JobStatus.WAITING_EVENT,
        "early": JobStatus.WAITING_TIME,
        "burst": JobStatus.WAITING_EVENT,
        "retry": JobStatus.WAITING_EVENT,
        "recovered": JobStatus.WAITING_EVENT,
    }
    # The last request the engine resolved before each recorded step, per job.
    resolved = {(r.state["job"], r.current_step): r for r in live.requests}
    v1 = definition(MISSION_V1)
    for job in MISSION_JOBS:
        rebuilt: list[ResolveRequest] = []
        events = engine.store.events(job_uuid(T, job))
        report = replay_job(events, recording(v1, rebuilt), version=1)
        agrees = "safe to migrate" if not report.finished else f"{report.status}: replays the same"
        assert report.safe and report.verdict.startswith(agrees), (job, report.verdict)
        assert all(step.outcome == "same" for step in report.steps)
        assert len(rebuilt) == len(report.steps) == engine.job(T, job).current_step
        for request in rebuilt:
            original = resolved[(job, request.current_step)]
            if request.reason == "replay":  # not recorded for a pure step a tick began with
                request = replace(request, reason=original.reason)
            # The history before the step, read as the tick's reader reads it (a code
            # workflow replays against it), and no job: no registry's hot body is used.
            assert request.job_uuid is None and request.history is not None
            before = [event.originator_version for event in request.history(0)]
            assert before == list(range(1, request.version + 1))
            assert request.history(request.version) == []
            request = replace(
                request, job_uuid=original.job_uuid, version=original.version, history=None
            )
            assert request == replace(original, history=None), (job, request.current_step)
        assert engine.replay(T, job, v1).verdict == report.verdict
        assert engine.replay(T, job).safe  # the registry's version the job is on


def recording(v1: WorkflowDefinition, into: list[ResolveRequest]) -> Resolver:
    """The pure resolution of ``v1``, remembering every request replay rebuilt."""

    def resolver(request: ResolveRequest) -> Resolution:
        into.append(request)
        return resolve(v1, request)

    return resolver


# ---- time travel --------------------------------------------------------------------------


def test_job_at_a_version_or_a_moment_is_the_job_exactly_as_it_was(
    make_engine: EngineFactory, clock: FakeClock
) -> None:
    registry = DefinitionRegistry([definition(MISSION_V1)])
    engine = make_engine(
        registry=registry, executor=ScoringAgent(), config={"snapshot_interval": 4}
    )
    engine.submit(T, "j", "mission")
    engine.run_until_idle()
    waiting_since = clock.now()
    clock.advance(timedelta(hours=5))
    engine.signal(T, "j", "invoice.paid", {"paid": 3}, signal_id="s1")
    engine.run_until_idle()
    events = engine.store.events(job_uuid(T, "j"))
    assert len(events) > 8
    for version in range(1, len(events) + 1):
        expected = fold(events[:version])
        view = engine.job_at(T, "j", version=version)  # from a snapshot where there is one
        assert view.version == version
        assert (view.status, view.state, view.current_step, view.next_step) == (
            expected.status, expected.state, expected.current_step, expected.cursor,
        )  # fmt: skip
        assert view.total_cost_usd == expected.total_cost_usd
    assert engine.job_at(T, "j", version=len(events)) == engine.job(T, "j")
    first_wait = engine.job_at(T, "j", at=waiting_since + timedelta(hours=1))
    assert first_wait.status is JobStatus.WAITING_EVENT
    assert first_wait.wait_event_name == "invoice.paid"
    assert first_wait.state["score"] == 0.9 and "paid" not in first_wait.state
    now = engine.job_at(T, "j", at=clock.now())
    assert now.state["paid"] == 3 and now.status is JobStatus.WAITING_TIME
    with pytest.raises(NoSuchVersionError, match="did not exist yet"):
        engine.job_at(T, "j", at=waiting_since - timedelta(days=1))
    with pytest.raises(NoSuchVersionError, match="no v99"):
        engine.job_at(T, "j", version=99)
    with pytest.raises(NoSuchVersionError):
        engine.job_at(T, "j", version=0)
    with pytest.raises(NoSuchVersionError, match="not both"):
        engine.job_at(T, "j", version=1, at=clock.now())


# ---- replay: the decision diff ------------------------------------------------------------


@pytest.fixture
def waiting(make_engine: EngineFactory) -> Engine:
    """A mission job waiting for its payment: 7 steps recorded (plan, check, revise,
    check, revise, check, payment)."""
    engine = make_engine(
        registry=DefinitionRegistry([definition(MISSION_V1)]), executor=ScoringAgent()
    )
    engine.submit(T, "j", "mission")
    engine.run_until_idle()
    assert engine.job(T, "j").status is JobStatus.WAITING_EVENT
    return engine


@pytest.mark.parametrize(
    ("changes", "step", "outcome", "recorded", "would"),
    [
        (
            [('value: 0.8}, next: payment', 'value: 0.6}, next: payment')],
            4,
            "different next step",
            "'check' (branch) -> queued, next 'revise'",
            "'check' (branch) -> queued, next 'payment'",
        ),
        (
            [("timeout: {days: 2}", "timeout: {days: 1}")],
            7,
            "different wait",
            "timeout 2026-01-03T00:00:00+00:00",
            "timeout 2026-01-02T00:00:00+00:00",
        ),
        (
            [("kind: wait_event\n    event: invoice.paid\n    timeout: {days: 2}\n"
              "    on_timeout: chase\n",
              "kind: await_approval\n    on_reject: chase\n"),
             ("    next: cool\n", "    on_approve: cool\n")],
            7,
            "different status",
            "'payment' (wait_event) -> waiting_event for event 'invoice.paid'",
            "'payment' (await_approval) -> awaiting_approval",
        ),
        (
            [("  revise: {kind", "  rework: {kind"), ("default: revise", "default: rework"),
             ("on_reject: revise", "on_reject: rework")],
            2,
            "different next step",
            "next 'revise'",
            "next 'rework'",
        ),
    ],
)  # fmt: skip
def test_replay_names_the_first_divergence(
    waiting: Engine,
    changes: list[tuple[str, str]],
    step: int,
    outcome: str,
    recorded: str,
    would: str,
) -> None:
    report = waiting.replay(T, "j", definition(mission(2, *changes)))
    assert not report.safe
    first = report.diverged_at
    assert first is not None and first.step_number == step and first.outcome == outcome
    assert all(s.outcome == "same" for s in report.steps[: step - 1])
    assert report.verdict.startswith(f"diverges at step {step}: recorded ")
    head, _, tail = report.verdict.partition(", would now do ")
    assert recorded in head and would in tail, report.verdict
    assert report.definition_version == 2 and report.recorded_version == 1


def test_replay_sees_changed_params_the_executor_would_be_given(waiting: Engine) -> None:
    """Everything that reaches the executor is compared, not only where the job goes."""
    report = waiting.replay(
        T, "j", definition(mission(2, ("params: {task: revise}", "params: {task: rewrite}")))
    )
    assert not report.safe
    first = report.diverged_at
    assert first is not None and first.step_number == 3 and first.outcome == "different input"
    assert [s.outcome for s in report.steps[:2]] == ["same", "same"]
    assert report.verdict.endswith(
        "with other input (params, retry policy, or the step's own output)"
    )
    retried = waiting.replay(
        T,
        "j",
        definition(
            mission(2, ("max_visits: 3, params", "max_visits: 3, retry: {max_attempts: 5}, params"))
        ),
    )
    assert retried.diverged_at is not None and retried.diverged_at.step_number == 3
    assert waiting.replay(T, "j", definition(mission(2))).safe


def test_replay_reports_a_step_the_definition_no_longer_has(waiting: Engine) -> None:
    renamed = mission(
        2,
        ("  revise: {kind", "  rework: {kind"),
        ("default: revise", "default: rework"),
        ("on_reject: revise", "on_reject: rework"),
    )
    report = waiting.replay(T, "j", definition(renamed))
    third = report.steps[2]  # recorded at cursor 'revise', which v2 does not have
    assert third.replayed.error is not None and "unknown step 'revise'" in third.replayed.error
    assert "fail the job (resolution failed" in third.replayed.describe()
    same = waiting.replay(
        T, "j", definition(mission(2, ("delay: {hours: 1}", "delay: {hours: 2}")))
    )
    assert same.safe and len(same.steps) == 7  # the change lies ahead of the job


def test_replay_refuses_another_workflow_and_works_with_python_workflows(
    make_engine: EngineFactory,
) -> None:
    registry = default_registry()
    registry.register("timer", 2, linear_workflow([STEP, sleep_ms(86_400_000), STEP, DONE]))
    engine = make_engine(registry=registry)
    engine.submit(T, "j", "timer", workflow_version=1)
    engine.run_until_idle()
    assert engine.replay(T, "j").safe
    report = engine.replay(T, "j", version=2)
    assert report.diverged_at is not None and report.diverged_at.outcome == "different wait"
    with pytest.raises(UnknownWorkflowError):
        engine.replay(T, "j", version=7)
    with pytest.raises(ReplayError, match="runs workflow 'timer'"):
        engine.replay(T, "j", definition(MISSION_V1))


def test_replay_holds_a_resolution_that_failed_the_job_against_one_that_would_not(
    make_engine: EngineFactory,
) -> None:
    def broken(request: ResolveRequest) -> Resolution:
        if request.current_step == 1:
            raise KeyError("no such branch")
        return Resolution("run_interaction_task", JobStatus.QUEUED)

    registry = FunctionRegistry()
    registry.register("flaky", 1, broken)
    registry.register(
        "flaky", 2, linear_workflow([Resolution("complete", JobStatus.COMPLETED)] * 2)
    )
    engine = make_engine(registry=registry)
    engine.submit(T, "j", "flaky", workflow_version=1)
    engine.run_until_idle()
    assert engine.job(T, "j").status is JobStatus.FAILED
    same = engine.replay(T, "j")
    assert same.safe and same.steps[-1].recorded.error is not None
    fixed = engine.replay(T, "j", version=2)
    first = fixed.diverged_at
    assert first is not None and (first.step_number, first.outcome) == (1, "different status")
    second = fixed.steps[1]
    assert (
        second.outcome == "different status"
        and "resolution failed" in fixed.steps[1].recorded.describe()
    )


# ---- migration ----------------------------------------------------------------------------


def test_migrate_moves_a_waiting_job_only_when_replay_says_safe_or_when_forced(
    make_engine: EngineFactory, clock: FakeClock
) -> None:
    v2 = mission(2, ("delay: {hours: 1}", "delay: {hours: 2}"))  # ahead of a waiting job
    v3 = mission(3, ("value: 0.8}, next: payment", "value: 0.6}, next: payment"))
    registry = DefinitionRegistry([definition(MISSION_V1), definition(v2), definition(v3)])
    engine = make_engine(registry=registry, executor=ScoringAgent())
    for job in ("a", "b", "done"):
        engine.submit(T, job, "mission", workflow_version=1)
    engine.run_until_idle()
    engine.cancel(T, "done", reason="not needed", by="ops")

    with pytest.raises(MigrationRefusedError, match="cannot move to v3: replay diverges at step 4"):
        engine.migrate(T, "a", 3)
    view, report = engine.migrate(T, "a", 2, by="ops")
    assert report.safe and view.workflow_version == 2
    last = engine.history(T, "a")[-1]
    assert last.event_type == "Migrated"
    assert last.data == {
        "from_version": 1, "to_version": 2, "forced": False, "migrated_by": "ops",
        "reason": None, "replay_verdict": "safe to migrate",
    }  # fmt: skip
    assert engine.verify(T, "a") is None
    views = JobViews(store_of(engine))
    views.catch_up()
    assert {r.job_id: r.workflow_version for r in views.jobs()}["a"] == 2

    # It goes on under v2: the cooling-off timer is v2's two hours.
    engine.signal(T, "a", "invoice.paid", signal_id="pay-a")
    engine.run_until_idle()
    moved = engine.job(T, "a")
    assert moved.status is JobStatus.WAITING_TIME
    assert moved.resume_at == clock.now() + timedelta(hours=2)
    assert engine.replay(T, "a").safe  # its history replays on v2, the version it is on

    with pytest.raises(InvalidPayloadError, match="by"):
        engine.migrate(T, "b", 3, force=True)
    view, report = engine.migrate(T, "b", 3, force=True, by="alice", reason="v3 is right")
    assert view.workflow_version == 3 and not report.safe
    forced = engine.history(T, "b")[-1].data
    assert forced["forced"] is True and forced["migrated_by"] == "alice"
    assert forced["reason"] == "v3 is right"
    assert forced["replay_verdict"].startswith("diverges at step 4")

    with pytest.raises(MigrationRefusedError, match="cancelled"):
        engine.migrate(T, "done", 2)
    with pytest.raises(MigrationRefusedError, match="already on v3"):
        engine.migrate(T, "b", 3)
    with pytest.raises(UnknownWorkflowError):
        engine.migrate(T, "b", 9)

    # A worker mid-step: the step was resolved on the old version; wait till it parks.
    engine.submit(T, "busy", "mission", workflow_version=1)
    busy = engine.store.load(job_uuid(T, "busy"))
    assert busy is not None
    busy.claim(
        worker_id="w9", claim_id="c", lease_until=clock.now() + timedelta(minutes=5),
        reason="queue", now=clock.now(),
    )  # fmt: skip
    engine.store.append(busy)
    with pytest.raises(MigrationRefusedError, match="running a step"):
        engine.migrate(T, "busy", 2)


# ---- tamper evidence ----------------------------------------------------------------------


@pytest.fixture
def three_jobs(make_engine: EngineFactory) -> Engine:
    """Three finished jobs of 9 events each: Submitted, then per step a claim and the
    StepRecorded (v2..v9). One step per tick, so each claim is a Claimed of its own (a
    continuing step carries its claim in its record), and four side-effecting steps."""
    registry = FunctionRegistry()
    steps = [Resolution("run_interaction_task", JobStatus.QUEUED) for _ in range(3)]
    steps.append(Resolution("run_interaction_task", JobStatus.COMPLETED))
    registry.register("agent4", 1, linear_workflow(steps))
    engine = make_engine(registry=registry, config={"max_steps_per_tick": 1})
    for job in ("j1", "j2", "j3"):
        engine.submit(T, job, "agent4")
    engine.run_until_idle()
    return engine


@pytest.fixture
def signed_jobs(make_engine: EngineFactory) -> tuple[Engine, tamper.Signatures]:
    """The three jobs of ``three_jobs``, each event signed, and the keyring to verify by."""
    registry = FunctionRegistry()
    steps = [Resolution("run_interaction_task", JobStatus.QUEUED) for _ in range(3)]
    steps.append(Resolution("run_interaction_task", JobStatus.COMPLETED))
    registry.register("agent4", 1, linear_workflow(steps))
    key = SigningKey("k1", Ed25519PrivateKey.generate(), Window(datetime(2000, 1, 1, tzinfo=UTC)))
    signer = Ed25519Signer([key])
    engine = make_engine(registry=registry, config={"max_steps_per_tick": 1}, signer=signer)
    for job in ("j1", "j2", "j3"):
        engine.submit(T, job, "agent4")
    engine.run_until_idle()
    return engine, tamper.Signatures(Keyring(signer.public_keys()))


def test_rows_moved_between_jobs_are_caught_by_verify_load_and_export(
    signed_jobs: tuple[Engine, tamper.Signatures],
    store_url: str,
    tmp_path: Path,
    make_engine: EngineFactory,
) -> None:
    """Two jobs' rows swapped by an UPDATE of originator_id: each row is still the bytes
    hashed and signed, but they name the other job, and nothing reads them as this one's."""
    engine, signatures = signed_jobs
    store = store_of(engine)
    one, two = job_uuid(T, "j1"), job_uuid(T, "j2")
    assert tamper.verify_store(store, signatures=signatures).intact
    RawEvents(store_url).swap_jobs(one, two)

    report = tamper.verify_store(store, signatures=signatures)
    found = {check.job_uuid: check.broken for check in report.broken}
    assert set(found) == {one, two}
    for mine, theirs in ((one, "j2"), (two, "j1")):
        broken = found[mine]
        assert broken is not None
        assert (broken.version, broken.event_type, broken.kind) == (1, "Job.Submitted", "moved")
        assert f"{T}/{theirs}" in broken.reason and "another job" in broken.reason
    # A process holding none of these jobs in memory (the engine that ran them keeps each
    # as its last tick committed it, and reads only what comes after).
    with pytest.raises(BrokenHistoryError, match=f"{T}/j1 is broken"):
        make_engine().job(T, "j1")  # (folded from its snapshot on: the first row read is refused)
    with pytest.raises(BrokenHistoryError, match="broken at v1"):
        engine.store.events(one)

    for selection in (exporting.Selection(), exporting.Selection(T), exporting.Selection(T, "j2")):
        out = io.StringIO()
        summary = exporting.export_jobs(store, out, selection, FakeClock().now())
        assert len(summary.broken) == (1 if selection.job_id else 2), selection
        assert all("moved" in why for why in summary.broken)
        path = write(tmp_path / "moved.jsonl", out.getvalue())
        checked = verifier.verify(path)
        assert not checked.verified
        assert any("moved" in problem.reason for problem in checked.problems), checked.problems


def test_one_row_moved_into_another_job_is_caught_at_its_version(
    signed_jobs: tuple[Engine, tamper.Signatures], store_url: str
) -> None:
    engine, signatures = signed_jobs
    one, three = job_uuid(T, "j1"), job_uuid(T, "j3")
    RawEvents(store_url).swap_jobs(one, three, version=5)
    report = tamper.verify_store(store_of(engine), signatures=signatures)
    found = {check.job_uuid: check.broken for check in report.broken}
    assert set(found) == {one, three}
    assert all(b is not None and (b.version, b.kind) == (5, "moved") for b in found.values())
    with pytest.raises(BrokenHistoryError, match="broken at v5"):
        engine.store.events(one)  # (a load folds from a snapshot past v5)
    assert len(engine.store.events(job_uuid(T, "j2"))) == 9  # the others still read


def test_verify_and_the_standalone_verifier_name_the_same_first_bad_version(
    signed_jobs: tuple[Engine, tamper.Signatures], store_url: str, tmp_path: Path
) -> None:
    """One order of checks in both tools: the first version that fails, whichever check
    it fails (chain, signature or anchor), and a rolled-back history fails at the first
    anchored version it lacks."""
    engine, signatures = signed_jobs
    assert isinstance(signatures.keyring, Keyring)
    store, raw = store_of(engine), RawEvents(store_url)
    anchors = tmp_path / "anchors.jsonl"
    tamper.take_anchor(store, FileAnchorSink(anchors), FakeClock().now())
    one, two, three = (job_uuid(T, job) for job in ("j1", "j2", "j3"))
    # j2: v2 unsigned (its signature cut off the row), v8 edited.
    row = raw.rows(two)[1]
    raw.set_state(two, 2, row.topic, row.state[: row.state.index(b',"signature":')] + b"}")
    raw.replace_in_state(two, 8, "+00:00", "+01:00")
    # j3 rolled back to v1..v7 (anchored at v9); j1 deleted whole.
    assert raw.delete(three, 8, and_after=True) == 2
    assert raw.delete(one, 1, and_after=True) == 9

    report = tamper.verify_store(store, read_anchors(anchors), signatures=signatures)
    ours = {c.job_uuid: (c.broken.version, c.broken.kind) for c in report.broken if c.broken}
    assert ours == {one: (1, "deleted"), two: (2, "unsigned"), three: (8, "truncated")}

    keyring = write(tmp_path / "keyring.json", json.dumps(signatures.keyring.document()))
    export = tmp_path / "export.jsonl"
    export.write_text(exported(engine))
    for check in (standalone, independent):
        failing = check(export, keyring, anchors)
        assert failing == {str(one): 1, str(two): 2, str(three): 8}, check


def standalone(export: Path, keyring: Path, anchors: Path) -> dict[str, int]:
    report = verifier.verify(export, verifier.read_keyring(keyring), [anchors])
    return {job: found.failure.version for job, found in report.jobs.items() if found.failure}


def independent(export: Path, keyring: Path, anchors: Path) -> dict[str, int]:
    args = [str(export), "--keyring", str(keyring), "--anchors", str(anchors)]
    failing, _ = independent_verifier.run(independent_verifier.arguments(args))
    return {job: version for job, version in failing.items() if version is not None}


def only_broken(engine: Engine, anchors: Path | None = None) -> tamper.JobCheck:
    report = tamper.verify_store(
        store_of(engine), read_anchors(anchors) if anchors is not None else None
    )
    assert len(report.jobs) == 3 and report.events >= 24
    assert [check.label for check in report.broken] == [f"{T}/j2"]
    check = report.broken[0]
    assert check.broken is not None
    return check


def test_verify_names_an_edited_field(three_jobs: Engine, store_url: str) -> None:
    assert tamper.verify_store(store_of(three_jobs)).intact
    RawEvents(store_url).replace_in_state(job_uuid(T, "j2"), 3, '"s1":true', '"s1":false')
    broken = only_broken(three_jobs).broken
    assert broken is not None
    assert (broken.version, broken.event_type, broken.kind) == (3, "Job.StepRecorded", "edited")
    assert "does not match its chain hash" in broken.reason
    assert three_jobs.verify(T, "j2") is not None  # the engine's own check agrees


def test_verify_names_a_deleted_event(three_jobs: Engine, store_url: str) -> None:
    assert RawEvents(store_url).delete(job_uuid(T, "j2"), 5) == 1
    broken = only_broken(three_jobs).broken
    assert broken is not None
    assert (broken.version, broken.event_type, broken.kind) == (5, "(missing)", "deleted")
    assert "jumps from v4 to v6 (Job.Claimed)" in broken.reason


def test_verify_names_a_reordered_history(three_jobs: Engine, store_url: str) -> None:
    raw = RawEvents(store_url)
    raw.swap(job_uuid(T, "j2"), 4, 5)
    assert [r.topic.rpartition(".")[2] for r in raw.rows(job_uuid(T, "j2"))[3:5]] == [
        "StepRecorded",
        "Claimed",
    ]
    broken = only_broken(three_jobs).broken
    assert broken is not None
    assert (broken.version, broken.event_type, broken.kind) == (4, "Job.StepRecorded", "reordered")
    assert "the event stored at v5 (Job.Claimed) belongs at v4" in broken.reason


def test_verify_names_a_row_that_no_longer_decodes(three_jobs: Engine, store_url: str) -> None:
    raw, uuid = RawEvents(store_url), job_uuid(T, "j2")
    raw.set_state(uuid, 6, raw.rows(uuid)[5].topic, b"{not json")
    broken = only_broken(three_jobs).broken
    assert broken is not None
    assert (broken.version, broken.event_type, broken.kind) == (6, "Job.Claimed", "undecodable")


def test_verify_with_anchors_catches_a_truncated_history(
    three_jobs: Engine, store_url: str, tmp_path: Path
) -> None:
    anchors = tmp_path / "anchors.jsonl"
    anchor, _ = tamper.take_anchor(store_of(three_jobs), FileAnchorSink(anchors), FakeClock().now())
    assert len(anchor.heads) == 3 and {h.version for h in anchor.heads} == {9}
    assert RawEvents(store_url).delete(job_uuid(T, "j2"), 8, and_after=True) == 2
    assert tamper.verify_store(store_of(three_jobs)).intact  # consistent without anchors
    check = only_broken(three_jobs, anchors)
    assert check.broken is not None and check.anchored_version == 9
    assert (check.broken.version, check.broken.event_type, check.broken.kind) == (
        8, "(missing)", "truncated",
    )  # fmt: skip
    assert "anchored at v9" in check.broken.reason and "only v1..v7" in check.broken.reason


def test_verify_with_anchors_catches_a_rewritten_history_and_a_deleted_job(
    three_jobs: Engine, store_url: str, tmp_path: Path
) -> None:
    store = store_of(three_jobs)
    anchors = tmp_path / "anchors.jsonl"
    tamper.take_anchor(store, FileAnchorSink(anchors), FakeClock().now())
    # Rewrite j2 from v7 on with recomputed hashes: the chain is consistent again.
    raw, uuid = RawEvents(store_url), job_uuid(T, "j2")

    def free(event: Job.Event, fields: dict[str, Any]) -> None:
        if isinstance(event, Job.StepRecorded):
            fields["cost_usd"] = Decimal("0")

    raw.rehash_tail(store.events(uuid), 6, free)
    assert tamper.verify_store(store).intact
    check = only_broken(three_jobs, anchors)
    assert check.broken is not None
    assert (check.broken.version, check.broken.event_type, check.broken.kind) == (
        9, "Job.StepRecorded", "rewritten",
    )  # fmt: skip

    assert raw.delete(job_uuid(T, "j3"), 1, and_after=True) == 9
    report = tamper.verify_store(store, read_anchors(anchors))
    gone = {c.label: c.broken for c in report.broken}[f"{T}/j3"]
    assert gone is not None and gone.kind == "deleted" and "holds no event" in gone.reason


def test_anchor_refuses_a_broken_chain_and_an_edited_anchor_file_is_reported(
    three_jobs: Engine, store_url: str, tmp_path: Path
) -> None:
    store, anchors, clock = store_of(three_jobs), tmp_path / "anchors.jsonl", FakeClock()
    tamper.take_anchor(store, FileAnchorSink(anchors), clock.now())
    tamper.take_anchor(store, FileAnchorSink(anchors), clock.now(), read_anchors(anchors))
    log_ = read_anchors(anchors)
    assert len(log_.anchors) == 2 and not log_.problems
    assert log_.anchors[1].previous_sha256 is not None
    lines = anchors.read_text().splitlines()
    first = json.loads(lines[0])
    first["heads"][0]["version"] = 8
    anchors.write_text(json.dumps(first) + "\n" + lines[1] + "\n")
    problems = read_anchors(anchors).problems
    assert any("line 1: the Merkle root does not match" in p for p in problems)
    assert any("line 2: does not follow the line before it" in p for p in problems)
    assert not tamper.verify_store(store, read_anchors(anchors)).intact

    RawEvents(store_url).replace_in_state(job_uuid(T, "j2"), 3, '"s1":true', '"s1":false')
    fresh = tmp_path / "fresh.jsonl"
    with pytest.raises(AnchorRefusedError, match=f"{T}/j2: v3 Job.StepRecorded"):
        tamper.take_anchor(store, FileAnchorSink(fresh), clock.now())
    assert not fresh.exists()


# ---- export and import --------------------------------------------------------------------


def exported(engine: Engine, selection: exporting.Selection | None = None) -> str:
    out = io.StringIO()
    exporting.export_jobs(
        store_of(engine), out, selection or exporting.Selection(), FakeClock().now()
    )
    return out.getvalue()


def test_export_then_import_into_an_empty_store_reproduces_every_job_and_key(
    make_engine: EngineFactory, clock: FakeClock, fresh_store_url: str, tmp_path: Path
) -> None:
    registry = DefinitionRegistry([definition(MISSION_V1)])
    source = run_missions(make_engine, clock, registry)
    text = exported(source)
    lines = [json.loads(line) for line in text.splitlines()]
    manifest = lines[-1]
    assert manifest["record"] == "manifest" and manifest["format"] == "jobledger.export/2"
    assert manifest["jobs"] == len(MISSION_JOBS) and manifest["events"] == len(lines) - 1
    assert text.splitlines()[0] == chain.canonical_json(lines[0])  # canonical lines
    assert standalone_verify(lines[:-1]) == {h["chain_hash"] for h in manifest["heads"].values()}

    path = tmp_path / "export.jsonl"
    path.write_text(text)
    target = make_engine(store_url=fresh_store_url, registry=registry, executor=ScoringAgent())
    summary = exporting.import_file(store_of(target), path)
    assert (summary.jobs, summary.events) == (len(MISSION_JOBS), len(lines) - 1)
    for job in MISSION_JOBS:
        uuid = job_uuid(T, job)
        before, after = source.store.events(uuid), target.store.events(uuid)
        assert [vars(e) for e in after] == [vars(e) for e in before]
        assert [type(e) for e in after] == [type(e) for e in before]
        assert target.job(T, job) == source.job(T, job)
        for key in exporting.consumed_keys(before):
            assert target.store.find_key(uuid if key.kind != "submit" else key.id, key.id)
    assert tamper.verify_store(store_of(target)).intact
    assert exported(target) == text  # byte for byte, the manifest's time aside (fixed here)

    # At most once still holds after the import: the keys came with the events.
    assert target.signal(T, "happy", "invoice.paid", signal_id="s-happy") is (
        SignalOutcome.DUPLICATE
    )
    again = target.submit(
        T, "happy", "mission", input={"job": "happy"}, idempotency_key="key-happy"
    )
    assert again.job_id == "happy"
    with pytest.raises(IdempotencyKeyReusedError, match="'happy'"):  # the key names its request
        target.submit(T, "other", "mission", input={"job": "happy"}, idempotency_key="key-happy")
    with pytest.raises(ApprovalAlreadyDecidedError):
        target.decide(T, "happy", "happy:step:9:approval", "approve", "lead")
    waiting = target.job(T, "rejected")
    target.signal(T, "rejected", "invoice.paid", signal_id="s-rejected-2")
    target.run_until_idle()
    assert target.job(T, "rejected").current_step == waiting.current_step + 1  # it goes on

    with pytest.raises(ImportRefusedError, match="not empty"):
        exporting.import_file(store_of(target), path)


def standalone_verify(lines: list[dict[str, Any]]) -> set[str]:
    """The chains of an export, recomputed with the standard library alone."""
    import hashlib

    heads: dict[str, str] = {}
    for line in lines:
        fields = {
            "originator_id": line["job_uuid"],
            "originator_version": line["version"],
            "timestamp": line["timestamp"],
            **line["data"],
        }
        document = {"type": "Job." + line["type"], "fields": fields}
        body = json.dumps(document, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
        digest = hashlib.sha256(heads.get(line["job_uuid"], "").encode() + body.encode())
        assert digest.hexdigest() == line["chain_hash"], (line["job"], line["version"])
        heads[line["job_uuid"]] = line["chain_hash"]
    return set(heads.values())


def test_import_refuses_a_file_that_does_not_verify_and_writes_nothing(
    three_jobs: Engine, fresh_store_url: str, tmp_path: Path, make_engine: EngineFactory
) -> None:
    text = exported(three_jobs)
    lines = text.splitlines()
    target = store_of(make_engine(store_url=fresh_store_url))

    def refused(name: str, content: str, match: str, *, verifies: bool = False) -> None:
        path = tmp_path / f"{name}.jsonl"
        path.write_text(content)
        # Import refuses all that jobledger-verify refuses (and, to write, a little more).
        assert verifier.verify(path).verified is verifies, name
        with pytest.raises(ImportRefusedError, match=match):
            exporting.import_file(target, path)
        assert log.is_empty(target)

    edited = lines[:]
    edited[2] = edited[2].replace('"s1":true', '"s1":false')
    assert edited[2] != lines[2]
    refused("edited", "\n".join(edited), "v3: the chain hash does not match the event")
    refused("truncated", "\n".join(lines[:-1]), "no manifest")
    refused(
        "short",
        "\n".join(lines[:8] + lines[9:]),
        "manifest: counts 3 jobs and 27 events; the file holds 3 and 26",
    )
    manifest = json.loads(lines[-1])
    manifest["heads"][str(job_uuid(T, "j1"))]["chain_hash"] = "0" * 64
    refused("manifest", "\n".join([*lines[:-1], chain.canonical_json(manifest)]), "heads differ")
    extra = json.loads(lines[1])
    extra["data"]["sneaky"] = 1
    extended = [lines[0], chain.canonical_json(extra), *lines[2:]]
    refused("field", "\n".join(extended), "v2: the chain hash does not match")
    j1 = str(job_uuid(T, "j1"))
    sneaky = rehash(edit_event(lines, j1, 2, lambda e: e["data"].update(sneaky=1)), j1, 2, None)
    refused("rehashed", "\n".join(fix_manifest(sneaky)), "sneaky", verifies=True)
    shuffled = [lines[0], lines[9], *lines[1:9], *lines[10:]]
    refused("shuffled", "\n".join(shuffled), "not contiguous", verifies=True)
    refused("garbage", "not json\n", "line 1: not a JSON object")
    respaced = [*lines[:3], json.dumps(json.loads(lines[3])), *lines[4:]]
    refused("respaced", "\n".join(respaced), "v4: the line is not canonical JSON")
    renamed = json.loads(lines[4])
    renamed["tenant"] = "other"
    refused(
        "tenant",
        "\n".join([*lines[:4], chain.canonical_json(renamed), *lines[5:]]),
        f"v5: tenant 'other' and job '{renamed['job']}' do not name this job_uuid",
    )

    good = write(tmp_path / "good.jsonl", text)
    assert verifier.verify(good).verified
    exporting.import_file(target, good)
    assert not log.is_empty(target)


def write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def test_export_one_job_or_one_tenant(make_engine: EngineFactory) -> None:
    engine = make_engine()
    engine.submit(T, "a", "agent3")
    engine.submit("other", "b", "agent3")
    engine.run_until_idle()
    one = [json.loads(line) for line in exported(engine, exporting.Selection(T, "a")).splitlines()]
    assert {line.get("job") for line in one[:-1]} == {"a"} and one[-1]["jobs"] == 1
    tenant = exported(engine, exporting.Selection("other")).splitlines()
    assert json.loads(tenant[-1])["heads"].keys() == {str(job_uuid("other", "b"))}
    everything = json.loads(exported(engine).splitlines()[-1])
    assert everything["jobs"] == 2 and everything["selection"] == {"all": True}


def test_the_raw_log_lists_every_job_and_reads_them_in_batches(make_engine: EngineFactory) -> None:
    registry = FunctionRegistry()
    registry.register("once", 1, linear_workflow([Resolution("complete", JobStatus.COMPLETED)]))
    engine = make_engine(config={"partitions": 3}, registry=registry)
    for n in range(7):
        engine.submit(T, f"j{n}", "once", idempotency_key=f"k{n}")
    engine.run_until_idle()
    store = store_of(engine)
    uuids = log.job_uuids(store)
    assert uuids == sorted(job_uuid(T, f"j{n}") for n in range(7))
    read = dict(log.read_jobs(store, [*uuids, UUID(int=1)], batch=3))
    assert all(len(read[u]) == 2 for u in uuids) and read[UUID(int=1)] == []  # no claim
    assert tamper.verify_store(store).intact and tamper.verify_store(store).events == 14
