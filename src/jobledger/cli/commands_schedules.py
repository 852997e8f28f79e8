"""``jobledger schedule ...``: cron schedules that submit jobs (``engine.schedules``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any

import typer
from rich.table import Table

from jobledger.cli.params import InputOption, Tenant, VersionOption
from jobledger.cli.session import OneShot, one_shot_with
from jobledger.domain.schedule import MAX_CATCH_UP, CatchUp, Overlap, ScheduleEntry, ScheduleView
from jobledger.engine.schedule_commands import ScheduleCommands
from jobledger.presentation.figures import when
from jobledger.presentation.json_output import jsonable, print_json
from jobledger.presentation.terminal import console
from jobledger.projections import JobViews
from jobledger.projections.schedules import ScheduleRow

app = typer.Typer(
    help="Cron schedules that submit jobs: create, list, pause, resume, delete, trigger, "
    "history. The reconciler (run, reconcile) fires them.",
    no_args_is_help=True,
)

Name = Annotated[str, typer.Argument(metavar="NAME", help="Schedule name.", show_default=False)]


@app.command("create")
@one_shot_with("store", "config", "json")
def create(
    cmd: OneShot,
    tenant: Tenant,
    name: Name,
    cron: Annotated[
        str,
        typer.Option("--cron", metavar="EXPR", help='Five cron fields, e.g. "0 7 * * *".'),
    ],
    timezone: Annotated[
        str,
        typer.Option("--timezone", metavar="ZONE", help="IANA time zone, e.g. Europe/Paris."),
    ],
    workflow: Annotated[
        str, typer.Option("--workflow", metavar="W", help="Workflow type each firing submits.")
    ],
    version: VersionOption = None,
    input: InputOption = None,
    catch_up: Annotated[
        CatchUp,
        typer.Option("--catch-up", help="Firings missed while nothing ran: skip, one, all."),
    ] = CatchUp.SKIP,
    catch_up_max: Annotated[
        int | None,
        typer.Option(
            "--catch-up-max",
            metavar="N",
            min=1,
            max=MAX_CATCH_UP,
            help="With --catch-up all: fire at most the latest N missed firings.",
        ),
    ] = None,
    overlap: Annotated[
        Overlap,
        typer.Option(
            "--overlap",
            help="While the previous job runs: allow, skip, or buffer_one (fire one when it ends).",
        ),
    ] = Overlap.ALLOW,
) -> None:
    """Create a schedule: each time of --cron on --timezone's clock submits a --workflow job."""
    with cmd.engine(purpose="schedule create", definitions=True, mode="create") as e:
        view = e.schedules.create(
            tenant,
            name,
            cron=cron,
            timezone=timezone,
            workflow_type=workflow,
            workflow_version=version,
            input=input,
            catch_up=str(catch_up),
            catch_up_max=catch_up_max,
            overlap=str(overlap),
        )
    _print_view(view, cmd.json)


@app.command("list")
@one_shot_with("store", "config", "json")
def list_schedules(
    cmd: OneShot,
    tenant: Tenant,
    deleted: Annotated[bool, typer.Option("--deleted", help="Deleted schedules too.")] = False,
) -> None:
    """The tenant's schedules from the schedules view (brought up to date first): cron,
    zone, workflow, state, next firing on the schedule's clock and in UTC, last job."""
    with cmd.engine(purpose="schedule list", mode="read") as engine:
        views = JobViews(engine.deps.store)
        views.catch_up()
        rows = views.tenant_schedules(tenant, deleted=deleted)
    if cmd.json:
        print_json([_row_document(r) for r in rows])
        return
    table = Table()
    for column in ("name", "cron", "zone", "workflow", "state", "next (local)", "next (UTC)"):
        table.add_column(column, overflow="fold")  # ids are never cut
    table.add_column("policies")
    table.add_column("last job", overflow="fold")
    for row in rows:
        moment, local = row.schedule.next_firing()
        table.add_row(
            row.name,
            row.cron,
            row.timezone,
            _workflow(row.workflow_type, row.workflow_version),
            row.state,
            local.isoformat() if local is not None else "-",
            when(moment),
            f"catch-up {_catch_up(row.catch_up, row.catch_up_max)}, overlap {row.overlap}",
            row.last_job_id or "-",
        )
    console().print(table)


