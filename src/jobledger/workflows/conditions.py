"""The branch condition language: comparisons on state paths, combined with all/any/not.

Conditions are data, never code. They are parsed (and their shape checked) when a
definition loads, and evaluated against a job's state without ``eval``:

    {path: "review.score", op: ">=", value: 0.8}
    {path: "sources", op: "exists"}
    {all: [...]}, {any: [...]}, {not: {...}}

A path is dot-separated; a segment of digits indexes a list (``"items.0.name"``). A path
that leads nowhere is *absent*: ``exists`` is false and every comparison with it is false
(``!=`` and ``not_in`` included). Comparing values that have no order between them (a
string with a number) is false, never an exception. Booleans are not numbers: ``true``
equals only ``true``, never ``1``.
"""

from __future__ import annotations

import json
import math
import operator
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, Literal, TypeAlias, cast, get_args

Op = Literal["==", "!=", "<", "<=", ">", ">=", "in", "not_in", "exists"]
OPS: Final[tuple[str, ...]] = get_args(Op)

_ORDERINGS: Final[dict[str, Callable[[Any, Any], bool]]] = {
    "<": operator.lt,
    "<=": operator.le,
    ">": operator.gt,
    ">=": operator.ge,
}
_COMBINATORS: Final = frozenset({"all", "any", "not"})
_COMPARISON_KEYS: Final = frozenset({"path", "op", "value"})


class _Absent:
    """What a path that leads nowhere evaluates to."""

    def __repr__(self) -> str:
        return "ABSENT"


ABSENT: Final = _Absent()


class ConditionError(ValueError):
    """A condition with the wrong shape; ``field`` is where inside the condition."""

    def __init__(self, message: str, field: str = "") -> None:
        super().__init__(message)
        self.field = field


# ---- the condition tree ------------------------------------------------------------------


@dataclass(frozen=True)
class Compare:
    path: str
    op: Op
    value: Any = None

    def evaluate(self, state: Mapping[str, Any]) -> bool:
        return compare(lookup(state, self.path), self.op, self.value)

    def describe(self) -> str:
        if self.op == "exists":
            return f"{self.path} exists"
        return f"{self.path} {self.op} {json.dumps(self.value)}"

    def to_data(self) -> dict[str, Any]:
        if self.op == "exists":
            return {"path": self.path, "op": self.op}
        return {"path": self.path, "op": self.op, "value": self.value}


@dataclass(frozen=True)
class AllOf:
    conditions: tuple[Condition, ...]

    def evaluate(self, state: Mapping[str, Any]) -> bool:
        return all(condition.evaluate(state) for condition in self.conditions)

    def describe(self) -> str:
        return _join(" and ", self.conditions)

    def to_data(self) -> dict[str, Any]:
        return {"all": [condition.to_data() for condition in self.conditions]}


@dataclass(frozen=True)
class AnyOf:
    conditions: tuple[Condition, ...]

    def evaluate(self, state: Mapping[str, Any]) -> bool:
        return any(condition.evaluate(state) for condition in self.conditions)

    def describe(self) -> str:
        return _join(" or ", self.conditions)

    def to_data(self) -> dict[str, Any]:
        return {"any": [condition.to_data() for condition in self.conditions]}


@dataclass(frozen=True)
class Not:
    condition: Condition

    def evaluate(self, state: Mapping[str, Any]) -> bool:
        return not self.condition.evaluate(state)

    def describe(self) -> str:
        return f"not ({self.condition.describe()})"

    def to_data(self) -> dict[str, Any]:
        return {"not": self.condition.to_data()}


Condition: TypeAlias = Compare | AllOf | AnyOf | Not


def _nested(condition: Condition) -> str:
    text = condition.describe()
    return text if isinstance(condition, Compare | Not) else f"({text})"


def _join(word: str, conditions: Sequence[Condition]) -> str:
    return word.join(_nested(condition) for condition in conditions)


# ---- evaluation --------------------------------------------------------------------------


def lookup(state: object, path: str) -> object:
    """The value at ``path`` in ``state``, or ABSENT."""
    node = state
    for segment in path.split("."):
        node = _child(node, segment)
        if node is ABSENT:
            break
    return node


def _child(node: object, segment: str) -> object:
    if isinstance(node, Mapping):
        return node.get(segment, ABSENT)
    if isinstance(node, list | tuple) and segment.isascii() and segment.isdigit():
        index = int(segment)
        return node[index] if index < len(node) else ABSENT
    return ABSENT


