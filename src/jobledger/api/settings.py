"""The API's settings: one pydantic model, ``JOBLEDGER_HTTP_*`` variables, or the
``[http]`` table of jobledger.toml (the CLI decides the precedence: flag > env > file >
default, as for every other setting)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import Field, SecretStr, ValidationError, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from jobledger.domain.errors import ConfigError
from jobledger.domain.setting_problems import setting_problem

ENV_PREFIX = "JOBLEDGER_HTTP_"
PATHS = ("jwks_file", "api_keys_file")
"""Settings that name files: relative to the config file that names them."""


class ApiSettings(BaseSettings):
    """Where the API listens, who may call it and how much."""

    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, extra="forbid", frozen=True)

    host: str = "127.0.0.1"
    """Loopback by default: exposing the API is a decision, not an accident."""
    port: int = Field(default=8080, ge=0, le=65535)

    # ---- authentication: a bearer JWT or an API key ----------------------------------
    jwt_secret: SecretStr | None = Field(default=None, min_length=32)
    """HS256 key of bearer JWTs (>= 32 bytes, RFC 7518 3.2)."""
    jwks_file: Path | None = None
    """A JWKS (JSON) file of RS256/ES256 public keys; a token names its key by ``kid``."""
    jwt_issuer: str | None = None
    """Required ``iss`` of every JWT (required when JWTs are accepted)."""
    jwt_audience: str | None = None
    """Required ``aud`` of every JWT (required when JWTs are accepted)."""
    jwt_leeway_seconds: float = Field(default=30.0, ge=0, le=300)
    """Clock skew allowed on a JWT's ``exp``, ``nbf`` and ``iat``: an issuer's clock a few
    seconds ahead must not refuse its fresh tokens (RFC 7519 4.1.4 allows "some small leeway")."""
    api_keys_file: Path | None = None
    """A JSON file of API keys, each stored as the sha256 of the key (never the key),
    with the subject, tenants and roles it stands for."""

    # ---- limits ----------------------------------------------------------------------
    max_body_bytes: int = Field(default=1024 * 1024, ge=1)
    """Larger request bodies are refused (413) before they are read whole."""
    rate_limit_per_minute: int = Field(default=600, ge=0)
    """Requests per credential per minute (a token bucket; 0 turns the limit off)."""
    rate_limit_burst: int = Field(default=60, ge=1)
    """How many requests a credential may send at once before the rate applies."""
    request_timeout_seconds: float = Field(default=30.0, gt=0)
    """How long a request may take to start its response (503 after that)."""
    keep_alive_seconds: int = Field(default=5, ge=1)
    """A connection with no request under way (none yet, between requests, or one whose
    head has not all arrived) is closed after this long."""
    max_connections: int | None = Field(default=None, ge=1)
    """At most this many open connections: past it a new one closes the longest idle one,
    or is refused (503) when none is idle. Default: half the process's open-file limit."""

    # ---- the console's session -------------------------------------------------------
    cookie_secure: bool = False
    """Mark the console's session cookie Secure (set it when served over TLS)."""
    session_secret: SecretStr | None = Field(default=None, min_length=32)
    """Signs the console's session cookies (a random one per process when unset)."""

    # ---- live updates (Server-Sent Events) -----------------------------------------------
    sse_heartbeat_seconds: float = Field(default=15.0, gt=0)
    """A comment line on a quiet event stream this often (keeps proxies from closing it)."""
    sse_poll_seconds: float = Field(default=0.2, gt=0)
    """How often the event streams look for new events on SQLite (PostgreSQL wakes them
    with LISTEN/NOTIFY; this is only its fallback there)."""

    @model_validator(mode="after")
    def _jwt_needs_issuer_and_audience(self) -> ApiSettings:
        if (self.jwt_secret is not None or self.jwks_file is not None) and (
            self.jwt_issuer is None or self.jwt_audience is None
        ):
            raise ValueError("JWTs need both jwt_issuer and jwt_audience to check them against")
        return self


def load_api_settings(
    table: Mapping[str, Any], config_file: Path | None = None, **flags: Any
) -> ApiSettings:
    """The API's settings, highest first: ``flags`` (not None), ``JOBLEDGER_HTTP_*``
    variables, the config file's ``[http]`` table, the defaults. Every problem is named
    in one ConfigError."""
    in_env = {name for name in ApiSettings.model_fields if os.environ.get(env_name(name))}
    values = {name: value for name, value in table.items() if name not in in_env}
    for name in PATHS:
        if isinstance(values.get(name), str) and config_file is not None:
            values[name] = config_file.parent / values[name]
    values |= {name: value for name, value in flags.items() if value is not None}
    try:
        return ApiSettings(**values)
    except ValidationError as error:
        where = f"[http] of {str(config_file)!r}" if config_file is not None else "settings"
        known = ApiSettings.model_fields
        problems = "; ".join(setting_problem(detail, known) for detail in error.errors())
        raise ConfigError(f"invalid HTTP {where} (or {ENV_PREFIX}* variable): {problems}") from None


def env_name(setting: str) -> str:
    return f"{ENV_PREFIX}{setting.upper()}"