StateChange = Callable[[ScheduleCommands, str, str], ScheduleView]


def _state_command(action: str, change: StateChange, doc: str) -> None:
    """``schedule pause|resume|delete``: one change of the schedule's state, then the
    schedule as it is now."""

    @app.command(action, help=doc)
    @one_shot_with("store", "config", "json")
    def command(cmd: OneShot, tenant: Tenant, name: Name) -> None:
        with cmd.engine(purpose=f"schedule {action}") as engine:
            view = change(engine.schedules, tenant, name)
        _print_view(view, cmd.json)


_state_command("pause", ScheduleCommands.pause, "Stop firing until resumed (trigger still fires).")
_state_command(
    "resume",
    ScheduleCommands.resume,
    "Fire again from the next cron time (firings missed while paused are not caught up).",
)
_state_command(
    "delete", ScheduleCommands.delete, "Never fire again; the history (and the name) are kept."
)


@app.command("trigger")
@one_shot_with("store", "config", "json")
def trigger(
    cmd: OneShot,
    tenant: Tenant,
    name: Name,
) -> None:
    """Fire now, under a key of its own: submits the job (a worker runs it); the next cron
    firing is unchanged."""
    with cmd.engine(purpose="schedule trigger", definitions=True) as engine:
        job_id = engine.schedules.trigger(tenant, name)
        view = engine.schedules.get(tenant, name)
    if cmd.json:
        print_json({"job_id": job_id, "schedule": _view_document(view)})
        return
    console().print(f"fired {job_id}")


@app.command("history")
@one_shot_with("store", "config", "json")
def history(
    cmd: OneShot,
    tenant: Tenant,
    name: Name,
) -> None:
    """Every event of the schedule: each firing with its job, each skip with its reason."""
    with cmd.engine(purpose="schedule history", mode="read") as engine:
        entries = engine.schedules.history(tenant, name)
    if cmd.json:
        print_json({"events": [_entry_document(e) for e in entries]})
        return
    table = Table("version", "time", "event", "fire time", "what")
    for entry in entries:
        table.add_row(
            str(entry.version),
            when(entry.timestamp),
            entry.event_type,
            when(entry.data.get("fire_time")),
            _what(entry),
        )
    console().print(table)


# ---- printing ----------------------------------------------------------------------------


def _print_view(view: ScheduleView, json: bool) -> None:
    if json:
        print_json(_view_document(view))
        return
    local = view.next_fire_local.isoformat() if view.next_fire_local else "-"
    console().print(
        f"schedule {view.name} of {view.tenant_id}: {view.state}, {view.cron} "
        f"({view.timezone}) -> {_workflow(view.workflow_type, view.workflow_version)}; "
        f"next {local} ({when(view.next_fire_at)})"
    )


def _view_document(view: ScheduleView) -> dict[str, Any]:
    document: dict[str, Any] = jsonable(view)
    return document


def _row_document(row: ScheduleRow) -> dict[str, Any]:
    document: dict[str, Any] = jsonable(row)
    moment, local = row.schedule.next_firing()
    document["next_fire_at"] = None if moment is None else jsonable(moment)
    document["next_fire_local"] = None if local is None else local.isoformat()
    return document


def _entry_document(entry: ScheduleEntry) -> dict[str, Any]:
    document: dict[str, Any] = jsonable(entry)
    return document


def _workflow(workflow_type: str, version: int | None) -> str:
    return workflow_type if version is None else f"{workflow_type}@{version}"


def _catch_up(mode: str, bound: int) -> str:
    return f"all (max {bound})" if mode == "all" else mode


def _what(entry: ScheduleEntry) -> str:
    data = entry.data
    if entry.event_type == "Fired":
        return f"job {data['job_id']} ({data['trigger']})"
    if entry.event_type == "Skipped":
        return str(data["reason"])
    if entry.event_type == "Created":
        return f"{data['cron']} ({data['timezone']}) -> {data['workflow_type']}"
    return ""