def compare(left: object, op: str, right: Any) -> bool:
    """``left op right``; false when ``left`` is absent or the two cannot be ordered."""
    if op == "exists":
        return left is not ABSENT
    if left is ABSENT:
        return False
    if op == "==":
        return _equal(left, right)
    if op == "!=":
        return not _equal(left, right)
    if op == "in":
        return any(_equal(left, item) for item in right)
    if op == "not_in":
        return not any(_equal(left, item) for item in right)
    return _orderable(left, right) and _ORDERINGS[op](left, right)


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _equal(left: object, right: object) -> bool:
    if isinstance(left, bool) or isinstance(right, bool):
        return isinstance(left, bool) and isinstance(right, bool) and left == right
    return bool(left == right)


def _orderable(left: object, right: object) -> bool:
    both_numbers = _is_number(left) and _is_number(right)
    return both_numbers or (isinstance(left, str) and isinstance(right, str))


# ---- parsing -----------------------------------------------------------------------------


def parse_condition(raw: object) -> Condition:
    """Check the shape of a condition and build it; raise ConditionError if it is wrong."""
    return _parse(raw, "")


def _at(where: str, key: str | int) -> str:
    return f"{where}.{key}" if where else str(key)


def _parse(raw: object, where: str) -> Condition:
    if not isinstance(raw, Mapping):
        raise ConditionError(
            f"a condition must be a mapping ({{path, op, value}}, all, any or not), "
            f"got {type(raw).__name__}",
            where,
        )
    if _COMBINATORS.intersection(raw):
        if len(raw) != 1:
            keys = ", ".join(sorted(map(str, raw)))
            raise ConditionError(f"a combinator takes exactly one key, got {keys}", where)
        (key,) = raw
        return _parse_combinator(key, raw[key], _at(where, key))
    return _parse_comparison(raw, where)


def _parse_combinator(key: str, inner: object, where: str) -> Condition:
    if key == "not":
        return Not(_parse(inner, where))
    if not isinstance(inner, list) or not inner:
        raise ConditionError(f"'{key}' takes a non-empty list of conditions", where)
    conditions = tuple(_parse(item, _at(where, index)) for index, item in enumerate(inner))
    return AllOf(conditions) if key == "all" else AnyOf(conditions)


def _parse_comparison(raw: Mapping[Any, Any], where: str) -> Compare:
    unknown = set(raw) - _COMPARISON_KEYS
    if unknown:
        keys = ", ".join(sorted(map(str, unknown)))
        raise ConditionError(
            f"unknown key(s) {keys}: a condition is {{path, op, value}}, all, any or not", where
        )
    path, op = _check_path(raw.get("path"), where), _check_op(raw.get("op"), where)
    if op == "exists":
        if "value" in raw:
            raise ConditionError("op 'exists' takes no value", _at(where, "value"))
        return Compare(path, op)
    if "value" not in raw:
        raise ConditionError(f"op '{op}' needs a value", where)
    value = _check_value(raw["value"], op, _at(where, "value"))
    return Compare(path, op, value)


def _check_path(path: object, where: str) -> str:
    if not isinstance(path, str) or not path or "" in path.split("."):
        raise ConditionError(
            f"path must be a dotted string like 'a.b.0.c', got {path!r}", _at(where, "path")
        )
    return path


def _check_op(op: object, where: str) -> Op:
    if isinstance(op, str) and op in OPS:
        return cast(Op, op)
    expected = ", ".join(OPS)
    raise ConditionError(
        f"unknown op {op!r}; expected one of {expected} (quote operators in YAML)",
        _at(where, "op"),
    )


def _check_value(value: object, op: str, where: str) -> Any:
    if not is_json(value):
        raise ConditionError(
            f"value must be JSON data (quote dates in YAML), got {type(value).__name__}", where
        )
    if op in ("in", "not_in") and not isinstance(value, list):
        raise ConditionError(f"op '{op}' needs a list value, got {value!r}", where)
    if op in _ORDERINGS and not (_is_number(value) or isinstance(value, str)):
        raise ConditionError(f"op '{op}' needs a number or a string, got {value!r}", where)
    return value


def is_json(value: object) -> bool:
    """Whether ``value`` is plain JSON data (YAML also yields dates, sets, ...)."""
    if value is None or isinstance(value, str | bool | int):
        return True
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, list):
        return all(is_json(item) for item in value)
    if isinstance(value, dict):
        return all(isinstance(k, str) and is_json(v) for k, v in value.items())
    return False
