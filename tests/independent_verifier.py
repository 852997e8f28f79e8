"""A second verifier of jobledger evidence, written from docs/evidence-format.md alone (not
from jobledger.audit.verifier), to show the document is enough. Standard library and
`cryptography` only; it imports nothing of jobledger.

    python tests/independent_verifier.py EXPORT [--keyring F] [--anchors F ...]
                                         [--unsigned-before T]

Prints ``JOB <job_uuid> OK|<failing version>`` per job and ``PROBLEM <where>`` per problem
of the export, manifest or anchors; exits 0 verified, 1 not verified, 2 unreadable input.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import json
import re
import sys
import uuid
from datetime import UTC, datetime
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

NAMESPACE = uuid.UUID("6f1c3f0e-8a53-4f55-9a5e-4f3c0c7e2b11")
RESERVED = {"originator_id", "originator_version", "timestamp", "chain_hash"}
B64URL = re.compile(r"[A-Za-z0-9_-]*")


class Unreadable(Exception):
    pass


def canon(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def lines_of(path: str) -> list[str]:
    try:
        with open(path, "rb") as file:
            text = file.read().decode("utf-8")
    except (OSError, UnicodeDecodeError) as error:
        raise Unreadable(str(error)) from None
    return [line for line in text.split("\n") if line.strip()]


def instant(text: Any) -> datetime:
    if not isinstance(text, str):
        raise ValueError(text)
    moment = datetime.fromisoformat(text)
    return moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment


def b64url(text: str, size: int) -> bytes:
    if len(text) != (size * 4 + 2) // 3 or not B64URL.fullmatch(text):
        raise ValueError("bad base64url")
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def load_keyring(path: str) -> dict[str, tuple[Ed25519PublicKey, datetime, datetime | None]]:
    try:
        document = json.loads("\n".join(lines_of(path)))
        assert document["format"] == "jobledger.keyring/1"
        ring = {}
        for key in document["keys"]:
            assert key["algorithm"] == "ed25519" and isinstance(key["id"], str)
            assert key["id"] not in ring
            end = None if key["not_after"] is None else instant(key["not_after"])
            public = Ed25519PublicKey.from_public_bytes(b64url(key["public_key"], 32))
            ring[key["id"]] = (public, instant(key["not_before"]), end)
        return ring
    except (AssertionError, ValueError, KeyError, TypeError) as error:
        raise Unreadable(f"keyring: {error!r}") from None


def parse(line: str) -> Any:
    try:
        return json.loads(line)
    except ValueError:
        return None


def uuid_text(value: Any) -> bool:
    try:
        return isinstance(value, str) and str(uuid.UUID(value)) == value
    except ValueError:
        return False


def event_failure(
    raw: str, e: dict[str, Any], position: int, previous: str, ring: Any, before: Any
) -> bool:
    """True when the line at this position fails one of the checks of section 3."""
    if canon(e) != raw:
        return True
    strings = all(
        isinstance(e.get(k), str) for k in ("tenant", "job", "type", "timestamp", "chain_hash")
    )
    if not strings or type(e.get("version")) is not int or not isinstance(e.get("data"), dict):
        return True
    if RESERVED & e["data"].keys() or any(
        not isinstance(e.get(k, ""), str) for k in ("signer", "signature")
    ):
        return True
    try:
        at = instant(e["timestamp"])
    except ValueError:
        return True
    name = f"{len(e['tenant'])}:{e['tenant']}/{e['job']}"
    if str(uuid.uuid5(NAMESPACE, name)) != e["job_uuid"] or e["version"] != position:
        return True
    fields = dict(
        e["data"],
        originator_id=e["job_uuid"],
        originator_version=position,
        timestamp=e["timestamp"],
    )
    body = canon({"type": "Job." + e["type"], "fields": fields}).encode()
    if hashlib.sha256(previous.encode() + body).hexdigest() != e["chain_hash"]:
        return True
    return ring is not None and not signed_well(e, at, ring, before)


def signed_well(e: dict[str, Any], at: datetime, ring: Any, before: Any) -> bool:
    if "signer" not in e and "signature" not in e:
        return before is not None and at < before
    if "signer" not in e or "signature" not in e or e["signer"] not in ring:
        return False
    public, start, end = ring[e["signer"]]
    if not (start <= at and (end is None or at < end)):
        return False
    message = b"jobledger.event/1\n" + e["signer"].encode() + b"\n" + e["chain_hash"].encode()
    try:
        public.verify(b64url(e["signature"], 64), message)
        return True
    except Exception:
        return False


def merkle(heads: list[dict[str, Any]]) -> str:
    nodes = [
        hashlib.sha256(
            b"\0" + f"{h['job_uuid']}:{h['version']}:{h['chain_hash']}".encode()
        ).digest()
        for h in sorted(heads, key=lambda h: uuid.UUID(h["job_uuid"]).int)
    ]
    if not nodes:
        return hashlib.sha256().hexdigest()
    while len(nodes) > 1:
        odd = [nodes.pop()] if len(nodes) % 2 else []
        nodes = [
            hashlib.sha256(b"\1" + a + b).digest()
            for a, b in zip(nodes[::2], nodes[1::2], strict=True)
        ] + odd
    return nodes[0].hex()


def der(data: bytes) -> list[tuple[int, bytes]]:
    out, i = [], 0
    while i < len(data):
        tag, n = data[i], data[i + 1]
        i += 2
        if n > 0x80:
            n, i = int.from_bytes(data[i : i + n - 0x80], "big"), i + n - 0x80
        elif n == 0x80:
            raise ValueError("indefinite length")
        if i + n > len(data):
            raise ValueError("truncated")
        out.append((tag, data[i : i + n]))
        i += n
    return out


def imprint(token: bytes) -> tuple[bytes, bytes]:
    """messageImprint of a TimeStampToken, by the path of section 5."""
    content_info = der(der(token)[0][1])
    assert content_info[0] == (6, bytes.fromhex("2a864886f70d010702"))
    signed_data = der(der(content_info[1][1])[0][1])
    encap = der(signed_data[2][1])
    assert encap[0] == (6, bytes.fromhex("2a864886f70d0109100104"))
    tst_info = der(der(der(encap[1][1])[0][1])[0][1])
    algorithm, hashed = der(tst_info[2][1])
    return der(algorithm[1])[0][1], hashed[1]


def anchor_problem(a: Any, expected: str | None) -> bool:
    if not isinstance(a, dict) or a.get("format") != "jobledger.anchor/1" or not heads_ok(a):
        return True
    if a.get("previous_sha256") != expected or a.get("jobs") != len(a["heads"]):
        return True
    if a.get("merkle_root") != merkle(a["heads"]):
        return True
    if "rfc3161" not in a:
        return False
    try:
        algorithm, hashed = imprint(base64.b64decode(a["rfc3161"]["token"], validate=True))
    except Exception:
        return True
    root = hashlib.sha256(bytes.fromhex(a["merkle_root"])).digest()
    return algorithm != bytes.fromhex("608648016503040201") or hashed != root


def heads_ok(a: dict[str, Any]) -> bool:
    return isinstance(a.get("heads"), list) and all(
        isinstance(h, dict)
        and uuid_text(h.get("job_uuid"))
        and type(h.get("version")) is int
        and isinstance(h.get("chain_hash"), str)
        for h in a["heads"]
    )


def run(args: argparse.Namespace) -> tuple[dict[str, int | None], set[str]]:
    ring = load_keyring(args.keyring) if args.keyring else None
    try:
        before = instant(args.unsigned_before) if args.unsigned_before else None
    except ValueError:
        raise Unreadable("--unsigned-before") from None
    problems: set[str] = set()
    jobs: dict[str, list[tuple[str, dict[str, Any]]]] = {}
    manifest = None
    lines = lines_of(args.export)
    for n, raw in enumerate(lines):
        d = parse(raw)
        if isinstance(d, dict) and d.get("record") == "manifest":
            manifest = d
            if n != len(lines) - 1 or canon(d) != raw:
                problems.add("manifest")
        elif isinstance(d, dict) and d.get("record") == "event" and uuid_text(d.get("job_uuid")):
            jobs.setdefault(d["job_uuid"], []).append((raw, d))
        else:
            problems.add("export")

    failing: dict[str, int | None] = {}
    for job, entries in jobs.items():
        failing[job], previous = None, ""
        for position, (raw, e) in enumerate(entries, 1):
            if event_failure(raw, e, position, previous, ring, before):
                failing[job] = position
                break
            previous = e["chain_hash"]

    events = sum(map(len, jobs.values()))
    heads = {
        j: {k: entries[-1][1].get(k) for k in ("tenant", "job", "version", "chain_hash")}
        for j, entries in jobs.items()
    }
    if (
        manifest is None
        or manifest.get("format") not in ("jobledger.export/1", "jobledger.export/2")
        or manifest.get("jobs") != len(jobs)
        or manifest.get("events") != events
        or manifest.get("heads") != heads
        or manifest.get("broken") != []
    ):
        problems.add("manifest")

    selection = (manifest or {}).get("selection")
    for path in args.anchors:
        previous_line = None
        for raw in lines_of(path):
            a = parse(raw)
            expected = hashlib.sha256(previous_line.encode()).hexdigest() if previous_line else None
            previous_line = raw
            if anchor_problem(a, expected):
                problems.add("anchors")
            if isinstance(a, dict) and heads_ok(a):
                for h in a["heads"]:
                    anchored(h, jobs, failing, selection)
    return failing, problems


def anchored(h: dict[str, Any], jobs: Any, failing: dict[str, int | None], selection: Any) -> None:
    entries = jobs.get(h["job_uuid"])
    if entries is None:
        wanted = True
        if isinstance(selection, dict) and isinstance(selection.get("tenant"), str):
            if isinstance(selection.get("job"), str):
                name = f"{len(selection['tenant'])}:{selection['tenant']}/{selection['job']}"
                wanted = str(uuid.uuid5(NAMESPACE, name)) == h["job_uuid"]
            else:
                wanted = h.get("tenant") == selection["tenant"]
        if not wanted:
            return
    v, held = h["version"], len(entries or [])
    ok = 1 <= v <= held and entries[v - 1][1].get("chain_hash") == h["chain_hash"]
    at = min(v, held + 1)  # rolled back: the first version the export lacks
    if not ok and (failing.get(h["job_uuid"]) is None or at < failing[h["job_uuid"]]):  # type: ignore[operator]
        failing[h["job_uuid"]] = at


def arguments(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    parser.add_argument("export")
    parser.add_argument("--keyring")
    parser.add_argument("--anchors", nargs="+", default=[])
    parser.add_argument("--unsigned-before")
    return parser.parse_args(argv)


def main() -> int:
    try:
        failing, problems = run(arguments())
    except Unreadable as error:
        print(f"unreadable: {error}", file=sys.stderr)
        return 2
    for job in sorted(failing):
        print(f"JOB {job} {'OK' if failing[job] is None else failing[job]}")
    for where in sorted(problems):
        print(f"PROBLEM {where}")
    return 1 if problems or any(v is not None for v in failing.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
