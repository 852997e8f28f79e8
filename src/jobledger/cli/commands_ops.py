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
from dataclasses import replace
from datetime import datetime
from enum import StrEnum
from typing import TYPE_CHECKING, Annotated, Any, Literal, NoReturn

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn
from rich.table import Table

from jobledger.adapters.event_store import StoreMode
from jobledger.api import require_http
from jobledger.audit.anchor_schedule import load_anchor_settings
from jobledger.cli.config_file import Settings, load_settings
from jobledger.cli.logs import (
    LogFormat,
    LogFormatOption,
    LogLevel,
    LogLevelOption,
)
from jobledger.cli.logs import configure as configure_logs
from jobledger.cli.params import LARGEST, parse_bind, parse_moment
from jobledger.cli.reloading import reload_on_sighup
from jobledger.cli.session import (
    ConfigOption,
    JsonFlag,
    OneShot,
    StoreOption,
    one_shot,
    open_engine,
)
from jobledger.domain.redaction import redact
from jobledger.domain.status import TERMINAL_STATUSES, UnknownStatusError, parse_statuses
from jobledger.engine.engine import Engine
from jobledger.orchestration.ports import BlockedNote
from jobledger.presentation.figures import money, when
from jobledger.presentation.job_view import blocked_text
from jobledger.presentation.json_output import jsonable, print_json
from jobledger.presentation.terminal import console
from jobledger.projections import JobViews, StatusRow
from jobledger.projections.job_views import JobQuery, cursor
from jobledger.runtime.processes import ProcessGroup
from jobledger.runtime.supervisor import Services, Supervisor

if TYPE_CHECKING:
    from jobledger.api.settings import ApiSettings

log = logging.getLogger(__name__)

projections_app = typer.Typer(help="The read models: run, rebuild, status.", no_args_is_help=True)

