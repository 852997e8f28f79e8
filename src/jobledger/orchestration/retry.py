"""Back-off with jitter, for what fails for a passing reason: a store that is away for a
while, or a race lost to other writers of the same job.

Each wait is drawn from the upper half of a ceiling that doubles per attempt ("equal
jitter"): the waits grow, so a store that is down is not hammered, and writers that
collided together spread apart instead of colliding again in lock step.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass


@dataclass(frozen=True)
class Backoff:
    base_seconds: float
    cap_seconds: float
    budget_seconds: float = math.inf
    """How long a caller may wait in all, across its attempts, before it gives up."""

    def ceiling(self, attempt: int) -> float:
        """The longest wait after failed attempt number ``attempt`` (from 1)."""
        # Bounded: a store away for hours is retried thousands of times, and 2.0 ** 1024
        # overflows a float; 2 ** 64 bases is past any cap already.
        doublings = min(max(0, attempt - 1), 64)
        return min(self.cap_seconds, self.base_seconds * 2.0**doublings)

    def delay(self, attempt: int) -> float:
        ceiling = self.ceiling(attempt)
        return ceiling / 2 + random.uniform(0, ceiling / 2)


INFRASTRUCTURE = Backoff(base_seconds=0.5, cap_seconds=30.0)
"""A tick that hit a store error, re-enqueued on the local queue."""

CONTENTION = Backoff(base_seconds=0.005, cap_seconds=0.5, budget_seconds=30.0)
"""A command (signal, decision, budget raise, cancel, resume, migrate) whose append lost
the race to another process writing the same job: decided again on the fresh job after
the wait (threads of one process take turns instead). Only contention that outlasts the
budget is reported (ConcurrencyError: try again). The budget is generous because what
it waits for is real work: 320 signals to one job from 8 processes at once all land on
PostgreSQL, which on a loaded 2-core machine takes 10-12 s to drain."""
