"""The ``jobledger`` command line: typer commands over :class:`jobledger.Engine`.

Exit codes scripts can trust: 0 ok; 1 a refused operation or a validation problem;
2 a usage error; 3 the store is unreachable, its URL is bad, or the configuration is
unusable; 4 temporary, try again (the store failed mid-command, or the job was
contended for longer than the command's back-off). Errors print ``error: <message>``
on stderr, without a traceback.
"""

from __future__ import annotations

from eventsourcing.persistence import PersistenceError
from typer import Typer

from jobledger.cli import (
    commands_audit,
    commands_decisions,
    commands_definitions,
    commands_demo,
    commands_jobs,
    commands_ops,
)
from jobledger.cli.session import Exit, report_error
from jobledger.errors import JobLedgerError

__all__ = ["Exit", "app", "main"]

JOBS, EVENTS, OPS, OTHER = (
    "Jobs",
    "Decisions and outside events",
    "Running",
    "Definitions and demo",
)
AUDIT = "Replay and audit"

app = Typer(
    name="jobledger",
    help="A durable, event-sourced job engine. Every command takes --store URL and "
    "--config FILE; exit codes: 0 ok, 1 refused or invalid, 2 usage, 3 store or config, "
    "4 temporary: try again.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode="markdown",
)
app.command(rich_help_panel=JOBS)(commands_jobs.submit)
app.command(rich_help_panel=JOBS)(commands_jobs.show)
app.command(rich_help_panel=JOBS)(commands_jobs.history)
app.command(rich_help_panel=JOBS)(commands_jobs.tick)
app.command(rich_help_panel=EVENTS)(commands_decisions.approve)
app.command(rich_help_panel=EVENTS)(commands_decisions.reject)
app.command(rich_help_panel=EVENTS)(commands_decisions.resume)
app.command(rich_help_panel=EVENTS)(commands_decisions.signal)
app.command(rich_help_panel=EVENTS)(commands_decisions.cancel)
app.add_typer(commands_decisions.token_app, name="token", rich_help_panel=EVENTS)
app.add_typer(commands_definitions.app, name="definitions", rich_help_panel=OTHER)
app.command(rich_help_panel=OTHER)(commands_demo.demo)
app.command("list", rich_help_panel=JOBS)(commands_ops.list_jobs)
app.command(rich_help_panel=OPS)(commands_ops.run)
app.command(rich_help_panel=OPS)(commands_ops.worker)
app.command(rich_help_panel=OPS)(commands_ops.reconcile)
app.add_typer(commands_ops.projections_app, name="projections", rich_help_panel=OPS)
app.command(rich_help_panel=AUDIT)(commands_audit.replay)
app.command(rich_help_panel=AUDIT)(commands_audit.migrate)
app.command(rich_help_panel=AUDIT)(commands_audit.verify)
app.command(rich_help_panel=AUDIT)(commands_audit.anchor)
app.command(rich_help_panel=AUDIT)(commands_audit.export)
app.command("import", rich_help_panel=AUDIT)(commands_audit.import_)


def main() -> None:
    """The console script: run the app, mapping jobledger's errors to exit codes."""
    try:
        app(prog_name="jobledger")
    except (JobLedgerError, PersistenceError) as error:
        raise SystemExit(report_error(error)) from None
