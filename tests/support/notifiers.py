"""The tests' notifier: what the outside world was told, by job (the Notifier contract
runs on it too, in tests/test_contracts.py)."""

from __future__ import annotations

from jobledger.domain.steps import IssuedToken
from jobledger.domain.views import JobView
from jobledger.orchestration.ports import ApprovalRequest


class Inbox:
    """The notifier port: what the outside world is told."""

    def __init__(self) -> None:
        self.tokens: dict[str, IssuedToken] = {}
        self.approvals: dict[str, ApprovalRequest] = {}

    def waiting_for_event(self, job: JobView, event_name: str, token: IssuedToken) -> None:
        self.tokens[job.job_id] = token

    def approval_requested(self, job: JobView, request: ApprovalRequest) -> None:
        self.approvals[job.job_id] = request
