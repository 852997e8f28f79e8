"""Resolution: what a definition decides for a job's next step, as a pure function of the
definition and the request (state, cursor, visits, now); and the registry that serves it."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from copy import deepcopy
from datetime import UTC
from pathlib import Path
from typing import Any, assert_never

from jobledger.domain.errors import UnknownWorkflowError
from jobledger.domain.fan_out import MapRequest
from jobledger.domain.status import JobStatus
from jobledger.domain.steps import ApprovalSpec, Resolution, ResolveRequest
from jobledger.workflows.conditions import ABSENT, lookup
from jobledger.workflows.definition import (
    MAX_CHILDREN,
    AnyStep,
    AwaitApproval,
    Branch,
    Complete,
    DefinitionError,
    Fail,
    MapStep,
    RunInteractionTask,
    WaitEvent,
    WaitTime,
    WorkflowDefinition,
    input_reference,
)
from jobledger.workflows.loader import check_definition, load_definitions


def resolve(definition: WorkflowDefinition, request: ResolveRequest) -> Resolution:
    """The step at ``request.cursor`` (``start`` when None), or a failure if that step
    has used up its ``max_visits``."""
    name = definition.start if request.cursor is None else request.cursor
    step = definition.steps.get(name)
    if step is None:
        raise DefinitionError([f"{definition.label}: unknown step {name!r} at the cursor"])
    if step.max_visits is not None and request.visits.get(name, 0) >= step.max_visits:
        return _exhausted(name, step.max_visits)
    return resolve_step(name, step, request.state)


def resolve_step(name: str, step: AnyStep, state: Mapping[str, Any]) -> Resolution:
    match step:
        case RunInteractionTask():
            return _run(name, step)
        case WaitTime():
            return _wait_time(name, step)
        case WaitEvent():
            return _wait_event(name, step)
        case AwaitApproval():
            return _await_approval(name, step)
        case Branch():
            return _branch(name, step, state)
        case MapStep():
            return _map(name, step, state)
        case Complete():
            return Resolution(
                step_type=step.kind,
                next_status=JobStatus.COMPLETED,
                step_name=name,
                transition_reason=f"step {name!r}: workflow complete",
            )
        case Fail():
            return Resolution(
                step_type=step.kind,
                next_status=JobStatus.FAILED,
                step_name=name,
                transition_reason=step.reason,
            )
        case _:
            assert_never(step)


def _exhausted(name: str, bound: int) -> Resolution:
    return Resolution(
        step_type="fail",
        next_status=JobStatus.FAILED,
        step_name=name,
        transition_reason=f"step {name!r} reached its bound of max_visits={bound}",
    )


def _run(name: str, step: RunInteractionTask) -> Resolution:
    return Resolution(
        step_type=step.kind,
        next_status=JobStatus.QUEUED,
        step_name=name,
        next_step=step.next,
        transition_reason=f"step {name!r}: run interaction task -> {step.next!r}",
        retry_policy=step.retry.policy() if step.retry is not None else None,
        params=deepcopy(step.params),
    )


def _wait_time(name: str, step: WaitTime) -> Resolution:
    if step.until is not None:
        resume_at = step.until.astimezone(UTC)
        until = f"until {resume_at.isoformat()}"
        return _timer(name, step, until, resume_at=resume_at)
    assert step.delay is not None  # the model requires one of the two
    return _timer(name, step, step.delay.describe(), resume_delay_ms=step.delay.total_ms())


def _timer(name: str, step: WaitTime, how_long: str, **when: Any) -> Resolution:
    return Resolution(
        step_type=step.kind,
        next_status=JobStatus.WAITING_TIME,
        step_name=name,
        next_step=step.next,
        transition_reason=f"step {name!r}: wait {how_long} -> {step.next!r}",
        **when,
    )


def _wait_event(name: str, step: WaitEvent) -> Resolution:
    reason = f"step {name!r}: wait for event {step.event!r} -> {step.next!r}"
    return Resolution(
        step_type=step.kind,
        next_status=JobStatus.WAITING_EVENT,
        step_name=name,
        next_step=step.next,
        transition_reason=reason + _timeout_note(step),
        wait_event_name=step.event,
        wait_timeout_ms=step.timeout.total_ms() if step.timeout is not None else None,
        on_timeout=step.on_timeout,
    )


def _timeout_note(step: WaitEvent | MapStep) -> str:
    """Where a wait with a timeout goes when it runs out (nowhere: the job fails)."""
    if step.timeout is None:
        return ""
    after = repr(step.on_timeout) if step.on_timeout is not None else "fail"
    return f" (timeout {step.timeout.describe()} -> {after})"


def _await_approval(name: str, step: AwaitApproval) -> Resolution:
    reason = f"step {name!r}: await approval"
    if step.approvers:
        reason += f" by {', '.join(step.approvers)}"
    if step.quorum is not None:
        reason += f" ({step.quorum} of {len(step.approvers)})"
    if step.expires is not None:
        reason += f" (expires in {step.expires.describe()})"
    approval = ApprovalSpec(
        approvers=tuple(step.approvers),
        expires_ms=step.expires.total_ms() if step.expires is not None else None,
        on_approve=step.on_approve,
        on_reject=step.on_reject,
        on_expire=step.on_expire,
        quorum=step.quorum,
    )
    return Resolution(
        step_type=step.kind,
        next_status=JobStatus.AWAITING_APPROVAL,
        step_name=name,
        next_step=step.on_approve,
        transition_reason=reason,
        approval=approval,
    )


def _branch(name: str, step: Branch, state: Mapping[str, Any]) -> Resolution:
    chosen, reason = step.default, f"branch {name!r}: no case matched -> default {step.default!r}"
    for number, case in enumerate(step.cases, start=1):
        if case.when.evaluate(state):
            chosen = case.next
            reason = f"branch {name!r}: case {number} ({case.when.describe()}) -> {chosen!r}"
            break
    return Resolution(
        step_type=step.kind,
        next_status=JobStatus.QUEUED,
        step_name=name,
        next_step=chosen,
        transition_reason=reason,
    )


def _map(name: str, step: MapStep, state: Mapping[str, Any]) -> Resolution:
    items = _items(name, step, state)
    need = step.need
    if need is not None and need > len(items):
        raise ValueError(f"map step {name!r}: join {need} is more than the {len(items)} items")
    request = MapRequest(
        workflow_type=step.workflow,
        workflow_version=step.version,
        items=tuple((item, _child_input(step, item, state)) for item in items),
        need=need,
        on_failure=step.on_failure,
        results=step.results,
        on_timeout=step.on_timeout,
    )
    reason = (
        f"step {name!r}: spawn {len(items)} x {step.workflow!r} v{step.version}, join {step.join}"
        + _timeout_note(step)
    )
    return Resolution(
        step_type=step.kind,
        next_status=JobStatus.WAITING_CHILDREN,
        step_name=name,
        next_step=step.next,
        transition_reason=f"{reason} -> {step.next!r}",
        params=request.to_params(),
        wait_timeout_ms=step.timeout.total_ms() if step.timeout is not None else None,
        on_timeout=step.on_timeout,
        children=request,
    )


def _items(name: str, step: MapStep, state: Mapping[str, Any]) -> list[Any]:
    """The fixed list, or the list at ``items_from``: anything else is a clear failure."""
    if step.items is not None:
        return deepcopy(step.items)
    assert step.items_from is not None  # the model requires one of the two
    found = lookup(state, step.items_from)
    if found is ABSENT:
        raise ValueError(f"map step {name!r}: the state has no {step.items_from!r}")
    if not isinstance(found, list):
        raise ValueError(
            f"map step {name!r}: {step.items_from!r} is {type(found).__name__}, not a list"
        )
    if len(found) > MAX_CHILDREN:
        raise ValueError(
            f"map step {name!r}: {len(found)} items is more than {MAX_CHILDREN} children"
        )
    return deepcopy(found)


def _child_input(step: MapStep, item: Any, state: Mapping[str, Any]) -> dict[str, Any]:
    data: dict[str, Any] = {}
    for key, value in step.input.items():
        reference = input_reference(value)
        if reference is None:
            data[key] = deepcopy(value)
            continue
        source, path = reference
        root = item if source == "item" else state
        found = root if path is None else lookup(root, path)
        if found is not ABSENT:
            data[key] = deepcopy(found)
    return data


class DefinitionRegistry:
    """The WorkflowRegistry port over declarative definitions. Every version is kept: a
    job resolves against the version it was submitted with (``workflow_version``)."""

    def __init__(self, definitions: Iterable[WorkflowDefinition] = ()) -> None:
        self._definitions: dict[tuple[str, int], WorkflowDefinition] = {}
        for definition in definitions:
            self.add(definition)

    @classmethod
    def from_directory(cls, path: str | Path) -> DefinitionRegistry:
        """Every definition in the *.yaml, *.yml and *.json files of ``path``."""
        return cls(load_definitions(path))

    def add(self, definition: WorkflowDefinition) -> None:
        """Register a definition after checking its graph; a (type, version) is final."""
        check_definition(definition, definition.label)
        if definition.key in self._definitions:
            raise DefinitionError([f"{definition.label} is already registered"])
        self._definitions[definition.key] = definition

    def get(self, workflow_type: str, workflow_version: int) -> WorkflowDefinition:
        definition = self._definitions.get((workflow_type, workflow_version))
        if definition is None:
            known = ", ".join(f"v{v}" for v in self.versions(workflow_type)) or "none"
            raise UnknownWorkflowError(
                f"unknown workflow {workflow_type!r} v{workflow_version} (known: {known})"
            )
        return definition

    def known(self) -> list[tuple[str, int]]:
        """Every (type, version) registered, in order."""
        return sorted(self._definitions)

    def versions(self, workflow_type: str) -> list[int]:
        return sorted(version for (kind, version) in self._definitions if kind == workflow_type)

    def latest_version(self, workflow_type: str) -> int:
        versions = self.versions(workflow_type)
        if not versions:
            raise UnknownWorkflowError(f"unknown workflow type {workflow_type!r}")
        return versions[-1]

    def has(self, workflow_type: str, workflow_version: int) -> bool:
        return (workflow_type, workflow_version) in self._definitions

    def budget_defaults(self, workflow_type: str, workflow_version: int) -> dict[str, Any]:
        """The definition's budget (max_steps, max_cost_usd, deadline_seconds), each only
        if it sets it; a submit's own budget overrides it key by key."""
        return self.get(workflow_type, workflow_version).budget_defaults()

    def personal_data(self, workflow_type: str, workflow_version: int) -> tuple[str, ...]:
        return tuple(self.get(workflow_type, workflow_version).personal_data)

    def resolve(self, request: ResolveRequest) -> Resolution:
        return resolve(self.get(request.workflow_type, request.workflow_version), request)
