"""Subscriptions survive crashes: a message's job is made exactly once whatever point its
worker dies at, and it runs.

1. In process, on the real broker: the first delivery of a message dies (an exception
   nothing in the engine catches) at each write of its submit: before the job is
   written, after its idempotency key is reserved, after the job is written and before
   its first tick is sent (also with an admission window, once the gate admitted it),
   after the tick is sent and before the offset is committed.
   Then a fresh engine's worker reads the message again (nothing was committed): one
   job, and it completes, with no reconciler running.
2. Real processes: a worker process (tests/support/subscription_worker.py) SIGKILLs
   itself between a submit (or a signal) and its offset commit, or its parent SIGKILLs
   it at a random moment; it is started again, round after round
   (``JOBLEDGER_TEST_CRASH_ROUNDS``, 20 by default). Then, from the store: exactly one
   job per message, keyed ``sub:<name>:<identity>``, each step recorded once, every
   offset committed; and a signal delivered again after a kill resumes its job once.

Every test runs on SQLite and on PostgreSQL.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from kafka import KafkaProducer

from jobledger import Engine, JobStatus
from jobledger.adapters.event_store import EventSourcedJobStore
from jobledger.adapters.kafka import subscriptions
from jobledger.adapters.kafka.worker import KafkaWorker
from jobledger.domain.errors import UnknownJobError
from jobledger.domain.identity import job_uuid, key_uuid, step_key
from jobledger.domain.job import Job
from jobledger.domain.keys import ConsumedKey, KeyKind
from jobledger.domain.subscription import Subscription
from jobledger.orchestration.ports import JobStore, Queue, Tick
from tests.support import pythonpath
from tests.support.engines import TOKEN_SECRET, StoreAround, StoreWrapper
from tests.support.kafka_broker import (
    KafkaTopics,
    committed_offsets,
    read_topic,
    running,
    wait_for,
)
from tests.support.subscriptions import all_committed, open_engine, settings_of

TENANT = "acme"
FULFIL_STEPS = 2
"""Side-effecting steps of ``fulfil`` (tests/support/subscription_worker.py), then its
pure ``complete`` step."""


class Crash(BaseException):
    """The process dies here: not an Exception, so nothing in the engine can catch it."""


def orders(topics: KafkaTopics) -> Subscription:
    return Subscription(
        name="orders",
        topic=f"{topics.prefix}.orders",
        tenant=TENANT,
        workflow="fulfil",
        key="{value.order}",
    )


def send_values(
    topics: KafkaTopics, topic: str, values: list[dict[str, Any]], *, key: str = "order"
) -> list[Any]:
    """Send each value, keyed by its field ``key``, and return where each landed."""
    producer = KafkaProducer(bootstrap_servers=topics.bootstrap, acks="all")
    try:
        futures = [
            producer.send(topic, key=str(v[key]).encode(), value=json.dumps(v).encode())
            for v in values
        ]
        producer.flush()
        return [future.get(timeout=30) for future in futures]
    finally:
        producer.close()


def completed(engine: Engine, job_id: str) -> bool:
    try:
        return engine.job(TENANT, job_id).status is JobStatus.COMPLETED
    except UnknownJobError:
        return False


# ---- what the store holds --------------------------------------------------------------


def submitted_events(engine: Engine) -> list[Job.Submitted]:
    """Every Submitted event in the log, every partition, read raw: a job made twice
    (under any id) shows here, whatever the views say."""
    store = engine.store
    assert isinstance(store, EventSourcedJobStore)
    found: list[Job.Submitted] = []
    for partition in store.partitions:
        start = 1
        while batch := partition.recorder.select_notifications(start, 500):
            for notification in batch:
                event = partition.mapper.to_domain_event(notification)
                if isinstance(event, Job.Submitted):
                    found.append(event)
            start = batch[-1].id + 1
    return found


def assert_one_job_per_identity(
    engine: Engine, subscription: Subscription, identities: list[str]
) -> None:
    """From the store: exactly one job per message identity (its derived id, its key
    ``sub:<name>:<identity>``), none other, each completed with its steps recorded once."""
    submitted = submitted_events(engine)
    made = Counter((event.tenant_id, event.job_id) for event in submitted)
    expected = {(TENANT, subscription.derived_job_id(i)): 1 for i in identities}
    assert made == expected
    keys = {event.job_id: event.submit_key for event in submitted}
    name = subscription.name
    assert keys == {subscription.derived_job_id(i): f"sub:{name}:{i}" for i in identities}
    for identity in identities:
        job_id = subscription.derived_job_id(identity)
        view = engine.job(TENANT, job_id)
        assert view.status is JobStatus.COMPLETED, view
        history = engine.history(TENANT, job_id)
        recorded = Counter(
            e.data["idempotency_key"] for e in history if e.event_type == "StepRecorded"
        )
        steps = range(1, FULFIL_STEPS + 2)
        assert recorded == {step_key(TENANT, job_id, n): 1 for n in steps}, job_id
        assert engine.verify(TENANT, job_id) is None


# ---- 1. crash points in process ----------------------------------------------------------


CRASH_POINTS = [
    "before_append",
    "after_key_reserved",
    "after_append",
    "admitted_before_enqueue",
    "after_enqueue",
]


class CrashAtSubmit(StoreAround):
    """A store whose process dies at the append of a job's Submitted event: before it
    (the job not written) or right after it committed (the job written)."""

    def __init__(self, inner: JobStore, *, after: bool) -> None:
        super().__init__(inner)
        self.after = after

    def append(self, job: Job, *keys: ConsumedKey) -> None:
        submits = any(isinstance(event, Job.Submitted) for event in job.pending_events)
        if submits and not self.after:
            raise Crash
        self.inner.append(job, *keys)
        if submits:
            raise Crash


class CrashAtFirstTick:
    """A queue whose process dies as it sends a job's first tick."""

    def __init__(self, inner: Queue) -> None:
        self.inner = inner

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def enqueue(self, tick: Tick, *, delay_ms: int = 0, dedupe_key: str | None = None) -> None:
        if tick.reason == "create":
            raise Crash
        self.inner.enqueue(tick, delay_ms=delay_ms, dedupe_key=dedupe_key)


