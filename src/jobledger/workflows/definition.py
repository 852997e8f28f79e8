"""The shape of a declarative workflow definition, as pydantic models.

A definition is a YAML or JSON document::

    type: research_mission
    version: 1
    budget: {max_steps: 40, max_cost_usd: 25, deadline: {hours: 336}}
    start: plan
    steps:
      plan: {kind: run_interaction_task, params: {task: plan}, next: done}
      done: {kind: complete}

These models check each field (types are strict, unknown fields are refused); the graph
as a whole (references, reachability, bounded cycles) is checked by the loader.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated, Any, Final, Literal, TypeAlias

from pydantic import (
    AwareDatetime,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    NonNegativeInt,
    PlainSerializer,
    PlainValidator,
    PositiveInt,
    field_validator,
    model_validator,
)

from jobledger.domain.erasure import path_problem
from jobledger.domain.errors import JobLedgerError
from jobledger.domain.steps import RetryPolicy
from jobledger.workflows.conditions import Condition, is_json, parse_condition

GATED_KINDS: Final = frozenset({"await_approval", "wait_event"})
"""Steps that wait for the outside world: a cycle through one is bounded by people."""

_DEFAULT_RETRY: Final = RetryPolicy()
_UNIT_MS: Final = {"days": 86_400_000, "hours": 3_600_000, "minutes": 60_000, "seconds": 1_000}


class DefinitionError(JobLedgerError):
    """One or more workflow definitions are invalid; ``problems`` lists every one found,
    each naming the file, the step and the field."""

    def __init__(self, problems: Sequence[str]) -> None:
        self.problems = list(problems)
        if len(self.problems) == 1:
            message = self.problems[0]
        else:
            lines = "".join(f"\n  - {problem}" for problem in self.problems)
            message = f"{len(self.problems)} problems in workflow definitions:{lines}"
        super().__init__(message)


def problem(source: str, message: str, step: str | None = None, field: str | None = None) -> str:
    """``source: step 'x': field 'y': message``, leaving out what does not apply."""
    where = [source]
    if step is not None:
        where.append(f"step {step!r}")
    if field:
        where.append(f"field {field!r}")
    return ": ".join([*where, message])


class FieldError(ValueError):
    """A check on a model that concerns one named field of it."""

    def __init__(self, message: str, field: str) -> None:
        super().__init__(message)
        self.field = field


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


# ---- durations ---------------------------------------------------------------------------


def _seconds_as_mapping(value: object) -> object:
    """A bare number is a count of seconds."""
    if isinstance(value, bool):
        return value
    if isinstance(value, int):
        return {"seconds": value}
    if isinstance(value, float):
        return {"ms": round(value * 1000)}
    return value


class Duration(_Model):
    """A span of time: ``{days, hours, minutes, seconds, ms}`` (any mix), or seconds."""

    days: NonNegativeInt = 0
    hours: NonNegativeInt = 0
    minutes: NonNegativeInt = 0
    seconds: NonNegativeInt = 0
    ms: NonNegativeInt = 0

    @model_validator(mode="after")
    def _positive(self) -> Duration:
        if self.total_ms() == 0:
            raise ValueError("a duration must be longer than zero")
        return self

    def total_ms(self) -> int:
        counts = (self.days, self.hours, self.minutes, self.seconds)
        return self.ms + sum(n * size for n, size in zip(counts, _UNIT_MS.values(), strict=True))

    def describe(self) -> str:
        """``1d12h``, ``1m30s``, ``1500ms``: the exact span, largest units first."""
        rest, parts = self.total_ms(), []
        for unit, size in _UNIT_MS.items():
            if unit == "seconds" and rest % size:
                break  # not whole seconds: say the rest in ms
            count, rest = divmod(rest, size)
            if count:
                parts.append(f"{count}{unit[0]}")
        if rest:
            parts.append(f"{rest}ms")
        return "".join(parts)


DurationField: TypeAlias = Annotated[Duration, BeforeValidator(_seconds_as_mapping)]
StepRef: TypeAlias = Annotated[str, Field(min_length=1)]


# ---- retry policy, branch cases ----------------------------------------------------------


class RetrySpec(_Model):
    max_attempts: PositiveInt = _DEFAULT_RETRY.max_attempts
    initial_backoff_ms: NonNegativeInt = _DEFAULT_RETRY.initial_backoff_ms
    multiplier: float = Field(_DEFAULT_RETRY.multiplier, ge=1.0)
    max_backoff_ms: NonNegativeInt = _DEFAULT_RETRY.max_backoff_ms
    retry_on: list[Annotated[str, Field(min_length=1)]] = []
    """Error kinds that retry; empty means every error marked retryable."""

    @model_validator(mode="after")
    def _ordered_backoff(self) -> RetrySpec:
        if self.max_backoff_ms < self.initial_backoff_ms:
            raise FieldError("must be at least initial_backoff_ms", "max_backoff_ms")
        return self

    def policy(self) -> RetryPolicy:
        return RetryPolicy(
            max_attempts=self.max_attempts,
            initial_backoff_ms=self.initial_backoff_ms,
            multiplier=self.multiplier,
            max_backoff_ms=self.max_backoff_ms,
            retry_on=frozenset(self.retry_on),
        )


def _condition(value: object) -> Condition:
    if isinstance(value, Condition):
        return value
    return parse_condition(value)


ConditionField: TypeAlias = Annotated[
    Condition,
    PlainValidator(_condition),
    PlainSerializer(lambda condition: condition.to_data()),
]


class Case(_Model):
    when: ConditionField
    next: StepRef


# ---- steps -------------------------------------------------------------------------------


class _Step(_Model):
    max_visits: PositiveInt | None = None
    """How many times the step may run; one more visit fails the job."""
    description: str | None = None

    kind: str

    def targets(self) -> tuple[tuple[str, str], ...]:
        """The steps this one may lead to, each with the field that names it."""
        return ()

    @property
    def bounded(self) -> bool:
        """Whether a cycle through this step is bounded (by a count or by a person)."""
        return self.max_visits is not None or self.kind in GATED_KINDS


class RunInteractionTask(_Step):
    """Calls the executor with ``params``; retries per ``retry``."""

    kind: Literal["run_interaction_task"]
    next: StepRef
    params: dict[str, Any] = {}
    retry: RetrySpec | None = None

    @field_validator("params")
    @classmethod
    def _json_params(cls, params: dict[str, Any]) -> dict[str, Any]:
        if not is_json(params):
            raise ValueError("must be JSON data (quote dates and times in YAML)")
        return params

    def targets(self) -> tuple[tuple[str, str], ...]:
        return (("next", self.next),)


class WaitTime(_Step):
    """A durable timer: a ``delay`` from now, or ``until`` an absolute time."""

    kind: Literal["wait_time"]
    next: StepRef
    delay: DurationField | None = None
    until: Annotated[AwareDatetime, Field(strict=False)] | None = None

    @model_validator(mode="after")
    def _one_of_delay_or_until(self) -> WaitTime:
        if self.delay is not None and self.until is not None:
            raise FieldError("give either delay or until, not both", "until")
        if self.delay is None and self.until is None:
            raise FieldError("give a delay or an until time", "delay")
        return self

    def targets(self) -> tuple[tuple[str, str], ...]:
        return (("next", self.next),)


class WaitEvent(_Step):
    """Parks until ``event`` arrives, or until ``timeout`` passes (then ``on_timeout``)."""

    kind: Literal["wait_event"]
    event: Annotated[str, Field(min_length=1)]
    next: StepRef
    timeout: DurationField | None = None
    on_timeout: StepRef | None = None
    """None fails the job when the wait times out."""

    @model_validator(mode="after")
    def _timeout_for_on_timeout(self) -> WaitEvent:
        if self.on_timeout is not None and self.timeout is None:
            raise FieldError("on_timeout needs a timeout", "on_timeout")
        return self

    def targets(self) -> tuple[tuple[str, str], ...]:
        return _named(("next", self.next), ("on_timeout", self.on_timeout))


class AwaitApproval(_Step):
    """A human gate; each decision names where the job goes next."""

    kind: Literal["await_approval"]
    approvers: list[Annotated[str, Field(min_length=1)]] = []
    expires: DurationField | None = None
    on_approve: StepRef
    on_reject: StepRef | None = None
    """None fails the job on rejection."""
    on_expire: StepRef | None = None
    """None fails the job when the request expires."""
    quorum: PositiveInt | None = None
    """How many of ``approvers`` must approve (each votes once); None: one decides."""

    @model_validator(mode="after")
    def _expiry_for_on_expire(self) -> AwaitApproval:
        if self.on_expire is not None and self.expires is None:
            raise FieldError("on_expire needs an expires duration", "on_expire")
        return self

    @model_validator(mode="after")
    def _reachable_quorum(self) -> AwaitApproval:
        repeated = sorted({name for name in self.approvers if self.approvers.count(name) > 1})
        if repeated:
            raise FieldError(f"{', '.join(map(repr, repeated))} listed more than once", "approvers")
        if self.quorum is not None and self.quorum > len(self.approvers):
            raise FieldError(
                f"quorum {self.quorum} needs that many named approvers; "
                f"{len(self.approvers)} listed",
                "quorum",
            )
        return self

    def targets(self) -> tuple[tuple[str, str], ...]:
        return _named(
            ("on_approve", self.on_approve),
            ("on_reject", self.on_reject),
            ("on_expire", self.on_expire),
        )


class Branch(_Step):
    """Goes to the first case whose condition holds on the job's state, else ``default``."""

    kind: Literal["branch"]
    cases: list[Case] = Field(min_length=1)
    default: StepRef

    def targets(self) -> tuple[tuple[str, str], ...]:
        cases = tuple((f"cases.{i}.next", case.next) for i, case in enumerate(self.cases))
        return (*cases, ("default", self.default))


