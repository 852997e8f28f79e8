"""Replay and audit: replay, migrate, verify, anchor, export, import.

Each command that finds something wrong (a replay that diverges, a broken chain, an
export with broken chains) still prints its full report, then exits 1 with
``error: <what>`` on stderr.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn
from rich.table import Table

from jobledger.adapters.kafka.settings import KafkaSettings
from jobledger.adapters.signing import Keyring
from jobledger.audit import export as exporting
from jobledger.audit.anchors import DEFAULT_ANCHOR_FILE, AnchorLog, AnchorSink, parse_anchors
from jobledger.audit.archived import with_tombstones
from jobledger.audit.destinations import Destination, open_sink, read_log
from jobledger.audit.kafka_archive import archive_reader
from jobledger.audit.tamper import (
    JobCheck,
    Signatures,
    VerifyReport,
    take_anchor,
    verify_one,
    verify_store,
)
from jobledger.audit.timestamping import TimeStampAuthority, TsaTrust
from jobledger.cli.config_file import load_settings
from jobledger.cli.params import LARGEST, JobId, Tenant
from jobledger.cli.session import (
    Exit,
    OneShot,
    WorkflowsOption,
    one_shot,
    one_shot_with,
    with_workflows,
)
from jobledger.domain.errors import ConfigError
from jobledger.domain.identity import job_uuid
from jobledger.domain.status import JobStatus
from jobledger.engine.engine import Engine
from jobledger.presentation.job_view import job_document
from jobledger.presentation.json_output import jsonable, print_json
from jobledger.presentation.terminal import console

if TYPE_CHECKING:
    # Loaded when a command needs them: definitions cost start-up time.
    from jobledger.audit.replay import ReplayReport, StepReplay
    from jobledger.cli.code_modules import CodeModules
    from jobledger.workflows import WorkflowDefinition

OptionalTenant = Annotated[
    str | None, typer.Argument(metavar="[TENANT]", help="Tenant id.", show_default=False)
]
OptionalJob = Annotated[
    str | None, typer.Argument(metavar="[JOB]", help="Job id.", show_default=False)
]
AllFlag = Annotated[bool, typer.Option("--all", help="Every job in the store.")]
OneTenant = Annotated[
    str | None, typer.Option("--tenant", metavar="T", help="Every job of one tenant.")
]


# ---- replay and migrate -----------------------------------------------------------------------


@one_shot
def replay(
    cmd: OneShot,
    definition: Annotated[
        Path | None,
        typer.Option(
            "--definition",
            metavar="FILE",
            help="The definition (YAML or JSON file) to replay against.",
            exists=True,
            dir_okay=False,
            show_default=False,
        ),
    ] = None,
    workflows: WorkflowsOption = None,
    tenant: OptionalTenant = None,
    job: OptionalJob = None,
    all_jobs: AllFlag = False,
    status: Annotated[
        str | None,
        typer.Option(
            "--status",
            help="With --all: only jobs in these statuses, e.g. waiting_event (code "
            "workflows: default every status but the finished ones).",
        ),
    ] = None,
    only_tenant: Annotated[
        str | None, typer.Option("--tenant", help="With --all: only this tenant.")
    ] = None,
) -> None:
    """Replay recorded decisions against a definition or code, without any side effect.

    For each recorded step the pure resolution of the given definition runs on the job
    as it was then; each step is `same`, `different step`, `different status`,
    `different next step` or `different wait`, and each job is `safe to migrate` or
    `diverges at step k: recorded X, would now do Y`. Exits 1 if any job diverges.

    With --workflows MODULE (or the configured workflows, when no --definition is
    given): the code workflows' bodies replay against the stored histories before a
    deploy, each job against the code of the version it is pinned to (a step's arguments
    may change, what it is and what a wait waits for may not); with --all, every job of
    their types not finished yet is checked, and each that would diverge is listed.
    """
    statuses = _statuses(status)
    _one_or_all(tenant, job, all_jobs)
    if (statuses or only_tenant) and not all_jobs:
        raise typer.BadParameter("--status and --tenant go with --all")
    if definition is not None and workflows:
        raise typer.BadParameter("give --definition or --workflows, not both")
    if definition is None:
        code = _code(cmd, workflows)
        if all_jobs:
            _replay_code_all(cmd, code, statuses, only_tenant)
        else:
            assert tenant is not None and job is not None
            _replay_code_one(cmd, code, tenant, job)
        return
    target = _definition(definition)
    with cmd.engine(purpose="replay", mode="read") as engine:
        if not all_jobs:
            assert tenant is not None and job is not None
            report = engine.replay(tenant, job, target)
            reports = [report]
        else:
            reports = _replay_all(engine, target, statuses, only_tenant, show=not cmd.json)
    diverged = [report for report in reports if not report.safe]
    if cmd.json:
        documents = [_replay_document(report) for report in reports]
        if all_jobs:
            print_json(
                {
                    "definition": {"type": target.type, "version": target.version},
                    **_counts(reports, documents),
                }
            )
        else:
            print_json(documents[0])
    elif all_jobs:
        console().print(_replay_summary(reports, target.label))
    else:
        _print_replay(reports[0])
    if diverged:
        if all_jobs:
            message = f"{len(diverged)} of {len(reports)} jobs diverge from {target.label}"
        else:
            message = f"{_label(reports[0])} {reports[0].verdict}"
        _fail(message)


def _code(cmd: OneShot, modules: list[str] | None) -> CodeModules:
    """The code workflows of ``--workflows``, else of the configured modules."""
    from jobledger.cli.code_modules import load_code

    settings = with_workflows(load_settings(cmd.config, cmd.store), modules or ())
    if not settings.workflows:
        raise typer.BadParameter(
            "give --definition FILE or --workflows MODULE (or set workflows in the config)"
        )
    code = load_code(settings.workflows, settings.config_file)
    if not code.workflows:
        raise ConfigError(f"the workflows modules ({code.label}) define no @workflow")
    return code


def _replay_code_one(cmd: OneShot, code: CodeModules, tenant: str, job: str) -> None:
    with cmd.engine(purpose="replay", mode="read") as engine:
        view = engine.job(tenant, job)
        found = {w.key: w for w in code.workflows}.get((view.workflow_type, view.workflow_version))
        if found is None:
            raise ConfigError(
                f"{tenant}/{job} runs {view.workflow_type!r} v{view.workflow_version}, which "
                f"the workflows modules ({code.label}) do not define"
            )
        report = engine.replay(tenant, job, found)
    if cmd.json:
        print_json(_replay_document(report))
    else:
        _print_replay(report)
    if not report.safe:
        _fail(f"{_label(report)} {report.verdict}")


def _replay_code_all(
    cmd: OneShot, code: CodeModules, statuses: list[str], tenant: str | None
) -> None:
    """Each job pinned to a version the code defines, against that version's body; a
    job pinned to a version it drops is warned about (it would be blocked, not diverge)."""
    live = statuses or [s.value for s in JobStatus if not s.is_terminal]
    reports: list[ReplayReport] = []
    with cmd.engine(purpose="replay", mode="read") as engine:
        for workflow in code.workflows:
            reports += engine.replay_all(workflow, statuses=live, tenant_id=tenant, pinned=True)
        warnings = _dropped(engine, code)
    reports.sort(key=lambda report: (report.tenant_id, report.job_id))
    diverged = [report for report in reports if not report.safe]
    labels = ", ".join(f"{w.type} v{w.version}" for w in code.workflows)
    if cmd.json:
        documents = [_replay_document(report) for report in reports]
        workflows = [{"type": w.type, "version": w.version} for w in code.workflows]
        print_json({"workflows": workflows, **_counts(reports, documents), "warnings": warnings})
    else:
        console().print(_replay_summary(reports, f"the code of {labels}", code=True))
    for warning in warnings:
        sys.stderr.write(f"warning: {warning}\n")
    if diverged:
        _fail(f"{len(diverged)} of {len(reports)} jobs diverge from the code of {labels}")


def _dropped(engine: Engine, code: CodeModules) -> list[str]:
    from jobledger.projections import JobViews

    views = JobViews(engine.deps.store)
    views.catch_up()
    types = {w.type for w in code.workflows}
    defined = {w.key for w in code.workflows}
    return [
        f"{count} live job(s) pinned to {kind!r} v{version}, which the workflows modules "
        f"({code.label}) do not define: workers with this code would leave them blocked"
        for (kind, version), count in sorted(views.live_pins().items())
        if kind in types and (kind, version) not in defined
    ]


def _counts(reports: Sequence[ReplayReport], documents: list[dict[str, Any]]) -> dict[str, Any]:
    diverged = sum(1 for report in reports if not report.safe)
    return {
        "jobs": documents,
        "safe": len(reports) - diverged,
        "migratable": sum(1 for report in reports if report.migratable),
        "finished": sum(1 for report in reports if report.finished),
        "diverged": diverged,
    }


@one_shot
def migrate(
    cmd: OneShot,
    tenant: Tenant,
    job: JobId,
    to_version: Annotated[
        int,
        typer.Option(
            "--to-version", metavar="V", min=1, max=LARGEST, help="The definition version."
        ),
    ],
    force: Annotated[
        bool, typer.Option("--force", help="Move even if replay diverges (needs --by, --reason).")
    ] = False,
    by: Annotated[str | None, typer.Option("--by", metavar="USER", help="Who moves it.")] = None,
    reason: Annotated[
        str | None, typer.Option("--reason", metavar="TEXT", help="Why (recorded).")
    ] = None,
    workflows: WorkflowsOption = None,
) -> None:
    """Move a job that has not finished to another version of its definition or code.

    Only when replaying the job against that version says it is safe; otherwise exits 1
    with the divergence, unless --force (with --by and --reason, which are recorded in
    the `Migrated` event with the replay verdict). Needs the definitions or the
    workflows modules (a code workflow's new version must replay the job's history).
    """
    if force and not (by and reason):
        raise typer.BadParameter("--force needs --by USER and --reason TEXT")
    with cmd.engine(purpose="migrate", definitions=True, workflows=workflows) as engine:
        view, report = engine.migrate(tenant, job, to_version, by=by, reason=reason, force=force)
        entries = engine.history(tenant, job)
    if cmd.json:
        print_json(
            {
                "job": job_document(view, entries),
                "replay": _replay_document(report),
                "forced": not report.safe,
            }
        )
        return
    how = "replay: safe to migrate" if report.safe else f"forced by {by} ({reason}); replay"
    text = f"migrated {tenant}/{job} to v{to_version}: {how}"
    if not report.safe:
        text += f" {report.verdict}"
    console().print(text)


def _replay_all(
    engine: Engine,
    target: WorkflowDefinition,
    statuses: list[str],
    tenant: str | None,
    *,
    show: bool,
) -> list[ReplayReport]:
    with _progress(show) as progress:
        task = progress.add_task("replaying", total=None)

        def advance(done: int, total: int) -> None:
            progress.update(task, completed=done, total=total)

        return engine.replay_all(target, statuses=statuses, tenant_id=tenant, progress=advance)


def _definition(path: Path) -> WorkflowDefinition:
    from jobledger.workflows import load_definitions

    definitions = load_definitions(path)
    if len(definitions) != 1:
        raise typer.BadParameter(f"{path} holds {len(definitions)} definitions; give one")
    return definitions[0]


def _replay_document(report: ReplayReport) -> dict[str, Any]:
    return {
        "tenant": report.tenant_id,
        "job": report.job_id,
        "job_uuid": report.job_uuid,
        "workflow_type": report.workflow_type,
        "recorded_version": report.recorded_version,
        "definition_version": report.definition_version,
        "status": report.status,
        "events": report.events,
        "safe": report.safe,
        "finished": report.finished,
        "migratable": report.migratable,
        "verdict": report.verdict,
        "diverged_at_step": report.diverged_at.step_number if report.diverged_at else None,
        "steps": [_step_document(step) for step in report.steps],
        "unreadable": list(report.unreadable),
    }


def _step_document(step: StepReplay) -> dict[str, Any]:
    document: dict[str, Any] = jsonable(step)
    document["outcome"] = step.outcome
    document["recorded"]["description"] = step.recorded.describe()
    document["replayed"]["description"] = step.replayed.describe()
    return document


def _print_replay(report: ReplayReport) -> None:
    out = console()
    table = Table(
        title=f"replay of {_label(report)} ({report.workflow_type} v{report.recorded_version}, "
        f"{report.status}) against v{report.definition_version}"
    )
    table.add_column("step", justify="right")
    table.add_column("v", justify="right")
    table.add_column("outcome", no_wrap=True)
    table.add_column("recorded", overflow="fold")
    table.add_column("would now do", overflow="fold")
    for step in report.steps:
        table.add_row(
            str(step.step_number),
            str(step.event_version),
            step.outcome,
            step.recorded.describe(),
            "" if step.same else step.replayed.describe(),
        )
    if not report.steps:
        table.caption = "no step recorded yet"
    out.print(table)
    if report.unreadable:
        out.print(f"could not read (erased): {', '.join(report.unreadable)}")
    out.print(f"verdict: {report.verdict}")


def _replay_summary(reports: Sequence[ReplayReport], target: str, *, code: bool = False) -> Table:
    """``code``: a deploy check of new code, whose jobs stay on their version (nothing
    to migrate): how many replay the same."""
    migratable = sum(1 for report in reports if report.migratable)
    finished = sum(1 for report in reports if report.finished)
    if code:
        same = sum(1 for report in reports if report.safe)
        title = f"replay of {target}: {same} of {len(reports)} jobs replay the same"
    else:
        title = f"replay against {target}: {migratable} of {len(reports)} jobs safe to migrate"
    suffix = f" ({finished} finished: nothing to migrate)" if finished and not code else ""
    table = Table(title=title + suffix)
    for column in ("tenant", "job", "status", "version", "steps", "verdict"):
        table.add_column(column, overflow="fold")
    for report in reports:
        table.add_row(
            report.tenant_id,
            report.job_id,
            report.status,
            f"v{report.recorded_version}",
            str(len(report.steps)),
            report.verdict,
        )
    if not reports:
        table.caption = "no job of this workflow matches"
    return table


# ---- verify and anchor ------------------------------------------------------------------------


AnchorsOption = Annotated[
    str | None,
    typer.Option(
        "--anchors",
        metavar="DEST",
        help="Where anchors were written by `jobledger anchor`: file:PATH (or a path) or "
        "kafka://HOST:PORT[/TOPIC]. Also catches a history truncated or rolled back since.",
        show_default=False,
    ),
]
TsaOption = Annotated[
    str | None,
    typer.Option(
        "--tsa",
        metavar="URL",
        help="Stamp each anchor line at this RFC 3161 time-stamping authority (its token "
        "goes into the line). Needs the `audit` extra.",
        show_default=False,
    ),
]
TsaCaOption = Annotated[
    Path | None,
    typer.Option(
        "--tsa-ca",
        metavar="FILE",
        help="The TSA's CA certificate(s) (PEM): RFC 3161 tokens must be signed by a "
        "time-stamping certificate chaining to it.",
        exists=True,
        dir_okay=False,
        show_default=False,
    ),
]


@one_shot
def verify(
    cmd: OneShot,
    tenant: OptionalTenant = None,
    job: OptionalJob = None,
    only_tenant: OneTenant = None,
    all_jobs: AllFlag = False,
    anchors: AnchorsOption = None,
    tsa_ca: TsaCaOption = None,
    keyring: Annotated[
        Path | None,
        typer.Option(
            "--keyring",
            metavar="FILE",
            help="The keyring of published public keys (default: the configured one): "
            "every event must be signed by a key it holds, valid at the event's time.",
            exists=True,
            dir_okay=False,
        ),
    ] = None,
    unsigned_before: Annotated[
        str | None,
        typer.Option(
            "--unsigned-before",
            metavar="TIME",
            help="With a keyring: accept unsigned events older than TIME (ISO 8601 with "
            "a zone), written before signing was turned on.",
        ),
    ] = None,
) -> None:
    """Recompute hash chains from the stored events; name each job's first broken link.

    Every job unless given TENANT JOB (one job) or --tenant T (one tenant's).

    Reports the version, event, kind and why: an edited field, a deleted event, a
    reordered history; with --anchors also a truncated or rewritten one, and every
    anchor's RFC 3161 token (its imprint; with --tsa-ca its signature); with a keyring
    an event unsigned or not signed by a key valid at its time (a history re-hashed by
    someone without a key). Exits 1 if any chain (or the anchors) is broken.
    """
    if (tenant is None) != (job is None) or (tenant is not None and (all_jobs or only_tenant)):
        raise typer.BadParameter("give TENANT JOB, or --tenant T, or --all (the default)")
    if all_jobs and only_tenant is not None:
        raise typer.BadParameter("give --tenant T or --all, not both")
    if tsa_ca is not None and anchors is None:
        raise typer.BadParameter("--tsa-ca goes with --anchors")
    cutoff = _moment(unsigned_before, "--unsigned-before")
    anchor_log = (
        _read_anchors(anchors, tsa_ca, cmd.store, cmd.config) if anchors is not None else None
    )
    with cmd.engine(purpose="verify", mode="read") as engine:
        keyring = keyring if keyring is not None else engine.deps.config.signing.keyring
        if cutoff is not None and keyring is None:
            raise typer.BadParameter("--unsigned-before needs a keyring (--keyring FILE)")
        signatures = Signatures(Keyring.from_file(keyring), cutoff) if keyring is not None else None
        if tenant is None:
            with _progress(not cmd.json) as progress:
                task = progress.add_task("verifying", total=None)
                report = verify_store(
                    engine.deps.store,
                    anchor_log,
                    lambda done, total: progress.update(task, completed=done, total=total),
                    tenant_id=only_tenant,
                    signatures=signatures,
                )
        else:
            assert tenant is not None and job is not None
            report = verify_one(engine.deps.store, job_uuid(tenant, job), anchor_log, signatures)
        # Archived jobs: checked against their archives (audit.archived).
        report = with_tombstones(
            engine.deps.store,
            report,
            anchor_log,
            archive_reader(KafkaSettings.of(engine.config)),
            signatures,
        )
        if tenant is not None and job is not None:
            first = report.jobs[0]
            if first.events == 0 and first.anchored_version is None and first.archived is None:
                engine.job(tenant, job)  # raises: no such job
    if cmd.json:
        print_json(_verify_document(report, anchor_log, keyring, cutoff))
    else:
        _print_verify(report, anchor_log, keyring)
    if not report.intact:
        broken = report.broken
        if broken and broken[0].broken is not None:
            first = broken[0]
            assert first.broken is not None
            message = (
                f"{len(broken)} of {len(report.jobs)} job(s) broken; first: {first.label} at "
                f"v{first.broken.version} ({first.broken.event_type}): {first.broken.reason}"
            )
        else:
            message = f"the anchors are not intact: {report.anchor_problems[0]}"
        _fail(message)


@one_shot
def anchor(
    cmd: OneShot,
    to: Annotated[
        str,
        typer.Option(
            "--to",
            "--file",
            metavar="DEST",
            help="Where to append: file:PATH (or a path) or kafka://HOST:PORT[/TOPIC] "
            "(topic jobledger.anchors by default; created with one partition if missing).",
        ),
    ] = DEFAULT_ANCHOR_FILE,
    tsa: TsaOption = None,
    tsa_ca: TsaCaOption = None,
    dump: Annotated[
        tuple[str, Path] | None,
        typer.Option(
            "--dump",
            metavar="DEST FILE",
            help="Anchor nothing: copy every anchor line of DEST (e.g. a Kafka topic) to "
            "FILE, in order, for an auditor.",
            show_default=False,
        ),
    ] = None,
) -> None:
    """Pin every job's chain head outside the store (one JSON line with a Merkle root).

    Verifies every chain (and the destination's earlier anchors) first and refuses, exit
    1, if any is broken; a destination or TSA that does not take the line exits non-zero
    with nothing anchored. `verify --anchors DEST` then catches a history rolled back since.
    """
    engine_config = load_settings(cmd.config, cmd.store).engine
    if dump is not None:
        _dump(Destination.parse(dump[0]).sink(engine_config), dump[1], cmd.json)
        return
    destination = Destination.parse(to)
    trust = TsaTrust.load(tsa_ca) if tsa_ca is not None else None
    authority = TimeStampAuthority(tsa, trust) if tsa is not None else None
    sink = open_sink(destination, engine_config, authority)
    previous = read_log(sink, trust)
    with (
        cmd.engine(purpose="anchor", mode="read") as engine,
        _progress(not cmd.json) as progress,
    ):
        task = progress.add_task("verifying", total=None)
        anchored, _ = take_anchor(
            engine.deps.store,
            sink,
            engine.clock.now(),
            previous,
            lambda done, total: progress.update(task, completed=done, total=total),
        )
    line = len(previous.anchors) + len(previous.problems) + 1
    document: dict[str, Any] = {
        "to": str(destination),
        "line": line,
        "anchored_at": anchored.anchored_at,
        "jobs": len(anchored.heads),
        "merkle_root": anchored.merkle_root,
        "rfc3161": {"tsa": tsa} if tsa is not None else None,
    }
    if cmd.json:
        print_json(document)
        return
    stamped = f", stamped by {tsa}" if tsa is not None else ""
    console().print(
        f"anchored {len(anchored.heads)} job heads to {destination} (line {line}), "
        f"merkle root {anchored.merkle_root}{stamped}"
    )


def _moment(text: str | None, option: str) -> datetime | None:
    if text is None:
        return None
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        raise typer.BadParameter(f"{option}: {text!r} is not an ISO 8601 time") from None
    if moment.tzinfo is None:
        raise typer.BadParameter(f"{option}: {text!r} has no zone (e.g. end it in Z)")
    return moment


def _read_anchors(
    anchors: str, tsa_ca: Path | None, store: str | None, config: Path | None
) -> AnchorLog:
    destination = Destination.parse(anchors)
    if destination.kind == "file" and not destination.path.is_file():
        missing = f"no anchor file {str(destination.path)!r}"
        raise typer.BadParameter(missing, param_hint="--anchors")
    trust = TsaTrust.load(tsa_ca) if tsa_ca is not None else None
    return read_log(destination.sink(load_settings(config, store).engine), trust)


def _dump(source: AnchorSink, file: Path, json: bool) -> None:
    """Every line verbatim (an edited one too: the auditor's verifier is to find it),
    written whole or not at all."""
    lines = source.lines()
    partial = file.with_name(f".{file.name}.partial")
    partial.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    partial.replace(file)
    log = parse_anchors(lines, str(file))
    if json:
        print_json({"from": source.name, "file": str(file), "lines": len(lines)})
        return
    console().print(f"wrote {len(lines)} anchor line(s) from {source.name} to {file}")
    for problem in log.problems:
        console().print(f"  note: {problem}", soft_wrap=True)


def _verify_document(
    report: VerifyReport,
    anchor_log: AnchorLog | None,
    keyring: Path | None,
    unsigned_before: datetime | None,
) -> dict[str, Any]:
    document: dict[str, Any] = {
        "intact": report.intact,
        "jobs": len(report.jobs),
        "events": report.events,
        "broken": [_check_document(check) for check in report.broken],
        "signatures": {
            "checked": report.signatures_checked,
            "keyring": str(keyring) if keyring is not None else None,
            "unsigned_before": unsigned_before.isoformat() if unsigned_before else None,
        },
    }
    if anchor_log is not None:
        document["anchors"] = {
            "source": anchor_log.source,
            "anchors": report.anchors_read,
            "problems": list(report.anchor_problems),
            "rfc3161": [jsonable(vars(stamp)) for stamp in anchor_log.stamps],
        }
    if len(report.jobs) == 1:
        document["job"] = _check_document(report.jobs[0])
    return document


def _check_document(check: JobCheck) -> dict[str, Any]:
    broken = check.broken
    return {
        "tenant": check.tenant_id,
        "job": check.job_id,
        "job_uuid": str(check.job_uuid),
        "events": check.events,
        "head": jsonable(check.head.document()) if check.head else None,
        "anchored_version": check.anchored_version,
        "intact": broken is None,
        "version": broken.version if broken else None,
        "event_type": broken.event_type if broken else None,
        "kind": broken.kind if broken else None,
        "reason": broken.reason if broken else None,
        "archived": check.archived,
    }


def _print_verify(report: VerifyReport, anchor_log: AnchorLog | None, keyring: Path | None) -> None:
    out = console()
    anchored = ""
    if anchor_log is not None:
        anchored = f" against {report.anchors_read} anchor(s) in {anchor_log.source}"
        _print_stamps(anchor_log)
    signed = (
        f"; signatures checked against {keyring}"
        if keyring is not None
        else "; signatures not checked (no keyring)"
    )
    if report.broken:
        table = Table(title="broken chains")
        for column in ("job", "version", "event", "kind", "reason"):
            table.add_column(column, overflow="fold")
        for check in report.broken:
            assert check.broken is not None
            table.add_row(
                check.label,
                f"v{check.broken.version}",
                check.broken.event_type,
                check.broken.kind,
                check.broken.reason,
            )
        out.print(table)
    for check in report.jobs:
        if check.archived is not None:
            out.print(f"{check.label}: {check.archived}", soft_wrap=True)
    for problem in report.anchor_problems:
        out.print(f"anchors: {problem}", soft_wrap=True)
    state = "all intact" if report.intact else f"{len(report.broken)} broken"
    out.print(
        f"verified {len(report.jobs)} job(s), {report.events} events{anchored}{signed}: {state}"
    )


def _print_stamps(anchor_log: AnchorLog) -> None:
    stamps = anchor_log.stamps
    if not stamps:
        return
    out = console()
    table = Table(title=f"RFC 3161 timestamps ({len(stamps)} of {len(anchor_log.anchors)} anchors)")
    for column in ("line", "tsa", "genTime", "signature", "problem"):
        table.add_column(column, overflow="fold")
    for stamp in stamps:
        table.add_row(
            str(stamp.line_number),
            stamp.tsa,
            stamp.gen_time.isoformat() if stamp.gen_time else "",
            "checked" if stamp.signature_checked else "NOT checked (no --tsa-ca)",
            stamp.problem or "",
        )
    out.print(table)


# ---- export and import ------------------------------------------------------------------------


@one_shot_with("store", "config", "logs")
def export(
    cmd: OneShot,
    tenant: OptionalTenant = None,
    job: OptionalJob = None,
    only_tenant: OneTenant = None,
    all_jobs: AllFlag = False,
) -> None:
    """Write job histories to stdout as canonical JSON lines, then a manifest line.

    Every job unless given TENANT JOB (one job) or --tenant T (one tenant's).

    One line per event (tenant, job, version, type, timestamp, data, chain hash); the
    manifest has the counts, each job's head hash and the export time. Exits 1 (after
    writing everything) if a stored chain does not verify: import refuses such a file.
    """
    chosen = sum([tenant is not None or job is not None, only_tenant is not None, all_jobs])
    if chosen > 1 or (tenant is None) != (job is None):
        raise typer.BadParameter("give TENANT JOB, or --tenant T, or --all (the default)")
    selection = exporting.Selection(tenant_id=tenant or only_tenant, job_id=job)
    with cmd.engine(purpose="export", mode="read") as engine:
        summary = exporting.export_jobs(
            engine.deps.store, sys.stdout, selection, engine.clock.now()
        )
    sys.stderr.write(f"exported {summary.jobs} job(s), {summary.events} events\n")
    if summary.broken:
        _fail(f"{len(summary.broken)} job(s) with a broken chain: {summary.broken[0]}")


@one_shot
def import_(
    cmd: OneShot,
    file: Annotated[
        Path,
        typer.Argument(
            metavar="FILE",
            help="A file written by `jobledger export`.",
            exists=True,
            dir_okay=False,
        ),
    ],
) -> None:
    """Load an export into an EMPTY store, chains and all.

    Appends the same events (ids, versions, times, chain hashes) and the at-most-once
    keys they consumed. Refuses, writing nothing, a file that jobledger-verify would not
    verify (without a keyring), or a store that is not empty.
    """
    with cmd.engine(purpose="import", mode="create") as engine:
        summary = exporting.import_file(engine.deps.store, file)
    if cmd.json:
        print_json(summary)
        return
    console().print(f"imported {summary.jobs} job(s), {summary.events} events, {summary.keys} keys")


# ---- plumbing ---------------------------------------------------------------------------------


def _one_or_all(tenant: str | None, job: str | None, all_jobs: bool) -> None:
    if all_jobs and (tenant is not None or job is not None):
        raise typer.BadParameter("give TENANT JOB or --all, not both")
    if not all_jobs and (tenant is None or job is None):
        raise typer.BadParameter("give TENANT JOB, or --all")


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


def _label(report: ReplayReport) -> str:
    return f"{report.tenant_id}/{report.job_id}"


def _fail(message: str) -> None:
    sys.stderr.write(f"error: {message}\n")
    raise typer.Exit(Exit.REFUSED)


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
