"""Tamper evidence: recompute every job's chain from the stored rows and name the first
broken link; with anchors, also catch a history rolled back to an earlier state.

What each kind of tampering looks like:

- ``edited``: a stored event no longer matches its chain hash (a field changed, or an
  event before it was rewritten with a new hash);
- ``deleted``: a version is missing (a gap), or an anchored job has no events at all;
- ``reordered``: an event sits at another version than the one its hash was made for
  (found by trying the other stored events at the broken position);
- ``undecodable``: a row no longer decodes as a job event;
- ``moved``: a row holds another job's event (its body, which the chain hash and the
  signature cover, names another job than the row is stored under): rows were moved
  between jobs, each still as written;
- ``truncated``: the newest events are gone, back to an internally consistent state
  (only an anchor shows it: the anchored version is missing);
- ``rewritten``: the chain holds, but the hash at an anchored version is not the one
  anchored (the history from there on was recomputed);
- ``unsigned``, ``signature``: with a keyring, an event without a signature (one older
  than ``unsigned_before`` aside), or whose signature does not hold by a key the keyring
  knows and that was valid at the event's time. A history rewritten and re-hashed by
  someone without a signing key is caught here, without anchors.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from uuid import UUID

from jobledger.adapters.event_store import EventSourcedJobStore
from jobledger.audit.anchors import Anchor, AnchorLog, AnchorSink, Head, make_anchor
from jobledger.audit.errors import AnchorRefusedError
from jobledger.audit.log import StoredRecord, job_uuids, read_job, read_jobs
from jobledger.domain import chain
from jobledger.domain.job import Job
from jobledger.domain.retention import Tombstone
from jobledger.orchestration.ports import KeyringCheck

Progress = Callable[[int, int], None]
"""Called with (jobs done, jobs in all)."""


@dataclass(frozen=True)
class Finding:
    """The first broken link of a job: where, which event, what kind, and why."""

    version: int
    event_type: str
    """The event stored at ``version`` (``(missing)`` when there is none)."""
    kind: str
    reason: str


@dataclass(frozen=True)
class JobCheck:
    job_uuid: UUID
    tenant_id: str | None
    job_id: str | None
    events: int
    head: Head | None
    """The newest stored link (None when the job has no events left)."""
    broken: Finding | None
    anchored_version: int | None = None
    archived: str | None = None
    """For an archived job (``audit.archived``): where its archive is, and whether it
    was read and verified."""

    @property
    def intact(self) -> bool:
        return self.broken is None

    @property
    def label(self) -> str:
        if self.tenant_id is not None and self.job_id is not None:
            return f"{self.tenant_id}/{self.job_id}"
        return f"job {self.job_uuid}"


@dataclass(frozen=True)
class Signatures:
    """What verify holds each event's signature against."""

    keyring: KeyringCheck
    unsigned_before: datetime | None = None
    """Unsigned events older than this pass (a store that predates signing)."""


@dataclass(frozen=True)
class VerifyReport:
    jobs: tuple[JobCheck, ...]
    anchor_problems: tuple[str, ...] = ()
    anchors_read: int = 0
    signatures_checked: bool = False
    """False: no keyring was given, so who wrote the events was not checked."""

    @property
    def events(self) -> int:
        return sum(check.events for check in self.jobs)

    @property
    def broken(self) -> list[JobCheck]:
        return [check for check in self.jobs if check.broken is not None]

    @property
    def intact(self) -> bool:
        return not self.broken and not self.anchor_problems


def check_job(
    job_uuid: UUID,
    records: Sequence[StoredRecord],
    anchored: tuple[Head, Anchor] | None = None,
    signatures: Signatures | None = None,
) -> JobCheck:
    """Recompute one job's chain from its stored rows (in version order), each event's
    signature checked as it comes (with ``signatures``), and hold its newest anchored
    head against them. The finding is the first version that fails, whichever check it
    fails: the order of docs/evidence-format.md, which jobledger-verify follows too."""
    tenant_id, job_id = _names(records, anchored)
    broken = _chain_break(records, signatures)
    if anchored is not None:
        pinned = _anchor_break(records, *anchored)
        if pinned is not None and (broken is None or pinned.version < broken.version):
            broken = pinned
    head = None
    if records and records[-1].event is not None:
        last = records[-1]
        assert last.event is not None
        head = Head(job_uuid, tenant_id, job_id, last.version, _stored_hash(last.event) or "")
    return JobCheck(
        job_uuid=job_uuid,
        tenant_id=tenant_id,
        job_id=job_id,
        events=len(records),
        head=head,
        broken=broken,
        anchored_version=anchored[0].version if anchored else None,
    )


