"""The code mission's tests, written with jobledger's testing kit (the ``jobledger_env``
fixture comes from its pytest plugin): every wait is skipped to, never slept through."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from decimal import Decimal

import pytest
from mission import (
    REVIEWER,
    Brief,
    MissionInput,
    Published,
    Survey,
    draft_brief,
    mission,
    publish,
)

from jobledger import JobStatus, StepError
from jobledger.testing import DEFAULT_START, JobHandle, WorkflowTestEnv, assert_steps

NOTES = MissionInput(notes="The river was high. The river was cold! Birds sang by the river.")
ALL_STEPS = ["survey", "sleep", "wait_event", "draft_brief", "approval", "publish", "complete"]


@pytest.fixture
def env(jobledger_env: Callable[..., WorkflowTestEnv]) -> WorkflowTestEnv:
    return jobledger_env([mission])


def at_review(env: WorkflowTestEnv) -> JobHandle:
    """A mission whose brief was fact-checked, drafted and sent for review."""
    job = env.start(mission, {"request": NOTES}, job_id="m1")
    env.run_until(job, status="waiting_event")
    env.resume(job, {"confirmed": True, "checker": "desk"})
    assert job.status is JobStatus.AWAITING_APPROVAL
    return job


def test_an_approved_mission_publishes_its_brief(env: WorkflowTestEnv) -> None:
    job = at_review(env)
    assert env.now() == DEFAULT_START + timedelta(days=1)  # only the cool-off was skipped
    env.approve(job, by=REVIEWER)

    published = job.result()
    assert isinstance(published, Published)
    assert published.brief.fact_checked
    assert published.brief.text.startswith("13 words in 3 sentences, mostly about the, river")
    assert published.location == "outbox/test/m1:step:6"
    assert_steps(job, ALL_STEPS)
    assert job.view.total_cost_usd == Decimal("1.10")


def test_the_survey_counts_the_notes(env: WorkflowTestEnv) -> None:
    job = env.start(mission, {"request": NOTES})
    first = job.steps()[0]
    assert Survey.model_validate(first.result) == Survey(
        words=13, distinct=8, sentences=3, frequent=["the", "river", "was"]
    )


def test_without_a_fact_check_the_brief_goes_out_unchecked(env: WorkflowTestEnv) -> None:
    job = env.start(mission, {"request": NOTES})
    env.run_until(job, status="awaiting_approval")
    assert env.now() == DEFAULT_START + timedelta(days=1 + 7)  # cool-off, then the timeout
    env.approve(job, by=REVIEWER)
    assert job.result().brief == Brief(
        text="13 words in 3 sentences, mostly about the, river, was (unchecked)",
        fact_checked=False,
    )


def test_the_review_expires_after_two_days_not_before(env: WorkflowTestEnv) -> None:
    job = at_review(env)
    env.advance(timedelta(days=2) - timedelta(seconds=1))
    assert job.status is JobStatus.AWAITING_APPROVAL
    env.advance(timedelta(seconds=1))
    assert job.status is JobStatus.FAILED
    assert job.last_error is not None and "the brief was expired" in job.last_error


def test_a_rejected_brief_is_never_published(env: WorkflowTestEnv) -> None:
    publishing = env.fake(publish)
    job = at_review(env)
    env.reject(job, by=REVIEWER, comment="needs sources")
    assert job.status is JobStatus.FAILED
    assert publishing.calls == []


def test_the_review_goes_to_the_reviewer_for_two_days(env: WorkflowTestEnv) -> None:
    job = at_review(env)
    assert job.approval is not None
    assert job.approval.request.approvers == (REVIEWER,)
    assert job.approval.request.expires_at == env.now() + timedelta(days=2)


def test_a_draft_that_fails_for_good_fails_the_mission(env: WorkflowTestEnv) -> None:
    drafting = env.fake(draft_brief, raises=StepError("model unavailable"))
    job = env.start(mission, {"request": NOTES})
    env.run_until(job, status="failed")
    assert [call.attempt for call in drafting.calls] == [0]  # not retryable: fails at once
    assert job.last_error is not None and "model unavailable" in job.last_error
