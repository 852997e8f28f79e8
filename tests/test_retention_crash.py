"""Archiving under crashes, on SQLite and PostgreSQL: a crash at each write point of an
archive run (after an archive file is written, inside the store transaction, after it)
and a real SIGKILL, then a rerun: no archive without its tombstone, no tombstone without
its archive, nothing lost (every job in the store as it was, or archived and
tombstoned), and verify passes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from uuid import UUID

import pytest

from jobledger import Engine
from jobledger.adapters.clock import FakeClock
from jobledger.audit import tamper
from jobledger.audit.archive import DirectoryArchive, read_directory_ref, sha256
from jobledger.audit.archived import with_tombstones
from jobledger.domain.identity import job_uuid
from jobledger.domain.job import Job
from jobledger.domain.retention import Tombstone
from jobledger.projections.job_views import JobViews
from jobledger.projections.retention import Archiver
from tests.support import pythonpath
from tests.support.engines import EngineFactory, store_of
from tests.support.retention import archiver, due_later, finished_jobs, raw_rows

JOBS = 4


class Crash(BaseException):
    """The process dies here: not an Exception, so nothing in the engine can catch it."""


class CrashAfterWrite(DirectoryArchive):
    """Dies once the n-th archive file is durable, before its job's transaction."""

    def __init__(self, root: Path, at: int) -> None:
        super().__init__(root)
        self.at, self.written = at, 0

    def write(self, job_uuid: UUID, key: str, data: bytes) -> str:
        ref = super().write(job_uuid, key, data)
        self.written += 1
        if self.written == self.at:
            raise Crash("after the archive write")
        return ref


def crashing_archiver(engine: Engine, point: str) -> Archiver:
    """An archiver over the engine's store that dies at ``point`` of the second job."""
    store = store_of(engine)
    run = Archiver(store, JobViews(store))
    seen: list[UUID] = []
    if point == "in_transaction":
        forget = run.views.forget_job

        def forget_then_die(curs: Any, uuid: UUID) -> None:
            forget(curs, uuid)  # the job's rows are deleted in this transaction by now
            seen.append(uuid)
            if len(seen) == 2:
                raise Crash("inside the transaction")

        run.views.forget_job = forget_then_die  # type: ignore[method-assign]
    elif point == "after_transaction":
        bury = store.remove_archived

        def bury_then_die(tombstone: Tombstone, also: Callable[[Any], None] | None = None) -> None:
            bury(tombstone, also)
            seen.append(tombstone.job_uuid)
            if len(seen) == 2:
                raise Crash("after the transaction")

        store.remove_archived = bury_then_die  # type: ignore[method-assign]
    return run


def assert_consistent(engine: Engine, ids: list[str], before: dict[str, Any]) -> int:
    """Every job whole in the store and without a tombstone, or gone from it with a
    tombstone whose archive holds exactly what was archived. Returns how many archived."""
    store = store_of(engine)
    archived = 0
    for job_id in ids:
        tombstone = store.tombstone(job_uuid("acme", job_id))
        rows = raw_rows(engine, "acme", job_id)
        if tombstone is None:
            assert rows == before[job_id], job_id
            continue
        archived += 1
        assert rows == []
        data = read_directory_ref(tombstone.archive_ref)
        assert sha256(data) == tombstone.archive_sha256
    return archived


def assert_recovered(engine: Engine, archive_dir: Path, ids: list[str]) -> None:
    store = store_of(engine)
    tombstones = store.tombstones_of()
    assert sorted(t.job_id for t in tombstones) == ids
    # No archive without its tombstone, no tombstone without its archive.
    files = {str(p) for p in archive_dir.iterdir()}
    assert files == {t.archive_ref.removeprefix("dir:") for t in tombstones}
    report = with_tombstones(store, tamper.verify_store(store), None, read_directory_ref)
    assert report.intact
    assert all("archive verified" in str(c.archived) for c in report.jobs if c.tenant_id == "acme")


