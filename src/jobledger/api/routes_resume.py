"""``POST /v1/resume``: the resume token as a callback URL for outside systems.

The token is the whole credential, and it is good for one thing: resuming the one wait
it was issued for, once. No API key or JWT is asked for, and the token opens nothing
else (the other endpoints refuse it as a bearer credential). It comes as
``Authorization: Bearer <token>`` or as ``token`` in the body; the engine checks it
(signature, expiry, the wait it names, its nonce not yet used) and consumes its nonce in
the same append as the resume, so a replayed, expired or forged token is a problem with
the engine's error type and changes nothing. The answer says only what became of the
job (its status and version): a token does not read the job's data."""

from __future__ import annotations

import hashlib
from typing import Any

from fastapi import APIRouter, Request
from pydantic import BaseModel, Field

from jobledger.api.deps import EngineDep, credential_of
from jobledger.api.limits import RateLimiter
from jobledger.api.models import Body
from jobledger.api.problems import EVERY_REQUEST, Problem, documented

router = APIRouter(tags=["inputs"], responses=EVERY_REQUEST)


class ResumeRequest(Body):
    token: str | None = Field(default=None, min_length=1, max_length=8192)
    """The resume token, when it is not the bearer credential."""
    payload: dict[str, Any] | None = None
    """What the job resumes with (the event's data)."""


class ResumeResult(BaseModel):
    tenant_id: str
    job_id: str
    status: str
    version: int


REFUSALS = documented(409)
"""401: forged or expired (InvalidTokenError, ExpiredTokenError); 409: used
(TokenReplayedError), superseded or not the open wait (TokenMismatchError), or the job
finished."""


@router.post("/resume", response_model=ResumeResult, responses=REFUSALS)
def resume(request: Request, engine: EngineDep, body: ResumeRequest | None = None) -> ResumeResult:
    """Resume the job the token was issued for, with ``payload`` (a body is optional
    when the token is the bearer credential)."""
    body = body if body is not None else ResumeRequest()
    token = _token(credential_of(request), body.token)
    # Limited per token, as any credential: a flood of forgeries costs one bucket each.
    limiter: RateLimiter = request.app.state.rate_limiter
    limiter.take(hashlib.sha256(token.encode()).hexdigest())
    job = engine.resume(token, body.payload or {})
    return ResumeResult(
        tenant_id=job.tenant_id, job_id=job.job_id, status=job.status, version=job.version
    )


def _token(bearer: str | None, in_body: str | None) -> str:
    if bearer is not None and in_body is not None and bearer != in_body:
        raise Problem(400, "two different resume tokens: send one", error="InvalidRequest")
    token = bearer or in_body
    if token is None:
        raise Problem(
            401,
            "a resume token is required: Authorization: Bearer <token>, or token in the body",
            error="InvalidTokenError",
            headers={"WWW-Authenticate": "Bearer"},
        )
    return token
