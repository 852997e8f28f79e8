"""``jobledger bulk ...`` and ``jobledger batches ...``: one action over the jobs a query
matches, as a durable batch (``engine.bulk``), and the batches recorded."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn
from rich.table import Table

from jobledger.cli.commands_repair import StepOption
from jobledger.cli.params import LARGEST, PayloadOption, Tenant, parse_moment
from jobledger.cli.session import OneShot, WorkflowsOption, one_shot_with
from jobledger.domain.batch import BatchView
from jobledger.domain.status import UnknownStatusError, parse_statuses
from jobledger.engine.bulk_commands import BulkPreview
from jobledger.engine.bulk_query import BulkQuery
from jobledger.engine.engine import Engine
from jobledger.presentation.figures import when
from jobledger.presentation.json_output import jsonable, print_json
from jobledger.presentation.terminal import console
from jobledger.projections.batches import BatchRow

app = typer.Typer(
    help="One action over the jobs a query matches (cancel, signal, raise-budget, "
    "migrate, retry, reset), recorded as a batch that resumes after a crash and acts on "
    "each job once.",
    no_args_is_help=True,
)
batches_app = typer.Typer(
    help="The batches bulk actions recorded: list, show, resume.", no_args_is_help=True
)

BatchId = Annotated[str, typer.Argument(metavar="BATCH", help="Batch id.", show_default=False)]


def _moment(name: str, help: str) -> Any:
    return typer.Option(name, metavar="TIME", parser=parse_moment, help=help)


Workflow = Annotated[str | None, typer.Option("--workflow", metavar="W", help="Workflow type.")]
Version = Annotated[
    int | None,
    typer.Option("--version", metavar="N", min=1, max=LARGEST, help="Version (with --workflow)."),
]
Status = Annotated[
    str | None,
    typer.Option("--status", metavar="S1,S2", help="Comma-separated statuses, e.g. failed,queued."),
]
SubmittedAfter = Annotated[datetime | None, _moment("--submitted-after", "Submitted at or after.")]
SubmittedBefore = Annotated[datetime | None, _moment("--submitted-before", "Submitted before.")]
FinishedAfter = Annotated[datetime | None, _moment("--finished-after", "Finished at or after.")]
FinishedBefore = Annotated[datetime | None, _moment("--finished-before", "Finished before.")]
Mission = Annotated[str | None, typer.Option("--mission", metavar="ID", help="Mission id.")]
Correlation = Annotated[
    str | None, typer.Option("--correlation", metavar="ID", help="Correlation id.")
]
Error = Annotated[
    str | None,
    typer.Option("--error", metavar="TEXT", help="The failure reason holds TEXT (last error)."),
]
AllJobs = Annotated[
    bool, typer.Option("--all", help="Consent to a query that matches every job of the tenant.")
]
DryRun = Annotated[
    bool, typer.Option("--dry-run", help="Print the count and the first 10; write nothing.")
]
RepairVersion = Annotated[
    int | None,
    typer.Option(
        "--to-version",
        metavar="V",
        min=1,
        max=LARGEST,
        help="Each job on this definition version, where the steps it keeps replay the "
        "same on it (else it is skipped, with the diff).",
    ),
]
By = Annotated[str, typer.Option("--by", metavar="USER", help="Who acts (recorded).")]
Reason = Annotated[str, typer.Option("--reason", metavar="TEXT", help="Why (recorded).")]


def _query(
    workflow: str | None,
    version: int | None,
    status: str | None,
    submitted: tuple[datetime | None, datetime | None],
    finished: tuple[datetime | None, datetime | None],
    ids: tuple[str | None, str | None],
    error: str | None,
    all_jobs: bool,
) -> BulkQuery:
    try:
        statuses = tuple(parse_statuses(status))
    except UnknownStatusError as problem:
        raise typer.BadParameter(str(problem), param_hint="--status") from None
    fields = {
        "workflow_type": workflow,
        "workflow_version": version,
        "status": statuses,
        "submitted_after": submitted[0],
        "submitted_before": submitted[1],
        "finished_after": finished[0],
        "finished_before": finished[1],
        "mission_id": ids[0],
        "correlation_id": ids[1],
        "error_contains": error,
        "all": all_jobs,
    }
    return BulkQuery.parse({k: v for k, v in fields.items() if v not in (None, ())})


def _act(
    cmd: OneShot,
    engine: Engine,
    tenant: str,
    action: str,
    query: BulkQuery,
    params: dict[str, Any],
    *,
    dry_run: bool,
    by: str,
    reason: str,
) -> None:
    """A dry run's count and sample, or the batch run here with a progress bar."""
    if dry_run:
        _print_preview(engine.bulk.preview(tenant, action, query, params), cmd.json)
        return
    started = engine.bulk.start(tenant, action, query, params, by=by, reason=reason)
    if not cmd.json:
        console().print(f"batch {started.batch_id}: {action} on {started.total} job(s)")
    _run(cmd, engine, tenant, started.batch_id)


