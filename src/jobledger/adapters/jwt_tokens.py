"""Resume tokens as JWTs signed with pyjwt; only the nonce and a hash are ever stored."""

from __future__ import annotations

import hashlib
import json
import secrets
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from typing import Annotated, Any

import jwt
from pydantic import BaseModel, ConfigDict, Field, StrictInt, StrictStr, ValidationError

from jobledger.domain.errors import ExpiredTokenError, InvalidTokenError
from jobledger.domain.steps import IssuedToken
from jobledger.domain.views import JobView
from jobledger.orchestration.ports import TokenClaims

REQUIRED_CLAIMS = ["iss", "aud", "exp", "iat", "jti", "tid", "job", "step", "evt", "wfv"]
MAX_TOKEN_LENGTH = 4096
"""Ours are about 400 characters; anything far longer is not one of them."""
_LAST_MOMENT = 253_402_300_799
"""9999-12-31T23:59:59Z, the last second a datetime can hold."""


class _Claims(BaseModel):
    """The claims a genuine token carries, with their types: a correctly signed token
    holding anything else (a key that signed a bad payload) is refused, not crashed on."""

    model_config = ConfigDict(extra="ignore", strict=True)

    tid: StrictStr
    job: StrictStr
    step: StrictInt
    evt: StrictStr
    wfv: StrictInt
    jti: StrictStr
    exp: Annotated[StrictInt, Field(ge=0, le=_LAST_MOMENT)]


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
        claims = _typed(self._decode(token))
        expires_at = datetime.fromtimestamp(claims.exp, UTC)
        # Expiry is judged on the engine's clock, not the host's, so fake clocks and
        # replays agree with production.
        if expires_at <= now:
            raise ExpiredTokenError(f"resume token expired at {expires_at.isoformat()}")
        return TokenClaims(
            tenant_id=claims.tid,
            job_id=claims.job,
            step_number=claims.step,
            event_name=claims.evt,
            workflow_version=claims.wfv,
            nonce=claims.jti,
            expires_at=expires_at,
        )

    def _decode(self, token: str) -> dict[str, Any]:
        if len(token) > MAX_TOKEN_LENGTH:
            raise InvalidTokenError(
                f"resume token is {len(token)} characters, over the limit of {MAX_TOKEN_LENGTH}"
            )
        header = _header(token)
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
        except jwt.DecodeError as error:
            raise InvalidTokenError(f"resume token is malformed: {error}") from None
        except jwt.PyJWTError as error:
            raise InvalidTokenError(f"resume token rejected: {error}") from None
        return decoded


def _header(token: str) -> dict[str, Any]:
    """The token's header, read only to choose the key: ``jwt.decode`` then checks the
    whole token, this header included, so the token is parsed once on the way, not twice
    (``jwt.get_unverified_header`` would parse every segment a first time)."""
    segments = token.split(".")
    if len(segments) != 3:
        raise InvalidTokenError("resume token is malformed: not three segments")
    try:
        header = json.loads(jwt.utils.base64url_decode(segments[0]))
    except RecursionError:
        # A header nested thousands deep makes the JSON parser recurse out.
        raise InvalidTokenError("resume token is malformed: nested too deep") from None
    except ValueError:  # not base64url, not UTF-8, not JSON
        raise InvalidTokenError("resume token is malformed: its header does not decode") from None
    if not isinstance(header, dict):
        raise InvalidTokenError("resume token is malformed: its header is not an object")
    return header


def _typed(claims: dict[str, Any]) -> _Claims:
    try:
        return _Claims.model_validate(claims)
    except ValidationError as error:
        problems = "; ".join(_claim_problem(detail) for detail in error.errors())
        raise InvalidTokenError(f"resume token claims are invalid: {problems}") from None


def _claim_problem(detail: Any) -> str:
    name = ".".join(str(part) for part in detail["loc"])
    kind = detail["type"]
    if kind == "missing":
        return f"{name}: required"
    if kind == "less_than_equal":
        return f"{name}: must be at most {detail['ctx']['le']}"
    if kind == "greater_than_equal":
        return f"{name}: must be at least {detail['ctx']['ge']}"
    what = "an integer" if kind.startswith("int") else "a string"
    return f"{name}: must be {what}"
