"""jobledger-verify: check a jobledger export without the engine.

One file, the standard library and ``cryptography`` only, so an auditor can copy it alone
and read it whole. It checks what docs/evidence-format.md specifies:

- every line of the export is JSON, canonical (the bytes json.dumps writes with sorted
  keys, no spaces, UTF-8 as is);
- per job: its lines name it (tenant and job give its uuid), versions run 1, 2, 3...,
  each chain hash is sha256(previous hash + the event's canonical bytes);
- with a keyring, each event is signed (Ed25519) by a key known and valid at its time;
- the manifest is there, last, and its counts and heads are the file's;
- parents and children agree: a child whose parent is in the export is among the
  children that parent's map step spawned, and a parent records the end only of a child
  it spawned;
- with anchor files, each anchor line's Merkle root is its heads', it links to the line
  before it, an RFC 3161 token in it stamps that root, and every anchored head is in the
  export with the same hash (a history rolled back or rewritten since it was anchored).

The TSA's signature on an RFC 3161 token is not checked here (that needs the TSA's
certificate chain): ``jobledger verify --tsa-ca`` checks it.

Exit status: 0 everything verifies; 1 something does not verify; 2 an input cannot be
read (a file missing or not UTF-8, a keyring that is not one, a bad argument).
"""

from __future__ import annotations

import argparse
import base64
import binascii
import functools
import hashlib
import json
import re
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final
from uuid import UUID, uuid5

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

EXIT_VERIFIED: Final = 0
EXIT_NOT_VERIFIED: Final = 1
EXIT_UNREADABLE: Final = 2

EXPORT_FORMATS: Final = ("jobledger.export/1", "jobledger.export/2")
ANCHOR_FORMAT: Final = "jobledger.anchor/1"
KEYRING_FORMAT: Final = "jobledger.keyring/1"
SIGNED_PREFIX: Final = b"jobledger.event/1\n"
JOB_NAMESPACE: Final = UUID("6f1c3f0e-8a53-4f55-9a5e-4f3c0c7e2b11")
RESERVED_DATA: Final = ("originator_id", "originator_version", "timestamp", "chain_hash")
SIGNATURE_B64URL: Final = re.compile(r"[A-Za-z0-9_-]{86}")  # 64 bytes, no padding
PUBLIC_KEY_B64URL: Final = re.compile(r"[A-Za-z0-9_-]{43}")  # 32 bytes, no padding


class UnreadableError(Exception):
    """An input the verifier cannot read at all (exit 2), as opposed to evidence that
    does not verify (exit 1)."""


# ---- the canonical form and the hashes ------------------------------------------------------


def canonical(value: Any) -> str:
    """The canonical JSON text: what every hash and every line is made of."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def event_bytes(line: dict[str, Any]) -> bytes:
    """The canonical bytes the chain hash covers, rebuilt from an export line."""
    fields = {
        "originator_id": line["job_uuid"],
        "originator_version": line["version"],
        "timestamp": line["timestamp"],
        **line["data"],
    }
    return canonical({"fields": fields, "type": "Job." + line["type"]}).encode()


def chain_hash(previous: str, line: dict[str, Any]) -> str:
    return hashlib.sha256(previous.encode() + event_bytes(line)).hexdigest()


@functools.lru_cache(maxsize=1024)  # every line of a job asks again
def job_uuid_of(tenant: str, job: str) -> str:
    return str(uuid5(JOB_NAMESPACE, f"{len(tenant)}:{tenant}/{job}"))


def merkle_root(heads: Sequence[dict[str, Any]]) -> str:
    """Leaves in job uuid order, 0x00-prefixed; nodes 0x01-prefixed; an odd node is
    promoted as it is (RFC 6962's domain separation, not its split)."""
    ordered = sorted(heads, key=lambda head: UUID(head["job_uuid"]))
    level = [
        hashlib.sha256(
            b"\x00" + f"{head['job_uuid']}:{head['version']}:{head['chain_hash']}".encode()
        ).digest()
        for head in ordered
    ]
    if not level:
        return hashlib.sha256(b"").hexdigest()
    while len(level) > 1:
        paired = [
            hashlib.sha256(b"\x01" + level[i] + level[i + 1]).digest()
            for i in range(0, len(level) - 1, 2)
        ]
        if len(level) % 2:
            paired.append(level[-1])
        level = paired
    return level[0].hex()


def parse_time(text: object) -> datetime:
    """ISO 8601; a time without an offset is UTC."""
    if not isinstance(text, str):
        raise ValueError(f"not a time: {text!r}")
    moment = datetime.fromisoformat(text)
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)


