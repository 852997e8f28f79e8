"""A Notifier that keeps what jobs hand to the outside world (tokens, approval requests)
for a caller in the same process to act on: the CLI prints them, the demo answers them."""

from __future__ import annotations

from dataclasses import dataclass, field

from jobledger.ports import ApprovalRequest, IssuedToken
from jobledger.views import JobView


@dataclass
class MemoryNotifier:
    tokens: list[tuple[str, IssuedToken]] = field(default_factory=list)
    approvals: list[ApprovalRequest] = field(default_factory=list)

    def waiting_for_event(self, job: JobView, event_name: str, token: IssuedToken) -> None:
        self.tokens.append((event_name, token))

    def approval_requested(self, job: JobView, request: ApprovalRequest) -> None:
        self.approvals.append(request)
