"""The ``workflows`` setting: Python modules whose module-level ``@workflow`` and ``@step``
objects a deployment serves, beside (or instead of) declarative definitions."""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from jobledger.cli.config_file import importable_beside
from jobledger.domain.errors import ConfigError
from jobledger.workflows.code import CodeWorkflow
from jobledger.workflows.tasks import Task


@dataclass(frozen=True)
class CodeModules:
    """What the modules define at module level, each object once (a module that imports
    another's workflow does not serve it twice)."""

    modules: tuple[str, ...]
    workflows: tuple[CodeWorkflow, ...]
    tasks: tuple[Task, ...]

    @property
    def label(self) -> str:
        return ", ".join(self.modules)


def load_code(modules: Sequence[str], config_file: Path | None = None) -> CodeModules:
    """Import each module (the config file's directory importable first) and collect its
    ``CodeWorkflow`` and ``Task`` objects. A module that does not import, or that defines
    neither, is a ConfigError naming it."""
    importable_beside(config_file)
    workflows: dict[int, CodeWorkflow] = {}
    tasks: dict[int, Task] = {}
    for name in modules:
        found = vars(_import(name)).values()
        here_workflows = [v for v in found if isinstance(v, CodeWorkflow)]
        here_tasks = [v for v in found if isinstance(v, Task)]
        if not here_workflows and not here_tasks:
            raise ConfigError(
                f"workflows module {name!r} defines no @workflow (nor @step) at module level"
            )
        workflows |= {id(w): w for w in here_workflows}
        tasks |= {id(t): t for t in here_tasks}
    return CodeModules(tuple(modules), tuple(workflows.values()), tuple(tasks.values()))


def _import(name: str) -> object:
    try:
        return importlib.import_module(name)
    except Exception as error:  # whatever its top level raised: say which module, and why
        raise ConfigError(
            f"workflows module {name!r} does not import: {type(error).__name__}: {error}"
        ) from None
