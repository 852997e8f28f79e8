"""Submitting, reading and ticking jobs: submit, show, history, tick."""

from __future__ import annotations

import sys
from datetime import datetime
from typing import Annotated, Any

import typer

from jobledger.cli.params import (
    LARGEST,
    BudgetOption,
    InputOption,
    JobId,
    Tenant,
    VersionOption,
    parse_moment,
)
from jobledger.cli.session import Exit, OneShot, Outside, one_shot
from jobledger.domain.identity import job_uuid
from jobledger.domain.views import FamilyView, HistoryEntry, JobView
from jobledger.engine.engine import Engine
from jobledger.orchestration.ports import BlockedNote
from jobledger.presentation.figures import when
from jobledger.presentation.history import history_document, history_table
from jobledger.presentation.job_view import job_document, job_table
from jobledger.presentation.json_output import print_json
from jobledger.presentation.terminal import console


@one_shot
def submit(
    cmd: OneShot,
    tenant: Tenant,
    job: JobId,
    workflow: Annotated[str, typer.Argument(metavar="WORKFLOW", help="Workflow type.")],
    version: VersionOption = None,
    input: InputOption = None,
    budget: BudgetOption = None,
    idempotency_key: Annotated[
        str | None,
        typer.Option("--idempotency-key", metavar="K", help="Same key, same job: no duplicate."),
    ] = None,
    mission: Annotated[
        str | None, typer.Option("--mission", metavar="ID", help="The mission it serves.")
    ] = None,
    employee: Annotated[
        str | None, typer.Option("--employee", metavar="ID", help="Who (or which agent) it is for.")
    ] = None,
    correlation: Annotated[
        str | None,
        typer.Option("--correlation", metavar="ID", help="Ties it to a request elsewhere."),
    ] = None,
    priority: Annotated[
        int | None,
        typer.Option(
            "--priority",
            min=0,
            max=9,
            help="0-9, the higher started first among the tenant's queued jobs (default 5).",
        ),
    ] = None,
    subject: Annotated[
        str | None,
        typer.Option(
            "--subject",
            metavar="S",
            help="Whose personal data the job holds (the workflow's personal_data): "
            "sealed with that data subject's key, erased by `jobledger erase --subject`; "
            "without it, with a key of the job's own (`jobledger erase --job`).",
        ),
    ] = None,
) -> None:
    """Submit a job; a worker (or `jobledger tick`) runs it.

    Submitting the same job again, or with a used idempotency key, returns the existing
    job unchanged (a different request for the same job is refused).
    """
    with cmd.engine(purpose="submit", definitions=True, mode="create") as engine:
        view = engine.submit(
            tenant,
            job,
            workflow,
            workflow_version=version,
            input=input,
            budget=budget,
            idempotency_key=idempotency_key,
            mission_id=mission,
            employee_id=employee,
            correlation_id=correlation,
            data_subject=subject,
            priority=priority,
        )
        family = engine.family(tenant, view.job_id)
        queued = engine.queued_because(tenant, view.job_id)
        _print_job(
            engine.history(tenant, view.job_id), view, cmd.json, family=family, queued=queued
        )


@one_shot
def show(
    cmd: OneShot,
    tenant: Tenant,
    job: JobId,
    at_version: Annotated[
        int | None,
        typer.Option(
            "--at-version",
            metavar="N",
            max=LARGEST,
            help="The job as it was after event N.",
        ),
    ] = None,
    at: Annotated[
        datetime | None,
        typer.Option(
            "--at",
            metavar="TIME",
            parser=parse_moment,
            help="The job as it was at an ISO 8601 time (UTC unless it says otherwise).",
        ),
    ] = None,
) -> None:
    """Show a job: status, step, next step, state, counters, lease, waits, approval.

    With --at-version N or --at TIME: the job exactly as it was then.
    """
    if at_version is not None and at is not None:
        raise typer.BadParameter("give --at-version or --at, not both")
    with cmd.engine(purpose="show", mode="read") as engine:
        if at_version is None and at is None:
            view = engine.job(tenant, job)
        else:
            view = engine.job_at(tenant, job, version=at_version, at=at)
        entries = [e for e in engine.history(tenant, job) if e.version <= view.version]
        if not cmd.json and (at_version is not None or at is not None):
            moment = when(view.updated_at)
            console().print(f"as it was at version {view.version} ({moment})")
        now = at_version is None and at is None
        blocked = _blocked(engine, view) if now else None
        # The children as they are now: a view of the past leaves them out.
        family = engine.family(tenant, job) if now else None
        queued = engine.queued_because(tenant, job) if now and view.status == "queued" else None
        _print_job(entries, view, cmd.json, blocked, family, queued=queued)