WorkersOption = Annotated[
    int, typer.Option("--workers", min=1, max=32, help="Worker threads handling ticks.")
]
ProcessesOption = Annotated[
    int,
    typer.Option(
        "--processes",
        min=1,
        max=64,
        help="Run N processes of this command on the store under one parent, which starts "
        "again one that dies and stops them all on Ctrl-C or SIGTERM. They share the work: "
        "on the local transport each takes its share of the due jobs from the store, on "
        "Kafka each is a consumer-group member. Not with --http or --metrics-port.",
    ),
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
HttpOption = Annotated[
    str | None,
    typer.Option(
        "--http",
        metavar="HOST:PORT",
        help="Also serve the HTTP API there, e.g. 127.0.0.1:8080 (port 0: any free one). "
        "Its other settings: JOBLEDGER_HTTP_*. Needs the http extra.",
        show_default=False,
    ),
]
MetricsPortOption = Annotated[
    int | None,
    typer.Option(
        "--metrics-port",
        metavar="PORT",
        min=0,
        max=65_535,
        help="Serve Prometheus metrics at /metrics on this port (0: any free one, printed "
        "as metrics: URL), on JOBLEDGER_METRICS_HOST (default 127.0.0.1). Default: the "
        "metrics_port setting (JOBLEDGER_METRICS_PORT), else none. Needs the metrics extra.",
        show_default=False,
    ),
]
TRANSPORTS = ("local", "kafka")
TERMINAL = {str(status) for status in TERMINAL_STATUSES}
Transport = Literal["local", "kafka"]


def _moment_option(name: str, help: str) -> Any:
    return typer.Option(name, metavar="TIME", parser=parse_moment, help=help)


class ListOutput(StrEnum):
    TABLE = "table"
    JSON = "json"
    PLAIN = "plain"


@one_shot
def list_jobs(
    cmd: OneShot,
    tenant: Annotated[str | None, typer.Option("--tenant", help="Only this tenant.")] = None,
    status: Annotated[
        str | None,
        typer.Option("--status", help="Comma-separated statuses, e.g. waiting_event,failed."),
    ] = None,
    workflow: Annotated[str | None, typer.Option("--workflow", help="Workflow type.")] = None,
    version: Annotated[
        int | None,
        typer.Option("--version", min=1, max=LARGEST, help="Workflow version (with --workflow)."),
    ] = None,
    mission: Annotated[str | None, typer.Option("--mission", help="Mission id.")] = None,
    correlation: Annotated[
        str | None, typer.Option("--correlation", help="Correlation id.")
    ] = None,
    created_after: Annotated[
        datetime | None, _moment_option("--created-after", "Created at or after (ISO 8601).")
    ] = None,
    created_before: Annotated[
        datetime | None, _moment_option("--created-before", "Created before (ISO 8601).")
    ] = None,
    updated_after: Annotated[
        datetime | None, _moment_option("--updated-after", "Changed at or after (ISO 8601).")
    ] = None,
    updated_before: Annotated[
        datetime | None, _moment_option("--updated-before", "Changed before (ISO 8601).")
    ] = None,
    after: Annotated[
        str | None,
        typer.Option("--after", metavar="CURSOR", help="Continue after this row (a row's cursor)."),
    ] = None,
    limit: Annotated[
        int, typer.Option("--limit", min=1, max=LARGEST, help="At most this many rows.")
    ] = 100,
    wide: Annotated[
        bool, typer.Option("--wide", help="Every column (workflow, step, updated) in the table.")
    ] = False,
    output_format: Annotated[
        ListOutput | None,
        typer.Option(
            "--output",
            "-o",
            help="table (people), json (machines), plain (tab-separated, for scripts).",
        ),
    ] = None,
) -> None:
    """List jobs from the status view (brought up to date with the log first), newest
    change first. A listing that stops at --limit says how to go on (--after CURSOR)."""
    query = JobQuery(
        tenant_id=tenant,
        status_in=_statuses(status),
        workflow_type=workflow,
        workflow_version=version,
        mission_id=mission,
        correlation_id=correlation,
        created_after=created_after,
        created_before=created_before,
        updated_after=updated_after,
        updated_before=updated_before,
        after=after,
        limit=limit,
    )
    with cmd.engine(purpose="list", mode="read") as engine:
        views = _views(engine)
        views.catch_up()
        rows = views.jobs(query)
        blocked = views.blocked_notes(rows)
    shape = output_format or (ListOutput.JSON if cmd.json else ListOutput.TABLE)
    if shape is ListOutput.JSON:
        print_json([_row_document(r, blocked.get(r.job_uuid)) for r in rows])
    elif shape is ListOutput.PLAIN:
        for row in rows:
            print("\t".join(_plain_cells(row, blocked.get(row.job_uuid))))
    else:
        console().print(_jobs_table(rows, blocked, wide=wide))
        if len(rows) == limit:
            # The command on a line of its own, to paste.
            console().print(f"more: --after {cursor(rows[-1])}", soft_wrap=True)


def run(
    workers: WorkersOption = 1,
    processes: ProcessesOption = 1,
    transport: TransportOption = None,
    http: HttpOption = None,
    anchor_to: Annotated[
        str | None,
        typer.Option(
            "--anchor-to",
            metavar="DEST",
            help="Anchor every chain head on a schedule to file:PATH (or a path) or "
            "kafka://HOST:PORT[/TOPIC] (else [anchors] to / JOBLEDGER_ANCHORS_TO).",
            show_default=False,
        ),
    ] = None,
    anchor_every: Annotated[
        str | None,
        typer.Option(
            "--anchor-every",
            metavar="DURATION",
            help="Anchor at least this often when events were appended (30s, 5m, 1h; "
            "default 5m unless --anchor-events is given).",
            show_default=False,
        ),
    ] = None,
    anchor_events: Annotated[
        int | None,
        typer.Option(
            "--anchor-events",
            metavar="N",
            min=1,
            help="Also anchor once N events were appended since the last anchor.",
            show_default=False,
        ),
    ] = None,
    metrics_port: MetricsPortOption = None,
    store: StoreOption = None,
    config: ConfigOption = None,
    log_level: LogLevelOption = LogLevel.INFO,
    log_format: LogFormatOption = LogFormat.TEXT,
) -> None:
    """Run everything in one process: workers, projections and the reconciler (and,
    with --http, the HTTP API).

    The embedded default: a SQLite file and nothing else to install. Ctrl-C stops
    cleanly; after a kill -9 the next start finishes whatever was in flight. With
    --transport kafka: Kafka workers, the views, the event outbox and the reconciler.
    """
    configure_logs(log_level, log_format)
    if processes > 1:
        _in_processes(
            processes,
            "run",
            {
                "--workers": workers,
                "--transport": transport,
                "--anchor-to": anchor_to,
                "--anchor-every": anchor_every,
                "--anchor-events": anchor_events,
                "--store": store,
                "--config": config,
                "--log-level": log_level,
                "--log-format": log_format,
            },
            one_process_only={"--http": http, "--metrics-port": metrics_port},
        )
    kafka = _is_kafka(transport, store, config)
    services = Services.of("run", kafka=kafka, workers=workers)
    if http is not None:
        services = replace(services, http=_api_settings(http, store, config))
    settings = load_settings(config, store)
    anchoring = load_anchor_settings(
        settings.anchors,
        settings.config_file,
        to=anchor_to,
        every=anchor_every,
        events=anchor_events,
    )
    services = replace(services, anchors=anchoring.plan())
    _serve("run", services, store, config, _transport_name(kafka), metrics_port=metrics_port)


def _api_settings(bind: str, store: str | None, config: Any) -> ApiSettings:
    """The API's settings as ``serve`` reads them (JOBLEDGER_HTTP_*, then the config
    file's [http] table), listening at ``bind`` (HOST:PORT)."""
    host, port = parse_bind(bind)
    require_http()
    from jobledger.api.settings import load_api_settings
    from jobledger.cli.commands_http import require_auth

    settings = load_settings(config, store)
    api = load_api_settings(settings.http, settings.config_file, host=host, port=port)
    require_auth(api, "run --http")
    return api


def worker(
    workers: WorkersOption = 1,
    processes: ProcessesOption = 1,
    transport: TransportOption = None,
    metrics_port: MetricsPortOption = None,
    store: StoreOption = None,
    config: ConfigOption = None,
    log_level: LogLevelOption = LogLevel.INFO,
    log_format: LogFormatOption = LogFormat.TEXT,
) -> None:
    """Run workers. local: they take due jobs from the store (views caught up on each
    pass). kafka: consumer-group members of the ticks and signals topics and of the
    subscriptions' topics, nothing else."""
    configure_logs(log_level, log_format)
    if processes > 1:
        _in_processes(
            processes,
            "worker",
            {
                "--workers": workers,
                "--transport": transport,
                "--store": store,
                "--config": config,
                "--log-level": log_level,
                "--log-format": log_format,
            },
            one_process_only={"--metrics-port": metrics_port},
        )
    kafka = _is_kafka(transport, store, config)
    services = Services.of("worker", kafka=kafka, workers=workers)
    _serve("worker", services, store, config, _transport_name(kafka), metrics_port=metrics_port)


def reconcile(
    once: Annotated[bool, typer.Option("--once", help="One pass, then exit.")] = False,
    transport: TransportOption = None,
    metrics_port: MetricsPortOption = None,
    store: StoreOption = None,
    config: ConfigOption = None,
    json: JsonFlag = False,
    log_level: LogLevelOption = LogLevel.WARNING,
    log_format: LogFormatOption = LogFormat.TEXT,
) -> None:
    """Re-enqueue what is due (timers, lapsed leases, lost ticks) and run those ticks.

    With --once: one pass (every queued job counts as due), the ticks it enqueued are
    handled, and the counts printed. With --transport kafka the due ticks are published
    to the ticks topic (the workers run them) and nothing is run here.
    """
    configure_logs(log_level, log_format)
    kafka = _is_kafka(transport, store, config)
    services = Services.of("reconcile", kafka=kafka)
    if not once:
        # On Kafka nothing runs here, so neither definitions nor a store to create.
        mode: StoreMode = "existing" if kafka else "create"
        transport_name = _transport_name(kafka)
        _serve(
            "reconcile",
            services,
            store,
            config,
            transport_name,
            mode=mode,
            metrics_port=metrics_port,
        )
        return
    if metrics_port is not None:
        raise typer.BadParameter(
            "metrics are served by a running reconciler, not by one pass (--once)",
            param_hint="--metrics-port",
        )
    with open_engine(
        store,
        config,
        purpose="reconcile",
        # On Kafka the definitions only serve the schedules it fires, when configured.
        definitions=not kafka or _has_workflows(load_settings(config, store)),
        executor=not kafka,
        transport=_transport_name(kafka),
        metrics=False,
    ) as engine:
        result, handled = Supervisor(engine, services).reconcile_once()
        ticks_topic = engine.config.kafka.ticks_topic
    extra = {"published": result.enqueued} if kafka else {"handled": handled}
    if json:
        print_json({**vars(result), **extra})
        return
    if not result.acted:
        console().print("another reconciler holds the lock: nothing done")
        return
    if kafka:
        console().print(
            f"scanned {result.scanned}, published {result.enqueued} ticks to {ticks_topic}, "
            f"skipped {result.skipped}; fired {result.fired} scheduled jobs"
        )
        return
    console().print(
        f"scanned {result.scanned}, enqueued {result.enqueued}, skipped {result.skipped}; "
        f"fired {result.fired} scheduled jobs; handled {handled} ticks"
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
    metrics_port: MetricsPortOption = None,
    store: StoreOption = None,
    config: ConfigOption = None,
    log_level: LogLevelOption = LogLevel.INFO,
    log_format: LogFormatOption = LogFormat.TEXT,
) -> None:
    """Follow the log and keep the views up to date until Ctrl-C."""
    configure_logs(log_level, log_format)
    services = Services.of("projections", kafka=False, outbox=outbox)
    _serve("projections", services, store, config, transport=None, metrics_port=metrics_port)


@projections_app.command("rebuild")
@one_shot
def projections_rebuild(
    cmd: OneShot,
) -> None:
    """Drop the views and fold the whole log again, with a progress bar."""
    with cmd.engine(purpose="projections rebuild") as engine:
        views = _views(engine)
        total = sum(entry.last_event for entry in views.lag())
        with _progress(not cmd.json) as progress:
            task = progress.add_task("rebuilding", total=total or None)
            replayed = views.rebuild(lambda done, _: progress.update(task, completed=done))
    if cmd.json:
        print_json({"replayed": replayed})
    else:
        console().print(f"rebuilt the views from {replayed} notifications")


@projections_app.command("status")
@one_shot
def projections_status(
    cmd: OneShot,
) -> None:
    """How far each partition's views (and, with the kafka transport, the outbox) are
    behind the log."""
    with cmd.engine(purpose="projections status", mode="read") as engine:
        views = _views(engine)
        lag = views.lag()
        if engine.config.transport == "kafka":
            from jobledger.projections.outbox import outbox_lag

            lag += outbox_lag(views.store)
    if cmd.json:
        print_json([{**vars(entry), "behind": entry.behind} for entry in lag])
        return
    table = Table("partition", "last event", "last applied", "behind")
    for entry in lag:
        table.add_row(
            entry.partition, str(entry.last_event), str(entry.last_tracked), str(entry.behind)
        )
    console().print(table)


# ---- plumbing ---------------------------------------------------------------------------


def _serve(
    name: str,
    services: Services,
    store: str | None,
    config: Any,
    transport: Transport | None,
    *,
    mode: StoreMode = "create",
    metrics_port: int | None = None,
) -> None:
    """Run the services until Ctrl-C or SIGTERM, on ``transport`` (None: as configured).
    The engine runs steps only where there are workers: only then are the definitions
    and the executor loaded, and SIGHUP reloads the definitions. Metrics are kept when
    a port is (flag or setting), or when the HTTP API serves them."""
    runs_steps = services.workers > 0
    kafka = transport == "kafka" or services.outbox
    settings = load_settings(config, store)
    # A reconciler submits the jobs of due schedules: it resolves their workflows.
    fires_schedules = services.reconciler and _has_workflows(settings)
    with open_engine(
        store,
        config,
        purpose=name,
        definitions=runs_steps or fires_schedules,
        executor=runs_steps,
        mode=mode,
        transport=transport,
        metrics_port=metrics_port,
        metrics=services.http is not None or None,
    ) as engine:
        supervisor = Supervisor(engine, services)
        definitions = settings.definitions if runs_steps else None
        with reload_on_sighup(engine, definitions, supervisor.api):
            console().print(_banner(name, engine, services, kafka))
            for line in _setup(engine, settings, runs_steps):
                console().print(f"  {line}", soft_wrap=True)
            if supervisor.api is not None:
                console().print(f"  http: {supervisor.api.url}", soft_wrap=True)
            if supervisor.metrics is not None:
                console().print(f"  metrics: {supervisor.metrics.url}", soft_wrap=True)
            if services.anchors is not None:
                console().print(f"  {services.anchors.describe()}", soft_wrap=True)
            if supervisor.archiving is not None:
                console().print(f"  {supervisor.archiving.describe()}", soft_wrap=True)
            with _stop_on_signals(supervisor.stopping.set):
                supervisor.run()
            if runs_steps or kafka:
                what = "messages" if kafka else "ticks"
                console().print(f"stopped cleanly after {supervisor.handled} {what}")


def _has_workflows(settings: Settings) -> bool:
    return settings.definitions is not None or bool(settings.workflows)


def _setup(engine: Engine, settings: Settings, runs_steps: bool) -> list[str]:
    """What the process runs with, so a wrong store or a missing definition shows at once."""
    partitions = engine.config.store.partitions
    lines = [
        f"store: {redact(engine.config.store_url)} ({partitions} partition(s)); "
        f"transport: {engine.config.transport}"
    ]
    if runs_steps:
        known = engine.registry.known()
        names = ", ".join(f"{kind}@{version}" for kind, version in known) or "none"
        sources = [str(settings.definitions)] if settings.definitions is not None else []
        sources += [f"module {name}" for name in settings.workflows]
        lines.append(f"definitions: {names} (from {', '.join(sources)})")
        lines.append(f"executor: {settings.executor or 'the step functions'}")
    return lines


def _banner(name: str, engine: Engine, services: Services, kafka: bool) -> str:
    where = redact(engine.config.store_url)
    if not kafka:
        if not services.workers:
            return "projections: following the log (Ctrl-C to stop)"
        return f"jobledger {name}: {services.workers} worker(s) on {where} (Ctrl-C to stop)"
    parts = [
        f"{services.workers} Kafka worker(s)" if services.workers else "",
        "views" if services.views else "",
        "outbox" if services.outbox else "",
        "reconciler" if services.reconciler else "",
    ]
    return (
        f"jobledger {name}: {', '.join(p for p in parts if p)} on {where} and Kafka at "
        f"{engine.config.kafka.bootstrap_servers} (Ctrl-C to stop)"
    )


def _in_processes(
    processes: int,
    command: str,
    options: dict[str, object],
    *,
    one_process_only: dict[str, object],
) -> NoReturn:
    """Run ``processes`` copies of ``command`` with the options given (unset ones left to
    each child's settings, as here), until Ctrl-C or SIGTERM; exit with the group's status."""
    for flag, value in one_process_only.items():
        if value is not None:
            raise typer.BadParameter(
                "one port cannot serve several processes: run it without --processes "
                "(or serve the API and metrics from a process of their own)",
                param_hint=flag,
            )
    args = [command]
    for flag, value in options.items():
        if value is not None:
            args += [flag, str(value)]
    console().print(f"jobledger {command}: {processes} processes on one store")
    raise typer.Exit(ProcessGroup(args, processes).run())


def _is_kafka(transport: str | None, store: str | None, config: Any) -> bool:
    """The --transport flag wins over the setting."""
    if transport is None:
        return load_settings(config, store).engine.transport == "kafka"
    return _check_transport(transport) == "kafka"


def _transport_name(kafka: bool) -> Transport:
    return "kafka" if kafka else "local"


def _check_transport(transport: str) -> str:
    if transport not in TRANSPORTS:
        raise typer.BadParameter(
            f"unknown transport {transport!r}; available: {', '.join(TRANSPORTS)}",
            param_hint="--transport",
        )
    return transport


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
        console=console(),
        disable=not visible,
        transient=True,
    ) as progress:
        yield progress


