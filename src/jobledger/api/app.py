"""The application: :func:`create_app` wires the engine, the settings and the routes.

Every endpoint is a plain ``def``: FastAPI runs it on the server's thread pool, so the
engine (synchronous, thread-safe: see docs/architecture.md) never blocks the event loop."""

from __future__ import annotations

import threading
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from jobledger.api import (
    console,
    problems,
    routes_approvals,
    routes_audit,
    routes_batches,
    routes_dead_letters,
    routes_erasures,
    routes_export,
    routes_inputs,
    routes_jobs,
    routes_live,
    routes_metrics,
    routes_repair,
    routes_replay,
    routes_resume,
    routes_schedules,
)
from jobledger.api.auth import Authenticator
from jobledger.api.batch_runner import BatchRunner
from jobledger.api.limits import BodyLimit, RateLimiter, RequestTimeout
from jobledger.api.live import LogBell
from jobledger.api.models import Health
from jobledger.api.paths import EncodedSlashes
from jobledger.api.problems import Problem
from jobledger.api.settings import ApiSettings
from jobledger.domain.errors import JobLedgerError
from jobledger.engine.engine import Engine
from jobledger.projections import JobViews

API_TITLE = "jobledger"
API_VERSION = "1"


def create_app(
    engine: Engine,
    settings: ApiSettings,
    *,
    authenticator: Authenticator | None = None,
    views: JobViews | None = None,
) -> FastAPI:
    """The API over ``engine``: everything under ``/v1``, plus ``/healthz``, ``/readyz``,
    ``/metrics`` (when the engine keeps metrics) and ``/openapi.json``. ``views``
    (default: the store's own) serve listings."""
    app = FastAPI(
        title=API_TITLE,
        version=API_VERSION,
        summary="A durable, event-sourced job engine: jobs, their inputs and their audit.",
        docs_url=None,
        redoc_url=None,
    )
    app.state.engine = engine
    app.state.settings = settings
    app.state.authenticator = authenticator or Authenticator.from_settings(settings)
    app.state.rate_limiter = RateLimiter(settings.rate_limit_per_minute, settings.rate_limit_burst)
    app.state.views = views if views is not None else JobViews(engine.deps.store)
    app.state.views_lock = threading.Lock()
    """One catch-up of the views at a time in this process (the others wait for it,
    then find nothing left to fold)."""
    app.state.live = LogBell(engine.deps.store, poll_interval=settings.sse_poll_seconds)
    """Follows the log for the event streams (started by the first; the server closes it)."""
    app.state.batches = BatchRunner(engine)
    """Runs batches in the background; those a dead process left unfinished start again."""
    app.state.batches.resume_unfinished()
    problems.install(app)
    for routes in (
        routes_jobs,
        routes_inputs,
        routes_repair,
        routes_approvals,
        routes_audit,
        routes_live,
        routes_resume,
        routes_export,
        routes_replay,
        routes_erasures,
        routes_schedules,
        routes_dead_letters,
        routes_batches,
    ):
        app.include_router(routes.router, prefix="/v1")
    app.include_router(routes_metrics.router)
    app.include_router(console.router())
    if engine.deps.metrics is not None:
        engine.deps.metrics.watch_status(app.state.views)
        engine.deps.metrics.watch_log_reader("views", app.state.views)
    _health(app)
    _document_400_not_422(app)
    # Outermost first: the timeout covers reading the body too.
    app.add_middleware(BodyLimit, max_bytes=settings.max_body_bytes)
    app.add_middleware(RequestTimeout, seconds=settings.request_timeout_seconds)
    app.add_middleware(EncodedSlashes)  # outermost: ids with "/" route as one segment
    return app


def _document_400_not_422(app: FastAPI) -> None:
    """FastAPI documents a 422 for every request it validates; this API answers an
    invalid request 400 (problem+json, as every other error), so the document says so."""
    build = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            document = build()
            for path in document.get("paths", {}).values():
                for operation in path.values():
                    responses = operation.get("responses", {})
                    if responses.get("422", {}).get("description") == "Validation Error":
                        del responses["422"]  # FastAPI's, not a 422 the route documents
            schemas = document.get("components", {}).get("schemas", {})
            for name in ("HTTPValidationError", "ValidationError"):
                schemas.pop(name, None)
            app.openapi_schema = document
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]


def _health(app: FastAPI) -> None:
    @app.get("/healthz", response_model=Health, tags=["health"])
    def healthz() -> Health:
        """The process is up (nothing else is checked)."""
        return Health(status="ok")

    @app.get(
        "/readyz",
        response_model=Health,
        tags=["health"],
        responses={503: {"description": "The store does not answer."}},
    )
    def readyz(request: Request) -> Health | JSONResponse:
        """The store answers (each partition's newest event and the views' position
        are read)."""
        views: JobViews = request.app.state.views
        try:
            views.lag()
        except JobLedgerError as error:
            detail = f"the store does not answer: {error}"
            return Problem(503, detail, error=type(error).__name__).response("/readyz")
        return Health(status="ok")
