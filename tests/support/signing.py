"""Real Ed25519 keys for the sealing tests, through the ports (``EventSigner``,
``KeyringCheck``) and the signed message CONTRACT-16 section 5 fixes:
``b"jobledger.event/1\\n" + key_id + b"\\n" + chain_hash``, base64url without padding."""

from __future__ import annotations

import base64
import binascii
from dataclasses import dataclass, field
from datetime import datetime

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey


def message(key_id: str, chain_hash: str) -> bytes:
    return b"jobledger.event/1\n" + key_id.encode() + b"\n" + chain_hash.encode()


def b64url(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


@dataclass
class SigningKey:
    key_id: str
    not_before: datetime
    not_after: datetime | None = None
    private: Ed25519PrivateKey = field(default_factory=Ed25519PrivateKey.generate)

    def sign(self, chain_hash: str, at: datetime) -> tuple[str, str]:
        return self.key_id, b64url(self.private.sign(message(self.key_id, chain_hash)))


@dataclass
class PublicKeyring:
    keys: list[SigningKey]

    def check(
        self, signer: str | None, signature: str | None, chain_hash: str, at: datetime
    ) -> str | None:
        if signer is None or signature is None:
            return "the event is not signed"
        key = next((k for k in self.keys if k.key_id == signer), None)
        if key is None:
            return f"unknown key {signer!r}"
        if at < key.not_before or (key.not_after is not None and at >= key.not_after):
            return f"key {signer!r} was not valid at {at.isoformat()}"
        try:
            raw = base64.urlsafe_b64decode(signature + "=" * (-len(signature) % 4))
            key.private.public_key().verify(raw, message(signer, chain_hash))
        except (InvalidSignature, binascii.Error, ValueError):
            return f"the signature does not hold by key {signer!r}"
        return None