class _Terminal(_Step):
    next: None = Field(None, exclude=True)

    @field_validator("next", mode="before")
    @classmethod
    def _no_next(cls, value: object) -> None:
        raise ValueError("a terminal step (complete or fail) takes no next step")


class Complete(_Terminal):
    """Terminal: the workflow finished."""

    kind: Literal["complete"]


class Fail(_Terminal):
    """Terminal: the workflow gives up, saying why."""

    kind: Literal["fail"]
    reason: Annotated[str, Field(min_length=1)]


ITEM: Final = "$item"
"""In a map step's ``input``, the item a child is spawned for (``$item.x``: a field of it)."""
STATE: Final = "$state."
"""In a map step's ``input``, a value of the parent's state at a dotted path."""
MAX_CHILDREN: Final = 1_000
"""How many children one map step may spawn (a fixed list, or a state list at run time)."""


def _join(value: object) -> str | int:
    if value in ("all", "any"):
        assert isinstance(value, str)
        return value
    if isinstance(value, int) and not isinstance(value, bool) and value >= 1:
        return value
    raise ValueError(f"must be all, any or a number of children (1 or more), got {value!r}")


JoinField: TypeAlias = Annotated[str | int, PlainValidator(_join)]


class MapStep(_Step):
    """Fan-out and join: one child job per item (a fixed ``items`` list, or the list at
    the state path ``items_from``), of workflow ``workflow`` v``version``, each given
    ``input`` (values ``$item``, ``$item.path``, ``$state.path`` or literals). The
    parent waits until ``join`` (all, any, or a count) of them completed, then writes
    one result per item to ``results`` in its state and goes to ``next``."""

    kind: Literal["map"]
    items: list[Any] | None = Field(None, max_length=MAX_CHILDREN)
    items_from: Annotated[str, Field(min_length=1)] | None = None
    workflow: Annotated[str, Field(min_length=1)]
    version: PositiveInt
    input: dict[Annotated[str, Field(min_length=1)], Any] = {ITEM.removeprefix("$"): ITEM}
    join: JoinField = "all"
    on_failure: Literal["fail_fast", "collect"] = "fail_fast"
    results: Annotated[str, Field(min_length=1)]
    """The state key each child's result lands under, as a list in item order."""
    timeout: DurationField | None = None
    on_timeout: StepRef | None = None
    """None fails the job when the join times out."""
    next: StepRef

    @field_validator("items", "input")
    @classmethod
    def _json_values(cls, value: object) -> object:
        if not is_json(value):
            raise ValueError("must be JSON data (quote dates and times in YAML)")
        return value

    @field_validator("items_from")
    @classmethod
    def _path(cls, path: str) -> str:
        found = path_problem(path)
        if found is not None:
            raise ValueError(found)
        return path

    @field_validator("results")
    @classmethod
    def _results_key(cls, key: str) -> str:
        if "." in key:
            raise ValueError("must be one top-level state key, not a dotted path")
        return key

    @model_validator(mode="after")
    def _consistent(self) -> MapStep:
        if (self.items is None) == (self.items_from is None):
            raise FieldError("give either items (a list) or items_from (a state path)", "items")
        if self.on_timeout is not None and self.timeout is None:
            raise FieldError("on_timeout needs a timeout", "on_timeout")
        if isinstance(self.join, int) and self.items is not None and self.join > len(self.items):
            raise FieldError(f"join {self.join} is more than the {len(self.items)} items", "join")
        for name, value in self.input.items():
            if isinstance(value, str) and value.startswith("$") and _reference(value) is None:
                raise FieldError(
                    f"input {name!r}: {value!r} is not $item, $item.<path> or $state.<path>",
                    "input",
                )
        return self

    def targets(self) -> tuple[tuple[str, str], ...]:
        return _named(("next", self.next), ("on_timeout", self.on_timeout))

    @property
    def need(self) -> int | None:
        """How many children must complete; None: every child must finish."""
        if isinstance(self.join, int):
            return self.join
        return 1 if self.join == "any" else None


