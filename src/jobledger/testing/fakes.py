"""Recording fakes for step functions: the executor runs a stand-in for a task name,
checked against the real function's signature and return type, and keeps every call.

Nothing in the user's modules is patched: the engine's executor is wrapped once, when the
test environment is built, and a fake is looked up by task name each time a step runs.
"""

from __future__ import annotations

import copy
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from jobledger.domain.steps import StepRequest, StepResult
from jobledger.orchestration.ports import StepExecutor
from jobledger.testing.handle import WorkflowTestError
from jobledger.workflows.tasks import TASK_PARAM, StepContext, Task, TaskExecutor


@dataclass(frozen=True)
class StepCall:
    """One run of a faked step, as the engine made it."""

    tenant_id: str
    job_id: str
    step_number: int
    idempotency_key: str
    attempt: int
    """0 on the first run of the step, n on its n-th retry."""
    args: Mapping[str, Any]
    """The step's arguments by parameter name, typed as the real function declares them."""


UNSET: Any = object()
"""What ``returns`` is when no value was given (None is a value a step may return)."""


@dataclass
class StepFake:
    """What a faked task does instead of its function, and the calls it received.

    Exactly one of ``returns`` (the value every call returns), ``side_effect`` (called
    with the :class:`StepCall`; what it returns is the step's value, what it raises is the
    step's error) or ``raises`` (an exception raised on every call) is set."""

    task: Task
    returns: Any = UNSET
    side_effect: Callable[[StepCall], Any] | None = None
    raises: BaseException | None = None
    calls: list[StepCall] = field(default_factory=list)

    def __post_init__(self) -> None:
        given = [self.returns is not UNSET, self.side_effect is not None, self.raises is not None]
        if sum(given) != 1:
            raise ValueError(
                f"fake({self.task.name!r}) takes exactly one of returns=, side_effect=, raises="
            )
        self._executor = TaskExecutor([_stand_in(self.task, self._run)])

    @property
    def last_call(self) -> StepCall:
        if not self.calls:
            raise WorkflowTestError(f"step {self.task.name!r} was never called")
        return self.calls[-1]

    def execute(self, request: StepRequest) -> StepResult:
        # The stand-in is synchronous: the executor hands back its StepResult at once.
        result: StepResult = self._executor.execute(request)
        return result

    def _run(self, context: StepContext, **args: Any) -> Any:
        call = StepCall(
            tenant_id=context.tenant_id,
            job_id=context.job_id,
            step_number=context.step_number,
            idempotency_key=context.idempotency_key,
            attempt=context.attempt,
            args=args,
        )
        self.calls.append(call)
        if self.raises is not None:
            raise self.raises
        if self.side_effect is not None:
            return self.side_effect(call)
        return self.returns


def _stand_in(task: Task, run: Callable[..., Any]) -> Task:
    """``task`` with ``run`` in place of its function: the same name, arguments and return
    type, so a fake's value is checked as the real function's would be. ``run`` always
    takes the step's context (it records the idempotency key and attempt)."""
    stand_in = copy.copy(task)
    stand_in.fn = run
    stand_in.is_async = False
    stand_in.takes_context = True
    return stand_in


class FakingExecutor:
    """The engine's executor, with the faked task names served by their fakes."""

    def __init__(self, inner: StepExecutor) -> None:
        self.inner = inner
        self.fakes: dict[str, StepFake] = {}

    def serves(self, task: Task) -> bool:
        """Whether a step of the engine's can run ``task``: only those can be faked."""
        return isinstance(self.inner, TaskExecutor) and self.inner.serves(task.name)

    def execute(self, request: StepRequest) -> StepResult | Awaitable[StepResult]:
        name = request.resolution.params.get(TASK_PARAM)
        fake = self.fakes.get(name) if isinstance(name, str) else None
        if fake is not None:
            return fake.execute(request)
        return self.inner.execute(request)
