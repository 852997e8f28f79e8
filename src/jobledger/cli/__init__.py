"""The ``jobledger`` command line: typer commands over :class:`jobledger.Engine`.

Exit codes scripts can trust: 0 ok; 1 a refused operation or a validation problem;
2 a usage error; 3 the store is unreachable, its URL is bad, it is damaged, or the
configuration is unusable; 4 temporary, try again (the store failed mid-command, or the job was
contended for longer than the command's back-off). Errors print ``error: <message>``
on stderr, without a traceback.
"""

from __future__ import annotations

from importlib.metadata import version
from typing import Annotated, Any

import typer
import typer.main
from eventsourcing.persistence import PersistenceError
from typer import Typer

from jobledger.cli import (
    commands_audit,
    commands_bulk,
    commands_config,
    commands_dead_letters,
    commands_decisions,
    commands_definitions,
    commands_demo,
    commands_erasure,
    commands_http,
    commands_jobs,
    commands_keys,
    commands_ops,
    commands_repair,
    commands_retention,
    commands_schedules,
    commands_subscriptions,
)
from jobledger.cli.session import Exit, report_error
from jobledger.domain.errors import JobLedgerError

__all__ = ["Exit", "app", "main"]

app = Typer(
    name="jobledger",
    help="A durable, event-sourced job engine. Every command takes --store URL and "
    "--config FILE; exit codes: 0 ok, 1 refused or invalid, 2 usage, 3 store or config, "
    "4 temporary: try again.",
    no_args_is_help=True,
    add_completion=True,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)


def _print_version(asked: bool) -> None:
    if asked:
        typer.echo(f"jobledger {version('jobledger')}")
        raise typer.Exit()


@app.callback()
def _root(
    show_version: Annotated[
        bool,
        typer.Option(
            "--version",
            is_eager=True,
            callback=_print_version,
            help="Print the version and exit.",
        ),
    ] = False,
) -> None:
    """A durable, event-sourced job engine."""


# Registered in the order --help lists them: jobs, decisions and outside events, running,
# replay and audit, then definitions, settings and the demo.
app.command()(commands_jobs.submit)
app.command()(commands_jobs.show)
app.command("list")(commands_ops.list_jobs)
app.command()(commands_jobs.history)
app.command()(commands_jobs.tick)
app.command()(commands_decisions.approve)
app.command()(commands_decisions.reject)
app.command()(commands_decisions.reassign)
app.command()(commands_decisions.resume)
app.command()(commands_decisions.signal)
app.command()(commands_decisions.cancel)
app.command("raise-budget")(commands_decisions.raise_budget)
app.command()(commands_repair.retry)
app.command()(commands_repair.reset)
app.command()(commands_repair.fork)
app.add_typer(commands_decisions.token_app, name="token")
app.add_typer(commands_schedules.app, name="schedule")
app.add_typer(commands_bulk.app, name="bulk")
app.add_typer(commands_bulk.batches_app, name="batches")
app.command()(commands_ops.run)
app.command()(commands_ops.worker)
app.command()(commands_ops.reconcile)
app.command()(commands_http.serve)
app.add_typer(commands_ops.projections_app, name="projections")
app.add_typer(commands_dead_letters.app, name="dead-letters")
app.add_typer(commands_subscriptions.app, name="subscriptions")
app.command()(commands_audit.replay)
app.command()(commands_audit.migrate)
app.command()(commands_audit.verify)
app.command()(commands_audit.anchor)
app.command()(commands_audit.export)
app.command("import")(commands_audit.import_)
app.add_typer(commands_keys.app, name="keys")
app.command()(commands_erasure.erase)
app.command()(commands_retention.archive)
app.command()(commands_retention.restore)
app.add_typer(commands_retention.tombstones_app, name="tombstones")
app.add_typer(commands_definitions.app, name="definitions")
app.add_typer(commands_config.app, name="config")
app.command()(commands_demo.demo)


def command() -> Any:
    """The app as a click command whose usage line names arguments as the field's CLIs
    do (``show [OPTIONS] TENANT JOB``), not typer 0.29's ``{TENANT}``; help is plain
    text, as ``git`` and ``gh`` print it (typer's rich help labels flags ``<bool>``, as if
    they took a value). tests/test_cli_help.py holds typer to both."""
    root = typer.main.get_command(app)
    for each in _walk(root):
        for param in each.params:
            if param.param_type_name == "argument" and hasattr(param, "_usage_display_name"):
                param._usage_display_name = _plain_name(param)
    return root


def _plain_name(param: Any) -> Any:
    # typer already says "[ID]..." for an optional list: the dots are not said twice.
    def name() -> str:
        raw: str = param.display_name_raw
        return raw if param.nargs == 1 or raw.endswith("...") else raw + "..."

    return name


def _walk(command: Any) -> list[Any]:
    children = getattr(command, "commands", {}).values()
    return [command, *(nested for child in children for nested in _walk(child))]


def main() -> None:
    """The console script: run the app, mapping jobledger's errors to exit codes."""
    try:
        command()(prog_name="jobledger")
    except (JobLedgerError, PersistenceError) as error:
        raise SystemExit(report_error(error)) from None