def _reference(value: str) -> tuple[str, str | None] | None:
    """("item", path or None) or ("state", path) for an input reference, else None."""
    if value == ITEM:
        return ("item", None)
    for prefix, source in ((ITEM + ".", "item"), (STATE, "state")):
        if value.startswith(prefix) and path_problem(value.removeprefix(prefix)) is None:
            return (source, value.removeprefix(prefix))
    return None


def input_reference(value: object) -> tuple[str, str | None] | None:
    """How a map step's input value is read: ("item", path), ("state", path), or None
    for a literal."""
    return _reference(value) if isinstance(value, str) else None


def _named(*targets: tuple[str, str | None]) -> tuple[tuple[str, str], ...]:
    """The (field, step) pairs whose step is set."""
    return tuple((field, step) for field, step in targets if step is not None)


AnyStep: TypeAlias = (
    RunInteractionTask | WaitTime | WaitEvent | AwaitApproval | Branch | MapStep | Complete | Fail
)
Step: TypeAlias = Annotated[AnyStep, Field(discriminator="kind")]
STEP_KINDS: Final = (
    "run_interaction_task",
    "wait_time",
    "wait_event",
    "await_approval",
    "branch",
    "map",
    "complete",
    "fail",
)


# ---- the definition ----------------------------------------------------------------------


