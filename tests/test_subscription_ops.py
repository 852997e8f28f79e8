"""Operating subscriptions on the real broker: ``jobledger subscriptions list`` (lag, the
pause, dead letters, as a table and as JSON), ``pause`` and ``resume`` obeyed by a running
worker within about a second while another subscription and the ticks go on, a pause that
survives a worker's restart, the subscription gauges, unknown names refused with nothing
written, and a schema failure redriven after the fix that makes its job exactly once."""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from kafka import KafkaAdminClient

from jobledger import Engine, JobStatus
from jobledger.adapters.kafka.settings import KafkaSettings
from jobledger.adapters.kafka.worker import KafkaWorker
from jobledger.adapters.metrics import Metrics
from jobledger.domain.errors import ConfigError, UnknownJobError
from jobledger.domain.subscription import Subscription
from jobledger.projections.job_views import JobViews
from tests.support.cli import run_jobledger
from tests.support.kafka_broker import (
    PARTITIONS,
    KafkaTopics,
    headers,
    read_topic,
    running,
    wait_for,
)
from tests.support.scrape import Samples, parse, value
from tests.support.subscriptions import all_committed, open_engine, send, settings_of

TENANT = "acme"
ORDER_SCHEMA = {
    "type": "object",
    "required": ["order", "amount"],
    "properties": {"order": {"type": "string"}, "amount": {"type": "number"}},
}


def orders(topics: KafkaTopics, **fields: Any) -> Subscription:
    return Subscription(
        **{
            "name": "orders",
            "topic": f"{topics.prefix}.orders",
            "tenant": TENANT,
            "workflow": "fulfil",
            "key": "{value.order}",
            **fields,
        }
    )


def returns(topics: KafkaTopics) -> Subscription:
    return Subscription(
        name="returns",
        topic=f"{topics.prefix}.returns",
        tenant=TENANT,
        workflow="fulfil",
        key="{value.order}",
    )


def cli_for(
    topics: KafkaTopics, tmp_path: Path, *subscriptions: Subscription
) -> Callable[..., subprocess.CompletedProcess[str]]:
    """``jobledger ARGS`` with this test's topics and subscriptions in its environment."""
    configured = json.dumps([s.model_dump(mode="json", exclude_none=True) for s in subscriptions])

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        env = {**topics.env(), "JOBLEDGER_SUBSCRIPTIONS": configured}
        return run_jobledger(*args, cwd=tmp_path, **env)

    return run


def order(n: int, **fields: Any) -> tuple[bytes, Any, dict[str, str]]:
    return (f"o-{n}".encode(), {"order": f"o-{n}", "amount": n, **fields}, {})


def exists(engine: Engine, job_id: str) -> bool:
    try:
        engine.job(TENANT, job_id)
    except UnknownJobError:
        return False
    return True


def scraped(metrics: Metrics) -> Samples:
    return parse(metrics.render().decode())


# ---- list ------------------------------------------------------------------------------


def test_list_shows_each_subscriptions_lag_and_dead_letters_as_a_table_and_as_json(
    kafka_topics: KafkaTopics, tmp_path: Path
) -> None:
    subscription = orders(kafka_topics, input_schema=ORDER_SCHEMA)
    other = returns(kafka_topics)
    engine = open_engine(f"sqlite:///{tmp_path}/jobs.db", kafka_topics, subscription, other)
    settings = settings_of(kafka_topics, subscription, other)
    send(kafka_topics, subscription.topic, [order(1), order(2, amount="two"), order(3)])
    send(kafka_topics, subscription.topic, [(b"o-4", {"order": "o-4"}, {})])
    worker = KafkaWorker(engine, settings)
    with running(worker):
        read_topic(kafka_topics.bootstrap, subscription.dead_letter_topic, at_least=2)
        wait_for(lambda: all_committed(kafka_topics, subscription.topic), 60, "all committed")
    # Five more while no worker runs: the group's lag.
    send(kafka_topics, subscription.topic, [order(n) for n in range(5, 10)])
    jl = cli_for(kafka_topics, tmp_path, subscription, other)

    listed = jl("subscriptions", "list", "--json")
    assert listed.returncode == 0, listed.stderr
    first, second = json.loads(listed.stdout)
    assert first["name"] == "orders" and first["topic"] == subscription.topic
    assert (first["action"], first["workflow"], first["paused"]) == ("submit", "fulfil", False)
    assert (first["lag"], first["dead_letters"]) == (5, 2)
    assert first["dead_letter_topic"] == subscription.dead_letter_topic
    partitions = first["partitions"]
    assert [p["partition"] for p in partitions] == list(range(PARTITIONS))
    assert sum(p["lag"] for p in partitions) == 5
    assert all(p["lag"] == p["end"] - (p["committed"] or 0) for p in partitions)
    assert (second["name"], second["lag"], second["dead_letters"]) == ("returns", 0, 0)
    assert second["pause"] is None

    table = jl("subscriptions", "list")
    assert table.returncode == 0, table.stderr
    (row,) = [line for line in table.stdout.splitlines() if "orders" in line]
    cells = [cell.strip() for cell in row.strip().strip("│").split("│")]
    assert cells[:5] == ["orders", subscription.topic, "submit", "fulfil", "running"]
    assert cells[5:] == ["5", "2"]

    # A redriven letter is no longer waiting.
    letters = jl("dead-letters", "list", "--subscription", "orders", "--json")
    ids = [letter["id"] for letter in json.loads(letters.stdout)]
    assert len(ids) == 2 and all(i.startswith("sub:orders:") for i in ids)
    redriven = jl("dead-letters", "redrive", ids[0])
    assert redriven.returncode == 0, redriven.stderr
    again = jl("subscriptions", "list", "--json")
    assert json.loads(again.stdout)[0]["dead_letters"] == 1
    engine.close()


