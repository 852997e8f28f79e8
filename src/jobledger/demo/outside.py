"""The demo plays the outside world: it receives resume tokens and approval requests
through the notifier port, checks the facts itself, and answers."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from jobledger.demo.agent import words
from jobledger.ports import ApprovalRequest, IssuedToken
from jobledger.views import JobView

FACT_CHECKER = "demo fact-checker"
REVIEWER = "demo-reviewer"


@dataclass
class OutsideWorld:
    """The Notifier port: what a job asks of the world, kept until the demo answers."""

    tokens: list[tuple[str, IssuedToken]] = field(default_factory=list)
    approvals: list[ApprovalRequest] = field(default_factory=list)

    def waiting_for_event(self, job: JobView, event_name: str, token: IssuedToken) -> None:
        self.tokens.append((event_name, token))

    def approval_requested(self, job: JobView, request: ApprovalRequest) -> None:
        self.approvals.append(request)


def fact_check(job: JobView, text: str) -> dict[str, Any]:
    """Recount the source independently and compare with what the agent recorded."""
    counted = len(words(text))
    recorded = job.state.get("survey", {}).get("words")
    return {
        "fact_check": {
            "checked_by": FACT_CHECKER,
            "words_recounted": counted,
            "confirmed": counted == recorded,
        }
    }