@pytest.mark.parametrize("point", ["after_write", "in_transaction", "after_transaction"])
def test_a_crash_at_each_write_point_then_a_rerun(
    point: str, make_engine: EngineFactory, clock: FakeClock, tmp_path: Path
) -> None:
    engine = make_engine()
    ids = finished_jobs(engine, JOBS)
    before = {job_id: raw_rows(engine, "acme", job_id) for job_id in ids}
    archive_dir = tmp_path / "archive"
    sink = (
        CrashAfterWrite(archive_dir, 2) if point == "after_write" else DirectoryArchive(archive_dir)
    )
    with pytest.raises(Crash):
        crashing_archiver(engine, point).run(sink, due_later(engine, clock), clock.now())
    engine.close()

    fresh = make_engine()
    done = assert_consistent(fresh, ids, before)
    assert done == (2 if point == "after_transaction" else 1)
    if point == "after_write":
        # The second job's archive is there, without a tombstone: its job is still stored.
        assert len(list(archive_dir.iterdir())) == 2
    run = archiver(fresh).run(DirectoryArchive(archive_dir), due_later(fresh, clock), clock.now())
    assert len(run.archived) == JOBS - done and not run.skipped
    assert_recovered(fresh, archive_dir, ids)


def test_a_crash_inside_a_restore_leaves_the_job_archived(
    make_engine: EngineFactory, clock: FakeClock, tmp_path: Path
) -> None:
    engine = make_engine()
    ids = finished_jobs(engine, 1)
    before = raw_rows(engine, "acme", "j0")
    archiver(engine).run(DirectoryArchive(tmp_path / "a"), due_later(engine, clock), clock.now())
    run = archiver(engine)

    def fold_then_die(curs: Any, events: list[Job.Event]) -> None:
        raise Crash("inside the restore's transaction")

    run.views.fold_job = fold_then_die  # type: ignore[method-assign]
    with pytest.raises(Crash):
        run.restore("acme", "j0", read_directory_ref, None)
    assert raw_rows(engine, "acme", "j0") == []
    assert store_of(engine).tombstone(job_uuid("acme", "j0")) is not None
    archiver(engine).restore("acme", "j0", read_directory_ref, None)
    assert raw_rows(engine, "acme", "j0") == before and ids == ["j0"]


@pytest.fixture
def spawn(store_url: str) -> Iterator[Callable[..., subprocess.Popen[str]]]:
    started: list[subprocess.Popen[str]] = []

    def start(*args: str) -> subprocess.Popen[str]:
        process = subprocess.Popen(
            [sys.executable, "-m", "tests.support.archive_crash", "--store", store_url, *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, "PYTHONPATH": pythonpath()},
        )
        started.append(process)
        return process

    yield start
    for process in started:
        if process.poll() is None:
            process.kill()
            process.communicate()


@pytest.mark.parametrize("point", ["archived", "buried"])
def test_sigkill_mid_run_then_a_rerun(
    point: str,
    make_engine: EngineFactory,
    clock: FakeClock,
    tmp_path: Path,
    spawn: Callable[..., subprocess.Popen[str]],
) -> None:
    engine = make_engine()
    ids = finished_jobs(engine, JOBS)
    before = {job_id: raw_rows(engine, "acme", job_id) for job_id in ids}
    archive_dir, marker = tmp_path / "archive", tmp_path / "hung"
    worker = spawn("--to", str(archive_dir), "--marker", str(marker), "--hang-at", point)
    deadline = time.monotonic() + 60
    while not marker.exists():
        if worker.poll() is not None:
            pytest.fail(f"the archiver exited before {point}: {worker.communicate()[1]}")
        assert time.monotonic() < deadline, f"the archiver never reached {point}"
        time.sleep(0.02)
    worker.send_signal(signal.SIGKILL)
    worker.communicate()

    fresh = make_engine()
    assert assert_consistent(fresh, ids, before) == (1 if point == "archived" else 2)
    run = archiver(fresh).run(DirectoryArchive(archive_dir), due_later(fresh, clock), clock.now())
    assert not run.skipped
    assert_recovered(fresh, archive_dir, ids)
