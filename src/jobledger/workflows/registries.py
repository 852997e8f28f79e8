"""Several workflow registries served as one: code workflows beside declarative
definitions (and any registry of your own), each (type, version) from the one that has it."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from jobledger.domain.steps import Resolution, ResolveRequest
from jobledger.orchestration.ports import WorkflowRegistry
from jobledger.orchestration.registry import newest_version, unknown_workflow
from jobledger.workflows.code import CodeWorkflow
from jobledger.workflows.replayer import CodeRegistry


class Registries:
    """The WorkflowRegistry port over ``registries``; a (type, version) two of them have is
    refused when they are put together, not resolved by whichever comes first."""

    def __init__(self, registries: Sequence[WorkflowRegistry]) -> None:
        self.registries = tuple(registries)
        seen: dict[tuple[str, int], WorkflowRegistry] = {}
        for registry in self.registries:
            for key in registry.known():
                if key in seen:
                    raise ValueError(f"workflow {key[0]!r} v{key[1]} is defined twice")
                seen[key] = registry
        self._owners = seen

    def _owner(self, workflow_type: str, workflow_version: int) -> WorkflowRegistry:
        owner = self._owners.get((workflow_type, workflow_version))
        if owner is None:
            raise unknown_workflow(self._owners, workflow_type, workflow_version)
        return owner

    def latest_version(self, workflow_type: str) -> int:
        return newest_version(self._owners, workflow_type)

    def has(self, workflow_type: str, workflow_version: int) -> bool:
        return (workflow_type, workflow_version) in self._owners

    def known(self) -> list[tuple[str, int]]:
        return sorted(self._owners)

    def budget_defaults(self, workflow_type: str, workflow_version: int) -> dict[str, Any]:
        owner = self._owner(workflow_type, workflow_version)
        return owner.budget_defaults(workflow_type, workflow_version)

    def personal_data(self, workflow_type: str, workflow_version: int) -> tuple[str, ...]:
        return self._owner(workflow_type, workflow_version).personal_data(
            workflow_type, workflow_version
        )

    def check_input(
        self, workflow_type: str, workflow_version: int, state: Mapping[str, Any]
    ) -> None:
        """The owner's input check, if it has one (code workflows do)."""
        owner = self._owner(workflow_type, workflow_version)
        check = getattr(owner, "check_input", None)
        if check is not None:
            check(workflow_type, workflow_version, state)

    def check_history(self, request: ResolveRequest) -> None:
        """The owner's history check, if it has one (code workflows do)."""
        owner = self._owner(request.workflow_type, request.workflow_version)
        check = getattr(owner, "check_history", None)
        if check is not None:
            check(request)

    def resolve(self, request: ResolveRequest) -> Resolution:
        return self._owner(request.workflow_type, request.workflow_version).resolve(request)


def code_workflow(
    registry: WorkflowRegistry, workflow_type: str, workflow_version: int
) -> CodeWorkflow | None:
    """The code workflow ``registry`` (or one of the registries it joins) resolves this
    (type, version) with; None when a definition (or any other resolver) does."""
    members = registry.registries if isinstance(registry, Registries) else (registry,)
    for member in members:
        if isinstance(member, CodeRegistry) and member.has(workflow_type, workflow_version):
            return member.get(workflow_type, workflow_version)
    return None
