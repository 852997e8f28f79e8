"""The CLI's settings: flags, a TOML file and ``JOBLEDGER_*`` variables.

Precedence, highest first: ``--store``; the environment; the config file; the defaults of
:class:`~jobledger.config.EngineConfig` (a variable set for one command beats the file it
runs beside, as in most tools). The config file is ``--config FILE``, else
``./jobledger.toml`` when there is one, else ``$JOBLEDGER_CONFIG``. Its keys are
EngineConfig's settings by their flat names (``store_url``, ``cost_ceiling_usd``,
``token_secret``, ...: :data:`jobledger.config.SETTINGS`) plus three of
the CLI's own: ``definitions`` (a directory), ``executor`` (``module:attr`` of a
StepExecutor, or of a class or factory that makes one) and ``workflows`` (a list of
module names whose ``@workflow`` and ``@step`` objects are served:
:mod:`jobledger.cli.code_modules`).
Every path the file names is relative to the file: the definitions, a SQLite store
(``sqlite:///jobs.db`` is the ``jobs.db`` beside the file), a ``file:`` notifier, the
runner's archive directory (``retention_archive_to``), a subscription's JSON Schema file
(``input_schema`` of ``[[subscriptions]]``) and the
executor's and workflows' modules (imported from the file's directory first).
``JOBLEDGER_DEFINITIONS``, ``JOBLEDGER_EXECUTOR`` and ``JOBLEDGER_WORKFLOWS`` (module
names, comma-separated) set those from the environment (relative to the current
directory, as any environment path is). An ``[http]`` table holds the API's settings
(:class:`jobledger.api.settings.ApiSettings`; ``JOBLEDGER_HTTP_*`` in the environment),
an ``[anchors]`` table the runner's scheduled anchoring
(:class:`jobledger.audit.anchor_schedule.AnchorSettings`; ``JOBLEDGER_ANCHORS_*``), and a
``[signing]`` table the signing-keys file (``keys``, the setting ``signing_keys``:
``JOBLEDGER_SIGNING_KEYS``) and the keyring (``keyring``: ``JOBLEDGER_KEYRING``), relative
to the file.
"""

from __future__ import annotations

import importlib
import os
import sys
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

from pydantic import ValidationError

from jobledger.config import SETTINGS, EngineConfig
from jobledger.domain.errors import ConfigError
from jobledger.domain.retention import KAFKA_TARGET
from jobledger.domain.setting_problems import setting_key, unknown_setting
from jobledger.orchestration.ports import StepExecutor

CLI_KEYS = ("definitions", "executor", "workflows")
HTTP_TABLE = "http"
"""The config file's table of the API's settings (``jobledger serve``)."""
SIGNING_TABLE = "signing"
SIGNING_KEYS = {"keys": "signing_keys", "keyring": "keyring"}
"""The ``[signing]`` table's keys, and the EngineConfig setting each one sets."""
ANCHORS_TABLE = "anchors"
"""The config file's table of scheduled anchoring (``jobledger run``)."""
ENV_CONFIG = "JOBLEDGER_CONFIG"
ENV_DEFINITIONS = "JOBLEDGER_DEFINITIONS"
ENV_EXECUTOR = "JOBLEDGER_EXECUTOR"
ENV_WORKFLOWS = "JOBLEDGER_WORKFLOWS"
DEFAULT_CONFIG = Path("jobledger.toml")


@dataclass(frozen=True)
class Settings:
    engine: EngineConfig
    definitions: Path | None
    executor: str | None
    """``module:attr``; imported only by the commands that run steps."""
    workflows: tuple[str, ...] = ()
    """Modules of code workflows and step functions; imported only by the commands that
    resolve workflows."""
    config_file: Path | None = None
    """The file the settings were read from (``--config``, ./jobledger.toml or
    $JOBLEDGER_CONFIG), if any: the executor's module is imported from its directory."""
    sources: dict[str, str] = field(default_factory=dict)
    """Where each setting that is not a default came from: ``flag``, ``file`` or ``env``."""
    http: dict[str, Any] = field(default_factory=dict)
    """The file's ``[http]`` table: the API's settings (``jobledger.api.settings``)."""
    anchors: dict[str, Any] = field(default_factory=dict)
    """The file's ``[anchors]`` table: scheduled anchoring (``jobledger.audit.anchor_schedule``)."""


def find_config_file(config_file: Path | None) -> Path | None:
    """``--config``, else ./jobledger.toml if present, else $JOBLEDGER_CONFIG."""
    if config_file is not None:
        return config_file
    if DEFAULT_CONFIG.is_file():
        return DEFAULT_CONFIG
    return Path(os.environ[ENV_CONFIG]) if os.environ.get(ENV_CONFIG) else None