def _views(engine: Engine) -> JobViews:
    return JobViews(engine.deps.store)


def _statuses(raw: str | None) -> list[str]:
    try:
        return parse_statuses(raw)
    except UnknownStatusError as error:
        raise typer.BadParameter(str(error), param_hint="--status") from None


def _row_document(row: StatusRow, blocked: BlockedNote | None) -> dict[str, Any]:
    document: dict[str, Any] = jsonable(
        {**vars(row), "cost_usd": row.cost_usd, "due_at": row.due_at, "blocked": blocked}
    )
    document.pop("cost_micros", None)
    document["cursor"] = cursor(row)
    return document


def _due(row: StatusRow) -> str:
    return when(row.due_at) if row.status not in TERMINAL else ""


def _plain_cells(row: StatusRow, note: BlockedNote | None) -> list[str]:
    """One job a line for scripts: tenant, job, status, workflow, version, step, next
    step, due, cost, updated, cursor (tabs and newlines in values become spaces)."""
    cells = [
        row.tenant_id,
        row.job_id,
        row.status if note is None else f"{row.status} (blocked)",
        row.workflow_type,
        str(row.workflow_version),
        str(row.current_step),
        row.next_step or "",
        row.due_at.isoformat() if row.due_at and row.status not in TERMINAL else "",
        str(row.cost_usd),
        row.updated_at.isoformat(),
        cursor(row),
    ]
    return [" ".join(cell.split()) if cell else cell for cell in cells]