def crashing_engine(
    store_url: str, topics: KafkaTopics, subscription: Subscription, point: str
) -> Engine:
    """The engine of the first delivery, dying at ``point``. With an admission window
    (``admitted_before_enqueue``) the gate admits the job before its tick is sent."""
    if point == "admitted_before_enqueue":
        engine = open_engine(store_url, topics, subscription, partitions=4, admission_window=2)
        return Engine(replace(engine.deps, queue=CrashAtFirstTick(engine.deps.queue)))
    wrap: StoreWrapper | None = None
    if point in ("before_append", "after_key_reserved"):
        wrap = lambda store: CrashAtSubmit(store, after=False)  # noqa: E731
    elif point == "after_append":
        wrap = lambda store: CrashAtSubmit(store, after=True)  # noqa: E731
    return open_engine(store_url, topics, subscription, wrap_store=wrap, partitions=4)


def an_order(engine: Engine, subscription: Subscription, *, colocated: bool) -> str:
    """An order whose submit key lives in its job's event table (one append writes both)
    or in another (the key is reserved first, then the job written: two writes)."""
    for n in range(100):
        order = f"o-{n}"
        key = key_uuid(TENANT, KeyKind.SUBMIT, subscription.dedupe_id(order))
        job = job_uuid(TENANT, subscription.derived_job_id(order))
        if engine.store.colocated(key, job) is colocated:
            return order
    raise AssertionError(f"no order with its key {'beside' if colocated else 'apart from'} its job")


