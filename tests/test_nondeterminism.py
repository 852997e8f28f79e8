"""Issue 26 item 3: a code workflow whose body no longer replays its history.

A job runs to a wait under the original code; then a NEW engine (a cold replay, as after a
deploy) runs changed code on the same store: a step renamed, two steps reordered, a step
inserted before recorded ones, a step removed, a changed wait. Each time the job is left
as it was (never failed, no step recorded), blocked with a NonDeterminismError naming the
step and both sides, shown by ``show``, ``list``, the HTTP API and an ops event; the
original code then finishes it. ``jobledger replay --workflows`` lists exactly that job
before the deploy. A step appended after the recorded ones is no divergence.
"""

from __future__ import annotations

import importlib.util
import json
import textwrap
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from jobledger import (
    CodeWorkflow,
    Engine,
    EngineConfig,
    FakeClock,
    JobStatus,
    NonDeterminismError,
    Tick,
)
from jobledger.adapters.ops import MemoryOps
from jobledger.api.auth import Role
from jobledger.projections import JobViews
from tests.support.cli import run_jobledger
from tests.support.engines import TOKEN_SECRET
from tests.support.http import start_api

STEPS = """
from datetime import timedelta

from jobledger import WorkflowContext, step, workflow


@step
def a(topic: str) -> str:
    return f"a({topic})"


@step
def b(text: str) -> str:
    return f"b({text})"


@step
def c(text: str) -> str:
    return f"c({text})"


@step
def x(text: str) -> str:
    return f"x({text})"


@step("a_renamed")
def a2(topic: str) -> str:
    return f"a2({topic})"


@workflow("mission", version=1)
async def mission(wf: WorkflowContext, topic: str) -> str:
"""

SLEEPS = """
first = await wf.step(a, topic)
second = await wf.step(b, first)
await wf.sleep(timedelta(hours=1))
return await wf.step(c, second)
"""
WAITS = """
first = await wf.step(a, topic)
second = await wf.step(b, first)
await wf.wait_event("reply", timeout=timedelta(hours=1))
return await wf.step(c, second)
"""


@dataclass(frozen=True)
class Change:
    original: str
    changed: str
    step: int
    recorded: str
    requested: str


CHANGES = {
    "renamed": Change(
        SLEEPS,
        SLEEPS.replace("wf.step(a, topic)", "wf.step(a2, topic)"),
        1,
        "step 'a'",
        "step 'a_renamed'",
    ),
    "reordered": Change(
        SLEEPS,
        SLEEPS.replace("wf.step(a, topic)", "wf.step(TMP, topic)")
        .replace("wf.step(b, first)", "wf.step(a, first)")
        .replace("TMP", "b"),
        1,
        "step 'a'",
        "step 'b'",
    ),
    "inserted": Change(
        SLEEPS, "topic = await wf.step(x, topic)\n" + SLEEPS, 1, "step 'a'", "step 'x'"
    ),
    "removed": Change(
        SLEEPS,
        SLEEPS.replace("second = await wf.step(b, first)\n", "second = first\n"),
        2,
        "step 'b'",
        "sleep (delay_ms=3600000)",
    ),
    "sleep changed": Change(
        SLEEPS,
        SLEEPS.replace("hours=1", "hours=2"),
        3,
        "sleep (until=2026-01-01T01:00:00+00:00)",
        "sleep (delay_ms=7200000)",
    ),
    "event renamed": Change(
        WAITS,
        WAITS.replace('"reply"', '"answer"'),
        3,
        "wait_event (event=reply)",
        "wait_event (event=answer, timeout_ms=3600000)",
    ),
}
START = datetime(2026, 1, 1, tzinfo=UTC)


