"""Export and import: a store's job histories as canonical JSON lines, and back.

An export (``jobledger.export/2``) is one line per event, in job id then version order::

    {"chain_hash":"…","data":{…},"job":"j1","job_uuid":"…","record":"event",
     "signature":"…","signer":"k-2026-12","tenant":"acme",
     "timestamp":"2026-01-01T00:00:00+00:00","type":"StepRecorded","version":3}

(``signature``/``signer`` only on signed events) and, last, one manifest line
(``"record":"manifest"``: format, export time, counts, every job's head hash, any broken
chain). Each line is canonical JSON (sorted keys, no spaces, UTF-8), built from the
event's stored form: ``data`` holds its fields exactly as the chain hashed them (personal
values sealed, times in ISO 8601, amounts as strings), so a file verifies with the
standard library alone: ``sha256(previous + {"fields": {originator_id: job_uuid,
originator_version: version, timestamp, **data}, "type": "Job." + type})``, and each
signature over ``jobledger.event/1\n<signer>\n<chain_hash>`` with the keyring.

Import reads /1 (the same lines, unsigned) and /2. It refuses, writing nothing, a file
that does not verify as ``jobledger-verify`` checks it (``jobledger.audit.verifier``, called
here: every line canonical and naming its job, the chains, the manifest, the family),
that does not rebuild into stored events, or a target store that is not empty. It then
writes the very same events (ids, versions, timestamps, the bytes hashed, chain hashes
and signatures as exported: nothing is sealed, hashed or signed again) job by job, with
the at-most-once keys their events consumed (the submit key, token nonces, signal ids,
approval ids; a step's key is its record itself), so nothing can be done twice after an
import that was done once before it.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Generator, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, Final, TextIO
from uuid import UUID

from eventsourcing.persistence import IntegrityError

from jobledger.adapters.event_store import EventSourcedJobStore
from jobledger.adapters.store_errors import store_errors
from jobledger.audit import verifier
from jobledger.audit.errors import ImportRefusedError
from jobledger.audit.log import events_of, is_empty, job_uuids, read_jobs
from jobledger.audit.tamper import JobCheck, check_job
from jobledger.domain import chain, event_decoding
from jobledger.domain.errors import UnknownJobError
from jobledger.domain.identity import job_uuid as job_uuid_of
from jobledger.domain.job import Job
from jobledger.domain.keys import ConsumedKey, KeyKind

EXPORT_FORMAT: Final = "jobledger.export/2"

Progress = Callable[[int, int], None]


# ---- export ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Selection:
    """What to export: one job (tenant and job), one tenant, or everything."""

    tenant_id: str | None = None
    job_id: str | None = None

    def document(self) -> dict[str, Any]:
        if self.job_id is not None:
            return {"tenant": self.tenant_id, "job": self.job_id}
        if self.tenant_id is not None:
            return {"tenant": self.tenant_id}
        return {"all": True}


@dataclass(frozen=True)
class ExportSummary:
    jobs: int
    events: int
    broken: tuple[str, ...] = ()
    """Jobs whose stored chain does not verify (exported as stored; import refuses them)."""


def event_document(event: Job.Event, tenant_id: str | None, job_id: str | None) -> dict[str, Any]:
    """The export line of an event, from its stored form (the sealed fields, not the
    opened ones: a personal value leaves the store as its ciphertext)."""
    sealed = chain.sealed_form(event)
    data = dict(chain.parse(sealed.body)["fields"])
    job_uuid = data.pop("originator_id")
    version = data.pop("originator_version")
    timestamp = data.pop("timestamp")
    document = {
        "record": "event",
        "tenant": tenant_id,
        "job": job_id,
        "job_uuid": job_uuid,
        "version": version,
        "type": type(event).__name__,
        "timestamp": timestamp,
        "data": data,
        "chain_hash": sealed.chain_hash,
    }
    if sealed.signature is not None:
        document["signature"] = sealed.signature
        document["signer"] = sealed.signer
    return document


def export_jobs(
    store: EventSourcedJobStore,
    out: TextIO,
    selection: Selection,
    now: datetime,
    progress: Progress | None = None,
) -> ExportSummary:
    """Write the selected jobs' events, then the manifest, to ``out``."""
    lines = export_lines(store, selection, now, progress)
    while True:
        try:
            out.write(next(lines))
        except StopIteration as finished:  # the generator returns the summary
            out.flush()
            summary: ExportSummary = finished.value
            return summary


