"""The HTTP API (and, mounted on it, the web console): FastAPI over :class:`jobledger.Engine`.

Process level: it may import the engine, the composition root and the projections;
nothing below it imports this package. FastAPI, uvicorn and Jinja2 are the ``http``
extra (``pip install 'jobledger[http]'``); :func:`require_http` says so plainly when they
are missing, and ``import jobledger.cli`` never imports this package's modules that need
them."""

from __future__ import annotations

import importlib.util

from jobledger.domain.errors import ConfigError

HTTP_EXTRA = ("fastapi", "uvicorn", "jinja2", "multipart")


def require_http() -> None:
    """Raise ConfigError naming the extra to install when a part of it is missing."""
    missing = [name for name in HTTP_EXTRA if importlib.util.find_spec(name) is None]
    if missing:
        raise ConfigError(f"the HTTP API needs {', '.join(missing)}: pip install 'jobledger[http]'")
