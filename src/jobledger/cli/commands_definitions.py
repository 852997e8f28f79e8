"""``jobledger definitions check``: validate workflow definitions without running them."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.table import Table

from jobledger.cli.config_file import load_settings
from jobledger.cli.logs import OneShotLogFormatOption, OneShotLogLevelOption, configure_one_shot
from jobledger.cli.session import ConfigOption, Exit, JsonFlag
from jobledger.domain.errors import ConfigError
from jobledger.presentation.json_output import compact, print_json
from jobledger.presentation.terminal import console

if TYPE_CHECKING:
    from jobledger.workflows import WorkflowDefinition

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
    config: ConfigOption = None,
    store: Annotated[
        str | None,
        typer.Option(
            "--store",
            metavar="URL",
            help="Also warn about versions live jobs in this store are pinned to that DIR "
            "no longer defines (workers with DIR would leave those jobs blocked).",
            show_default=False,
        ),
    ] = None,
    json: JsonFlag = False,
    log_level: OneShotLogLevelOption = None,
    log_format: OneShotLogFormatOption = None,
) -> None:
    """Validate definitions without running them (exit 1 on any problem).

    Checks every field and each whole graph; prints each definition found, or every
    problem with its file, step and field. With --store: warns (exit 0) for each
    (type, version) that jobs not yet finished are pinned to and DIR drops.
    """
    configure_one_shot(log_level, log_format)
    from jobledger.workflows import DefinitionError, load_definitions

    if directory is None:
        directory = load_settings(config, store).definitions
        if directory is None:
            raise ConfigError("give DIR, or set definitions in --config or JOBLEDGER_DEFINITIONS")
    try:
        definitions = load_definitions(directory)
    except DefinitionError as error:
        if not json:
            raise
        print_json({"ok": False, "problems": error.problems})
        raise typer.Exit(Exit.REFUSED) from None
    files = _files_of(directory)
    rows = [_summary(d, files.get(d.key, "?")) for d in definitions]
    warnings = _dropped_pins(store, config, definitions, directory) if store else []
    if json:
        print_json({"ok": True, "definitions": rows, "warnings": warnings})
        return
    out = console()
    out.print(_table(rows, directory))
    out.print(f"{len(rows)} definition(s) OK in {directory}")
    for warning in warnings:
        sys.stderr.write(f"warning: {warning}\n")


def _dropped_pins(
    store: str, config: Path | None, definitions: list[WorkflowDefinition], directory: Path
) -> list[str]:
    """A job runs on the version it was submitted with (or migrated to): a deploy that
    drops that version leaves the job blocked on every worker that has it no more."""
    from jobledger.cli.session import open_engine
    from jobledger.projections import JobViews

    with open_engine(store, config, purpose="definitions check --store") as engine:
        views = JobViews(engine.deps.store)
        views.catch_up()
        pins = views.live_pins()
    defined = {definition.key for definition in definitions}
    return [
        f"{count} live job(s) pinned to {kind!r} v{version}, which {directory} does not "
        "define: workers with these definitions would leave them blocked"
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