def load_settings(config_file: Path | None, store_url: str | None) -> Settings:
    config_file = find_config_file(config_file)
    values = read_config_file(config_file) if config_file is not None else {}
    http = values.pop(HTTP_TABLE, {})
    anchors = values.pop(ANCHORS_TABLE, {})
    for name, table in ((HTTP_TABLE, http), (ANCHORS_TABLE, anchors)):
        if not isinstance(table, dict):
            raise ConfigError(f"config file {str(config_file)!r}: [{name}] must be a table")
    if config_file is not None:
        values.update(signing_settings(values, config_file))
    in_env = {key for key in [*SETTINGS, *CLI_KEYS] if os.environ.get(env_name(key))}
    values = {key: value for key, value in values.items() if key not in in_env}
    sources = {key: "file" for key in values} | {key: "env" for key in in_env}
    definitions = values.pop("definitions", None)
    executor = values.pop("executor", None)
    workflows = _modules(values.pop("workflows", None), config_file, "workflows" in in_env)
    if definitions is not None:
        assert config_file is not None
        definitions = config_file.parent / _string(definitions, "definitions", config_file)
    elif "definitions" in in_env:
        definitions = Path(os.environ[ENV_DEFINITIONS])
    if executor is not None:
        assert config_file is not None
        executor = _string(executor, "executor", config_file)
    elif "executor" in in_env:
        executor = os.environ[ENV_EXECUTOR]
    if store_url is not None:
        values["store_url"] = store_url
        sources["store_url"] = "flag"
    elif "store_url" in values and config_file is not None:
        values["store_url"] = beside(
            config_file, _string(values["store_url"], "store_url", config_file)
        )
    notifier = values.get("notifier")
    if isinstance(notifier, str) and notifier.startswith("file:") and config_file is not None:
        values["notifier"] = "file:" + str(config_file.parent / notifier.removeprefix("file:"))
    values.update(_archive_beside(values, config_file))
    values.update(_schemas_beside(values, config_file))
    if any(isinstance(s, dict) and "input_model" in s for s in values.get("subscriptions", [])):
        importable_beside(config_file)  # a subscription's input_model is imported by name
    engine = engine_config(values, config_file)
    return Settings(engine, definitions, executor, workflows, config_file, sources, http, anchors)


def _modules(value: object, config_file: Path | None, in_env: bool) -> tuple[str, ...]:
    """``workflows``: the file's list of module names, or JOBLEDGER_WORKFLOWS's
    comma-separated ones (the environment wins, as for every setting)."""
    if in_env:
        return split_modules(os.environ[ENV_WORKFLOWS])
    if value is None:
        return ()
    assert config_file is not None
    if isinstance(value, str):
        value = [value]  # one module needs no list
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise ConfigError(
            f"config file {str(config_file)!r}: workflows must be a list of module names"
        )
    return tuple(value)


def split_modules(names: str) -> tuple[str, ...]:
    """``a, b.c`` -> ``("a", "b.c")``: blanks and empty names dropped."""
    return tuple(name.strip() for name in names.split(",") if name.strip())


def signing_settings(values: dict[str, Any], config_file: Path) -> dict[str, Path]:
    """The file's ``[signing]`` table (taken out of ``values``) as the settings it sets,
    each path relative to the file. The settings are spelled one way in a file, in the
    table, so a flat ``keyring = ...`` is refused rather than read relative to another
    directory."""
    where = f"config file {str(config_file)!r}"
    for key, setting in SIGNING_KEYS.items():
        if setting in values:
            raise ConfigError(
                f"{where}: set {setting} in the [{SIGNING_TABLE}] table: {key} = FILE"
            )
    table = values.pop(SIGNING_TABLE, {})
    if not isinstance(table, dict):
        raise ConfigError(f"{where}: [{SIGNING_TABLE}] must be a table")
    unknown = sorted(set(table) - set(SIGNING_KEYS))
    if unknown:
        known = ", ".join(SIGNING_KEYS)
        raise ConfigError(
            f"{where}: unknown [{SIGNING_TABLE}] setting {unknown[0]!r} (known: {known})"
        )
    return {
        SIGNING_KEYS[key]: config_file.parent
        / _string(value, f"{SIGNING_TABLE}.{key}", config_file)
        for key, value in table.items()
    }


def env_name(setting: str) -> str:
    return f"JOBLEDGER_{setting.upper()}"


def beside(config_file: Path, store_url: str) -> str:
    """A relative SQLite path in a config file is relative to the file, not to wherever
    the command runs (else ``--config s1/tick.toml`` from the parent quietly creates a new,
    empty ``./tick.db``)."""
    prefix = "sqlite:///"
    if not store_url.startswith(prefix) or store_url.startswith(prefix + "/"):
        return store_url
    return prefix + str((config_file.parent / store_url.removeprefix(prefix)).absolute())