# ---- reading files ---------------------------------------------------------------------------


def read_lines(path: Path) -> list[tuple[int, str]]:
    """(line number, text) of each non-blank line. Lines end at "\\n" only: the canonical
    form leaves U+2028 and friends unescaped inside strings."""
    try:
        text = path.read_bytes().decode("utf-8")
    except OSError as error:
        raise UnreadableError(f"{path}: cannot read: {error.strerror or error}") from None
    except UnicodeDecodeError as error:
        raise UnreadableError(f"{path}: not UTF-8 ({error.reason} at byte {error.start})") from None
    return [(number, line) for number, line in enumerate(text.split("\n"), start=1) if line.strip()]


@dataclass(frozen=True)
class Key:
    id: str
    public: Ed25519PublicKey
    not_before: datetime
    not_after: datetime | None

    def valid_at(self, moment: datetime) -> bool:
        return self.not_before <= moment and (self.not_after is None or moment < self.not_after)

    def window(self) -> str:
        end = self.not_after.isoformat() if self.not_after else "no end"
        return f"{self.not_before.isoformat()} to {end}"


def read_keyring(path: Path) -> dict[str, Key]:
    text = "\n".join(line for _, line in read_lines(path))
    try:
        document = json.loads(text)
        if not isinstance(document, dict) or document.get("format") != KEYRING_FORMAT:
            raise ValueError(f"format is not {KEYRING_FORMAT!r}")
        keys = [key_of(entry) for entry in document["keys"]]
    except (ValueError, KeyError, TypeError) as error:
        raise UnreadableError(f"{path}: not a keyring: {error}") from None
    ring = {key.id: key for key in keys}
    if len(ring) != len(keys):
        raise UnreadableError(f"{path}: not a keyring: a key id appears twice")
    return ring


def key_of(entry: dict[str, Any]) -> Key:
    if entry["algorithm"] != "ed25519":
        raise ValueError(f"key {entry['id']!r}: algorithm is not 'ed25519'")
    if not isinstance(entry["id"], str) or not PUBLIC_KEY_B64URL.fullmatch(entry["public_key"]):
        raise ValueError(f"key {entry['id']!r}: public_key is not 32 bytes in base64url")
    raw = base64.urlsafe_b64decode(entry["public_key"] + "=")
    not_after = entry["not_after"]
    return Key(
        id=entry["id"],
        public=Ed25519PublicKey.from_public_bytes(raw),
        not_before=parse_time(entry["not_before"]),
        not_after=None if not_after is None else parse_time(not_after),
    )


# ---- the report ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Failure:
    version: int
    reason: str


@dataclass
class Job:
    """One job's lines in file order (the line at index i should be version i + 1), and
    its tenant and job as its first line (or an anchor, when it has none) names them."""

    job_uuid: str
    tenant: object
    job: object
    lines: list[dict[str, Any]] = field(default_factory=list)
    raw: list[str] = field(default_factory=list)
    failure: Failure | None = None

    def fail(self, version: int, reason: str) -> None:
        """Keep the failure at the lowest version: the first that does not verify."""
        if self.failure is None or version < self.failure.version:
            self.failure = Failure(version, reason)

    def label(self) -> str:
        return f"{self.tenant}/{self.job} ({self.job_uuid})"

    @classmethod
    def named_by(cls, document: dict[str, Any]) -> Job:
        """The job an event line or an anchored head names."""
        return cls(document["job_uuid"], document.get("tenant"), document.get("job"))


@dataclass(frozen=True)
class Problem:
    """Something wrong with the file itself, the manifest or an anchor line."""

    where: str  # "export", "manifest", "anchors" or "family"
    reason: str


@dataclass
class Report:
    jobs: dict[str, Job] = field(default_factory=dict)
    problems: list[Problem] = field(default_factory=list)
    events: int = 0
    signatures_checked: bool = False
    anchors_read: int = 0

    @property
    def verified(self) -> bool:
        return not self.problems and all(job.failure is None for job in self.jobs.values())


# ---- the export ------------------------------------------------------------------------------


