"""Archives of finished jobs: one job's export (``jobledger.export/2``, the format
``jobledger export`` writes and ``jobledger-verify`` reads) kept in a directory, one
file a job, or on a Kafka topic, one message a job (``audit.kafka_archive``).

Archiving one job: its export is written durably and read back (the digest compared),
THEN one store transaction deletes the job's rows and writes its tombstone (naming the
archive and its sha256). A crash before that transaction leaves the job whole in the
store and, maybe, its archive file without a tombstone: the next archive run writes the
file again (the same name) and goes on, and :meth:`DirectoryArchive.strays` finds the
files no tombstone names, which the run removes when their job is still in the store.

Restoring reads the archive the tombstone names, checks its digest, verifies it as
import does, and writes the very events back (the same rows: ids, versions, bytes,
chain hashes, signatures) with the tombstone's deletion, in one transaction.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, Protocol
from uuid import UUID

from jobledger.adapters.event_store import EventSourcedJobStore
from jobledger.adapters.tombstones import InTransaction
from jobledger.audit.errors import ImportRefusedError
from jobledger.audit.export import Selection, export_lines, read_histories
from jobledger.domain import chain
from jobledger.domain.errors import (
    ArchiveMismatchError,
    RetentionError,
    UnknownJobError,
)
from jobledger.domain.identity import job_uuid as job_uuid_of
from jobledger.domain.job import Job
from jobledger.domain.retention import Tombstone
from jobledger.domain.status import TERMINAL_STATUSES

DIR_PREFIX = "dir:"
SUFFIX = ".jsonl"


class ArchiveUnreachableError(RetentionError):
    """The archive a tombstone names cannot be read (moved, deleted, a broker down)."""


class ArchiveSink(Protocol):
    """Where archives go: ``write`` returns the reference a tombstone keeps, once the
    bytes are durable and read back intact."""

    def write(self, job_uuid: UUID, key: str, data: bytes) -> str: ...


class DirectoryArchive:
    """One file a job, ``<job uuid>.jsonl`` (a name no tenant or job id can steer),
    written to a temporary file, fsynced, renamed over, the directory fsynced."""

    def __init__(self, root: Path) -> None:
        self.root = root.resolve()
        try:
            self.root.mkdir(parents=True, exist_ok=True)
        except OSError as error:
            raise RetentionError(f"cannot use {root} as an archive: {error.strerror}") from None

    def path_of(self, job_uuid: UUID) -> Path:
        return self.root / f"{job_uuid}{SUFFIX}"

    def write(self, job_uuid: UUID, key: str, data: bytes) -> str:
        path = self.path_of(job_uuid)
        try:
            with tempfile.NamedTemporaryFile(
                dir=self.root, prefix=f".{job_uuid}.", suffix=".tmp", delete=False
            ) as tmp:
                tmp.write(data)
                tmp.flush()
                os.fsync(tmp.fileno())
            os.replace(tmp.name, path)
            _fsync_dir(self.root)
            written = path.read_bytes()
        except OSError as error:
            raise RetentionError(f"cannot write the archive {path}: {error.strerror}") from None
        if sha256(written) != sha256(data):
            raise RetentionError(f"the archive {path} does not read back as written")
        return DIR_PREFIX + str(path)

    def strays(self, buried: set[str]) -> list[Path]:
        """Files of this directory no tombstone names (``buried``: the references the
        store's tombstones hold), and temporary files a crash left."""
        found = []
        for path in sorted(self.root.iterdir()):
            temporary = path.name.startswith(".") and path.name.endswith(".tmp")
            unnamed = path.suffix == SUFFIX and DIR_PREFIX + str(path) not in buried
            if temporary or unnamed:
                found.append(path)
        return found


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def job_of_file(path: Path) -> UUID | None:
    """The job a ``<uuid>.jsonl`` archive file is named for (None: not such a name)."""
    try:
        return UUID(path.name.removesuffix(SUFFIX).lstrip(".").split(".")[0])
    except ValueError:
        return None


# ---- archiving one job ----------------------------------------------------------------------


@dataclass(frozen=True)
class Archived:
    tombstone: Tombstone
    bytes: int


def archive_job(
    store: EventSourcedJobStore,
    sink: ArchiveSink,
    tenant_id: str,
    job_id: str,
    now: datetime,
    also: InTransaction | None = None,
) -> Archived:
    """Archive one finished job: its export to ``sink`` (durable, read back), then one
    transaction deletes it and writes its tombstone (``also`` run in it)."""
    uuid = job_uuid_of(tenant_id, job_id)
    job = store.load(uuid)
    if job is None:
        raise UnknownJobError(tenant_id, job_id)
    if job.status not in TERMINAL_STATUSES:
        raise RetentionError(
            f"job {job_id!r} of tenant {tenant_id!r} is {job.status}: only a finished job is "
            "archived"
        )
    lines = export_lines(store, Selection(tenant_id, job_id), now)
    data, summary = _drain(lines)
    if summary.broken:
        raise RetentionError(
            f"job {job_id!r} of tenant {tenant_id!r}: its chain does not verify "
            f"({summary.broken[0]}): not archived (run jobledger verify)"
        )
    head = chain.parse(data.splitlines()[-1])["heads"][str(uuid)]
    ref = sink.write(uuid, f"{tenant_id}/{job_id}", data)
    tombstone = Tombstone(
        job_uuid=uuid,
        tenant_id=tenant_id,
        job_id=job_id,
        workflow_type=job.workflow_type,
        status=str(job.status),
        version=int(head["version"]),
        chain_hash=str(head["chain_hash"]),
        archive_ref=ref,
        archive_sha256=sha256(data),
        archived_at=now,
    )
    store.remove_archived(tombstone, also)
    return Archived(tombstone, len(data))


def _drain(lines: Iterator[str]) -> tuple[bytes, Any]:
    parts = []
    while True:
        try:
            parts.append(next(lines))
        except StopIteration as finished:
            return "".join(parts).encode(), finished.value


# ---- reading an archive back ----------------------------------------------------------------

Reader = Callable[[str], bytes]
"""Reads the archive a reference names (raises ArchiveUnreachableError)."""


def read_directory_ref(ref: str) -> bytes:
    if not ref.startswith(DIR_PREFIX):
        raise ArchiveUnreachableError(f"not a directory archive reference: {ref!r}")
    path = Path(ref.removeprefix(DIR_PREFIX))
    try:
        return path.read_bytes()
    except OSError as error:
        raise ArchiveUnreachableError(f"cannot read the archive {path}: {error.strerror}") from None


def archived_events(tombstone: Tombstone, data: bytes) -> list[Job.Event]:
    """The job's events in its archive, refused unless the bytes are the ones archived
    (their sha256), verify as jobledger-verify checks a file, and end at the tombstone's
    head."""
    if sha256(data) != tombstone.archive_sha256:
        raise ArchiveMismatchError(
            f"the archive {tombstone.archive_ref} is not the one job {tombstone.job_id!r} of "
            f"tenant {tombstone.tenant_id!r} was archived to (sha256 {sha256(data)}, "
            f"tombstone {tombstone.archive_sha256})"
        )
    with _as_file(data) as path:
        try:
            histories = read_histories(path)
        except ImportRefusedError as error:
            raise ArchiveMismatchError(f"the archive {tombstone.archive_ref}: {error}") from None
    events = histories.get(tombstone.job_uuid)
    if not events or len(histories) != 1:
        raise ArchiveMismatchError(
            f"the archive {tombstone.archive_ref} does not hold job {tombstone.job_id!r} of "
            f"tenant {tombstone.tenant_id!r} alone"
        )
    last = events[-1]
    if (last.originator_version, last.chain_hash) != (tombstone.version, tombstone.chain_hash):
        raise ArchiveMismatchError(
            f"the archive {tombstone.archive_ref} ends at v{last.originator_version}, the "
            f"tombstone of job {tombstone.job_id!r} at v{tombstone.version}"
        )
    return events


@contextmanager
def _as_file(data: bytes) -> Iterator[Path]:
    """The verifier and the import read files: the bytes in one of this process's own."""
    with tempfile.NamedTemporaryFile(suffix=SUFFIX) as tmp:
        tmp.write(data)
        tmp.flush()
        yield Path(tmp.name)


def restore_job(
    store: EventSourcedJobStore,
    tenant_id: str,
    job_id: str,
    read: Reader,
    ref: str | None = None,
    also: Callable[[list[Job.Event]], InTransaction] | None = None,
) -> Tombstone:
    """Bring an archived job back, byte for byte, from the archive its tombstone names
    (or ``ref``: the same archive, moved), in one transaction with the tombstone's
    deletion (``also(events)`` run in it)."""
    uuid = job_uuid_of(tenant_id, job_id)
    tombstone = store.tombstone(uuid)
    if tombstone is None:
        if store.load(uuid) is not None:
            raise RetentionError(f"job {job_id!r} of tenant {tenant_id!r} is not archived")
        raise UnknownJobError(tenant_id, job_id)
    events = archived_events(tombstone, read(ref or tombstone.archive_ref))
    store.restore_archived(tombstone, events, also(events) if also is not None else None)
    return tombstone
