"""The FieldSealer port by AES-256-GCM: a job's personal values are stored as sealed
values, encrypted with its data subject's key (``adapters.subject_keys``).

A sealed value, in place of the personal value in the stored (and hashed) fields::

    {"$sealed":"aes-256-gcm/1","key":"<key id>","nonce":"<b64url 12 bytes>","ct":"<b64url>"}

The plaintext is the canonical JSON of the value; the associated data is
``"<job uuid>:<path>"``, so a sealed value copied to another job or path does not open.
Keys are looked up on every use, never kept: a key erased by another process stops
opening values here at once.
"""

from __future__ import annotations

import base64
import json
import os
from collections.abc import Mapping
from typing import Any, Final, Protocol
from uuid import UUID

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from jobledger.domain.erasure import ERASED, STATE_FIELDS, changed_at
from jobledger.domain.job import Job

SCHEME: Final = "aes-256-gcm/1"
SEALED: Final = "$sealed"
NONCE_BYTES: Final = 12


class KeyLookup(Protocol):
    def key(self, key_id: str) -> bytes | None:
        """The key's bytes; None once it is erased."""


class SealedValueError(ValueError):
    """A stored sealed value that its key does not open: its bytes, its job or its path
    were changed."""


class FieldCipher:
    def __init__(self, keys: KeyLookup) -> None:
        self.keys = keys

    def seal(self, job: Job, event_type: str, fields: dict[str, Any]) -> dict[str, Any]:
        names = STATE_FIELDS.get(event_type, ())
        key_id = job.personal_data_key
        if not job.personal_data or key_id is None or not names:
            return fields
        raw = self.keys.key(key_id)
        # The subject's key is gone: what arrives for it now is erased as it is written.
        cipher = None if raw is None else AESGCM(raw)

        def sealed(path: str, value: Any) -> Any:
            if cipher is None:
                return ERASED
            nonce = os.urandom(NONCE_BYTES)
            plaintext = _canonical(value).encode()
            ct = cipher.encrypt(nonce, plaintext, _aad(job.id, path))
            return {SEALED: SCHEME, "key": key_id, "nonce": _b64(nonce), "ct": _b64(ct)}

        sealed_fields = dict(fields)
        for name in names:
            value = fields.get(name)
            if isinstance(value, Mapping):
                sealed_fields[name] = changed_at(value, job.personal_data, sealed)
        return sealed_fields

    def open(self, fields: dict[str, Any]) -> dict[str, Any]:
        names = [n for n, v in fields.items() if isinstance(v, Mapping) and _holds_sealed(v)]
        if not names:
            return fields
        job_uuid = UUID(str(fields["originator_id"]))
        ciphers: dict[str, AESGCM | None] = {}
        opened = dict(fields)
        for name in names:
            opened[name] = self._opened(fields[name], job_uuid, ciphers, ())
        return opened

    def _opened(
        self,
        node: Mapping[str, Any],
        job_uuid: UUID,
        ciphers: dict[str, AESGCM | None],
        at: tuple[str, ...],
    ) -> dict[str, Any]:
        result: dict[str, Any] = {}
        for name, value in node.items():
            path = (*at, name)
            if is_sealed(value):
                result[name] = self._open_value(value, job_uuid, ".".join(path), ciphers)
            elif isinstance(value, Mapping):
                result[name] = self._opened(value, job_uuid, ciphers, path)
            else:
                result[name] = value
        return result

    def _open_value(
        self,
        value: Mapping[str, Any],
        job_uuid: UUID,
        path: str,
        ciphers: dict[str, AESGCM | None],
    ) -> Any:
        key_id = str(value["key"])
        if key_id not in ciphers:
            raw = self.keys.key(key_id)
            ciphers[key_id] = None if raw is None else AESGCM(raw)
        cipher = ciphers[key_id]
        if cipher is None:
            return ERASED
        try:
            plaintext = cipher.decrypt(
                _unb64(str(value["nonce"])), _unb64(str(value["ct"])), _aad(job_uuid, path)
            )
        except (InvalidTag, ValueError):
            raise SealedValueError(
                f"the sealed value at {path!r} of job {job_uuid} does not open with key "
                f"{key_id}: it was changed, or moved from another job or path"
            ) from None
        return json.loads(plaintext)


def is_sealed(value: object) -> bool:
    return isinstance(value, Mapping) and value.get(SEALED) == SCHEME


def _holds_sealed(node: Mapping[str, Any]) -> bool:
    return any(is_sealed(v) or (isinstance(v, Mapping) and _holds_sealed(v)) for v in node.values())


def _canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def _aad(job_uuid: UUID, path: str) -> bytes:
    return f"{job_uuid}:{path}".encode()


def _b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
