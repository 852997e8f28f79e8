"""The sealing pipeline: what a store does to each job event as it writes it, and the row
format it writes (v2).

Each new event goes: its fields -> personal values sealed (``FieldSealer``) -> canonical
bytes, encoded once -> linked to the job's previous chain hash -> signed (``EventSigner``,
when the writer has a key) -> the stored row, built by concatenation around the very bytes
the chain hashed::

    {"chain_hash":"<hex>","event":<canonical bytes>,"signature":"<b64url>","signer":"<key id>"}

(canonical JSON itself: keys sorted; ``signature``/``signer`` absent when unsigned). Rows
written before it are eventsourcing's transcoder's (they start ``{"timestamp":``) and
keep decoding (``adapters.mapper``); verify hashes a v2 row's stored body as it is.
"""

from __future__ import annotations

import json
from typing import Any, Final

from jobledger.domain import chain
from jobledger.domain.chain import Sealed
from jobledger.domain.job import Job
from jobledger.orchestration.ports import EventSigner, FieldSealer

ROW_PREFIX: Final = b'{"chain_hash":"'
"""How every v2 row starts (an old row starts ``{"timestamp":``)."""
_HASH_LENGTH: Final = 64
_EVENT_KEY: Final = b'","event":'
_BODY_START: Final = len(ROW_PREFIX) + _HASH_LENGTH + len(_EVENT_KEY)


class NoSealing:
    """The default ``FieldSealer``: no field is personal, every value is stored as is."""

    def seal(self, job: Job, event_type: str, fields: dict[str, Any]) -> dict[str, Any]:
        return fields

    def open(self, fields: dict[str, Any]) -> dict[str, Any]:
        return fields


class SealingPipeline:
    """Hashes, seals and signs a job's new events in order, from the job's stored head.
    ``seal`` is a list of steps, each a method a subclass may override."""

    def __init__(self, sealer: FieldSealer | None = None, signer: EventSigner | None = None):
        self.sealer: FieldSealer = sealer if sealer is not None else NoSealing()
        self.signer = signer

    def seal_pending(self, job: Job) -> None:
        """Give each of the job's pending events its stored form and chain hash, and move
        the job's head to the last. An event already sealed (an append tried again after
        its group was refused) keeps its form: its hash is already the next link's input."""
        previous = job.chain_head
        for event in job.pending_events:
            assert isinstance(event, Job.Event)
            sealed = chain.attached(event)
            if sealed is None:
                sealed = self.seal(job, event, previous)
                chain.attach(event, sealed)
            previous = sealed.chain_hash
        job.chain_head = previous

    def seal(self, job: Job, event: Job.Event, previous: str) -> Sealed:
        event_type = type(event).__qualname__
        fields = self.fields(event)
        fields = self.seal_fields(job, event_type, fields)
        body = self.encode(event_type, fields)
        chain_hash = self.link(previous, body)
        signer, signature = self.sign(chain_hash, event)
        return Sealed(body, chain_hash, signature, signer)

    # ---- the steps ---------------------------------------------------------------------

    def fields(self, event: Job.Event) -> dict[str, Any]:
        return chain.event_fields(event)

    def seal_fields(self, job: Job, event_type: str, fields: dict[str, Any]) -> dict[str, Any]:
        return self.sealer.seal(job, event_type, fields)

    def encode(self, event_type: str, fields: dict[str, Any]) -> bytes:
        return chain.canonical_bytes(event_type, fields)

    def link(self, previous: str, body: bytes) -> str:
        return chain.link_bytes(previous, body)

    def sign(self, chain_hash: str, event: Job.Event) -> tuple[str | None, str | None]:
        if self.signer is None:
            return None, None
        return self.signer.sign(chain_hash, event.timestamp)


# ---- the row --------------------------------------------------------------------------------


def row_bytes(sealed: Sealed) -> bytes:
    """The v2 row: canonical JSON, built around the body without encoding it again."""
    head = ROW_PREFIX + sealed.chain_hash.encode() + _EVENT_KEY + sealed.body
    if sealed.signature is None:
        return head + b"}"
    return head + _signature_tail(sealed.signature, sealed.signer)


def _signature_tail(signature: str, signer: str | None) -> bytes:
    return (
        b',"signature":'
        + _json_string(signature)
        + b',"signer":'
        + _json_string(signer or "")
        + b"}"
    )


def _json_string(value: str) -> bytes:
    return json.dumps(value, ensure_ascii=False).encode()


def is_row(state: bytes) -> bool:
    return state.startswith(ROW_PREFIX)


def read_row(state: bytes) -> tuple[Sealed, dict[str, Any]]:
    """A v2 row's stored form (its body sliced out as stored: the bytes verify hashes)
    and its event document ``{"fields": {...}, "type": "Job.X"}``. Raises ValueError on a
    row that is not one."""
    try:
        row = chain.parse(state)
    except ValueError as error:
        raise ValueError(f"not a stored event row: {error}") from None
    if not isinstance(row, dict) or not isinstance(row.get("event"), dict):
        raise ValueError("not a stored event row: no event object")
    chain_hash, signature, signer = row.get("chain_hash"), row.get("signature"), row.get("signer")
    if not isinstance(chain_hash, str) or not _optional_str(signature, signer):
        raise ValueError("not a stored event row: bad chain_hash, signature or signer")
    tail = b"}" if signature is None else _signature_tail(signature, signer)
    # A row edited into another layout slices to bytes that no longer hash: reported as
    # an edit, like any other change to the body.
    body = bytes(state[_BODY_START : len(state) - len(tail)])
    return Sealed(body, chain_hash, signature, signer), row["event"]


def _optional_str(*values: object) -> bool:
    return all(value is None or isinstance(value, str) for value in values)
