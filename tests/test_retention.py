"""Retention and archival on SQLite and PostgreSQL: finished jobs past their retention
are exported (the verified export format) to an archive, removed from the store with a
tombstone in the same transaction, and restored byte for byte."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from uuid import uuid4

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from kafka import KafkaAdminClient
from kafka.admin import ConfigResource, ConfigResourceType
from pydantic import ValidationError

from jobledger import EngineConfig
from jobledger.adapters.clock import FakeClock
from jobledger.adapters.kafka.settings import KafkaSettings
from jobledger.adapters.signing import Ed25519Signer, Keyring, SigningKey, Window
from jobledger.audit import tamper, verifier
from jobledger.audit.anchors import FileAnchorSink, read_anchors
from jobledger.audit.archive import DirectoryArchive, archive_job, read_directory_ref
from jobledger.audit.archived import with_tombstones
from jobledger.audit.kafka_archive import KafkaArchive, archive_reader
from jobledger.domain import chain
from jobledger.domain.errors import (
    ArchiveMismatchError,
    InvalidPayloadError,
    JobArchivedError,
    RetentionError,
    UnknownJobError,
)
from jobledger.domain.identity import job_uuid
from jobledger.domain.retention import RetentionPolicy
from jobledger.projections.job_views import JobViews
from jobledger.projections.retention import Scope
from tests.support.engines import EngineFactory, store_of
from tests.support.retention import POLICY, archiver, due_later, finished_jobs, raw_rows


@pytest.fixture
def archive_dir(tmp_path: Path) -> Path:
    return tmp_path / "archive"


def test_archive_then_restore_gives_back_the_same_rows(
    make_engine: EngineFactory, clock: FakeClock, archive_dir: Path
) -> None:
    engine = make_engine()
    ids = finished_jobs(engine, 3)
    before = {job_id: raw_rows(engine, "acme", job_id) for job_id in ids}
    views = JobViews(store_of(engine))
    views.catch_up()
    spend_before = views.status_counts("acme"), views.spend_days("acme")

    run = archiver(engine).run(DirectoryArchive(archive_dir), due_later(engine, clock), clock.now())

    assert sorted(t.job_id for t in run.archived) == ids and not run.skipped
    for job_id in ids:
        assert raw_rows(engine, "acme", job_id) == []
        with pytest.raises(JobArchivedError, match="was archived to dir:"):
            engine.job("acme", job_id)
    assert [r.job_id for r in views.jobs(tenant_id="acme")] == []
    assert views.spend_days("acme") == spend_before[1]  # spent is spent
    tombstone = store_of(engine).tombstone(job_uuid("acme", "j0"))
    assert tombstone is not None and tombstone.version == len(before["j0"])
    archive_file = Path(tombstone.archive_ref.removeprefix("dir:"))
    assert archive_file.parent == archive_dir.resolve()
    assert verifier.verify(archive_file).verified

    for job_id in ids:
        archiver(engine).restore("acme", job_id, read_directory_ref, None)
        assert raw_rows(engine, "acme", job_id) == before[job_id]
        assert chain.verify(engine.store.events(job_uuid("acme", job_id))) is None
        assert engine.job("acme", job_id).status == "completed"
    assert store_of(engine).tombstones.all() == []
    views.catch_up()
    # The restored jobs are listed again, and their spend is not counted twice.
    assert (views.status_counts("acme"), views.spend_days("acme")) == spend_before
    assert tamper.verify_store(store_of(engine)).intact


def test_only_finished_jobs_past_their_retention_are_due(
    make_engine: EngineFactory, clock: FakeClock
) -> None:
    engine = make_engine()
    engine.submit("acme", "sleeping", "timer")  # not finished: never due
    finished_jobs(engine, 2, tenant="acme", tail=False)
    finished_jobs(engine, 1, tenant="brief", prefix="b")
    policy = RetentionPolicy(default_days=30, tenants={"brief": 60}, workflows={"timer": 1})
    rows = due_later(engine, clock, Scope(policy))
    assert sorted((r.tenant_id, r.job_id) for r in rows) == [("acme", "j0"), ("acme", "j1")]
    # The workflow's days beat the tenant's, the tenant's the default.
    assert policy.days("brief", "timer") == 1 and policy.days("brief", "agent3") == 60
    assert policy.days("acme", "agent3") == 30
    assert [r.job_id for r in due_later(engine, clock, Scope(policy, tenant_id="brief"))] == []
    assert len(due_later(engine, clock, Scope(RetentionPolicy(), older_than_days=31))) == 3
    assert due_later(engine, clock, Scope(RetentionPolicy(), older_than_days=32)) == []


def test_no_retention_and_no_older_than_is_refused() -> None:
    with pytest.raises(InvalidPayloadError, match="no retention is configured"):
        Scope(RetentionPolicy())
    with pytest.raises(InvalidPayloadError, match="0 to 36500 days"):
        Scope(POLICY, older_than_days=-1)
    with pytest.raises(InvalidPayloadError, match="0 to 36500 days"):
        Scope(POLICY, older_than_days=36_501)


def test_a_job_that_moved_or_is_running_is_not_archived(
    make_engine: EngineFactory, clock: FakeClock, archive_dir: Path
) -> None:
    engine = make_engine()
    engine.submit("acme", "sleeping", "timer")
    engine.run_until_idle()
    store, archive = store_of(engine), DirectoryArchive(archive_dir)
    with pytest.raises(RetentionError, match="only a finished job is archived"):
        archive_job(store, archive, "acme", "sleeping", clock.now())
    assert list(archive_dir.iterdir()) == []
    with pytest.raises(UnknownJobError):
        archive_job(store, archive, "acme", "nope", clock.now())


def test_a_tampered_archive_is_not_restored(
    make_engine: EngineFactory, clock: FakeClock, archive_dir: Path
) -> None:
    engine = make_engine()
    finished_jobs(engine, 1)
    run = archiver(engine).run(DirectoryArchive(archive_dir), due_later(engine, clock), clock.now())
    path = Path(run.archived[0].archive_ref.removeprefix("dir:"))
    path.write_bytes(path.read_bytes().replace(b'"acme"', b'"acmf"', 1))
    with pytest.raises(ArchiveMismatchError, match="sha256"):
        archiver(engine).restore("acme", "j0", read_directory_ref, None)
    assert raw_rows(engine, "acme", "j0") == []
    assert store_of(engine).tombstone(job_uuid("acme", "j0")) is not None


def test_the_views_must_have_folded_the_job(
    make_engine: EngineFactory, clock: FakeClock, archive_dir: Path
) -> None:
    engine = make_engine()
    finished_jobs(engine, 1)
    rows = due_later(engine, clock)
    engine.submit("acme", "late", "agent3")
    engine.run_until_idle()
    late = [r for r in due_later(engine, clock) if r.job_id == "late"]
    store = store_of(engine)
    # A reader rewound behind the job (a view not yet folded to its end): refused.
    with store.backend.transaction() as curs:
        store.backend.forget(curs, [p.name for p in store.partitions])
    run = archiver(engine).run(DirectoryArchive(archive_dir), [*rows, *late], clock.now())
    assert run.archived == [] and len(run.skipped) == 2
    assert "not folded job" in run.skipped[0][2]
    assert raw_rows(engine, "acme", "j0") != []


def test_stray_archive_files_are_reconciled(
    make_engine: EngineFactory, clock: FakeClock, archive_dir: Path
) -> None:
    engine = make_engine()
    finished_jobs(engine, 2)
    archive = DirectoryArchive(archive_dir)
    # A run that died after writing j1's file, before its transaction.
    archive.write(job_uuid("acme", "j1"), "acme/j1", b"unfinished")
    (archive_dir / f".{job_uuid('acme', 'j1')}.x.tmp").write_bytes(b"half")
    foreign = archive_dir / "00000000-0000-0000-0000-000000000001.jsonl"
    foreign.write_bytes(b"another store's")
    rows = [r for r in due_later(engine, clock) if r.job_id == "j0"]
    run = archiver(engine).run(archive, rows, clock.now())
    assert len(run.strays_removed) == 2 and run.foreign == [str(foreign.resolve())]
    names = {p.name for p in archive_dir.iterdir()}
    assert names == {f"{job_uuid('acme', 'j0')}.jsonl", foreign.name}


def test_archived_at_is_the_run_time(
    make_engine: EngineFactory, clock: FakeClock, archive_dir: Path
) -> None:
    engine = make_engine()
    finished_jobs(engine, 1)
    now = datetime(2031, 1, 1, tzinfo=UTC)
    run = archiver(engine).run(DirectoryArchive(archive_dir), due_later(engine, clock), now)
    assert run.archived[0].archived_at == now
    (listed,) = store_of(engine).tombstones.all()
    assert listed == run.archived[0]


def test_the_job_holding_the_newest_event_waits_on_sqlite(
    make_engine: EngineFactory, clock: FakeClock, archive_dir: Path, store_url: str
) -> None:
    engine = make_engine()
    engine.submit("acme", "last", "agent3")
    engine.run_until_idle()
    run = archiver(engine).run(DirectoryArchive(archive_dir), due_later(engine, clock), clock.now())
    if store_url.startswith("postgresql"):  # its positions are never handed out again
        assert [t.job_id for t in run.archived] == ["last"]
        return
    assert run.archived == [] and "holds the newest event of its log" in run.skipped[0][2]
    # Its archive file, written before the refusal, is reconciled away.
    assert run.strays_removed and list(archive_dir.iterdir()) == []
    engine.submit("acme", "next", "timer")
    run = archiver(engine).run(DirectoryArchive(archive_dir), due_later(engine, clock), clock.now())
    assert [t.job_id for t in run.archived] == ["last"]


def test_verify_accounts_for_archived_jobs_and_anchors_still_hold(
    make_engine: EngineFactory, clock: FakeClock, archive_dir: Path, tmp_path: Path
) -> None:
    engine = make_engine()
    finished_jobs(engine, 2)
    store, anchors = store_of(engine), tmp_path / "anchors.jsonl"
    tamper.take_anchor(store, FileAnchorSink(anchors), clock.now())
    archiver(engine).run(DirectoryArchive(archive_dir), due_later(engine, clock), clock.now())

    # The tombstones stand for the jobs: the anchors taken before still verify, and a
    # new anchor (which pins the tombstones' heads) can be taken.
    report = tamper.verify_store(store, read_anchors(anchors))
    assert report.intact
    archived = {c.label: c for c in report.jobs if c.archived is not None}
    assert set(archived) == {"acme/j0", "acme/j1"}
    tamper.take_anchor(store, FileAnchorSink(anchors), clock.now(), read_anchors(anchors))
    assert tamper.verify_store(store, read_anchors(anchors)).intact

    # Read, each archive is verified link by link against its tombstone and the anchors.
    full = with_tombstones(store, report, read_anchors(anchors), read_directory_ref)
    notes = {c.label: c.archived for c in full.jobs if c.archived is not None}
    assert full.intact and all("archive verified" in n for n in notes.values() if n)
    first = store.tombstone(job_uuid("acme", "j0"))
    assert first is not None
    assert {c.label: c.events for c in full.jobs}["acme/j0"] == first.version

    # An archive edited, or gone: broken, or the tombstone alone.
    path = Path(first.archive_ref.removeprefix("dir:"))
    path.write_bytes(path.read_bytes() + b"\n")
    broken = with_tombstones(store, report, None, read_directory_ref)
    assert [c.label for c in broken.broken] == ["acme/j0"]
    assert broken.broken[0].broken is not None and "sha256" in broken.broken[0].broken.reason
    path.unlink()
    gone = with_tombstones(store, report, None, read_directory_ref)
    assert gone.intact
    assert "archive not read" in str({c.label: c.archived for c in gone.jobs}["acme/j0"])


def test_a_job_gone_without_a_tombstone_is_still_deleted(
    make_engine: EngineFactory, clock: FakeClock, tmp_path: Path
) -> None:
    engine = make_engine()
    finished_jobs(engine, 1)
    store, anchors = store_of(engine), tmp_path / "anchors.jsonl"
    tamper.take_anchor(store, FileAnchorSink(anchors), clock.now())
    uuid = job_uuid("acme", "j0")
    with store.backend.transaction() as curs:
        table = store.backend.table(store.partition(uuid).events_table)
        curs.execute(
            store.backend.sql(f"DELETE FROM {table} WHERE originator_id = :id"),
            {"id": store.backend.uuid(uuid)},
        )
    report = tamper.verify_store(store, read_anchors(anchors))
    (check,) = report.broken
    assert check.broken is not None and check.broken.kind == "deleted"


def test_a_job_the_outbox_has_not_published_stays(
    make_engine: EngineFactory, clock: FakeClock, archive_dir: Path
) -> None:
    engine = make_engine()
    finished_jobs(engine, 1)
    store = store_of(engine)
    outbox = f"{store.partitions[0].name}.outbox"
    with store.backend.transaction() as curs:  # an outbox that has published nothing yet
        store.backend.track(curs, outbox, old=0, new=1)
    run = archiver(engine).run(DirectoryArchive(archive_dir), due_later(engine, clock), clock.now())
    assert run.archived == [] and "the outbox has not published" in run.skipped[0][2]
    assert raw_rows(engine, "acme", "j0") != [] and list(archive_dir.iterdir()) == []
    newest = store.partitions[0].recorder.max_notification_id() or 0
    with store.backend.transaction() as curs:  # published since
        store.backend.track(curs, outbox, old=1, new=newest)
    run = archiver(engine).run(DirectoryArchive(archive_dir), due_later(engine, clock), clock.now())
    assert [t.job_id for t in run.archived] == ["j0"]


def test_archive_to_a_kafka_topic_and_restore_from_it(
    make_engine: EngineFactory, clock: FakeClock, kafka_bootstrap: str
) -> None:
    engine = make_engine()
    ids = finished_jobs(engine, 2)
    before = {job_id: raw_rows(engine, "acme", job_id) for job_id in ids}
    settings = KafkaSettings(bootstrap_servers=kafka_bootstrap, topic_partitions=2)
    topic = f"jobledger.archive.{uuid4().hex[:12]}"
    sink = KafkaArchive(settings, topic)
    try:
        run = archiver(engine).run(sink, due_later(engine, clock), clock.now())
    finally:
        sink.close()
    assert sorted(t.job_id for t in run.archived) == ids
    assert all(t.archive_ref.startswith(f"kafka:{topic}/") for t in run.archived)
    admin = KafkaAdminClient(bootstrap_servers=kafka_bootstrap)
    try:  # the topic keeps its messages for ever
        described = admin.describe_configs([ConfigResource(ConfigResourceType.TOPIC, topic)])
    finally:
        admin.close()
    kept = described["topic"][topic]
    assert kept["retention.ms"]["value"] == kept["retention.bytes"]["value"] == "-1"
    read = archive_reader(settings)
    store = store_of(engine)
    report = with_tombstones(store, tamper.verify_store(store), None, read)
    notes = [c.archived for c in report.jobs if c.archived is not None]
    assert report.intact and len(notes) == 2 and all("archive verified" in n for n in notes)
    for job_id in ids:
        archiver(engine).restore("acme", job_id, read, None)
        assert raw_rows(engine, "acme", job_id) == before[job_id]


def test_one_archive_run_at_a_time(
    make_engine: EngineFactory, clock: FakeClock, archive_dir: Path
) -> None:
    engine = make_engine()
    finished_jobs(engine, 1)
    other = store_of(engine).backend.lock("archive")  # another run holds it
    rows, archive = due_later(engine, clock), DirectoryArchive(archive_dir)
    assert other.try_acquire()
    try:
        with pytest.raises(RetentionError, match="another archive run or restore"):
            archiver(engine).run(archive, rows, clock.now())
    finally:
        other.release()
    assert raw_rows(engine, "acme", "j0") != []


def test_an_archived_job_is_not_made_again_under_its_idempotency_key(
    make_engine: EngineFactory, clock: FakeClock, archive_dir: Path
) -> None:
    engine = make_engine()
    engine.submit("acme", "keyed", "agent3", idempotency_key="k-1")
    engine.run_until_idle()
    engine.submit("acme", "after", "agent3")
    run = archiver(engine).run(DirectoryArchive(archive_dir), due_later(engine, clock), clock.now())
    assert [t.job_id for t in run.archived] == ["keyed"]
    with pytest.raises(JobArchivedError):
        engine.submit("acme", None, "agent3", idempotency_key="k-1")
    assert raw_rows(engine, "acme", "keyed") == []


def test_the_retention_settings() -> None:
    config = EngineConfig(
        retention_default_days=90, retention_tenants={"acme": 365}, retention_workflows={"w": 7}
    )
    assert config.retention.default_days == 90 and config.retention.tenants == {"acme": 365}
    with pytest.raises(ValidationError, match="retention of 'acme' is -1 days"):
        EngineConfig(retention_tenants={"acme": -1})
    with pytest.raises(ValidationError, match="retention of 'w' is 36501 days: it must be 0 to"):
        EngineConfig(retention_workflows={"w": 36_501})
    with pytest.raises(ValidationError, match="retention_default_days"):
        EngineConfig(retention_default_days=-1)


def test_a_job_submitted_anew_under_an_archived_id_blocks_its_restore(
    make_engine: EngineFactory, clock: FakeClock, archive_dir: Path
) -> None:
    engine = make_engine()
    finished_jobs(engine, 1)
    archiver(engine).run(DirectoryArchive(archive_dir), due_later(engine, clock), clock.now())
    engine.submit("acme", "j0", "agent3", input={"anew": True})
    anew = raw_rows(engine, "acme", "j0")
    with pytest.raises(RetentionError, match="is in the store again"):
        archiver(engine).restore("acme", "j0", read_directory_ref, None)
    assert raw_rows(engine, "acme", "j0") == anew
    assert store_of(engine).tombstone(job_uuid("acme", "j0")) is not None


def test_a_signed_archive_is_checked_against_the_keyring(
    make_engine: EngineFactory, clock: FakeClock, archive_dir: Path
) -> None:
    key = SigningKey("k1", Ed25519PrivateKey.generate(), Window(clock.now()))
    engine = make_engine(signer=Ed25519Signer([key]))
    ids = finished_jobs(engine, 1)
    before = raw_rows(engine, "acme", "j0")
    archiver(engine).run(DirectoryArchive(archive_dir), due_later(engine, clock), clock.now())
    store = store_of(engine)
    report = tamper.verify_store(store)
    ours = tamper.Signatures(Keyring(Ed25519Signer([key]).public_keys()))
    assert with_tombstones(store, report, None, read_directory_ref, ours).intact
    stranger = SigningKey("k1", Ed25519PrivateKey.generate(), Window(clock.now()))
    theirs = tamper.Signatures(Keyring(Ed25519Signer([stranger]).public_keys()))
    refused = with_tombstones(store, report, None, read_directory_ref, theirs)
    assert [c.label for c in refused.broken] == ["acme/j0"]
    archiver(engine).restore("acme", "j0", read_directory_ref, None)
    assert raw_rows(engine, "acme", "j0") == before and ids == ["j0"]


def test_archive_and_restore_across_partitions(
    make_engine: EngineFactory, clock: FakeClock, archive_dir: Path
) -> None:
    engine = make_engine(config={"partitions": 3})
    ids = finished_jobs(engine, 6, tail=False)
    store = store_of(engine)
    later: set[str] = set()
    while len(later) < len(store.partitions):  # a newer event in every partition's log
        job_id = f"l{len(later)}-{uuid4().hex[:6]}"
        engine.submit("later", job_id, "agent3")
        later.add(store.partition(job_uuid("later", job_id)).name)
    assert len({store.partition(job_uuid("acme", j)).name for j in ids}) > 1
    before = {job_id: raw_rows(engine, "acme", job_id) for job_id in ids}
    run = archiver(engine).run(DirectoryArchive(archive_dir), due_later(engine, clock), clock.now())
    assert not run.skipped, run.skipped
    assert sorted(t.job_id for t in run.archived) == ids
    for job_id in ids:
        archiver(engine).restore("acme", job_id, read_directory_ref, None)
        assert raw_rows(engine, "acme", job_id) == before[job_id]
    assert tamper.verify_store(store).intact


def test_an_archived_jobs_snapshots_go_with_it(
    make_engine: EngineFactory, clock: FakeClock, archive_dir: Path
) -> None:
    engine = make_engine(config={"snapshot_interval": 2})
    finished_jobs(engine, 1)
    store, uuid = store_of(engine), job_uuid("acme", "j0")
    table = store.backend.table(f"{store.partition(uuid).table_prefix}_snapshots")

    def snapshots() -> int:
        statement = f"SELECT COUNT(*) AS n FROM {table} WHERE originator_id = :id"
        return int(store.backend.fetch(statement, {"id": store.backend.uuid(uuid)})[0]["n"])

    assert snapshots() > 0
    archiver(engine).run(DirectoryArchive(archive_dir), due_later(engine, clock), clock.now())
    assert snapshots() == 0
    archiver(engine).restore("acme", "j0", read_directory_ref, None)
    assert engine.job("acme", "j0").status == "completed"
