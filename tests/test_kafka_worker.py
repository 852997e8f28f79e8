"""Ticks and signals over a real Apache Kafka broker (scripts/kafka-local): ordering per
job, the dead-letter topic, no commit before the effect is durable (and none at all on
an infrastructure error), re-delivery after a worker is killed, a rebalance between two
consumers, signals in, timers brought back by the reconciler.

Every store-facing test runs on SQLite and on PostgreSQL; the multi-worker one on
PostgreSQL.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from uuid import UUID

import pytest
from kafka import KafkaProducer, TopicPartition

from jobledger import Engine, EngineConfig, FunctionRegistry, JobStatus, StoreUnavailableError, Tick
from jobledger.adapters.event_store import EventSourcedJobStore
from jobledger.adapters.kafka import KafkaQueue, SignalMessage, job_key
from jobledger.adapters.kafka import clients as kafka_clients
from jobledger.adapters.kafka.messages import (
    MalformedMessage,
    TickMessage,
    decode_signal,
    decode_tick,
    encode_tick,
)
from jobledger.adapters.kafka.worker import KafkaWorker
from jobledger.adapters.ops import MemoryOps
from jobledger.domain.identity import step_key
from jobledger.domain.job import Job
from jobledger.domain.keys import ConsumedKey
from jobledger.orchestration.orchestrator import TickReport
from jobledger.orchestration.ports import JobStore
from jobledger.runtime.kafka_runner import KafkaRunner, KafkaRunnerSettings
from tests.support import pythonpath
from tests.support.crash_worker import read_counts
from tests.support.engines import TOKEN_SECRET, CountingExecutor, StoreWrapper, default_registry
from tests.support.engines import open_engine as build_engine
from tests.support.kafka_broker import (
    KafkaTopics,
    committed_offsets,
    end_offsets,
    headers,
    read_topic,
    running,
    wait_for,
)
from tests.support.outage import Outage
from tests.support.services import postgres_schema_url
from tests.support.workflows import DONE, LAST_STEP, STEP, linear_registry, sleep_ms, wait_event

TENANT = "acme"
PROCS = [sys.executable, "-m", "tests.support.kafka_procs"]


@pytest.fixture
def pg_url() -> Iterator[str]:
    yield from postgres_schema_url()


def open_engine(
    store_url: str,
    topics: KafkaTopics,
    executor: Any,
    *,
    registry: FunctionRegistry | None = None,
    worker_id: str = "w0",
    wrap_store: StoreWrapper | None = None,
    **config: Any,
) -> Engine:
    settings = EngineConfig(
        **{
            "store_url": store_url,
            "worker_id": worker_id,
            "token_secret": TOKEN_SECRET,
            **topics.config(),
            **config,
        }
    )
    return build_engine(
        registry=registry or default_registry(),
        executor=executor,
        config=settings,
        ops=MemoryOps(),
        wrap_store=wrap_store,
    )


def all_done(engine: Engine, jobs: list[str]) -> bool:
    return all(engine.job(TENANT, job).status.is_terminal for job in jobs)


def assert_steps_once(engine: Engine, job_id: str, side_effect_steps: int) -> None:
    view = engine.job(TENANT, job_id)
    assert view.status is JobStatus.COMPLETED, view
    history = engine.history(TENANT, job_id)
    recorded = Counter(e.data["idempotency_key"] for e in history if e.event_type == "StepRecorded")
    assert recorded == {step_key(TENANT, job_id, n): 1 for n in range(1, side_effect_steps + 2)}
    assert engine.verify(TENANT, job_id) is None


def producer(topics: KafkaTopics) -> Any:
    return KafkaProducer(bootstrap_servers=topics.bootstrap, acks="all")


# ---- messages (no broker) ----------------------------------------------------------------


def test_ticks_and_signals_round_trip_and_bad_values_say_why() -> None:
    value = encode_tick(Tick("t", "j", "create"), dedupe_key="create", enqueued_at_ms=5)
    assert decode_tick(value) == TickMessage(Tick("t", "j", "create"), "create", 5)
    signal_message = SignalMessage("t", "j", "invoice.paid", "evt-1", {"paid": 12})
    assert decode_signal(signal_message.encode()) == signal_message
    bad = {
        None: "empty",
        b"": "empty",
        b"\xff\xfe": "not_utf8",
        b"tick!": "not_json",
        b"[1, 2]": "not_object",
        b'{"job_id": "j"}': "missing_field",
        b'{"tenant_id": 7, "job_id": "j"}': "bad_field",
        b'{"tenant_id": "t\\u0000", "job_id": "j"}': "bad_field",
        b'{"tenant_id": "t", "job_id": "j", "schema": "other/9"}': "unknown_schema",
        # Nested past what the decoder can follow: a bad message, not a handler's bug.
        b'{"tenant_id": "t", "job_id": "j", "x": ' + b"[" * 100_000 + b"]" * 100_000 + b"}": (
            "not_json"
        ),
    }
    for raw, reason in bad.items():
        with pytest.raises(MalformedMessage) as caught:
            decode_tick(raw)
        assert caught.value.reason == reason, raw
    with pytest.raises(MalformedMessage, match="payload"):
        decode_signal(
            b'{"tenant_id": "t", "job_id": "j", "event": "e", "signal_id": "s", "payload": 3}'
        )


# ---- the queue ---------------------------------------------------------------------------


def test_ticks_are_keyed_by_job_and_stay_in_order_on_one_partition(
    kafka_topics: KafkaTopics,
) -> None:
    queue = KafkaQueue(kafka_topics.settings())
    jobs = [("t1", "a"), ("t1", "b"), ("t2", "a"), ("t2", "c"), ("t3", "x"), ("t3", "y")]
    for n in range(15):
        for tenant, job in jobs:
            queue.enqueue(Tick(tenant, job, f"r{n}"), dedupe_key=f"d{n}")
    # A delayed tick is not published: the reconciler sends it when it is due.
    queue.enqueue(Tick("t1", "a", "waiting_time_resume"), delay_ms=60_000, dedupe_key="x")
    queue.close()
    assert (queue.published, queue.left_to_reconciler) == (90, 1)

    records = read_topic(kafka_topics.bootstrap, kafka_topics.ticks, at_least=90)
    assert len(records) == 90
    by_key: dict[bytes, list[Any]] = defaultdict(list)
    for record in records:
        by_key[record.key].append(record)
    for tenant, job in jobs:
        mine = by_key[job_key(tenant, job)]
        assert len({r.partition for r in mine}) == 1, "one job's ticks share one partition"
        decoded = [decode_tick(r.value) for r in sorted(mine, key=lambda r: r.offset)]
        assert [d.tick for d in decoded] == [Tick(tenant, job, f"r{n}") for n in range(15)]
        assert [d.dedupe_key for d in decoded] == [f"d{n}" for n in range(15)]
    assert len({r.partition for r in records}) > 1, "jobs spread over the partitions"


# ---- the worker --------------------------------------------------------------------------


@pytest.mark.parametrize("concurrency", [1, 4])
def test_each_jobs_ticks_are_handled_in_the_order_they_were_published(
    store_url: str, kafka_topics: KafkaTopics, concurrency: int
) -> None:
    executor = CountingExecutor()
    engine = open_engine(store_url, kafka_topics, executor)
    jobs = [f"job-{n}" for n in range(4)]
    for job in jobs:
        engine.submit(TENANT, job, "agent3")
    for n in range(12):
        for job in jobs:
            engine.queue.enqueue(Tick(TENANT, job, f"extra-{n}"))
    seen: dict[str, list[str]] = defaultdict(list)

    def observe(message: TickMessage, report: TickReport | None) -> None:
        seen[message.tick.job_id].append(message.tick.reason)

    worker = KafkaWorker(engine, kafka_topics.settings(), on_tick=observe, concurrency=concurrency)
    with running(worker):
        wait_for(lambda: sum(map(len, seen.values())) == 4 * 13, 60, "every tick handled")
    for job in jobs:
        assert seen[job] == ["create", *[f"extra-{n}" for n in range(12)]]
        assert_steps_once(engine, job, 3)
    assert max(executor.calls.values()) == 1
    assert committed_offsets(kafka_topics.bootstrap, kafka_topics.group, kafka_topics.ticks) == (
        end_offsets(kafka_topics.bootstrap, kafka_topics.ticks)
    )
    engine.close()


def test_one_worker_runs_many_jobs_ticks_at_once_and_commits_only_what_is_done(
    store_url: str, kafka_topics: KafkaTopics
) -> None:
    """Issue 11: the Kafka worker group-commits whatever is runnable. Its first steps of
    four jobs only end when all four run at once (a barrier); every offset is committed
    once every message before it in its partition is done."""
    width = 4
    together = threading.Barrier(width, timeout=20)
    executor = CountingExecutor()

    def first_steps_together(request: Any) -> None:
        if request.step_number == 1:
            together.wait()  # passes only when `width` jobs' first steps run at once

    executor.fail_with = first_steps_together
    engine = open_engine(store_url, kafka_topics, executor, concurrency=width)
    jobs = [f"job-{n}" for n in range(width)]
    for job in jobs:
        engine.submit(TENANT, job, "agent3")
    worker = KafkaWorker(engine, kafka_topics.settings(), concurrency=width)
    with running(worker):
        wait_for(lambda: all_done(engine, jobs), 60, "every job completed")
    assert not together.broken
    for job in jobs:
        assert_steps_once(engine, job, 3)
    assert max(executor.calls.values()) == 1
    assert committed_offsets(kafka_topics.bootstrap, kafka_topics.group, kafka_topics.ticks) == (
        end_offsets(kafka_topics.bootstrap, kafka_topics.ticks)
    )
    engine.close()


def test_a_worker_run_again_after_it_stopped_handles_ticks_again(
    store_url: str, kafka_topics: KafkaTopics
) -> None:
    """The supervisor restarts a worker that died by calling ``run`` again on it: each
    run has its own lanes (the last run's were closed when it ended)."""
    engine = open_engine(store_url, kafka_topics, CountingExecutor(), concurrency=2)
    worker = KafkaWorker(engine, kafka_topics.settings(), concurrency=2)
    engine.submit(TENANT, "first", "agent3")
    with running(worker):
        wait_for(lambda: all_done(engine, ["first"]), 60, "the first run's job completed")
    worker.stopping.clear()
    engine.submit(TENANT, "second", "agent3")
    with running(worker):
        wait_for(lambda: all_done(engine, ["second"]), 60, "the second run's job completed")
    assert_steps_once(engine, "first", 3)
    assert_steps_once(engine, "second", 3)
    engine.close()


class PollLog:
    """The worker's real consumer, its polls written down in order with what else
    happened (a publish acknowledged, a tick handled): an order, never a duration."""

    def __init__(self, consumer: Any, log: list[tuple[str, int]], lock: threading.Lock) -> None:
        self._consumer = consumer
        self._log = log
        self._lock = lock
        self.config: dict[str, Any] = consumer.config

    def __getattr__(self, name: str) -> Any:
        return getattr(self._consumer, name)

    def poll(self, **options: Any) -> Any:
        with self._lock:
            self._log.append(("poll begun", 0))
        batch = self._consumer.poll(**options)
        with self._lock:
            self._log.append(("poll returned", sum(map(len, batch.values()))))
        return batch


def test_a_tick_published_to_an_idle_worker_is_taken_by_the_poll_under_way(
    store_url: str, kafka_topics: KafkaTopics, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 25: no poll interval is waited out with work queued. Once a tick is on the
    broker, no poll the idle worker begins comes back empty before the tick is handled:
    the fetch under way returns it as soon as it lands, since the broker answers a fetch
    at its first byte and the tick's producer sends at once."""
    log: list[tuple[str, int]] = []
    lock = threading.Lock()
    real_consumer = kafka_clients.consumer
    consumers: list[PollLog] = []

    def logged_consumer(*args: Any, **kwargs: Any) -> Any:
        consumers.append(PollLog(real_consumer(*args, **kwargs), log, lock))
        return consumers[-1]

    monkeypatch.setattr(kafka_clients, "consumer", logged_consumer)
    engine = open_engine(store_url, kafka_topics, CountingExecutor(), registry=one_step())
    engine.submit(TENANT, "warm-up", "one")

    def note(message: TickMessage, report: TickReport | None) -> None:
        with lock:
            log.append(("handled " + message.tick.job_id, 0))

    worker = KafkaWorker(engine, kafka_topics.settings(), on_tick=note)
    with running(worker):
        wait_for(lambda: all_done(engine, ["warm-up"]), 60, "the warm-up job completed")
        # Idle: a poll has come back empty since (the worker is waiting on the broker).
        wait_for(lambda: ("poll returned", 0) in after(log, lock, "handled warm-up"), 30, "idle")
        engine.submit(TENANT, "j", "one")  # its tick is published, acknowledged
        with lock:
            log.append(("acknowledged", 0))
        wait_for(lambda: all_done(engine, ["j"]), 60, "the job completed")
    since = after(log, lock, "acknowledged")
    window = since[: since.index(("handled j", 0))]
    # Polls run one after another: an empty return preceded by a begin in the window is
    # a poll that began with the tick on the broker and waited out its timeout.
    waited_out = [
        i
        for i, entry in enumerate(window)
        if entry == ("poll returned", 0) and ("poll begun", 0) in window[:i]
    ]
    assert waited_out == [], window
    # The waits a tick could sit out, as configured: none while one byte is there.
    assert consumers[0].config["fetch_min_bytes"] == 1
    assert engine.deps.kafka_queue is not None
    assert engine.deps.kafka_queue.producer().config["linger_ms"] == 0
    engine.close()


def after(log: list[tuple[str, int]], lock: threading.Lock, mark: str) -> list[tuple[str, int]]:
    """What the log holds after ``mark`` (all of it when there is none yet)."""
    with lock:
        entries = list(log)
    marks = [i for i, (what, _) in enumerate(entries) if what == mark]
    return entries[marks[-1] + 1 :] if marks else []


def one_step() -> FunctionRegistry:
    return linear_registry({"one": [LAST_STEP]})


def test_malformed_ticks_and_signals_go_to_the_dead_letter_topics_and_are_committed(
    store_url: str, kafka_topics: KafkaTopics
) -> None:
    engine = open_engine(store_url, kafka_topics, CountingExecutor())
    raw = producer(kafka_topics)
    poison = [
        (b"\xff\xfe\xfd", "not_utf8"),
        (b"{not json", "not_json"),
        (b'{"tenant_id": "acme"}', "missing_field"),
        (b'{"tenant_id": "acme", "job_id": 12}', "bad_field"),
        (encode_tick(Tick(TENANT, "ghost"), dedupe_key=None, enqueued_at_ms=0), "unknown_job"),
    ]
    key = job_key(TENANT, "job-1")
    for value, _ in poison:
        raw.send(kafka_topics.ticks, key=key, value=value, headers=[("origin", b"test")])
    bad_signal = b'{"tenant_id": "acme", "job_id": "job-1", "event": "e"}'
    raw.send(kafka_topics.signals, key=key, value=bad_signal)
    raw.flush()
    # A good job on the same partition after the poison still runs.
    engine.submit(TENANT, "job-1", "agent3")

    worker = KafkaWorker(engine, kafka_topics.settings())
    with running(worker):
        wait_for(lambda: all_done(engine, ["job-1"]), 60, "the good job completed")
        wait_for(lambda: worker.stats.dead_lettered == 6, 30, "all poison dead-lettered")
    assert_steps_once(engine, "job-1", 3)

    dead = read_topic(kafka_topics.bootstrap, kafka_topics.ticks_dlq, at_least=5)
    assert [(r.value, headers(r)["jobledger.dlq.reason"]) for r in dead] == poison
    for record in dead:
        meta = headers(record)
        assert record.key == key and meta["origin"] == "test"
        assert meta["jobledger.dlq.topic"] == kafka_topics.ticks
        assert meta["jobledger.dlq.error"]
        assert int(meta["jobledger.dlq.offset"]) >= 0
    (dead_signal,) = read_topic(kafka_topics.bootstrap, kafka_topics.signals_dlq, at_least=1)
    assert dead_signal.value == bad_signal
    assert headers(dead_signal)["jobledger.dlq.reason"] == "missing_field"
    # Dead-lettered messages are committed: the group is at the end of both topics.
    for topic in (kafka_topics.ticks, kafka_topics.signals):
        committed = committed_offsets(kafka_topics.bootstrap, kafka_topics.group, topic)
        assert committed == end_offsets(kafka_topics.bootstrap, topic)
    engine.close()


class FlakyStore:
    """The job store with an outage switch: while ``down``, every call fails the way an
    unreachable database does (StoreUnavailableError). ``fail_append`` fails one chosen
    append (by how many appends came before it), after the earlier ones committed."""

    def __init__(self, inner: JobStore) -> None:
        self.inner = inner
        self.down = False
        self.calls_while_down = 0
        self.appends = 0
        self.fail_append: int | None = None

    def __getattr__(self, name: str) -> Any:
        """The rest of the port is the real store's."""
        return getattr(self.inner, name)

    def _check(self) -> None:
        if self.down:
            self.calls_while_down += 1
            raise StoreUnavailableError("connection refused (test outage)")

    def load(self, job_uuid: UUID) -> Job | None:
        self._check()
        return self.inner.load(job_uuid)

    def append(self, job: Job, *keys: ConsumedKey) -> None:
        self._check()
        self.appends += 1
        if self.appends == self.fail_append:
            raise StoreUnavailableError("the commit failed (test)")
        self.inner.append(job, *keys)

    def find_key(self, route: UUID, key_id: UUID) -> ConsumedKey | None:
        self._check()
        return self.inner.find_key(route, key_id)

    def events(self, job_uuid: UUID, **window: int | None) -> list[Job.Event]:
        self._check()
        return self.inner.events(job_uuid, **window)


def test_an_infrastructure_error_is_not_committed_and_the_partition_retries_it(
    store_url: str, kafka_topics: KafkaTopics
) -> None:
    executor = CountingExecutor()
    engine = open_engine(store_url, kafka_topics, executor, wrap_store=FlakyStore)  # lease: 5 min
    flaky = engine.store
    assert isinstance(flaky, FlakyStore)
    engine.submit(TENANT, "job-1", "agent3")
    engine.submit(TENANT, "job-2", "agent3")
    flaky.appends = 0  # ``fail_append`` counts the worker's appends, not the submits'
    flaky.down = True
    bootstrap, group, ticks = kafka_topics.bootstrap, kafka_topics.group, kafka_topics.ticks

    worker = KafkaWorker(engine, kafka_topics.settings())
    with running(worker):
        wait_for(lambda: worker.stats.retried >= 4, 30, "the worker retried during the outage")
        # Nothing was committed, nothing skipped, nothing dead-lettered, no job failed.
        assert committed_offsets(bootstrap, group, ticks) == {p: 0 for p in range(4)}
        assert worker.stats.dead_lettered == 0 and worker.stats.ticks == 0
        # The database comes back, but the commit of job-1's second append (the step
        # after its claim) fails once: the retry goes on with the same claim at once
        # instead of waiting out its own 5-minute lease.
        flaky.fail_append = 2
        flaky.down = False
        wait_for(lambda: all_done(engine, ["job-1", "job-2"]), 60, "both jobs completed")
        wait_for(
            lambda: committed_offsets(bootstrap, group, ticks) == end_offsets(bootstrap, ticks),
            30,
            "everything committed once the store is back",
        )
    assert flaky.calls_while_down >= 4
    for job in ("job-1", "job-2"):
        assert_steps_once(engine, job, 3)
    assert worker.stats.dead_lettered == 0
    assert read_topic(bootstrap, kafka_topics.ticks_dlq) == []
    # Step 1 of whichever job hit the failed commit ran once: the worker did not die, and
    # the retry recorded what it kept (issue 29, item 4).
    assert sorted(executor.calls.values()) == [1] * 6
    engine.close()


def test_an_outage_during_the_spend_check_is_rewound_and_never_dead_lettered(
    store_url: str, kafka_topics: KafkaTopics, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With a cost ceiling, every delivery of the tick meets the outage at the spend
    check (the driver's error, below the adapters): it used to be taken for a bug and
    dead-lettered after three tries, its offset committed."""
    executor = CountingExecutor()
    engine = open_engine(store_url, kafka_topics, executor, cost_ceiling_usd="100")
    engine.submit(TENANT, "job-1", "agent3")
    assert isinstance(engine.store, EventSourcedJobStore)
    outage = Outage(engine.store, monkeypatch)
    (partition,) = engine.store.partitions
    outage.during(partition.recorder, "select_notifications")
    bootstrap, group, ticks = kafka_topics.bootstrap, kafka_topics.group, kafka_topics.ticks

    worker = KafkaWorker(engine, kafka_topics.settings())
    with running(worker):
        wait_for(lambda: worker.stats.retried >= 4, 30, "the worker retried during the outage")
        assert committed_offsets(bootstrap, group, ticks) == {p: 0 for p in range(4)}
        assert worker.stats.dead_lettered == 0 and worker.stats.ticks == 0
        outage.end()
        wait_for(lambda: all_done(engine, ["job-1"]), 60, "the job completed")
        wait_for(
            lambda: committed_offsets(bootstrap, group, ticks) == end_offsets(bootstrap, ticks),
            30,
            "everything committed once the store is back",
        )
    assert engine.job(TENANT, "job-1").status is JobStatus.COMPLETED
    assert_steps_once(engine, "job-1", 3)
    assert worker.stats.dead_lettered == 0
    assert read_topic(bootstrap, kafka_topics.ticks_dlq) == []
    engine.close()


@pytest.mark.slow
@pytest.mark.parametrize("point", ["after_step_2_recorded", "after_the_whole_tick"])
def test_a_worker_killed_between_effect_and_commit_gets_its_tick_delivered_again(
    store_url: str, kafka_topics: KafkaTopics, tmp_path: Path, point: str
) -> None:
    counter = tmp_path / "calls"
    engine = open_engine(store_url, kafka_topics, CountingExecutor(), lease_ms=1_500)
    engine.submit(TENANT, "job-1", "agent3")
    (tick_record,) = read_topic(kafka_topics.bootstrap, kafka_topics.ticks, at_least=1)
    env = {
        **os.environ,
        **kafka_topics.env(),
        "JOBLEDGER_STORE_URL": store_url,
        "JOBLEDGER_LEASE_MS": "1500",
        "PYTHONPATH": pythonpath(),
    }
    marker = tmp_path / "hung"
    hang = (
        ["--hang-after-record", "2"]
        if point == "after_step_2_recorded"
        else ["--hang-before-commit"]
    )
    doomed = subprocess.Popen(
        [*PROCS, "--counter", str(counter), "--marker", str(marker), *hang],
        env={**env, "JOBLEDGER_WORKER_ID": "doomed"},
        stderr=subprocess.PIPE,
    )
    try:
        wait_for(lambda: marker.exists() or doomed.poll() is not None, 60, "the worker hung")
        assert doomed.poll() is None, doomed.stderr.read() if doomed.stderr else ""
    finally:
        doomed.send_signal(signal.SIGKILL)
        doomed.wait()
    # Its effect is in the store, its offset is not committed.
    left = engine.job(TENANT, "job-1")
    if point == "after_step_2_recorded":
        assert (left.status, left.current_step, left.worker_id) == (JobStatus.RUNNING, 2, "doomed")
    else:
        assert left.status is JobStatus.COMPLETED
    committed = committed_offsets(kafka_topics.bootstrap, kafka_topics.group, kafka_topics.ticks)
    assert committed[tick_record.partition] == tick_record.offset == 0

    survivor = subprocess.Popen(
        [*PROCS, "--counter", str(counter)],
        env={**env, "JOBLEDGER_WORKER_ID": "survivor"},
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_for(lambda: all_done(engine, ["job-1"]), 90, "the re-delivered tick finished it")
        wait_for(
            lambda: (
                committed_offsets(kafka_topics.bootstrap, kafka_topics.group, kafka_topics.ticks)[
                    tick_record.partition
                ]
                == 1
            ),
            30,
            "the tick committed by the survivor",
        )
    finally:
        survivor.send_signal(signal.SIGTERM)
        survivor.wait(timeout=30)
    assert_steps_once(engine, "job-1", 3)
    # No recorded step ran again: each side effect ran exactly once.
    assert read_counts(counter) == {step_key(TENANT, "job-1", n): 1 for n in (1, 2, 3)}
    history = engine.history(TENANT, "job-1")
    if point == "after_step_2_recorded":
        # The survivor took over the doomed worker's lapsed claim on step 3.
        claims = [e.data for e in history if e.event_type == "Claimed"]
        taken_over = next(c for c in claims if c["worker_id"] == "survivor")
        assert taken_over["previous_worker_id"] == "doomed"
    engine.close()


@pytest.mark.slow
def test_two_consumers_share_the_partitions_and_hand_them_over_on_a_rebalance(
    pg_url: str, kafka_topics: KafkaTopics
) -> None:
    executor = CountingExecutor()
    executor.fail_with = lambda request: time.sleep(0.01)  # type: ignore[func-returns-value]
    engine_a = open_engine(pg_url, kafka_topics, executor, worker_id="a")
    engine_b = open_engine(pg_url, kafka_topics, executor, worker_id="b")
    jobs = [f"job-{n}" for n in range(100)]
    for job in jobs:
        engine_a.submit(TENANT, job, "agent3")
    a = KafkaWorker(engine_a, kafka_topics.settings(), max_poll_records=5)
    b = KafkaWorker(engine_b, kafka_topics.settings(), max_poll_records=5)
    everything = frozenset(
        TopicPartition(topic, p)
        for topic in (kafka_topics.ticks, kafka_topics.signals)
        for p in range(4)
    )
    a_thread = threading.Thread(target=a.run, daemon=True)
    a_thread.start()
    wait_for(lambda: a.assignment == everything and a.stats.ticks >= 8, 60, "a alone")
    with running(b):
        # b joins: the group rebalances and the two share the partitions.
        wait_for(lambda: 0 < len(b.assignment) < 8, 60, "b got a share")
        wait_for(lambda: b.stats.ticks >= 5, 60, "b works")
        assert 0 < len(a.assignment) < 8 and not a.assignment & b.assignment
        # a leaves: b takes every partition over, and finishes the rest.
        a.stop()
        a_thread.join(timeout=30)
        wait_for(lambda: b.assignment == everything, 60, "b took everything")
        handed_over = b.stats.ticks
        wait_for(lambda: all_done(engine_a, jobs), 90, "every job completed")
        assert b.stats.ticks > handed_over, "b ran ticks from a's former partitions"
    assert a.stats.ticks + b.stats.ticks >= len(jobs)
    for job in jobs:
        assert_steps_once(engine_a, job, 3)
    assert set(executor.calls.values()) == {1}, "no step ran twice"
    assert committed_offsets(kafka_topics.bootstrap, kafka_topics.group, kafka_topics.ticks) == (
        end_offsets(kafka_topics.bootstrap, kafka_topics.ticks)
    )
    engine_a.close()
    engine_b.close()


# ---- signals in --------------------------------------------------------------------------


def wait_registry() -> FunctionRegistry:
    return linear_registry({"wait": [STEP, wait_event("invoice.paid"), STEP, DONE]})


def test_a_published_signal_resumes_a_waiting_job_once(
    store_url: str, kafka_topics: KafkaTopics
) -> None:
    executor = CountingExecutor()
    engine = open_engine(store_url, kafka_topics, executor, registry=wait_registry())
    raw = producer(kafka_topics)

    def publish(message: SignalMessage) -> None:
        raw.send(kafka_topics.signals, key=message.key, value=message.encode()).get(10)

    engine.submit(TENANT, "late", "wait")
    worker = KafkaWorker(engine, kafka_topics.settings())
    with running(worker):
        wait_for(
            lambda: engine.job(TENANT, "late").status is JobStatus.WAITING_EVENT, 30, "it waits"
        )
        paid = SignalMessage(TENANT, "late", "invoice.paid", "evt-1", {"amount": 120})
        publish(paid)
        wait_for(lambda: all_done(engine, ["late"]), 30, "the signal resumed it")
        publish(paid)  # delivered twice: the signal id makes the second a no-op
        # A signal that arrives before its job waits is kept until the wait opens.
        early = SignalMessage(TENANT, "early", "invoice.paid", "evt-2", {"amount": 7})
        engine.submit(TENANT, "early", "wait")
        publish(early)
        publish(SignalMessage(TENANT, "nobody", "invoice.paid", "evt-3", {}))
        wait_for(lambda: all_done(engine, ["early"]), 30, "the early signal was kept")
        wait_for(lambda: worker.stats.signals >= 3 and worker.stats.dead_lettered == 1, 30, "all")
    assert worker.stats.outcomes["signal_duplicate"] >= 1
    for job in ("late", "early"):
        view = engine.job(TENANT, job)
        assert view.status is JobStatus.COMPLETED
        resumed = [e for e in engine.history(TENANT, job) if e.event_type == "Resumed"]
        assert len(resumed) == 1
    assert engine.job(TENANT, "late").state["amount"] == 120
    assert engine.job(TENANT, "early").state["amount"] == 7
    assert set(executor.calls.values()) == {1}
    (dead,) = read_topic(kafka_topics.bootstrap, kafka_topics.signals_dlq, at_least=1)
    assert headers(dead)["jobledger.dlq.reason"] == "unknown_job"
    engine.close()


# ---- timers come back through the reconciler ---------------------------------------------


def test_the_reconciler_publishes_a_timer_when_it_is_due(
    store_url: str, kafka_topics: KafkaTopics
) -> None:
    registry = linear_registry({"nap": [STEP, sleep_ms(1_500), STEP, DONE]})
    executor = CountingExecutor()
    engine = open_engine(
        store_url, kafka_topics, executor, registry=registry, inline_resume_max_delay_ms=0
    )
    engine.submit(TENANT, "napper", "nap")
    runner = KafkaRunner(
        engine, KafkaRunnerSettings(workers=1, reconciler=True, reconcile_interval=0.2)
    )
    runner.start()
    try:
        wait_for(
            lambda: engine.job(TENANT, "napper").status is JobStatus.WAITING_TIME, 30, "asleep"
        )
        assert isinstance(engine.queue, KafkaQueue) and engine.queue.left_to_reconciler >= 1
        wait_for(lambda: all_done(engine, ["napper"]), 30, "woken by the reconciler")
    finally:
        runner.stop()
    assert_steps_once(engine, "napper", 3)
    reasons = [
        decode_tick(r.value).tick.reason
        for r in read_topic(kafka_topics.bootstrap, kafka_topics.ticks, at_least=2)
    ]
    assert reasons[0] == "create" and "reconcile_waiting_time" in reasons
    engine.close()