class BudgetDefaults(_Model):
    """Defaults for a job's budget; the submit's own budget wins key by key."""

    max_steps: PositiveInt | None = None
    max_cost_usd: Annotated[float, Field(ge=0, allow_inf_nan=False)] | None = None
    deadline: DurationField | None = None

    @model_validator(mode="after")
    def _whole_seconds(self) -> BudgetDefaults:
        if self.deadline is not None and self.deadline.total_ms() % 1000:
            raise FieldError("must be a whole number of seconds", "deadline")
        return self

    def defaults(self) -> dict[str, Any]:
        defaults: dict[str, Any] = {}
        if self.max_steps is not None:
            defaults["max_steps"] = self.max_steps
        if self.max_cost_usd is not None:
            defaults["max_cost_usd"] = self.max_cost_usd
        if self.deadline is not None:
            defaults["deadline_seconds"] = self.deadline.total_ms() // 1000
        return defaults


class WorkflowDefinition(_Model):
    type: Annotated[str, Field(min_length=1)]
    version: int = Field(ge=1)
    description: str | None = None
    budget: BudgetDefaults = Field(default_factory=BudgetDefaults)
    personal_data: list[str] = []
    """Dotted paths into job state whose values are personal data: sealed with the data
    subject's key wherever an event carries them, unreadable once it is erased."""
    start: StepRef
    steps: dict[Annotated[str, Field(min_length=1)], Step] = Field(min_length=1)

    @field_validator("personal_data")
    @classmethod
    def _personal_paths(cls, paths: list[str]) -> list[str]:
        for path in paths:
            problem = path_problem(path)
            if problem is not None:
                raise ValueError(problem)
        repeated = sorted({p for p in paths if paths.count(p) > 1})
        if repeated:
            raise ValueError(f"{', '.join(map(repr, repeated))} listed more than once")
        return paths

    @property
    def key(self) -> tuple[str, int]:
        return (self.type, self.version)

    @property
    def label(self) -> str:
        return f"workflow {self.type!r} v{self.version}"

    def budget_defaults(self) -> dict[str, Any]:
        """max_steps, max_cost_usd and deadline_seconds, each only if the definition sets it."""
        return self.budget.defaults()
