"""Store errors are infrastructure errors on every path: retried with back-off, never a
refusal, never a failed job, never a dead letter (issue 9, item 7).

Outages are injected below the adapters (tests/support/outage.py): the driver's real
error is raised where the library gets a connection, so what is tested is the adapters'
translation of it.
"""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
import threading
from collections import Counter
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from eventsourcing.persistence import IntegrityError

import jobledger
from jobledger import Engine, JobStatus, StoreUnavailableError
from jobledger.adapters.clock import FakeClock
from jobledger.adapters.event_store import EventSourcedJobStore
from jobledger.adapters.kafka.messages import encode_tick
from jobledger.adapters.kafka.settings import KafkaSettings
from jobledger.adapters.kafka.worker import KafkaWorker
from jobledger.adapters.local_queue import LocalQueue
from jobledger.adapters.log_spend import LogSpend
from jobledger.adapters.ops import MemoryOps
from jobledger.api import problems
from jobledger.audit import log as audit_log
from jobledger.audit import time_travel
from jobledger.cli.session import Exit, exit_code
from jobledger.domain.errors import (
    ConcurrencyError,
    ConfigError,
    DuplicateKeyError,
    StepError,
    StoreCorruptError,
    StoreUnreachableError,
    TokenReplayedError,
    VersionConflict,
)
from jobledger.domain.identity import job_uuid, key_uuid
from jobledger.domain.job import Job
from jobledger.domain.keys import ConsumedKey, KeyKind
from jobledger.domain.steps import StepRequest
from jobledger.orchestration import retry
from jobledger.orchestration.ports import Tick
from jobledger.projections import JobViews
from tests.support.engines import CountingExecutor, EngineFactory, default_registry
from tests.support.outage import DiskFull, Outage

CEILING = {"cost_ceiling_usd": "100"}


def event_store(engine: Engine) -> EventSourcedJobStore:
    assert isinstance(engine.store, EventSourcedJobStore)
    return engine.store


def spend_reader(engine: Engine) -> Any:
    """The recorder the spend check reads the log through."""
    (partition,) = event_store(engine).partitions
    return partition.recorder


# ---- the spend check -------------------------------------------------------------------


