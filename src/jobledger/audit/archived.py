"""Verifying a store with archived jobs: each tombstone stands for a job whose events
left the store. Its archive is read when it can be (a directory, a topic) and checked
as a stored history is (its sha256 against the tombstone, every link, every signature
with a keyring, the newest anchored head); when it cannot be, the tombstone's own head
is held against the anchors. A job anchored once that has neither events nor a
tombstone is still reported ``deleted`` by the chain checks (``audit.tamper``).
"""

from __future__ import annotations

from dataclasses import replace

from jobledger.adapters.event_store import EventSourcedJobStore
from jobledger.audit.anchors import Anchor, AnchorLog, Head
from jobledger.audit.archive import ArchiveUnreachableError, Reader, archived_events
from jobledger.audit.log import StoredRecord
from jobledger.audit.tamper import (
    Finding,
    JobCheck,
    Signatures,
    VerifyReport,
    check_job,
    tombstone_check,
)
from jobledger.domain.errors import JobLedgerError
from jobledger.domain.retention import Tombstone


def with_tombstones(
    store: EventSourcedJobStore,
    report: VerifyReport,
    anchors: AnchorLog | None,
    read: Reader,
    signatures: Signatures | None = None,
) -> VerifyReport:
    """``report`` (of ``verify_store`` or ``verify_one``) with each archived job (a
    tombstone's check) checked against its archive too, when it can be read."""
    anchored = anchors.latest_heads() if anchors is not None else {}
    checks = []
    for check in report.jobs:
        tombstone = store.tombstone(check.job_uuid) if check.archived is not None else None
        if tombstone is not None:
            check = check_archived(tombstone, anchored.get(check.job_uuid), read, signatures)
        checks.append(check)
    return replace(report, jobs=tuple(checks))


def check_archived(
    tombstone: Tombstone,
    anchored: tuple[Head, Anchor] | None,
    read: Reader,
    signatures: Signatures | None,
) -> JobCheck:
    where = f"archived to {tombstone.archive_ref}"
    try:
        events = archived_events(tombstone, read(tombstone.archive_ref))
    except ArchiveUnreachableError as error:
        check = tombstone_check(tombstone, anchored)
        return replace(check, archived=f"{where}; archive not read ({error})")
    except JobLedgerError as error:
        finding = Finding(tombstone.version, "(archive)", "archive", str(error))
        return replace(tombstone_check(tombstone, anchored), broken=finding)
    records = [StoredRecord(e.originator_id, e.originator_version, _topic(e), e) for e in events]
    check = check_job(tombstone.job_uuid, records, anchored, signatures)
    return replace(check, archived=f"{where}; archive verified")


def _topic(event: object) -> str:
    kind = type(event)
    return f"{kind.__module__}:{kind.__qualname__}"
