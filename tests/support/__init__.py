"""What the tests share that is not a fixture: helper classes, fake executors, the
processes the crash and Kafka tests start, and the one place engines are built
(:mod:`tests.support.engines`). Fixtures live in tests/conftest.py and use these."""

from __future__ import annotations

import os
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
"""The repository root: on a test process's PYTHONPATH, ``tests.support`` imports."""


def pythonpath(*first: Path | str) -> str:
    """A PYTHONPATH for a process a test starts: ``first``, then the repository root (so
    ``tests.support.*`` imports, e.g. an executor named ``tests.support.cli:...``), then
    the caller's own PYTHONPATH (so the process runs this checkout's code)."""
    parts = [*map(str, first), str(ROOT), os.environ.get("PYTHONPATH", "")]
    return os.pathsep.join(part for part in parts if part)
