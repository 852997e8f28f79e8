"""SIGHUP: what a long-running command reads again without a restart.

The workflow definitions (``run`` and ``worker``, when they run steps), swapped in for the
workers at once, so a rolling deploy adds a version (the code workflows stay served as
they are: a Python module is not imported twice, and their hot bodies are kept); and the
API's key files (``serve`` and ``run --http``), so a key removed from the API keys file
(revoked) stops working, and the console sessions signed in with it end. A file that is
invalid is refused whole and what is in use is kept; either way the process says so.
"""

from __future__ import annotations

import logging
import signal
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from jobledger.domain.errors import ConfigError, JobLedgerError
from jobledger.engine.engine import Engine
from jobledger.presentation.terminal import console

if TYPE_CHECKING:
    from jobledger.api.auth import Authenticator
    from jobledger.api.server import ApiServer
    from jobledger.orchestration.ports import WorkflowRegistry
    from jobledger.workflows import DefinitionRegistry

log = logging.getLogger(__name__)


@contextmanager
def reload_on_sighup(
    engine: Engine, definitions: Path | None, api: ApiServer | None
) -> Iterator[None]:
    """While in the block, SIGHUP reads ``definitions`` (a directory; None: not these)
    and then the key files of ``api`` (None: no API) again."""
    keys = api.keys if api is not None else None
    if (definitions is None and keys is None) or not hasattr(signal, "SIGHUP"):
        yield
        return

    def reload(*_: Any) -> None:
        if definitions is not None:
            _reload_definitions(engine, definitions)
        if keys is not None:
            _reload_keys(keys)

    previous = signal.signal(signal.SIGHUP, reload)
    try:
        yield
    finally:
        signal.signal(signal.SIGHUP, previous)


def _reload_definitions(engine: Engine, directory: Path) -> None:
    from jobledger.workflows import DefinitionRegistry

    try:
        definitions = DefinitionRegistry.from_directory(directory)
        registry = _beside_code(engine, definitions)
    except JobLedgerError as error:
        log.warning(
            "SIGHUP: definitions in %s NOT reloaded, keeping those in use: %s", directory, error
        )
        return
    engine.use_registry(registry)
    loaded = ", ".join(f"{kind} v{version}" for kind, version in registry.known())
    console().print(f"SIGHUP: definitions reloaded from {directory}: {loaded or 'none'}")


def _reload_keys(keys: Authenticator) -> None:
    try:
        keys.reload()
    except JobLedgerError as error:
        log.warning("SIGHUP: API keys NOT reloaded, keeping those in use: %s", error)
        return
    if keys.api_keys_file is not None:
        console().print(
            f"SIGHUP: API keys reloaded from {keys.api_keys_file}: {len(keys.api_keys)} key(s)",
            soft_wrap=True,
        )
    if keys.jwks_file is not None and keys.jwks is not None:
        console().print(
            f"SIGHUP: JWKS reloaded from {keys.jwks_file}: {len(keys.jwks.keys)} key(s)",
            soft_wrap=True,
        )


def _beside_code(engine: Engine, definitions: DefinitionRegistry) -> WorkflowRegistry:
    """The new definitions beside the code workflows in use (the same registry, with its
    hot bodies). Refused when they name a task no step function serves and there is no
    executor to hand it to (the executor is not reloaded)."""
    from jobledger.workflows.registries import Registries
    from jobledger.workflows.replayer import CodeRegistry
    from jobledger.workflows.serving import require_served, task_names
    from jobledger.workflows.tasks import TaskExecutor

    current = engine.registry
    members = current.registries if isinstance(current, Registries) else (current,)
    code = [member for member in members if isinstance(member, CodeRegistry)]
    if not code:
        return definitions
    executor = engine.deps.executor
    if isinstance(executor, TaskExecutor) and executor.fallback is None:
        declared = [definitions.get(kind, version) for kind, version in definitions.known()]
        require_served(task_names(declared, list(executor.tasks.values())))
    try:
        return Registries([*code, definitions])
    except ValueError as error:  # a (type, version) a code workflow has too
        raise ConfigError(str(error)) from None
