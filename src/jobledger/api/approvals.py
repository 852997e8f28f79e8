"""Approval requests as the person deciding sees them: what is being approved, bound to
which action hash, by whom, until when; read through the engine's facade and the views
for the API's inbox and the console's pages.

Nothing here decides anything the engine decides: a decision goes to ``Engine.decide``
and the engine's own checks (the open request, its action hash, its expiry, its
approvers) refuse what they refuse. The rules computed here are two hashes. The action hash is
computed by the engine's own function (``transition.action_sha256``) to show the approver
that what is shown is exactly what the request is bound to. The card's ``shown_sha256``
covers everything the card shows, what each decision leads to included (the next step,
its params and description, from the workflow's definition as it is loaded now): a
decision sent with it is made only if the card, built again, still hashes to it.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from datetime import datetime
from typing import Any

from jobledger.api.auth import Principal, Role
from jobledger.domain import transition
from jobledger.domain.errors import JobLedgerError
from jobledger.domain.views import HistoryEntry
from jobledger.engine.engine import Engine
from jobledger.presentation.audit_lines import personal_paths
from jobledger.presentation.json_output import jsonable
from jobledger.projections import JobViews
from jobledger.workflows.definition import AnyStep, Complete, Fail
from jobledger.workflows.resolver import DefinitionRegistry, resolve_step

DECISIONS = ("approve", "reject")


@dataclass(frozen=True)
class Outcome:
    """Where one decision takes the job: the step it goes to next, as the workflow's
    definition says (the step's kind, params and description)."""

    decision: str
    """``approve`` or ``reject``."""
    step: str | None
    """The step the request names for this decision (None: the job fails on a rejection;
    on an approval, the workflow's code goes on)."""
    effect: str
    """What happens, in words."""
    description: str | None = None
    params: Mapping[str, Any] | None = None
    """The next step's params (None: it has none, or the registry cannot say)."""


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
    description: str | None
    """The approval step's description in the definition."""
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
    outcomes: tuple[Outcome, ...] = ()
    """What approving and what rejecting do, in that order."""
    quorum: int | None = None
    """How many of ``approvers`` must approve (None: one decision decides)."""
    votes: tuple[Mapping[str, Any], ...] = ()
    """The votes cast on a quorum request so far: voter, decision, at."""

    @property
    def progress(self) -> str | None:
        """``1 of 2 approvals`` on a quorum request; None otherwise."""
        if self.quorum is None:
            return None
        approvals = sum(1 for vote in self.votes if vote["decision"] == "approved")
        return f"{approvals} of {self.quorum} approvals"

    def others(self, subject: str) -> list[str]:
        return [name for name in self.approvers if name != subject]

    def decidable_by(self, principal: Principal) -> bool:
        """Whether to offer ``principal`` the decision (only what to show: the engine
        decides)."""
        return offers_decision(principal, self.tenant_id, self.approvers)

    @property
    def shown_sha256(self) -> str:
        """The hash of what the card shows of the action (not whether it is still open:
        a request decided meanwhile is the engine's to refuse, saying so)."""
        shown = {f.name: getattr(self, f.name) for f in fields(self) if f.name not in NOT_SHOWN}
        encoded = json.dumps(jsonable(shown), sort_keys=True, separators=(",", ":"), default=str)
        return hashlib.sha256(encoded.encode()).hexdigest()


NOT_SHOWN = frozenset({"hash_matches", "open", "outcome", "votes"})
"""What ``shown_sha256`` leaves out: derived from the rest, or the request's status (the
votes other approvers cast meanwhile do not change what this one approves)."""


def inbox(engine: Engine, views: JobViews, principal: Principal) -> list[ApprovalCard]:
    """The pending approvals of every tenant the principal approves for, oldest first,
    that name the principal among their approvers (or name nobody: any approver), as the
    views hold them (the caller brings them up to date)."""
    rows = [
        row
        for row in views.pending_approvals()
        if principal.may(Role.APPROVER, str(row["tenant_id"]))
        and _names(principal.subject, str(row["approvers"]).split(","))
    ]
    cards = []
    for row in rows:
        card = approval(engine, str(row["tenant_id"]), str(row["job_id"]), str(row["approval_id"]))
        if card is not None and card.open:
            cards.append(card)
    return sorted(cards, key=lambda card: card.requested_at)


def offers_decision(principal: Principal, tenant_id: str, approvers: Sequence[str]) -> bool:
    """Whether to offer ``principal`` the decision of a request of ``tenant_id`` that
    lists ``approvers``: an approver of the tenant, listed (or the list is empty)."""
    return principal.may(Role.APPROVER, tenant_id) and _names(principal.subject, approvers)


def _names(subject: str, approvers: Sequence[str]) -> bool:
    # Only what to show: whether the subject may decide is the engine's check, on decide.
    listed = [name for name in approvers if name]
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
    steps = _steps(engine, view.workflow_type, view.workflow_version)
    definition = steps.get(step_name) if step_name is not None else None
    params = _params(step_name, definition, view.state)
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
        approvers=_approvers(history, requested),
        expires_at=requested.data.get("expires_at"),
        requested_at=requested.timestamp,
        description=definition.description if definition is not None else None,
        params=params,
        state=view.state,
        output=step.data.get("output", {}) if step is not None else {},
        hash_matches=matches,
        open=now.pending_approval_id == approval_id and ended is None,
        outcome=ended or (None if now.pending_approval_id == approval_id else str(now.status)),
        outcomes=tuple(
            _outcome(decision, requested.data.get(f"on_{decision}"), steps, view.state)
            for decision in DECISIONS
        ),
        quorum=requested.data.get("quorum"),
        votes=tuple(
            {"voter": e.data["voted_by"], "decision": e.data["decision"], "at": e.timestamp}
            for e in history[requested.version :]
            if e.event_type == "ApprovalVoted" and e.data.get("approval_id") == approval_id
        ),
    )