def read_export(path: Path, report: Report) -> dict[str, Any] | None:
    """Group the event lines by job; return the manifest (the last line) if there is one."""
    lines = read_lines(path)
    manifest: dict[str, Any] | None = None
    for index, (number, raw) in enumerate(lines):
        document = parse_object(raw)
        if document is None:
            report.problems.append(Problem("export", f"line {number}: not a JSON object"))
        elif document.get("record") == "manifest":
            if index != len(lines) - 1:
                report.problems.append(Problem("manifest", f"line {number}: not the last line"))
            manifest = document
            if raw != canonical(document):
                report.problems.append(Problem("manifest", f"line {number}: not canonical"))
        elif document.get("record") == "event" and is_uuid(document.get("job_uuid")):
            job = report.jobs.setdefault(document["job_uuid"], Job.named_by(document))
            job.lines.append(document)
            job.raw.append(raw)
            report.events += 1
        else:
            report.problems.append(
                Problem("export", f"line {number}: neither an event of a job nor the manifest")
            )
    return manifest


def parse_object(raw: str) -> dict[str, Any] | None:
    try:
        document = json.loads(raw)
    except ValueError:
        return None
    return document if isinstance(document, dict) else None


def is_uuid(value: object) -> bool:
    try:
        return isinstance(value, str) and str(UUID(value)) == value
    except ValueError:
        return False


def check_job(job: Job, keyring: dict[str, Key] | None, unsigned_before: datetime | None) -> None:
    """Walk the job's lines in order; record the first that does not verify."""
    previous = ""
    for version, (line, raw) in enumerate(zip(job.lines, job.raw, strict=True), start=1):
        why = line_problem(line, raw, version, previous)
        if why is None and keyring is not None:
            why = signature_problem(line, keyring, unsigned_before)
        if why is not None:
            job.fail(version, why)
            return
        previous = line["chain_hash"]


def line_problem(line: dict[str, Any], raw: str, version: int, previous: str) -> str | None:
    if raw != canonical(line):
        return "the line is not canonical JSON (edited by hand?)"
    shape = shape_problem(line)
    if shape is not None:
        return shape
    if job_uuid_of(line["tenant"], line["job"]) != line["job_uuid"]:
        return f"tenant {line['tenant']!r} and job {line['job']!r} do not name this job_uuid"
    if line["version"] != version:
        return f"expected version {version}, found v{line['version']} (a line missing or moved)"
    if chain_hash(previous, line) != line["chain_hash"]:
        return "the chain hash does not match the event (edited, or a line before it changed)"
    return None


def shape_problem(line: dict[str, Any]) -> str | None:
    texts = ("tenant", "job", "type", "timestamp", "chain_hash")
    if not all(isinstance(line.get(name), str) for name in texts):
        return f"{', '.join(texts)} must be strings"
    if not isinstance(line.get("version"), int) or isinstance(line.get("version"), bool):
        return "version must be an integer"
    if not isinstance(line.get("data"), dict) or set(RESERVED_DATA) & set(line["data"]):
        return f"data must be an object without {', '.join(RESERVED_DATA)}"
    if not all(isinstance(line.get(name, ""), str) for name in ("signer", "signature")):
        return "signer and signature must be strings"
    try:
        parse_time(line["timestamp"])
    except ValueError:
        return f"timestamp is not an ISO 8601 time: {line['timestamp']!r}"
    return None


def signature_problem(
    line: dict[str, Any], keyring: dict[str, Key], unsigned_before: datetime | None
) -> str | None:
    signer, signature = line.get("signer"), line.get("signature")
    at = parse_time(line["timestamp"])
    if signer is None and signature is None:
        if unsigned_before is not None and at < unsigned_before:
            return None
        return "not signed"
    if signer is None or signature is None:
        return "signer and signature must come together"
    key = keyring.get(signer)
    if key is None:
        return f"signed by key {signer!r}, which the keyring does not know"
    if not key.valid_at(at):
        return f"signed by key {signer!r} at {at.isoformat()}, outside its window ({key.window()})"
    message = SIGNED_PREFIX + signer.encode() + b"\n" + line["chain_hash"].encode()
    try:
        if not SIGNATURE_B64URL.fullmatch(signature):
            raise InvalidSignature
        key.public.verify(base64.urlsafe_b64decode(signature + "=="), message)
    except InvalidSignature:
        return f"the signature is not key {signer!r}'s over this chain hash"
    return None