def _run(cmd: OneShot, engine: Engine, tenant: str, batch_id: str) -> None:
    with _progress(not cmd.json) as progress:
        task = progress.add_task(batch_id, total=None)
        done = engine.bulk.run(
            tenant,
            batch_id,
            lambda n, total: progress.update(task, completed=n, total=total),
        )
    _print_batch(done, cmd.json, outcomes=False)


@app.command("cancel")
@one_shot_with("store", "config", "json")
def cancel(
    cmd: OneShot,
    tenant: Tenant,
    by: By,
    reason: Reason,
    workflow: Workflow = None,
    version: Version = None,
    status: Status = None,
    submitted_after: SubmittedAfter = None,
    submitted_before: SubmittedBefore = None,
    finished_after: FinishedAfter = None,
    finished_before: FinishedBefore = None,
    mission: Mission = None,
    correlation: Correlation = None,
    error: Error = None,
    all_jobs: AllJobs = False,
    dry_run: DryRun = False,
) -> None:
    """Cancel every job the query matches (those already finished are skipped, with why)."""
    query = _query(
        workflow,
        version,
        status,
        (submitted_after, submitted_before),
        (finished_after, finished_before),
        (mission, correlation),
        error,
        all_jobs,
    )
    with cmd.engine(purpose="bulk cancel") as engine:
        _act(cmd, engine, tenant, "cancel", query, {}, dry_run=dry_run, by=by, reason=reason)


@app.command("signal")
@one_shot_with("store", "config", "json")
def signal(
    cmd: OneShot,
    tenant: Tenant,
    event: Annotated[str, typer.Argument(metavar="EVENT", help="The event's name.")],
    by: By,
    reason: Reason,
    payload: PayloadOption = None,
    workflow: Workflow = None,
    version: Version = None,
    status: Status = None,
    submitted_after: SubmittedAfter = None,
    submitted_before: SubmittedBefore = None,
    finished_after: FinishedAfter = None,
    finished_before: FinishedBefore = None,
    mission: Mission = None,
    correlation: Correlation = None,
    error: Error = None,
    all_jobs: AllJobs = False,
    dry_run: DryRun = False,
) -> None:
    """Deliver EVENT to every job the query matches (signal id `batch:BATCH`): a job
    waiting for it resumes, another keeps it for when its wait opens."""
    query = _query(
        workflow,
        version,
        status,
        (submitted_after, submitted_before),
        (finished_after, finished_before),
        (mission, correlation),
        error,
        all_jobs,
    )
    params = {"event_name": event, "payload": dict(payload or {})}
    with cmd.engine(purpose="bulk signal") as engine:
        _act(cmd, engine, tenant, "signal", query, params, dry_run=dry_run, by=by, reason=reason)


@app.command("raise-budget")
@one_shot_with("store", "config", "json")
def raise_budget(
    cmd: OneShot,
    tenant: Tenant,
    by: By,
    reason: Reason,
    max_steps: Annotated[
        int | None,
        typer.Option("--max-steps", metavar="N", min=1, max=LARGEST, help="The new step limit."),
    ] = None,
    max_cost: Annotated[
        str | None, typer.Option("--max-cost", metavar="USD", help="The new cost limit in dollars.")
    ] = None,
    deadline: Annotated[datetime | None, _moment("--deadline", "The new deadline.")] = None,
    workflow: Workflow = None,
    version: Version = None,
    status: Status = None,
    submitted_after: SubmittedAfter = None,
    submitted_before: SubmittedBefore = None,
    finished_after: FinishedAfter = None,
    finished_before: FinishedBefore = None,
    mission: Mission = None,
    correlation: Correlation = None,
    error: Error = None,
    all_jobs: AllJobs = False,
    dry_run: DryRun = False,
) -> None:
    """Raise the budget of every job the query matches; parked jobs go on."""
    query = _query(
        workflow,
        version,
        status,
        (submitted_after, submitted_before),
        (finished_after, finished_before),
        (mission, correlation),
        error,
        all_jobs,
    )
    limits = {"max_steps": max_steps, "max_cost_usd": max_cost, "deadline_at": deadline}
    params = {k: v for k, v in limits.items() if v is not None}
    with cmd.engine(purpose="bulk raise-budget") as engine:
        _act(
            cmd,
            engine,
            tenant,
            "raise-budget",
            query,
            params,
            dry_run=dry_run,
            by=by,
            reason=reason,
        )


