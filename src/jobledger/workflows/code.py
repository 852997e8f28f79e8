"""Workflows as Python code: ``@workflow("mission", version=1)`` on an ``async def`` whose
body awaits the commands of its :class:`WorkflowContext` (``wf.step``, ``wf.sleep``,
``wf.wait_event``, ``wf.approval``, ``wf.map``) with branches and loops in plain Python.

Each command is one step of the job, recorded with the same events a declarative
definition's step records: the body never runs a side effect itself, it only says what
the next step is. :mod:`jobledger.workflows.replayer` finds that step by replaying the body
against the job's history, so the body must decide the same way every time it is replayed:
time, randomness and ids come from ``wf.now()``, ``wf.random()`` and ``wf.uuid()``, which
derive from the history.
"""

from __future__ import annotations

import inspect
import random as _random
import uuid as _uuid
from collections.abc import Awaitable, Callable, Generator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, Final, Literal, NoReturn, get_type_hints

from pydantic import BaseModel, ConfigDict, TypeAdapter, ValidationError, create_model

from jobledger.domain.erasure import path_problem
from jobledger.domain.fan_out import MapRequest
from jobledger.domain.status import JobStatus
from jobledger.domain.steps import ApprovalSpec, Resolution, RetryPolicy
from jobledger.workflows.tasks import ARGS_PARAM, TASK_PARAM, Task, field_problems

SLEEP: Final = "sleep"
WAIT_EVENT: Final = "wait_event"
APPROVAL: Final = "approval"
MAP: Final = "map"
# The routes a code workflow's waits take: the body, not a step graph, decides what follows,
# so every way out of a wait leads back to the body (none fails the job by itself).
RESUMED, TIMED_OUT = "resumed", "timed_out"
Decision = Literal["approved", "rejected", "expired"]
APPROVED: Final[Decision] = "approved"
REJECTED: Final[Decision] = "rejected"
EXPIRED: Final[Decision] = "expired"
MAP_RESULTS_KEY: Final = "map_results"
"""The state key a code workflow's join leaves its children's results under."""
DEFAULT_MAX_VISITS: Final = 10_000
"""How often one step name may be recorded in a job: a loop that never ends is failed,
saying so, instead of running until its budget."""


