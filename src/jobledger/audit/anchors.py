"""Anchors: the head of every job's chain, pinned somewhere the store cannot rewrite.

A hash chain shows an edit, a deletion or a reordering inside a history, but not a
history rolled back (or truncated) to an earlier state that is itself consistent: every
remaining link still holds. An anchor records each job's head (version and chain hash)
and a Merkle root over them, as one JSON line appended to a destination outside the
store. ``verify --anchors`` then requires every anchored head to still be there.

Each line also carries the sha256 of the line before it, so the anchor file is a chain
too: an edited, removed or inserted anchor line is reported.

The destination is an :class:`AnchorSink`: :class:`FileAnchorSink` appends to a file
(fsync'd); the Kafka sink (:mod:`jobledger.adapters.kafka.anchors`) publishes each line
to the topic ``jobledger.anchors``; :mod:`jobledger.audit.timestamping` stamps each line
with an RFC 3161 token over its Merkle root on its way to either. Which one a command
uses is a destination URL (:mod:`jobledger.audit.destinations`).
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, Final, Protocol
from uuid import UUID

from jobledger.audit import verifier

ANCHOR_FORMAT: Final = "jobledger.anchor/1"
ANCHOR_TOPIC: Final = "jobledger.anchors"
"""The Kafka topic anchors go to unless a destination names another."""
DEFAULT_ANCHOR_FILE: Final = "jobledger-anchors.jsonl"


@dataclass(frozen=True)
class Head:
    """The newest link of one job's chain."""

    job_uuid: UUID
    tenant_id: str | None
    job_id: str | None
    version: int
    chain_hash: str

    def document(self) -> dict[str, Any]:
        return {
            "job_uuid": str(self.job_uuid),
            "tenant": self.tenant_id,
            "job": self.job_id,
            "version": self.version,
            "chain_hash": self.chain_hash,
        }

    @classmethod
    def of(cls, data: Mapping[str, Any]) -> Head:
        return cls(
            job_uuid=UUID(str(data["job_uuid"])),
            tenant_id=data.get("tenant"),
            job_id=data.get("job"),
            version=int(data["version"]),
            chain_hash=str(data["chain_hash"]),
        )


def merkle_root(heads: Iterable[Head]) -> str:
    """sha256 Merkle root over the heads in job id order: the standalone verifier's, so
    what the engine anchors is what an auditor's copy of it recomputes."""
    return verifier.merkle_root([head.document() for head in heads])


@dataclass(frozen=True)
class TimeStamp:
    """An RFC 3161 timestamp token over an anchor's Merkle root, and the TSA that gave it."""

    tsa: str
    token: str
    """The DER TimeStampToken, base64 (standard alphabet, padded)."""

    def document(self) -> dict[str, str]:
        return {"tsa": self.tsa, "token": self.token}


