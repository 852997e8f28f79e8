"""Signed events: the Ed25519 signer a writer signs each event's chain hash with, and the
keyring of published public keys that verify checks the signatures against.

A writer holds a list of signing keys, each valid in a window ``[not_before, not_after)``
(``not_after`` open when null), so keys rotate without a gap: the old key's ``not_after``
is the new key's ``not_before``. An event is signed by the key valid at the event's own
time, and a signature counts only when the key was valid at that time: a key leaked after
its retirement cannot sign events dated later (backdated ones are what anchors catch).

The signed message (``docs/evidence-format.md``) is
``b"jobledger.event/1\\n" + key_id + b"\\n" + chain_hash``; the signature is base64url
without padding. Two files: the signing-keys file (JSON, a list of ``{id,
private_key_file, not_before, not_after}``; private keys in PEM PKCS8 files named relative
to it) and the keyring (``{"format": "jobledger.keyring/1", "keys": [{id, algorithm,
public_key, not_before, not_after}]}``, public keys as base64url of the raw 32 bytes).
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import (
    Ed25519PrivateKey,
    Ed25519PublicKey,
)

from jobledger.domain.errors import ConfigError, DeploymentError

MESSAGE_PREFIX = b"jobledger.event/1\n"
KEYRING_FORMAT = "jobledger.keyring/1"
ALGORITHM = "ed25519"


class SigningKeyError(DeploymentError):
    """No signing key is valid at the time of the event to sign: this writer cannot write
    (a deployment problem, never the job's: a worker leaves the job as it is, and a
    command exits 3), until it is given a key for now."""


def message(key_id: str, chain_hash: str) -> bytes:
    """What is signed: the key id is inside, so a signature cannot be passed off as
    another key's."""
    return MESSAGE_PREFIX + key_id.encode() + b"\n" + chain_hash.encode()


def b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def from_b64url(text: str) -> bytes:
    """Base64url with or without padding; anything else raises ValueError."""
    if not isinstance(text, str) or not text.isascii() or "=" in text.rstrip("="):
        raise ValueError("not base64url")
    try:
        return base64.urlsafe_b64decode(text.rstrip("=") + "=" * (-len(text) % 4))
    except (binascii.Error, ValueError):
        raise ValueError("not base64url") from None


def utc(moment: datetime) -> datetime:
    """A time without a zone is UTC (as everywhere in jobledger)."""
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)


@dataclass(frozen=True)
class Window:
    """When a key is valid: from ``not_before`` (included) to ``not_after`` (excluded;
    None: no end yet)."""

    not_before: datetime
    not_after: datetime | None = None

    def __post_init__(self) -> None:
        if self.not_after is not None and utc(self.not_after) <= utc(self.not_before):
            raise ValueError(f"not_after must be later than not_before ({self})")

    def contains(self, at: datetime) -> bool:
        at = utc(at)
        return utc(self.not_before) <= at and (self.not_after is None or at < utc(self.not_after))

    def __str__(self) -> str:
        end = self.not_after.isoformat() if self.not_after is not None else "no end"
        return f"from {self.not_before.isoformat()} until {end}"


@dataclass(frozen=True)
class SigningKey:
    id: str
    private_key: Ed25519PrivateKey
    window: Window


@dataclass(frozen=True)
class PublicKey:
    id: str
    public_key: Ed25519PublicKey
    window: Window

    def entry(self) -> dict[str, Any]:
        """The key as a keyring file lists it."""
        raw = self.public_key.public_bytes(
            serialization.Encoding.Raw, serialization.PublicFormat.Raw
        )
        return {
            "id": self.id,
            "algorithm": ALGORITHM,
            "public_key": b64url(raw),
            "not_before": self.window.not_before.isoformat(),
            "not_after": None
            if self.window.not_after is None
            else self.window.not_after.isoformat(),
        }