def export_lines(
    store: EventSourcedJobStore,
    selection: Selection,
    now: datetime,
    progress: Progress | None = None,
) -> Generator[str, None, ExportSummary]:
    """The export line by line (each ending in a newline), as it is read: an HTTP
    response streams it as it goes. The manifest is the last line, so a stream cut off
    part way is refused by import. Returns the summary."""
    if selection.job_id is not None:
        assert selection.tenant_id is not None
        uuids = [job_uuid_of(selection.tenant_id, selection.job_id)]
    else:
        uuids = job_uuids(store)
    heads: dict[str, dict[str, Any]] = {}
    broken: list[str] = []
    events = 0
    for done, (job_uuid, records) in enumerate(read_jobs(store, uuids), start=1):
        if progress is not None:
            progress(done, len(uuids))
        if not records:
            assert selection.tenant_id is not None and selection.job_id is not None
            raise UnknownJobError(selection.tenant_id, selection.job_id)
        check = check_job(job_uuid, records)
        if selection.tenant_id is not None and check.tenant_id != selection.tenant_id:
            # A job its stored events do not place (its Submitted does not decode, or is
            # another job's) is broken in every tenant's export, as in verify's report,
            # but none of its lines leave: they may be another tenant's.
            if check.tenant_id is None and check.broken is not None:
                broken.append(_broken(check))
            continue
        job_events = events_of(records)
        for event in job_events:
            yield chain.canonical_json(event_document(event, check.tenant_id, check.job_id)) + "\n"
        events += len(job_events)
        if check.broken is not None:
            broken.append(_broken(check))
        if job_events:
            last = job_events[-1]
            heads[str(job_uuid)] = {
                "tenant": check.tenant_id,
                "job": check.job_id,
                "version": last.originator_version,
                "chain_hash": last.chain_hash,
            }
    manifest = {
        "record": "manifest",
        "format": EXPORT_FORMAT,
        "exported_at": now,
        "selection": selection.document(),
        "jobs": len(heads),
        "events": events,
        "heads": heads,
        "broken": broken,
    }
    yield chain.canonical_json(manifest) + "\n"
    return ExportSummary(len(heads), events, tuple(broken))


def _broken(check: JobCheck) -> str:
    assert check.broken is not None
    found = check.broken
    return f"{check.label}: v{found.version} {found.event_type}: {found.kind}: {found.reason}"


# ---- import ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class ImportSummary:
    jobs: int
    events: int
    keys: int


@dataclass
class _JobLines:
    job_uuid: UUID
    tenant_id: str
    job_id: str
    first_line: int
    documents: list[dict[str, Any]] = field(default_factory=list)


def import_file(
    store: EventSourcedJobStore, path: str | Path, progress: Progress | None = None
) -> ImportSummary:
    """Check the whole file (every chain, the manifest) and that the store is empty,
    then append every job's events and keys; refuses before writing anything."""
    source = Path(path)
    if not is_empty(store):
        raise ImportRefusedError(
            "the target store is not empty: import only into a fresh store (nothing written)"
        )
    jobs, events = _check_file(source)
    keys = 0
    for done, lines in enumerate(_job_groups(source), start=1):
        job_events = [_event(document, source, lines.first_line) for document in lines.documents]
        keys += _append(store, job_events)
        if progress is not None:
            progress(done, jobs)
    return ImportSummary(jobs, events, keys)


def read_histories(source: Path) -> dict[UUID, list[Job.Event]]:
    """Every job's events in a file that verifies (checked as import checks it), rebuilt
    with their stored forms: an archive read back to be restored."""
    _check_file(source)
    return {
        lines.job_uuid: [_event(doc, source, lines.first_line) for doc in lines.documents]
        for lines in _job_groups(source)
    }