@dataclass
class Deploys:
    """The store, a fake clock every engine shares, and the modules written beside it."""

    store_url: str
    directory: Path
    clock: FakeClock
    ops: MemoryOps

    def module(self, name: str, body: str) -> str:
        source = STEPS + textwrap.indent(body.strip() + "\n", "    ")
        (self.directory / f"{name}.py").write_text(source, encoding="utf-8")
        return name

    def workflow(self, name: str) -> CodeWorkflow:
        """The module's workflow, imported afresh (every module is named ``mission``'s v1)."""
        spec = importlib.util.spec_from_file_location(name, self.directory / f"{name}.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        found: CodeWorkflow = module.mission
        return found

    def engine(self, module: str) -> Engine:
        config = EngineConfig(
            store_url=self.store_url, token_secret=TOKEN_SECRET, worker_id=f"on-{module}"
        )
        return Engine.open(
            config=config, workflows=[self.workflow(module)], clock=self.clock, ops=self.ops
        )

    def cli(self, *args: str, code: int = 0) -> str:
        done = run_jobledger(*args, "--store", self.store_url, cwd=self.directory)
        assert "Traceback" not in done.stderr, done.stderr
        assert done.returncode == code, (args, done.stdout, done.stderr)
        return done.stdout


@pytest.fixture
def deploys(store_url: str, tmp_path: Path) -> Deploys:
    return Deploys(store_url, tmp_path, FakeClock(START), MemoryOps())


def to_the_wait(deploys: Deploys, module: str) -> tuple[Any, list[str]]:
    """Submit under ``module``'s code and run the job to its wait."""
    with deploys.engine(module) as engine:
        engine.submit("acme", "j", "mission", input={"topic": "t"})
        engine.run_until_idle()
        view = engine.job("acme", "j")
        assert view.status in (JobStatus.WAITING_TIME, JobStatus.WAITING_EVENT)
        return view, [entry.event_type for entry in engine.history("acme", "j")]


def wake(engine: Engine) -> None:
    """The wait is over: its tick comes to a worker that has never seen the job."""
    engine.handle(Tick("acme", "j", "timer"))


@pytest.mark.parametrize("kind", list(CHANGES))
def test_changed_code_leaves_the_job_blocked_naming_the_step_and_the_old_code_finishes_it(
    deploys: Deploys, kind: str
) -> None:
    change = CHANGES[kind]
    old = deploys.module(f"old_{kind.replace(' ', '_')}", change.original)
    new = deploys.module(f"new_{kind.replace(' ', '_')}", change.changed)
    waiting, events = to_the_wait(deploys, old)

    # Before the deploy: replay lists exactly this job, at the step, with both sides.
    checked = json.loads(deploys.cli("replay", "--all", "--workflows", new, "--json", code=1))
    assert checked["diverged"] == 1
    assert [(j["job"], j["diverged_at_step"]) for j in checked["jobs"]] == [("j", change.step)]
    assert f"diverges at step {change.step}" in checked["jobs"][0]["verdict"]
    assert json.loads(deploys.cli("replay", "--all", "--workflows", old, "--json"))["safe"] == 1

    deploys.clock.advance(timedelta(hours=1, seconds=1))
    with deploys.engine(new) as engine:
        engine.note_blocked_in(JobViews(engine.deps.store))
        wake(engine)  # a timed-out wait is checked before its timeout would be written
        with pytest.raises(NonDeterminismError) as raised:
            engine.tick("acme", "j", reason="timer")
        error = raised.value
        assert (error.step_number, error.recorded, error.requested) == (
            change.step,
            change.recorded,
            change.requested,
        )
        after = engine.job("acme", "j")
        assert (after.version, after.status, after.last_error) == (
            waiting.version,
            waiting.status,
            None,
        )
        assert [entry.event_type for entry in engine.history("acme", "j")] == events
        reason = f"at step {change.step} the history holds {change.recorded}, the code asks for"
        blocked = [e for e in deploys.ops.events if e.eventType == "job.deployment_blocked"]
        assert blocked and reason in blocked[-1].metadata["reason"]
        assert change.requested in blocked[-1].metadata["reason"]

        shown = json.loads(deploys.cli("show", "acme", "j", "--json"))
        assert reason in shown["blocked"]["reason"]
        assert "blocked" in deploys.cli("show", "acme", "j")
        row = next(r for r in json.loads(deploys.cli("list", "--json")) if r["job_id"] == "j")
        assert reason in row["blocked"]["reason"]
        with start_api(engine, deploys.directory) as api, api.as_role(Role.AUDITOR) as http:
            job = http.get("/v1/jobs/acme/j").json()
            assert reason in job["blocked"]["reason"] and job["status"] == after.status
            listed = http.get("/v1/jobs/acme").json()["jobs"]
            assert reason in listed[0]["blocked"]["reason"]

    with deploys.engine(old) as engine:
        wake(engine)
        engine.run_until_idle()
        done = engine.job("acme", "j")
    assert done.status is JobStatus.COMPLETED, done.last_error
    assert done.state["result"] == "c(b(a(t)))"


def test_a_step_appended_after_the_recorded_ones_is_no_divergence(deploys: Deploys) -> None:
    old = deploys.module("old_appended", SLEEPS)
    new = deploys.module(
        "new_appended",
        SLEEPS.replace("return await wf.step(c, second)", "done = await wf.step(c, second)")
        + "return await wf.step(x, done)\n",
    )
    to_the_wait(deploys, old)
    checked = json.loads(deploys.cli("replay", "--all", "--workflows", new, "--json"))
    assert (checked["safe"], checked["diverged"]) == (1, 0)

    deploys.clock.advance(timedelta(hours=1, seconds=1))
    with deploys.engine(new) as engine:
        wake(engine)
        engine.run_until_idle()
        done = engine.job("acme", "j")
    assert done.status is JobStatus.COMPLETED, done.last_error
    assert done.state["result"] == "x(c(b(a(t))))"
    assert not [e for e in deploys.ops.events if e.eventType == "job.deployment_blocked"]


def test_replay_of_one_job_names_the_step_and_exits_1(deploys: Deploys) -> None:
    old = deploys.module("old_one", SLEEPS)
    new = deploys.module("new_one", CHANGES["reordered"].changed)
    to_the_wait(deploys, old)
    text = deploys.cli("replay", "acme", "j", "--workflows", new, code=1)
    assert "verdict: diverges at step 1" in text.replace("\n", " ")
    with deploys.engine(old) as engine:
        report = engine.replay("acme", "j", deploys.workflow(new))
        assert report.diverged_at is not None and report.diverged_at.step_number == 1
        assert engine.replay("acme", "j").safe  # the job's own code