@app.command("migrate")
@one_shot_with("store", "config", "json")
def migrate(
    cmd: OneShot,
    tenant: Tenant,
    to_version: Annotated[
        int, typer.Option("--to-version", metavar="V", min=1, max=LARGEST, help="The version.")
    ],
    by: By,
    reason: Reason,
    force: Annotated[bool, typer.Option("--force", help="Move even if replay diverges.")] = False,
    workflows: WorkflowsOption = None,
    workflow: Workflow = None,
    version: Version = None,
    status: Status = None,
    submitted_after: SubmittedAfter = None,
    submitted_before: SubmittedBefore = None,
    finished_after: FinishedAfter = None,
    finished_before: FinishedBefore = None,
    mission: Mission = None,
    correlation: Correlation = None,
    error: Error = None,
    all_jobs: AllJobs = False,
    dry_run: DryRun = False,
) -> None:
    """Move every job the query matches to version V, each only where replay says safe
    (or --force); the others are skipped with the divergence."""
    query = _query(
        workflow,
        version,
        status,
        (submitted_after, submitted_before),
        (finished_after, finished_before),
        (mission, correlation),
        error,
        all_jobs,
    )
    params = {"to_version": to_version, "force": force}
    opened = cmd.engine(purpose="bulk migrate", definitions=True, workflows=workflows)
    with opened as engine:
        _act(cmd, engine, tenant, "migrate", query, params, dry_run=dry_run, by=by, reason=reason)


@app.command("retry")
@one_shot_with("store", "config", "json")
def retry(
    cmd: OneShot,
    tenant: Tenant,
    by: By,
    reason: Reason,
    to_version: RepairVersion = None,
    workflows: WorkflowsOption = None,
    workflow: Workflow = None,
    version: Version = None,
    status: Status = None,
    submitted_after: SubmittedAfter = None,
    submitted_before: SubmittedBefore = None,
    finished_after: FinishedAfter = None,
    finished_before: FinishedBefore = None,
    mission: Mission = None,
    correlation: Correlation = None,
    error: Error = None,
    all_jobs: AllJobs = False,
    dry_run: DryRun = False,
) -> None:
    """Retry every failed job the query matches at the step that failed, as `jobledger
    retry` does (the others are skipped, with why)."""
    query = _query(
        workflow,
        version,
        status,
        (submitted_after, submitted_before),
        (finished_after, finished_before),
        (mission, correlation),
        error,
        all_jobs,
    )
    params = {"to_version": to_version}
    opened = cmd.engine(purpose="bulk retry", definitions=True, workflows=workflows)
    with opened as engine:
        _act(cmd, engine, tenant, "retry", query, params, dry_run=dry_run, by=by, reason=reason)


@app.command("reset")
@one_shot_with("store", "config", "json")
def reset(
    cmd: OneShot,
    tenant: Tenant,
    step: StepOption,
    by: By,
    reason: Reason,
    to_version: RepairVersion = None,
    workflows: WorkflowsOption = None,
    workflow: Workflow = None,
    version: Version = None,
    status: Status = None,
    submitted_after: SubmittedAfter = None,
    submitted_before: SubmittedBefore = None,
    finished_after: FinishedAfter = None,
    finished_before: FinishedBefore = None,
    mission: Mission = None,
    correlation: Correlation = None,
    error: Error = None,
    all_jobs: AllJobs = False,
    dry_run: DryRun = False,
) -> None:
    """Run every job the query matches again from after its step N (0: from the start),
    as `jobledger reset` does; a job N does not fit is skipped, with why."""
    query = _query(
        workflow,
        version,
        status,
        (submitted_after, submitted_before),
        (finished_after, finished_before),
        (mission, correlation),
        error,
        all_jobs,
    )
    params = {"step": step, "to_version": to_version}
    opened = cmd.engine(purpose="bulk reset", definitions=True, workflows=workflows)
    with opened as engine:
        _act(cmd, engine, tenant, "reset", query, params, dry_run=dry_run, by=by, reason=reason)