def check_manifest(manifest: dict[str, Any] | None, report: Report) -> None:
    if manifest is None:
        report.problems.append(Problem("manifest", "no manifest line (the file is incomplete)"))
        return
    if manifest.get("format") not in EXPORT_FORMATS:
        report.problems.append(Problem("manifest", f"unknown format {manifest.get('format')!r}"))
    if (manifest.get("jobs"), manifest.get("events")) != (len(report.jobs), report.events):
        report.problems.append(
            Problem(
                "manifest",
                f"counts {manifest.get('jobs')} jobs and {manifest.get('events')} events; the "
                f"file holds {len(report.jobs)} and {report.events}",
            )
        )
    heads = {uuid: head_of(job) for uuid, job in report.jobs.items()}
    claimed = manifest.get("heads")
    if not isinstance(claimed, dict):
        report.problems.append(Problem("manifest", "heads is not an object"))
    elif claimed != heads:
        differ = [u for u in sorted(set(heads) | set(claimed)) if heads.get(u) != claimed.get(u)]
        report.problems.append(Problem("manifest", f"heads differ for {', '.join(differ)}"))
    broken = manifest.get("broken")
    if broken != []:
        found = "; ".join(map(str, broken)) if isinstance(broken, list) else repr(broken)
        report.problems.append(Problem("manifest", f"the exporter found broken chains: {found}"))


def head_of(job: Job) -> dict[str, Any]:
    last = job.lines[-1]
    return {k: last.get(k) for k in ("tenant", "job", "version", "chain_hash")}


# ---- anchors ---------------------------------------------------------------------------------


def check_anchor_file(path: Path, report: Report, selected: Selection) -> None:
    previous: str | None = None
    for number, raw in read_lines(path):
        where = f"{path} line {number}"
        expected_previous = None if previous is None else sha256_hex(previous.encode())
        previous = raw
        anchor = parse_object(raw)
        why = anchor_problem(anchor, expected_previous) if anchor is not None else "not JSON"
        if why is not None:
            report.problems.append(Problem("anchors", f"{where}: {why}"))
        if anchor is not None and heads_readable(anchor):
            report.anchors_read += 1
            for head in anchor["heads"]:
                check_anchored_head(head, report, selected, where)


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def anchor_problem(anchor: dict[str, Any], expected_previous: str | None) -> str | None:
    if anchor.get("format") != ANCHOR_FORMAT:
        return f"format is not {ANCHOR_FORMAT!r}"
    if not heads_readable(anchor):
        return "heads must be a list of {job_uuid, tenant, job, version, chain_hash}"
    if anchor.get("previous_sha256") != expected_previous:
        return "does not follow the line before it (an anchor line edited, removed or inserted)"
    if anchor.get("jobs") != len(anchor["heads"]):
        return f"says {anchor.get('jobs')} jobs but holds {len(anchor['heads'])} heads"
    root = anchor.get("merkle_root")
    if root != merkle_root(anchor["heads"]):
        return "the Merkle root is not its heads' (the line was edited)"
    if "rfc3161" in anchor:
        return timestamp_problem(anchor["rfc3161"], root)
    return None


def heads_readable(anchor: dict[str, Any]) -> bool:
    heads = anchor.get("heads")
    return isinstance(heads, list) and all(
        isinstance(head, dict)
        and is_uuid(head.get("job_uuid"))
        and type(head.get("version")) is int
        and isinstance(head.get("chain_hash"), str)
        for head in heads
    )


@dataclass(frozen=True)
class Selection:
    """Which jobs the export holds (its manifest's selection): an anchored job outside it
    is not expected in the file."""

    tenant: str | None = None
    job: str | None = None

    def holds(self, head: dict[str, Any]) -> bool:
        if self.tenant is None:
            return True
        if self.job is None:
            return bool(head.get("tenant") == self.tenant)
        return bool(head["job_uuid"] == job_uuid_of(self.tenant, self.job))

    @classmethod
    def of(cls, manifest: dict[str, Any] | None) -> Selection:
        chosen = (manifest or {}).get("selection")
        if not isinstance(chosen, dict) or not isinstance(chosen.get("tenant"), str):
            return cls()
        job = chosen.get("job")
        return cls(chosen["tenant"], job if isinstance(job, str) else None)


def check_anchored_head(
    head: dict[str, Any], report: Report, selected: Selection, where: str
) -> None:
    """The export must still hold the anchored version with the anchored hash. A job
    cut back (or missing whole) fails at the first version it lacks, as a gap would."""
    version = head["version"]
    job = report.jobs.get(head["job_uuid"])
    if job is None:
        if not selected.holds(head):
            return
        report.jobs[head["job_uuid"]] = job = Job.named_by(head)
    held = len(job.lines)
    if version > held:
        ends = f"the export ends at v{held} (rolled back)" if held else "not in the export"
        job.fail(held + 1, f"anchored at v{version} ({where}); {ends}")
    elif version < 1 or job.lines[version - 1].get("chain_hash") != head["chain_hash"]:
        job.fail(version, f"anchored v{version} ({where}) had another chain hash (rewritten)")


