"""``jobledger demo``: the demo mission, phase by phase, then a summary and its checks.

Two workers (two Engines) share one store. worker-1 crashes inside a step; worker-2
takes over once the lease lapses. The demo plays the outside world (the fact-checker
with its resume token, the reviewer) and the reconciler, and moves a FakeClock so that
days of waiting take no time.
"""

from __future__ import annotations

import secrets
import shutil
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any
from uuid import uuid4

from pydantic import SecretStr
from rich.console import Console
from rich.padding import Padding
from rich.table import Table
from rich.text import Text

from jobledger.adapters.clock import FakeClock
from jobledger.adapters.notifier import MemoryNotifier
from jobledger.adapters.ops import MemoryOps
from jobledger.config import EngineConfig
from jobledger.demo import fan_out_documents, field_notes, mission_code, mission_document
from jobledger.demo.agent import DemoAgent, EffectsLedger, SimulatedCrash, paragraphs, words
from jobledger.demo.outside import REVIEWER, fact_check
from jobledger.domain.errors import TokenReplayedError
from jobledger.domain.redaction import redact
from jobledger.domain.status import JobStatus
from jobledger.domain.views import HistoryEntry, JobView
from jobledger.engine.bootstrap import Parts
from jobledger.engine.engine import Engine
from jobledger.presentation.figures import money, when
from jobledger.presentation.history import history_table
from jobledger.workflows import DefinitionRegistry, parse_definition
from jobledger.workflows.tasks import RESULT_KEY

START = datetime(2026, 5, 4, 9, 0, tzinfo=UTC)
CEILING = Decimal("0.50")
LEASE = timedelta(seconds=30)


@dataclass(frozen=True)
class Mission:
    """One way of writing the demo mission: where it is written, what its workflows and
    steps are called, and where its records keep what the checks look at."""

    workflow: str
    fan_out: str
    written: str
    survey: str
    crash: str
    """The step (and the agent's task) worker-1 crashes in."""
    timer: str
    event: str
    draft: str
    publish: str
    code: bool

    def output(self, step: HistoryEntry) -> dict[str, Any]:
        """A run step's output as the agent made it (code steps record their return)."""
        output: dict[str, Any] = step.data["output"]
        return output[RESULT_KEY] if self.code else output

    def brief(self, view: JobView) -> str:
        return str((view.state[RESULT_KEY] if self.code else view.state)["brief"])

    def paragraph_words(self, view: JobView) -> dict[str, int]:
        """Each child job's word count, from the parent's joined results."""
        if self.code:
            return {r["job_id"]: r["words"] for r in view.state.get(RESULT_KEY) or []}
        results = view.state.get("paragraphs", [])
        return {r["job_id"]: r.get("result", {}).get("words", 0) for r in results}


DECLARATIVE = Mission(
    workflow="demo_mission",
    fan_out="demo_fan_out",
    written="definition: jobledger/demo/mission.yaml in the package "
    "(copy it from examples/definitions/demo_mission.v1.yaml)",
    survey="survey",
    crash="summarise",
    timer="cool_off",
    event="fact_check",
    draft="draft",
    publish="publish",
    code=False,
)
CODE = Mission(
    workflow=mission_code.MISSION,
    fan_out=mission_code.FAN_OUT,
    written="written as code: @workflow bodies and @step functions in "
    "jobledger/demo/mission_code.py in the package",
    survey="count_words",
    crash="summarise",
    timer="sleep",
    event="wait_event",
    draft="draft_brief",
    publish="publish",
    code=True,
)


@dataclass(frozen=True)
class Check:
    name: str
    ok: bool
    detail: str


