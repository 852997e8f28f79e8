"""Operating jobledger: list, run, worker, reconcile, and the projections.

``--transport kafka`` (or ``transport = "kafka"`` / ``JOBLEDGER_TRANSPORT``) runs them as
a Kafka-driven service: workers consume the ticks and signals topics, the reconciler
publishes due ticks, and ``projections run --outbox`` publishes every job event.
"""

from __future__ import annotations

import logging
import signal
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path
from typing import Annotated, Any

import typer
from projections import JobViews, ProjectionRunner, StatusRow
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn
from rich.table import Table

from jobledger.adapters.event_store import EventSourcedJobStore
from jobledger.cli import output
from jobledger.cli.config_file import load_settings
from jobledger.cli.params import LARGEST
from jobledger.cli.session import ConfigOption, JsonFlag, StoreOption, open_engine
from jobledger.engine import Engine
from jobledger.errors import JobLedgerError
from jobledger.ports import BlockedNote
from jobledger.redaction import redact
from jobledger.runner import EmbeddedRunner, RunnerSettings
from jobledger.status import JobStatus

log = logging.getLogger(__name__)

projections_app = typer.Typer(help="The read models: run, rebuild, status.", no_args_is_help=True)

WorkersOption = Annotated[
    int, typer.Option("--workers", min=1, max=32, help="Worker threads handling ticks.")
]
TransportOption = Annotated[
    str | None,
    typer.Option(
        "--transport",
        help="Where ticks come from: local (in-process) or kafka (the ticks topic). "
        "Default: the transport setting (JOBLEDGER_TRANSPORT), else local.",
        show_default=False,
    ),
]
TRANSPORTS = ("local", "kafka")


def list_jobs(
    tenant: Annotated[str | None, typer.Option("--tenant", help="Only this tenant.")] = None,
    status: Annotated[
        str | None,
        typer.Option("--status", help="Comma-separated statuses, e.g. waiting_event,failed."),
    ] = None,
    workflow: Annotated[str | None, typer.Option("--workflow", help="Workflow type.")] = None,
    limit: Annotated[
        int, typer.Option("--limit", min=1, max=LARGEST, help="At most this many rows.")
    ] = 100,
    store: StoreOption = None,
    config: ConfigOption = None,
    json: JsonFlag = False,
) -> None:
    """List jobs from the status view (brought up to date with the log first)."""
    statuses = _statuses(status)
    with open_engine(store, config, purpose="list", mode="read") as engine:
        views = _views(engine)
        views.catch_up()
        rows = views.jobs(tenant_id=tenant, status_in=statuses, workflow_type=workflow, limit=limit)
        blocked = views.blocked_notes(rows)
    if json:
        output.print_json([_row_document(r, blocked.get(r.job_uuid)) for r in rows])
        return
    output.console().print(_jobs_table(rows, blocked))


def run(
    workers: WorkersOption = 1,
    transport: TransportOption = None,
    store: StoreOption = None,
    config: ConfigOption = None,
) -> None:
    """Run everything in one process: workers, projections and the reconciler.

    The embedded default: a SQLite file and nothing else to install. Ctrl-C stops
    cleanly; after a kill -9 the next start finishes whatever was in flight. With
    --transport kafka: Kafka workers, the views, the event outbox and the reconciler.
    """
    _run(store, config, RunnerSettings(workers=workers, projections=True), "run", transport)


def worker(
    workers: WorkersOption = 1,
    transport: TransportOption = None,
    store: StoreOption = None,
    config: ConfigOption = None,
) -> None:
    """Run workers. local: fed by the reconciler (views caught up on each pass).
    kafka: consumer-group members of the ticks and signals topics, nothing else."""
    _run(store, config, RunnerSettings(workers=workers, projections=False), "worker", transport)


def reconcile(
    once: Annotated[bool, typer.Option("--once", help="One pass, then exit.")] = False,
    transport: TransportOption = None,
    store: StoreOption = None,
    config: ConfigOption = None,
    json: JsonFlag = False,
) -> None:
    """Re-enqueue what is due (timers, lapsed leases, lost ticks) and run those ticks.

    With --once: one pass (every queued job counts as due), the ticks it enqueued are
    handled, and the counts printed. With --transport kafka the due ticks are published
    to the ticks topic (the workers run them) and nothing is run here.
    """
    if _is_kafka(transport, store, config):
        _reconcile_kafka(once, store, config, json)
        return
    if not once:
        _run(store, config, RunnerSettings(workers=1, projections=False), "reconcile", transport)
        return
    with open_engine(store, config, purpose="reconcile", definitions=True, executor=True) as engine:
        runner = EmbeddedRunner(engine)
        runner.views.catch_up()
        # By hand, a queued job is due now: no other process is about to tick it.
        result = runner.reconciler.reconcile(lost_tick_after=timedelta(0))
        handled = engine.run_until_idle()
        runner.reconciler.stop()
    document = {**vars(result), "handled": handled}
    if json:
        output.print_json(document)
        return
    if not result.acted:
        output.console().print("another reconciler holds the lock: nothing done")
        return
    output.console().print(
        f"scanned {result.scanned}, enqueued {result.enqueued}, skipped {result.skipped}; "
        f"handled {handled} ticks"
    )