# ---- RFC 3161: the token's message imprint ---------------------------------------------------

OID_SIGNED_DATA: Final = bytes.fromhex("2a864886f70d010702")  # 1.2.840.113549.1.7.2
OID_TST_INFO: Final = bytes.fromhex("2a864886f70d0109100104")  # 1.2.840.113549.1.9.16.1.4
OID_SHA256: Final = bytes.fromhex("608648016503040201")  # 2.16.840.1.101.3.4.2.1


def der_items(data: bytes) -> Iterator[tuple[int, bytes]]:
    """(tag, contents) of each DER element in ``data``, in order (low tag numbers only:
    all a TimeStampToken's path to its imprint uses)."""
    position = 0
    while position < len(data):
        tag, length = data[position], data[position + 1]
        position += 2
        if length & 0x80:
            size = length & 0x7F
            if size == 0 or size > 4 or position + size > len(data):
                raise ValueError("bad DER length")
            length = int.from_bytes(data[position : position + size], "big")
            position += size
        if position + length > len(data):
            raise ValueError("DER element runs past its container")
        yield tag, data[position : position + length]
        position += length


def der_children(contents: bytes, *tags: int) -> list[bytes]:
    """The contents of the first ``len(tags)`` children, which must have those tags."""
    items = list(der_items(contents))
    if len(items) < len(tags) or any(
        item[0] != tag for item, tag in zip(items, tags, strict=False)
    ):
        raise ValueError("not the structure of a TimeStampToken")
    return [item[1] for item in items[: len(tags)]]


SEQUENCE, SET, OID, OCTETS, INTEGER, EXPLICIT_0 = 0x30, 0x31, 0x06, 0x04, 0x02, 0xA0


def token_imprint(token: bytes) -> tuple[bytes, bytes]:
    """(hash algorithm OID, hashed message) of a DER TimeStampToken: ContentInfo ->
    SignedData -> encapContentInfo -> TSTInfo -> messageImprint (RFC 3161 section 2.4.2)."""
    (content_info,) = der_children(token, SEQUENCE)
    kind, signed = der_children(content_info, OID, EXPLICIT_0)
    (signed_data,) = der_children(signed, SEQUENCE)
    _, _, encapsulated = der_children(signed_data, INTEGER, SET, SEQUENCE)
    content_type, wrapped = der_children(encapsulated, OID, EXPLICIT_0)
    (tst_der,) = der_children(wrapped, OCTETS)
    (tst_info,) = der_children(tst_der, SEQUENCE)
    _, _, imprint = der_children(tst_info, INTEGER, OID, SEQUENCE)
    algorithm, hashed = der_children(imprint, SEQUENCE, OCTETS)
    (algorithm_oid,) = der_children(algorithm, OID)
    if kind != OID_SIGNED_DATA or content_type != OID_TST_INFO:
        raise ValueError("not a TimeStampToken (content types)")
    return algorithm_oid, hashed


def timestamp_problem(stamp: object, root: str) -> str | None:
    if not isinstance(stamp, dict) or not isinstance(stamp.get("token"), str):
        return "rfc3161 must be {tsa, token}"
    try:
        token = base64.b64decode(stamp["token"], validate=True)
        algorithm, hashed = token_imprint(token)
    except (ValueError, binascii.Error) as error:
        return f"the RFC 3161 token cannot be read: {error}"
    if algorithm != OID_SHA256:
        return "the RFC 3161 token's imprint is not SHA-256"
    if hashed != hashlib.sha256(bytes.fromhex(root)).digest():
        return "the RFC 3161 token stamps another Merkle root"
    return None


# ---- the run ---------------------------------------------------------------------------------


def verify(
    export: Path,
    keyring: dict[str, Key] | None = None,
    anchors: Sequence[Path] = (),
    unsigned_before: datetime | None = None,
) -> Report:
    report = Report(signatures_checked=keyring is not None)
    manifest = read_export(export, report)
    for job in report.jobs.values():
        check_job(job, keyring, unsigned_before)
    check_family(report)
    check_manifest(manifest, report)
    for path in anchors:
        check_anchor_file(path, report, Selection.of(manifest))
    return report


