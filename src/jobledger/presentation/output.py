"""What the CLI prints: rich tables for people, JSON for machines (stdout only)."""

from __future__ import annotations

import dataclasses
import json
import os
import sys
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import Decimal
from enum import Enum
from pathlib import Path
from typing import Any
from uuid import UUID

from rich.console import Console, ConsoleOptions, RenderableType, RenderResult
from rich.padding import Padding
from rich.table import Table
from rich.text import Text

from jobledger.domain import erasure
from jobledger.domain.erasure import ERASED
from jobledger.domain.views import FamilyView, HistoryEntry, JobView
from jobledger.orchestration.ports import BlockedNote

_PIPE_WIDTH = 160
"""Rich wraps at 80 columns when stdout is not a terminal; logs and pipes want wider."""


def console() -> Console:
    """A console on stdout; colours only on a terminal. Markup is off: ids, states and
    reasons are printed as they are (style with Text or ``style=`` instead)."""
    width = None
    if not sys.stdout.isatty():
        width = int(os.environ.get("COLUMNS", "0") or 0) or _PIPE_WIDTH
    return Console(highlight=False, markup=False, width=width)


# ---- JSON ------------------------------------------------------------------------------


def jsonable(value: Any) -> Any:
    """Plain JSON data: Decimals and datetimes as strings, enums as their values."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return jsonable({f.name: getattr(value, f.name) for f in dataclasses.fields(value)})
    if isinstance(value, Mapping):
        return {str(key): jsonable(item) for key, item in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        return [jsonable(item) for item in value]
    if isinstance(value, Enum):
        return jsonable(value.value)
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, Decimal | UUID | Path):
        return str(value)
    return value


def print_json(value: Any) -> None:
    """One JSON document on stdout, and nothing else there."""
    sys.stdout.write(json.dumps(jsonable(value), indent=2, allow_nan=False) + "\n")
    sys.stdout.flush()


def compact(value: Any) -> str:
    return json.dumps(jsonable(value), separators=(", ", ": "))


def when(moment: datetime | None) -> str:
    """UTC, to the millisecond (whole seconds said without them)."""
    if moment is None:
        return "-"
    text = moment.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]
    return (text[:-4] if text.endswith(".000") else text) + " UTC"


def money(amount: Decimal | str | int | float) -> str:
    """Dollars with at least two decimals (``$0.40``), and every further digit the amount
    has (``$0.0125``): a sub-cent agent step must not read as free."""
    value = Decimal(str(amount))
    if value == value.quantize(Decimal("0.01")):
        value = value.quantize(Decimal("0.01"))
    return f"${value:f}"


# ---- a job -----------------------------------------------------------------------------


def pending_approval(view: JobView, history: Iterable[HistoryEntry]) -> dict[str, Any] | None:
    """The open approval request in full (the view has only its id)."""
    if view.pending_approval_id is None:
        return None
    for entry in reversed(list(history)):
        if (
            entry.event_type == "ApprovalRequested"
            and entry.data.get("approval_id") == view.pending_approval_id
        ):
            keep = ("approval_id", "step_number", "attempt", "approvers", "expires_at")
            return {
                **{key: entry.data.get(key) for key in keep},
                "action_sha256": entry.data.get("action_sha256"),
                "on_approve": entry.data.get("on_approve"),
                "on_reject": entry.data.get("on_reject"),
                "on_expire": entry.data.get("on_expire"),
            }
    return {"approval_id": view.pending_approval_id}


def open_wait(view: JobView, history: Iterable[HistoryEntry]) -> dict[str, Any] | None:
    """The event wait the job is in: its name, timeout and token expiry (never the token)."""
    if view.wait_event_name is None:
        return None
    reissued: Mapping[str, Any] | None = None  # the newest token, if one was reissued
    for entry in reversed(list(history)):
        if entry.event_type == "ResumeTokenReissued" and reissued is None:
            reissued = entry.data
        wait = entry.data.get("wait_event") if entry.event_type == "StepRecorded" else None
        if isinstance(wait, Mapping) and wait.get("name") == view.wait_event_name:
            token = reissued or wait
            return {
                "event": wait.get("name"),
                "step_number": entry.data.get("step_number"),
                "timeout_at": view.resume_at,
                "on_timeout": wait.get("on_timeout"),
                "token_expires_at": token.get("expires_at"),
                "token_nonce": token.get("nonce"),
            }
    return {"event": view.wait_event_name, "timeout_at": view.resume_at}


def job_document(
    view: JobView,
    history: list[HistoryEntry],
    blocked: BlockedNote | None = None,
    family: FamilyView | None = None,
    *,
    queued: str | None = None,
) -> dict[str, Any]:
    """``family``: the job's parent and children (``parent`` and ``children`` keys);
    ``queued``: why a queued job has not started (the admission gate's answer)."""
    document: dict[str, Any] = jsonable(view)
    document["pending_approval"] = jsonable(pending_approval(view, history))
    document["wait"] = jsonable(open_wait(view, history))
    document["blocked"] = jsonable(blocked)
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
    table.add_row("waits", _waits(view, history))
    for label, text in family_rows(family) if family is not None else []:
        table.add_row(label, text)
    approval = pending_approval(view, history)
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


def _waits(view: JobView, history: list[HistoryEntry]) -> str:
    wait = open_wait(view, history)
    if wait is not None:
        timeout = (
            f"times out {when(wait['timeout_at'])}" if wait.get("timeout_at") else "no timeout"
        )
        return f"event {wait['event']!r} ({timeout})"
    if view.resume_at is not None:
        return f"timer until {when(view.resume_at)}"
    return "-"


def _approval(approval: Mapping[str, Any]) -> str:
    text = str(approval["approval_id"])
    if approval.get("approvers"):
        text += f" by {', '.join(approval['approvers'])}"
    if approval.get("expires_at"):
        text += f", expires {when(approval['expires_at'])}"
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


# ---- a history, as an audit reads it ---------------------------------------------------


@dataclass(frozen=True)
class AuditLine:
    """Who or what caused an event, the step it concerns, and what changed."""

    by: str
    step: str
    transition: str


def audit_line(entry: HistoryEntry, personal: Sequence[str] = ()) -> AuditLine:
    """How an event reads in an audit; ``personal``: the job's personal data paths, whose
    erased values the line names (``[erased] output.customer.email``)."""
    describe = _DESCRIBERS.get(entry.event_type)
    line = AuditLine("-", "", compact(entry.data)) if describe is None else describe(entry.data)
    erased = erasure.unreadable_fields(f"Job.{entry.event_type}", entry.data, personal)
    if not erased:
        return line
    marked = f"{ERASED} {', '.join(erased)}"
    return dataclasses.replace(
        line, transition=f"{line.transition}; {marked}" if line.transition else marked
    )


def personal_paths(entries: Sequence[HistoryEntry]) -> tuple[str, ...]:
    """The job's personal data paths, as its Submitted recorded them."""
    if not entries or entries[0].event_type != "Submitted":
        return ()
    return tuple(entries[0].data.get("personal_data") or ())


def history_document(entries: list[HistoryEntry]) -> list[dict[str, Any]]:
    rows = []
    personal = personal_paths(entries)
    for entry in entries:
        line = audit_line(entry, personal)
        rows.append(
            {
                "version": entry.version,
                "time": entry.timestamp,
                "event_type": entry.event_type,
                "by": line.by,
                "step": line.step,
                "transition": line.transition,
                "data": entry.data,
                "chain_hash": entry.chain_hash,
            }
        )
    return jsonable(rows)  # type: ignore[no-any-return]


WIDE_HISTORY = 110
"""Below this many columns a history table would wrap every cell into a tower of
fragments; each event is printed as a short block instead."""


@dataclass(frozen=True)
class History:
    """A job's history that fits the terminal: a table where it is wide enough, else one
    block per event (version, time, event and who on one line; step and transition below)."""

    entries: tuple[HistoryEntry, ...]
    title: str | None = None
    seconds: bool = False

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        if options.max_width >= WIDE_HISTORY:
            yield self.table()
        else:
            yield from self.blocks()

    def table(self) -> Table:
        table = Table(title=self.title)
        table.add_column("v", justify="right")
        table.add_column("time (UTC)", no_wrap=True)
        table.add_column("event", no_wrap=True)
        table.add_column("by", overflow="fold")
        table.add_column("step", overflow="fold")
        table.add_column("transition", overflow="fold")
        personal = personal_paths(self.entries)
        for entry in self.entries:
            line = audit_line(entry, personal)
            table.add_row(str(entry.version), self.time(entry), entry.event_type, *line_cells(line))
        return table

    def blocks(self) -> Iterator[RenderableType]:
        if self.title:
            yield Text(self.title, style="bold")
        personal = personal_paths(self.entries)
        for entry in self.entries:
            line = audit_line(entry, personal)
            head = Text(f"v{entry.version}  {self.time(entry)}  ")
            head.append(entry.event_type, style="bold")
            head.append(f"  {line.by}")
            yield head
            for detail in (line.step, line.transition):
                if detail:
                    yield Padding(Text(detail, overflow="fold"), (0, 0, 0, 4), expand=False)

    def time(self, entry: HistoryEntry) -> str:
        return entry.timestamp.strftime("%Y-%m-%d %H:%M:%S.%f")[: -7 if self.seconds else -3]


def line_cells(line: AuditLine) -> tuple[str, str, str]:
    return line.by, line.step, line.transition


def history_table(
    entries: Iterable[HistoryEntry], title: str | None = None, *, seconds: bool = False
) -> History:
    return History(tuple(entries), title, seconds)


def _step(data: Mapping[str, Any]) -> str:
    number = data.get("step_number")
    name = data.get("step_name")
    kind = data.get("step_type")
    text = f"#{number}" if number is not None else ""
    if name:
        text += f" {name}"
    if kind and kind != name:
        text += f" ({kind})"
    return text.strip()


def _arrow(status: object, step: object = None) -> str:
    return f"-> {status}" + (f" at {step!r}" if step else "")


def _submitted(d: Mapping[str, Any]) -> AuditLine:
    by = f"submit (key {d['submit_key']})" if d.get("submit_key") else "submit"
    text = f"{d['workflow_type']} v{d['workflow_version']} {_arrow('queued')}"
    parent = d.get("parent")
    if parent:
        text += f"; child {parent['index']} of {parent['job_id']} (step {parent['step_number']})"
    return AuditLine(by, "", text)


def _claimed(d: Mapping[str, Any]) -> AuditLine:
    text = f"{d['previous_status']} -> running, lease until {when(d['lease_until'])}"
    if d.get("previous_worker_id"):
        text += f"; took over from {d['previous_worker_id']} (lease expired)"
    return AuditLine(f"worker {d['worker_id']}", "", f"{text} (tick: {d['reason']})")


def _step_recorded(d: Mapping[str, Any]) -> AuditLine:
    by = f"worker {d['worker_id']}" if d.get("worker_id") else "engine"
    text = _arrow(d["next_status"], d.get("next_step"))
    if d.get("resume_at") is not None:
        text += f" until {when(d['resume_at'])}"
    wait = d.get("wait_event")
    if isinstance(wait, Mapping):
        text += f", event {wait.get('name')!r} (token nonce {wait.get('nonce')})"
    if d.get("cost_usd"):
        text += f", cost {money(d['cost_usd'])}"
    text += f", key {d['idempotency_key']}"
    return AuditLine(by, _step(d), text)


def _ceiling(d: Mapping[str, Any]) -> AuditLine:
    text = (
        f"-> waiting_time until {when(d['resume_at'])}: tenant spent "
        f"{money(d['spend_usd'])} of its {money(d['ceiling_usd'])} daily ceiling"
    )
    return AuditLine("cost ceiling", f"#{d['step_number']} (not run)", text)


def _retry(d: Mapping[str, Any]) -> AuditLine:
    text = f"-> waiting_time until {when(d['resume_at'])}, attempt {d['attempt']}: {d['error']}"
    return AuditLine(f"retry policy ({d['error_kind']})", f"#{d['step_number']}", text)


def _failed(d: Mapping[str, Any]) -> AuditLine:
    return AuditLine(d["cause"], f"#{d['step_number']}", f"-> failed: {d['error']}")


def _approval_requested(d: Mapping[str, Any]) -> AuditLine:
    who = ", ".join(d["approvers"]) or "any trusted caller"
    text = f"approval {d['approval_id']} (attempt {d['attempt']}) for {who}"
    if d.get("expires_at") is not None:
        text += f", expires {when(d['expires_at'])}"
    return AuditLine("engine", f"#{d['step_number']}", text)


def _approval_decided(d: Mapping[str, Any]) -> AuditLine:
    text = f"{d['decision']} {d['approval_id']} {_arrow('queued', d.get('next_step'))}"
    if d.get("comment"):
        text += f": {d['comment']!r}"
    return AuditLine(f"decided_by {d['decided_by']}", "", text)


def _approval_expired(d: Mapping[str, Any]) -> AuditLine:
    text = f"{d['approval_id']} expired {_arrow('queued', d.get('next_step'))}"
    return AuditLine("expiry", "", text)


def _signal_buffered(d: Mapping[str, Any]) -> AuditLine:
    text = f"event {d['event_name']!r} kept until its wait opens"
    return AuditLine(f"signal {d['signal_id']}", "", text)


def _resumed(d: Mapping[str, Any]) -> AuditLine:
    by = f"token nonce {d['nonce']}" if d.get("nonce") else f"{d['source']} {d['signal_id']}"
    return AuditLine(by, "", f"event {d['event_name']!r} arrived {_arrow('queued')}")


def _token_reissued(d: Mapping[str, Any]) -> AuditLine:
    text = f"new resume token, nonce {d['nonce']}; token nonce {d['previous_nonce']} voided"
    return AuditLine(f"reissued_by {d['reissued_by']}", "", text)


def _timed_out(d: Mapping[str, Any]) -> AuditLine:
    text = f"event {d['event_name']!r} did not arrive {_arrow('queued', d.get('next_step'))}"
    return AuditLine("timeout", "", text)


def _budget_exceeded(d: Mapping[str, Any]) -> AuditLine:
    text = f"-> budget_exceeded: {d['limit']} {d['used']} of {d['allowed']}"
    return AuditLine("budget", "", text)


def _budget_raised(d: Mapping[str, Any]) -> AuditLine:
    return AuditLine(f"raised_by {d['raised_by']}", "", f"{compact(d['budget'])}: {d['reason']}")


def _cancelled(d: Mapping[str, Any]) -> AuditLine:
    return AuditLine(f"cancelled_by {d['cancelled_by']}", "", f"-> cancelled: {d['reason']}")


def _discarded(d: Mapping[str, Any]) -> AuditLine:
    by = f"worker {d['worker_id']}" if d.get("worker_id") else "engine"
    text = f"late result discarded ({d['reason']}), key {d['idempotency_key']}"
    return AuditLine(by, f"#{d['step_number']}", text)


def _migrated(d: Mapping[str, Any]) -> AuditLine:
    by = f"migrated_by {d['migrated_by']}" if d.get("migrated_by") else "migration"
    text = f"v{d['from_version']} -> v{d['to_version']}"
    if d.get("forced"):
        text += f", FORCED ({d.get('reason') or 'no reason given'})"
    elif d.get("reason"):
        text += f" ({d['reason']})"
    return AuditLine(by, "", f"{text}; replay: {d['replay_verdict']}")


def _rerouted(d: Mapping[str, Any]) -> AuditLine:
    gate = d["approval"]
    approvers = ", ".join(gate.get("approvers") or ()) or "anyone trusted"
    return AuditLine(
        "migration", "", f"{gate['approval_id']} now decided by {approvers} ({d['reason']})"
    )


def _children_spawned(d: Mapping[str, Any]) -> AuditLine:
    ids = ", ".join(child["job_id"] for child in d["children"]) or "none"
    join = d["join"]
    need = "all" if join["need"] is None else join["need"]
    return AuditLine("engine", f"#{d['step_number']}", f"spawned {ids}; join {need}")


def _child_finished(d: Mapping[str, Any]) -> AuditLine:
    text = f"child {d['child_job_id']} {d['status']}, cost {money(d['cost_usd'])}"
    if d.get("error"):
        text += f": {d['error']}"
    return AuditLine(f"child {d['child_job_id']}", "", text)


def _joined(d: Mapping[str, Any]) -> AuditLine:
    done = sum(1 for result in d["results"] if result["status"] == "completed")
    text = f"{done} of {len(d['results'])} children completed -> {d['results_key']}"
    return AuditLine("engine", f"#{d['step_number']}", f"{text} {_arrow('queued', d['next_step'])}")


def _join_timed_out(d: Mapping[str, Any]) -> AuditLine:
    after = d["next_step"] or "fail"
    return AuditLine("timeout", f"#{d['step_number']}", f"join timed out -> {after}")


def _erased(d: Mapping[str, Any]) -> AuditLine:
    paths = ", ".join(d.get("paths") or ()) or "no path"
    text = f"personal data erased ({paths}), key {d['key_id']} destroyed: {d['reason']}"
    return AuditLine(f"erased_by {d['erased_by']}", "", text)


_DESCRIBERS = {
    "Submitted": _submitted,
    "Claimed": _claimed,
    "StepRecorded": _step_recorded,
    "CostCeilingDeferred": _ceiling,
    "RetryScheduled": _retry,
    "Failed": _failed,
    "ApprovalRequested": _approval_requested,
    "ApprovalDecided": _approval_decided,
    "ApprovalExpired": _approval_expired,
    "SignalBuffered": _signal_buffered,
    "Resumed": _resumed,
    "ResumeTokenReissued": _token_reissued,
    "WaitTimedOut": _timed_out,
    "BudgetExceeded": _budget_exceeded,
    "BudgetRaised": _budget_raised,
    "Cancelled": _cancelled,
    "LateResultDiscarded": _discarded,
    "Migrated": _migrated,
    "ApprovalRerouted": _rerouted,
    "Erased": _erased,
    "ChildrenSpawned": _children_spawned,
    "ChildFinished": _child_finished,
    "ChildrenJoined": _joined,
    "JoinTimedOut": _join_timed_out,
}
