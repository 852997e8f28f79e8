"""The demo plays the outside world: it receives resume tokens and approval requests
through the notifier port, checks the facts itself, and answers."""

from __future__ import annotations

from typing import Any

from jobledger.demo.agent import words

FACT_CHECKER = "demo fact-checker"
REVIEWER = "demo-reviewer"


def fact_check(recorded: object, text: str) -> dict[str, Any]:
    """Recount the source independently and compare with the word count the agent
    recorded (``recorded``)."""
    counted = len(words(text))
    return {
        "fact_check": {
            "checked_by": FACT_CHECKER,
            "words_recounted": counted,
            "confirmed": counted == recorded,
        }
    }