class Ed25519Signer:
    """Signs chain hashes with the key valid at the event's time (the ``EventSigner``
    port). Where windows overlap, the key that became valid last signs."""

    def __init__(self, keys: Sequence[SigningKey]) -> None:
        if not keys:
            raise ConfigError("a signer needs at least one signing key")
        _refuse_duplicates(key.id for key in keys)
        self._keys = sorted(keys, key=lambda key: utc(key.window.not_before), reverse=True)

    @property
    def keys(self) -> list[SigningKey]:
        return list(self._keys)

    def key_at(self, at: datetime) -> SigningKey:
        for key in self._keys:
            if key.window.contains(at):
                return key
        windows = "; ".join(f"{key.id!r} {key.window}" for key in self._keys)
        raise SigningKeyError(
            f"no signing key is valid at {utc(at).isoformat()} (the keys: {windows}); "
            "add a key whose window covers it (jobledger keys generate)"
        )

    def sign(self, chain_hash: str, at: datetime) -> tuple[str, str]:
        key = self.key_at(at)
        return key.id, b64url(key.private_key.sign(message(key.id, chain_hash)))

    def public_keys(self) -> list[PublicKey]:
        return [PublicKey(k.id, k.private_key.public_key(), k.window) for k in self._keys]

    @classmethod
    def from_file(cls, path: Path) -> Ed25519Signer:
        return cls(read_signing_keys(path))


class Keyring:
    """The published public keys (the ``KeyringCheck`` port): whether an event's
    signature was made by a known key, valid at the event's time."""

    def __init__(self, keys: Iterable[PublicKey]) -> None:
        keys = list(keys)
        _refuse_duplicates(key.id for key in keys)
        self._keys = {key.id: key for key in keys}

    @property
    def keys(self) -> list[PublicKey]:
        return list(self._keys.values())

    def check(
        self, signer: str | None, signature: str | None, chain_hash: str, at: datetime
    ) -> str | None:
        """None when the signature is good; else why not, in words."""
        if not signer or not signature:
            return "unsigned (no signature)"
        key = self._keys.get(signer)
        if key is None:
            return f"signed by key {signer!r}, which is not in the keyring"
        if not key.window.contains(at):
            return (
                f"signed by key {signer!r}, which was not valid at {utc(at).isoformat()} "
                f"(its window: {key.window})"
            )
        try:
            key.public_key.verify(from_b64url(signature), message(signer, chain_hash))
        except (ValueError, InvalidSignature):
            return f"bad signature by key {signer!r} (it does not match the chain hash)"
        return None

    def document(self) -> dict[str, Any]:
        """The keyring file's content."""
        return {"format": KEYRING_FORMAT, "keys": [key.entry() for key in self._keys.values()]}

    @classmethod
    def from_file(cls, path: Path) -> Keyring:
        return cls.from_document(read_json(path, "keyring"), str(path))

    @classmethod
    def from_document(cls, document: Any, source: str) -> Keyring:
        where = f"keyring {source!r}"
        if not isinstance(document, dict):
            raise ConfigError(f"{where} must be a JSON object with format and keys")
        if document.get("format") != KEYRING_FORMAT:
            raise ConfigError(
                f"{where}: format must be {KEYRING_FORMAT!r} (got {document.get('format')!r})"
            )
        entries = document.get("keys")
        if not isinstance(entries, list):
            raise ConfigError(f"{where}: keys must be a list")
        keys = [_public_key(entry, f"{where}, key {n}") for n, entry in enumerate(entries, 1)]
        _refuse_duplicates((key.id for key in keys), where)
        return cls(keys)


# ---- reading the files ----------------------------------------------------------------------


def read_json(path: Path, what: str) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except OSError as error:
        raise ConfigError(f"cannot read {what} {str(path)!r}: {error.strerror}") from None
    except UnicodeDecodeError:
        raise ConfigError(f"{what} {str(path)!r} is not UTF-8 text") from None
    except json.JSONDecodeError as error:
        raise ConfigError(
            f"{what} {str(path)!r} is not valid JSON: {error.msg} at line {error.lineno} "
            f"column {error.colno}"
        ) from None