@pytest.mark.parametrize("point", CRASH_POINTS)
def test_a_submit_dying_at_any_write_leaves_one_job_that_runs_when_the_message_is_read_again(
    store_url: str, kafka_topics: KafkaTopics, point: str
) -> None:
    subscription = orders(kafka_topics)
    settings = settings_of(kafka_topics, subscription)
    # Four event tables: "after the key is reserved" is a moment of its own for an order
    # whose key lives apart from its job; "before the append", one whose key is beside it.
    first = crashing_engine(store_url, kafka_topics, subscription, point)
    order = an_order(first, subscription, colocated=point == "before_append")
    send_values(kafka_topics, subscription.topic, [{"order": order, "amount": 5}])
    (record,) = read_topic(kafka_topics.bootstrap, subscription.topic, at_least=1)
    job_id = subscription.derived_job_id(order)
    if point == "after_enqueue":
        assert subscriptions.handle(first, subscription, record) == "submitted"
    else:
        with pytest.raises(Crash):
            subscriptions.handle(first, subscription, record)
    first.close()
    # What the dead delivery left: nothing, the key alone, the job without its tick, or
    # the job and its tick; and never the offset.
    gate = {"admission_window": 2} if point == "admitted_before_enqueue" else {}
    left = open_engine(store_url, kafka_topics, subscription, partitions=4, **gate)
    jobs_left = [e.job_id for e in submitted_events(left)]
    assert jobs_left == ([] if point in ("before_append", "after_key_reserved") else [job_id])
    key = key_uuid(TENANT, KeyKind.SUBMIT, subscription.dedupe_id(order))
    key_reserved = left.store.find_key(key, key) is not None
    assert key_reserved is (point != "before_append")
    if point == "admitted_before_enqueue":
        assert left.deps.admission is not None
        assert left.deps.admission.admitted(str(job_uuid(TENANT, job_id))) is True
    ticks = read_topic(kafka_topics.bootstrap, kafka_topics.ticks, timeout=2)
    assert len(ticks) == (1 if point == "after_enqueue" else 0)
    committed = committed_offsets(kafka_topics.bootstrap, kafka_topics.group, subscription.topic)
    assert set(committed.values()) == {0}

    worker = KafkaWorker(left, settings)
    with running(worker):
        wait_for(
            lambda: completed(left, job_id),
            60,
            f"the job of the message read again completed ({point}; no reconciler runs)",
        )
        wait_for(lambda: all_committed(kafka_topics, subscription.topic), 30, "offset committed")
    outcome = "submitted" if point in ("before_append", "after_key_reserved") else "found"
    subscribed = {k: n for k, n in worker.stats.outcomes.items() if k.startswith("orders_")}
    assert subscribed == {f"orders_{outcome}": 1}
    assert worker.stats.dead_lettered == 0
    assert_one_job_per_identity(left, subscription, [order])
    left.close()


# ---- 2. SIGKILLed worker processes -----------------------------------------------------

