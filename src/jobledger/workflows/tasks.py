"""Steps as functions: ``@step`` binds a task name to a typed function, and
:class:`TaskExecutor` (a StepExecutor) runs the function a step's ``params["task"]`` names.

Inputs and outputs cross the log as JSON, so both are checked where they cross: a step's
arguments against the function's annotations when the workflow asks for the step (and
again when the executor reads them back from the log), its return value against its
return annotation. A value that does not fit is a step error naming the field.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation
from typing import Any, Final, TypeVar, get_type_hints, overload

from pydantic import BaseModel, ConfigDict, TypeAdapter, ValidationError, create_model

from jobledger.domain.errors import StepError
from jobledger.domain.steps import RetryPolicy, StepRequest, StepResult

TASK_PARAM: Final = "task"
"""The params key that names the function a step runs (a definition's, or code's)."""
ARGS_PARAM: Final = "args"
"""A code workflow's step arguments, by parameter name, as JSON."""
SAVE_AS_PARAM: Final = "save_as"
"""A declarative step's params may name the state key its result is saved under."""
RESULT_KEY: Final = "result"
"""The step output key that holds a function's return value."""

_F = TypeVar("_F", bound=Callable[..., Any])


@dataclass
class StepContext:
    """What a step function is handed when its first parameter is annotated with it."""

    tenant_id: str
    job_id: str
    step_number: int
    idempotency_key: str
    """Stable for this step across every re-delivery: pass it to the systems you call."""
    attempt: int
    """0 on the first run of the step, n on its n-th retry."""
    state: Mapping[str, Any]
    """The job's state, read-only."""
    budget: Mapping[str, Any]
    """The job's budget, read-only."""
    span: Any
    """The step's span: ``span.set({...})`` and ``span.event(name, {...})`` land in its trace."""
    _heartbeat: Callable[[], bool] | None = field(default=None, repr=False)
    spent_usd: Decimal = Decimal(0)

    def spend(self, usd: Decimal | float | int | str) -> None:
        """Add ``usd`` to what this step cost (it counts toward the job's and the tenant's
        budgets once the step is recorded)."""
        try:
            amount = Decimal(str(usd))
        except InvalidOperation:
            raise StepError(
                f"spend({usd!r}): not an amount of money", kind="invalid_cost"
            ) from None
        if not amount.is_finite() or amount < 0:
            raise StepError(f"spend({usd!r}): must be a finite amount >= 0", kind="invalid_cost")
        self.spent_usd += amount

    def heartbeat(self) -> bool:
        """Renew the step's lease now (a heartbeat runs by itself every lease/3; call this
        between the parts of a long step to learn early). False once another worker took
        the job over: its result would not be recorded, so stop."""
        return True if self._heartbeat is None else self._heartbeat()


