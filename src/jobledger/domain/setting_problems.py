"""How one problem of a settings model's validation reads (pydantic's error details): the
setting named by its dotted key, an unknown one with the settings that are known."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from pydantic_core import ErrorDetails


def setting_key(detail: ErrorDetails) -> str:
    """The setting the problem is about (``kafka.ticks_topic``); empty for the whole model."""
    return ".".join(str(part) for part in detail["loc"])


def unknown_setting(key: str, known: Iterable[str]) -> str:
    return f"unknown setting {key!r} (known: {', '.join(known)})"


def setting_problem(detail: ErrorDetails, known: Iterable[str]) -> str:
    """The problem, for a person: a validator's message without pydantic's ``Value error``."""
    key = setting_key(detail)
    if detail["type"] == "extra_forbidden":
        return unknown_setting(key, known)
    message = str(detail["msg"]).removeprefix("Value error, ")
    return f"{key}: {message}" if key else message


def refuse_unknown_keys(values: Any, known: Iterable[str], what: str) -> Any:
    """``values`` when it is not a table or names only ``known`` keys; else a ValueError
    naming the first unknown key with the table's own keys (not every setting's)."""
    if isinstance(values, dict):
        fields = list(known)
        unknown = sorted(set(values) - set(fields))
        if unknown:
            raise ValueError(f"unknown {what} key {unknown[0]!r} (known: {', '.join(fields)})")
    return values
