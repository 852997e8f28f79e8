"""Dead letters over a real broker: list, show and filter them, redrive them (once, unless
forced; the --all guard), a tick dead-lettered for a job that did not exist yet and
redriven after its submit, a double redrive that runs no step and delivers no signal twice
(both stores), a redrive killed mid-way (fault injection at each write, and a real
SIGKILL) then run again, and the same over the CLI and the HTTP API (admins only)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from kafka import KafkaProducer

from jobledger import Engine, EngineConfig, JobStatus
from jobledger.adapters.kafka import SignalMessage
from jobledger.adapters.kafka import clients as kafka_clients
from jobledger.adapters.kafka.dead_letters import (
    DeadLetters,
    LetterFilter,
    Selection,
)
from jobledger.adapters.kafka.messages import encode_tick, job_key
from jobledger.adapters.kafka.worker import KafkaWorker
from jobledger.adapters.ops import MemoryOps
from jobledger.domain.errors import DeadLetterError, UnknownDeadLetterError
from jobledger.orchestration.ports import Tick
from tests.support import pythonpath
from tests.support.cli import run_jobledger
from tests.support.engines import TOKEN_SECRET, CountingExecutor, agent_steps
from tests.support.engines import open_engine as build_engine
from tests.support.http import problem, start_api, token
from tests.support.kafka_broker import KafkaTopics, headers, read_topic, running, wait_for
from tests.support.redrive_crash import BATCH, Crash, crashing
from tests.support.workflows import DONE, STEP, linear_registry, wait_event

TENANT = "acme"


def dead_letter(
    topics: KafkaTopics,
    producer: Any,
    *,
    kind: str = "ticks",
    job: str = "j",
    reason: str = "unknown_job",
    at: datetime | None = None,
    value: bytes | None = None,
) -> None:
    """A letter as the worker writes it (worker.dead_letter's headers)."""
    source = topics.ticks if kind == "ticks" else topics.signals
    dlq = topics.ticks_dlq if kind == "ticks" else topics.signals_dlq
    moment = at or datetime.now(UTC)
    body = value or encode_tick(Tick(TENANT, job, "create"), dedupe_key=None, enqueued_at_ms=0)
    producer.send(
        dlq,
        key=job_key(TENANT, job),
        value=body,
        headers=[
            ("traceparent", b"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"),
            ("jobledger.dlq.reason", reason.encode()),
            ("jobledger.dlq.error", f"{reason} for {job}".encode()),
            ("jobledger.dlq.topic", source.encode()),
            ("jobledger.dlq.partition", b"0"),
            ("jobledger.dlq.offset", b"7"),
            ("jobledger.dlq.worker", b"w0"),
            ("jobledger.dlq.at", moment.isoformat().encode()),
        ],
    )


def raw_producer(topics: KafkaTopics) -> Any:
    return KafkaProducer(bootstrap_servers=topics.bootstrap, acks="all", linger_ms=5)


# ---- reading ---------------------------------------------------------------------------


def test_letters_are_listed_shown_and_filtered(kafka_topics: KafkaTopics) -> None:
    producer = raw_producer(kafka_topics)
    old = datetime(2026, 1, 1, tzinfo=UTC)
    dead_letter(kafka_topics, producer, job="a", at=old)
    dead_letter(kafka_topics, producer, job="b", reason="invalid")
    dead_letter(kafka_topics, producer, kind="signals", job="a", reason="job_finished")
    producer.flush()
    letters = DeadLetters(kafka_topics.settings())

    every = letters.read()
    assert [(x.id.kind, x.key_text, x.reason) for x in every] == [
        ("ticks", "acme/a", "unknown_job"),
        ("ticks", "acme/b", "invalid"),
        ("signals", "acme/a", "job_finished"),
    ]
    assert all(not x.redriven for x in every)
    shown = letters.get(str(every[1].id))
    assert shown.document()["source_topic"] == kafka_topics.ticks
    assert shown.document()["headers"] == {
        "traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    }
    assert shown.error == "invalid for b"

    def keys(**criteria: Any) -> list[str | None]:
        return [x.key_text for x in letters.read(LetterFilter(**criteria))]

    assert keys(reason="invalid") == ["acme/b"]
    assert keys(topic="signals") == ["acme/a"]
    assert keys(topic=kafka_topics.ticks) == ["acme/a", "acme/b"]
    assert keys(key="acme/a") == ["acme/a", "acme/a"]
    assert keys(key="acme/*", reason="job_finished") == ["acme/a"]
    assert keys(since=old + timedelta(days=1)) == ["acme/b", "acme/a"]
    assert keys(until=old + timedelta(days=1)) == ["acme/a"]

    with pytest.raises(UnknownDeadLetterError, match="no dead letter 'ticks:0:999'"):
        letters.get("ticks:0:999")
    for bad in ("ticks:0", "queue:0:1", "ticks:x:1", "ticks:-1:2"):
        with pytest.raises(DeadLetterError, match="bad dead letter id"):
            letters.get(bad)
    with pytest.raises(DeadLetterError, match=r"unknown topic 'jobledger\.other'"):
        letters.read(LetterFilter(topic="jobledger.other"))


# ---- redriving ---------------------------------------------------------------------------


def test_a_redrive_sends_the_original_back_once_and_again_only_when_forced(
    kafka_topics: KafkaTopics,
) -> None:
    producer = raw_producer(kafka_topics)
    dead_letter(kafka_topics, producer, job="a")
    dead_letter(kafka_topics, producer, job="b", reason="invalid")
    producer.flush()
    letters = DeadLetters(kafka_topics.settings())
    a, b = letters.read()

    # Naming nothing takes every letter: refused without --all, nothing sent.
    with pytest.raises(DeadLetterError, match="--all"):
        letters.redrive(Selection(), by="ops")
    with pytest.raises(UnknownDeadLetterError):
        letters.redrive(Selection(ids=(str(a.id), "ticks:0:999")), by="ops")
    dry = letters.redrive(Selection(every=True), by="ops", dry_run=True)
    assert (dry.matched, dry.sent, dry.dry_run) == (2, [str(a.id), str(b.id)], True)
    assert read_topic(kafka_topics.bootstrap, kafka_topics.ticks) == []

    first = letters.redrive(Selection(ids=(str(a.id),)), by="ops")
    assert (first.sent, first.skipped) == ([str(a.id)], [])
    (sent,) = read_topic(kafka_topics.bootstrap, kafka_topics.ticks, at_least=1)
    assert (sent.key, sent.value) == (a.key, a.value)
    sent_headers = headers(sent)
    assert sent_headers["jobledger.redrive.of"] == str(a.id)
    assert sent_headers["jobledger.redrive.count"] == "1"
    assert "traceparent" in sent_headers and "jobledger.dlq.reason" not in sent_headers

    shown = letters.get(str(a.id))
    assert shown.redriven and shown.redrives[0].by == "ops"
    # The marker is no letter of its own.
    assert [str(x.id) for x in letters.read()] == [str(a.id), str(b.id)]

    again = letters.redrive(Selection(every=True), by="ops")
    assert (again.sent, again.skipped) == ([str(b.id)], [str(a.id)])
    forced = letters.redrive(Selection(ids=(str(a.id),)), by="ops2", force=True)
    assert forced.sent == [str(a.id)]
    sent_all = read_topic(kafka_topics.bootstrap, kafka_topics.ticks, at_least=3)
    counts = Counter(
        (headers(r)["jobledger.redrive.of"], headers(r)["jobledger.redrive.count"])
        for r in sent_all
    )
    assert counts == {(str(a.id), "1"): 1, (str(b.id), "1"): 1, (str(a.id), "2"): 1}
    assert [r.by for r in letters.get(str(a.id)).redrives] == ["ops", "ops2"]


# ---- through the worker and the engine (both stores) ------------------------------------


def open_engine(store_url: str, topics: KafkaTopics, executor: Any, **config: Any) -> Engine:
    settings = EngineConfig(
        **{
            "store_url": store_url,
            "worker_id": "w0",
            "token_secret": TOKEN_SECRET,
            "inline_resume_max_delay_ms": 0,
            **topics.config(),
            **config,
        }
    )
    registry = linear_registry(
        {"agent3": agent_steps(3), "wait": [STEP, wait_event("invoice.paid"), STEP, DONE]}
    )
    return build_engine(registry=registry, executor=executor, config=settings, ops=MemoryOps())


def test_a_tick_and_a_signal_for_a_job_not_there_yet_are_redriven_after_its_submit_once(
    store_url: str, kafka_topics: KafkaTopics
) -> None:
    """A tick and a signal that came before their job are dead-lettered (unknown_job); once
    the jobs exist, a redrive runs the one and delivers the other. Redriven again (forced)
    they run no step twice and deliver no signal twice. A tick for a job that never came is
    dead-lettered again, as a letter that names the one it was redriven from."""
    executor = CountingExecutor()
    engine = open_engine(store_url, kafka_topics, executor)
    # Submitted on the local transport: no tick of its own, only the redriven one runs it.
    submitter = open_engine(store_url, kafka_topics, executor, transport="local")
    producer = raw_producer(kafka_topics)
    tick = encode_tick(Tick(TENANT, "early", "create"), dedupe_key="create", enqueued_at_ms=0)
    producer.send(kafka_topics.ticks, key=job_key(TENANT, "early"), value=tick)
    ghost = encode_tick(Tick(TENANT, "ghost", "create"), dedupe_key="create", enqueued_at_ms=0)
    producer.send(kafka_topics.ticks, key=job_key(TENANT, "ghost"), value=ghost)
    paid = SignalMessage(TENANT, "waiter", "invoice.paid", "evt-1", {"amount": 120})
    producer.send(kafka_topics.signals, key=paid.key, value=paid.encode())
    producer.flush()
    letters = DeadLetters(kafka_topics.settings())
    handled: list[tuple[str, str]] = []  # (redrive_of, count) of each redriven message done with

    def note(record: Any) -> None:
        meta = headers(record)
        if "jobledger.redrive.of" in meta:
            handled.append((meta["jobledger.redrive.of"], meta["jobledger.redrive.count"]))

    worker = KafkaWorker(engine, kafka_topics.settings(), after_effect=note)
    with running(worker):
        wait_for(lambda: worker.stats.dead_lettered == 3, 30, "all dead-lettered")
        first = {x.key_text: str(x.id) for x in letters.read()}
        assert [x.reason for x in letters.read()] == ["unknown_job"] * 3

        submitter.submit(TENANT, "early", "agent3")
        engine.submit(TENANT, "waiter", "wait")
        wait_for(lambda: status(engine, "waiter") is JobStatus.WAITING_EVENT, 30, "it waits")
        assert status(engine, "early") is JobStatus.QUEUED
        report = letters.redrive(Selection(filter=LetterFilter(reason="unknown_job")), by="ops")
        assert len(report.sent) == 3
        wait_for(lambda: all_done(engine, ["early", "waiter"]), 60, "redriven, both ran")
        wait_for(lambda: worker.stats.dead_lettered == 4, 30, "the ghost dead-lettered again")
        _, again = letters.read(LetterFilter(key="acme/ghost"))
        assert again.document()["redrive_of"] == first["acme/ghost"]

        chosen = (first["acme/early"], first["acme/waiter"])
        forced = letters.redrive(Selection(ids=chosen), by="ops", force=True)
        assert forced.sent == list(chosen)
        wait_for(lambda: len(handled) == 5, 30, "every redriven message handled")
    assert sorted(handled) == sorted(
        [(first["acme/ghost"], "1"), *((i, "1") for i in chosen), *((i, "2") for i in chosen)]
    )
    assert worker.stats.outcomes["signal_duplicate"] == 1
    assert worker.stats.dead_lettered == 4  # the ghost twice; the others were handled
    assert set(executor.calls.values()) == {1}
    assert sorted(executor.calls) == [
        *(f"acme/early:step:{n}" for n in (1, 2, 3)),
        *(f"acme/waiter:step:{n}" for n in (1, 3)),  # step 2 is the wait
    ]
    for job in ("early", "waiter"):
        assert status(engine, job) is JobStatus.COMPLETED
        steps = Counter(
            e.data["idempotency_key"]
            for e in engine.history(TENANT, job)
            if e.event_type == "StepRecorded"
        )
        assert set(steps.values()) == {1}
        assert engine.verify(TENANT, job) is None
    resumed = [e for e in engine.history(TENANT, "waiter") if e.event_type == "Resumed"]
    assert len(resumed) == 1
    assert engine.job(TENANT, "waiter").state["amount"] == 120
    submitter.close()
    engine.close()


def status(engine: Engine, job: str) -> JobStatus:
    return engine.job(TENANT, job).status


def all_done(engine: Engine, jobs: list[str]) -> bool:
    return all(status(engine, job).is_terminal for job in jobs)


# ---- the command line ----------------------------------------------------------------------


def test_the_cli_lists_shows_and_redrives_with_the_all_guard(
    kafka_topics: KafkaTopics, tmp_path: Path
) -> None:
    producer = raw_producer(kafka_topics)
    dead_letter(kafka_topics, producer, job="a")
    dead_letter(kafka_topics, producer, job="b", reason="invalid")
    dead_letter(kafka_topics, producer, kind="signals", job="c", reason="job_finished")
    producer.flush()
    env = kafka_topics.env()

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return run_jobledger("dead-letters", *args, cwd=tmp_path, **env)

    table = cli("list")
    assert table.returncode == 0, table.stderr
    assert "unknown_job" in table.stdout and "acme/c" in table.stdout
    listed = json.loads(cli("list", "--json", "--reason", "invalid").stdout)
    assert [(x["id"], x["key"]) for x in listed] == [(listed[0]["id"], "acme/b")]
    b_id = listed[0]["id"]
    shown = json.loads(cli("show", b_id, "--json").stdout)
    assert (shown["reason"], shown["source_topic"]) == ("invalid", kafka_topics.ticks)
    (signal_letter,) = json.loads(cli("list", "--topic", "signals", "--json").stdout)
    plain = cli("show", signal_letter["id"])
    assert plain.returncode == 0 and "job_finished for c" in plain.stdout

    assert json.loads(cli("list", "--json", "--since", "2999-01-01").stdout) == []
    until = json.loads(cli("list", "--json", "--until", "2999-01-01T00:00+02:00").stdout)
    assert len(until) == 3
    bad_time = cli("list", "--since", "yesterday")
    assert bad_time.returncode == 2 and "not an ISO 8601 time: 'yesterday'" in bad_time.stderr
    unknown = cli("show", "ticks:3:999")
    assert (unknown.returncode, unknown.stderr) == (1, "error: no dead letter 'ticks:3:999'\n")
    bad = cli("redrive", "queue:1")
    assert bad.returncode == 1 and "bad dead letter id 'queue:1'" in bad.stderr

    guarded = cli("redrive")
    assert guarded.returncode == 1
    assert "takes every dead letter" in guarded.stderr and "(--all)" in guarded.stderr
    dry = cli("redrive", "--all", "--dry-run")
    assert dry.returncode == 0 and dry.stdout.startswith("would send 3 of 3 matching")
    assert read_topic(kafka_topics.bootstrap, kafka_topics.ticks) == []

    sent = json.loads(cli("redrive", "--reason", "invalid", "--by", "ann", "--json").stdout)
    assert (sent["sent"], sent["skipped"], sent["dry_run"]) == ([b_id], [], False)
    rest = cli("redrive", "--all", "--by", "ann")
    assert rest.returncode == 0, rest.stderr
    assert rest.stdout.startswith("sent 2 of 3 matching; skipped 1 already redriven")
    again = json.loads(cli("redrive", b_id, "--force", "--json").stdout)
    assert again["sent"] == [b_id]
    redrives = json.loads(cli("show", b_id, "--json").stdout)["redrives"]
    assert [(r["by"], r["count"]) for r in redrives] == [("ann", 1), ("cli", 2)]
    resent = read_topic(kafka_topics.bootstrap, kafka_topics.ticks, at_least=3)
    a_id = next(x["id"] for x in json.loads(cli("list", "--key", "acme/a", "--json").stdout))
    assert Counter(headers(r)["jobledger.redrive.of"] for r in resent) == {b_id: 2, a_id: 1}
    (signal,) = read_topic(kafka_topics.bootstrap, kafka_topics.signals, at_least=1)
    assert headers(signal)["jobledger.redrive.of"] == signal_letter["id"]


# ---- a redrive that dies ---------------------------------------------------------------------

LETTERS = 250  # three batches of redrive_crash.BATCH (100, 100, 50)


def many_letters(topics: KafkaTopics, n: int = LETTERS) -> list[str]:
    producer = raw_producer(topics)
    for i in range(n):
        dead_letter(topics, producer, job=f"job-{i}")
    producer.flush()
    return [str(x.id) for x in DeadLetters(topics.settings()).read()]


def redriven_counts(topics: KafkaTopics, at_least: int) -> Counter[str]:
    sent = read_topic(topics.bootstrap, topics.ticks, at_least=at_least, timeout=10)
    return Counter(headers(r)["jobledger.redrive.of"] for r in sent)


def assert_finished_once_but_the_batch_in_flight(
    topics: KafkaTopics, ids: list[str], in_flight: set[str]
) -> None:
    """After the rerun: every letter was sent back, only the interrupted batch's may have
    gone twice, each is marked, and a third run sends nothing."""
    counts = redriven_counts(topics, at_least=len(ids))
    assert set(counts) == set(ids)
    assert {i for i, c in counts.items() if c > 1} <= in_flight
    assert max(counts.values()) <= 2
    letters = DeadLetters(topics.settings())
    assert all(x.redriven for x in letters.read())
    third = letters.redrive(Selection(every=True), by="ops")
    assert (third.sent, len(third.skipped)) == ([], len(ids))


POINTS = [
    ("send", 250, "before"),  # half of batch 2's originals handed to the producer
    ("flush", 3, "before"),  # batch 2's originals sent, not flushed
    ("flush", 3, "after"),  # batch 2's originals on the broker, no marker yet: the window
    ("flush", 4, "before"),  # batch 2's markers sent, not flushed
    ("flush", 4, "after"),  # batch 2 marked: between two batches
]


@pytest.mark.parametrize("point", POINTS, ids=["-".join(map(str, p)) for p in POINTS])
def test_a_redrive_that_dies_at_any_write_then_runs_again_sends_each_letter_once_but_its_batch(
    kafka_topics: KafkaTopics, monkeypatch: pytest.MonkeyPatch, point: tuple[str, int, str]
) -> None:
    ids = many_letters(kafka_topics)
    letters = DeadLetters(kafka_topics.settings(), batch_size=BATCH)

    def die() -> None:
        raise Crash

    with monkeypatch.context() as patched:
        patched.setattr(kafka_clients, "producer", crashing(point, die))
        with pytest.raises(Crash):
            letters.redrive(Selection(every=True), by="ops")
    batch_1, batch_2 = set(ids[:BATCH]), set(ids[BATCH : 2 * BATCH])
    # What the topics hold after the crash: batch 1 sent and marked, batch 3 untouched.
    after_crash = redriven_counts(kafka_topics, at_least=BATCH)
    assert batch_1 <= set(after_crash) <= batch_1 | batch_2
    marked = {str(x.id) for x in letters.read() if x.redriven}
    assert batch_1 <= marked <= batch_1 | batch_2
    assert marked <= set(after_crash), "a marker only ever follows its message"

    rerun = letters.redrive(Selection(every=True), by="ops")
    assert set(rerun.skipped) == marked
    assert_finished_once_but_the_batch_in_flight(kafka_topics, ids, batch_2)
    if point == ("flush", 4, "after"):
        assert set(redriven_counts(kafka_topics, LETTERS).values()) == {1}


@pytest.mark.parametrize("where", [("flush", "3", "after"), ("flush", "4", "after")])
def test_a_redrive_killed_by_sigkill_mid_way_then_run_again(
    kafka_topics: KafkaTopics, where: tuple[str, str, str]
) -> None:
    """A real SIGKILL: in the window (batch 2 sent, not marked) the rerun sends batch 2
    again, nothing else; between batches it sends nothing twice."""
    ids = many_letters(kafka_topics)
    topics = kafka_topics
    names = (topics.ticks, topics.ticks_dlq, topics.signals, topics.signals_dlq)
    killed = subprocess.run(
        [sys.executable, "-m", "tests.support.redrive_crash", topics.bootstrap, *names, *where],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": pythonpath()},
    )
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    letters = DeadLetters(topics.settings(), batch_size=BATCH)
    rerun = letters.redrive(Selection(every=True), by="ops")
    batch_2 = set(ids[BATCH : 2 * BATCH])
    assert_finished_once_but_the_batch_in_flight(topics, ids, batch_2)
    counts = redriven_counts(topics, LETTERS)
    twice = {i for i, c in counts.items() if c == 2}
    if where[1] == "3":
        assert twice == batch_2 and set(rerun.sent) == set(ids[BATCH:])
    else:
        assert twice == set() and set(rerun.sent) == set(ids[2 * BATCH :])


# ---- the HTTP API ------------------------------------------------------------------------------


def test_the_api_lists_shows_and_redrives_for_admins_of_every_tenant_only(
    kafka_topics: KafkaTopics, tmp_path: Path
) -> None:
    producer = raw_producer(kafka_topics)
    dead_letter(kafka_topics, producer, job="a")
    dead_letter(kafka_topics, producer, job="b", reason="invalid")
    producer.flush()
    engine = open_engine(f"sqlite:///{tmp_path}/jobs.db", kafka_topics, CountingExecutor())
    admin = token(tenants="*", roles="admin", sub="root")
    with start_api(engine, tmp_path) as api:
        with api.client() as anonymous:
            assert problem(anonymous.get("/v1/dead-letters"), 401)["error"] == (
                "AuthenticationError"
            )
        # An admin of one tenant, an operator of every tenant: neither sees them all.
        for credential in (
            token(tenants="acme", roles="admin"),
            token(tenants="*", roles="operator"),
        ):
            with api.client(credential) as http:
                assert problem(http.get("/v1/dead-letters"), 403)["error"] == "Forbidden"
                assert problem(http.get("/v1/dead-letters/ticks:0:0"), 403)
                refused = http.post("/v1/dead-letters/redrive", json={"all": True})
                assert problem(refused, 403)["error"] == "Forbidden"
        assert read_topic(kafka_topics.bootstrap, kafka_topics.ticks) == []

        with api.client(admin) as http:
            letters = http.get("/v1/dead-letters").json()["letters"]
            assert [x["key"] for x in letters] == ["acme/a", "acme/b"]
            only = http.get("/v1/dead-letters", params={"reason": "invalid"}).json()["letters"]
            assert [x["key"] for x in only] == ["acme/b"]
            b_id = only[0]["id"]
            shown = http.get(f"/v1/dead-letters/{b_id}").json()
            assert (shown["reason"], shown["source_topic"]) == ("invalid", kafka_topics.ticks)
            missing = problem(http.get("/v1/dead-letters/ticks:0:999"), 404)
            assert missing["error"] == "UnknownDeadLetterError"
            assert problem(http.get("/v1/dead-letters/nope"), 400)["error"] == "DeadLetterError"

            everything = problem(http.post("/v1/dead-letters/redrive", json={}), 400)
            assert everything["detail"].endswith("or ask for all of them (--all)")
            unknown = http.post("/v1/dead-letters/redrive", json={"ids": [b_id, "ticks:0:999"]})
            assert problem(unknown, 404)["error"] == "UnknownDeadLetterError"
            typo = http.post("/v1/dead-letters/redrive", json={"idz": [b_id]})
            assert problem(typo, 400)
            dry = http.post("/v1/dead-letters/redrive", json={"all": True, "dry_run": True})
            assert dry.json() == {
                "matched": 2,
                "sent": [x["id"] for x in letters],
                "skipped": [],
                "dry_run": True,
            }
            assert read_topic(kafka_topics.bootstrap, kafka_topics.ticks) == []

            sent = http.post("/v1/dead-letters/redrive", json={"ids": [b_id]}).json()
            assert (sent["sent"], sent["skipped"]) == ([b_id], [])
            again = http.post("/v1/dead-letters/redrive", json={"reason": "invalid"}).json()
            assert (again["sent"], again["skipped"]) == ([], [b_id])
            redrives = http.get(f"/v1/dead-letters/{b_id}").json()["redrives"]
            assert [(r["by"], r["count"]) for r in redrives] == [("root", 1)]
    (resent,) = read_topic(kafka_topics.bootstrap, kafka_topics.ticks, at_least=1)
    assert headers(resent)["jobledger.redrive.of"] == b_id
    engine.close()