def _schemas_beside(values: dict[str, Any], config_file: Path | None) -> dict[str, Any]:
    """A subscription's relative ``input_schema`` file in a config file is relative to
    the file (an inline schema, a table, stays as it is)."""
    subscriptions = values.get("subscriptions")
    if config_file is None or not isinstance(subscriptions, list):
        return {}
    return {
        "subscriptions": [
            {**entry, "input_schema": str(config_file.parent / entry["input_schema"])}
            if isinstance(entry, dict) and isinstance(entry.get("input_schema"), str)
            else entry
            for entry in subscriptions
        ]
    }


def _archive_beside(values: dict[str, Any], config_file: Path | None) -> dict[str, Any]:
    """A relative archive directory in a config file is relative to the file."""
    target = values.get("retention_archive_to")
    if config_file is None or not isinstance(target, str) or not target.strip():
        return {}
    if target.startswith(KAFKA_TARGET) or Path(target).is_absolute():
        return {}
    return {"retention_archive_to": str(config_file.parent / target)}


def read_config_file(path: Path) -> dict[str, Any]:
    try:
        with path.open("rb") as file:
            return tomllib.load(file)
    except OSError as error:
        raise ConfigError(f"cannot read config file {str(path)!r}: {error.strerror}") from None
    except tomllib.TOMLDecodeError as error:
        raise ConfigError(f"config file {str(path)!r} is not valid TOML: {error}") from None
    except RecursionError:  # tomllib recurses into nested arrays and tables
        raise ConfigError(f"config file {str(path)!r} is not valid TOML: nested too deep") from None


def engine_config(values: dict[str, Any], source: Path | None) -> EngineConfig:
    """EngineConfig from the file's values over the environment, every problem named."""
    try:
        return EngineConfig(**values)
    except ValidationError as error:
        where = f"config file {str(source)!r}" if source is not None else "configuration"
        problems = "; ".join(_problem(detail) for detail in error.errors())
        raise ConfigError(f"invalid {where} (or JOBLEDGER_* variable): {problems}") from None


def _problem(detail: Any) -> str:
    key = setting_key(detail)
    kind, ctx = detail["type"], detail.get("ctx") or {}
    if kind == "extra_forbidden":
        return unknown_setting(key, [*SETTINGS, *CLI_KEYS])
    if kind == "too_short":
        return (
            f"{key} must be at least {ctx['min_length']} characters long "
            f"(it is {ctx['actual_length']})"
        )
    if kind in ("greater_than_equal", "greater_than", "less_than_equal", "less_than"):
        words = {"greater_than_equal": "at least", "greater_than": "more than"}
        words |= {"less_than_equal": "at most", "less_than": "less than"}
        bound = next(iter(ctx.values()))
        return f"{key} must be {words[kind]} {bound} (got {detail['input']!r})"
    if kind == "literal_error":
        return f"{key} must be one of {ctx['expected']} (got {detail['input']!r})"
    if kind == "string_pattern_mismatch":
        return f"{key} {detail['input']!r} is not allowed here (pattern {ctx['pattern']})"
    if kind.endswith("_parsing") or kind.endswith("_type"):
        return f"{key}: {detail['msg'].lower()} (got {detail['input']!r})"
    return f"{key}: {detail['msg']}"


def _string(value: object, key: str, source: Path) -> str:
    if not isinstance(value, str) or not value:
        raise ConfigError(f"config file {str(source)!r}: {key} must be a non-empty string")
    return value


def importable_beside(config_file: Path | None) -> None:
    """Make the config file's directory importable first, then the current directory, as
    it is for ``python -m``: a deployment's own modules sit beside its config."""
    roots = [os.getcwd()]
    if config_file is not None:
        roots.insert(0, str(config_file.parent.absolute()))
    for root in reversed(roots):
        if root not in sys.path:
            sys.path.insert(0, root)


def load_executor(spec: str, config_file: Path | None = None) -> StepExecutor:
    """Import ``module:attr``; a class or a factory is called with no arguments. The
    config file's directory is importable first, then the current directory, as it is
    for ``python -m``."""
    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise ConfigError(f"executor {spec!r} must be an import path like 'package.module:Name'")
    importable_beside(config_file)
    try:
        target: Any = importlib.import_module(module_name)
    except ImportError as error:
        raise ConfigError(f"executor {spec!r}: cannot import {module_name!r}: {error}") from None
    for part in attr.split("."):
        if not hasattr(target, part):
            raise ConfigError(f"executor {spec!r}: {module_name!r} has no attribute {attr!r}")
        target = getattr(target, part)
    if isinstance(target, type) or (callable(target) and not hasattr(target, "execute")):
        target = target()
    if not callable(getattr(target, "execute", None)):
        raise ConfigError(f"executor {spec!r} is not a step executor (it has no execute method)")
    return cast(StepExecutor, target)
