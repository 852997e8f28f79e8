"""Boundary checks for user payloads: JSON objects only, bounded in size, nesting depth and
integer length; free text bounded like payloads."""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Mapping
from typing import Any, Final

from jobledger.domain.errors import InvalidPayloadError
from jobledger.domain.read_only import FrozenDict, FrozenList, thaw

MAX_DEPTH: Final = 100
"""How deep arrays and objects may nest: far deeper than any real document, shallow enough
that no parser or encoder on the way (json, pydantic, the stores) recurses to a crash."""
MAX_INT_DIGITS: Final = 4300
"""Python's own limit on converting integers to and from text (the default of
sys.set_int_max_str_digits): a longer integer could not be read back from the store."""
_INT_LIMIT: Final = 10**MAX_INT_DIGITS
# A JSON string (skipped whole, brackets inside it do not count), a bracket, or a quote
# that opens a string never closed (the rest is that string; the parser will say so).
_JSON_TOKENS: Final = re.compile(r'"(?:[^"\\]|\\.)*"|[\[\]{}]|"', re.DOTALL)
_DIGITS_ERROR: Final = re.compile(r"value has (\d+) digits")


def json_object(value: Mapping[str, Any] | None, *, what: str, max_bytes: int) -> dict[str, Any]:
    """Return a normalised copy of ``value``, or raise saying what is wrong with it.

    Normalising through JSON here (tuples become lists, keys become strings) keeps what the
    store holds identical to what was hashed into the chain.
    """
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise InvalidPayloadError(f"{what} must be a JSON object, got {type(value).__name__}")
    if not value:  # most steps return no output or patch: nothing to walk or encode
        return {}
    _check_shape(value, what)
    try:
        encoded = json.dumps(value, allow_nan=False, separators=(",", ":"), default=_thaw_view)
    except (TypeError, ValueError) as error:
        raise InvalidPayloadError(f"{what} is not serialisable as JSON: {error}") from None
    size = len(encoded.encode())
    if size > max_bytes:
        raise InvalidPayloadError(f"{what} is {size} bytes, over the limit of {max_bytes}")
    decoded: dict[str, Any] = json.loads(encoded)
    return decoded


def _thaw_view(value: object) -> object:
    """An executor may return parts of the read-only job state it was handed."""
    if isinstance(value, FrozenDict | FrozenList):
        return thaw(value)
    raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")


def text(value: object, *, what: str, max_bytes: int) -> str:
    """Free text (a reason, a comment) bounded like a payload: it is stored in an event."""
    if not isinstance(value, str):
        raise InvalidPayloadError(f"{what} must be a string, got {type(value).__name__}")
    _check_text(value, what)
    size = len(value.encode())
    if size > max_bytes:
        raise InvalidPayloadError(f"{what} is {size} bytes, over the limit of {max_bytes}")
    return value


def parse_json(
    source: str, *, object_pairs_hook: Callable[[list[tuple[str, Any]]], Any] | None = None
) -> Any:
    """``json.loads`` that refuses text nested deeper than MAX_DEPTH before parsing it
    (the parser would recurse to a RecursionError) and says plainly when an integer is
    too long. Raises json.JSONDecodeError for malformed JSON, InvalidPayloadError (a bare
    message, for the caller to place) for these two, and for NaN and Infinity, which
    Python's json reads but JSON (RFC 8259) has no such number."""
    depth = 0
    for token in _JSON_TOKENS.finditer(source):
        mark = token.group()
        if mark in "[{":
            depth += 1
            if depth > MAX_DEPTH:
                raise InvalidPayloadError(f"nested deeper than {MAX_DEPTH} levels")
        elif mark in "]}":
            depth -= 1
        elif mark == '"':
            break
    try:
        return json.loads(source, object_pairs_hook=object_pairs_hook, parse_constant=_not_a_number)
    except ValueError as error:
        found = _DIGITS_ERROR.search(str(error))
        if isinstance(error, json.JSONDecodeError) or found is None:
            raise
        raise InvalidPayloadError(_too_long(int(found.group(1)))) from None


def _not_a_number(constant: str) -> object:
    raise InvalidPayloadError(f"{constant} is not a JSON number")


def integer_digits(value: int) -> int:
    """How many decimal digits ``value`` has, without converting it to text."""
    value = abs(value)
    if value == 0:
        return 1
    estimate = int((value.bit_length() - 1) * math.log10(2)) + 1
    return estimate + 1 if value >= 10**estimate else estimate


def _too_long(digits: int) -> str:
    return f"an integer of {digits} digits is over the limit of {MAX_INT_DIGITS}"


def lone_surrogate(value: str) -> str | None:
    """The first lone surrogate in ``value`` (what JSON's ``\\ud800`` decodes to): not a
    character, no UTF-8 for it, so nothing that holds one can be stored or hashed."""
    if value.isascii():
        return None
    try:
        value.encode()
    except UnicodeEncodeError as error:
        return value[error.start]
    return None


def _check_text(value: str, what: str) -> None:
    if (found := lone_surrogate(value)) is not None:
        raise InvalidPayloadError(
            f"{what} holds a lone surrogate (U+{ord(found):04X}), not text: a string must be "
            "valid Unicode"
        )


def _check_shape(value: Mapping[str, Any], what: str) -> None:
    """Depth, integer length and text (no lone surrogates, in keys or values), walked
    without recursion (a deep value must not crash the check meant to refuse it)."""
    pending: list[tuple[object, int]] = [(value, 1)]
    while pending:
        item, depth = pending.pop()
        if isinstance(item, Mapping):
            children: Any = item.values()
            for key in item:
                if isinstance(key, str):
                    _check_text(key, what)
        elif isinstance(item, list | tuple):
            children = item
        elif isinstance(item, str):
            _check_text(item, what)
            continue
        else:
            if isinstance(item, int) and not isinstance(item, bool) and abs(item) >= _INT_LIMIT:
                digits = integer_digits(item)
                raise InvalidPayloadError(
                    f"{what} holds an integer of {digits} digits, over the limit of "
                    f"{MAX_INT_DIGITS}"
                )
            continue
        if depth > MAX_DEPTH:
            raise InvalidPayloadError(f"{what} is nested deeper than {MAX_DEPTH} levels")
        pending.extend((child, depth + 1) for child in children)
