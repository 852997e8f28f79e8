"""Approval requests as the person deciding sees them: what is being approved, bound to
which action hash, by whom, until when; read through the engine's facade and the views
for the API's inbox and the console's pages.

Nothing here decides anything the engine decides: a decision goes to ``Engine.decide``
and the engine's own checks (the open request, its action hash, its expiry, its
approvers) refuse what they refuse. The one rule computed here is the action hash, and
it is computed by the engine's own function (``transition.action_sha256``) to show the
approver that what is shown is exactly what the request is bound to.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from projections import JobViews

from jobledger import transition
from jobledger.api.auth import Principal, Role
from jobledger.cli.output import personal_paths
from jobledger.engine import Engine
from jobledger.errors import JobLedgerError
from jobledger.views import HistoryEntry
from jobledger.workflows.resolver import DefinitionRegistry, resolve_step


@dataclass(frozen=True)
class ApprovalCard:
    """One approval request as the approver sees it: what, bound to which hash, by whom."""

    tenant_id: str
    job_id: str
    workflow: str
    approval_id: str
    step_number: int
    step_name: str | None
    attempt: int
    action_sha256: str
    approvers: tuple[str, ...]
    expires_at: datetime | None
    requested_at: datetime
    params: Mapping[str, Any] | None
    """The step's params as its definition gives them (None: the registry cannot say)."""
    state: Mapping[str, Any]
    """The job's state when the request was made: the outputs the action rests on."""
    output: Mapping[str, Any]
    """The approval step's own recorded output."""
    hash_matches: bool | None
    """Whether step, params and state shown hash to ``action_sha256`` (None: unknown
    params, not checked)."""
    open: bool
    """Still the job's open request (else decided, expired or the job moved on)."""
    outcome: str | None
    """How it ended when not open: who decided what, or that it expired."""

    def others(self, subject: str) -> list[str]:
        return [name for name in self.approvers if name != subject]


def inbox(engine: Engine, views: JobViews, principal: Principal) -> list[ApprovalCard]:
    """The pending approvals of every tenant the principal approves for, oldest first,
    that name the principal among their approvers (or name nobody: any approver), as the
    views hold them (the caller brings them up to date)."""
    rows = [
        row
        for row in views.pending_approvals()
        if principal.may(Role.APPROVER, str(row["tenant_id"]))
        and _names(principal.subject, str(row["approvers"]))
    ]
    cards = []
    for row in rows:
        card = approval(engine, str(row["tenant_id"]), str(row["job_id"]), str(row["approval_id"]))
        if card is not None and card.open:
            cards.append(card)
    return sorted(cards, key=lambda card: card.requested_at)


def _names(subject: str, approvers: str) -> bool:
    # Only what to list: whether the subject may decide is the engine's check, on decide.
    listed = [name for name in approvers.split(",") if name]
    return not listed or subject in listed


def approval(engine: Engine, tenant_id: str, job_id: str, approval_id: str) -> ApprovalCard | None:
    """The request ``approval_id`` of the job, open or not; None if the job never made it."""
    history = engine.history(tenant_id, job_id)
    requested = _last(history, "ApprovalRequested", approval_id)
    if requested is None:
        return None
    step = next(
        (
            e
            for e in reversed(history[: requested.version - 1])
            if e.event_type == "StepRecorded"
            and e.data.get("step_number") == requested.data["step_number"]
        ),
        None,
    )
    step_name = step.data.get("step_name") if step is not None else None
    view = engine.job_at(tenant_id, job_id, version=requested.version)
    params = _params(engine, view.workflow_type, view.workflow_version, step_name, view.state)
    matches = None
    if params is not None:
        personal = personal_paths(history)
        bound = transition.action_sha256(step_name, dict(params), dict(view.state), personal)
        matches = bound == requested.data["action_sha256"]
    now = engine.job(tenant_id, job_id)
    ended = _ending(history, approval_id)
    return ApprovalCard(
        tenant_id=tenant_id,
        job_id=job_id,
        workflow=f"{view.workflow_type} v{view.workflow_version}",
        approval_id=approval_id,
        step_number=int(requested.data["step_number"]),
        step_name=step_name,
        attempt=int(requested.data["attempt"]),
        action_sha256=str(requested.data["action_sha256"]),
        approvers=tuple(requested.data.get("approvers") or ()),
        expires_at=requested.data.get("expires_at"),
        requested_at=requested.timestamp,
        params=params,
        state=view.state,
        output=step.data.get("output", {}) if step is not None else {},
        hash_matches=matches,
        open=now.pending_approval_id == approval_id and ended is None,
        outcome=ended or (None if now.pending_approval_id == approval_id else str(now.status)),
    )


def _last(
    history: Sequence[HistoryEntry], event_type: str, approval_id: str
) -> HistoryEntry | None:
    for entry in reversed(history):
        if entry.event_type == event_type and entry.data.get("approval_id") == approval_id:
            return entry
    return None


def _ending(history: Sequence[HistoryEntry], approval_id: str) -> str | None:
    decided = _last(history, "ApprovalDecided", approval_id)
    if decided is not None:
        d = decided.data
        return f"{d['decision']} by {d['decided_by']} at {decided.timestamp.isoformat()}"
    expired = _last(history, "ApprovalExpired", approval_id)
    if expired is not None:
        return f"expired undecided at {expired.timestamp.isoformat()}"
    return None


def _params(
    engine: Engine,
    workflow_type: str,
    version: int,
    step_name: str | None,
    state: Mapping[str, Any],
) -> Mapping[str, Any] | None:
    """The params the step's definition gives it, resolved by the engine's own resolver;
    None when the registry is not declarative (a function registry's params are known
    only to its code)."""
    registry = engine.registry
    if not isinstance(registry, DefinitionRegistry) or step_name is None:
        return None
    try:
        definition = registry.get(workflow_type, version)
    except JobLedgerError:
        return None
    step = definition.steps.get(step_name)
    if step is None:
        return None
    return resolve_step(step_name, step, state).params
