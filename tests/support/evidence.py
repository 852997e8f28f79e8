"""The evidence corpus's tools: signing keys, the attacker's edits of an
export (each one a function from good lines to tampered lines, made the way someone with
the file and no signing key would), and a throwaway RFC 3161 time-stamping authority
(``openssl ts``) for anchor tokens.

Lines are the export's text lines (no newline); events are edited as parsed JSON and
written back canonical, so only what the edit means is under test, not its spelling."""

from __future__ import annotations

import base64
import hashlib
import json
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from jobledger.domain import chain

Lines = list[str]
Edit = Callable[[Lines], Lines]


def canonical(document: Any) -> str:
    return json.dumps(document, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def b64url(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


# ---- keys -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class SigningKey:
    id: str
    private: Ed25519PrivateKey
    not_before: datetime
    not_after: datetime | None

    def sign(self, chain_hash: str) -> str:
        message = b"jobledger.event/1\n" + self.id.encode() + b"\n" + chain_hash.encode()
        return b64url(self.private.sign(message))

    def valid_at(self, moment: datetime) -> bool:
        return self.not_before <= moment and (self.not_after is None or moment < self.not_after)


def new_key(key_id: str, not_before: datetime, not_after: datetime | None) -> SigningKey:
    return SigningKey(key_id, Ed25519PrivateKey.generate(), not_before, not_after)


def leaked_keys(signing_keys: Path) -> list[SigningKey]:
    """The private keys of a signing-keys file (what a thief of the key files holds)."""
    keys = []
    for entry in json.loads(signing_keys.read_text()):
        pem = (signing_keys.parent / entry["private_key_file"]).read_bytes()
        private = serialization.load_pem_private_key(pem, None)
        assert isinstance(private, Ed25519PrivateKey)
        end = entry["not_after"]
        keys.append(
            SigningKey(
                entry["id"],
                private,
                datetime.fromisoformat(entry["not_before"]),
                None if end is None else datetime.fromisoformat(end),
            )
        )
    return keys


# ---- reading an export -----------------------------------------------------------------------


def events_of(lines: Lines, job_uuid: str) -> list[int]:
    """The indexes of a job's event lines, in order."""
    return [
        index
        for index, line in enumerate(lines)
        if json.loads(line).get("record") == "event" and json.loads(line)["job_uuid"] == job_uuid
    ]


def rehash(lines: Lines, job_uuid: str, start: int, signer: SigningKey | None = None) -> Lines:
    """Recompute the job's chain from version ``start`` on, from its lines as they now
    are (the engine's own canonical bytes), signing each of those events with ``signer``
    or leaving it unsigned; the events before ``start`` stay as they were."""
    out = list(lines)
    previous = chain.GENESIS
    for index in events_of(lines, job_uuid):
        event = json.loads(out[index])
        if event["version"] < start:
            previous = event["chain_hash"]
            continue
        fields = {
            "originator_id": event["job_uuid"],
            "originator_version": event["version"],
            "timestamp": event["timestamp"],
            **event["data"],
        }
        event["chain_hash"] = chain.link(previous, "Job." + event["type"], fields)
        event.pop("signer", None)
        event.pop("signature", None)
        if signer is not None:
            event.update(signer=signer.id, signature=signer.sign(event["chain_hash"]))
        previous = event["chain_hash"]
        out[index] = canonical(event)
    return out


def fix_manifest(lines: Lines) -> Lines:
    """The manifest made to agree with the event lines (counts and heads)."""
    events = [json.loads(line) for line in lines[:-1]]
    manifest = json.loads(lines[-1])
    heads = {
        event["job_uuid"]: {key: event[key] for key in ("tenant", "job", "version", "chain_hash")}
        for event in events
    }
    manifest.update(jobs=len(heads), events=len(events), heads=heads)
    return [*lines[:-1], canonical(manifest)]


# ---- the attacker's edits --------------------------------------------------------------------


def edit_event(
    lines: Lines, job_uuid: str, version: int, change: Callable[[dict[str, Any]], None]
) -> Lines:
    out = list(lines)
    index = events_of(lines, job_uuid)[version - 1]
    event = json.loads(out[index])
    change(event)
    out[index] = canonical(event)
    return out


def edit_data(lines: Lines, job_uuid: str, version: int) -> Lines:
    def change(event: dict[str, Any]) -> None:
        event["data"]["worker_id"] = "mallory"

    return edit_event(lines, job_uuid, version, change)


def delete_line(lines: Lines, job_uuid: str, version: int) -> Lines:
    index = events_of(lines, job_uuid)[version - 1]
    return lines[:index] + lines[index + 1 :]


def swap_lines(lines: Lines, job_uuid: str, version: int) -> Lines:
    """Versions ``version`` and ``version + 1`` change places."""
    first, second = events_of(lines, job_uuid)[version - 1 : version + 1]
    out = list(lines)
    out[first], out[second] = out[second], out[first]
    return out


def rewrite_tail(
    lines: Lines, job_uuid: str, version: int, signer: SigningKey | None, keep_old: bool = False
) -> Lines:
    """From ``version`` on: an edit, the chain re-hashed, the manifest fixed up; the new
    events signed by ``signer`` (a key the attacker holds), or by nobody, or, with
    ``keep_old``, carrying their old signatures (over the old hashes)."""
    old = [json.loads(lines[index]) for index in events_of(lines, job_uuid)]
    out = rehash(edit_data(lines, job_uuid, version), job_uuid, version, signer)
    if keep_old:
        for index, before in zip(events_of(out, job_uuid), old, strict=True):
            event = json.loads(out[index])
            if "signature" in before:
                event.update(signer=before["signer"], signature=before["signature"])
            out[index] = canonical(event)
    return fix_manifest(out)


def redate(lines: Lines, job_uuid: str, version: int, at: datetime, signer: SigningKey) -> Lines:
    """The event moved to ``at`` and everything re-hashed and re-signed with ``signer``
    (a retired key that leaked): its window does not cover ``at``."""
    moved = edit_event(lines, job_uuid, version, lambda e: e.update(timestamp=at.isoformat()))
    return fix_manifest(rehash(moved, job_uuid, version, signer))


def roll_back(lines: Lines, job_uuid: str, keep: int) -> Lines:
    """The job cut back to its first ``keep`` events, the manifest fixed up: a consistent
    earlier state, which only an anchor taken since tells apart."""
    drop = set(events_of(lines, job_uuid)[keep:])
    return fix_manifest([line for index, line in enumerate(lines) if index not in drop])


def edit_manifest(lines: Lines, change: Callable[[dict[str, Any]], None]) -> Lines:
    manifest = json.loads(lines[-1])
    change(manifest)
    return [*lines[:-1], canonical(manifest)]


def edit_anchor_head(anchor_lines: Lines, number: int, job_uuid: str) -> Lines:
    """A head's hash in anchor line ``number`` (from 1) replaced, the Merkle root left."""
    out = list(anchor_lines)
    anchor = json.loads(out[number - 1])
    for head in anchor["heads"]:
        if head["job_uuid"] == job_uuid:
            head["chain_hash"] = "0" * 64
    out[number - 1] = canonical(anchor)
    return out


# ---- RFC 3161 ----------------------------------------------------------------------------------

TSA_CONFIG = """
[ tsa ]
default_tsa = tsa_config
[ tsa_config ]
serial = {dir}/serial
crypto_device = builtin
signer_cert = {dir}/tsa.pem
certs = {dir}/ca.pem
signer_key = {dir}/tsa.key
signer_digest = sha256
default_policy = 1.2.3.4.1
digests = sha256
accuracy = secs:1
ordering = yes
tsa_name = no
ess_cert_id_chain = no
ess_cert_id_alg = sha256
"""


class TimeStampAuthority:
    """A throwaway CA and TSA certificate, and ``openssl ts -reply`` to stamp digests."""

    def __init__(self, directory: Path) -> None:
        self.dir = directory
        directory.mkdir(parents=True, exist_ok=True)
        self._openssl(
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:P-256",
            "-nodes",
            "-keyout",
            "ca.key",
            "-out",
            "ca.pem",
            "-subj",
            "/CN=test ca",
            "-days",
            "2",
        )
        self._openssl(
            "req",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:P-256",
            "-nodes",
            "-keyout",
            "tsa.key",
            "-out",
            "tsa.csr",
            "-subj",
            "/CN=test tsa",
        )
        (directory / "tsa.ext").write_text("extendedKeyUsage = critical,timeStamping\n")
        self._openssl(
            "x509",
            "-req",
            "-in",
            "tsa.csr",
            "-CA",
            "ca.pem",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-out",
            "tsa.pem",
            "-days",
            "2",
            "-extfile",
            "tsa.ext",
        )
        (directory / "serial").write_text("01\n")
        (directory / "tsa.cnf").write_text(TSA_CONFIG.format(dir=directory))

    def stamp(self, merkle_root: str) -> str:
        """The base64 DER TimeStampToken over sha256(the root's 32 raw bytes)."""
        digest = hashlib.sha256(bytes.fromhex(merkle_root)).hexdigest()
        self._openssl("ts", "-query", "-digest", digest, "-sha256", "-cert", "-out", "q.tsq")
        self._openssl(
            "ts",
            "-reply",
            "-config",
            "tsa.cnf",
            "-queryfile",
            "q.tsq",
            "-token_out",
            "-out",
            "token.der",
        )
        return base64.b64encode((self.dir / "token.der").read_bytes()).decode()

    def _openssl(self, *args: str) -> None:
        subprocess.run(["openssl", *args], cwd=self.dir, check=True, capture_output=True)


def with_token(anchor_lines: Lines, token: str) -> Lines:
    """The last anchor line with an RFC 3161 token (the last: no later line links to it)."""
    anchor = json.loads(anchor_lines[-1])
    anchor["rfc3161"] = {"tsa": "http://127.0.0.1/tsa", "token": token}
    return [*anchor_lines[:-1], canonical(anchor)]