ROUNDS = max(1, int(os.environ.get("JOBLEDGER_TEST_CRASH_ROUNDS", "20")))
"""Rounds of a worker killing itself between a submit and its commit (the issue's 20)."""
RANDOM_KILLS = max(1, ROUNDS // 5)
"""More rounds, spread among those: a worker the test kills at a random moment."""
SIGNAL_ROUNDS = 4
"""Jobs waiting for a signal, each signal's worker killed right after delivering it."""
SEED = 28
WORKER = [sys.executable, "-m", "tests.support.subscription_worker"]


class WorkerProcess:
    """The worker process of each round, started again after each kill, always as one
    static group member (see tests/support/subscription_worker.py)."""

    def __init__(self, env: dict[str, str], tmp_path: Path) -> None:
        self.env = env
        self.tmp_path = tmp_path
        self.counter = tmp_path / "effects"
        self.kills = tmp_path / "kills"
        self.started = 0

    def start(self, *args: str) -> subprocess.Popen[bytes]:
        self.started += 1
        log = (self.tmp_path / f"worker-{self.started}.log").open("wb")
        command = [*WORKER, "--counter", str(self.counter), "--member", "worker", *args]
        return subprocess.Popen(
            command,
            env={**self.env, "JOBLEDGER_WORKER_ID": f"w{self.started}"},
            stdout=log,
            stderr=subprocess.STDOUT,
        )

    def failed(self, proc: subprocess.Popen[bytes], what: str) -> AssertionError:
        """Kill a worker that did not do ``what``; the error carries its log (with its
        threads' stacks when it hung)."""
        if proc.poll() is None:
            proc.send_signal(signal.SIGUSR1)
            time.sleep(1)
            proc.kill()
            proc.wait()
        log = (self.tmp_path / f"worker-{self.started}.log").read_text()
        return AssertionError(f"worker {self.started} {what}; its log ends:\n{log[-6000:]}")

    def kills_itself(self, after: int) -> None:
        """One round: the worker SIGKILLs itself after ``after`` new effects."""
        proc = self.start("--kill-after", str(after), "--kills", str(self.kills))
        try:
            returncode = proc.wait(timeout=120)
        except subprocess.TimeoutExpired:
            raise self.failed(proc, "never killed itself") from None
        if returncode != -signal.SIGKILL:
            raise self.failed(proc, f"exited {returncode}")

    def killed_at_random(self, rng: random.Random) -> None:
        """One round: SIGKILLed by the test at a random moment once it has joined."""
        ready = self.tmp_path / f"ready-{self.started + 1}"
        proc = self.start("--ready", str(ready))
        deadline = time.monotonic() + 60
        while not ready.exists():
            if proc.poll() is not None or time.monotonic() > deadline:
                raise self.failed(proc, "never joined")
            time.sleep(0.02)
        time.sleep(rng.uniform(0, 0.5))
        proc.send_signal(signal.SIGKILL)
        proc.wait()

    @contextmanager
    def last(self) -> Iterator[None]:
        """The last worker, never killed, with the reconciler (as ``jobledger run`` has):
        a step a random kill interrupted under a live claim goes on once the dead
        worker's lease lapses."""
        proc = self.start("--reconcile")
        try:
            yield
        except BaseException as error:
            raise self.failed(proc, f"did not finish the work ({error})") from error
        proc.send_signal(signal.SIGTERM)
        try:
            assert proc.wait(timeout=60) == 0
        except (subprocess.TimeoutExpired, AssertionError):
            raise self.failed(proc, "did not stop cleanly") from None


def worker_env(store_url: str, topics: KafkaTopics, *subscribed: Subscription) -> dict[str, str]:
    listed = [s.model_dump(mode="json", exclude_none=True) for s in subscribed]
    return {
        **os.environ,
        **topics.env(),
        "JOBLEDGER_STORE_URL": store_url,
        "JOBLEDGER_SUBSCRIPTIONS": json.dumps(listed),
        "JOBLEDGER_LEASE_MS": "1500",
        "JOBLEDGER_TOKEN_SECRET": TOKEN_SECRET,
        # One message at a time: a self-kill knows the message it follows (see the worker).
        "JOBLEDGER_CONCURRENCY": "1",
        "PYTHONPATH": pythonpath(),
    }


def assert_read_again(topics: KafkaTopics, position: str) -> None:
    """The message at ``position`` (``topic:partition:offset``) is not committed: the
    next worker reads it again."""
    topic, partition, offset = position.rsplit(":", 2)
    assert committed_offsets(topics.bootstrap, topics.group, topic)[int(partition)] <= int(offset)


@pytest.mark.slow
def test_kill_9_between_submit_and_commit_leaves_exactly_one_job_per_message(
    store_url: str, kafka_topics: KafkaTopics, tmp_path: Path
) -> None:
    started = time.monotonic()
    # No business key: a message's identity is its position, as by default.
    subscription = Subscription(
        name="orders", topic=f"{kafka_topics.prefix}.orders", tenant=TENANT, workflow="fulfil"
    )
    settings_of(kafka_topics, subscription)
    workers = WorkerProcess(worker_env(store_url, kafka_topics, subscription), tmp_path)
    rng = random.Random(SEED)
    landed: list[Any] = []

    def two_more_orders() -> None:
        # Sent while no worker runs: each round's worker has new messages to submit.
        n = len(landed)
        values = [{"order": f"o-{n}", "amount": n}, {"order": f"o-{n + 1}", "amount": n + 1}]
        landed.extend(send_values(kafka_topics, subscription.topic, values))

    engine = open_engine(store_url, kafka_topics, subscription)
    for n in range(ROUNDS):
        two_more_orders()
        workers.kills_itself(after=rng.choice([1, 2]))
        # Killed right after a message's job was durable, before its offset was committed.
        position = workers.kills.read_text().splitlines()[-1]
        assert engine.job(TENANT, subscription.derived_job_id(position)).workflow_type == "fulfil"
        assert_read_again(kafka_topics, position)
        if n % (ROUNDS // RANDOM_KILLS) == 0:
            two_more_orders()
            workers.killed_at_random(rng)
    two_more_orders()

    identities = [f"{subscription.topic}:{m.partition}:{m.offset}" for m in landed]
    jobs = [subscription.derived_job_id(i) for i in identities]
    with workers.last():
        wait_for(lambda: all(completed(engine, j) for j in jobs), 120, "every job completed")
        wait_for(lambda: all_committed(kafka_topics, subscription.topic), 30, "offsets committed")
    kills = workers.kills.read_text().splitlines()
    assert len(kills) == ROUNDS
    assert set(kills) <= set(identities)
    assert_one_job_per_identity(engine, subscription, identities)
    # Every side effect ran, none more than once per kill that could have cut it short.
    effects = Counter(workers.counter.read_text().splitlines())
    keys = {step_key(TENANT, job, n) for job in jobs for n in range(1, FULFIL_STEPS + 1)}
    assert set(effects) == keys
    assert sum(effects.values()) - len(keys) <= ROUNDS + RANDOM_KILLS
    engine.close()
    print(
        f"\n{ROUNDS} self-kills, {RANDOM_KILLS} random kills, {len(landed)} messages, "
        f"{sum(effects.values()) - len(keys)} side effects run again, "
        f"{time.monotonic() - started:.0f}s"
    )


def payments(topics: KafkaTopics) -> Subscription:
    return Subscription(
        name="payments",
        topic=f"{topics.prefix}.payments",
        action="signal",
        tenant=TENANT,
        job_id="{value.job}",
        event="paid",
        input="value.payment",
    )


@pytest.mark.slow
def test_a_signal_delivered_again_after_a_kill_resumes_its_job_once(
    store_url: str, kafka_topics: KafkaTopics, tmp_path: Path
) -> None:
    subscription = payments(kafka_topics)
    settings_of(kafka_topics, subscription)
    engine = open_engine(store_url, kafka_topics)
    jobs = [f"pay-{n}" for n in range(SIGNAL_ROUNDS)]
    for job in jobs:
        engine.submit(TENANT, job, "payment")
    workers = WorkerProcess(worker_env(store_url, kafka_topics, subscription), tmp_path)
    positions: dict[str, str] = {}
    for job in jobs:
        # One signal a round, and the worker dies right after it resumed (or buffered)
        # its job, before its offset is committed: the next worker reads it again.
        (landed,) = send_values(
            kafka_topics,
            subscription.topic,
            [{"job": job, "payment": {"amount": len(positions) + 1}}],
            key="job",
        )
        positions[job] = f"{subscription.topic}:{landed.partition}:{landed.offset}"
        workers.kills_itself(after=1)
        assert_read_again(kafka_topics, positions[job])
    assert workers.kills.read_text().splitlines() == list(positions.values())

    with workers.last():
        wait_for(lambda: all(completed(engine, j) for j in jobs), 120, "every job completed")
        wait_for(lambda: all_committed(kafka_topics, subscription.topic), 30, "offsets committed")
    for n, job in enumerate(jobs):
        history = engine.history(TENANT, job)
        resumed = [e.data for e in history if e.event_type == "Resumed"]
        assert len(resumed) == 1, job
        assert resumed[0]["signal_id"] == f"sub:payments:{positions[job]}"
        assert resumed[0]["payload"] == {"amount": n + 1}
        recorded = Counter(
            e.data["idempotency_key"] for e in history if e.event_type == "StepRecorded"
        )
        assert recorded == {step_key(TENANT, job, step): 1 for step in range(1, 5)}, job
    engine.close()