def check_family(report: Report) -> None:
    """Every parent-child link the export holds is named at both ends."""
    spawned: dict[str, set[str]] = {}
    for job in report.jobs.values():
        ids = spawned.setdefault(job.job_uuid, set())
        for line in job.lines:
            data = _data(line)
            if line.get("type") == "ChildrenSpawned" and isinstance(data.get("children"), list):
                ids.update(str(c.get("job_id")) for c in data["children"] if isinstance(c, dict))
            elif line.get("type") == "ChildFinished" and data.get("child_job_id") not in ids:
                why = f"records the end of {data.get('child_job_id')!r}, a child it never spawned"
                report.problems.append(Problem("family", f"{job.label()}: {why}"))
    for job in report.jobs.values():
        first = job.lines[0] if job.lines else {}
        link = _data(first).get("parent") if first.get("type") == "Submitted" else None
        if not isinstance(link, dict):
            continue
        parent = job_uuid_of(str(job.tenant), str(link.get("job_id")))
        if parent in spawned and str(job.job) not in spawned[parent]:
            why = f"names {link.get('job_id')!r} as its parent, which never spawned it"
            report.problems.append(Problem("family", f"{job.label()}: {why}"))


def _data(line: dict[str, Any]) -> dict[str, Any]:
    data = line.get("data")
    return data if isinstance(data, dict) else {}


def report_document(report: Report) -> dict[str, Any]:
    return {
        "verified": report.verified,
        "events": report.events,
        "signatures_checked": report.signatures_checked,
        "anchors_read": report.anchors_read,
        "jobs": [
            {
                "job_uuid": job.job_uuid,
                "tenant": job.tenant,
                "job": job.job,
                "events": len(job.lines),
                "verified": job.failure is None,
                "version": job.failure.version if job.failure else None,
                "reason": job.failure.reason if job.failure else None,
            }
            for job in sorted(report.jobs.values(), key=lambda job: job.job_uuid)
        ],
        "problems": [{"where": p.where, "reason": p.reason} for p in report.problems],
    }


def print_report(report: Report, anchors: Sequence[Path]) -> None:
    for job in sorted(report.jobs.values(), key=lambda job: job.job_uuid):
        if job.failure is None:
            print(f"OK    {job.label()}: {len(job.lines)} events")
        else:
            print(f"FAIL  {job.label()}: v{job.failure.version}: {job.failure.reason}")
    for problem in report.problems:
        print(f"FAIL  {problem.where}: {problem.reason}")
    failed = sum(job.failure is not None for job in report.jobs.values())
    print(
        f"{len(report.jobs)} job(s), {report.events} events, {failed} failing; "
        f"{len(report.problems)} problem(s) in the file, manifest or anchors"
    )
    print(
        "signatures: checked against the keyring"
        if report.signatures_checked
        else "signatures: NOT checked (no --keyring)"
    )
    if anchors:
        print(f"anchors: {report.anchors_read} anchor line(s) read from {len(anchors)} file(s)")
    print("VERIFIED" if report.verified else "NOT VERIFIED")


def arguments(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="jobledger-verify",
        description="Verify a jobledger export: chains, signatures, manifest, anchors. "
        "Exit 0: verified; 1: does not verify; 2: an input cannot be read.",
    )
    parser.add_argument("export", type=Path, help="the export file (jobledger export > FILE)")
    parser.add_argument("--keyring", type=Path, help="published public keys: check signatures")
    parser.add_argument(
        "--anchors",
        type=Path,
        nargs="+",
        default=[],
        metavar="FILE",
        help="anchor files (or Kafka topic dumps, one record value per line)",
    )
    parser.add_argument(
        "--unsigned-before",
        metavar="TIME",
        help="with --keyring: accept unsigned events dated before TIME (ISO 8601)",
    )
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    options = arguments(argv)
    try:
        keyring = read_keyring(options.keyring) if options.keyring else None
        before = None
        if options.unsigned_before is not None:
            try:
                before = parse_time(options.unsigned_before)
            except ValueError:
                raise UnreadableError(
                    f"--unsigned-before: not an ISO 8601 time: {options.unsigned_before!r}"
                ) from None
        report = verify(options.export, keyring, options.anchors, before)
    except UnreadableError as error:
        print(f"error: {error}", file=sys.stderr)
        return EXIT_UNREADABLE
    if options.json:
        print(json.dumps(report_document(report), indent=2, ensure_ascii=False))
    else:
        print_report(report, options.anchors)
    return EXIT_VERIFIED if report.verified else EXIT_NOT_VERIFIED


if __name__ == "__main__":
    sys.exit(main())