def _check_file(source: Path) -> tuple[int, int]:
    """Pass one: the file verifies as jobledger-verify checks it (every line canonical,
    every job's lines, versions and chain, the manifest, the family), and each history
    rebuilds into events this store can hold."""
    _verify(source)
    jobs = events = 0
    for lines in _job_groups(source):
        job_events = [_event(document, source, lines.first_line) for document in lines.documents]
        where = f"{source}: job {lines.tenant_id}/{lines.job_id}"
        first = job_events[0]
        if not isinstance(first, Job.Submitted):
            raise ImportRefusedError(f"{where}: the history does not start with Submitted")
        if (first.tenant_id, first.job_id) != (lines.tenant_id, lines.job_id):
            raise ImportRefusedError(f"{where}: its lines name another job than its events")
        # The rows as they will be written (rebuilt from the lines) must hold too.
        broken = chain.verify(job_events)
        if broken is not None:
            raise ImportRefusedError(
                f"{where}: the chain does not verify at v{broken.version} "
                f"({broken.event_type}): {broken.reason} (nothing written)"
            )
        jobs += 1
        events += len(job_events)
    return jobs, events


def _verify(source: Path) -> None:
    """The standalone verifier's checks, shared (no keyring: the signatures are kept as
    they are, and checked by verify against a keyring)."""
    try:
        report = verifier.verify(source)
    except verifier.UnreadableError as error:
        raise ImportRefusedError(f"cannot read {error}") from None
    if report.verified:
        return
    found = [
        f"job {job.label()} v{job.failure.version}: {job.failure.reason}"
        for job in report.jobs.values()
        if job.failure is not None
    ]
    found += [f"{problem.where}: {problem.reason}" for problem in report.problems]
    more = f" (and {len(found) - 1} more)" if len(found) > 1 else ""
    raise ImportRefusedError(
        f"{source} does not verify (as jobledger-verify checks it): {found[0]}{more}; "
        "nothing written"
    )


