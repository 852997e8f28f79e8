"""The console's demo executor: the demo's agent on the bundled field notes, for the
fact-checked brief (``fact_check.yaml``) run by a real ``jobledger run``.

``executor = "jobledger.demo.brief:agent"``; its side effects (the log of executions and
the outbox) land in ``demo-effects/`` of the directory the runner starts in.
"""

from __future__ import annotations

from pathlib import Path

from jobledger.demo import field_notes
from jobledger.demo.agent import DemoAgent, EffectsLedger

EFFECTS = Path("demo-effects")


def agent() -> DemoAgent:
    return DemoAgent(field_notes(), EffectsLedger(EFFECTS))
