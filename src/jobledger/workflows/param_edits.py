"""Which edits an approver may make: new values for params the step the approval leads to
already has in its definition (a key it lacks would be a new input the step's author never
meant; the step's kind and routes are not params and stay as defined)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from jobledger.domain.errors import InvalidPayloadError, JobLedgerError
from jobledger.orchestration.ports import WorkflowRegistry
from jobledger.workflows.resolver import DefinitionRegistry, resolve_step


def check_edit(
    registry: WorkflowRegistry,
    workflow: tuple[str, int],
    step_name: str,
    state: Mapping[str, Any],
    edit: Mapping[str, Any],
) -> None:
    """Refuse (InvalidPayloadError, saying which) an edit of a key ``step_name`` has no
    param for, or of a step whose params only its code knows."""
    if not isinstance(registry, DefinitionRegistry):
        raise InvalidPayloadError(
            f"step {step_name!r} is a code workflow's; only a declarative step's params "
            "can be edited"
        )
    try:
        step = registry.get(*workflow).steps.get(step_name)
    except JobLedgerError as error:
        raise InvalidPayloadError(f"cannot check the edit: {error}") from None
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