def verify_store(
    store: EventSourcedJobStore,
    anchors: AnchorLog | None = None,
    progress: Progress | None = None,
    *,
    tenant_id: str | None = None,
    signatures: Signatures | None = None,
) -> VerifyReport:
    """Every job in the log (and every anchored job, even if it is gone from the log), or
    with ``tenant_id`` that tenant's. A job is placed by its stored ``Submitted`` (or its
    anchored head); one that neither places is reported for every tenant, since hiding a
    tampered history is worse than showing an unplaceable one."""
    anchored = anchors.latest_heads() if anchors is not None else {}
    buried = {t.job_uuid: t for t in store.tombstones_of()}
    uuids = sorted(set(job_uuids(store)) | set(anchored) | set(buried))
    checks = []
    for done, (job_uuid, records) in enumerate(read_jobs(store, uuids), start=1):
        tombstone = buried.get(job_uuid) if not records else None
        if tombstone is not None:
            check = tombstone_check(tombstone, anchored.get(job_uuid))
        else:
            check = check_job(job_uuid, records, anchored.get(job_uuid), signatures)
        if tenant_id is None or check.tenant_id in (tenant_id, None):
            checks.append(check)
        if progress is not None:
            progress(done, len(uuids))
    return _report(tuple(checks), anchors, signatures)


def verify_one(
    store: EventSourcedJobStore,
    job_uuid: UUID,
    anchors: AnchorLog | None = None,
    signatures: Signatures | None = None,
) -> VerifyReport:
    anchored = anchors.latest_heads() if anchors is not None else {}
    records = read_job(store, job_uuid)
    tombstone = store.tombstone(job_uuid) if not records else None
    if tombstone is not None:
        check = tombstone_check(tombstone, anchored.get(job_uuid))
    else:
        check = check_job(job_uuid, records, anchored.get(job_uuid), signatures)
    return _report((check,), anchors, signatures)


def tombstone_check(tombstone: Tombstone, anchored: tuple[Head, Anchor] | None) -> JobCheck:
    """An archived job, by its tombstone alone (``audit.archived`` reads its archive):
    its head stands for the job's, and must be at or past, and agree with, the newest
    anchored one. Anchors taken after the archive keep pinning it."""
    head = Head(
        tombstone.job_uuid,
        tombstone.tenant_id,
        tombstone.job_id,
        tombstone.version,
        tombstone.chain_hash,
    )
    broken = None
    if anchored is not None:
        pinned, _ = anchored
        if pinned.version > tombstone.version or (
            pinned.version == tombstone.version and pinned.chain_hash != tombstone.chain_hash
        ):
            broken = Finding(
                pinned.version,
                "(archived)",
                "rewritten",
                f"anchored at v{pinned.version} {pinned.chain_hash}, but the job's tombstone "
                f"holds v{tombstone.version} {tombstone.chain_hash}",
            )
    return JobCheck(
        job_uuid=tombstone.job_uuid,
        tenant_id=tombstone.tenant_id,
        job_id=tombstone.job_id,
        events=0,
        head=head,
        broken=broken,
        anchored_version=anchored[0].version if anchored else None,
        archived=f"archived to {tombstone.archive_ref}",
    )


def _report(
    checks: tuple[JobCheck, ...], anchors: AnchorLog | None, signatures: Signatures | None
) -> VerifyReport:
    return VerifyReport(
        jobs=checks,
        anchor_problems=anchors.problems if anchors is not None else (),
        anchors_read=len(anchors.anchors) if anchors is not None else 0,
        signatures_checked=signatures is not None,
    )


def take_anchor(
    store: EventSourcedJobStore,
    sink: AnchorSink,
    now: datetime,
    previous: AnchorLog | None = None,
    progress: Progress | None = None,
) -> tuple[Anchor, VerifyReport]:
    """Verify every chain (and the anchors taken before, when given), then append the
    head of every job and their Merkle root to ``sink`` as one line. Refuses, writing
    nothing, if anything is broken: an anchor must never pin a tampered history."""
    report = verify_store(store, previous, progress)
    if not report.intact:
        raise AnchorRefusedError(_refusal(report))
    heads = [check.head for check in report.jobs if check.head is not None]
    anchor = make_anchor(heads, now, sink.last_line())
    sink.append(anchor.to_line())
    return anchor, report


# ---- the checks --------------------------------------------------------------------------------


