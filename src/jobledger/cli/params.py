"""Argument types shared by the commands: JSON objects given inline or as ``@file``."""

from __future__ import annotations

import json
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any

import typer

from jobledger.domain.errors import InvalidPayloadError
from jobledger.domain.payloads import parse_json

LARGEST: int = 2**63 - 1
"""The largest number a store holds (SQLite INTEGER, PostgreSQL bigint): the upper bound
of every count and version option, so a huge one is a usage error, not a crash."""


class JsonObject(dict[str, Any]):
    """A JSON object read from an option (``'{"a": 1}'``, ``@file.json`` or ``@-``)."""


def read_value(value: str) -> str:
    """``@path`` reads a file, ``@-`` reads stdin; anything else is the value itself."""
    if not value.startswith("@"):
        return value
    source = value[1:]
    if source == "-":
        return sys.stdin.read()
    try:
        return Path(source).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as error:
        raise typer.BadParameter(f"cannot read {source!r}: {error}") from None


def parse_json_object(value: str) -> JsonObject:
    text = read_value(value)
    try:
        data = parse_json(text)
    except json.JSONDecodeError as error:
        where = f"line {error.lineno} column {error.colno}"
        raise typer.BadParameter(f"not valid JSON: {error.msg} at {where}") from None
    except InvalidPayloadError as error:  # nested too deep, an integer too long
        raise typer.BadParameter(str(error)) from None
    if not isinstance(data, dict):
        raise typer.BadParameter(f"must be a JSON object, got {type(data).__name__}")
    return JsonObject(data)


def parse_moment(value: str) -> datetime:
    """An ISO 8601 time; without a timezone it is UTC."""
    try:
        moment = datetime.fromisoformat(value.strip())
    except ValueError:
        raise typer.BadParameter(f"not an ISO 8601 time: {value!r}") from None
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)


def _json_option(name: str, help: str) -> Any:
    return typer.Option(name, parser=parse_json_object, metavar="JSON|@FILE", help=help)


InputOption = Annotated[
    JsonObject | None, _json_option("--input", "The job's input: a JSON object, or @file.")
]
BudgetOption = Annotated[
    JsonObject | None,
    _json_option(
        "--budget", "Budget overrides: max_steps, max_cost_usd, deadline_seconds, deadline_at."
    ),
]
PayloadOption = Annotated[
    JsonObject | None, _json_option("--payload", "Merged into the job's state: JSON or @file.")
]
EditOption = Annotated[
    JsonObject | None,
    _json_option("--edit", "New values for params of the step approved: JSON or @file."),
]
DataOption = Annotated[
    JsonObject | None,
    _json_option("--data", "An answer merged into the job's state: JSON or @file."),
]
VersionOption = Annotated[
    int | None,
    typer.Option("--version", min=1, max=LARGEST, help="Definition version (default: the newest)."),
]
Tenant = Annotated[str, typer.Argument(metavar="TENANT", help="Tenant id.", show_default=False)]
JobId = Annotated[str, typer.Argument(metavar="JOB", help="Job id.", show_default=False)]


def parse_bind(value: str) -> tuple[str, int]:
    """``HOST:PORT`` (an IPv6 host in brackets: ``[::1]:8080``) -> (host, port)."""
    host, sep, port = value.rpartition(":")
    host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    if not sep or not host or not port.isdigit() or int(port) > 65535:
        raise typer.BadParameter(
            f"expected HOST:PORT (e.g. 127.0.0.1:8080, [::1]:8080), got {value!r}",
            param_hint="--http",
        )
    return host, int(port)
