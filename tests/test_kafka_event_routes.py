"""Event routes on a real broker: the outbox sends each job event to the events topic and,
as a CloudEvent 1.0, to every route it matches (by workflow type, by event type), in the
binding's structured and binary modes; the library parses them back with the stored
event's identity and chain hash. A batch is tracked only once every copy is
acknowledged: a routed topic that cannot take it holds the position, and a crash after
the acknowledgements sends the batch again with the same CloudEvent ids. On SQLite and
on PostgreSQL.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
from collections import Counter, defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cloudevents.core.base import BaseCloudEvent
from cloudevents.core.bindings.kafka import KafkaMessage, from_binary, from_structured
from cloudevents.core.formats.json import JSONFormat
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from kafka import KafkaAdminClient

from jobledger import Engine, EngineConfig, StepError
from jobledger.adapters.event_store import EventSourcedJobStore
from jobledger.adapters.kafka import KafkaUnavailableError, ensure_topics
from jobledger.adapters.kafka.publisher import KafkaEventPublisher
from jobledger.adapters.kafka.settings import KafkaSettings
from jobledger.adapters.signing import private_pem
from jobledger.domain import chain
from jobledger.domain.event_routes import EventRoute
from jobledger.domain.identity import job_uuid
from jobledger.domain.job import Job
from jobledger.projections.outbox import Outbox, decode_event, encode_event
from jobledger.workflows import DefinitionRegistry
from jobledger.workflows.loader import parse_definition
from tests.support import pythonpath
from tests.support.cli import JOBLEDGER
from tests.support.engines import TOKEN_SECRET, CountingExecutor, EngineFactory, store_of
from tests.support.erasure import ADA, ONBOARDING, PLAINTEXT, Greeter, run_onboarding
from tests.support.kafka_broker import KafkaTopics, end_offsets, read_topic, wait_for
from tests.test_kafka_outbox import TENANT, Crash, CrashBeforeTracking

FORMAT = JSONFormat()


@dataclasses.dataclass(frozen=True)
class Routed:
    """This test's routes, their topics made on the broker, and its settings."""

    by_workflow: EventRoute
    by_type: EventRoute
    unmatched: EventRoute
    settings: KafkaSettings


@pytest.fixture
def routed(kafka_topics: KafkaTopics) -> Iterator[Routed]:
    prefix = kafka_topics.prefix
    routes = Routed(
        EventRoute(topic=f"{prefix}.agents", workflows=["agent3"]),
        EventRoute(topic=f"{prefix}.outcomes", event_types=["Failed", "Cancelled"], mode="binary"),
        EventRoute(topic=f"{prefix}.nobody", workflows=["no-such-workflow"]),
        kafka_topics.settings(),
    )
    settings = dataclasses.replace(
        routes.settings, event_routes=(routes.by_workflow, routes.by_type, routes.unmatched)
    )
    ensure_topics(settings)  # the routed topics are made with the others
    yield dataclasses.replace(routes, settings=settings)
    admin = KafkaAdminClient(bootstrap_servers=kafka_topics.bootstrap)
    try:
        admin.delete_topics([r.topic for r in settings.event_routes], raise_errors=False)
    except Exception:
        pass  # best effort: the broker is thrown away at the end of the run
    finally:
        admin.close()


def run_jobs(engine: Engine, executor: CountingExecutor) -> dict[str, str]:
    """Jobs of two workflow types that complete, wait, fail and are cancelled: job id ->
    workflow type."""
    jobs = {f"agent-{n}": "agent3" for n in range(4)} | {"doomed": "agent3"}
    jobs |= {"timer-0": "timer", "cancelled-timer": "timer"}
    for job, workflow in jobs.items():
        engine.submit(TENANT, job, workflow, input={"n": 1})
    engine.cancel(TENANT, "cancelled-timer", reason="not needed", by="ops")
    executor.fail_with = lambda r: StepError("boom") if r.job.job_id == "doomed" else None
    engine.run_until_idle()
    return jobs


def stored_events(engine: Engine, jobs: dict[str, str]) -> dict[str, Job.Event]:
    """Every stored event by its CloudEvent id (the job's UUID and the event's version)."""
    events = {}
    for job in jobs:
        uuid = job_uuid(TENANT, job)
        for event in engine.store.events(uuid):
            events[f"{uuid}/{event.originator_version}"] = event
    return events


