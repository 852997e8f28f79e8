"""How a job reads: a table for people, a JSON document for machines (the API's body of
a job and ``show --json`` are the same document)."""

from __future__ import annotations

from collections import Counter
from datetime import datetime
from typing import Any

from rich.table import Table
from rich.text import Text

from jobledger.domain.substate import ApprovalGate
from jobledger.domain.views import FamilyView, HistoryEntry, JobView
from jobledger.orchestration.ports import BlockedNote
from jobledger.presentation.figures import money, when
from jobledger.presentation.json_output import compact, jsonable


def job_json(view: JobView, blocked: BlockedNote | None = None) -> dict[str, Any]:
    """A job as JSON: the view (its open approval request and wait included) and why a
    worker left it untouched; the API's body of a job."""
    document: dict[str, Any] = jsonable(view)
    document["blocked"] = jsonable(blocked)
    return document


def job_document(
    view: JobView,
    history: list[HistoryEntry],
    blocked: BlockedNote | None = None,
    family: FamilyView | None = None,
    *,
    queued: str | None = None,
) -> dict[str, Any]:
    """What ``show --json`` prints: ``job_json`` and why the job is parked (which reads
    the history's last event); ``family``: the job's parent and children (``parent`` and
    ``children`` keys); ``queued``: why a queued job has not started (the admission
    gate's answer)."""
    document = job_json(view, blocked)
    document["parked"] = parked(view, history)
    if family is not None:
        document.update(jsonable(family))
    document["queued_because"] = queued
    return document


def family_rows(family: FamilyView) -> list[tuple[str, str]]:
    """(label, text) rows for a job's parent and children, as ``show`` prints them."""
    rows = []
    if family.parent is not None:
        link = family.parent
        rows.append(
            ("parent", f"{link['job_id']} (step {link['step_number']}, item {link['index']})")
        )
    if family.children:
        counts = Counter(child.status for child in family.children)
        summary = ", ".join(f"{n} {status}" for status, n in sorted(counts.items()))
        rows.append(("children", f"{len(family.children)}: {summary}"))
        for child in family.children:
            rows.append(("", f"{child.job_id}  {child.workflow}  {child.status}"))
    return rows


def _moment(value: object) -> datetime | None:
    """A time kept in a JSON document: ISO 8601 text, or already a datetime."""
    if isinstance(value, str):
        return datetime.fromisoformat(value)
    return value if isinstance(value, datetime) else None


def parked(view: JobView, history: list[HistoryEntry]) -> str | None:
    """Why a job that is not running and not finished sits where it is, when the reason
    is not the wait or approval its step opened: a budget limit, or the tenant's daily
    cost ceiling (a deployment problem is ``blocked``)."""
    last = history[-1] if history else None
    if view.status == "budget_exceeded":
        deadline = _moment(view.budget.get("deadline_at"))
        until = f"; fails at its deadline {when(deadline)} unless raised" if deadline else ""
        return f"{view.last_error}: raise-budget lets it go on{until}"
    if last is not None and last.event_type == "CostCeilingDeferred" and view.resume_at:
        spend, ceiling = last.data["spend_usd"], last.data["ceiling_usd"]
        return (
            f"tenant cost ceiling: {money(spend)} of {money(ceiling)} spent today; "
            f"runs again {when(view.resume_at)}"
        )
    return None


def blocked_text(note: BlockedNote) -> str:
    return f"{note.reason} (worker {note.worker_id}, {when(note.noticed_at)}; retried later)"


def job_table(
    view: JobView,
    history: list[HistoryEntry] | None = None,
    blocked: BlockedNote | None = None,
    family: FamilyView | None = None,
    *,
    queued: str | None = None,
) -> Table:
    history = history or []
    table = Table(title=f"job {view.tenant_id}/{view.job_id}", show_header=False, box=None)
    table.add_column(style="bold")
    table.add_column()
    table.add_row("workflow", f"{view.workflow_type} v{view.workflow_version}")
    table.add_row("status", Text(str(view.status), style=_STATUS_STYLE.get(view.status, "")))
    if queued is not None:
        table.add_row("queued because", Text(queued, style="yellow"))
    table.add_row("priority", str(view.priority))
    upcoming = view.next_step or ("the start step" if view.current_step == 0 else "-")
    table.add_row("step", f"{view.current_step} recorded; next: {upcoming}")
    table.add_row("state", compact(view.state))
    if view.erased:
        table.add_row("erased", f"could not read {', '.join(view.erased)}: their key was erased")
    table.add_row(
        "counters",
        f"steps {view.total_steps_executed}, cost {money(view.total_cost_usd)}, "
        f"attempt {view.attempt}, version {view.version}, "
        f"buffered signals {view.buffered_signals}",
    )
    table.add_row("budget", compact(view.budget) if view.budget else "-")
    lease = "-"
    if view.lease_until is not None:
        lease = f"{view.worker_id} until {when(view.lease_until)}"
    table.add_row("lease", lease)
    table.add_row("waits", _waits(view))
    for label, text in family_rows(family) if family is not None else []:
        table.add_row(label, text)
    approval = view.pending_approval
    table.add_row("pending approval", _approval(approval) if approval else "-")
    if blocked is not None:
        table.add_row("blocked", Text(blocked_text(blocked), style="yellow"))
    reason = parked(view, history)
    if reason is not None:
        table.add_row("parked", Text(reason, style="yellow"))
    if view.last_error and view.status != "completed":  # a completed job got past it
        label = "failed because" if view.status == "failed" else "last error"
        table.add_row(label, view.last_error)
    deadline = _moment(view.budget.get("deadline_at"))
    if deadline and not view.status.is_terminal:
        table.add_row("deadline", when(deadline))
    table.add_row("created", when(view.created_at))
    table.add_row("updated", when(view.updated_at))
    if view.completed_at is not None:
        table.add_row("finished", when(view.completed_at))
    return table


def _waits(view: JobView) -> str:
    wait = view.wait
    if wait is not None:
        timeout = f"times out {when(wait.timeout_at)}" if wait.timeout_at else "no timeout"
        return f"event {wait.event!r} ({timeout})"
    if view.resume_at is not None:
        return f"timer until {when(view.resume_at)}"
    return "-"


def _approval(approval: ApprovalGate) -> str:
    text = approval.approval_id
    if approval.approvers:
        text += f" by {', '.join(approval.approvers)}"
    if approval.quorum is not None:
        text += f" ({approval.progress})"
    if approval.expires_at:
        text += f", expires {when(approval.expires_at)}"
    return text


_STATUS_STYLE = {
    "completed": "green",
    "failed": "red",
    "cancelled": "red",
    "budget_exceeded": "yellow",
    "awaiting_approval": "cyan",
    "waiting_event": "cyan",
    "waiting_time": "cyan",
    "waiting_children": "cyan",
}