class Task:
    """A function bound to a task name, with its signature read once."""

    def __init__(
        self, name: str, fn: Callable[..., Any], *, retry: RetryPolicy | None = None
    ) -> None:
        if not name or not isinstance(name, str):
            raise ValueError(f"a step's task name must be a non-empty string, got {name!r}")
        self.name = name
        self.fn = fn
        self.retry = retry
        self.is_async = inspect.iscoroutinefunction(fn)
        hints = get_type_hints(fn)
        parameters = list(inspect.signature(fn).parameters.values())
        self.takes_context = bool(parameters) and hints.get(parameters[0].name) is StepContext
        if self.takes_context:
            parameters = parameters[1:]
        self.parameters = tuple(parameters)
        fields: dict[str, Any] = {
            p.name: (hints.get(p.name, Any), ... if p.default is p.empty else p.default)
            for p in parameters
        }
        self._inputs: type[BaseModel] = create_model(
            f"{name}_input", __config__=ConfigDict(extra="forbid"), **fields
        )
        returns = hints.get("return", Any)
        self.returns_result = returns is StepResult
        self._returns_name = getattr(returns, "__name__", None) or str(returns)
        self._output: TypeAdapter[Any] = TypeAdapter(returns)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """The function itself, for tests and for calling it outside a workflow."""
        return self.fn(*args, **kwargs)

    def __repr__(self) -> str:
        return f"<step {self.name!r} ({self.fn.__module__}.{self.fn.__qualname__})>"

    # ---- the arguments, as the log holds them ----------------------------------------

    def encode_args(self, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> dict[str, Any]:
        """Bind a call's arguments to the function's parameters, check them, and return
        them as JSON by parameter name. A TypeError or ValueError names what is wrong."""
        names = [p.name for p in self.parameters]
        if len(args) > len(names):
            raise TypeError(f"step {self.name!r} takes {len(names)} arguments, got {len(args)}")
        bound = dict(zip(names, args, strict=False))
        for key, value in kwargs.items():
            if key in bound:
                raise TypeError(f"step {self.name!r} got argument {key!r} twice")
            bound[key] = value
        try:
            model = self._inputs.model_validate(bound)
        except ValidationError as error:
            raise ValueError(f"step {self.name!r}: {field_problems(error)}") from None
        return model.model_dump(mode="json")

    def decode_args(self, args: Mapping[str, Any], *, extra: bool = False) -> dict[str, Any]:
        """The typed arguments from their JSON; ``extra``: ignore unknown keys (a
        definition's params carry the price and other keys no parameter takes)."""
        wanted = {p.name for p in self.parameters}
        given = {k: v for k, v in args.items() if k in wanted} if extra else dict(args)
        try:
            model = self._inputs.model_validate(given)
        except ValidationError as error:
            raise StepError(
                f"step {self.name!r}: input {field_problems(error)}", kind="invalid_input"
            ) from None
        return {name: getattr(model, name) for name in wanted}

    def decode_result(self, value: Any) -> Any:
        """A recorded return value (JSON) as the declared return type, for the workflow
        that awaited it. A value recorded by an older version of the function that no
        longer fits is handed over as recorded."""
        if self.returns_result:
            return value
        try:
            return self._output.validate_python(value)
        except ValidationError:
            return value

    def encode_result(self, value: Any) -> Any:
        """The return value as JSON, checked against the return annotation."""
        try:
            return self._output.dump_python(self._output.validate_python(value), mode="json")
        except (ValidationError, ValueError, TypeError) as error:
            detail = field_problems(error) if isinstance(error, ValidationError) else str(error)
            raise StepError(
                f"step {self.name!r} returned a value that is not its declared "
                f"{self._returns_name}: {detail}",
                kind="invalid_output",
            ) from None


@overload
def step(name: _F, /) -> Task: ...
@overload
def step(
    name: str | None = None, /, *, retry: RetryPolicy | None = None
) -> Callable[[_F], Task]: ...


def step(
    name: str | Callable[..., Any] | None = None, /, *, retry: RetryPolicy | None = None
) -> Task | Callable[[Callable[..., Any]], Task]:
    """Bind a task name (the function's name by default) to a step function, sync or
    ``async``. Its first parameter may be a :class:`StepContext`; the others, and its
    return value, are checked against their annotations (pydantic models included).
    ``retry``: the policy its ``StepError(retryable=True)`` failures retry under."""
    if callable(name):
        return Task(name.__name__, name)

    def bind(fn: Callable[..., Any]) -> Task:
        return Task(name or fn.__name__, fn, retry=retry)

    return bind


class TaskExecutor:
    """The StepExecutor of step functions: a step runs the function its ``params["task"]``
    names; a step naming none is handed to ``fallback`` (the one-executor way)."""

    def __init__(self, tasks: Iterable[Task] = (), *, fallback: Any = None) -> None:
        self.tasks: dict[str, Task] = {}
        self.fallback = fallback
        for task in tasks:
            self.add(task)

    def add(self, task: Task) -> None:
        known = self.tasks.get(task.name)
        if known is not None and known.fn is not task.fn:
            raise ValueError(f"two functions serve task {task.name!r}: {known!r} and {task!r}")
        self.tasks[task.name] = task

    def serves(self, name: str) -> bool:
        return name in self.tasks

    def execute(self, request: StepRequest) -> Any:
        params = request.resolution.params
        name = params.get(TASK_PARAM)
        task = self.tasks.get(name) if isinstance(name, str) else None
        if task is None:
            if self.fallback is not None:
                return self.fallback.execute(request)
            raise StepError(f"no step function serves task {name!r}", kind="unknown_task")
        if ARGS_PARAM in params:
            kwargs = task.decode_args(params[ARGS_PARAM])
        else:
            kwargs = task.decode_args(params, extra=True)
        context = _context(request)
        args = (context,) if task.takes_context else ()
        if task.is_async:
            return _finish_async(task, task.fn(*args, **kwargs), context, params)
        return _result(task, task.fn(*args, **kwargs), context, params)


async def _finish_async(
    task: Task, running: Any, context: StepContext, params: Mapping[str, Any]
) -> StepResult:
    return _result(task, await running, context, params)


def _result(task: Task, value: Any, context: StepContext, params: Mapping[str, Any]) -> StepResult:
    if task.returns_result or isinstance(value, StepResult):
        result: StepResult = value
        cost = Decimal(str(result.cost_usd)) + context.spent_usd
        return StepResult(output=result.output, state_patch=result.state_patch, cost_usd=cost)
    encoded = task.encode_result(value)
    save_as = params.get(SAVE_AS_PARAM)
    patch = {save_as: encoded} if isinstance(save_as, str) and save_as else {}
    return StepResult(output={RESULT_KEY: encoded}, state_patch=patch, cost_usd=context.spent_usd)


def _context(request: StepRequest) -> StepContext:
    job = request.job
    return StepContext(
        tenant_id=job.tenant_id,
        job_id=job.job_id,
        step_number=request.step_number,
        idempotency_key=request.idempotency_key,
        attempt=job.attempt,
        state=job.state,
        budget=job.budget,
        span=request.span,
        _heartbeat=request.heartbeat,
    )


def field_problems(error: ValidationError) -> str:
    """Each problem with the field it is in: ``field 'notes': Input should be ...``."""
    parts = []
    for problem in error.errors():
        where = ".".join(str(part) for part in problem["loc"])
        parts.append(f"field {where!r}: {problem['msg']}" if where else problem["msg"])
    return "; ".join(parts)
