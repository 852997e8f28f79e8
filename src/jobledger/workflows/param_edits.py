"""Which edits an approver may make: new values for params the step the approval leads to
already has in its definition (a key it lacks would be a new input the step's author never
meant; the step's kind and routes are not params and stay as defined)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from jobledger.domain.errors import InvalidPayloadError
from jobledger.orchestration.ports import WorkflowRegistry
from jobledger.workflows.definition import WorkflowDefinition
from jobledger.workflows.registries import Registries
from jobledger.workflows.resolver import DefinitionRegistry, resolve_step


def check_edit(
    registry: WorkflowRegistry,
    workflow: tuple[str, int],
    step_name: str,
    state: Mapping[str, Any],
    edit: Mapping[str, Any],
) -> None:
    """Refuse (InvalidPayloadError, saying which) an edit of a key ``step_name`` has no
    param for, or of a step whose params only code knows (a code workflow's)."""
    definition = _definition(registry, workflow)
    if definition is None:
        raise InvalidPayloadError(
            f"workflow {workflow[0]!r} v{workflow[1]} has no declarative definition; only "
            "the params of a definition's step can be edited"
        )
    step = definition.steps.get(step_name)
    if step is None:
        raise InvalidPayloadError(f"step {step_name!r} is not in the job's workflow definition")
    params = resolve_step(step_name, step, state).params
    unknown = sorted(set(edit) - set(params))
    if unknown:
        allowed = ", ".join(sorted(params)) or "none"
        raise InvalidPayloadError(
            f"step {step_name!r} has no param {', '.join(map(repr, unknown))} to edit "
            f"(its params: {allowed})"
        )


def _definition(registry: WorkflowRegistry, workflow: tuple[str, int]) -> WorkflowDefinition | None:
    """The declarative definition of ``workflow`` in ``registry`` (or in one of the
    registries it joins); None when code (or any other resolver) serves it."""
    members = registry.registries if isinstance(registry, Registries) else (registry,)
    for member in members:
        if isinstance(member, DefinitionRegistry) and member.has(*workflow):
            return member.get(*workflow)
    return None
