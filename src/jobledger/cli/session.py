"""Shared plumbing: the options every command takes, opening an engine from them, and the
exit code each kind of error maps to."""

from __future__ import annotations

import functools
import inspect
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, replace
from enum import IntEnum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Concatenate, Literal, ParamSpec, TypeVar

import typer
from eventsourcing.persistence import PersistenceError

from jobledger.adapters.event_store import StoreMode
from jobledger.adapters.notifier import MemoryNotifier
from jobledger.cli.code_modules import CodeModules, load_code
from jobledger.cli.config_file import Settings, load_executor, load_settings
from jobledger.cli.logs import OneShotLogFormatOption, OneShotLogLevelOption, configure_one_shot
from jobledger.domain.errors import (
    BrokenHistoryError,
    ConcurrencyError,
    ConfigError,
    DuplicateKeyError,
    JobLedgerError,
    StoreCorruptError,
    StoreUnavailableError,
    StoreUnreachableError,
)
from jobledger.domain.redaction import redact
from jobledger.engine.engine import Engine
from jobledger.orchestration.ports import Notifier, Queue, StepExecutor, WorkflowRegistry
from jobledger.orchestration.registry import FunctionRegistry
from jobledger.workflows.loader import load_definitions
from jobledger.workflows.registries import Registries
from jobledger.workflows.replayer import CodeRegistry
from jobledger.workflows.resolver import DefinitionRegistry
from jobledger.workflows.serving import require_served, task_names

if TYPE_CHECKING:
    from jobledger.engine.bootstrap import Parts
    from jobledger.workflows.definition import WorkflowDefinition


class Exit(IntEnum):
    OK = 0
    REFUSED = 1
    """A refused operation or a validation problem (a JobLedgerError)."""
    USAGE = 2
    """Bad arguments or options (typer's own exit code)."""
    UNAVAILABLE = 3
    """The store is unreachable, its URL is bad or its database damaged, a job's history is
    broken, or the configuration is unusable."""
    TEMPORARY = 4
    """Try again: the store failed mid-command (the change may or may not have landed;
    the retry sees what the store holds), or other writers kept winning the race for
    the job for longer than the command's back-off."""


def exit_code(error: JobLedgerError | PersistenceError) -> Exit:
    if isinstance(
        error, ConfigError | StoreUnreachableError | StoreCorruptError | BrokenHistoryError
    ):
        return Exit.UNAVAILABLE
    if isinstance(error, DuplicateKeyError):
        return Exit.REFUSED  # a used key is an answer, not a race to run again
    if isinstance(error, StoreUnavailableError | ConcurrencyError | PersistenceError):
        return Exit.TEMPORARY
    return Exit.REFUSED


def report_error(error: JobLedgerError | PersistenceError) -> Exit:
    """``error: <message>`` on stderr, no traceback; the exit code for it."""
    code = exit_code(error)
    message = redact(str(error))  # a driver's message may quote the store URL
    if isinstance(error, PersistenceError):
        message = f"store error: {' '.join(message.split())}"  # the driver's, on one line
    sys.stderr.write(f"error: {message}\n")
    return code


# ---- the options every command takes ---------------------------------------------------

StoreOption = Annotated[
    str | None,
    typer.Option(
        "--store",
        metavar="URL",
        help="Store URL (overrides JOBLEDGER_STORE_URL and the config file): "
        "sqlite:///file.db or postgresql://user:pw@host:5432/db[?schema=s].",
        show_default=False,
    ),
]
ConfigOption = Annotated[
    Path | None,
    typer.Option(
        "--config",
        metavar="FILE",
        help="TOML file: EngineConfig fields, plus definitions = DIR, executor = "
        "'module:attr' and workflows = ['module', ...].",
        show_default=False,
    ),
]
JsonFlag = Annotated[bool, typer.Option("--json", help="Print JSON on stdout instead of tables.")]
WorkflowsOption = Annotated[
    list[str] | None,
    typer.Option(
        "--workflows",
        metavar="MODULE",
        help="A module of @workflow and @step functions (importable from the config "
        "file's directory or the current one); repeat for several. Overrides workflows "
        "in the config file and JOBLEDGER_WORKFLOWS.",
        show_default=False,
    ),
]

