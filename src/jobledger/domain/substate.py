"""The parts of a job's state as value objects: its budget, the event wait it is in, the
approval gate it waits at, the signals it keeps.

Events keep these as JSON objects (they are stored, and hashed into the chain, as they
were written), and so do snapshots: ``from_dict`` and ``to_dict`` are used only there,
at the storage boundary, and ``to_dict`` gives back exactly the stored form (the same
keys in the same order, times and amounts as the same strings).
"""

from __future__ import annotations

from collections.abc import Mapping
from copy import deepcopy
from dataclasses import dataclass, field, replace
from datetime import datetime
from decimal import Decimal
from typing import Any

JSON = dict[str, Any]


@dataclass(frozen=True)
class JobBudget:
    """What a job may spend; every limit is optional. The deadline is absolute, so a
    replay never drifts (``jobledger.domain.budget`` turns a submit's seconds into it)."""

    max_steps: int | None = None
    max_cost_usd: Decimal | None = None
    deadline_at: datetime | None = None

    @classmethod
    def from_dict(cls, stored: Mapping[str, Any]) -> JobBudget:
        steps, cost, deadline = (
            stored.get(k) for k in ("max_steps", "max_cost_usd", "deadline_at")
        )
        return cls(
            max_steps=None if steps is None else int(steps),
            max_cost_usd=None if cost is None else Decimal(str(cost)),
            deadline_at=datetime.fromisoformat(deadline) if isinstance(deadline, str) else None,
        )

    def to_dict(self) -> JSON:
        stored: JSON = {}
        if self.max_steps is not None:
            stored["max_steps"] = self.max_steps
        if self.max_cost_usd is not None:
            stored["max_cost_usd"] = str(self.max_cost_usd)
        if self.deadline_at is not None:
            stored["deadline_at"] = self.deadline_at.isoformat()
        return stored

    def exceeded(self, steps: int, cost_usd: Decimal) -> tuple[str, str, str] | None:
        """(limit, used, allowed) for the first limit reached at this spend, else None."""
        if self.max_steps is not None and steps >= self.max_steps:
            return "max_steps", str(steps), str(self.max_steps)
        if self.max_cost_usd is not None and cost_usd >= self.max_cost_usd:
            return "max_cost_usd", str(cost_usd), str(self.max_cost_usd)
        return None


@dataclass(frozen=True)
class EventWait:
    """The outside event a job waits for, and the resume token issued for it: only its
    nonce and a hash of it, never the token itself."""

    name: str
    nonce: str
    token_sha256: str
    expires_at: datetime
    on_timeout: str | None
    """The step after a timeout; None fails the job."""
    superseded_nonces: tuple[str, ...] = ()
    """Nonces of tokens reissued away during this wait: refused as superseded, not as
    used."""

    @classmethod
    def from_dict(cls, stored: Mapping[str, Any]) -> EventWait:
        return cls(
            name=stored["name"],
            nonce=stored["nonce"],
            token_sha256=stored["token_sha256"],
            expires_at=datetime.fromisoformat(stored["expires_at"]),
            # Absent from waits opened before timeouts had a next step.
            on_timeout=stored.get("on_timeout"),
            superseded_nonces=tuple(stored.get("superseded_nonces", ())),
        )

    def to_dict(self) -> JSON:
        stored: JSON = {
            "name": self.name,
            "nonce": self.nonce,
            "token_sha256": self.token_sha256,
            "expires_at": self.expires_at.isoformat(),
            "on_timeout": self.on_timeout,
        }
        if self.superseded_nonces:
            stored["superseded_nonces"] = list(self.superseded_nonces)
        return stored

    def reissued(self, *, nonce: str, token_sha256: str, expires_at: datetime) -> EventWait:
        """The same wait under a new token; the old nonce is kept for the wait's life."""
        return replace(
            self,
            nonce=nonce,
            token_sha256=token_sha256,
            expires_at=expires_at,
            superseded_nonces=(*self.superseded_nonces, self.nonce),
        )