# ---- batches -----------------------------------------------------------------------------


@batches_app.command("list")
@one_shot_with("store", "config", "json")
def list_batches(
    cmd: OneShot,
    tenant: Tenant,
    limit: Annotated[int, typer.Option("--limit", metavar="N", min=1, max=LARGEST)] = 100,
) -> None:
    """The tenant's batches, newest first: action, who, how far each got."""
    with cmd.engine(purpose="batches list", mode="read") as engine:
        rows = engine.bulk.batches(tenant, limit)
    if cmd.json:
        print_json([_row_document(r) for r in rows])
        return
    table = Table()
    for column in ("batch", "action", "by", "created", "jobs", "applied", "skipped", "failed"):
        table.add_column(column, overflow="fold")
    table.add_column("state")
    for row in rows:
        table.add_row(
            row.batch_id,
            row.action,
            row.by_whom,
            when(row.created_at),
            str(row.total),
            str(row.applied),
            str(row.skipped),
            str(row.failed),
            "finished" if row.finished else "running or interrupted",
        )
    console().print(table)


@batches_app.command("show")
@one_shot_with("store", "config", "json")
def show(cmd: OneShot, tenant: Tenant, batch: BatchId) -> None:
    """A batch: its action, query, who and why, and each job's outcome."""
    with cmd.engine(purpose="batches show", mode="read") as engine:
        view = engine.bulk.batch(tenant, batch)
    _print_batch(view, cmd.json, outcomes=True)


@batches_app.command("resume")
@one_shot_with("store", "config", "json")
def resume(cmd: OneShot, tenant: Tenant, batch: BatchId, workflows: WorkflowsOption = None) -> None:
    """Go on with a batch whose runner stopped, from the first job without an outcome
    (a job acted on just before the stop is recorded, not acted on again)."""
    opened = cmd.engine(purpose="batches resume", definitions=True, workflows=workflows)
    with opened as engine:
        _run(cmd, engine, tenant, batch)


# ---- printing ----------------------------------------------------------------------------


def _print_preview(preview: BulkPreview, json: bool) -> None:
    if json:
        sample = [{"job_id": job_id, "status": status} for job_id, status in preview.sample]
        print_json(
            {"dry_run": True, "action": preview.action, "count": preview.count, "sample": sample}
        )
        return
    console().print(f"dry run: {preview.action} would act on {preview.count} job(s)")
    for job_id, status in preview.sample:
        console().print(f"  {job_id}  {status}", soft_wrap=True)


def _print_batch(view: BatchView, json: bool, *, outcomes: bool) -> None:
    if json:
        print_json(_view_document(view))
        return
    state = "finished" if view.finished else "not finished"
    console().print(
        f"batch {view.batch_id} ({view.action} by {view.by}: {view.reason}): {state}, "
        f"{view.done}/{view.total} done: {view.applied} applied, {view.skipped} skipped, "
        f"{view.failed} failed",
        soft_wrap=True,
    )
    if not outcomes:
        return
    table = Table("job", "outcome", "detail", "at")
    for done in view.outcomes:
        table.add_row(done.job_id, str(done.outcome), done.detail or "-", when(done.at))
    console().print(table)


def _view_document(view: BatchView) -> dict[str, Any]:
    document: dict[str, Any] = jsonable(view)
    document["done"] = view.done
    return document


def _row_document(row: BatchRow) -> dict[str, Any]:
    document: dict[str, Any] = jsonable(row)
    return document


@contextmanager
def _progress(visible: bool) -> Iterator[Progress]:
    """A progress bar on stderr (shown on a terminal only: logs get no control codes)."""
    stderr = Console(stderr=True)
    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        console=stderr,
        disable=not (visible and stderr.is_terminal),
        transient=True,
    ) as progress:
        yield progress
