"""``GET /metrics``: the process's Prometheus metrics, for a caller that sees every tenant.

Not open like ``/healthz``: the figures span every tenant (and name tenants when the
tenant label is on), so the scraper authenticates as any other caller, with a credential
whose tenants are ``*`` (an API key in Prometheus's ``authorization`` block). A scraper
that cannot authenticate uses ``--metrics-port`` instead, on a network only it reaches.
"""

from __future__ import annotations

from fastapi import APIRouter, Request, Response

from jobledger.api.deps import Caller, EngineDep
from jobledger.api.problems import EVERY_REQUEST, Problem, text_body

router = APIRouter(tags=["metrics"], responses=EVERY_REQUEST)

MEDIA_TYPE = "text/plain; version=0.0.4; charset=utf-8"
SCRAPED = text_body(
    "text/plain", "The Prometheus text exposition format (docs/metrics.md).", 403, 404
)


@router.get("/metrics", response_class=Response, responses=SCRAPED)
def metrics(request: Request, caller: Caller, engine: EngineDep) -> Response:
    """Every metric of this process (any role, but only for a caller of every tenant)."""
    if not caller.sees_every_tenant:
        raise Problem(
            403,
            f"{caller.subject!r} does not see every tenant: metrics span them all",
            error="Forbidden",
        )
    kept = engine.deps.metrics
    if kept is None:
        raise Problem(
            404,
            "this process keeps no metrics",
            error="MetricsOff",
        )
    return Response(kept.render(), media_type=MEDIA_TYPE)