class WorkflowFailed(Exception):
    """``wf.fail(reason)``: the job fails with ``reason``, as a definition's fail step."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True)
class Approval:
    """How an approval ended: ``approved``, ``rejected`` or ``expired``."""

    decision: Decision
    decided_by: str | None = None
    comment: str | None = None
    data: dict[str, Any] | None = None
    """The data the decision answered with (``decide(..., data=)``); None: none."""

    @property
    def approved(self) -> bool:
        return self.decision == APPROVED


@dataclass(frozen=True)
class ChildResult:
    """One child of ``wf.map``: its job, its item, how it ended, and what it returned."""

    job_id: str
    item: Any
    status: str
    result: Any = None
    """A code child's return value; a declarative child's final state."""
    error: str | None = None

    @property
    def completed(self) -> bool:
        return self.status == JobStatus.COMPLETED


@dataclass(frozen=True)
class Command:
    """What the body awaits: the next step, as its Resolution, and how the history's
    record of that step is told apart from another (its signature)."""

    resolution: Resolution

    def __await__(self) -> Generator[Command, Any, Any]:
        return (yield self)

    @property
    def label(self) -> str:
        """How a step is named in a non-determinism report."""
        resolution = self.resolution
        return describe(resolution.step_type, resolution.step_name, resolution.params)


def describe(step_type: str, step_name: str | None, params: Mapping[str, Any] | None) -> str:
    name = step_name or step_type
    if step_type == "run_interaction_task":
        return f"step {name!r}"
    detail = ", ".join(f"{k}={v}" for k, v in (params or {}).items() if k != "action")
    return f"{name} ({detail})" if detail else name


Duration = timedelta | float | int
"""A timedelta, or seconds."""


def _millis(duration: Duration, what: str) -> int:
    seconds = duration.total_seconds() if isinstance(duration, timedelta) else duration
    if not isinstance(seconds, int | float) or seconds < 0:
        raise ValueError(f"{what} must be a timedelta or seconds >= 0, got {duration!r}")
    return int(seconds * 1000)


@dataclass
class WorkflowContext:
    """``wf``: the commands a workflow body awaits, and its deterministic time, randomness
    and ids. Made by the replayer for each replay of the body."""

    tenant_id: str
    job_id: str
    workflow_type: str
    workflow_version: int
    _job_uuid: str
    _now: datetime
    _position: int = 0
    _ids: int = field(default=0, repr=False)

    # ---- deterministic values -------------------------------------------------------

    def now(self) -> datetime:
        """The moment the body was last woken (its previous step's end, a wait's end, or the
        submit): the same on every replay."""
        return self._now

    def random(self) -> _random.Random:
        """A random generator seeded from the job and the body's place in its history."""
        return _random.Random(f"{self._job_uuid}:{self._position}")

    def uuid(self) -> _uuid.UUID:
        """An id derived from the job and the body's place in its history."""
        self._ids += 1
        return _uuid.uuid5(
            _uuid.NAMESPACE_URL, f"jobledger:{self._job_uuid}:{self._position}:{self._ids}"
        )

    def _woken(self, position: int, at: datetime) -> None:
        self._position, self._now, self._ids = position, at, 0

    # ---- commands -------------------------------------------------------------------

    def step(self, task: Task, /, *args: Any, **kwargs: Any) -> Awaitable[Any]:
        """Run ``task`` with these arguments as the next step; its return value (as JSON
        turned back into the declared type) once recorded. A recorded step never runs again."""
        if not isinstance(task, Task):
            raise TypeError(f"wf.step() takes a @step function, got {task!r}")
        encoded = task.encode_args(args, kwargs)
        return _Typed(
            Command(
                Resolution(
                    step_type="run_interaction_task",
                    next_status=JobStatus.QUEUED,
                    step_name=task.name,
                    transition_reason=f"step {task.name!r}",
                    retry_policy=task.retry,
                    params={TASK_PARAM: task.name, ARGS_PARAM: encoded},
                )
            ),
            task,
        )

    def sleep(self, duration: Duration) -> Command:
        """A durable timer: the job waits (no worker holds it) and goes on after ``duration``."""
        ms = _millis(duration, "wf.sleep()")
        return Command(
            Resolution(
                step_type="wait_time",
                next_status=JobStatus.WAITING_TIME,
                step_name=SLEEP,
                transition_reason=f"sleep {timedelta(milliseconds=ms)}",
                resume_delay_ms=ms,
                params={"delay_ms": ms},
            )
        )

    def sleep_until(self, moment: datetime) -> Command:
        """A durable timer until ``moment`` (timezone-aware)."""
        if not isinstance(moment, datetime) or moment.tzinfo is None:
            raise ValueError(f"wf.sleep_until() needs a timezone-aware datetime, got {moment!r}")
        at = moment.astimezone(UTC)
        return Command(
            Resolution(
                step_type="wait_time",
                next_status=JobStatus.WAITING_TIME,
                step_name=SLEEP,
                transition_reason=f"sleep until {at.isoformat()}",
                resume_at=at,
                params={"until": at.isoformat()},
            )
        )

    def wait_event(self, name: str, *, timeout: Duration | None = None) -> Command:
        """Wait for the outside event ``name`` (a resume token handed to the notifier, or a
        signal): its payload, or None if ``timeout`` passed first."""
        if not isinstance(name, str) or not name:
            raise ValueError(f"wf.wait_event() needs an event name, got {name!r}")
        ms = None if timeout is None else _millis(timeout, "wf.wait_event(timeout=)")
        reason = f"wait for event {name!r}" + (
            "" if ms is None else f" (timeout {timedelta(milliseconds=ms)})"
        )
        return Command(
            Resolution(
                step_type="wait_event",
                next_status=JobStatus.WAITING_EVENT,
                step_name=WAIT_EVENT,
                next_step=RESUMED,
                transition_reason=reason,
                wait_event_name=name,
                wait_timeout_ms=ms,
                on_timeout=None if ms is None else TIMED_OUT,
                params={"event": name, "timeout_ms": ms},
            )
        )

    def approval(
        self,
        *,
        approvers: Sequence[str] = (),
        expires: Duration | None = None,
        action: Mapping[str, Any] | None = None,
        name: str = APPROVAL,
        quorum: int | None = None,
    ) -> Command:
        """Wait for a person's decision (an :class:`Approval`). ``approvers``: who may decide
        (empty: anyone the deployment trusts); ``expires``: after which it ends ``expired``;
        ``action``: what is being approved, bound into the request's action hash;
        ``quorum``: how many of ``approvers`` must approve, each voting once."""
        if isinstance(approvers, str):
            raise TypeError("approvers must be a list of names, not one string")
        ms = None if expires is None else _millis(expires, "wf.approval(expires=)")
        who = tuple(approvers)
        # Only when set: the params of an approval without one hash as they always did.
        counted = {} if quorum is None else {"quorum": quorum}
        reason = f"await approval{' by ' + ', '.join(who) if who else ''}"
        return Command(
            Resolution(
                step_type="await_approval",
                next_status=JobStatus.AWAITING_APPROVAL,
                step_name=name,
                next_step=APPROVED,
                transition_reason=reason,
                approval=ApprovalSpec(
                    approvers=who,
                    expires_ms=ms,
                    on_approve=APPROVED,
                    on_reject=REJECTED,
                    on_expire=EXPIRED,
                    quorum=quorum,
                ),
                params={
                    "approvers": list(who),
                    "expires_ms": ms,
                    "action": dict(action or {}),
                    **counted,
                },
            )
        )

    def map(
        self,
        child: CodeWorkflow | tuple[str, int],
        items: Sequence[Any],
        *,
        join: Literal["all"] | int = "all",
        on_failure: Literal["fail_fast", "collect"] = "fail_fast",
        timeout: Duration | None = None,
        name: str = MAP,
    ) -> Command:
        """Spawn one child job per item and wait for the join: ``all`` of them to finish,
        or ``join`` (a number) of them to complete. A list of :class:`ChildResult`, in item
        order. ``child``: a code workflow, or a definition's (type, version). A dict item
        is the child's input; any other item is the value of a code child's one parameter
        (or ``{"item": item}``)."""
        workflow_type, version, into = _child(child)
        listed = list(items)
        need = None if join == "all" else join
        if need is not None and (not isinstance(need, int) or not 0 < need <= len(listed)):
            raise ValueError(f"wf.map(join={join!r}): 'all' or a number from 1 to {len(listed)}")
        ms = None if timeout is None else _millis(timeout, "wf.map(timeout=)")
        reason = f"spawn {len(listed)} x {workflow_type!r} v{version}, join {join}"
        request = MapRequest(
            workflow_type=workflow_type,
            workflow_version=version,
            items=tuple((item, into(item)) for item in listed),
            need=need,
            on_failure=on_failure,
            results=MAP_RESULTS_KEY,
            on_timeout=None if ms is None else TIMED_OUT,
        )
        return Command(
            Resolution(
                step_type="map",
                next_status=JobStatus.WAITING_CHILDREN,
                step_name=name,
                next_step=RESUMED,
                transition_reason=reason,
                params=request.to_params(),
                wait_timeout_ms=ms,
                on_timeout=request.on_timeout,
                children=request,
            )
        )

    def fail(self, reason: str) -> NoReturn:
        """Fail the job now with ``reason`` (its ``last_error``)."""
        raise WorkflowFailed(str(reason))