def parse(record: Any, mode: str) -> BaseCloudEvent:
    message = KafkaMessage(headers=dict(record.headers), key=record.key, value=record.value)
    return from_binary(message, FORMAT) if mode == "binary" else from_structured(message, FORMAT)


def check_cloud_event(
    cloud: BaseCloudEvent, record: Any, stored: Job.Event, jobs: dict[str, str]
) -> None:
    """The CloudEvent says what the stored event is, and its data is the stored event."""
    job = cloud.get_subject()
    assert job is not None and record.key == f"{TENANT}/{job}".encode()
    assert cloud.get_type() == f"jobledger.job.{type(stored).__name__}"
    assert cloud.get_source() == f"jobledger/{TENANT}/{jobs[job]}"
    assert cloud.get_time() == stored.timestamp
    assert cloud.get_extension("jobledgertenant") == TENANT
    assert cloud.get_extension("jobledgerjobversion") == str(stored.originator_version)
    assert cloud.get_extension("jobledgerchainhash") == chain.sealed_form(stored).chain_hash
    data = cloud.get_data()
    assert isinstance(data, dict)
    decoded = decode_event(json.dumps(data).encode())
    assert chain.event_fields(decoded) == chain.event_fields(stored)


def test_routes_send_matching_events_as_cloud_events_in_both_modes(
    make_engine: EngineFactory, executor: CountingExecutor, routed: Routed
) -> None:
    engine = make_engine()
    jobs = run_jobs(engine, executor)
    stored = stored_events(engine, jobs)
    store = engine.store
    assert isinstance(store, EventSourcedJobStore)
    publisher = KafkaEventPublisher(routed.settings)
    outbox = Outbox(store, publisher, batch=10, routes=routed.settings.event_routes)
    assert outbox.publish_pending() == len(stored)  # events, not copies
    bootstrap = routed.settings.bootstrap_servers
    assert len(read_topic(bootstrap, routed.settings.events_topic, at_least=len(stored))) == len(
        stored
    )

    # By workflow type, structured mode: every agent3 event and nothing of the timers.
    agent_ids = {i for i, e in stored.items() if jobs[_job(engine, e)] == "agent3"}
    records = read_topic(bootstrap, routed.by_workflow.topic, at_least=len(agent_ids))
    assert len(records) == len(agent_ids)
    for record in records:
        assert dict(record.headers)["content-type"] == b"application/cloudevents+json"
        cloud = parse(record, "structured")
        check_cloud_event(cloud, record, stored[cloud.get_id()], jobs)
    assert {parse(r, "structured").get_id() for r in records} == agent_ids
    # A job's events keep their order on the routed topic (keyed by the job).
    versions: dict[str, list[int]] = defaultdict(list)
    for record in records:
        versions[record.key.decode()].append(
            int(parse(record, "structured").get_id().split("/")[1])
        )
    assert all(v == sorted(v) for v in versions.values())

    # By event type, binary mode: the failures and cancellations of every workflow.
    outcome_ids = {i for i, e in stored.items() if type(e).__name__ in ("Failed", "Cancelled")}
    assert {type(stored[i]).__name__ for i in outcome_ids} == {"Failed", "Cancelled"}
    records = read_topic(bootstrap, routed.by_type.topic, at_least=len(outcome_ids))
    assert len(records) == len(outcome_ids)
    for record in records:
        cloud = parse(record, "binary")
        assert record.value == encode_event(stored[cloud.get_id()])  # the events topic's bytes
        check_cloud_event(cloud, record, stored[cloud.get_id()], jobs)
    assert {parse(r, "binary").get_subject() for r in records} == {"doomed", "cancelled-timer"}

    # A route no event matches gets nothing.
    assert sum(end_offsets(bootstrap, routed.unmatched.topic).values()) == 0
    publisher.close()


def _job(engine: Engine, event: Job.Event) -> str:
    first = engine.store.events(event.originator_id, to_version=1)[0]
    assert isinstance(first, Job.Submitted)
    return first.job_id


