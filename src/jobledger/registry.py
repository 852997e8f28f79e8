"""Workflows defined in Python: a registry of pure resolver functions, keyed by type and
version. (Declarative YAML/JSON definitions build on the same WorkflowRegistry port.)"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from jobledger.errors import UnknownWorkflowError
from jobledger.ports import Resolution, ResolveRequest

Resolver = Callable[[ResolveRequest], Resolution]


class FunctionRegistry:
    def __init__(self, workflows: dict[tuple[str, int], Resolver] | None = None) -> None:
        self._workflows: dict[tuple[str, int], Resolver] = dict(workflows or {})

    def register(self, workflow_type: str, version: int, resolver: Resolver) -> None:
        if (workflow_type, version) in self._workflows:
            raise ValueError(f"workflow {workflow_type!r} v{version} is already registered")
        self._workflows[(workflow_type, version)] = resolver

    def latest_version(self, workflow_type: str) -> int:
        versions = [v for (t, v) in self._workflows if t == workflow_type]
        if not versions:
            raise UnknownWorkflowError(f"unknown workflow type {workflow_type!r}")
        return max(versions)

    def has(self, workflow_type: str, workflow_version: int) -> bool:
        return (workflow_type, workflow_version) in self._workflows

    def known(self) -> list[tuple[str, int]]:
        return sorted(self._workflows)

    def budget_defaults(self, workflow_type: str, workflow_version: int) -> dict[str, Any]:
        return {}

    def resolve(self, request: ResolveRequest) -> Resolution:
        key = (request.workflow_type, request.workflow_version)
        if key not in self._workflows:
            known = ", ".join(
                f"v{v}" for (t, v) in sorted(self._workflows) if t == request.workflow_type
            )
            raise UnknownWorkflowError(
                f"unknown workflow {request.workflow_type!r} v{request.workflow_version} "
                f"(known: {known or 'none'})"
            )
        return self._workflows[key](request)


def linear_workflow(steps: Sequence[Resolution]) -> Resolver:
    """Step n of the job runs ``steps[n - 1]``: the simplest pure resolver."""
    frozen = tuple(steps)

    def resolve(request: ResolveRequest) -> Resolution:
        if request.current_step >= len(frozen):
            raise IndexError(f"no step {request.current_step + 1} in a {len(frozen)}-step workflow")
        return frozen[request.current_step]

    return resolve
