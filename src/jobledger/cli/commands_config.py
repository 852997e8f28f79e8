"""``jobledger config show``: the effective settings and where each one came from."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import typer
from pydantic import BaseModel, SecretStr
from rich.table import Table

from jobledger.api.settings import env_name as http_env_name
from jobledger.api.settings import load_api_settings
from jobledger.audit.anchor_schedule import env_name as anchors_env_name
from jobledger.audit.anchor_schedule import load_anchor_settings
from jobledger.cli.config_file import CLI_KEYS, Settings, env_name, load_settings
from jobledger.cli.session import OneShot, one_shot
from jobledger.config import SETTINGS
from jobledger.domain.redaction import redact
from jobledger.presentation.json_output import jsonable, print_json
from jobledger.presentation.terminal import console

app = typer.Typer(help="The settings commands run with.", no_args_is_help=True)

HIDDEN = "********"


def effective(settings: Settings) -> list[dict[str, Any]]:
    """Every setting: its value (secrets hidden, a store URL without its password) and
    its source: ``flag``, ``env`` (the variable named), ``file`` (the file) or ``default``."""
    rows = []
    for name in [*SETTINGS, *CLI_KEYS]:
        value = settings.engine.setting(name) if name not in CLI_KEYS else None
        if name == "definitions":
            value = settings.definitions
        elif name == "executor":
            value = settings.executor
        elif name == "workflows":
            value = list(settings.workflows) or None
        rows.append(
            {"setting": name, "value": shown(name, value), "source": source(settings, name)}
        )
    return rows + http_rows(settings) + anchor_rows(settings)


def http_rows(settings: Settings) -> list[dict[str, Any]]:
    """The API's settings (``jobledger serve``), as ``http.<name>``: from
    ``JOBLEDGER_HTTP_*``, the file's ``[http]`` table, or the defaults."""
    api = load_api_settings(settings.http, settings.config_file)
    return _table_rows("http", api, http_env_name, settings.http, settings.config_file)


def anchor_rows(settings: Settings) -> list[dict[str, Any]]:
    """Scheduled anchoring (``jobledger run``), as ``anchors.<name>``: from
    ``JOBLEDGER_ANCHORS_*``, the file's ``[anchors]`` table, or the defaults."""
    anchors = load_anchor_settings(settings.anchors, settings.config_file)
    return _table_rows("anchors", anchors, anchors_env_name, settings.anchors, settings.config_file)


def _table_rows(
    table: str,
    loaded: BaseModel,
    env: Callable[[str], str],
    in_file: Mapping[str, Any],
    config_file: Path | None,
) -> list[dict[str, Any]]:
    """The settings of a table of the config file, each as ``<table>.<name>`` with where
    it came from: its variable (``env``), the file, or the default."""
    rows = []
    for name in type(loaded).model_fields:
        if os.environ.get(env(name)):
            where = f"env {env(name)}"
        elif name in in_file:
            where = f"file {config_file}"
        else:
            where = "default"
        value = shown(name, getattr(loaded, name))
        rows.append({"setting": f"{table}.{name}", "value": value, "source": where})
    return rows


def shown(name: str, value: Any) -> Any:
    if isinstance(value, SecretStr):
        return HIDDEN
    if isinstance(value, dict) and any(isinstance(v, SecretStr) for v in value.values()):
        return dict.fromkeys(value, HIDDEN)
    if name == "store_url" and isinstance(value, str):
        return redact(value)
    if isinstance(value, list) and all(isinstance(v, BaseModel) for v in value):
        return [v.model_dump(exclude_none=True) for v in value]  # concurrency_limits
    return jsonable(value)


def source(settings: Settings, name: str) -> str:
    where = settings.sources.get(name)
    if where == "file":
        return f"file {settings.config_file}"
    if where == "env":
        return f"env {env_name(name)}"
    return where or "default"


@app.command("show")
@one_shot
def show(cmd: OneShot) -> None:
    """Print the effective settings, each with where it came from; secrets hidden."""
    settings = load_settings(cmd.config, cmd.store)
    rows = effective(settings)
    if cmd.json:
        print_json({"config_file": settings.config_file, "settings": rows})
        return
    out = console()
    out.print(f"config file: {settings.config_file or '(none found)'}")
    table = Table("setting", "value", "source")
    for row in rows:
        value = row["value"]
        table.add_row(row["setting"], "-" if value is None else str(value), row["source"])
    out.print(table)
