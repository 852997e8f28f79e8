"""The console's sessions: kept by the serving process, named by a signed cookie.

The credential itself (an API key or a JWT) is checked once, at sign-in, by the API's
Authenticator and never stored. The server keeps each session (who signed in, what they
may do, a CSRF token, an expiry and, for an API key, its sha256); the cookie holds only
the session's random id and expiry, signed with HMAC-SHA256 under the API's session
secret. Signing out ends the session here, so a copy of the cookie is no session either;
a cookie that was changed, or signed under another secret, or expired, is none.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import secrets
import threading
from collections import OrderedDict
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from jobledger.api.auth import Principal

COOKIE = "jobledger_console"
PRE_SIGN_IN_COOKIE = "jobledger_console_csrf"
"""Before sign-in there is no session to hold the CSRF token: the sign-in form's token
rides in its own short-lived signed cookie (double submit)."""
LIFETIME = timedelta(hours=8)


MAX_SESSIONS = 100_000
"""Sessions kept at once; past it the oldest end first (sign-in is rate-limited, so only
a long run of real sign-ins gets there)."""


@dataclass(frozen=True)
class Session:
    id: str
    principal: Principal
    csrf: str
    expires_at: datetime
    api_key: str | None = None
    """The sha256 of the API key it was signed in with (None: a JWT): the session lasts
    only while the keys file lists that key, and its roles are the key's as listed now."""

    def csrf_matches(self, submitted: str | None) -> bool:
        return submitted is not None and hmac.compare_digest(self.csrf, submitted)


class Sessions:
    """The live sessions of this process, oldest first. Thread-safe: the handlers run on
    the server's thread pool."""

    def __init__(self) -> None:
        self._live: OrderedDict[str, Session] = OrderedDict()
        self._lock = threading.Lock()

    def start(self, principal: Principal, now: datetime, api_key: str | None = None) -> Session:
        """A session for ``principal`` that ends after LIFETIME (or at sign-out)."""
        session = Session(
            secrets.token_urlsafe(32), principal, secrets.token_urlsafe(32), now + LIFETIME, api_key
        )
        with self._lock:
            # Every session lasts LIFETIME: the oldest are the first to expire.
            while self._live and next(iter(self._live.values())).expires_at <= now:
                self._live.popitem(last=False)
            self._live[session.id] = session
            while len(self._live) > MAX_SESSIONS:
                self._live.popitem(last=False)
        return session

    def get(self, session_id: str | None, now: datetime) -> Session | None:
        if session_id is None:
            return None
        with self._lock:
            session = self._live.get(session_id)
            if session is not None and session.expires_at <= now:
                del self._live[session_id]
                return None
        return session

    def end(self, session_id: str) -> None:
        with self._lock:
            self._live.pop(session_id, None)


class _Signed(BaseModel):
    """What a signed cookie holds (its signature checked first)."""

    model_config = ConfigDict(extra="forbid")

    exp: int


class _PreSignIn(_Signed):
    csrf: str = Field(min_length=1)


class _SessionRef(_Signed):
    sid: str = Field(min_length=1)


Body = TypeVar("Body", bound=_Signed)


class SessionCodec:
    """Signs and reads the session and pre-sign-in cookies."""

    def __init__(self, secret: bytes) -> None:
        if len(secret) < 32:
            raise ValueError("the console's session secret must be at least 32 bytes")
        self._secret = secret

    def encode(self, session: Session) -> str:
        return self._sign({"sid": session.id, "exp": int(session.expires_at.timestamp())})

    def session_id(self, cookie: str | None, now: datetime) -> str | None:
        """The id of the session the cookie names, if its signature holds and it has not
        expired (whether the session still lives is :class:`Sessions`' to say)."""
        body = self._verified(cookie, _SessionRef, now)
        return body.sid if body is not None else None

    def pre_sign_in(self, now: datetime) -> tuple[str, str]:
        """A CSRF token for the sign-in form and the signed cookie that vouches for it."""
        token = secrets.token_urlsafe(32)
        cookie = self._sign({"csrf": token, "exp": int((now + timedelta(hours=1)).timestamp())})
        return token, cookie

    def pre_sign_in_matches(self, cookie: str | None, submitted: str | None, now: datetime) -> bool:
        body = self._verified(cookie, _PreSignIn, now)
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