@dataclass(frozen=True)
class ApprovalGate:
    """The open approval request: who may decide, until when, and where each decision
    leads (None fails the job); ``action_sha256`` pins what is being approved."""

    approval_id: str
    step_number: int
    attempt: int
    action_sha256: str
    approvers: tuple[str, ...]
    """Who may decide; empty means any caller the deployment trusts."""
    expires_at: datetime | None
    on_approve: str | None
    on_reject: str | None
    on_expire: str | None
    quorum: int | None = None
    """How many of ``approvers`` must approve; None: one decision decides (as before
    quorums existed)."""
    votes: tuple[ApprovalVote, ...] = ()
    """The votes cast so far on a quorum request, in order."""

    @classmethod
    def from_dict(cls, stored: Mapping[str, Any]) -> ApprovalGate:
        return cls(
            approval_id=stored["approval_id"],
            step_number=stored["step_number"],
            attempt=stored["attempt"],
            action_sha256=stored["action_sha256"],
            approvers=tuple(stored["approvers"]),
            expires_at=_moment(stored["expires_at"]),
            on_approve=stored["on_approve"],
            on_reject=stored["on_reject"],
            on_expire=stored["on_expire"],
            quorum=stored.get("quorum"),
            votes=tuple(ApprovalVote.from_dict(v) for v in stored.get("votes", ())),
        )

    def to_dict(self) -> JSON:
        stored: JSON = {
            "approval_id": self.approval_id,
            "step_number": self.step_number,
            "attempt": self.attempt,
            "action_sha256": self.action_sha256,
            "approvers": list(self.approvers),
            "expires_at": None if self.expires_at is None else self.expires_at.isoformat(),
            "on_approve": self.on_approve,
            "on_reject": self.on_reject,
            "on_expire": self.on_expire,
        }
        # Only when used: a request without a quorum keeps the bytes it always had.
        if self.quorum is not None:
            stored["quorum"] = self.quorum
        if self.votes:
            stored["votes"] = [vote.to_dict() for vote in self.votes]
        return stored

    def next_step(self, approved: bool) -> str | None:
        return self.on_approve if approved else self.on_reject

    def voted(self, name: str) -> bool:
        return any(vote.voter == name for vote in self.votes)

    def tally(self, decision: str) -> tuple[ApprovalVote, ...]:
        return tuple(vote for vote in self.votes if vote.decision == decision)

    def outcome(self) -> str | None:
        """``approved`` once the quorum approved, ``rejected`` once it no longer can be
        reached (the approvals so far and every listed approver yet to vote fall short),
        else None: still open."""
        needed = self.quorum or 1
        approvals = len(self.tally(APPROVED))
        if approvals >= needed:
            return APPROVED
        if approvals + len(self.yet_to_vote()) < needed:
            return REJECTED
        return None

    def yet_to_vote(self) -> tuple[str, ...]:
        return tuple(name for name in self.approvers if not self.voted(name))

    @property
    def progress(self) -> str:
        """``1 of 2 approvals`` (the quorum's progress), for people reading."""
        return f"{len(self.tally(APPROVED))} of {self.quorum or 1} approvals"


APPROVED = "approved"
REJECTED = "rejected"


@dataclass(frozen=True)
class ApprovalVote:
    """One approver's vote on a quorum request, and the data they answered with."""

    voter: str
    decision: str
    """``approved`` or ``rejected``."""
    data: JSON | None = None

    @classmethod
    def from_dict(cls, stored: Mapping[str, Any]) -> ApprovalVote:
        return cls(stored["voter"], stored["decision"], deepcopy(stored.get("data")))

    def to_dict(self) -> JSON:
        stored: JSON = {"voter": self.voter, "decision": self.decision}
        if self.data is not None:
            stored["data"] = deepcopy(self.data)
        return stored


@dataclass(frozen=True)
class BufferedSignal:
    """A signal that arrived before the job waited for it, kept until a wait opens."""

    signal_id: str
    event_name: str
    payload: JSON = field(default_factory=dict)

    @classmethod
    def from_dict(cls, stored: Mapping[str, Any]) -> BufferedSignal:
        return cls(stored["signal_id"], stored["event_name"], deepcopy(stored["payload"]))

    def to_dict(self) -> JSON:
        return {
            "signal_id": self.signal_id,
            "event_name": self.event_name,
            "payload": deepcopy(self.payload),
        }


def _moment(stored: datetime | str | None) -> datetime | None:
    """A time as a JSON field holds it: ISO 8601 text (a row or snapshot before issue 16
    may hold the datetime itself, which eventsourcing's transcoder typed back)."""
    return datetime.fromisoformat(stored) if isinstance(stored, str) else stored