@projections_app.command("run")
def projections_run(
    outbox: Annotated[
        bool,
        typer.Option(
            "--outbox",
            help="Also publish every job event to the Kafka events topic (the outbox).",
        ),
    ] = False,
    store: StoreOption = None,
    config: ConfigOption = None,
) -> None:
    """Follow the log and keep the views up to date until Ctrl-C."""
    if outbox:
        from jobledger.kafka_runner import KafkaRunnerSettings

        settings = KafkaRunnerSettings(workers=0, projections=True, outbox=True)
        with open_engine(store, config, purpose="projections run", mode="create") as engine:
            _run_kafka(engine, settings, "projections")
        return
    with open_engine(store, config, purpose="projections run", mode="create") as engine:
        runner = ProjectionRunner(_views(engine))
        with _stop_on_signals(runner.stop):
            output.console().print("projections: following the log (Ctrl-C to stop)")
            runner.run_forever()


@projections_app.command("rebuild")
def projections_rebuild(
    store: StoreOption = None, config: ConfigOption = None, json: JsonFlag = False
) -> None:
    """Drop the views and fold the whole log again, with a progress bar."""
    with open_engine(store, config, purpose="projections rebuild") as engine:
        views = _views(engine)
        total = sum(entry.last_event for entry in views.lag())
        with _progress(not json) as progress:
            task = progress.add_task("rebuilding", total=total or None)
            replayed = views.rebuild(lambda done, _: progress.update(task, completed=done))
    if json:
        output.print_json({"replayed": replayed})
    else:
        output.console().print(f"rebuilt the views from {replayed} notifications")


@projections_app.command("status")
def projections_status(
    store: StoreOption = None, config: ConfigOption = None, json: JsonFlag = False
) -> None:
    """How far each partition's views (and, with the kafka transport, the outbox) are
    behind the log."""
    with open_engine(store, config, purpose="projections status", mode="read") as engine:
        views = _views(engine)
        lag = views.lag()
        if engine.config.transport == "kafka":
            from projections.outbox import outbox_lag

            lag += outbox_lag(views.store)
    if json:
        output.print_json([{**vars(entry), "behind": entry.behind} for entry in lag])
        return
    table = Table("partition", "last event", "last applied", "behind")
    for entry in lag:
        table.add_row(
            entry.partition, str(entry.last_event), str(entry.last_tracked), str(entry.behind)
        )
    output.console().print(table)


# ---- plumbing ---------------------------------------------------------------------------


def _run(
    store: str | None, config: Any, settings: RunnerSettings, name: str, transport: str | None
) -> None:
    with (
        open_engine(
            store, config, purpose=name, definitions=True, executor=True, mode="create"
        ) as engine,
        _reload_on_sighup(engine, load_settings(config, store).definitions),
    ):
        if _use_transport(engine, transport) == "kafka":
            from jobledger.kafka_runner import KafkaRunnerSettings

            everything = name == "run"
            kafka_settings = KafkaRunnerSettings(
                workers=settings.workers if name != "reconcile" else 0,
                projections=everything,
                outbox=everything,
                reconciler=everything or name == "reconcile",
            )
            _run_kafka(engine, kafka_settings, name)
            return
        runner = EmbeddedRunner(engine, settings)
        output.console().print(
            f"jobledger {name}: {settings.workers} worker(s) on "
            f"{redact(engine.config.store_url)} (Ctrl-C to stop)"
        )
        with _stop_on_signals(runner.stopping.set):
            runner.run()
        output.console().print(f"stopped cleanly after {runner.handled} ticks")


def _is_kafka(transport: str | None, store: str | None, config: Any) -> bool:
    if transport is None:
        return load_settings(config, store).engine.transport == "kafka"
    return _check_transport(transport) == "kafka"


def _check_transport(transport: str) -> str:
    if transport not in TRANSPORTS:
        raise typer.BadParameter(
            f"unknown transport {transport!r}; available: {', '.join(TRANSPORTS)}",
            param_hint="--transport",
        )
    return transport


def _use_transport(engine: Engine, transport: str | None) -> str:
    """The --transport flag wins over the setting; kafka swaps in the Kafka queue."""
    chosen = _check_transport(transport or engine.config.transport)
    if chosen == "kafka":
        from jobledger.adapters.kafka import KafkaQueue, KafkaSettings

        if not isinstance(engine.queue, KafkaQueue):
            engine.use_queue(KafkaQueue(KafkaSettings.of(engine.config)))
    return chosen