@one_shot
def history(
    cmd: OneShot,
    tenant: Tenant,
    job: JobId,
) -> None:
    """Every event of a job in order, as an audit reads it, and whether its chain holds.

    Each row says who or what caused the event: the worker, the decider, the resume
    token's nonce, the signal id, the cost ceiling or a timeout. Exits 1 if the hash
    chain is broken.
    """
    with cmd.engine(purpose="history", mode="read") as engine:
        entries = engine.history(tenant, job)
        broken = engine.verify(tenant, job)
    if cmd.json:
        chain = {"intact": broken is None, "broken_at": broken}
        print_json({"events": history_document(entries), "chain": chain})
    else:
        out = console()
        out.print(history_table(entries, title=f"history of {tenant}/{job}"))
        out.print("hash chain: intact" if broken is None else "hash chain: BROKEN")
    if broken is not None:
        sys.stderr.write(
            f"error: the hash chain is broken at v{broken.version} "
            f"({broken.event_type}): {broken.reason}\n"
        )
        raise typer.Exit(Exit.REFUSED)


@one_shot
def tick(
    cmd: OneShot,
    tenant: Tenant,
    job: JobId,
) -> None:
    """Advance one job by one tick, as a worker would (for operators).

    Prints the tick's outcome and any resume token or approval request it handed out.
    Needs the definitions and an executor (--config or JOBLEDGER_DEFINITIONS and
    JOBLEDGER_EXECUTOR).
    """
    outside = Outside()
    with cmd.engine(purpose="tick", definitions=True, executor=True, notifier=outside) as engine:
        report = engine.tick(tenant, job, reason="operator")
        view = engine.job(tenant, job)
        entries = engine.history(tenant, job)
    tokens = [
        {"event": event, "token": t.token, "nonce": t.nonce, "expires_at": t.expires_at}
        for event, t in outside.tokens
    ]
    document: dict[str, Any] = {
        "outcome": report.outcome,
        "steps_executed": report.steps_executed,
        "resume_tokens": tokens,
        "approval_requests": outside.approvals,
        "job": job_document(view, entries),
    }
    if cmd.json:
        print_json(document)
        return
    out = console()
    out.print(f"tick: {report.outcome}, {report.steps_executed} step(s) executed")
    for token in tokens:
        out.print(f"resume token for event {token['event']!r}: {token['token']}", soft_wrap=True)
    for request in outside.approvals:
        out.print(f"approval requested: {request.approval_id}")
    out.print(job_table(view, entries))


def _print_job(
    entries: list[HistoryEntry],
    view: JobView,
    as_json: bool,
    blocked: BlockedNote | None = None,
    family: FamilyView | None = None,
    *,
    queued: str | None = None,
) -> None:
    if as_json:
        print_json(job_document(view, entries, blocked, family, queued=queued))
    else:
        console().print(job_table(view, entries, blocked, family, queued=queued))


def _blocked(engine: Engine, view: JobView) -> BlockedNote | None:
    """Why a worker left the job untouched, if that still applies (see projections.blocked)."""
    from jobledger.projections import JobViews

    uuid = str(job_uuid(view.tenant_id, view.job_id))
    return JobViews(engine.deps.store).blocked_note(uuid, view.version)
