"""The dependencies every endpoint shares: the authenticated caller and the tenant scope.

``principal`` reads ``Authorization: Bearer <JWT or API key>``, spends one request of
that credential's rate, and authenticates it. ``tenant_scope`` is the one rule of who
sees what: a tenant the caller cannot see is answered exactly as a job that does not
exist (404, the same words), so ids do not leak; a tenant it sees, without the role the
operation needs, is 403."""

from __future__ import annotations

import hashlib
from typing import Annotated

from fastapi import Depends, Request

from jobledger.api.auth import AuthenticationError, Authenticator, Principal, Role
from jobledger.api.limits import RateLimiter
from jobledger.api.problems import Problem
from jobledger.engine.engine import Engine

BEARER = "bearer"


def engine(request: Request) -> Engine:
    found: Engine = request.app.state.engine
    return found


def credential_of(request: Request) -> str | None:
    """The bearer credential of the request, if any (the console also reads a cookie)."""
    header = request.headers.get("authorization")
    if header is None:
        return None
    scheme, _, value = header.partition(" ")
    value = value.strip()
    return value if scheme.lower() == BEARER and value else None


def principal(request: Request) -> Principal:
    """The authenticated caller, or the 401 problem (429 when over its rate)."""
    credential = credential_of(request)
    spend_rate(request, credential)
    if credential is None:
        raise _unauthorised("credentials are required: Authorization: Bearer <token or key>")
    authenticator: Authenticator = request.app.state.authenticator
    try:
        return authenticator.authenticate(credential)
    except AuthenticationError as error:
        raise _unauthorised(str(error)) from None


def spend_rate(request: Request, credential: str | None) -> None:
    """Spend one request of the credential's rate, or without one of the client address's;
    raise the 429 problem when none is left (the console's sign-in spends from both)."""
    limiter: RateLimiter = request.app.state.rate_limiter
    if credential is None:
        host = request.client.host if request.client is not None else "unknown"
        limiter.take(f"anonymous:{host}")
        return
    # The rate is per credential, checked before it is verified: a flood of forged
    # tokens is limited too (each distinct forgery is its own bucket, and so is cheap).
    limiter.take(hashlib.sha256(credential.encode()).hexdigest())


def _unauthorised(detail: str) -> Problem:
    return Problem(401, detail, error="AuthenticationError", headers={"WWW-Authenticate": "Bearer"})


def no_job(tenant_id: str, job_id: str) -> Problem:
    """The 404 of a job that does not exist, word for word the engine's UnknownJobError."""
    return Problem(404, f"no job {job_id!r} for tenant {tenant_id!r}", error="UnknownJobError")


def tenant_scope(
    who: Principal, tenant_id: str, role: Role | None, *, job_id: str | None = None
) -> None:
    """Raise the 404 problem unless ``who`` sees ``tenant_id``, then the 403 problem
    unless it acts as ``role`` there (``None``: any role reads)."""
    if not who.sees(tenant_id):
        if job_id is not None:
            raise no_job(tenant_id, job_id)
        raise Problem(404, f"no tenant {tenant_id!r}", error="UnknownTenant")
    allowed = who.may_read(tenant_id) if role is None else who.may(role, tenant_id)
    if not allowed:
        needs = "any role" if role is None else f"the {role} role"
        raise Problem(
            403, f"{who.subject!r} lacks {needs} in tenant {tenant_id!r}", error="Forbidden"
        )


Caller = Annotated[Principal, Depends(principal)]
EngineDep = Annotated[Engine, Depends(engine)]