def test_list_gives_up_on_an_unreachable_broker_within_the_send_timeout(tmp_path: Path) -> None:
    configured = [{"name": "orders", "topic": "orders", "tenant": TENANT, "workflow": "fulfil"}]
    started = time.monotonic()
    result = run_jobledger(
        "subscriptions",
        "list",
        cwd=tmp_path,
        JOBLEDGER_SUBSCRIPTIONS=json.dumps(configured),
        JOBLEDGER_KAFKA_BOOTSTRAP_SERVERS="127.0.0.1:1",
        JOBLEDGER_KAFKA_SEND_TIMEOUT_MS="1500",
    )
    assert time.monotonic() - started < 10
    assert result.returncode == 4
    assert result.stderr.startswith("error: cannot reach Kafka at 127.0.0.1:1")
    assert "Traceback" not in result.stderr


# ---- pause and resume ------------------------------------------------------------------


def test_a_pause_stops_a_running_worker_making_jobs_while_the_rest_goes_on_and_resume_makes_them(
    kafka_topics: KafkaTopics, tmp_path: Path
) -> None:
    subscription, other = orders(kafka_topics), returns(kafka_topics)
    subscriptions = (subscription, other)
    engine = open_engine(f"sqlite:///{tmp_path}/jobs.db", kafka_topics, *subscriptions)
    settings = settings_of(kafka_topics, *subscriptions)
    jl = cli_for(kafka_topics, tmp_path, *subscriptions)
    worker = KafkaWorker(engine, settings)
    metrics = Metrics()
    metrics.watch_consumers([worker], kafka_topics.group, {s.name: s.topic for s in subscriptions})
    with running(worker):
        send(kafka_topics, subscription.topic, [order(1)])
        wait_for(lambda: exists(engine, subscription.derived_job_id("o-1")), 60, "o-1's job")

        paused = jl("subscriptions", "pause", "orders", "--reason", "bad prices", "--by", "ann")
        assert paused.returncode == 0, paused.stderr
        assert paused.stdout.startswith("orders: paused by ann")
        set_at = time.monotonic()
        wait_for(lambda: worker.paused_subscriptions == {"orders"}, 10, "the worker paused")
        assert time.monotonic() - set_at < 2, "obeyed within about a second"

        send(kafka_topics, subscription.topic, [order(n) for n in (2, 3, 4)])
        send(kafka_topics, other.topic, [order(50)])
        engine.submit(TENANT, "ticked", "fulfil")  # the ticks go on too
        wait_for(lambda: exists(engine, other.derived_job_id("o-50")), 60, "the other's job")
        wait_for(
            lambda: engine.job(TENANT, "ticked").status is JobStatus.COMPLETED,
            60,
            "the submitted job ran",
        )
        wait_for(
            lambda: (
                value(scraped(metrics), "jobledger_subscription_lag", subscription="orders") == 3
            ),
            30,
            "the paused subscription's lag in the metrics",
        )
        samples = scraped(metrics)
        assert value(samples, "jobledger_subscription_paused", subscription="orders") == 1
        assert ("jobledger_subscription_paused", frozenset({("subscription", "returns")})) in (
            samples
        )
        assert value(samples, "jobledger_subscription_paused", subscription="returns") == 0
        assert value(samples, "jobledger_subscription_lag", subscription="returns") == 0
        assert not any(exists(engine, subscription.derived_job_id(f"o-{n}")) for n in (2, 3, 4))

        listed = jl("subscriptions", "list", "--json")
        first, second = json.loads(listed.stdout)
        assert (first["paused"], first["lag"], second["paused"]) == (True, 3, False)
        assert (first["pause"]["by"], first["pause"]["reason"]) == ("ann", "bad prices")
        table = jl("subscriptions", "list")
        assert "paused by ann: bad prices" in table.stdout

        resumed = jl("subscriptions", "resume", "orders", "--json")
        assert resumed.returncode == 0, resumed.stderr
        assert json.loads(resumed.stdout) == {
            "name": "orders",
            "paused": False,
            "was_paused": True,
            "by": "cli",
        }
        jobs = [subscription.derived_job_id(f"o-{n}") for n in (2, 3, 4)]
        wait_for(lambda: all(exists(engine, j) for j in jobs), 60, "the held messages' jobs")
        wait_for(
            lambda: (
                value(scraped(metrics), "jobledger_subscription_paused", subscription="orders") == 0
            ),
            10,
            "the paused gauge back to 0",
        )
    assert worker.stats.outcomes["orders_submitted"] == 4
    assert all_committed(kafka_topics, subscription.topic)
    engine.close()