def _jobs_table(rows: list[StatusRow], blocked: dict[str, BlockedNote], *, wide: bool) -> Table:
    """Ids are never cut: they wrap (fold) when the terminal is narrow, and the less
    important columns only appear with --wide."""
    table = Table()
    table.add_column("tenant", overflow="fold")
    table.add_column("job", overflow="fold")
    if wide:
        table.add_column("workflow", overflow="fold")
        table.add_column("step", justify="right")
    table.add_column("status", overflow="fold")
    table.add_column("next", overflow="fold")
    table.add_column("due (UTC)", overflow="fold")
    table.add_column("cost", justify="right", no_wrap=True)
    if wide:
        table.add_column("updated (UTC)", overflow="fold")
    for row in rows:
        note = blocked.get(row.job_uuid)
        state = row.status if note is None else f"{row.status}, blocked: {blocked_text(note)}"
        cells = [row.tenant_id, row.job_id]
        if wide:
            cells += [f"{row.workflow_type} v{row.workflow_version}", str(row.current_step)]
        cells += [state, row.next_step or "", _due(row).removesuffix(" UTC")]
        cells.append(money(row.cost_usd))
        if wide:
            cells.append(when(row.updated_at).removesuffix(" UTC"))
        table.add_row(*cells)
    if not rows:
        table.caption = "no jobs match"
    return table