TailOption = Literal["store", "config", "json", "logs"]
"""The options a one-shot command's signature ends with: ``logs`` is ``--log-level`` and
``--log-format``."""

_TAIL: dict[str, tuple[TailOption, Any, Any]] = {
    "store": ("store", StoreOption, None),
    "config": ("config", ConfigOption, None),
    "json": ("json", JsonFlag, False),
    "log_level": ("logs", OneShotLogLevelOption, None),
    "log_format": ("logs", OneShotLogFormatOption, None),
}
"""Each common option's parameter: the choice that brings it, its typer annotation and its
default, in the order a signature ends with them."""

P = ParamSpec("P")
R = TypeVar("R")


# The CLI's notifier keeps what a tick hands out, for printing.
Outside = MemoryNotifier


@dataclass(frozen=True)
class OneShot:
    """What a one-shot command's common options said (see :func:`one_shot_with`); an
    option the command does not take reads as its default."""

    store: str | None = None
    config: Path | None = None
    json: bool = False

    def engine(
        self,
        *,
        purpose: str,
        mode: StoreMode = "existing",
        definitions: bool = False,
        executor: bool = False,
        workflows: Sequence[str] | None = None,
        notifier: Notifier | None = None,
    ) -> AbstractContextManager[Engine]:
        """:func:`open_engine` on the store and config file these options name."""
        return open_engine(
            self.store,
            self.config,
            purpose=purpose,
            mode=mode,
            definitions=definitions,
            executor=executor,
            workflows=workflows or (),
            notifier=notifier,
        )


def one_shot_with(
    *options: TailOption,
) -> Callable[[Callable[Concatenate[OneShot, P], R]], Callable[P, R]]:
    """A decorator for a command whose signature ends with the chosen common options, in
    the order of :data:`_TAIL`. The command declares a first parameter, a :class:`OneShot`,
    which typer does not see; typer sees the options appended instead. With ``logs``,
    logging is configured from them before the command's body runs."""

    def decorate(body: Callable[Concatenate[OneShot, P], R]) -> Callable[P, R]:
        tail = {name: option for name, option in _TAIL.items() if option[0] in options}
        signature = inspect.signature(body, eval_str=True)  # typer reads no strings here
        parameters = [
            *list(signature.parameters.values())[1:],  # all but the OneShot
            *(
                inspect.Parameter(
                    name, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=annotation
                )
                for name, (_, annotation, default) in tail.items()
            ),
        ]

        # Typer calls the command with keywords: the body's own and the tail's, which
        # P.kwargs does not name (its signature is what typer reads, not what mypy checks).
        @functools.wraps(body)
        def command(*args: P.args, **kwargs: P.kwargs) -> R:
            common: dict[str, Any] = {name: kwargs.pop(name) for name in tail}  # typer checked them
            if "logs" in options:
                configure_one_shot(common.pop("log_level"), common.pop("log_format"))
            return body(OneShot(**common), *args, **kwargs)

        command.__signature__ = signature.replace(parameters=parameters)  # type: ignore[attr-defined]
        command.__annotations__ = {
            **{parameter.name: parameter.annotation for parameter in parameters},
            "return": signature.return_annotation,
        }
        return command

    return decorate


one_shot = one_shot_with("store", "config", "json", "logs")
"""The common options of most one-shot commands: --store, --config, --json, --log-level,
--log-format."""


