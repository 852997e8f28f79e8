"""JSON for machines: plain JSON data from the domain's values, and one document on
stdout (nothing else there)."""

from __future__ import annotations

import dataclasses
import json
import sys
from collections.abc import Mapping
from datetime import datetime
from decimal import Decimal
from enum import Enum
from pathlib import Path
from typing import Any
from uuid import UUID


def jsonable(value: Any) -> Any:
    """Plain JSON data: Decimals and datetimes as strings, enums as their values."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return jsonable({f.name: getattr(value, f.name) for f in dataclasses.fields(value)})
    if isinstance(value, Mapping):
        return {str(key): jsonable(item) for key, item in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        return [jsonable(item) for item in value]
    if isinstance(value, Enum):
        return jsonable(value.value)
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, Decimal | UUID | Path):
        return str(value)
    return value


def print_json(value: Any) -> None:
    """One JSON document on stdout, and nothing else there."""
    sys.stdout.write(json.dumps(jsonable(value), indent=2, allow_nan=False) + "\n")
    sys.stdout.flush()


def compact(value: Any) -> str:
    return json.dumps(jsonable(value), separators=(", ", ": "))
