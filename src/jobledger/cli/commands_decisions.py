"""What people and outside systems send a job: approve, reject, resume, signal, cancel,
raise-budget, and a new resume token (token reissue)."""

from __future__ import annotations

from datetime import datetime
from decimal import Decimal, InvalidOperation
from typing import Annotated

import typer

from jobledger.cli.params import (
    LARGEST,
    DataOption,
    EditOption,
    JobId,
    JsonObject,
    PayloadOption,
    Tenant,
    parse_moment,
    read_value,
)
from jobledger.cli.session import OneShot, one_shot
from jobledger.domain.errors import StaleApprovalError
from jobledger.domain.views import JobView
from jobledger.engine.engine import Engine
from jobledger.presentation.figures import when
from jobledger.presentation.job_view import job_document
from jobledger.presentation.json_output import print_json
from jobledger.presentation.terminal import console

ApprovalOption = Annotated[
    str | None,
    typer.Option(
        "--approval", metavar="ID", help="The approval request (default: the job's open one)."
    ),
]
ByOption = Annotated[str, typer.Option("--by", metavar="USER", help="Who decides.")]
CommentOption = Annotated[str | None, typer.Option("--comment", metavar="TEXT")]

token_app = typer.Typer(help="Resume tokens: reissue.", no_args_is_help=True)


@one_shot
def approve(
    cmd: OneShot,
    tenant: Tenant,
    job: JobId,
    by: ByOption,
    approval: ApprovalOption = None,
    comment: CommentOption = None,
    edit: EditOption = None,
    data: DataOption = None,
) -> None:
    """Approve the job's open approval request (on a quorum request: vote to approve).

    --edit changes params of the step the approval leads to (it runs with them); --data
    lands in the job's state. Both are recorded with their sha256.
    """
    _decide(cmd, tenant, job, "approve", by, approval, comment, edit=edit, data=data)


@one_shot
def reject(
    cmd: OneShot,
    tenant: Tenant,
    job: JobId,
    by: ByOption,
    approval: ApprovalOption = None,
    comment: CommentOption = None,
    data: DataOption = None,
) -> None:
    """Reject the job's open approval request (on a quorum request: vote to reject)."""
    _decide(cmd, tenant, job, "reject", by, approval, comment, edit=None, data=data)


def _decide(
    cmd: OneShot,
    tenant: str,
    job: str,
    decision: str,
    by: str,
    approval: str | None,
    comment: str | None,
    *,
    edit: JsonObject | None,
    data: JsonObject | None,
) -> None:
    # An edit is checked against the step's definition: only then are definitions loaded.
    with cmd.engine(purpose=decision, definitions=edit is not None) as engine:
        approval_id = approval if approval is not None else _open_approval(engine, tenant, job)
        view = engine.decide(tenant, job, approval_id, decision, by, comment, edit=edit, data=data)
        verb = "approved" if decision == "approve" else "rejected"
        gate = view.pending_approval
        if gate is not None and gate.approval_id == approval_id:
            # A vote that left the quorum request open.
            verb = f"voted {verb} ({gate.progress})"
        _done(f"{verb} {approval_id} as {by}", engine, view, cmd.json)


@one_shot
def reassign(
    cmd: OneShot,
    tenant: Tenant,
    job: JobId,
    to: Annotated[
        list[str],
        typer.Option("--to", metavar="USER", help="A new approver (repeat for several)."),
    ],
    by: Annotated[str, typer.Option("--by", metavar="USER", help="Who reassigns.")],
    reason: Annotated[str, typer.Option("--reason", metavar="TEXT", help="Why (recorded).")],
    approval: ApprovalOption = None,
) -> None:
    """Move the job's open approval request to other approvers.

    The approvers named before may no longer decide; votes already cast stay counted.
    """
    with cmd.engine(purpose="reassign") as engine:
        approval_id = approval if approval is not None else _open_approval(engine, tenant, job)
        view = engine.reassign(tenant, job, approval_id, to, by=by, reason=reason)
        _done(f"{approval_id} reassigned to {', '.join(to)} by {by}", engine, view, cmd.json)


def _open_approval(engine: Engine, tenant: str, job: str) -> str:
    view = engine.job(tenant, job)
    if view.pending_approval_id is None:
        raise StaleApprovalError(f"job {job!r} is {view.status}, not awaiting approval")
    return view.pending_approval_id


@one_shot
def resume(
    cmd: OneShot,
    token: Annotated[
        str, typer.Option("--token", metavar="TOKEN", help="The resume token, or @file.")
    ],
    payload: PayloadOption = None,
    tenant: Annotated[
        str | None,
        typer.Option("--tenant", metavar="TENANT", help="Refuse a token of another tenant."),
    ] = None,
) -> None:
    """Resume the job a signed resume token was issued for (once)."""
    with cmd.engine(purpose="resume") as engine:
        view = engine.resume(read_value(token).strip(), payload, tenant_id=tenant)
        _done(f"resumed {view.tenant_id}/{view.job_id}", engine, view, cmd.json)


