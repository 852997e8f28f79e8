"""The event outbox on a real broker: every job event on the events topic in log order
per job, with its headers; a consumer rebuilds every job from the topic alone; after a
crash the outbox resumes from its tracked position and its duplicates carry the same
position. On SQLite and on PostgreSQL.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import pytest

from jobledger import Engine, JobStatus, StepError
from jobledger.adapters.event_store import EventSourcedJobStore
from jobledger.adapters.kafka.publisher import KafkaEventPublisher
from jobledger.adapters.locks import lock_for
from jobledger.domain import chain
from jobledger.domain.identity import job_uuid
from jobledger.domain.job import Job
from jobledger.domain.views import JobView
from jobledger.projections import status
from jobledger.projections.outbox import Outbox, decode_event, encode_event
from tests.support.engines import CountingExecutor, EngineFactory
from tests.support.kafka_broker import KafkaTopics, headers, read_topic

TENANT = "acme"


def run_some_jobs(engine: Engine, executor: CountingExecutor) -> list[str]:
    """Jobs that complete, wait on a timer, fail and get cancelled: many event types."""
    jobs = []
    for n in range(6):
        engine.submit(TENANT, f"agent-{n}", "agent3", input={"n": n})
        jobs.append(f"agent-{n}")
    for n in range(2):
        engine.submit(TENANT, f"timer-{n}", "timer")
        jobs.append(f"timer-{n}")
    engine.submit(TENANT, "doomed", "agent3")
    engine.submit(TENANT, "cancelled", "agent3")
    jobs += ["doomed", "cancelled"]
    engine.cancel(TENANT, "cancelled", reason="changed my mind", by="ops")
    executor.fail_with = lambda r: StepError("boom") if r.job.job_id == "doomed" else None
    engine.run_until_idle()  # the timers stay asleep: their jobs wait
    return jobs


def rebuild(records: list[Any]) -> dict[str, Job]:
    """What a downstream consumer does with the topic alone: per job, apply an event when
    its version is the next one, drop older ones (duplicates), fold with the domain."""
    jobs: dict[str, Job] = {}
    versions: dict[str, int] = defaultdict(int)
    events: dict[str, list[Job.Event]] = defaultdict(list)
    for record in records:
        meta = headers(record)
        key = record.key.decode()
        assert key == f"{meta['tenant']}/{meta['job']}"
        version = int(meta["job_version"])
        if version <= versions[key]:
            continue
        assert version == versions[key] + 1, f"{key}: version {version} out of order"
        event = decode_event(record.value)
        assert event.originator_version == version
        assert type(event).__name__ == meta["event_type"]
        events[key].append(event)
        jobs[key] = event.mutate(jobs.get(key))  # type: ignore[arg-type]
        versions[key] = version
    for key, history in events.items():
        assert chain.verify(history) is None, key  # the chain holds on the topic too
    return jobs


def assert_topic_matches_store(engine: Engine, jobs: list[str], records: list[Any]) -> None:
    rebuilt = rebuild(records)
    assert set(rebuilt) == {f"{TENANT}/{job}" for job in jobs}
    for job in jobs:
        assert JobView.of(rebuilt[f"{TENANT}/{job}"]) == engine.job(TENANT, job)
    # Every event of the store is on the topic, in log order per job, and nothing else.
    by_key: dict[str, list[int]] = defaultdict(list)
    for record in records:
        by_key[record.key.decode()].append(int(headers(record)["job_version"]))
    for job in jobs:
        stored = engine.history(TENANT, job)
        unique = list(dict.fromkeys(by_key[f"{TENANT}/{job}"]))
        assert unique == [entry.version for entry in stored]


def test_every_event_is_published_in_log_order_and_the_topic_rebuilds_every_job(
    make_engine: EngineFactory, executor: CountingExecutor, kafka_topics: KafkaTopics
) -> None:
    engine = make_engine()
    jobs = run_some_jobs(engine, executor)
    statuses = {engine.job(TENANT, job).status for job in jobs}
    assert {JobStatus.COMPLETED, JobStatus.WAITING_TIME, JobStatus.FAILED} <= statuses
    assert JobStatus.CANCELLED in statuses
    store = engine.store
    assert isinstance(store, EventSourcedJobStore)
    publisher = KafkaEventPublisher(kafka_topics.settings())
    outbox = Outbox(store, publisher, lock=lock_for(store.location, "outbox"), batch=25)
    total = sum(len(engine.history(TENANT, job)) for job in jobs)
    assert outbox.publish_pending() == total
    assert outbox.publish_pending() == 0  # all tracked: nothing published twice

    records = read_topic(kafka_topics.bootstrap, kafka_topics.events, at_least=total)
    assert len(records) == total
    assert_topic_matches_store(engine, jobs, records)
    # Headers say where each event is in the log: positions are unique and increasing.
    positions = [(headers(r)["log"], int(headers(r)["position"])) for r in records]
    assert len(set(positions)) == total
    for partition in {r.partition for r in records}:
        mine = [int(headers(r)["position"]) for r in records if r.partition == partition]
        assert mine == sorted(mine)
    first = headers(records[0])
    assert set(first) >= {"tenant", "job", "job_uuid", "event_type", "job_version", "log"}
    assert outbox.lag()[0].behind == 0

    # More work later: the outbox goes on from its tracked position.
    engine.submit(TENANT, "later", "agent3")
    engine.run_until_idle()
    more = len(engine.history(TENANT, "later"))
    assert outbox.publish_pending() == more
    records = read_topic(kafka_topics.bootstrap, kafka_topics.events, at_least=total + more)
    assert_topic_matches_store(engine, [*jobs, "later"], records)
    publisher.close()


class Crash(BaseException):
    """The process dies here."""


class CrashBeforeTracking(Outbox):
    """Dies after the broker acknowledged a batch, before the position is recorded."""

    def __init__(self, *args: Any, crash_on_batch: int, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.batches = 0
        self.crash_on_batch = crash_on_batch

    def track(self, curs: Any, tracking: Any, *, after: int) -> None:
        self.batches += 1
        if self.batches == self.crash_on_batch:
            raise Crash
        super().track(curs, tracking, after=after)


def test_after_a_crash_the_outbox_resumes_and_its_duplicates_carry_the_same_position(
    make_engine: EngineFactory, executor: CountingExecutor, kafka_topics: KafkaTopics
) -> None:
    engine = make_engine()
    jobs = run_some_jobs(engine, executor)
    store = engine.store
    assert isinstance(store, EventSourcedJobStore)
    total = sum(len(engine.history(TENANT, job)) for job in jobs)
    publisher = KafkaEventPublisher(kafka_topics.settings())
    doomed = CrashBeforeTracking(store, publisher, batch=20, crash_on_batch=3)
    with pytest.raises(Crash):
        doomed.publish_pending()
    # Two batches tracked, the third on the topic but not tracked.
    assert doomed.position(store.partitions[0]) == 40
    restarted = Outbox(store, publisher, batch=20)
    assert restarted.publish_pending() + 40 >= total
    records = read_topic(kafka_topics.bootstrap, kafka_topics.events, at_least=total + 1)

    by_position: dict[tuple[str, str], list[bytes]] = defaultdict(list)
    for record in records:
        meta = headers(record)
        by_position[(meta["log"], meta["position"])].append(record.value)
    duplicated = {p: values for p, values in by_position.items() if len(values) > 1}
    assert duplicated, "the untracked batch was published again"
    assert all(len(set(values)) == 1 for values in duplicated.values()), "same event, same bytes"
    assert len(by_position) == total
    assert_topic_matches_store(engine, jobs, records)
    publisher.close()


def test_a_decoded_event_is_the_stored_event(
    make_engine: EngineFactory, executor: CountingExecutor
) -> None:
    engine = make_engine()
    engine.submit(TENANT, "one", "agent3", input={"text": "héllo", "n": 1.5})
    engine.run_until_idle()
    events = engine.store.events(job_uuid(TENANT, "one"))
    decoded = [decode_event(encode_event(event)) for event in events]
    assert [type(e) for e in decoded] == [type(e) for e in events]
    assert [chain.event_fields(e) for e in decoded] == [chain.event_fields(e) for e in events]
    assert chain.verify(decoded) is None
    row = None
    for event in decoded:
        row = status.fold(row, event)
    assert row is not None and (row.status, row.current_step) == ("completed", 4)
    with pytest.raises(ValueError, match="not a job event"):
        decode_event(b'{"type": "Job.Nope", "fields": {}}')