@contextmanager
def open_engine(
    store_url: str | None,
    config: Path | None,
    *,
    purpose: str,
    definitions: bool = False,
    executor: bool = False,
    workflows: Sequence[str] = (),
    notifier: Notifier | None = None,
    mode: StoreMode = "existing",
    transport: Literal["local", "kafka"] | None = None,
    queue: Queue | None = None,
    metrics_port: int | None = None,
    metrics: bool | None = None,
) -> Iterator[Engine]:
    """An engine on the configured store, closed afterwards. ``definitions`` and
    ``executor`` say whether the command resolves workflows and runs steps (only then are
    the definitions, the workflows modules and the executor loaded); ``workflows`` (the
    ``--workflows`` flag) wins over the configured modules.
    ``mode``: only the commands that write jobs create a store; the ones that only read
    say ``read`` (no lock, no DDL). ``transport`` (the ``--transport`` flag) wins over
    the configured one; the queue is chosen from it when the engine is built, unless
    ``queue`` is given. ``metrics_port`` (the ``--metrics-port`` flag) wins over the
    configured one; ``metrics`` True keeps metrics without a port of their own (the HTTP
    API serves them), False keeps none whatever is configured (a one-off command)."""
    settings = with_workflows(load_settings(config, store_url), workflows)
    engine_config = settings.engine
    if transport is not None:
        engine_config = engine_config.model_copy(update={"transport": transport})
    if metrics_port is not None or metrics is False:
        engine_config = engine_config.model_copy(update={"metrics_port": metrics_port})
    _require(settings, purpose, definitions=definitions, executor=executor)
    parts = _served(settings, purpose, definitions=definitions, executor=executor)
    parts["notifier"], parts["store_mode"] = notifier, mode
    parts["queue"], parts["metrics"] = queue, bool(metrics)
    engine = Engine.open(config=engine_config, **parts)
    try:
        yield engine
    finally:
        engine.close()


def with_workflows(settings: Settings, workflows: Sequence[str]) -> Settings:
    """The settings with the ``--workflows`` modules, when the flag gave any."""
    if not workflows:
        return settings
    sources = {**settings.sources, "workflows": "flag"}
    return replace(settings, workflows=tuple(workflows), sources=sources)


def _require(settings: Settings, purpose: str, *, definitions: bool, executor: bool) -> None:
    """Every setting the command needs and lacks, named at once (not one per attempt). Code
    workflows stand for both: their step functions are the executor."""
    missing = []
    code = bool(settings.workflows)
    if definitions and settings.definitions is None and not code:
        missing.append(
            "workflow definitions (definitions = DIR, or JOBLEDGER_DEFINITIONS) or code "
            "workflows (workflows = [modules], or JOBLEDGER_WORKFLOWS)"
        )
    if executor and settings.executor is None and not code:
        missing.append(
            "a step executor (executor = 'module:attr', or JOBLEDGER_EXECUTOR) or step "
            "functions (workflows = [modules])"
        )
    if missing:
        where = "the config file" if settings.config_file else "a config file (jobledger.toml)"
        raise ConfigError(f"{purpose} needs {' and '.join(missing)}: set them in {where}")


def _served(settings: Settings, purpose: str, *, definitions: bool, executor: bool) -> Parts:
    """The registry and executor parts of the engine. Commands that run no step get one
    registry and no executor (the executor is not imported); those that run steps get the
    code workflows, the definitions and the step functions, and every task a workflow
    names must be served (by a function, or by the executor)."""
    loaded = executor and settings.executor is not None
    if not definitions:
        return {"registry": FunctionRegistry(), "executor": _executor(settings) if loaded else None}
    declared = _definitions(settings)
    if not settings.workflows:
        registry = DefinitionRegistry(declared)
        return {"registry": registry, "executor": _executor(settings) if loaded else None}
    code = load_code(settings.workflows, settings.config_file)
    if not executor:
        return {"registry": _registry(code, declared)}
    given = _executor(settings) if loaded else None
    if given is None:
        _require_served(purpose, code, declared)
    return {"workflows": [*code.workflows, *declared], "tasks": code.tasks, "executor": given}


def _definitions(settings: Settings) -> list[WorkflowDefinition]:
    return [] if settings.definitions is None else load_definitions(settings.definitions)


def _registry(code: CodeModules, declared: Sequence[WorkflowDefinition]) -> WorkflowRegistry:
    try:
        return Registries([CodeRegistry(code.workflows), DefinitionRegistry(declared)])
    except ValueError as error:  # a (type, version) both define
        raise ConfigError(str(error)) from None


def _require_served(
    purpose: str, code: CodeModules, declared: Sequence[WorkflowDefinition]
) -> None:
    """Refused here, before the store opens, and saying what to do about it."""
    try:
        require_served(task_names([*code.workflows, *declared], code.tasks))
    except ConfigError as error:
        raise ConfigError(
            f"{purpose}: {error}: add @step functions for them to the workflows modules "
            f"({code.label}), or set executor = 'module:attr' for the rest"
        ) from None


def _executor(settings: Settings) -> StepExecutor:
    assert settings.executor is not None  # asked only when it is set
    return load_executor(settings.executor, settings.config_file)
