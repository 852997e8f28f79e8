"""What the engine hands out while a test runs: resume tokens and approval requests, kept
with the job they belong to so that a test can answer them."""

from __future__ import annotations

from dataclasses import dataclass, field

from jobledger.domain.steps import IssuedToken
from jobledger.domain.views import JobView
from jobledger.orchestration.ports import ApprovalRequest


@dataclass(frozen=True)
class TokenNotice:
    """A resume token handed out for an event wait."""

    tenant_id: str
    job_id: str
    step_number: int
    """The step that opened the wait (a token is bound to it)."""
    event_name: str
    token: IssuedToken


@dataclass(frozen=True)
class ApprovalNotice:
    """An approval request handed out for a person to decide."""

    tenant_id: str
    job_id: str
    request: ApprovalRequest


@dataclass
class RecordingNotifier:
    """A notifier that keeps every notice, in order, for the test to read and answer."""

    tokens: list[TokenNotice] = field(default_factory=list)
    approvals: list[ApprovalNotice] = field(default_factory=list)

    def waiting_for_event(self, job: JobView, event_name: str, token: IssuedToken) -> None:
        self.tokens.append(
            TokenNotice(job.tenant_id, job.job_id, job.current_step, event_name, token)
        )

    def approval_requested(self, job: JobView, request: ApprovalRequest) -> None:
        self.approvals.append(ApprovalNotice(job.tenant_id, job.job_id, request))

    def tokens_of(self, tenant_id: str, job_id: str) -> list[TokenNotice]:
        return [t for t in self.tokens if (t.tenant_id, t.job_id) == (tenant_id, job_id)]

    def approvals_of(self, tenant_id: str, job_id: str) -> list[ApprovalNotice]:
        return [a for a in self.approvals if (a.tenant_id, a.job_id) == (tenant_id, job_id)]
