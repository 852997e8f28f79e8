"""The demo mission written as code (``jobledger demo --code``): the same survey, cool-off,
fact-check, draft, review and publish as ``mission.yaml``, and the same fan-out as
``fan_out.yaml``, as ``@workflow`` bodies awaiting ``@step`` functions.

The step functions do the demo agent's work (:class:`~jobledger.demo.agent.DemoAgent`,
which keeps the side effects and can crash once), so they are made per agent:
:func:`mission_workflows` binds them to it. Each charges the price the YAML gives in
``price_usd`` with ``ctx.spend``.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from jobledger.demo.agent import DemoAgent, paragraphs
from jobledger.demo.outside import REVIEWER
from jobledger.workflows.code import CodeWorkflow, WorkflowContext, workflow
from jobledger.workflows.tasks import StepContext, step

MISSION = "demo_mission_code"
FAN_OUT = "demo_fan_out_code"
PARAGRAPH = "demo_paragraph_code"
JSON = dict[str, Any]


def mission_workflows(agent: DemoAgent) -> list[CodeWorkflow]:
    """The mission, the fan-out and its child, their steps served by ``agent``."""

    @step("count_words")
    def count_words(ctx: StepContext) -> JSON:
        """Count the words, distinct words and sentences of the field notes."""
        ctx.spend("0.20")
        return agent.perform(ctx.idempotency_key, "count_words", {})[0]

    @step("summarise")
    def summarise(ctx: StepContext) -> JSON:
        """The most frequent words and the longest one."""
        ctx.spend("0.30")
        return agent.perform(ctx.idempotency_key, "summarise", {})[0]

    @step("draft_brief")
    def draft_brief(ctx: StepContext, survey: JSON, summary: JSON, fact_check: JSON) -> str:
        """A short brief from the survey, the summary and the fact-check."""
        ctx.spend("0.50")
        state = {"survey": survey, "summary": summary, "fact_check": fact_check}
        _, patch = agent.perform(ctx.idempotency_key, "draft_brief", state)
        return str(patch["brief"])

    @step("publish")
    def publish(ctx: StepContext, brief: str) -> JSON:
        """Deliver the brief to the outbox."""
        ctx.spend("0.40")
        return agent.perform(ctx.idempotency_key, "publish", {"brief": brief})[0]

    @step("count_paragraph")
    def count_paragraph(ctx: StepContext, paragraph: int) -> JSON:
        ctx.spend("0.01")
        return agent.perform(ctx.idempotency_key, "count_paragraph", {"paragraph": paragraph})[0]

    @workflow(
        MISSION,
        version=1,
        budget={"max_steps": 20, "max_cost_usd": 5, "deadline_seconds": 30 * 86_400},
    )
    async def mission(wf: WorkflowContext, source: str) -> JSON:
        """Survey field notes, cool off, get them fact-checked and approved, publish a brief."""
        survey = await wf.step(count_words)
        summary = await wf.step(summarise)
        await wf.sleep(timedelta(days=3))
        checked = await wf.wait_event("factcheck.done", timeout=timedelta(days=7))
        if checked is None:
            wf.fail("nobody fact-checked the notes in time")
        brief = await wf.step(draft_brief, survey, summary, checked["fact_check"])
        review = await wf.approval(approvers=[REVIEWER], expires=timedelta(days=2), name="review")
        if not review.approved:
            wf.fail(f"the brief was {review.decision}")
        published = await wf.step(publish, brief)
        return {"source": source, "brief": brief, **published}

    @workflow(PARAGRAPH, version=1)
    async def paragraph(wf: WorkflowContext, paragraph: int) -> JSON:
        """Count the words of one paragraph of the field notes."""
        return dict(await wf.step(count_paragraph, paragraph))

    @workflow(FAN_OUT, version=1, budget={"max_cost_usd": 1})
    async def fan_out(wf: WorkflowContext) -> list[JSON]:
        """One child job per paragraph, all joined: each child's job and word count."""
        items = list(range(len(paragraphs(agent.text))))
        children = await wf.map(paragraph, items, timeout=timedelta(hours=1), name="split")
        failed = [child.job_id for child in children if not child.completed]
        if failed:
            wf.fail(f"children did not complete: {', '.join(failed)}")
        return [{"job_id": child.job_id, **child.result} for child in children]

    return [mission, paragraph, fan_out]