@dataclass
class Demo:
    out: Console
    base: EngineConfig
    directory: Path
    store_url: str
    tenant: str
    job: str
    fresh: bool
    mission: Mission = DECLARATIVE
    clock: FakeClock = field(default_factory=lambda: FakeClock(START))
    text: str = field(default_factory=field_notes)
    outside: MemoryNotifier = field(default_factory=MemoryNotifier)
    ops: MemoryOps = field(default_factory=MemoryOps)
    secret: str = field(default_factory=lambda: secrets.token_urlsafe(32))
    shown: int = 0
    replay_refusal: str | None = None
    crash: str | None = None

    def __post_init__(self) -> None:
        self.ledger = EffectsLedger(self.directory)
        documents = [("mission.yaml", mission_document()), *fan_out_documents()]
        self.registry = DefinitionRegistry(parse_definition(text, name) for name, text in documents)

    @property
    def fan_out_job(self) -> str:
        return f"{self.job}-fan-out"

    # ---- plumbing ------------------------------------------------------------------------

    def engine(self, worker: str, agent: DemoAgent) -> Engine:
        config = self.base.model_copy(
            update={
                "store_url": self.store_url,
                "worker_id": worker,
                "cost_ceiling_usd": CEILING,
                "tenant_cost_ceilings_usd": {},
                "token_secret": SecretStr(self.secret),
                "lease_ms": int(LEASE.total_seconds() * 1000),
                "resume_mode": "queue",
                # The demo drives its own in-process queue on a fake clock, whatever
                # transport the environment configures for real workers.
                "transport": "local",
            }
        )
        parts: Parts = {"clock": self.clock, "notifier": self.outside, "ops": self.ops}
        if self.mission.code:
            parts["workflows"] = mission_code.mission_workflows(agent)
        else:
            parts["registry"], parts["executor"] = self.registry, agent
        return Engine.open(config=config, **parts)

    def phase(self, title: str) -> None:
        self.out.print()
        self.out.rule(Text(title, style="bold"), align="left")

    def say(self, text: str, style: str = "") -> None:
        # A hanging indent: a wrapped line stays under its first, not at column 0.
        self.out.print(Padding(Text(text, style=style), (0, 0, 0, 2), expand=False))

    def timeline(self, engine: Engine) -> None:
        """The events appended since the last look."""
        entries = engine.history(self.tenant, self.job)
        if len(entries) > self.shown:
            self.out.print(history_table(entries[self.shown :], seconds=True))
        self.shown = len(entries)

    # ---- the mission -------------------------------------------------------------------

    def run(self) -> Engine:
        self.intro()
        self.worker_one_crashes()
        engine = self.engine("worker-2", DemoAgent(self.text, self.ledger))
        self.worker_two_takes_over(engine)
        self.durable_timer(engine)
        self.outside_event(engine)
        self.human_approval(engine)
        self.cost_ceiling(engine)
        self.fan_out(engine)
        return engine

    def intro(self) -> None:
        self.out.print(
            f"jobledger demo: the example mission {self.mission.workflow!r} v1, "
            f"job {self.tenant}/{self.job}"
        )
        self.say(self.mission.written)
        fresh = " (a fresh temporary file)" if self.fresh else ""
        self.say(f"store: {redact(self.store_url)}{fresh}")
        self.say(
            f"time is simulated with a FakeClock from {when(START)}: the 3-day timer and the "
            "wait until midnight run instantly"
        )
        self.say(
            f"tenant cost ceiling {money(CEILING)} per UTC day; lease {LEASE.seconds} s; "
            "two workers (two Engines) share the store"
        )

    def worker_one_crashes(self) -> None:
        self.phase("1. worker-1 runs the agent steps and crashes inside step 2")
        agent = DemoAgent(self.text, self.ledger, crash_after=self.mission.crash)
        engine = self.engine("worker-1", agent)
        engine.submit(
            self.tenant,
            self.job,
            self.mission.workflow,
            input={"source": "field_notes.txt"},
            idempotency_key=f"{self.job}-request",
        )
        try:
            engine.run_until_idle()
        except SimulatedCrash as crash:
            self.crash = str(crash)
        self.timeline(engine)
        view = engine.job(self.tenant, self.job)
        engine.close()  # the worker is gone, and its in-process queue with it
        self.say(f"crash: SimulatedCrash: {self.crash}", style="red")
        self.say(
            f"step 2 did its work and wrote its side effect, but was never recorded: the job "
            f"is {view.status} under worker-1's lease until {when(view.lease_until)}"
        )

    def worker_two_takes_over(self, engine: Engine) -> None:
        self.phase("2. worker-2, a fresh Engine on the same store, takes over after the lease")
        report = engine.tick(self.tenant, self.job, "reconciler")
        self.say(
            f"at {when(self.clock.now())} worker-2 finds the lease still live: {report.outcome} "
            "(it will look again when the lease lapses)"
        )
        lease_until = engine.job(self.tenant, self.job).lease_until
        assert lease_until is not None
        self.clock.set(lease_until + timedelta(seconds=1))
        engine.run_until_idle()
        self.timeline(engine)
        self.say(
            "worker-2 re-ran step 2 with the same idempotency key; step 1, recorded before "
            "the crash, was not re-run"
        )

    def durable_timer(self, engine: Engine) -> None:
        self.phase("3. a durable timer: three days")
        resume_at = engine.job(self.tenant, self.job).resume_at
        assert resume_at is not None
        self.say(f"the job sleeps until {when(resume_at)}; the fake clock jumps there")
        self.clock.set(resume_at)
        engine.run_until_idle()
        self.timeline(engine)

    def outside_event(self, engine: Engine) -> None:
        self.phase("4. a wait for an outside event, resumed with a signed token")
        event, token = self.outside.tokens[-1]
        self.say(
            f"the notifier handed the fact-checker a signed resume token for {event!r} "
            f"(nonce {token.nonce}); the store keeps only its nonce and hash"
        )
        self.clock.advance(timedelta(hours=2))
        answer = fact_check(self.survey(engine)["words"], self.text)
        engine.resume(token.token, answer)
        self.say(f"two hours later the fact-checker resumes the job: {answer['fact_check']}")
        try:
            engine.resume(token.token, answer)
        except TokenReplayedError as refused:
            self.replay_refusal = str(refused)
            self.say(f"sending the same token again is refused: {refused}")
        engine.run_until_idle()
        self.timeline(engine)

    def human_approval(self, engine: Engine) -> None:
        self.phase("5. a human approval (decided by the demo itself)")
        request = self.outside.approvals[-1]
        self.say(
            f"approval {request.approval_id} requested from {', '.join(request.approvers)}, "
            f"expires {when(request.expires_at)}"
        )
        engine.decide(
            self.tenant,
            self.job,
            request.approval_id,
            "approve",
            REVIEWER,
            "approved by the demo itself, standing in for a person",
        )
        self.say(f"the demo approves it as {REVIEWER!r} (standing in for a person)")
        engine.run_until_idle()
        self.timeline(engine)

    def cost_ceiling(self, engine: Engine) -> None:
        self.phase("6. the tenant's daily cost ceiling defers the last step to midnight")
        view = engine.job(self.tenant, self.job)
        assert view.resume_at is not None
        self.say(
            f"today's spend reached the {money(CEILING)} ceiling: 'publish' waits until "
            f"{when(view.resume_at)}; the fake clock jumps there"
        )
        self.clock.set(view.resume_at)
        engine.run_until_idle()
        self.timeline(engine)

    def fan_out(self, engine: Engine) -> None:
        self.phase("7. a fan-out mission: one child job per paragraph, then a join")
        self.say(
            f"job {self.fan_out_job} runs {self.mission.fan_out!r}: its map step spawns one "
            "child job per paragraph and waits for all of them"
        )
        engine.submit(self.tenant, self.fan_out_job, self.mission.fan_out)
        engine.run_until_idle()
        entries = engine.history(self.tenant, self.fan_out_job)
        self.out.print(history_table(entries, seconds=True))
        children = Table(title="children")
        for column in ("child job", "workflow", "status", "words"):
            children.add_column(column, overflow="fold")
        counts = self.mission.paragraph_words(engine.job(self.tenant, self.fan_out_job))
        for child in engine.family(self.tenant, self.fan_out_job).children:
            children.add_row(child.job_id, child.workflow, child.status, str(counts[child.job_id]))
        self.out.print(children)
        self.say(
            "each child's end was reported to the parent by the engine as it happened; the "
            "join handed every child's result back, in paragraph order"
        )

    # ---- what it shows ----------------------------------------------------------------

    def steps(self, engine: Engine) -> dict[str, HistoryEntry]:
        """The mission's recorded steps by name."""
        history = engine.history(self.tenant, self.job)
        return {e.data["step_name"]: e for e in history if e.event_type == "StepRecorded"}

    def survey(self, engine: Engine) -> dict[str, Any]:
        return self.mission.output(self.steps(engine)[self.mission.survey])

    def checks(self, engine: Engine) -> list[Check]:
        history = engine.history(self.tenant, self.job)
        steps = self.steps(engine)
        view = engine.job(self.tenant, self.job)
        return [
            self.check_agent(steps),
            self.check_crash(history, steps),
            self.check_no_rerun(history),
            self.check_timer(steps),
            self.check_event(history, view.state),
            self.check_approval(history),
            self.check_ceiling(history, steps),
            Check(
                "completed",
                view.status is JobStatus.COMPLETED and view.total_cost_usd == Decimal("1.40"),
                f"{view.status} after {view.total_steps_executed} steps, "
                f"cost {money(view.total_cost_usd)}",
            ),
            Check(
                "chain verified",
                engine.verify(self.tenant, self.job) is None,
                f"{len(history)} events, each hash links to the one before",
            ),
            self.check_fan_out(engine),
        ]

    def check_fan_out(self, engine: Engine) -> Check:
        view = engine.job(self.tenant, self.fan_out_job)
        family = engine.family(self.tenant, self.fan_out_job).children
        results = self.mission.paragraph_words(view)
        counted = sum(results.values())
        keys = [(k, task) for (k, task) in self.ledger.executions() if task == "count_paragraph"]
        runs = [self.ledger.executions()[key] for key in keys]
        ok = (
            view.status is JobStatus.COMPLETED
            and len(family) == len(paragraphs(self.text)) == len(results)
            and all(child.status == JobStatus.COMPLETED for child in family)
            and runs == [1] * len(family)
            and counted == len(words(self.text))
        )
        detail = (
            f"{len(family)} children spawned once each, all completed and joined: "
            f"{counted} words in all"
        )
        return Check("fan-out join", ok, detail)

    def check_agent(self, steps: dict[str, HistoryEntry]) -> Check:
        survey = steps[self.mission.survey]
        found = self.mission.output(survey)["words"]
        cost = survey.data["cost_usd"]
        ok = found == len(words(self.text)) and cost == Decimal("0.20")
        detail = (
            f"{self.mission.survey!r} counted {found} words in the bundled field notes "
            f"for {money(cost)}"
        )
        return Check("agent step", ok, detail)

    def check_crash(self, history: list[HistoryEntry], steps: dict[str, HistoryEntry]) -> Check:
        crashed = self.mission.crash
        key = steps[crashed].data["idempotency_key"]
        runs = self.ledger.executions()[(key, crashed)]
        takeovers = [
            e
            for e in history
            if e.event_type == "Claimed" and e.data["previous_worker_id"] == "worker-1"
        ]
        ok = (
            self.crash is not None
            and runs == 2
            and steps[crashed].data["worker_id"] == "worker-2"
            and len(takeovers) == 1
            and "job.step.recovered" in self.ops.types(self.job)
        )
        detail = f"{key} ran {runs} times (crash, then takeover), recorded once by worker-2"
        return Check("worker crash", ok, detail)

    def check_no_rerun(self, history: list[HistoryEntry]) -> Check:
        numbers = [e.data["step_number"] for e in history if e.event_type == "StepRecorded"]
        runs = self.ledger.executions()
        others = {key: n for (key, task), n in runs.items() if task != self.mission.crash}
        ok = (
            numbers == list(range(1, len(numbers) + 1))
            and all(n == 1 for n in others.values())
            and len(self.ledger.outbox_entries()) == len(runs)
        )
        detail = (
            f"{len(numbers)} steps recorded once each; every other side effect ran once; "
            f"the outbox holds one entry per key ({len(self.ledger.outbox_entries())})"
        )
        return Check("no step re-run", ok, detail)

    def check_timer(self, steps: dict[str, HistoryEntry]) -> Check:
        timer = steps[self.mission.timer].data
        waited = timer["resume_at"] - timer["ended_at"]
        woke = steps[self.mission.event].data["started_at"]
        ok = waited == timedelta(days=3) and woke >= timer["resume_at"]
        return Check("durable timer", ok, f"slept {waited.days} days, woke at {when(woke)}")

    def check_event(self, history: list[HistoryEntry], state: Mapping[str, object]) -> Check:
        _, token = self.outside.tokens[-1]
        resumed = [e for e in history if e.event_type == "Resumed"]
        ok = (
            len(resumed) == 1
            and resumed[0].data["nonce"] == token.nonce
            and self.replay_refusal is not None
            and state.get("fact_check", {}).get("confirmed") is True  # type: ignore[attr-defined]
        )
        detail = f"resumed once by token nonce {token.nonce}; the replayed token was refused"
        return Check("outside event", ok, detail)

    def check_approval(self, history: list[HistoryEntry]) -> Check:
        decided = [e for e in history if e.event_type == "ApprovalDecided"]
        ok = len(decided) == 1 and decided[0].data["decided_by"] == REVIEWER
        verdict = decided[0].data["decision"] if decided else "nothing"
        return Check("human approval", ok, f"{verdict} by {REVIEWER} (the demo itself)")

    def check_ceiling(self, history: list[HistoryEntry], steps: dict[str, HistoryEntry]) -> Check:
        deferred = [e for e in history if e.event_type == "CostCeilingDeferred"]
        draft_day = steps[self.mission.draft].data["ended_at"].date()
        midnight = datetime.combine(draft_day + timedelta(days=1), datetime.min.time(), UTC)
        ok = (
            len(deferred) == 1
            and deferred[0].data["resume_at"] == midnight
            and steps[self.mission.publish].data["started_at"] >= midnight
        )
        detail = f"{self.mission.publish!r} deferred to {when(midnight)}, then ran"
        return Check("cost ceiling", ok, detail)

    def summary(self, engine: Engine, checks: list[Check]) -> bool:
        self.phase("summary")
        steps = Table(title="steps")
        for column in ("#", "step", "kind", "by", "at (UTC)", "cost"):
            steps.add_column(column, overflow="fold")  # narrow terminals wrap, never cut
        for e in engine.history(self.tenant, self.job):
            if e.event_type == "StepRecorded":
                d = e.data
                steps.add_row(
                    str(d["step_number"]),
                    d["step_name"],
                    d["step_type"],
                    d["worker_id"] or "engine",
                    d["ended_at"].strftime("%Y-%m-%d %H:%M:%S"),
                    money(d["cost_usd"]) if d["cost_usd"] else "-",
                )
        self.out.print(steps)
        effects = Table(title="side effects per idempotency key")
        for column in ("key", "task", "executions", "outbox entries"):
            effects.add_column(column, overflow="fold")
        outbox = self.ledger.outbox_entries()
        for (key, task), runs in sorted(self.ledger.executions().items()):
            effects.add_row(key, task, str(runs), str(outbox.count(key)))
        self.out.print(effects)
        view = engine.job(self.tenant, self.job)
        self.say(f"total cost {money(view.total_cost_usd)}; the brief: {self.mission.brief(view)}")
        self.out.print()
        for check in checks:
            mark = ("PASS", "green") if check.ok else ("FAIL", "red")
            line = Text.assemble(mark, f"  {check.name:<15} {check.detail}")
            self.out.print(Padding(line, (0, 0, 0, 2), expand=False))
        failed = [check.name for check in checks if not check.ok]
        if failed:
            self.out.print(f"{len(failed)} check(s) FAILED: {', '.join(failed)}", style="red")
        else:
            self.out.print(f"all {len(checks)} checks passed", style="green")
        return not failed


