"""Where the CLI prints for people: a rich console on stdout."""

from __future__ import annotations

import os
import sys

from rich.console import Console

_PIPE_WIDTH = 160
"""Rich wraps at 80 columns when stdout is not a terminal; logs and pipes want wider."""


def console() -> Console:
    """A console on stdout; colours only on a terminal. Markup is off: ids, states and
    reasons are printed as they are (style with Text or ``style=`` instead)."""
    width = None
    if not sys.stdout.isatty():
        width = int(os.environ.get("COLUMNS", "0") or 0) or _PIPE_WIDTH
    return Console(highlight=False, markup=False, width=width)
