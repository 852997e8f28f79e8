"""The tests' workflows, defined once: the steps they are built of and one registry of
linear workflows, so a test names the steps it needs and nothing else."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from jobledger import FunctionRegistry, JobStatus, Resolution, linear_workflow
from jobledger.domain.steps import ApprovalSpec

STEP = Resolution("run_interaction_task", JobStatus.QUEUED)
"""One side-effecting agent step (it calls the executor)."""
DONE = Resolution("complete", JobStatus.COMPLETED)
LAST_STEP = Resolution("run_interaction_task", JobStatus.COMPLETED)
"""An agent step that completes the job."""
SEND_100 = Resolution("run_interaction_task", JobStatus.QUEUED, params={"send": "$100"})
"""The agent step an approval gate reviews."""


def wait_event(event: str, timeout_ms: int | None = None) -> Resolution:
    return Resolution(
        "wait_event", JobStatus.WAITING_EVENT, wait_event_name=event, wait_timeout_ms=timeout_ms
    )


def sleep_ms(delay_ms: int) -> Resolution:
    return Resolution("wait_time", JobStatus.WAITING_TIME, resume_delay_ms=delay_ms)


def review(approval: ApprovalSpec) -> Resolution:
    """The approval step named ``review``."""
    return Resolution(
        "await_approval", JobStatus.AWAITING_APPROVAL, step_name="review", approval=approval
    )


def linear_registry(workflows: Mapping[str, Sequence[Resolution]]) -> FunctionRegistry:
    """Each workflow, version 1, runs its steps in order."""
    registry = FunctionRegistry()
    for name, steps in workflows.items():
        registry.register(name, 1, linear_workflow(steps))
    return registry


def tasks_definition(workflow_type: str, *tasks: str) -> str:
    """The YAML definition (version 1) of one agent step per task, each named after its
    ``task`` parameter, in order, then ``done``."""
    steps = [
        f"  {task}: {{kind: run_interaction_task, params: {{task: {task}}}, next: {after}}}\n"
        for task, after in zip(tasks, [*tasks[1:], "done"], strict=True)
    ]
    head = f"\ntype: {workflow_type}\nversion: 1\nstart: {tasks[0]}\nsteps:\n"
    return head + "".join(steps) + "  done: {kind: complete}\n"
