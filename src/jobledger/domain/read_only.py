"""Read-only views of a job's JSON (its state, its budget) for code that must not change it.

An executor is handed the job as it stands; copying the state for every step (deepcopy,
~17 us for a small job and growing with it) only protects the job from a mutating
executor. These views protect it without the copy: O(1) to make, nested dicts and lists
come out as views too, and nothing reaches the job's own objects for writing. They stay
valid only while the step runs (the job's next event replaces its state, not the view).

``deepcopy`` of a view, or ``thaw``, gives plain, mutable JSON again; ``json_object``
(what every payload goes through) accepts views inside a payload, so an executor may
return parts of the state it was given.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any, overload


class FrozenDict(Mapping[str, Any]):
    __slots__ = ("_data",)

    def __init__(self, data: Mapping[str, Any]) -> None:
        self._data = data

    def __getitem__(self, key: str) -> Any:
        return frozen(self._data[key])

    def __iter__(self) -> Iterator[str]:
        return iter(self._data)

    def __len__(self) -> int:
        return len(self._data)

    def __eq__(self, other: object) -> bool:
        return self._data == (other._data if isinstance(other, FrozenDict | FrozenList) else other)

    __hash__ = None  # type: ignore[assignment]  # like the dict it shows

    def __repr__(self) -> str:
        return f"FrozenDict({self._data!r})"

    def __deepcopy__(self, memo: dict[int, Any]) -> dict[str, Any]:
        return {key: thaw(item) for key, item in self._data.items()}


class FrozenList(Sequence[Any]):
    __slots__ = ("_data",)

    def __init__(self, data: Sequence[Any]) -> None:
        self._data = data

    @overload
    def __getitem__(self, index: int) -> Any: ...
    @overload
    def __getitem__(self, index: slice) -> FrozenList: ...
    def __getitem__(self, index: int | slice) -> Any:
        if isinstance(index, slice):
            return FrozenList(self._data[index])
        return frozen(self._data[index])

    def __len__(self) -> int:
        return len(self._data)

    def __eq__(self, other: object) -> bool:
        return self._data == (other._data if isinstance(other, FrozenDict | FrozenList) else other)

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"FrozenList({self._data!r})"

    def __deepcopy__(self, memo: dict[int, Any]) -> list[Any]:
        return [thaw(item) for item in self._data]


def frozen(value: Any) -> Any:
    """A read-only view of JSON ``value`` (scalars are immutable already)."""
    if isinstance(value, dict):
        return FrozenDict(value)
    if isinstance(value, list):
        return FrozenList(value)
    return value


def thaw(value: Any) -> Any:
    """Plain, mutable JSON from a view (or from JSON holding views): a deep copy."""
    if isinstance(value, Mapping):
        return {key: thaw(item) for key, item in value.items()}
    if isinstance(value, list | tuple | FrozenList):
        return [thaw(item) for item in value]
    return value