def run_demo(
    *, base: EngineConfig, store_url: str | None, keep: bool, out: Console, code: bool = False
) -> bool:
    """Run the demo; True if every check passed. A given ``store_url`` gets a job id of
    its own, so the demo can run there again; otherwise a fresh temporary file is used.
    ``code``: run the mission written as code (mission_code.py) instead of its YAML."""
    directory = Path(tempfile.mkdtemp(prefix="jobledger-demo-"))
    suffix = "" if store_url is None else f"-{uuid4().hex[:8]}"
    demo = Demo(
        out=out,
        base=base,
        directory=directory,
        store_url=store_url or f"sqlite:///{directory / 'demo.db'}",
        tenant=f"demo-tenant{suffix}",
        job=f"mission-1{suffix}",
        fresh=store_url is None,
        mission=CODE if code else DECLARATIVE,
    )
    try:
        engine = demo.run()
        try:
            return demo.summary(engine, demo.checks(engine))
        finally:
            engine.close()
    finally:
        if keep:
            # The command on a line of its own, never wrapped, so it pastes as it is.
            out.print(f"\nkept {directory}; try:")
            command = f"jobledger history {demo.tenant} {demo.job} --store {redact(demo.store_url)}"
            out.print(command, soft_wrap=True)
        else:
            shutil.rmtree(directory, ignore_errors=True)