@token_app.command("reissue")
@one_shot
def reissue_token(
    cmd: OneShot,
    tenant: Tenant,
    job: JobId,
    by: Annotated[str, typer.Option("--by", metavar="USER", help="Who asks for it.")],
) -> None:
    """Issue a new resume token for a job waiting for an event, and print it.

    The old token stops working in the same write (it is refused as superseded). The
    new one lives at least until the wait's timeout or the job's deadline.
    """
    with cmd.engine(purpose="token reissue") as engine:
        token = engine.reissue_token(tenant, job, by=by)
        view = engine.job(tenant, job)
        history = engine.history(tenant, job)
    if cmd.json:
        print_json(
            {
                "token": token.token,
                "nonce": token.nonce,
                "expires_at": token.expires_at,
                "job": job_document(view, history),
            }
        )
        return
    out = console()
    out.print(
        f"new resume token for {tenant}/{job} (event {view.wait_event_name!r}, expires "
        f"{when(token.expires_at)}); the previous token is void:"
    )
    out.print(token.token, soft_wrap=True)


@one_shot
def signal(
    cmd: OneShot,
    tenant: Tenant,
    job: JobId,
    event: Annotated[str, typer.Argument(metavar="EVENT", help="The event's name.")],
    signal_id: Annotated[
        str, typer.Option("--id", metavar="SIGNAL_ID", help="Makes delivery idempotent.")
    ],
    payload: PayloadOption = None,
) -> None:
    """Deliver an outside event by name (trusted callers).

    A job waiting for EVENT resumes; otherwise the signal is kept until the wait opens.
    The same --id twice is delivered once.
    """
    with cmd.engine(purpose="signal") as engine:
        outcome = engine.signal(tenant, job, event, payload, signal_id=signal_id)
        _done(f"signal {signal_id}: {outcome}", engine, engine.job(tenant, job), cmd.json, outcome)


@one_shot
def cancel(
    cmd: OneShot,
    tenant: Tenant,
    job: JobId,
    reason: Annotated[str, typer.Option("--reason", metavar="TEXT")],
    by: Annotated[str, typer.Option("--by", metavar="USER", help="Who cancels.")],
) -> None:
    """Cancel a job (terminal; open tokens and approvals become void)."""
    with cmd.engine(purpose="cancel") as engine:
        view = engine.cancel(tenant, job, reason=reason, by=by)
        _done(f"cancelled by {by}", engine, view, cmd.json)


def _amount(value: str) -> Decimal:
    try:
        amount = Decimal(value)
    except InvalidOperation:
        raise typer.BadParameter(f"not an amount of dollars: {value!r}") from None
    if not amount.is_finite() or amount < 0:
        raise typer.BadParameter(f"must be a finite amount of at least 0, got {value!r}")
    return amount


@one_shot
def raise_budget(
    cmd: OneShot,
    tenant: Tenant,
    job: JobId,
    by: Annotated[str, typer.Option("--by", metavar="USER", help="Who raises it.")],
    reason: Annotated[str, typer.Option("--reason", metavar="TEXT", help="Why (recorded).")],
    max_steps: Annotated[
        int | None,
        typer.Option("--max-steps", metavar="N", min=1, max=LARGEST, help="The new step limit."),
    ] = None,
    max_cost: Annotated[
        Decimal | None,
        typer.Option(
            "--max-cost", metavar="USD", parser=_amount, help="The new cost limit in dollars."
        ),
    ] = None,
    deadline: Annotated[
        datetime | None,
        typer.Option(
            "--deadline",
            metavar="TIME",
            parser=parse_moment,
            help="The new deadline, ISO 8601 (UTC unless it says otherwise).",
        ),
    ] = None,
) -> None:
    """Raise a job's budget (steps, cost, deadline), recorded with who and why.

    A job parked in budget_exceeded goes on once the raise covers what stopped it.
    """
    if max_steps is None and max_cost is None and deadline is None:
        raise typer.BadParameter("give at least one of --max-steps, --max-cost, --deadline")
    with cmd.engine(purpose="raise-budget") as engine:
        view = engine.raise_budget(
            tenant,
            job,
            raised_by=by,
            reason=reason,
            max_steps=max_steps,
            max_cost_usd=max_cost,
            deadline_at=deadline,
        )
        _done(f"budget raised by {by}", engine, view, cmd.json)


def _done(
    what: str, engine: Engine, view: JobView, as_json: bool, outcome: str | None = None
) -> None:
    """One line for people; for machines ``{"job": ..., "outcome": ...}`` where the job
    is what ``show --json`` prints."""
    if as_json:
        document = job_document(view, engine.history(view.tenant_id, view.job_id))
        print_json({"job": document, **({"outcome": outcome} if outcome else {})})
        return
    out = console()
    out.print(f"{what}: {view.tenant_id}/{view.job_id} is now {view.status}")
    if view.status == "queued":
        out.print("the job runs on when a worker (or `jobledger tick`) picks it up")
