"""Boundary checks for user payloads: JSON objects only, bounded in size."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from jobledger.errors import InvalidPayloadError


def json_object(value: Mapping[str, Any] | None, *, what: str, max_bytes: int) -> dict[str, Any]:
    """Return a normalised copy of ``value``, or raise saying what is wrong with it.

    Normalising through JSON here (tuples become lists, keys become strings) keeps what the
    store holds identical to what was hashed into the chain.
    """
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise InvalidPayloadError(f"{what} must be a JSON object, got {type(value).__name__}")
    try:
        encoded = json.dumps(value, allow_nan=False, separators=(",", ":"))
    except (TypeError, ValueError) as error:
        raise InvalidPayloadError(f"{what} is not serialisable as JSON: {error}") from None
    size = len(encoded.encode())
    if size > max_bytes:
        raise InvalidPayloadError(f"{what} is {size} bytes, over the limit of {max_bytes}")
    decoded: dict[str, Any] = json.loads(encoded)
    return decoded