def _lines(source: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    try:
        with source.open(encoding="utf-8") as file:
            for number, raw in enumerate(file, start=1):
                if not raw.strip():
                    continue
                try:
                    document = json.loads(raw)
                except json.JSONDecodeError as error:
                    raise ImportRefusedError(
                        f"{source} line {number}: not JSON: {error.msg}"
                    ) from None
                if not isinstance(document, dict):
                    raise ImportRefusedError(f"{source} line {number}: not a JSON object")
                yield number, document
    except (OSError, UnicodeDecodeError) as error:
        raise ImportRefusedError(f"cannot read {source}: {error}") from None


def _job_groups(source: Path) -> Iterator[_JobLines]:
    """Each job's event lines, which must be contiguous and in version order."""
    seen: set[UUID] = set()
    current: _JobLines | None = None
    for number, document in _lines(source):
        kind = document.get("record")
        if kind == "manifest":
            continue
        if kind != "event":
            raise ImportRefusedError(f"{source} line {number}: unknown record {kind!r}")
        try:
            job_uuid = UUID(str(document["job_uuid"]))
            tenant_id, job_id = str(document["tenant"]), str(document["job"])
        except (KeyError, ValueError) as error:
            raise ImportRefusedError(f"{source} line {number}: bad job fields: {error}") from None
        if current is None or current.job_uuid != job_uuid:
            if job_uuid in seen:
                raise ImportRefusedError(
                    f"{source} line {number}: the events of job {tenant_id}/{job_id} are "
                    "not contiguous"
                )
            seen.add(job_uuid)
            if current is not None:
                yield current
            current = _JobLines(job_uuid, tenant_id, job_id, number)
        current.documents.append(document)
    if current is not None:
        yield current


# ---- rebuilding the events ------------------------------------------------------------------


def _event(document: Mapping[str, Any], source: Path, line: int) -> Job.Event:
    """The stored event the line was exported from: same class, fields and types, with
    its stored form (the canonical bytes the line's fields make, its chain hash and
    signature) attached, to be written as it is."""
    where = f"{source} (job from line {line}), v{document.get('version')}"
    name = document.get("type")
    event_class = event_decoding.event_class(name) if isinstance(name, str) else None
    if event_class is None or "." in str(name):
        raise ImportRefusedError(f"{where}: unknown event type {name!r}")
    data = document.get("data")
    if not isinstance(data, dict):
        raise ImportRefusedError(f"{where}: data is not an object")
    expected = event_decoding.field_types(event_class)
    unknown = sorted(set(data) - set(expected))
    # A field added to an event class later (it has a default) is absent from older events.
    missing = sorted(set(expected) - set(data) - event_decoding.optional_fields(event_class))
    if unknown or missing:
        raise ImportRefusedError(f"{where}: fields unknown {unknown}, missing {missing}")
    signature, signer = document.get("signature"), document.get("signer")
    if not all(value is None or isinstance(value, str) for value in (signature, signer)):
        raise ImportRefusedError(f"{where}: signature and signer must be strings")
    try:
        fields = {
            "originator_id": str(document["job_uuid"]),
            "originator_version": int(document["version"]),
            "timestamp": str(document["timestamp"]),
            **data,
        }
        body = chain.canonical_bytes(event_class.__qualname__, fields)
        event = event_decoding.rebuild(event_class, fields)
        sealed = chain.Sealed(body, str(document["chain_hash"]), signature, signer)
    except (KeyError, ValueError, TypeError, ArithmeticError) as error:
        raise ImportRefusedError(f"{where}: {error}") from None
    chain.attach(event, sealed)
    return event


# ---- appending ------------------------------------------------------------------------------


def consumed_keys(events: list[Job.Event]) -> list[ConsumedKey]:
    """The at-most-once keys a history consumed, derived from its events. Its step keys
    are none of them: a step's key is its record's own identity (the job's version
    sequence refuses a second record of a step), written with the events themselves."""
    first = events[0]
    assert isinstance(first, Job.Submitted)
    found: dict[tuple[KeyKind, str], datetime] = {}

    def use(kind: KeyKind, key: str | None, at: datetime) -> None:
        if key is not None:
            found.setdefault((kind, key), at)

    for event in events:
        if isinstance(event, Job.Submitted):
            use(KeyKind.SUBMIT, event.submit_key, event.timestamp)
        elif isinstance(event, Job.Resumed):
            if event.source == "token":
                use(KeyKind.TOKEN, event.nonce, event.timestamp)
            elif event.source == "signal":
                use(KeyKind.SIGNAL, event.signal_id, event.timestamp)
        elif isinstance(event, Job.ResumeTokenReissued):
            use(KeyKind.TOKEN, event.previous_nonce, event.timestamp)  # voided, not used
        elif isinstance(event, Job.SignalBuffered):
            use(KeyKind.SIGNAL, event.signal_id, event.timestamp)
        elif isinstance(event, Job.ApprovalDecided):
            use(KeyKind.APPROVAL, event.approval_id, event.timestamp)
    return [
        ConsumedKey.consume(
            kind=kind,
            key=key,
            tenant_id=first.tenant_id,
            job_id=first.job_id,
            job_uuid=first.originator_id,
            timestamp=at,
        )
        for (kind, key), at in found.items()
    ]


def _append(store: EventSourcedJobStore, events: list[Job.Event]) -> int:
    """The job's events with the keys that live beside it in one transaction; a submit key
    whose id hashes to another partition in its own."""
    job_uuid = events[0].originator_id
    partition = store.partition(job_uuid)
    keys = consumed_keys(events)
    together: list[Any] = list(events)
    apart: list[ConsumedKey] = []
    for key in keys:
        # Where the engine writes and looks for it: most keys beside their job.
        if store.colocated(key.route, job_uuid):
            together.extend(key.collect_events())
        else:
            apart.append(key)
    try:
        with store_errors("importing"):
            partition.events.put(together)
            for key in apart:
                store.partition(key.route).events.put(list(key.collect_events()))
    except IntegrityError:
        raise ImportRefusedError(
            f"job {job_uuid} or one of its keys is already in the store (import stopped "
            "part way: start again on a fresh store)"
        ) from None
    job = store.load(job_uuid)
    if job is not None:
        store.snapshot_if_due(partition, job, 0)
    return len(keys)