def test_a_pause_survives_a_worker_restart(kafka_topics: KafkaTopics, tmp_path: Path) -> None:
    subscription, other = orders(kafka_topics), returns(kafka_topics)
    subscriptions = (subscription, other)
    engine = open_engine(f"sqlite:///{tmp_path}/jobs.db", kafka_topics, *subscriptions)
    settings = settings_of(kafka_topics, *subscriptions)
    jl = cli_for(kafka_topics, tmp_path, *subscriptions)
    first = KafkaWorker(engine, settings)
    with running(first):
        send(kafka_topics, subscription.topic, [order(1)])
        wait_for(lambda: exists(engine, subscription.derived_job_id("o-1")), 60, "o-1's job")
        paused = jl("subscriptions", "pause", "orders")
        assert paused.returncode == 0, paused.stderr
        wait_for(lambda: first.paused_subscriptions == {"orders"}, 10, "the worker paused")

    send(kafka_topics, subscription.topic, [order(2), order(3)])
    second = KafkaWorker(engine, settings)
    with running(second):
        wait_for(lambda: second.joined.is_set(), 60, "the new worker joined")
        assert second.paused_subscriptions == {"orders"}, "paused from its start"
        send(kafka_topics, other.topic, [order(50)])
        wait_for(lambda: exists(engine, other.derived_job_id("o-50")), 60, "the other's job")
        time.sleep(1)  # o-2 and o-3 were sent first: time enough to have been taken
        assert not exists(engine, subscription.derived_job_id("o-2"))
        assert not exists(engine, subscription.derived_job_id("o-3"))
        again = jl("subscriptions", "pause", "orders")
        assert again.stdout.startswith("orders: paused already (by cli at ")

        jl("subscriptions", "resume", "orders")
        wait_for(
            lambda: (
                exists(engine, subscription.derived_job_id("o-2"))
                and exists(engine, subscription.derived_job_id("o-3"))
            ),
            60,
            "the held messages' jobs after the resume",
        )
    engine.close()


def test_an_unknown_subscription_is_refused_naming_the_known_ones_and_nothing_is_written(
    kafka_topics: KafkaTopics, tmp_path: Path
) -> None:
    jl = cli_for(kafka_topics, tmp_path, orders(kafka_topics), returns(kafka_topics))
    none_jl = cli_for(kafka_topics, tmp_path)
    known = "error: no subscription 'nope' (known: orders, returns)\n"
    for args in (
        ("subscriptions", "pause", "nope", "--reason", "r"),
        ("subscriptions", "resume", "nope"),
        ("dead-letters", "list", "--subscription", "nope"),
        ("dead-letters", "show", "sub:nope:0:0"),
        ("dead-letters", "redrive", "sub:nope:0:0"),
    ):
        result = jl(*args)
        assert (result.returncode, result.stdout, result.stderr) == (1, "", known), args
    admin = KafkaAdminClient(bootstrap_servers=kafka_topics.bootstrap)
    try:
        assert f"{kafka_topics.group}.paused" not in admin.list_topics()
    finally:
        admin.close()
    none = none_jl("subscriptions", "pause", "nope")
    assert none.stderr == "error: no subscription 'nope' (known: none is configured)\n"
    empty = none_jl("subscriptions", "list", "--json")
    assert (empty.returncode, json.loads(empty.stdout)) == (0, [])


# ---- dead letters redriven ---------------------------------------------------------------


