"""The CLI's settings: flags, an optional TOML file and ``JOBLEDGER_*`` variables.

Precedence, highest first: ``--store``; the ``--config`` file; the environment; the
defaults of :class:`~jobledger.config.EngineConfig`. The file's keys are EngineConfig
fields (``store_url``, ``cost_ceiling_usd``, ``token_secret``, ...) plus two of the CLI's
own: ``definitions`` (a directory, relative to the file) and ``executor`` (``module:attr``
of a StepExecutor, or of a class or factory that makes one). ``JOBLEDGER_DEFINITIONS`` and
``JOBLEDGER_EXECUTOR`` set those two from the environment.
"""

from __future__ import annotations

import importlib
import os
import sys
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

from pydantic import ValidationError

from jobledger.config import EngineConfig
from jobledger.errors import ConfigError
from jobledger.ports import StepExecutor

CLI_KEYS = ("definitions", "executor")
ENV_DEFINITIONS = "JOBLEDGER_DEFINITIONS"
ENV_EXECUTOR = "JOBLEDGER_EXECUTOR"


@dataclass(frozen=True)
class Settings:
    engine: EngineConfig
    definitions: Path | None
    executor: str | None
    """``module:attr``; imported only by the commands that run steps."""


def load_settings(config_file: Path | None, store_url: str | None) -> Settings:
    values = read_config_file(config_file) if config_file is not None else {}
    definitions = values.pop("definitions", None)
    executor = values.pop("executor", None)
    if definitions is not None:
        assert config_file is not None
        definitions = config_file.parent / _string(definitions, "definitions", config_file)
    elif os.environ.get(ENV_DEFINITIONS):
        definitions = Path(os.environ[ENV_DEFINITIONS])
    if executor is not None:
        assert config_file is not None
        executor = _string(executor, "executor", config_file)
    else:
        executor = os.environ.get(ENV_EXECUTOR) or None
    if store_url is not None:
        values["store_url"] = store_url
    return Settings(engine_config(values, config_file), definitions, executor)


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
    key = ".".join(str(part) for part in detail["loc"])
    if detail["type"] == "extra_forbidden":
        known = ", ".join([*EngineConfig.model_fields, *CLI_KEYS])
        return f"unknown setting {key!r} (known: {known})"
    return f"{key}: {detail['msg']}"


def _string(value: object, key: str, source: Path) -> str:
    if not isinstance(value, str) or not value:
        raise ConfigError(f"config file {str(source)!r}: {key} must be a non-empty string")
    return value


def load_executor(spec: str) -> StepExecutor:
    """Import ``module:attr``; a class or a factory is called with no arguments. The
    current directory is importable, as it is for ``python -m``."""
    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise ConfigError(f"executor {spec!r} must be an import path like 'package.module:Name'")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
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
