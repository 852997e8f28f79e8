"""``jobledger definitions check``: validate workflow definitions and code workflows without
running them, and check the task names they use against the step functions served."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.table import Table

from jobledger.cli.code_modules import CodeModules, load_code
from jobledger.cli.config_file import load_settings
from jobledger.cli.logs import OneShotLogFormatOption, OneShotLogLevelOption, configure_one_shot
from jobledger.cli.session import ConfigOption, Exit, JsonFlag, WorkflowsOption, with_workflows
from jobledger.domain.errors import ConfigError
from jobledger.presentation.json_output import compact, print_json
from jobledger.presentation.terminal import console

if TYPE_CHECKING:
    from jobledger.workflows import WorkflowDefinition
    from jobledger.workflows.code import CodeWorkflow

app = typer.Typer(help="Workflow definitions.", no_args_is_help=True)


@app.command()
def check(
    directory: Annotated[
        Path | None,
        typer.Argument(
            metavar="DIR",
            help="A directory (or one file) of *.yaml/*.yml/*.json definitions; default: "
            "the configured definitions.",
            show_default=False,
        ),
    ] = None,
    workflows: WorkflowsOption = None,
    config: ConfigOption = None,
    store: Annotated[
        str | None,
        typer.Option(
            "--store",
            metavar="URL",
            help="Also warn about versions live jobs in this store are pinned to that DIR "
            "(and the workflows modules) no longer define (workers with them would leave "
            "those jobs blocked).",
            show_default=False,
        ),
    ] = None,
    json: JsonFlag = False,
    log_level: OneShotLogLevelOption = None,
    log_format: OneShotLogFormatOption = None,
) -> None:
    """Validate definitions and code workflows without running them (exit 1 on any problem).

    Checks every field and each whole graph; prints each definition found, or every
    problem with its file, step and field. With workflows modules (--workflows or the
    configured ones) it also lists their @workflow functions and checks task names on
    both sides: a task a definition or workflow names that no @step function serves
    (missing; left to the executor when one is configured), and a @step function no
    workflow names (unused); either exits 1. With --store: warns (exit 0) for each
    (type, version) that jobs not yet finished are pinned to and the deployment drops.
    """
    configure_one_shot(log_level, log_format)
    from jobledger.workflows import DefinitionError, load_definitions

    settings = with_workflows(load_settings(config, store), workflows or ())
    if directory is None:
        directory = settings.definitions
    if directory is None and not settings.workflows:
        raise ConfigError(
            "give DIR or --workflows MODULE, or set definitions or workflows in --config "
            "(or JOBLEDGER_DEFINITIONS, JOBLEDGER_WORKFLOWS)"
        )
    try:
        definitions = load_definitions(directory) if directory is not None else []
    except DefinitionError as error:
        if not json:
            raise
        print_json({"ok": False, "problems": error.problems})
        raise typer.Exit(Exit.REFUSED) from None
    code = load_code(settings.workflows, settings.config_file) if settings.workflows else None
    files = _files_of(directory) if directory is not None else {}
    rows = [_summary(d, files.get(d.key, "?")) for d in definitions]
    code_rows = [_code_summary(w) for w in code.workflows] if code is not None else []
    tasks = _tasks(code, definitions, settings.executor) if code is not None else []
    problems = _twice(definitions, code) + [t["problem"] for t in tasks if t["problem"]]
    defined = {d.key for d in definitions} | {w.key for w in (code.workflows if code else ())}
    warnings = _dropped_pins(store, config, defined) if store else []
    if json:
        print_json(
            {
                "ok": not problems,
                "definitions": rows,
                "workflows": code_rows,
                "tasks": tasks,
                "problems": problems,
                "warnings": warnings,
            }
        )
    else:
        _print_check(rows, code_rows, tasks, directory, code)
        for problem in problems:
            sys.stderr.write(f"error: {problem}\n")
        for warning in warnings:
            sys.stderr.write(f"warning: {warning}\n")
    if problems:
        raise typer.Exit(Exit.REFUSED)


def _print_check(
    rows: list[dict[str, Any]],
    code_rows: list[dict[str, Any]],
    tasks: list[dict[str, Any]],
    directory: Path | None,
    code: CodeModules | None,
) -> None:
    out = console()
    if directory is not None:
        out.print(_table(rows, directory))
        out.print(f"{len(rows)} definition(s) OK in {directory}")
    if code is not None:
        out.print(_code_table(code_rows, code))
        out.print(_task_table(tasks))


def _code_summary(workflow: CodeWorkflow) -> dict[str, Any]:
    return {
        "module": workflow.body.__module__,
        "function": workflow.body.__qualname__,
        "type": workflow.type,
        "version": workflow.version,
        "tasks": [task.name for task in workflow.tasks()],
        "budget": dict(workflow.budget),
    }


def _tasks(
    code: CodeModules, definitions: list[WorkflowDefinition], executor: str | None
) -> list[dict[str, Any]]:
    """Every task name, who names it, what serves it, and what is wrong with it (None:
    nothing). With an executor configured, a name no function serves is handed to it."""
    from jobledger.workflows.serving import task_names

    names = task_names([*code.workflows, *definitions], code.tasks)
    rows = []
    for name in sorted(set(names.named) | names.served):
        named_by = list(names.named.get(name, ()))
        served = "function" if name in names.served else "executor" if executor else None
        problem = None
        if served is None:
            problem = f"task {name!r} (named by {', '.join(named_by)}): no @step function serves it"
        elif not named_by:
            problem = f"task {name!r}: a @step function serves it, but no workflow names it"
        rows.append({"task": name, "named_by": named_by, "served_by": served, "problem": problem})
    return rows


def _twice(definitions: list[WorkflowDefinition], code: CodeModules | None) -> list[str]:
    """A (type, version) both a definition and a code workflow define cannot be served."""
    declared = {d.key for d in definitions}
    return [
        f"{w.label} is defined both as code ({w.body.__module__}) and as a definition"
        for w in (code.workflows if code is not None else ())
        if w.key in declared
    ]


def _code_table(rows: list[dict[str, Any]], code: CodeModules) -> Table:
    table = Table(title=f"code workflows in {code.label}")
    for column in ("function", "type", "version", "tasks", "budget"):
        table.add_column(column)
    for row in rows:
        budget = compact(row["budget"]) if row["budget"] else "-"
        function = f"{row['module']}.{row['function']}"
        tasks = ", ".join(row["tasks"]) or "-"
        table.add_row(function, row["type"], f"v{row['version']}", tasks, budget)
    if not rows:
        table.caption = "no @workflow (step functions only)"
    return table


def _task_table(rows: list[dict[str, Any]]) -> Table:
    table = Table(title="task names: named by a workflow, served by a @step function")
    for column in ("task", "named by", "served by", "problem"):
        table.add_column(column, overflow="fold")
    for row in rows:
        named = ", ".join(row["named_by"]) or "-"
        problem = "missing" if row["served_by"] is None else "unused" if row["problem"] else ""
        table.add_row(row["task"], named, row["served_by"] or "-", problem)
    if not rows:
        table.caption = "no task named or served"
    return table


def _dropped_pins(store: str, config: Path | None, defined: set[tuple[str, int]]) -> list[str]:
    """A job runs on the version it was submitted with (or migrated to): a deploy that
    drops that version leaves the job blocked on every worker that has it no more."""
    from jobledger.cli.session import open_engine
    from jobledger.projections import JobViews

    with open_engine(store, config, purpose="definitions check --store") as engine:
        views = JobViews(engine.deps.store)
        views.catch_up()
        pins = views.live_pins()
    return [
        f"{count} live job(s) pinned to {kind!r} v{version}, which the checked definitions "
        "do not define: workers with these definitions would leave them blocked"
        for (kind, version), count in sorted(pins.items())
        if (kind, version) not in defined
    ]


def _files_of(path: Path) -> dict[tuple[str, int], str]:
    """Which file holds each (type, version); only called once everything loaded."""
    from jobledger.workflows.loader import SUFFIXES, parse_definition

    files = sorted(p for p in path.iterdir() if p.suffix in SUFFIXES) if path.is_dir() else [path]
    found = {}
    for file in files:
        if file.is_file():
            definition = parse_definition(file.read_text(encoding="utf-8"), file.name)
            found[definition.key] = file.name
    return found


def _summary(definition: WorkflowDefinition, file: str) -> dict[str, Any]:
    return {
        "file": file,
        "type": definition.type,
        "version": definition.version,
        "start": definition.start,
        "steps": {name: step.kind for name, step in definition.steps.items()},
        "budget": definition.budget_defaults(),
        "description": definition.description,
    }


def _table(rows: list[dict[str, Any]], directory: Path) -> Table:
    table = Table(title=f"workflow definitions in {directory}")
    for column in ("file", "type", "version", "start", "steps", "budget"):
        table.add_column(column)
    for row in rows:
        kinds = ", ".join(f"{name} ({kind})" for name, kind in row["steps"].items())
        budget = compact(row["budget"]) if row["budget"] else "-"
        table.add_row(row["file"], row["type"], f"v{row['version']}", row["start"], kinds, budget)
    return table