def _run_kafka(engine: Engine, settings: Any, name: str) -> None:
    from jobledger.kafka_runner import KafkaRunner

    runner = KafkaRunner(engine, settings)
    parts = [
        f"{settings.workers} Kafka worker(s)" if settings.workers else "",
        "views" if settings.projections else "",
        "outbox" if settings.outbox else "",
        "reconciler" if settings.reconciler else "",
    ]
    output.console().print(
        f"jobledger {name}: {', '.join(p for p in parts if p)} on "
        f"{redact(engine.config.store_url)} and Kafka at "
        f"{engine.config.kafka_bootstrap_servers} (Ctrl-C to stop)"
    )
    with _stop_on_signals(runner.stopping.set):
        runner.run()
    output.console().print(f"stopped cleanly after {runner.handled} messages")


def _reconcile_kafka(once: bool, store: str | None, config: Any, json: bool) -> None:
    from jobledger.adapters.kafka import ensure_topics
    from jobledger.kafka_runner import KafkaRunner, KafkaRunnerSettings

    with open_engine(store, config, purpose="reconcile") as engine:
        _use_transport(engine, "kafka")
        if not once:
            _run_kafka(engine, KafkaRunnerSettings(workers=0, reconciler=True), "reconcile")
            return
        runner = KafkaRunner(engine, KafkaRunnerSettings(workers=0, reconciler=True))
        assert runner.views is not None and runner.reconciler is not None
        if runner.kafka.create_topics:
            ensure_topics(runner.kafka)
        runner.views.catch_up()
        # By hand, a queued job is due now: publish its tick.
        result = runner.reconciler.reconcile(lost_tick_after=timedelta(0))
        runner.reconciler.stop()
    document = {**vars(result), "published": result.enqueued}
    if json:
        output.print_json(document)
        return
    if not result.acted:
        output.console().print("another reconciler holds the lock: nothing done")
        return
    output.console().print(
        f"scanned {result.scanned}, published {result.enqueued} ticks to "
        f"{engine.config.kafka_ticks_topic}, skipped {result.skipped}"
    )


@contextmanager
def _reload_on_sighup(engine: Engine, directory: Path | None) -> Iterator[None]:
    """SIGHUP reads the definitions again and swaps them in for the workers at once (a
    rolling deploy adds a version without a restart). Invalid definitions are refused
    whole and the ones in use are kept; either way the runner says so."""
    if directory is None or not hasattr(signal, "SIGHUP"):
        yield
        return

    def reload(*_: Any) -> None:
        from jobledger.workflows import DefinitionRegistry

        try:
            registry = DefinitionRegistry.from_directory(directory)
        except JobLedgerError as error:
            log.warning(
                "SIGHUP: definitions in %s NOT reloaded, keeping those in use: %s", directory, error
            )
            return
        engine.use_registry(registry)
        loaded = ", ".join(f"{kind} v{version}" for kind, version in registry.known())
        output.console().print(f"SIGHUP: definitions reloaded from {directory}: {loaded or 'none'}")

    previous = signal.signal(signal.SIGHUP, reload)
    try:
        yield
    finally:
        signal.signal(signal.SIGHUP, previous)


@contextmanager
def _stop_on_signals(stop: Any) -> Iterator[None]:
    """Ctrl-C and SIGTERM ask the loop to stop; it finishes the tick in hand first."""
    previous = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    for sig in previous:
        signal.signal(sig, lambda *_: stop())
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


@contextmanager
def _progress(visible: bool) -> Iterator[Progress]:
    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        console=output.console(),
        disable=not visible,
        transient=True,
    ) as progress:
        yield progress


def _views(engine: Engine) -> JobViews:
    assert isinstance(engine.store, EventSourcedJobStore)
    return JobViews(engine.store)


def _statuses(raw: str | None) -> list[str]:
    if raw is None:
        return []
    names = [part.strip() for part in raw.split(",") if part.strip()]
    known = {s.value for s in JobStatus}
    unknown = [n for n in names if n not in known]
    if unknown:
        raise typer.BadParameter(
            f"unknown status {', '.join(unknown)}; known: {', '.join(sorted(known))}",
            param_hint="--status",
        )
    return names


def _row_document(row: StatusRow, blocked: BlockedNote | None) -> dict[str, Any]:
    document: dict[str, Any] = output.jsonable(
        {**vars(row), "cost_usd": row.cost_usd, "due_at": row.due_at, "blocked": blocked}
    )
    document.pop("cost_micros", None)
    return document


def _jobs_table(rows: list[StatusRow], blocked: dict[str, BlockedNote]) -> Table:
    table = Table("tenant", "job", "workflow", "status", "step", "next", "due", "cost", "updated")
    for row in rows:
        note = blocked.get(row.job_uuid)
        table.add_row(
            row.tenant_id,
            row.job_id,
            f"{row.workflow_type} v{row.workflow_version}",
            row.status if note is None else f"{row.status}, blocked: {output.blocked_text(note)}",
            str(row.current_step),
            row.next_step or "",
            output.when(row.due_at)
            if row.status not in ("completed", "failed", "cancelled")
            else "",
            output.money(row.cost_usd),
            output.when(row.updated_at),
        )
    if not rows:
        table.caption = "no jobs match"
    return table
