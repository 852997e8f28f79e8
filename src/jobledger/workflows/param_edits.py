"""The params an approver may edit: those the step the approval leads to has in its
declarative definition (``jobledger.domain.approval_answers.check_edit`` refuses others)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from jobledger.orchestration.ports import WorkflowRegistry
from jobledger.workflows.definition import WorkflowDefinition
from jobledger.workflows.registries import Registries
from jobledger.workflows.resolver import DefinitionRegistry, resolve_step


def editable_params(
    registry: WorkflowRegistry,
    workflow: tuple[str, int],
    step_name: str,
    state: Mapping[str, Any],
) -> tuple[str, ...] | None:
    """The params of ``step_name`` as the definition resolves them on ``state``; None when
    no declarative definition has that step (a code workflow's steps are its code's)."""
    definition = _definition(registry, workflow)
    step = definition.steps.get(step_name) if definition is not None else None
    if step is None:
        return None
    return tuple(resolve_step(step_name, step, state).params)


def _definition(registry: WorkflowRegistry, workflow: tuple[str, int]) -> WorkflowDefinition | None:
    """The declarative definition of ``workflow`` in ``registry`` (or in one of the
    registries it joins); None when code (or any other resolver) serves it."""
    members = registry.registries if isinstance(registry, Registries) else (registry,)
    for member in members:
        if isinstance(member, DefinitionRegistry) and member.has(*workflow):
            return member.get(*workflow)
    return None
