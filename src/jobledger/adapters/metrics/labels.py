"""Bounded label values: a label takes at most ``cap`` values, the rest fold into one."""

from __future__ import annotations

import threading

OTHER = "other"


class CappedLabel:
    """The first ``cap`` distinct values keep their names (first come, kept for the
    process's life, so a series never changes name); every later one is ``other``."""

    def __init__(self, cap: int) -> None:
        if cap < 1:
            raise ValueError(f"a label cap must be at least 1, got {cap}")
        self.cap = cap
        self._kept: set[str] = set()
        self._lock = threading.Lock()

    def __call__(self, value: str) -> str:
        if value in self._kept:
            return value
        with self._lock:
            if len(self._kept) < self.cap:
                self._kept.add(value)
                return value
        return OTHER
