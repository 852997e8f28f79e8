"""Which step functions a deployment's workflows name, and which it serves: a definition
that names a task no function serves is refused when the engine is built, not when a job
first reaches that step (``jobledger definitions check`` lists both sides)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from jobledger.domain.errors import ConfigError
from jobledger.workflows.code import CodeWorkflow
from jobledger.workflows.definition import RunInteractionTask, WorkflowDefinition
from jobledger.workflows.tasks import TASK_PARAM, Task


@dataclass(frozen=True)
class TaskNames:
    """Task names by who names them (``type vN`` of each workflow) and those served."""

    named: dict[str, tuple[str, ...]]
    """task name -> the workflows that name it."""
    served: frozenset[str]

    @property
    def missing(self) -> list[str]:
        """Named by a workflow, served by no function."""
        return sorted(set(self.named) - self.served)

    @property
    def unused(self) -> list[str]:
        """Served by a function no workflow names."""
        return sorted(self.served - set(self.named))


def task_names(
    workflows: Iterable[CodeWorkflow | WorkflowDefinition], tasks: Iterable[Task]
) -> TaskNames:
    named: dict[str, list[str]] = {}
    served = {task.name for task in tasks}
    for workflow in workflows:
        label = f"{workflow.type} v{workflow.version}"
        for name in _named_by(workflow):
            named.setdefault(name, []).append(label)
        if isinstance(workflow, CodeWorkflow):
            served |= {task.name for task in workflow.tasks()}
    return TaskNames({k: tuple(v) for k, v in named.items()}, frozenset(served))


def _named_by(workflow: CodeWorkflow | WorkflowDefinition) -> list[str]:
    if isinstance(workflow, CodeWorkflow):
        return [task.name for task in workflow.tasks()]
    names = []
    for step in workflow.steps.values():
        task = step.params.get(TASK_PARAM) if isinstance(step, RunInteractionTask) else None
        if isinstance(task, str):
            names.append(task)
    return names


def require_served(names: TaskNames) -> None:
    """Refuse a deployment whose workflows name tasks no function serves."""
    missing = names.missing
    if missing:
        where = "; ".join(f"{name!r} (named by {', '.join(names.named[name])})" for name in missing)
        raise ConfigError(f"no step function serves task {where}")