def test_a_schema_failure_redriven_after_the_fix_makes_its_job_exactly_once(
    store_url: str, kafka_topics: KafkaTopics, tmp_path: Path
) -> None:
    """No business key: the message's identity is its position. A redrive puts it at a new
    offset, but carries the first one (jobledger.redrive.origin), so it makes the job its
    first delivery would have made, and a second redrive finds that job."""
    strict = orders(kafka_topics, key=None, input_schema=ORDER_SCHEMA)
    engine = open_engine(store_url, kafka_topics, strict)
    settings = settings_of(kafka_topics, strict)
    forged = {"jobledger.redrive.origin": "nowhere"}
    send(
        kafka_topics,
        strict.topic,
        [(b"o-1", {"order": "o-1", "amount": "12.50"}, {}), (b"o-9", order(9)[1], forged)],
    )
    worker = KafkaWorker(engine, settings)
    with running(worker):
        letters = read_topic(kafka_topics.bootstrap, strict.dead_letter_topic, at_least=2)
    engine.close()
    by_reason = {headers(each)["jobledger.dlq.reason"]: each for each in letters}
    assert sorted(by_reason) == ["origin", "schema"]
    assert (
        "'nowhere' is not TOPIC:PARTITION:OFFSET"
        in headers(by_reason["origin"])["jobledger.dlq.error"]
    )
    letter = by_reason["schema"]
    first_read = headers(letter)
    origin = ":".join(
        first_read[f"jobledger.dlq.{name}"] for name in ("topic", "partition", "offset")
    )
    job_id = strict.derived_job_id(origin)

    # The fix: amounts may be strings too. A new worker reads the subscription as fixed.
    fixed_schema = {**ORDER_SCHEMA, "properties": {"order": {"type": "string"}}}
    fixed = orders(kafka_topics, key=None, input_schema=fixed_schema)
    engine = open_engine(store_url, kafka_topics, fixed)
    worker = KafkaWorker(engine, replace(settings, subscriptions=(fixed,)))
    letter_id = f"sub:orders:{letter.partition}:{letter.offset}"
    fixed_jl = cli_for(kafka_topics, tmp_path, fixed)
    with running(worker):
        redriven = fixed_jl(
            "dead-letters", "redrive", "--subscription", "orders", "--reason", "schema", "--json"
        )
        assert redriven.returncode == 0, redriven.stderr
        assert json.loads(redriven.stdout)["sent"] == [letter_id]
        wait_for(
            lambda: (
                exists(engine, job_id) and engine.job(TENANT, job_id).status is JobStatus.COMPLETED
            ),
            60,
            "the job of the message's first position",
        )
        forced = fixed_jl("dead-letters", "redrive", letter_id, "--force")
        assert forced.returncode == 0, forced.stderr
        wait_for(lambda: worker.stats.outcomes["orders_found"] == 1, 60, "the second redrive")
    assert worker.stats.outcomes["orders_submitted"] == 1
    assert engine.job(TENANT, job_id).state["amount"] == "12.50"
    resent = read_topic(kafka_topics.bootstrap, fixed.topic, at_least=3)
    assert [headers(r).get("jobledger.redrive.origin") for r in resent[-2:]] == [origin, origin]
    for record in resent[-2:]:  # the job of a redriven message's own position: none
        position = f"{record.topic}:{record.partition}:{record.offset}"
        assert not exists(engine, fixed.derived_job_id(position))
    views = JobViews(engine.deps.store)
    views.catch_up()
    assert [row.job_id for row in views.jobs(tenant_id=TENANT)] == [job_id]
    shown = fixed_jl("dead-letters", "show", letter_id, "--json")
    document = json.loads(shown.stdout)
    assert (document["kind"], document["subscription"], document["origin"]) == (
        "subscription",
        "orders",
        origin,
    )
    assert [r["count"] for r in document["redrives"]] == [1, 2]
    engine.close()


def test_settings_refuse_a_group_id_no_pause_topic_can_be_named_after_and_shared_topics() -> None:
    topics = KafkaTopics("localhost:9092", "cfg")
    subscription = orders(topics)
    with pytest.raises(ConfigError, match=r"kafka_group_id 'my group' names .* 'my group\.paused'"):
        KafkaSettings(group_id="my group", subscriptions=(subscription,))
    KafkaSettings(group_id="my group")  # no subscription, no pause topic: as before
    on_the_switches = orders(topics, topic="jobledger-workers.paused")
    with pytest.raises(ConfigError, match="is one of jobledger's own"):
        KafkaSettings(subscriptions=(on_the_switches,))
    shared = replace_subscription(returns(topics), dlq_topic=subscription.dead_letter_topic)
    with pytest.raises(ConfigError, match="'orders' and 'returns' share topic"):
        KafkaSettings(subscriptions=(subscription, shared))
    into_orders = replace_subscription(returns(topics), dlq_topic=subscription.topic)
    with pytest.raises(ConfigError, match="'orders' and 'returns' share topic"):
        KafkaSettings(subscriptions=(subscription, into_orders))


def replace_subscription(subscription: Subscription, **fields: Any) -> Subscription:
    return Subscription(**{**subscription.model_dump(exclude_none=True), **fields})