def _chain_break(
    records: Sequence[StoredRecord], signatures: Signatures | None = None
) -> Finding | None:
    """The first stored event that is missing, does not decode, is not the link after
    the one before it, or (with ``signatures``) is not signed as it should be."""
    previous = chain.GENESIS
    expected = 1
    for index, record in enumerate(records):
        if record.version != expected:
            return _gap(expected, record)
        event = record.event
        if record.moved is not None:
            return Finding(record.version, record.event_type, "moved", record.moved)
        if event is None:
            return Finding(
                record.version, record.event_type, "undecodable", f"the stored event {record.error}"
            )
        stored = _stored_hash(event)
        if stored is None or not chain.holds_at(previous, event, record.version):
            return _mismatch(records, index, previous)
        unsigned = _signature_break(record, event, signatures) if signatures else None
        if unsigned is not None:
            return unsigned
        previous = stored
        expected += 1
    return None


def _signature_break(
    record: StoredRecord, event: Job.Event, signatures: Signatures
) -> Finding | None:
    """Whether the keyring vouches for the writer of this (well-linked) event."""
    sealed = chain.attached(event)
    signer, signature = (sealed.signer, sealed.signature) if sealed else (None, None)
    event_type = type(event).__qualname__
    if signature is None:
        cutoff = signatures.unsigned_before
        if cutoff is not None and event.timestamp < cutoff:
            return None
        why = "the event is not signed" + (
            f" (and is not older than {cutoff.isoformat()})" if cutoff is not None else ""
        )
        return Finding(record.version, event_type, "unsigned", why)
    failed = signatures.keyring.check(signer, signature, event.chain_hash, event.timestamp)
    if failed is not None:
        return Finding(record.version, event_type, "signature", failed)
    return None


def _stored_hash(event: Job.Event) -> str | None:
    """The chain hash the row holds (a tampered row may hold none)."""
    value = vars(event).get(chain.CHAIN_FIELD)
    return value if isinstance(value, str) else None


def _gap(expected: int, record: StoredRecord) -> Finding:
    missing = (
        f"v{expected}" if record.version == expected + 1 else f"v{expected}..v{record.version - 1}"
    )
    before = f"v{expected - 1}" if expected > 1 else "the start"
    return Finding(
        expected,
        "(missing)",
        "deleted",
        f"{missing} missing: the stored history jumps from {before} to v{record.version} "
        f"({record.event_type}); an event was deleted",
    )


def _mismatch(records: Sequence[StoredRecord], index: int, previous: str) -> Finding:
    record = records[index]
    assert record.event is not None
    event_type = type(record.event).__qualname__
    for other in records:
        if other is record or other.event is None:
            continue
        if chain.holds_at(previous, other.event, record.version):
            return Finding(
                record.version,
                event_type,
                "reordered",
                f"the event stored at v{other.version} ({other.event_type}) belongs at "
                f"v{record.version}: the history was reordered",
            )
    return Finding(
        record.version,
        event_type,
        "edited",
        "the event does not match its chain hash: a field was edited "
        "(or the event before it was rewritten)",
    )


def _anchor_break(records: Sequence[StoredRecord], head: Head, anchor: Anchor) -> Finding | None:
    """The anchored version must still be stored, with the anchored hash. A history cut
    back (or deleted whole) fails at the first anchored version it lacks."""
    pinned = f"anchored at v{head.version} on {anchor.anchored_at.isoformat()}"
    if anchor.line_number:
        pinned += f" (anchor line {anchor.line_number})"
    if not records:
        return Finding(
            1,
            "(missing)",
            "deleted",
            f"{pinned}, but the store holds no event of the job: it was deleted",
        )
    last = records[-1]
    if last.version < head.version:
        return Finding(
            last.version + 1,
            "(missing)",
            "truncated",
            f"{pinned}, but the store holds only v1..v{last.version}: the history was "
            "truncated or rolled back",
        )
    record = next((r for r in records if r.version == head.version), None)
    stored = _stored_hash(record.event) if record and record.event else None
    if record is not None and stored != head.chain_hash:
        return Finding(
            head.version,
            record.event_type,
            "rewritten",
            f"{pinned} with another chain hash: the history up to there was rewritten",
        )
    return None  # (a version missing below the last is the chain's finding, lower)


def _names(
    records: Sequence[StoredRecord], anchored: tuple[Head, Anchor] | None
) -> tuple[str | None, str | None]:
    first = records[0].event if records else None
    if isinstance(first, Job.Submitted):
        return first.tenant_id, first.job_id
    if anchored is not None:
        return anchored[0].tenant_id, anchored[0].job_id
    return None, None


def _refusal(report: VerifyReport) -> str:
    lines = [f"{len(report.broken)} broken chain(s); nothing anchored"]
    lines += [
        f"  {check.label}: v{check.broken.version} {check.broken.event_type}: {check.broken.reason}"
        for check in report.broken[:10]
        if check.broken is not None
    ]
    lines += [f"  {problem}" for problem in report.anchor_problems]
    return "\n".join(lines)
