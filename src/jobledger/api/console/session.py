"""The console's session: the Principal a credential proved, in a signed cookie.

The credential itself (an API key or a JWT) is checked once, at sign-in, by the API's
Authenticator and never stored: the cookie holds only who signed in, what they may do, a
CSRF token and an expiry, signed with HMAC-SHA256 under the API's session secret. A
cookie that was changed, or signed under another secret, or expired, is no session.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import secrets
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from jobledger.api.auth import Principal, Role

COOKIE = "jobledger_console"
PRE_SIGN_IN_COOKIE = "jobledger_console_csrf"
"""Before sign-in there is no session to hold the CSRF token: the sign-in form's token
rides in its own short-lived signed cookie (double submit)."""
LIFETIME = timedelta(hours=8)


@dataclass(frozen=True)
class Session:
    principal: Principal
    csrf: str
    expires_at: datetime

    def csrf_matches(self, submitted: str | None) -> bool:
        return submitted is not None and hmac.compare_digest(self.csrf, submitted)


class _Signed(BaseModel):
    """What a signed cookie holds (its signature checked first)."""

    model_config = ConfigDict(extra="forbid")

    csrf: str = Field(min_length=1)
    exp: int


class _SessionBody(_Signed):
    sub: str = Field(min_length=1)
    tenants: list[str]
    roles: list[Role]


Body = TypeVar("Body", bound=_Signed)


class SessionCodec:
    """Signs and reads the session and pre-sign-in cookies."""

    def __init__(self, secret: bytes) -> None:
        if len(secret) < 32:
            raise ValueError("the console's session secret must be at least 32 bytes")
        self._secret = secret

    def new(self, principal: Principal, now: datetime) -> Session:
        """A session for ``principal`` that ends after LIFETIME."""
        return Session(principal, secrets.token_urlsafe(32), now + LIFETIME)

    def encode(self, session: Session) -> str:
        p = session.principal
        return self._sign(
            {
                "sub": p.subject,
                "tenants": sorted(p.tenants),
                "roles": sorted(str(role) for role in p.roles),
                "csrf": session.csrf,
                "exp": int(session.expires_at.timestamp()),
            }
        )

    def decode(self, cookie: str | None, now: datetime) -> Session | None:
        body = self._verified(cookie, _SessionBody, now)
        if body is None:
            return None
        principal = Principal(body.sub, frozenset(body.tenants), frozenset(body.roles))
        return Session(principal, body.csrf, datetime.fromtimestamp(body.exp, now.tzinfo))

    def pre_sign_in(self, now: datetime) -> tuple[str, str]:
        """A CSRF token for the sign-in form and the signed cookie that vouches for it."""
        token = secrets.token_urlsafe(32)
        cookie = self._sign({"csrf": token, "exp": int((now + timedelta(hours=1)).timestamp())})
        return token, cookie

    def pre_sign_in_matches(self, cookie: str | None, submitted: str | None, now: datetime) -> bool:
        body = self._verified(cookie, _Signed, now)
        return (
            body is not None and submitted is not None and hmac.compare_digest(body.csrf, submitted)
        )

    def _sign(self, body: dict[str, object]) -> str:
        payload = _b64(json.dumps(body, separators=(",", ":"), sort_keys=True).encode())
        return f"{payload}.{self._mac(payload)}"

    def _verified(self, cookie: str | None, shape: type[Body], now: datetime) -> Body | None:
        """The cookie's body if its signature holds, it has ``shape`` and has not expired."""
        if not cookie or cookie.count(".") != 1:
            return None
        payload, mac = cookie.split(".")
        if not hmac.compare_digest(mac, self._mac(payload)):
            return None
        try:
            raw = base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4))
            body = shape.model_validate_json(raw)
        except (ValueError, ValidationError):
            return None
        return body if body.exp > now.timestamp() else None

    def _mac(self, payload: str) -> str:
        digest = hmac.new(self._secret, payload.encode(), hashlib.sha256).digest()
        return _b64(digest)


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).decode().rstrip("=")