@dataclass(frozen=True)
class Anchor:
    anchored_at: datetime
    heads: tuple[Head, ...]
    merkle_root: str
    previous_sha256: str | None
    """sha256 of the anchor line before this one at the destination (None for the first)."""
    line_number: int = 0
    rfc3161: TimeStamp | None = None

    def to_line(self) -> str:
        document: dict[str, Any] = {
            "format": ANCHOR_FORMAT,
            "anchored_at": self.anchored_at.isoformat(),
            "jobs": len(self.heads),
            "merkle_root": self.merkle_root,
            "previous_sha256": self.previous_sha256,
            "heads": [
                head.document() for head in sorted(self.heads, key=lambda head: head.job_uuid)
            ],
        }
        if self.rfc3161 is not None:
            document["rfc3161"] = self.rfc3161.document()
        return json.dumps(document, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def make_anchor(heads: Sequence[Head], anchored_at: datetime, previous_line: str | None) -> Anchor:
    return Anchor(
        anchored_at=anchored_at,
        heads=tuple(heads),
        merkle_root=merkle_root(heads),
        previous_sha256=line_sha256(previous_line) if previous_line is not None else None,
    )


def line_sha256(line: str) -> str:
    return hashlib.sha256(line.rstrip("\n").encode()).hexdigest()


# ---- destinations ----------------------------------------------------------------------------


class AnchorSink(Protocol):
    """An append-only destination outside the store (a file, a Kafka topic)."""

    name: str
    """Where the lines go, as a user would name it (a path, a ``kafka://`` URL)."""

    def last_line(self) -> str | None:
        """The newest anchor line written there, if any (to chain the next one to it)."""

    def append(self, line: str) -> None:
        """Append one line durably, or raise (then nothing counts as anchored)."""

    def lines(self) -> list[str]:
        """Every line written there, oldest first."""


class FileAnchorSink:
    """Appends each anchor as one line and fsyncs it (the file is opened in append mode
    only: it is never rewritten)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.name = str(self.path)

    def last_line(self) -> str | None:
        if not self.path.exists():
            return None
        with self.path.open("rb") as file:
            file.seek(0, os.SEEK_END)
            end = file.tell()
            position, tail = end, b""
            # Read backwards until the last complete non-empty line is in hand.
            while position > 0:
                step = min(65_536, position)
                position -= step
                file.seek(position)
                tail = file.read(step) + tail
                if tail.rstrip(b"\n").count(b"\n") >= 1:
                    break
        lines = [line for line in tail.split(b"\n") if line.strip()]
        return lines[-1].decode() if lines else None

    def append(self, line: str) -> None:
        with self.path.open("a", encoding="utf-8") as file:
            file.write(line.rstrip("\n") + "\n")
            file.flush()
            os.fsync(file.fileno())

    def lines(self) -> list[str]:
        return self.path.read_text(encoding="utf-8").splitlines() if self.path.exists() else []


# ---- reading them back -----------------------------------------------------------------------


@dataclass(frozen=True)
class StampCheck:
    """What checking one anchor's RFC 3161 token found."""

    line_number: int
    tsa: str
    gen_time: datetime | None
    """The time the TSA signed (None when the token does not parse)."""
    signature_checked: bool
    """Whether the token's signature was checked against a trusted TSA CA."""
    problem: str | None = None


@dataclass(frozen=True)
class AnchorLog:
    """Every anchor read from a destination, and what is wrong with the destination."""

    anchors: tuple[Anchor, ...]
    problems: tuple[str, ...] = field(default_factory=tuple)
    source: str = ""
    stamps: tuple[StampCheck, ...] = ()
    """The RFC 3161 tokens checked (empty until
    :func:`jobledger.audit.timestamping.check_stamps` ran)."""

    def latest_heads(self) -> dict[UUID, tuple[Head, Anchor]]:
        """Per job, its highest anchored head (with the anchor that pinned it). If the
        chain verifies and the hash at that version matches, every earlier anchored head
        matches too: each chain hash commits to the whole prefix."""
        latest: dict[UUID, tuple[Head, Anchor]] = {}
        for anchor in self.anchors:
            for head in anchor.heads:
                known = latest.get(head.job_uuid)
                if known is None or head.version >= known[0].version:
                    latest[head.job_uuid] = (head, anchor)
        return latest


def read_anchors(path: str | Path) -> AnchorLog:
    """Parse an anchor file (see :func:`parse_anchors`)."""
    source = Path(path)
    try:
        text = source.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as error:
        return AnchorLog((), (f"{source}: cannot read: {error}",))
    return parse_anchors(text.splitlines(), str(source))


def parse_anchors(lines: Iterable[str], source: str) -> AnchorLog:
    """Parse anchor lines (oldest first), checking each line's Merkle root and its link to
    the line before it. RFC 3161 tokens are checked apart
    (:func:`jobledger.audit.timestamping.check_stamps`)."""
    anchors: list[Anchor] = []
    problems: list[str] = []
    previous: str | None = None
    for number, raw in enumerate(lines, start=1):
        if not raw.strip():
            continue
        try:
            anchor = parse_line(raw, number)
        except (ValueError, KeyError, TypeError) as error:
            problems.append(f"{source} line {number}: not an anchor: {error}")
            previous = raw
            continue
        if anchor.merkle_root != merkle_root(anchor.heads):
            problems.append(
                f"{source} line {number}: the Merkle root does not match its heads "
                "(the anchor line was edited)"
            )
        expected = line_sha256(previous) if previous is not None else None
        if anchor.previous_sha256 != expected:
            problems.append(
                f"{source} line {number}: does not follow the line before it "
                "(an anchor line was edited, removed or inserted)"
            )
        anchors.append(anchor)
        previous = raw
    return AnchorLog(tuple(anchors), tuple(problems), source)


def parse_line(raw: str, number: int = 0) -> Anchor:
    """One anchor line, or ValueError/KeyError/TypeError when it is not one."""
    data = json.loads(raw)
    if not isinstance(data, dict) or data.get("format") != ANCHOR_FORMAT:
        raise ValueError(f"format is not {ANCHOR_FORMAT!r}")
    stamp = data.get("rfc3161")
    return Anchor(
        anchored_at=datetime.fromisoformat(data["anchored_at"]),
        heads=tuple(Head.of(head) for head in data["heads"]),
        merkle_root=str(data["merkle_root"]),
        previous_sha256=data.get("previous_sha256"),
        line_number=number,
        rfc3161=TimeStamp(str(stamp["tsa"]), str(stamp["token"])) if stamp is not None else None,
    )
