"""The demo plays the outside world: it receives resume tokens and approval requests
through the notifier port, checks the facts itself, and answers."""

from __future__ import annotations

from typing import Any

from jobledger.demo.agent import words
from jobledger.domain.views import JobView

FACT_CHECKER = "demo fact-checker"
REVIEWER = "demo-reviewer"


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