def read_signing_keys(path: Path) -> list[SigningKey]:
    """The signing-keys file: each entry's private key read from its PEM file (a path
    relative to the signing-keys file)."""
    entries = read_json(path, "signing-keys file")
    where = f"signing-keys file {str(path)!r}"
    if not isinstance(entries, list) or not entries:
        raise ConfigError(
            f"{where} must be a non-empty JSON list of "
            "{id, private_key_file, not_before, not_after}"
        )
    keys = []
    for n, entry in enumerate(entries, 1):
        context = f"{where}, key {n}"
        fields = _fields(entry, context, ("id", "private_key_file", "not_before", "not_after"))
        key_file = path.parent / _text(fields, "private_key_file", context)
        keys.append(
            SigningKey(
                _text(fields, "id", context),
                read_private_key(key_file),
                _window(fields, context),
            )
        )
    _refuse_duplicates((key.id for key in keys), where)
    return keys


def read_private_key(path: Path) -> Ed25519PrivateKey:
    """An unencrypted Ed25519 key in PEM (PKCS8)."""
    try:
        data = path.read_bytes()
    except OSError as error:
        raise ConfigError(f"cannot read private key {str(path)!r}: {error.strerror}") from None
    try:
        key = serialization.load_pem_private_key(data, password=None)
    except TypeError:
        raise ConfigError(
            f"private key {str(path)!r} is encrypted; jobledger reads unencrypted PEM "
            "(protect the file by its permissions)"
        ) from None
    except ValueError:
        raise ConfigError(f"private key {str(path)!r} is not a PEM (PKCS8) private key") from None
    if not isinstance(key, Ed25519PrivateKey):
        raise ConfigError(
            f"private key {str(path)!r} is not an Ed25519 key (it is {type(key).__name__})"
        )
    return key


def private_pem(key: Ed25519PrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def parse_time(value: object, context: str) -> datetime:
    if not isinstance(value, str):
        raise ConfigError(f"{context} must be an ISO 8601 time (got {value!r})")
    try:
        return utc(datetime.fromisoformat(value))
    except ValueError:
        raise ConfigError(f"{context} is not an ISO 8601 time: {value!r}") from None


def _public_key(entry: Any, context: str) -> PublicKey:
    fields = _fields(entry, context, ("id", "algorithm", "public_key", "not_before", "not_after"))
    if fields["algorithm"] != ALGORITHM:
        raise ConfigError(
            f"{context}: algorithm must be {ALGORITHM!r} (got {fields['algorithm']!r})"
        )
    try:
        raw = from_b64url(_text(fields, "public_key", context))
        public = Ed25519PublicKey.from_public_bytes(raw)
    except ValueError:
        raise ConfigError(
            f"{context}: public_key must be the base64url of 32 raw Ed25519 bytes"
        ) from None
    return PublicKey(_text(fields, "id", context), public, _window(fields, context))


def _fields(entry: Any, context: str, names: tuple[str, ...]) -> dict[str, Any]:
    if not isinstance(entry, dict):
        raise ConfigError(f"{context} must be a JSON object with {', '.join(names)}")
    missing = [name for name in names if name not in entry]
    unknown = sorted(set(entry) - set(names))
    if missing or unknown:
        problems = [f"missing {', '.join(missing)}"] if missing else []
        problems += [f"unknown {', '.join(unknown)}"] if unknown else []
        raise ConfigError(f"{context}: {'; '.join(problems)} (fields: {', '.join(names)})")
    return entry


def _text(fields: dict[str, Any], name: str, context: str) -> str:
    value = fields[name]
    if not isinstance(value, str) or not value:
        raise ConfigError(f"{context}: {name} must be a non-empty string (got {value!r})")
    return value


def _window(fields: dict[str, Any], context: str) -> Window:
    not_before = parse_time(fields["not_before"], f"{context}: not_before")
    raw_end = fields["not_after"]
    not_after = None if raw_end is None else parse_time(raw_end, f"{context}: not_after")
    try:
        return Window(not_before, not_after)
    except ValueError as error:
        raise ConfigError(f"{context}: {error}") from None


def _refuse_duplicates(ids: Iterable[str], where: str = "the keys") -> None:
    seen: set[str] = set()
    for key_id in ids:
        if key_id in seen:
            raise ConfigError(f"{where}: key id {key_id!r} appears twice")
        seen.add(key_id)