@dataclass(frozen=True)
class _Typed:
    """A step's command, awaited for its value as the task's declared return type."""

    command: Command
    task: Task

    def __await__(self) -> Generator[Command, Any, Any]:
        value = yield self.command
        return self.task.decode_result(value)


def _child(
    child: CodeWorkflow | tuple[str, int],
) -> tuple[str, int, Callable[[Any], dict[str, Any]]]:
    if isinstance(child, CodeWorkflow):
        return child.type, child.version, child.input_of_item
    if isinstance(child, tuple) and len(child) == 2:
        kind, version = child
        return str(kind), int(version), _item_input
    raise TypeError(f"wf.map() takes a @workflow or a (type, version) pair, got {child!r}")


def _item_input(item: Any) -> dict[str, Any]:
    return dict(item) if isinstance(item, Mapping) else {"item": item}


Body = Callable[..., Awaitable[Any]]


class CodeWorkflow:
    """A workflow body bound to its type and version, with its input and result types."""

    def __init__(
        self,
        body: Body,
        workflow_type: str,
        version: int,
        *,
        budget: Mapping[str, Any] | None = None,
        retry: RetryPolicy | None = None,
        personal_data: Sequence[str] = (),
        max_visits: int = DEFAULT_MAX_VISITS,
    ) -> None:
        if not inspect.iscoroutinefunction(body):
            raise TypeError(f"@workflow({workflow_type!r}) needs an async def, got {body!r}")
        if not isinstance(version, int) or isinstance(version, bool) or version < 1:
            raise ValueError(f"@workflow({workflow_type!r}): version must be an int >= 1")
        problems = [p for p in map(path_problem, personal_data) if p is not None]
        if problems:
            raise ValueError(f"@workflow({workflow_type!r}) personal_data: {problems[0]}")
        self.body = body
        self.type = workflow_type
        self.version = version
        self.budget = dict(budget or {})
        self.retry = retry
        self.personal_data = tuple(personal_data)
        self.max_visits = max_visits
        hints = get_type_hints(body)
        parameters = list(inspect.signature(body).parameters.values())[1:]
        self._parameters = [p.name for p in parameters]
        # The job's input binds to the body's parameters by name, always: one rule, so an
        # input reads the same whatever the parameters' types.
        fields: dict[str, Any] = {
            p.name: (hints.get(p.name, Any), ... if p.default is p.empty else p.default)
            for p in parameters
        }
        self._inputs: type[BaseModel] = create_model(
            f"{workflow_type}_v{version}_input", __config__=ConfigDict(extra="ignore"), **fields
        )
        self._returns: TypeAdapter[Any] = TypeAdapter(hints.get("return", Any))

    @property
    def key(self) -> tuple[str, int]:
        return (self.type, self.version)

    @property
    def label(self) -> str:
        return f"workflow {self.type!r} v{self.version}"

    def __repr__(self) -> str:
        return f"<{self.label} ({self.body.__module__}.{self.body.__qualname__})>"

    def tasks(self) -> list[Task]:
        """The step functions the body refers to by name (its module's globals and its
        closure): what a worker running it must serve."""
        code = self.body.__code__
        names = set(code.co_names)
        found = {
            v.name: v
            for k, v in self.body.__globals__.items()
            if k in names and isinstance(v, Task)
        }
        for cell in self.body.__closure__ or ():
            value = cell.cell_contents
            if isinstance(value, Task):
                found[value.name] = value
        return [found[name] for name in sorted(found)]

    def arguments(self, state: Mapping[str, Any]) -> dict[str, Any]:
        """The body's arguments from the job's input (its submitted state), key by
        parameter name; keys no parameter takes are left in the state. A ValueError names
        each field that does not fit."""
        try:
            model = self._inputs.model_validate(dict(state))
        except ValidationError as error:
            raise ValueError(f"{self.label} input: {field_problems(error)}") from None
        return {name: getattr(model, name) for name in self._parameters}

    def input_of_item(self, item: Any) -> dict[str, Any]:
        """A child's input from a map item: a dict as it is, any other value as the value
        of the body's one parameter."""
        if isinstance(item, Mapping):
            return dict(item)
        if len(self._parameters) == 1:
            return {self._parameters[0]: item}
        return {"item": item}

    def encode_result(self, value: Any) -> Any:
        try:
            return self._returns.dump_python(self._returns.validate_python(value), mode="json")
        except (ValidationError, ValueError, TypeError) as error:
            detail = field_problems(error) if isinstance(error, ValidationError) else str(error)
            raise ValueError(f"{self.label} returned a value it cannot record: {detail}") from None

    def decode_child_result(self, value: Any) -> Any:
        try:
            return self._returns.validate_python(value)
        except ValidationError:
            return value


def workflow(
    workflow_type: str,
    *,
    version: int = 1,
    budget: Mapping[str, Any] | None = None,
    retry: RetryPolicy | None = None,
    personal_data: Sequence[str] = (),
    max_visits: int = DEFAULT_MAX_VISITS,
) -> Callable[[Body], CodeWorkflow]:
    """Make ``async def body(wf, ...)`` the workflow ``workflow_type`` at ``version``.

    ``budget``: its defaults (``max_steps``, ``max_cost_usd``, ``deadline_seconds``);
    ``retry``: the policy a ``StepError(retryable=True)`` raised by the body itself
    retries under; ``personal_data``: dotted paths into its input that are personal;
    ``max_visits``: how often one step name may be recorded (bounds a runaway loop)."""

    def bind(body: Body) -> CodeWorkflow:
        return CodeWorkflow(
            body,
            workflow_type,
            version,
            budget=budget,
            retry=retry,
            personal_data=personal_data,
            max_visits=max_visits,
        )

    return bind
