"""The demo's mission (src/jobledger/demo/mission.yaml) as code: three agent steps, a
one-day cool-off, an outside fact-check with a seven-day timeout, and a reviewer's
approval that expires in two days. Inputs and outputs are pydantic models, checked where
they cross the log.

Run it with ``Engine.open(url, workflows=[mission])``; test it with ``test_mission.py``.
"""

from __future__ import annotations

import re
from collections import Counter
from datetime import timedelta

from pydantic import BaseModel

from jobledger import StepContext, WorkflowContext, step, workflow

REVIEWER = "reviewer"
_WORD = re.compile(r"[a-z]+(?:'[a-z]+)?")


class MissionInput(BaseModel):
    notes: str
    """The field notes to survey."""


class Survey(BaseModel):
    words: int
    distinct: int
    sentences: int
    frequent: list[str]


class FactCheck(BaseModel):
    """What the fact-checker sends back with its resume token (or signal)."""

    confirmed: bool
    checker: str


class Brief(BaseModel):
    text: str
    fact_checked: bool


class Published(BaseModel):
    location: str
    brief: Brief


@step
def survey(ctx: StepContext, notes: str) -> Survey:
    """The first agent turn: count what the notes hold."""
    ctx.spend("0.20")
    words = _WORD.findall(notes.lower())
    frequent = [word for word, _ in Counter(words).most_common(3)]
    sentences = len([s for s in re.split(r"[.!?]+", notes) if s.strip()])
    return Survey(
        words=len(words), distinct=len(set(words)), sentences=sentences, frequent=frequent
    )


@step
def draft_brief(ctx: StepContext, survey: Survey, check: FactCheck | None) -> Brief:
    """The second agent turn: a short brief from the survey and the fact-check."""
    ctx.spend("0.50")
    checked = check is not None and check.confirmed
    by = f"checked by {check.checker}" if check is not None and checked else "unchecked"
    about = ", ".join(survey.frequent)
    text = f"{survey.words} words in {survey.sentences} sentences, mostly about {about} ({by})"
    return Brief(text=text, fact_checked=checked)


@step
def publish(ctx: StepContext, brief: Brief) -> Published:
    """The third agent turn: deliver the brief. The idempotency key names the delivery, so
    a re-delivered step overwrites its own entry instead of publishing twice."""
    ctx.spend("0.40")
    return Published(location=f"outbox/{ctx.idempotency_key}", brief=brief)


@workflow(
    "code_mission",
    version=1,
    budget={"max_steps": 20, "max_cost_usd": 5, "deadline_seconds": 30 * 24 * 3600},
)
async def mission(wf: WorkflowContext, request: MissionInput) -> Published:
    found = await wf.step(survey, request.notes)
    await wf.sleep(timedelta(days=1))  # cool off
    answer = await wf.wait_event("factcheck.done", timeout=timedelta(days=7))
    check = FactCheck.model_validate(answer) if answer is not None else None
    brief = await wf.step(draft_brief, found, check)
    decision = await wf.approval(
        approvers=[REVIEWER], expires=timedelta(days=2), action={"brief": brief.text}
    )
    if not decision.approved:
        wf.fail(f"the brief was {decision.decision}")
    published: Published = await wf.step(publish, brief)
    return published
