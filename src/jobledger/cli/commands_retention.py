"""Retention: ``jobledger archive``, ``jobledger restore``, ``jobledger tombstones list``."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn
from rich.table import Table

from jobledger.adapters.event_store import EventSourcedJobStore
from jobledger.adapters.kafka.settings import KafkaSettings
from jobledger.audit.archive import ArchiveSink
from jobledger.audit.archive_targets import close_archive, open_archive
from jobledger.audit.kafka_archive import archive_reader
from jobledger.cli.params import JobId, Tenant
from jobledger.cli.session import OneShot, one_shot, one_shot_with
from jobledger.config import MAX_RETENTION_DAYS
from jobledger.domain.retention import ArchiveTarget, RetentionPolicy, Tombstone
from jobledger.engine.engine import Engine
from jobledger.presentation.figures import when
from jobledger.presentation.json_output import print_json
from jobledger.presentation.terminal import console
from jobledger.projections import JobViews, StatusRow
from jobledger.projections.retention import Archiver, ArchiveRun, Scope

SAMPLE = 10
"""How many due jobs a dry run shows."""

tombstones_app = typer.Typer(
    help="The tombstones archived jobs left in the store.", no_args_is_help=True
)


@one_shot
def archive(
    cmd: OneShot,
    older_than: Annotated[
        int | None,
        typer.Option(
            "--older-than",
            metavar="DAYS",
            min=0,
            max=MAX_RETENTION_DAYS,
            help="Finished jobs that ended more than DAYS ago (else: past their configured "
            "retention).",
            show_default=False,
        ),
    ] = None,
    tenant: Annotated[str | None, typer.Option("--tenant", help="Only this tenant.")] = None,
    workflow: Annotated[
        str | None, typer.Option("--workflow", help="Only this workflow type.")
    ] = None,
    to: Annotated[
        Path | None,
        typer.Option(
            "--to",
            metavar="DIR",
            help="Archive to this directory, one file per job.",
            file_okay=False,
            show_default=False,
        ),
    ] = None,
    to_topic: Annotated[
        str | None,
        typer.Option(
            "--to-topic",
            metavar="TOPIC",
            help="Archive to this Kafka topic (the configured brokers), one message per job.",
            show_default=False,
        ),
    ] = None,
    dry_run: Annotated[
        bool,
        typer.Option("--dry-run", help="Count the due jobs and show a sample; change nothing."),
    ] = False,
) -> None:
    """Archive finished jobs past their retention: each job's export (the format
    `jobledger export` writes) goes to --to DIR or --to-topic TOPIC, then the job leaves
    the store, leaving a tombstone (its chain head, the archive and its sha256).

    A job is left in the store, with the reason, when it moved since it was read, when
    the outbox has not published its events, or (SQLite) while it holds its log's newest
    event.
    A directory's files that no tombstone names (a run that crashed before removing its
    job, a job restored since) are removed when their job is in the store.
    """
    if not dry_run and (to is None) == (to_topic is None):
        raise typer.BadParameter("give exactly one of --to DIR and --to-topic TOPIC")
    with cmd.engine(purpose="archive") as engine:
        scope = Scope(_policy(engine), older_than, tenant, workflow)
        archiver = _archiver(engine)
        now = engine.clock.now()
        rows = archiver.due(scope, now)
        if dry_run:
            _print_due(cmd, rows)
            return
        sink = _sink(engine, to, to_topic)
        try:
            with _progress(not cmd.json) as progress:
                task = progress.add_task("archiving", total=len(rows))
                run = archiver.run(
                    sink,
                    rows,
                    now,
                    lambda done, total: progress.update(task, completed=done, total=total),
                )
        finally:
            close_archive(sink)
    if cmd.json:
        print_json(run.document())
    else:
        _print_run(run, str(to) if to is not None else f"topic {to_topic}")


@one_shot
def restore(
    cmd: OneShot,
    tenant: Tenant,
    job: JobId,
    source: Annotated[
        str | None,
        typer.Option(
            "--from",
            metavar="REF",
            help="Where the archive is now (dir:PATH or kafka:TOPIC/PARTITION@OFFSET); "
            "default: the reference its tombstone keeps.",
            show_default=False,
        ),
    ] = None,
) -> None:
    """Bring an archived job back into the store, byte for byte: the archive must be the
    one its tombstone names (its sha256) and verify; the same events are written back
    and the tombstone removed, in one transaction."""
    with cmd.engine(purpose="restore") as engine:
        settings = KafkaSettings.of(engine.config)
        tombstone = _archiver(engine).restore(tenant, job, archive_reader(settings), source)
    if cmd.json:
        print_json(tombstone.document())
    else:
        where = source or tombstone.archive_ref
        console().print(f"restored {tenant}/{job}: {tombstone.version} events from {where}")


@tombstones_app.command("list")
@one_shot_with("store", "config", "json")
def list_tombstones(
    cmd: OneShot,
    tenant: Annotated[str | None, typer.Option("--tenant", help="Only this tenant.")] = None,
) -> None:
    """The archived jobs: each one's events, chain head and archive."""
    with cmd.engine(purpose="tombstones", mode="read") as engine:
        found = _store(engine).tombstones.all(tenant)
    if cmd.json:
        print_json([t.document() for t in found])
        return
    console().print(_tombstones_table(found))


# ---- plumbing -------------------------------------------------------------------------


def _store(engine: Engine) -> EventSourcedJobStore:
    store = engine.deps.store
    assert isinstance(store, EventSourcedJobStore)
    return store


def _archiver(engine: Engine) -> Archiver:
    return Archiver(_store(engine), JobViews(_store(engine)))


def _policy(engine: Engine) -> RetentionPolicy:
    options = engine.config.retention
    return RetentionPolicy(options.default_days, options.tenants, options.workflows)


def _sink(engine: Engine, to: Path | None, to_topic: str | None) -> ArchiveSink:
    target = ArchiveTarget(directory=to) if to is not None else ArchiveTarget(topic=to_topic)
    return open_archive(target, engine.config)


def _print_due(cmd: OneShot, rows: list[StatusRow]) -> None:
    sample = rows[:SAMPLE]
    if cmd.json:
        print_json(
            {
                "due": len(rows),
                "sample": [
                    {"tenant": r.tenant_id, "job": r.job_id, "ended_at": r.updated_at}
                    for r in sample
                ],
            }
        )
        return
    out = console()
    out.print(f"{len(rows)} job(s) due for archiving (dry run: nothing changed)")
    if sample:
        table = Table("TENANT", "JOB", "WORKFLOW", "STATUS", "ENDED")
        for r in sample:
            table.add_row(r.tenant_id, r.job_id, r.workflow_type, r.status, when(r.updated_at))
        out.print(table)


def _print_run(run: ArchiveRun, destination: str) -> None:
    out = console()
    out.print(
        f"archived {len(run.archived)} of {run.due} due job(s) to {destination} ({run.bytes} bytes)"
    )
    for tenant_id, job_id, reason in run.skipped:
        out.print(f"  left {tenant_id}/{job_id}: {reason}")
    for path in run.strays_removed:
        out.print(f"  removed stray {path}")
    for path in run.foreign:
        out.print(f"  not this store's (left alone): {path}")


def _tombstones_table(found: list[Tombstone]) -> Table:
    table = Table("TENANT", "JOB", "STATUS", "EVENTS", "ARCHIVED", "ARCHIVE")
    for t in found:
        table.add_row(
            t.tenant_id, t.job_id, t.status, str(t.version), when(t.archived_at), t.archive_ref
        )
    return table


@contextmanager
def _progress(visible: bool) -> Iterator[Any]:
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
