"""Resume tokens as JWTs signed with pyjwt; only the nonce and a hash are ever stored."""

from __future__ import annotations

import hashlib
import secrets
from datetime import datetime, timedelta

import jwt

from jobledger.ports import IssuedToken
from jobledger.views import JobView


class JwtResumeTokens:
    def __init__(
        self,
        *,
        secret: str,
        key_id: str,
        ttl_seconds: int,
        issuer: str,
        audience: str,
        algorithm: str = "HS256",
    ) -> None:
        self.secret = secret
        self.key_id = key_id
        self.ttl = timedelta(seconds=ttl_seconds)
        self.issuer = issuer
        self.audience = audience
        self.algorithm = algorithm

    def issue(
        self, job: JobView, *, step_number: int, event_name: str, now: datetime
    ) -> IssuedToken:
        nonce = secrets.token_hex(16)
        expires_at = now + self.ttl
        claims = {
            "iss": self.issuer,
            "aud": self.audience,
            "sub": f"{job.tenant_id}/{job.job_id}",
            "tid": job.tenant_id,
            "job": job.job_id,
            "step": step_number,
            "evt": event_name,
            "wfv": job.workflow_version,
            "jti": nonce,
            "iat": int(now.timestamp()),
            "exp": int(expires_at.timestamp()),
        }
        token = jwt.encode(
            claims, self.secret, algorithm=self.algorithm, headers={"kid": self.key_id}
        )
        return IssuedToken(
            token=token,
            nonce=nonce,
            token_sha256=hashlib.sha256(token.encode()).hexdigest(),
            expires_at=expires_at,
        )
