"""Who is calling: a bearer JWT or an API key turned into a :class:`Principal`.

A JWT is checked against the configured key (HS256 with the shared secret, or RS256/ES256
with the JWKS key its ``kid`` names), issuer and audience, and must carry ``exp`` and
``sub``. An API key is looked up by its sha256 in the keys file, so the file holds no
usable secret. Either way the claims say which tenants (``"*"``: every tenant) and which
roles the caller has."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any

import jwt
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from jobledger.api.settings import ApiSettings
from jobledger.domain.errors import ConfigError

EVERY_TENANT = "*"
ASYMMETRIC = ("RS256", "ES256")


class Role(StrEnum):
    OPERATOR = "operator"
    """Submit, signal, cancel, raise a budget (and read what it operates on)."""
    APPROVER = "approver"
    """Decide approvals that list them (and read the jobs they decide on)."""
    AUDITOR = "auditor"
    """Read, verify, export, replay."""
    ADMIN = "admin"
    """Everything."""


@dataclass(frozen=True)
class Principal:
    """An authenticated caller: who, in which tenants, with which roles."""

    subject: str
    tenants: frozenset[str]
    roles: frozenset[Role]

    def sees(self, tenant_id: str) -> bool:
        return self.sees_every_tenant or tenant_id in self.tenants

    @property
    def sees_every_tenant(self) -> bool:
        return EVERY_TENANT in self.tenants

    def may(self, role: Role, tenant_id: str) -> bool:
        """Whether the caller acts as ``role`` in ``tenant_id`` (an admin acts as any)."""
        return self.sees(tenant_id) and (role in self.roles or Role.ADMIN in self.roles)

    def may_read(self, tenant_id: str) -> bool:
        """Every role reads the jobs of the tenants it sees."""
        return self.sees(tenant_id) and bool(self.roles)


class AuthenticationError(Exception):
    """The credential was refused; the message says why (never echoing the credential)."""


class _Claims(BaseModel):
    """What a JWT or an API key entry must say about its holder."""

    model_config = ConfigDict(extra="ignore")

    sub: str = Field(min_length=1, max_length=200)
    tenants: list[str] = Field(min_length=1)
    roles: list[Role] = Field(min_length=1)

    def principal(self) -> Principal:
        return Principal(self.sub, frozenset(self.tenants), frozenset(self.roles))


class ApiKey(BaseModel):
    """One entry of the API keys file."""

    model_config = ConfigDict(extra="forbid")

    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    subject: str = Field(min_length=1, max_length=200)
    tenants: list[str] = Field(min_length=1)
    roles: list[Role] = Field(min_length=1)


class ApiKeysFile(BaseModel):
    model_config = ConfigDict(extra="forbid")

    keys: list[ApiKey]


def key_sha256(key: str) -> str:
    """What the keys file stores for ``key``."""
    return hashlib.sha256(key.encode()).hexdigest()


class Authenticator:
    """Turns a presented credential into a Principal, or raises AuthenticationError.

    The API keys and the JWKS come from their files (``api_keys_file``, ``jwks_file``);
    :meth:`reload` reads them again (the server does on SIGHUP), so a key removed from
    its file stops working without a restart."""

    def __init__(
        self,
        *,
        secret: str | None = None,
        jwks: jwt.PyJWKSet | None = None,
        issuer: str | None = None,
        audience: str | None = None,
        leeway: float = 30.0,
        api_keys: Iterable[ApiKey] = (),
        api_keys_file: Path | None = None,
        jwks_file: Path | None = None,
    ) -> None:
        self.secret = secret
        self.leeway = leeway
        self.jwks = jwks
        self.issuer = issuer
        self.audience = audience
        self.api_keys: Mapping[str, ApiKey] = _by_sha256(api_keys)
        self.api_keys_file = api_keys_file
        self.jwks_file = jwks_file

    @classmethod
    def from_settings(cls, settings: ApiSettings) -> Authenticator:
        secret = settings.jwt_secret.get_secret_value() if settings.jwt_secret else None
        authenticator = cls(
            secret=secret,
            issuer=settings.jwt_issuer,
            audience=settings.jwt_audience,
            leeway=settings.jwt_leeway_seconds,
            api_keys_file=settings.api_keys_file,
            jwks_file=settings.jwks_file,
        )
        authenticator.reload()
        return authenticator

    def reload(self) -> None:
        """Read the key files again and swap them in (each request sees the old keys or the
        new, never a mix of one file). A file that cannot be read or is invalid raises
        ConfigError before anything is swapped: the keys in use are kept."""
        api_keys = _by_sha256(_read_keys(self.api_keys_file)) if self.api_keys_file else None
        jwks = _read_jwks(self.jwks_file) if self.jwks_file else None
        if api_keys is not None:
            self.api_keys = api_keys
        if jwks is not None:
            self.jwks = jwks

    @property
    def configured(self) -> bool:
        return self.secret is not None or self.jwks is not None or bool(self.api_keys)

    def authenticate(self, credential: str) -> Principal:
        return self.identify(credential)[0]

    def identify(self, credential: str) -> tuple[Principal, str | None]:
        """The caller, and the sha256 of the API key that proved it (None: a JWT)."""
        if _looks_like_jwt(credential) and (self.secret is not None or self.jwks is not None):
            return self._jwt(credential), None
        sha256 = key_sha256(credential)
        principal = self.key_holder(sha256)
        if principal is None:
            raise AuthenticationError("unknown credential")
        return principal, sha256

    def key_holder(self, sha256: str) -> Principal | None:
        """Whom the API key of this sha256 stands for, while its file lists it."""
        entry = self.api_keys.get(sha256)
        if entry is None:
            return None
        return Principal(entry.subject, frozenset(entry.tenants), frozenset(entry.roles))

    def _jwt(self, token: str) -> Principal:
        try:
            header = jwt.get_unverified_header(token)
            key, algorithm = self._key_for(header)
            claims = jwt.decode(
                token,
                key,
                algorithms=[algorithm],
                audience=self.audience,
                issuer=self.issuer,
                leeway=self.leeway,
                options={"require": ["exp", "iss", "aud", "sub"]},
            )
        except jwt.ExpiredSignatureError:
            raise AuthenticationError("the token has expired") from None
        except jwt.InvalidAudienceError:
            raise AuthenticationError("the token is for another audience") from None
        except jwt.InvalidIssuerError:
            raise AuthenticationError("the token is from another issuer") from None
        except jwt.MissingRequiredClaimError as error:
            raise AuthenticationError(f"the token lacks the {error.claim!r} claim") from None
        except jwt.InvalidSignatureError:
            raise AuthenticationError("the token's signature does not verify") from None
        except jwt.PyJWTError as error:
            raise AuthenticationError(f"the token is not valid: {error}") from None
        return _principal_of(claims)

    def _key_for(self, header: Mapping[str, Any]) -> tuple[Any, str]:
        """The key the token's header asks for, and the one algorithm it may use: an
        HS256 token is only checked with the secret and an RS256/ES256 one only with a
        JWKS key of that very algorithm (no algorithm confusion)."""
        algorithm = header.get("alg")
        if algorithm == "HS256" and self.secret is not None:
            return self.secret, algorithm
        if algorithm in ASYMMETRIC and self.jwks is not None:
            kid = header.get("kid")
            for key in self.jwks.keys:
                if key.key_id == kid and key.algorithm_name == algorithm:
                    return key.key, algorithm
            raise AuthenticationError(f"the token names an unknown key {kid!r}")
        raise AuthenticationError(f"tokens signed with {algorithm!r} are not accepted")


def _looks_like_jwt(credential: str) -> bool:
    return credential.count(".") == 2 and credential.startswith("eyJ")


def _principal_of(claims: Mapping[str, Any]) -> Principal:
    """``tenants`` (a list, or ``"*"``) or a single ``tenant``; ``roles`` (a list, or one
    space-separated string, as OAuth scopes are written)."""
    tenants = claims.get("tenants", claims.get("tenant"))
    roles = claims.get("roles")
    try:
        return _Claims.model_validate(
            {
                "sub": claims.get("sub"),
                "tenants": [tenants] if isinstance(tenants, str) else tenants,
                "roles": roles.split() if isinstance(roles, str) else roles,
            }
        ).principal()
    except ValidationError as error:
        fields = sorted({str(detail["loc"][0]) for detail in error.errors()})
        raise AuthenticationError(f"the token's {', '.join(fields)} claims are invalid") from None


def _read_jwks(path: Path) -> jwt.PyJWKSet:
    try:
        jwks = jwt.PyJWKSet.from_json(path.read_text(encoding="utf-8"))
    except OSError as error:
        raise ConfigError(f"cannot read JWKS file {str(path)!r}: {error.strerror}") from None
    except (jwt.PyJWKSetError, jwt.PyJWKError, ValueError) as error:
        raise ConfigError(f"JWKS file {str(path)!r} is not usable: {error}") from None
    unusable = [key.key_id for key in jwks.keys if key.algorithm_name not in ASYMMETRIC]
    if unusable:
        raise ConfigError(
            f"JWKS file {str(path)!r}: keys {unusable} are not RS256 or ES256 (set their alg)"
        )
    return jwks


def _by_sha256(api_keys: Iterable[ApiKey]) -> dict[str, ApiKey]:
    return {entry.sha256: entry for entry in api_keys}


def _read_keys(path: Path) -> list[ApiKey]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        return ApiKeysFile.model_validate(data).keys
    except OSError as error:
        raise ConfigError(f"cannot read API keys file {str(path)!r}: {error.strerror}") from None
    except json.JSONDecodeError as error:
        raise ConfigError(f"API keys file {str(path)!r} is not JSON: {error.msg}") from None
    except ValidationError as error:
        first = error.errors()[0]
        where = ".".join(str(part) for part in first["loc"])
        raise ConfigError(f"API keys file {str(path)!r}: {where}: {first['msg']}") from None