def test_an_outage_during_the_spend_check_is_a_store_error_and_fails_nothing(
    make_engine: EngineFactory, executor: CountingExecutor, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine = make_engine(config=CEILING)
    engine.submit("t", "j", "agent3")
    outage = Outage(event_store(engine), monkeypatch)
    outage.begin_on(spend_reader(engine), "select_notifications")

    with pytest.raises(StoreUnavailableError):
        engine.tick("t", "j")

    outage.end()
    assert engine.job("t", "j").status is JobStatus.QUEUED  # not failed, no step ran
    assert sum(executor.calls.values()) == 0


def test_the_local_queue_retries_a_tick_whose_spend_check_hit_an_outage(
    make_engine: EngineFactory,
    executor: CountingExecutor,
    clock: FakeClock,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    engine = make_engine(config=CEILING)
    engine.submit("t", "j", "agent3")
    outage = Outage(event_store(engine), monkeypatch)
    outage.begin_on(spend_reader(engine), "select_notifications")

    assert engine.run_until_idle() == 1  # the tick was handled, not raised out of the loop
    assert isinstance(engine.queue, LocalQueue)
    (pending,) = engine.queue.pending()  # ... and put back with a delay, not dropped
    assert pending[1].job_id == "j" and pending[0] > clock.now()

    outage.end()
    engine.run_until_idle(wait_for_timers=True)
    assert engine.job("t", "j").status is JobStatus.COMPLETED
    assert set(executor.calls.values()) == {1}


def test_each_retry_of_an_infrastructure_error_waits_longer_with_jitter(
    make_engine: EngineFactory, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine = make_engine(config=CEILING)
    engine.submit("t", "j", "agent3")
    outage = Outage(event_store(engine), monkeypatch)
    outage.down = True
    assert isinstance(engine.queue, LocalQueue)
    delays = []
    for _ in range(5):
        clock.advance(timedelta(minutes=5))
        assert engine.run_until_idle() == 1
        ((due, _, _),) = engine.queue.pending()
        delays.append((due - clock.now()).total_seconds())
    backoff = retry.INFRASTRUCTURE
    for attempt, delay in enumerate(delays, start=1):
        assert backoff.ceiling(attempt) / 2 <= delay <= backoff.ceiling(attempt)
    assert delays == sorted(delays) and delays[0] < delays[-1]


def test_a_store_away_for_hours_is_still_retried_at_the_cap() -> None:
    """Thousands of retries (30 s apart: about nine hours) must not overflow the back-off
    and crash the worker's loop."""
    backoff = retry.INFRASTRUCTURE
    for attempt in (1025, 10_000):
        assert backoff.cap_seconds / 2 <= backoff.delay(attempt) <= backoff.cap_seconds


def test_the_kafka_worker_rewinds_a_tick_whose_spend_check_hit_an_outage_and_never_dead_letters(
    make_engine: EngineFactory, executor: CountingExecutor, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine = make_engine(config=CEILING)
    engine.submit("t", "j", "agent3")
    outage = Outage(event_store(engine), monkeypatch)
    outage.during(spend_reader(engine), "select_notifications")
    settings = KafkaSettings.of(engine.config)
    worker = KafkaWorker(engine, settings)
    dead: list[Any] = []
    monkeypatch.setattr(worker, "dead_letter", lambda record, *why: dead.append(why) or True)
    record = SimpleNamespace(
        topic=settings.ticks_topic,
        partition=0,
        offset=7,
        key=b"t/j",
        value=encode_tick(Tick("t", "j", "create"), dedupe_key=None, enqueued_at_ms=0),
        headers=[],
    )

    # However often it is delivered while the spend check fails: read again (False),
    # never dead-lettered as if it were a bug.
    assert [worker.process(record) for _ in range(5)] == [False] * 5
    assert dead == [] and worker.stats.retried == 5

    outage.end()
    assert worker.process(record) is True
    assert dead == [] and worker.stats.ticks == 1
    assert engine.job("t", "j").status is JobStatus.COMPLETED


# ---- a full disk under a live runner ------------------------------------------------------


def run_through_a_full_disk(
    engine: Engine, disk: DiskFull, clock: FakeClock, ops: MemoryOps, seconds: int
) -> int:
    """Tick the runner, a second apart, for ``seconds`` of a full disk, then free it and
    run to the end. Returns how many ticks the full disk made fail."""
    for _ in range(seconds):
        engine.run_until_idle()
        clock.advance(timedelta(seconds=1))
    disk.free()
    refused = sum(
        e.eventType == "job.tick.ended" and e.metadata["outcome"] == "store_error"
        for e in ops.events
    )
    engine.run_until_idle(wait_for_timers=True)
    return refused


@pytest.mark.parametrize("seconds", [10, 60], ids=["lease-live", "lease-lapsed"])
def test_a_step_whose_record_a_full_disk_refused_is_recorded_later_and_never_run_again(
    make_engine: EngineFactory,
    executor: CountingExecutor,
    clock: FakeClock,
    ops: MemoryOps,
    monkeypatch: pytest.MonkeyPatch,
    seconds: int,
) -> None:
    """The disk fills while steps run (no worker dies): each step's result is kept in
    the worker and its append retried until it lands, not the step run again on every
    retry (issue 29, item 4); whether the steps' leases outlive the full disk or not,
    while no other worker takes the jobs over."""
    engine = make_engine(config={"concurrency": 4})
    jobs = [f"j{n}" for n in range(8)]
    for job_id in jobs:
        engine.submit("t", job_id, "agent3")
    disk = DiskFull(event_store(engine), monkeypatch)
    executor.fail_with = lambda request: disk.fill_once()  # at the first side effect

    refused = run_through_a_full_disk(engine, disk, clock, ops, seconds)

    assert refused >= 10 and disk.filled
    assert [engine.job("t", job_id).status for job_id in jobs] == [JobStatus.COMPLETED] * 8
    assert len(executor.calls) == 3 * len(jobs)
    assert set(executor.calls.values()) == {1}, executor.calls


def test_a_step_error_whose_retry_a_full_disk_refused_is_not_run_again_either(
    make_engine: EngineFactory,
    executor: CountingExecutor,
    clock: FakeClock,
    ops: MemoryOps,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """What a step did includes the error it raised: the retry it schedules is kept and
    appended, the failing attempt is not run again for each refused append."""
    engine = make_engine(config={"concurrency": 4})
    jobs = [f"j{n}" for n in range(4)]
    for job_id in jobs:
        engine.submit("t", job_id, "agent3")
    disk = DiskFull(event_store(engine), monkeypatch)

    def first_attempts_fail(request: StepRequest) -> Exception | None:
        disk.fill_once()
        if executor.calls[request.idempotency_key] == 1:
            return StepError("the service is busy", retryable=True, kind="busy")
        return None

    executor.fail_with = first_attempts_fail

    refused = run_through_a_full_disk(engine, disk, clock, ops, 10)

    assert refused >= 10
    assert [engine.job("t", job_id).status for job_id in jobs] == [JobStatus.COMPLETED] * 4
    assert len(executor.calls) == 3 * len(jobs)
    assert set(executor.calls.values()) == {2}, executor.calls  # the failure, its one retry


def test_a_kept_step_whose_job_another_worker_took_over_is_dropped_not_recorded(
    make_engine: EngineFactory,
    executor: CountingExecutor,
    clock: FakeClock,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The documented at-least-once case: the full disk outlasted the lease and another
    worker took the job over and ran the step again (same key). The first worker's kept
    result is dropped when its retry finds the job moved on: one record of the step."""
    first = make_engine()
    first.submit("t", "j", "agent3")
    disk = DiskFull(event_store(first), monkeypatch)
    executor.fail_with = lambda request: disk.fill_once()
    first.run_until_idle()  # step 1 ran; its record was refused, its retry is queued
    disk.free()
    clock.advance(timedelta(minutes=1))  # the lease lapsed

    second = make_engine(config={"max_steps_per_tick": 1})
    assert second.tick("t", "j").steps_executed == 1  # took over, ran step 1 again
    first.run_until_idle(wait_for_timers=True)  # its retry: the job moved on

    assert first.job("t", "j").status is JobStatus.COMPLETED
    assert executor.calls == {"t/j:step:1": 2, "t/j:step:2": 1, "t/j:step:3": 1}
    recorded = [
        (e.step_number, e.worker_id)
        for e in first.store.events(job_uuid("t", "j"))
        if isinstance(e, Job.StepRecorded)
    ]
    assert recorded[0] == (1, "w1")  # the second worker's, once
    assert [number for number, _ in recorded] == [1, 2, 3, 4]


# ---- every entry point of the store adapters ----------------------------------------------


def test_every_store_read_and_write_turns_an_outage_into_a_store_error(
    make_engine: EngineFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine = make_engine()
    engine.submit("t", "j", "agent3")
    store = event_store(engine)
    job = store.load(job_uuid("t", "j"))
    assert job is not None
    views = JobViews(store)
    spend = LogSpend(store)
    key = ConsumedKey.consume(
        kind=KeyKind.SIGNAL,
        key="s",
        tenant_id="t",
        job_id="j",
        job_uuid=job.id,
        timestamp=job.modified_on,
    )
    calls = {
        "load": lambda: store.load(job.id),
        "events": lambda: store.events(job.id),
        "holds": lambda: store.holds(job.id, 1, "0" * 64),
        "find_key": lambda: store.find_key(job.id, key_uuid("t", KeyKind.SIGNAL, "s")),
        "append": lambda: store.append(job),
        "reserve_key": lambda: store.reserve_key(key),
        "log spend": lambda: spend.tenant_day_spend_usd("t", job.modified_on),
        "view spend": lambda: views.tenant_day_spend_usd("t", job.modified_on),
        "jobs": lambda: views.jobs(),
        "due": lambda: views.due(JobStatus.QUEUED, job.modified_on, 10),
        "approvals": lambda: views.pending_approvals(),
        "lag": lambda: views.lag(),
        "catch_up": lambda: views.catch_up(),
        "audit: raw rows": lambda: audit_log.read_job(store, job.id),
        "audit: time travel": lambda: time_travel.job_at(store, job.id, version=1),
    }
    outage = Outage(store, monkeypatch)
    outage.down = True
    escaped = {}
    for name, call in calls.items():
        try:
            call()
        except StoreUnavailableError:
            continue
        except BaseException as error:
            escaped[name] = repr(error)
        else:
            escaped[name] = "no error at all"
    assert escaped == {}
    assert outage.refused >= len(calls)


def test_an_outage_while_telling_a_duplicate_from_a_conflict_is_a_store_error(
    make_engine: EngineFactory, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A refused append is followed by a read (which key collided?): it is a store call
    like any other."""
    engine = make_engine()
    engine.submit("t", "j", "agent3")
    store = event_store(engine)
    first, second = store.load(job_uuid("t", "j")), store.load(job_uuid("t", "j"))
    assert first is not None and second is not None
    keys = []
    for job, name in ((first, "s1"), (second, "s2")):
        job.buffer_signal(signal_id=name, event_name="ev", payload={}, now=clock.now())
        keys.append(engine.commands._key(job, KeyKind.SIGNAL, name))
    store.append(first, keys[0])
    outage = Outage(store, monkeypatch)
    (partition,) = store.partitions
    recorder = partition.events.recorder
    insert_events = recorder.insert_events

    def refused_then_down(*args: Any, **kwargs: Any) -> Any:
        try:
            return insert_events(*args, **kwargs)
        except IntegrityError:
            outage.down = True  # the database goes away right after refusing the append
            raise

    monkeypatch.setattr(recorder, "insert_events", refused_then_down)
    with pytest.raises(StoreUnavailableError):
        store.append(second, keys[1])  # stale: refused, then the lookup fails
    assert outage.refused >= 1  # the lookup really met the outage


# ---- contention -------------------------------------------------------------------------


def test_many_concurrent_signals_to_one_job_all_land(make_engine: EngineFactory) -> None:
    """Lost races are retried with back-off and jitter, not reported as refusals."""
    engines = [make_engine() for _ in range(8)]
    engines[0].submit("t", "j", "agent3")
    signals = 320
    outcomes: Counter[str] = Counter()
    start = threading.Barrier(signals)

    def deliver(n: int) -> None:
        start.wait()
        try:
            outcome = engines[n % len(engines)].signal("t", "j", "ev", {"n": n}, signal_id=f"s{n}")
            outcomes[str(outcome)] += 1
        except Exception as error:
            outcomes[type(error).__name__] += 1

    threads = [threading.Thread(target=deliver, args=(n,)) for n in range(signals)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    assert outcomes == {"buffered": signals}
    job = engines[0].store.load(job_uuid("t", "j"))
    assert job is not None
    inbox = {entry.signal_id for entry in job.inbox}
    assert inbox == {f"s{n}" for n in range(signals)}


@dataclass(frozen=True)
class RecordingBackoff(retry.Backoff):
    waits: list[float] = field(default_factory=list)

    def delay(self, attempt: int) -> float:
        wait = super().delay(attempt)
        self.waits.append(wait)
        return wait


def test_a_lost_race_is_retried_with_back_off_until_the_budget_is_spent(
    make_engine: EngineFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine = make_engine()
    engine.submit("t", "j", "agent3")
    backoff = RecordingBackoff(0.001, 0.02, budget_seconds=0.3)
    monkeypatch.setattr(retry, "CONTENTION", backoff)
    appends = Counter[str]()

    def always_loses(job: Any, *keys: Any) -> None:
        appends["tried"] += 1
        raise VersionConflict("the job was changed by another writer since it was loaded")

    monkeypatch.setattr(event_store(engine), "append", always_loses)
    with pytest.raises(ConcurrencyError, match="kept changing; try again"):
        engine.signal("t", "j", "ev", signal_id="s1")
    # Retried after each lost race (not refused at the first), each wait drawn from a
    # doubling ceiling, until the next wait would overrun the budget.
    assert appends["tried"] == len(backoff.waits) > 5
    for attempt, wait in enumerate(backoff.waits, start=1):
        assert backoff.ceiling(attempt) / 2 <= wait <= backoff.ceiling(attempt)
    assert sum(backoff.waits[:-1]) <= backoff.budget_seconds


# ---- the command line -------------------------------------------------------------------


def test_a_command_that_finds_the_store_busy_exits_4_and_succeeds_when_run_again(
    tmp_path: Path,
) -> None:
    """The real command line (this checkout's code, whichever is installed), on a SQLite
    file whose write lock another connection holds for longer than the lock timeout."""
    url = f"sqlite:///{tmp_path}/jobs.db"
    engine = Engine.open(url, registry=default_registry())
    engine.submit("t", "j", "agent3")
    engine.close()
    source = Path(jobledger.__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": str(source), "SQLITE_LOCK_TIMEOUT": "1"}
    command = [sys.executable, "-m", "jobledger.cli", "signal", "t", "j", "ev", "--id", "s1"]
    command += ["--store", url]
    other_writer = sqlite3.connect(tmp_path / "jobs.db", isolation_level=None)
    other_writer.execute("BEGIN IMMEDIATE")
    try:
        busy = subprocess.run(command, capture_output=True, text=True, env=env, timeout=60)
    finally:
        other_writer.execute("ROLLBACK")
        other_writer.close()
    assert busy.returncode == Exit.TEMPORARY, busy.stderr
    assert busy.stderr == "error: store error while appending: database is locked\n"

    again = subprocess.run(command, capture_output=True, text=True, env=env, timeout=60)
    assert again.returncode == Exit.OK, again.stderr
    assert "buffered" in again.stdout


def damage(path: Path, *, at: str) -> None:
    """Overwrite bytes of the SQLite file as a bad sector would: in the middle of the
    events table's first page (``at="page"``), or the file's header (``at="header"``)."""
    conn = sqlite3.connect(path)
    (root,) = conn.execute(
        "SELECT rootpage FROM sqlite_master WHERE name = 'jobledger_p0_events'"
    ).fetchone()
    (page_size,) = conn.execute("PRAGMA page_size").fetchone()
    conn.close()
    with path.open("r+b") as file:
        file.seek((root - 1) * page_size + 8 if at == "page" else 0)
        file.write(b"\xff" * 64)


@pytest.mark.parametrize("at", ["page", "header"])
def test_a_damaged_sqlite_file_is_broken_exit_3_not_try_again(tmp_path: Path, at: str) -> None:
    """A malformed page (``database disk image is malformed``) or a file that is no longer
    a database fails the same way however often it is tried: every command says the store
    is damaged and exits 3, the engine raises StoreCorruptError, the API answers 503
    without Retry-After. (SQLite only: a PostgreSQL page cannot be damaged from here.)"""
    url = f"sqlite:///{tmp_path}/jobs.db"
    engine = Engine.open(url, registry=default_registry())
    for n in range(3):
        engine.submit("t", f"j{n}", "agent3", input={"pad": "x" * 3000})
    engine.close()
    damage(tmp_path / "jobs.db", at=at)
    source = Path(jobledger.__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": str(source)}
    for args in (
        ["show", "t", "j1"],
        ["history", "t", "j1"],
        ["list"],
        ["verify", "--all"],
        ["export", "--all"],
        ["signal", "t", "j1", "ev", "--id", "s1"],
    ):
        command = [sys.executable, "-m", "jobledger.cli", *args, "--store", url]
        done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=60)
        assert done.returncode == Exit.UNAVAILABLE, (args, done.returncode, done.stderr)
        assert "the store is damaged" in done.stderr, (args, done.stderr)
        assert "restore it from a backup" in done.stderr, (args, done.stderr)

    with pytest.raises(StoreCorruptError) as raised:
        damaged = Engine.open(url, registry=default_registry())
        try:
            damaged.job("t", "j1")
        finally:
            damaged.close()
    assert exit_code(raised.value) is Exit.UNAVAILABLE
    problem = problems.of_error(raised.value)
    assert problem.status == 503 and "Retry-After" not in problem.headers


@pytest.mark.parametrize(
    ("error", "code"),
    [
        (TokenReplayedError("the resume token was already used"), Exit.REFUSED),
        (DuplicateKeyError("signal", "s1"), Exit.REFUSED),
        (ConfigError("bad setting"), Exit.UNAVAILABLE),
        (StoreUnreachableError("cannot open the postgresql store: refused"), Exit.UNAVAILABLE),
        (ConcurrencyError("job 'j' kept changing; try again"), Exit.TEMPORARY),
        (VersionConflict("the job moved on"), Exit.TEMPORARY),
        (StoreUnavailableError("store error while appending: disk I/O error"), Exit.TEMPORARY),
    ],
)
def test_the_cli_exit_code_separates_refused_from_try_again(error: Exception, code: Exit) -> None:
    assert exit_code(error) is code  # type: ignore[arg-type]


# ---- resolution ------------------------------------------------------------------------


def test_a_store_error_while_resolving_is_not_a_definition_bug(
    make_engine: EngineFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A registry may read a store (definitions kept in a database): its outage must not
    fail the job as if the definition had thrown."""
    engine = make_engine()
    engine.submit("t", "j", "agent3")

    def unavailable(request: Any) -> Any:
        raise StoreUnavailableError("store error while reading definitions: disk I/O error")

    monkeypatch.setattr(engine.registry, "resolve", unavailable)
    with pytest.raises(StoreUnavailableError):
        engine.tick("t", "j")
    assert engine.job("t", "j").status is JobStatus.QUEUED