def _approvers(history: Sequence[HistoryEntry], requested: HistoryEntry) -> tuple[str, ...]:
    """Who may decide the request: as it was made, or as its last reassignment says."""
    approval_id = requested.data["approval_id"]
    moved = _last(history[requested.version :], "ApprovalReassigned", approval_id)
    source = moved if moved is not None else requested
    return tuple(source.data.get("approvers") or ())


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


def _steps(engine: Engine, workflow_type: str, version: int) -> Mapping[str, AnyStep]:
    """The steps of the job's definition, as the engine's registry has it loaded now;
    none when the registry is not declarative (a function registry's steps are known
    only to its code)."""
    registry = engine.registry
    if not isinstance(registry, DefinitionRegistry):
        return {}
    try:
        return registry.get(workflow_type, version).steps
    except JobLedgerError:
        return {}


def _params(
    name: str | None, step: AnyStep | None, state: Mapping[str, Any]
) -> Mapping[str, Any] | None:
    """The params the step's definition gives it, resolved by the engine's own resolver."""
    if name is None or step is None:
        return None
    return resolve_step(name, step, state).params


def _outcome(
    decision: str, name: str | None, steps: Mapping[str, AnyStep], state: Mapping[str, Any]
) -> Outcome:
    if name is None:
        if decision == "reject":
            return Outcome(decision, None, "the job fails (rejected)")
        return Outcome(decision, None, "the workflow goes on as its code decides")
    step = steps.get(name)
    if step is None:
        return Outcome(decision, name, f"step {name} runs next (its definition is not known here)")
    if isinstance(step, Fail):
        effect = f"step {name}: the job fails: {step.reason}"
    elif isinstance(step, Complete):
        effect = f"step {name}: the job completes"
    else:
        effect = f"step {name} ({step.kind}) runs next"
    try:
        params = _params(name, step, state)
    except ValueError as error:  # a map step whose items the state does not hold (yet)
        effect += f", but it cannot start on this state: {error}"
        params = None
    return Outcome(decision, name, effect, step.description, params or None)
