"""How one event of a job's history reads in an audit: who or what caused it, the step
it concerns, and what changed."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from jobledger.domain import erasure
from jobledger.domain.erasure import ERASED
from jobledger.domain.views import HistoryEntry
from jobledger.presentation.figures import money, when
from jobledger.presentation.json_output import compact


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
    if d.get("quorum") is not None:
        text += f", {d['quorum']} of {len(d['approvers'])} must approve"
    if d.get("expires_at") is not None:
        text += f", expires {when(d['expires_at'])}"
    return AuditLine("engine", f"#{d['step_number']}", text)


def _approval_decided(d: Mapping[str, Any]) -> AuditLine:
    text = f"{d['decision']} {d['approval_id']} {_arrow('queued', d.get('next_step'))}"
    if d.get("comment"):
        text += f": {d['comment']!r}"
    text += _answers(d)
    return AuditLine(f"decided_by {d['decided_by']}", "", text)


def _answers(d: Mapping[str, Any]) -> str:
    """The edit and data a decision or vote answered with, by their hashes."""
    text = ""
    if d.get("edit") is not None:
        keys = ", ".join(sorted(d["edit"]))
        text += f"; edited {d.get('next_step')} params {keys} (sha256 {d['edit_sha256'][:12]})"
    if d.get("data") is not None:
        text += f"; data {', '.join(sorted(d['data']))} (sha256 {d['data_sha256'][:12]})"
    return text


def _approval_voted(d: Mapping[str, Any]) -> AuditLine:
    text = f"voted {d['decision']} on {d['approval_id']} (attempt {d['attempt']})"
    if d.get("comment"):
        text += f": {d['comment']!r}"
    return AuditLine(f"voted_by {d['voted_by']}", f"#{d['step_number']}", text + _answers(d))


def _reassigned(d: Mapping[str, Any]) -> AuditLine:
    before = ", ".join(d["previous_approvers"]) or "anyone trusted"
    text = f"{d['approval_id']} moved from {before} to {', '.join(d['approvers'])}"
    return AuditLine(f"reassigned_by {d['reassigned_by']}", "", f"{text} ({d['reason']})")


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


def _versions(d: Mapping[str, Any]) -> str:
    """`` on v2`` when a repair moved the job to another version, else nothing."""
    return f" on v{d['to_version']}" if d["to_version"] != d["from_version"] else ""


def _retried(d: Mapping[str, Any]) -> AuditLine:
    text = f"retried after its {d['cause']} failure{_versions(d)} -> queued: {d['reason']}"
    return AuditLine(f"retried_by {d['retried_by']}", f"#{d['step_number']}", text)


def _reset(d: Mapping[str, Any]) -> AuditLine:
    text = (
        f"reset to after step {d['step_number']}, epoch {d['epoch']}{_versions(d)} "
        f"-> queued: {d['reason']}"
    )
    return AuditLine(f"reset_by {d['reset_by']}", f"#{d['step_number']}", text)


def _forked_from(d: Mapping[str, Any]) -> AuditLine:
    text = f"forked from job {d['origin_job_id']} after its step {d['step_number']}: {d['reason']}"
    return AuditLine(f"forked_by {d['forked_by']}", f"#{d['step_number']}", text)


def _forked(d: Mapping[str, Any]) -> AuditLine:
    text = f"forked into job {d['fork_job_id']} after step {d['step_number']}: {d['reason']}"
    return AuditLine(f"forked_by {d['forked_by']}", f"#{d['step_number']}", text)


_DESCRIBERS = {
    "Submitted": _submitted,
    "Claimed": _claimed,
    "StepRecorded": _step_recorded,
    "CostCeilingDeferred": _ceiling,
    "RetryScheduled": _retry,
    "Failed": _failed,
    "ApprovalRequested": _approval_requested,
    "ApprovalDecided": _approval_decided,
    "ApprovalVoted": _approval_voted,
    "ApprovalReassigned": _reassigned,
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
    "Retried": _retried,
    "Reset": _reset,
    "ForkedFrom": _forked_from,
    "Forked": _forked,
}
