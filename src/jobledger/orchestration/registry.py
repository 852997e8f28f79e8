"""Workflows defined in Python: a registry of pure resolver functions, keyed by type and
version. (Declarative YAML/JSON definitions build on the same WorkflowRegistry port.)"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

from jobledger.domain.erasure import path_problem
from jobledger.domain.errors import UnknownWorkflowError
from jobledger.domain.steps import Resolution, ResolveRequest

Resolver = Callable[[ResolveRequest], Resolution]


def newest_version(keys: Iterable[tuple[str, int]], workflow_type: str) -> int:
    """The highest version of ``workflow_type`` among a registry's (type, version) keys."""
    versions = [v for (t, v) in keys if t == workflow_type]
    if not versions:
        raise UnknownWorkflowError(f"unknown workflow type {workflow_type!r}")
    return max(versions)


def unknown_workflow(
    keys: Iterable[tuple[str, int]], workflow_type: str, workflow_version: int
) -> UnknownWorkflowError:
    """A registry has no (type, version): the error names the versions it has."""
    known = ", ".join(f"v{v}" for (t, v) in sorted(keys) if t == workflow_type)
    return UnknownWorkflowError(
        f"unknown workflow {workflow_type!r} v{workflow_version} (known: {known or 'none'})"
    )


class FunctionRegistry:
    def __init__(self, workflows: dict[tuple[str, int], Resolver] | None = None) -> None:
        self._workflows: dict[tuple[str, int], Resolver] = dict(workflows or {})
        self._personal: dict[tuple[str, int], tuple[str, ...]] = {}

    def register(
        self,
        workflow_type: str,
        version: int,
        resolver: Resolver,
        *,
        personal_data: tuple[str, ...] = (),
    ) -> None:
        """``personal_data``: dotted paths into job state whose values are personal."""
        if (workflow_type, version) in self._workflows:
            raise ValueError(f"workflow {workflow_type!r} v{version} is already registered")
        problems = [p for p in map(path_problem, personal_data) if p is not None]
        if problems:
            raise ValueError(f"personal_data of {workflow_type!r} v{version}: {problems[0]}")
        self._workflows[(workflow_type, version)] = resolver
        self._personal[(workflow_type, version)] = tuple(personal_data)

    def latest_version(self, workflow_type: str) -> int:
        return newest_version(self._workflows, workflow_type)

    def has(self, workflow_type: str, workflow_version: int) -> bool:
        return (workflow_type, workflow_version) in self._workflows

    def known(self) -> list[tuple[str, int]]:
        return sorted(self._workflows)

    def budget_defaults(self, workflow_type: str, workflow_version: int) -> dict[str, Any]:
        return {}

    def personal_data(self, workflow_type: str, workflow_version: int) -> tuple[str, ...]:
        return self._personal.get((workflow_type, workflow_version), ())

    def resolve(self, request: ResolveRequest) -> Resolution:
        key = (request.workflow_type, request.workflow_version)
        if key not in self._workflows:
            raise unknown_workflow(self._workflows, *key)
        return self._workflows[key](request)


def linear_workflow(steps: Sequence[Resolution]) -> Resolver:
    """Step n of the job runs ``steps[n - 1]``: the simplest pure resolver."""
    frozen = tuple(steps)

    def resolve(request: ResolveRequest) -> Resolution:
        if request.current_step >= len(frozen):
            raise IndexError(f"no step {request.current_step + 1} in a {len(frozen)}-step workflow")
        return frozen[request.current_step]

    return resolve
