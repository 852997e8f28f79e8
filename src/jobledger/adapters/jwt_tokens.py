"""Resume tokens as JWTs signed with pyjwt; only the nonce and a hash are ever stored."""

from __future__ import annotations

import hashlib
import secrets
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

import jwt

from jobledger.errors import ExpiredTokenError, InvalidTokenError
from jobledger.ports import IssuedToken, TokenClaims
from jobledger.views import JobView

REQUIRED_CLAIMS = ["iss", "aud", "exp", "iat", "jti", "tid", "job", "step", "evt", "wfv"]


class JwtResumeTokens:
    """Signs with the current key; verifies with it or any retired key still listed, so
    keys rotate without voiding the tokens already handed out."""

    def __init__(
        self,
        *,
        secret: str,
        key_id: str,
        ttl_seconds: int,
        issuer: str,
        audience: str,
        previous_keys: Mapping[str, str] | None = None,
        algorithm: str = "HS256",
    ) -> None:
        self.key_id = key_id
        self.keys = {**(previous_keys or {}), key_id: secret}
        self.ttl = timedelta(seconds=ttl_seconds)
        self.issuer = issuer
        self.audience = audience
        self.algorithm = algorithm

    def issue(
        self,
        job: JobView,
        *,
        step_number: int,
        event_name: str,
        now: datetime,
        lasts_until: datetime | None = None,
    ) -> IssuedToken:
        nonce = secrets.token_hex(16)
        # A token must not die before its wait does (a 7-day wait with a 24 h token
        # would strand the job); a long time to live is still a floor.
        expires_at = max(now + self.ttl, lasts_until or now)
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
            claims,
            self.keys[self.key_id],
            algorithm=self.algorithm,
            headers={"kid": self.key_id},
        )
        return IssuedToken(
            token=token,
            nonce=nonce,
            token_sha256=hashlib.sha256(token.encode()).hexdigest(),
            expires_at=expires_at,
        )

    def verify(self, token: str, *, now: datetime) -> TokenClaims:
        claims = self._decode(token)
        expires_at = datetime.fromtimestamp(claims["exp"], UTC)
        # Expiry is judged on the engine's clock, not the host's, so fake clocks and
        # replays agree with production.
        if expires_at <= now:
            raise ExpiredTokenError(f"resume token expired at {expires_at.isoformat()}")
        return TokenClaims(
            tenant_id=str(claims["tid"]),
            job_id=str(claims["job"]),
            step_number=int(claims["step"]),
            event_name=str(claims["evt"]),
            workflow_version=int(claims["wfv"]),
            nonce=str(claims["jti"]),
            expires_at=expires_at,
        )

    def _decode(self, token: str) -> dict[str, Any]:
        try:
            header = jwt.get_unverified_header(token)
        except jwt.PyJWTError as error:
            raise InvalidTokenError(f"resume token is malformed: {error}") from None
        key = self.keys.get(str(header.get("kid")))
        if key is None:
            raise InvalidTokenError(f"resume token names an unknown key id {header.get('kid')!r}")
        try:
            decoded: dict[str, Any] = jwt.decode(
                token,
                key,
                algorithms=[self.algorithm],
                audience=self.audience,
                issuer=self.issuer,
                options={"require": REQUIRED_CLAIMS, "verify_exp": False},
            )
        except jwt.InvalidSignatureError:
            raise InvalidTokenError("resume token signature does not verify") from None
        except jwt.PyJWTError as error:
            raise InvalidTokenError(f"resume token rejected: {error}") from None
        return decoded