def test_a_batch_is_tracked_only_once_every_routed_copy_is_acknowledged(
    make_engine: EngineFactory, executor: CountingExecutor, routed: Routed
) -> None:
    engine = make_engine()
    jobs = run_jobs(engine, executor)
    total = len(stored_events(engine, jobs))
    store = engine.store
    assert isinstance(store, EventSourcedJobStore)
    # A route to a topic the broker does not have (and does not create): its copies are
    # never acknowledged, so the batch is not tracked though the events topic took it.
    missing = EventRoute(topic=f"{routed.by_workflow.topic}.missing")
    broken = dataclasses.replace(routed.settings, send_timeout_ms=2_000)
    publisher = KafkaEventPublisher(broken)
    outbox = Outbox(store, publisher, batch=10, routes=[routed.by_type, missing])
    with pytest.raises(KafkaUnavailableError, match=r"\.missing"):
        outbox.publish_pending()
    assert outbox.position(store.partitions[0]) == 0
    publisher.close()

    # Without it, the same outbox position publishes everything: nothing was lost.
    publisher = KafkaEventPublisher(routed.settings)
    assert Outbox(store, publisher, batch=10, routes=[routed.by_type]).publish_pending() == total
    bootstrap = routed.settings.bootstrap_servers
    records = read_topic(bootstrap, routed.by_type.topic, at_least=2)
    ids = Counter(parse(r, "binary").get_id() for r in records)
    assert len(ids) == 2  # doomed's Failed and cancelled-timer's Cancelled
    publisher.close()


def test_after_a_crash_the_routed_duplicates_carry_the_same_cloud_event_id(
    make_engine: EngineFactory, executor: CountingExecutor, routed: Routed
) -> None:
    engine = make_engine()
    jobs = run_jobs(engine, executor)
    stored = stored_events(engine, jobs)
    store = engine.store
    assert isinstance(store, EventSourcedJobStore)
    publisher = KafkaEventPublisher(routed.settings)
    route = routed.by_workflow
    doomed = CrashBeforeTracking(store, publisher, batch=10, crash_on_batch=2, routes=[route])
    with pytest.raises(Crash):
        doomed.publish_pending()
    assert doomed.position(store.partitions[0]) == 10  # the second batch sent, not tracked
    Outbox(store, publisher, batch=10, routes=[route]).publish_pending()

    agent_ids = {i for i, e in stored.items() if jobs[_job(engine, e)] == "agent3"}
    records = read_topic(routed.settings.bootstrap_servers, route.topic, at_least=len(agent_ids))
    by_id: dict[str, list[bytes]] = defaultdict(list)
    for record in records:
        by_id[parse(record, "structured").get_id()].append(record.value)
    assert set(by_id) == agent_ids  # every event routed, none lost
    duplicated = {i: values for i, values in by_id.items() if len(values) > 1}
    assert duplicated, "the untracked batch was routed again"
    assert all(len(set(values)) == 1 for values in duplicated.values()), "same id, same bytes"
    publisher.close()


@pytest.mark.slow
def test_a_sigkilled_outbox_process_routes_every_event_after_its_restart(
    make_engine: EngineFactory, store_url: str, kafka_topics: KafkaTopics, tmp_path: Path
) -> None:
    """``jobledger projections run --outbox`` with JOBLEDGER_EVENT_ROUTES makes the routed
    topic itself; killed -9 while it publishes, its successor routes every event (the
    ones sent again with the same id and bytes)."""
    engine = make_engine()
    for n in range(120):
        engine.submit(TENANT, f"job-{n}", "agent3")
    engine.run_until_idle()
    wanted = {
        f"{job_uuid(TENANT, f'job-{n}')}/{version}"
        for n in range(120)
        for version in range(1, len(engine.history(TENANT, f"job-{n}")) + 1)
    }
    topic = f"{kafka_topics.prefix}.routed"
    env = {
        **os.environ,
        **kafka_topics.env(),
        "PYTHONPATH": pythonpath(),
        "JOBLEDGER_STORE_URL": store_url,
        "JOBLEDGER_EVENT_ROUTES": json.dumps([{"topic": topic, "mode": "binary"}]),
    }

    def outbox_process(name: str) -> subprocess.Popen[bytes]:
        return subprocess.Popen(
            [str(JOBLEDGER), "projections", "run", "--outbox"],
            env={**env, "JOBLEDGER_WORKER_ID": name},
            cwd=tmp_path,
            stdout=(tmp_path / f"{name}.log").open("wb"),
            stderr=subprocess.STDOUT,
        )

    def routed_count() -> int:
        try:
            return sum(end_offsets(kafka_topics.bootstrap, topic).values())
        except Exception:
            return 0  # the process has not made the topic yet

    first = outbox_process("outbox-1")
    try:
        wait_for(lambda: routed_count() > 0, 60, "the first events routed", 0.05)
    finally:
        first.send_signal(signal.SIGKILL)
        first.wait()
    at_kill = routed_count()
    second = outbox_process("outbox-2")
    try:
        wait_for(lambda: routed_count() >= len(wanted), 90, "every event routed", 0.5)
    finally:
        second.send_signal(signal.SIGTERM)
        second.wait(timeout=60)

    records = read_topic(kafka_topics.bootstrap, topic, at_least=len(wanted))
    by_id: dict[str, set[bytes]] = defaultdict(set)
    for record in records:
        by_id[parse(record, "binary").get_id()].add(record.value)
    assert set(by_id) == wanted, f"{len(wanted - set(by_id))} events lost (killed at {at_kill})"
    assert all(len(values) == 1 for values in by_id.values()), "a resent event changed"
    print(f"killed at {at_kill} routed of {len(wanted)}; {len(records)} messages in all")


