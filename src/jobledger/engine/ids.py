"""The ids callers name things by (tenants, jobs, idempotency keys, people, schedules):
one check, shared by every command that takes one."""

from __future__ import annotations

import unicodedata

from jobledger.domain.errors import InvalidPayloadError
from jobledger.domain.payloads import lone_surrogate

MAX_ID_LENGTH = 200


def check_id(name: str, value: object) -> None:
    if not isinstance(value, str) or not value or len(value) > MAX_ID_LENGTH:
        raise InvalidPayloadError(
            f"{name} must be a non-empty string of at most "
            f"{MAX_ID_LENGTH} characters, got {value!r}"
        )
    if any(unicodedata.category(c) in ("Cc", "Cf", "Zl", "Zp") for c in value):
        raise InvalidPayloadError(f"{name} must not contain control characters: {value!r}")
    if lone_surrogate(value) is not None:
        raise InvalidPayloadError(f"{name} must not contain a lone surrogate: {value!r}")
    if value in (".", ".."):
        # Encoded or not, "." and ".." are the dot segments every URL client removes: the
        # job's Location, /v1/jobs/t/.., would lead to /v1/jobs/.
        raise InvalidPayloadError(
            f"{name} must not be '.' or '..': a URL path resolves it away, got {value!r}"
        )