def test_personal_values_stay_sealed_on_routed_topics_in_both_modes(
    store_url: str, kafka_topics: KafkaTopics
) -> None:
    """A workflow's personal_data travels sealed to a routed topic, as to the events topic;
    one event matching two routes goes to both."""
    registry = DefinitionRegistry([parse_definition(ONBOARDING, "onboarding.yaml")])
    config = EngineConfig(store_url=store_url, token_secret=TOKEN_SECRET, worker_id="w0")
    engine = Engine.open(registry=registry, executor=Greeter(), config=config)
    prefix = kafka_topics.prefix
    routes = (
        EventRoute(topic=f"{prefix}.people", workflows=["onboarding"]),
        EventRoute(topic=f"{prefix}.people.bin", workflows=["onboarding"], mode="binary"),
    )
    settings = dataclasses.replace(kafka_topics.settings(), event_routes=routes)
    ensure_topics(settings)
    publisher = KafkaEventPublisher(settings)
    try:
        run_onboarding(engine, "j1", "ada", ADA)
        total = len(engine.history("acme", "j1"))
        outbox = Outbox(store_of(engine), publisher, routes=routes)
        assert outbox.publish_pending() == total
        for route in routes:
            records = read_topic(kafka_topics.bootstrap, route.topic, at_least=total)
            assert len(records) == total
            values = b"\n".join(record.value for record in records)
            for plaintext in PLAINTEXT:
                assert plaintext not in values, (route.mode, plaintext)
            assert b'"$sealed":"aes-256-gcm/1"' in values.replace(b" ", b"")
    finally:
        publisher.close()
        engine.close()
        admin = KafkaAdminClient(bootstrap_servers=kafka_topics.bootstrap)
        try:
            admin.delete_topics([route.topic for route in routes], raise_errors=False)
        finally:
            admin.close()


def test_a_signed_event_names_its_signer_on_the_routed_topic(
    make_engine: EngineFactory, executor: CountingExecutor, routed: Routed, tmp_path: Path
) -> None:
    key_file = tmp_path / "w1.pem"
    key_file.write_bytes(private_pem(Ed25519PrivateKey.generate()))
    keys = tmp_path / "signing-keys.json"
    entry = {"id": "w1", "private_key_file": "w1.pem", "not_before": "2000-01-01T00:00:00Z"}
    entry |= {"not_after": None}
    keys.write_text(json.dumps([entry]))
    engine = make_engine(config={"signing_keys": keys})
    engine.submit(TENANT, "signed", "agent3")
    engine.run_until_idle()
    stored = engine.store.events(job_uuid(TENANT, "signed"))
    assert all(chain.sealed_form(event).signer == "w1" for event in stored)
    store = engine.store
    assert isinstance(store, EventSourcedJobStore)
    publisher = KafkaEventPublisher(routed.settings)
    outbox = Outbox(store, publisher, routes=[routed.by_workflow])
    assert outbox.publish_pending() == len(stored)
    records = read_topic(
        routed.settings.bootstrap_servers, routed.by_workflow.topic, at_least=len(stored)
    )
    clouds = [parse(record, "structured") for record in records]
    assert [cloud.get_extension("jobledgersigner") for cloud in clouds] == ["w1"] * len(stored)
    assert [cloud.get_extension("jobledgerchainhash") for cloud in clouds] == [
        chain.sealed_form(event).chain_hash for event in stored
    ]
    publisher.close()
