"""Subscriptions without a broker (jobledger.domain.subscription): templates over a
message, the tenant allow-list, the ids a message is known by, its input checked by a
pydantic model or a JSON Schema, and every rule a subscription's configuration is held
to, in Python, in ``JOBLEDGER_SUBSCRIPTIONS`` and in ``[[subscriptions]]`` of
jobledger.toml (read by the CLI's own loading). The broker-side behaviour is in
tests/test_kafka_subscriptions.py and tests/test_subscription_crash.py."""

from __future__ import annotations

import json
import re
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel, Field, ValidationError

from jobledger import EngineConfig
from jobledger.adapters.kafka.settings import KafkaSettings
from jobledger.cli.config_file import load_settings
from jobledger.domain.errors import ConfigError
from jobledger.domain.subscription import (
    LAST_POSITION,
    Message,
    Subscription,
    SubscriptionMessageError,
    check_template,
    render,
)
from jobledger.engine.ids import check_id
from jobledger.runtime.supervisor import Services, Supervisor
from tests.support.engines import TOKEN_SECRET, CountingExecutor, open_engine
from tests.support.workflows import DONE, STEP, linear_registry

ORDER = {"order": "o-42", "tenant": "acme", "amount": 12.5, "paid": True, "items": [{"sku": "a"}]}
SCHEMA = {
    "type": "object",
    "required": ["order", "amount"],
    "properties": {"order": {"type": "string"}, "amount": {"type": "number", "minimum": 0}},
}


def message(value: Any = None, *, key: bytes | None = b"k-1", **headers: bytes) -> Message:
    return Message(
        topic="t.orders",
        partition=3,
        offset=17,
        key=key,
        headers=tuple(headers.items()),
        value=ORDER if value is None else value,
    )


def orders(**fields: Any) -> Subscription:
    return Subscription(
        **{"name": "orders", "topic": "t.orders", "tenant": "acme", "workflow": "fulfil", **fields}
    )


def refused(**fields: Any) -> str:
    """The error a subscription with these fields is refused with."""
    with pytest.raises(ValidationError) as caught:
        orders(**fields)
    return str(caught.value)


def message_error(call: Any) -> SubscriptionMessageError:
    with pytest.raises(SubscriptionMessageError) as caught:
        call()
    return caught.value


# ---- templates -------------------------------------------------------------------------


def test_every_kind_of_field_renders_with_the_literal_text_around_it() -> None:
    got = message(tenant=b"globex", source=b"web")
    fields = "{key}|{topic}|{partition}|{offset}|{header.tenant}|{value.order}|{value.items.0.sku}"
    assert render(fields, got) == "k-1|t.orders|3|17|globex|o-42|a"
    assert render("order {value.order} of {header.source}!", got) == "order o-42 of web!"
    assert render("plain", got) == "plain"
    # Scalars as text: a boolean as JSON spells it, a number as written.
    assert render("{value.paid}/{value.amount}", got) == "true/12.5"
    # A JSON array value is indexed from the top.
    assert render("{value.1}", message(["a", "b"])) == "b"


def test_the_last_header_of_a_name_wins() -> None:
    got = replace(message(), headers=(("tenant", b"first"), ("tenant", b"last")))
    assert render("{header.tenant}", got) == "last"


@pytest.mark.parametrize(
    ("template", "got", "said"),
    [
        ("{key}", message(key=None), "the message has no {key}"),
        ("{header.tenant}", message(), "the message has no {header.tenant}"),
        ("{value.customer}", message(), "the message has no {value.customer}"),
        ("{value.items.5.sku}", message(), "the message has no {value.items.5.sku}"),
        ("{value.order.id}", message(), "the message has no {value.order.id}"),
        ("{value.order}", message({"order": None}), "the message has no {value.order}"),
        ("{value.items}", message(), "{value.items} is not a single value"),
        ("{value.order}", message("just text"), "the message has no {value.order}"),
        ("{key}", message(key=b"\xff\xfe"), "not UTF-8"),
    ],
)
def test_a_field_the_message_lacks_is_a_template_error_naming_it(
    template: str, got: Message, said: str
) -> None:
    error = message_error(lambda: render(template, got))
    assert error.reason == "template"
    assert said in error.detail


@pytest.mark.parametrize(
    ("template", "said"),
    [
        ("{customer}", "unknown field {customer}"),
        ("acme-{Key}", "unknown field {Key}"),
        ("{header}", "unknown field {header}"),
        ("{header.}", "unknown field {header.}"),
        ("{value.}", "unknown field {value.}"),
        ("{value.a..b}", "unknown field {value.a..b}"),
        ("{}", "unknown field {}"),
        ("{ key }", "unknown field { key }"),
        ("{key", "unmatched brace"),
        ("key}", "unmatched brace"),
        ("{{key}}", "unmatched brace"),
        ("{value.{key}}", "unmatched brace"),
    ],
)
def test_a_template_with_an_unknown_field_or_a_stray_brace_is_refused_at_config_time(
    template: str, said: str
) -> None:
    with pytest.raises(ValueError, match=re.escape(said)):
        check_template(template)
    for field in ("tenant", "job_id", "key", "correlation_id"):
        error = refused(**{field: template})
        assert said in error and field in error
    with pytest.raises(ValidationError, match=re.escape(said)):
        payments(event=template)


def test_the_unknown_field_error_lists_the_known_ones() -> None:
    error = refused(tenant="{tenant}")
    assert "{key}, {topic}, {partition}, {offset}, {header.NAME}, {value.PATH}" in error


def test_an_empty_template_is_refused() -> None:
    assert "a template must not be empty" in refused(key="")


# ---- one message's tenant, ids and input ---------------------------------------------------


def test_the_tenant_comes_from_its_template_and_the_allow_list_holds_it() -> None:
    subscription = orders(tenant="{header.tenant}", tenants=["acme", "globex"])
    assert subscription.tenant_of(message(tenant=b"globex")) == "globex"
    error = message_error(lambda: subscription.tenant_of(message(tenant=b"initech")))
    assert error.reason == "tenant_not_allowed"
    assert "'initech'" in error.detail and "acme, globex" in error.detail
    # Without a list, any tenant the template yields.
    assert orders(tenant="{header.tenant}").tenant_of(message(tenant=b"initech")) == "initech"
    assert "an empty list allows no tenant" in refused(tenants=[])


def test_a_messages_identity_is_its_position_unless_a_business_key_is_declared() -> None:
    got = message()
    by_position = orders()
    assert by_position.identity(got) == "t.orders:3:17"
    assert by_position.dedupe_id("t.orders:3:17") == "sub:orders:t.orders:3:17"
    by_key = orders(key="{value.order}")
    assert by_key.identity(got) == "o-42"
    assert by_key.dedupe_id(by_key.identity(got)) == "sub:orders:o-42"
    # The same business key in another message (a producer's retry) is the same message.
    assert by_key.identity(replace(got, offset=99)) == "o-42"


def test_derived_job_ids_are_stable_and_each_identity_has_its_own() -> None:
    subscription = orders()
    # Pinned: a job id derived differently after an upgrade would make every message
    # delivered again after it a new job.
    assert subscription.derived_job_id("t.orders:3:17") == "orders-42ad747baa2da1b23f27a16a"
    assert orders(key="{value.order}").job_id_of(message(), "o-42") == (
        "orders-d6ea07f67c0388773c0111fe"
    )
    assert subscription.job_id_of(message(), "t.orders:3:17") == "orders-42ad747baa2da1b23f27a16a"
    assert subscription.derived_job_id("t.orders:3:18") != subscription.derived_job_id(
        "t.orders:3:17"
    )
    assert orders(name="returns").derived_job_id("t.orders:3:17").startswith("returns-")
    # A job id template names the job instead.
    named = orders(job_id="order-{value.order}")
    assert named.job_id_of(message(), "t.orders:3:17") == "order-o-42"


def test_the_ids_of_the_longest_name_and_topic_fit_the_engines_ids() -> None:
    name = "n" * 100
    topic = "t" * (200 - len(f"sub:{name}::{LAST_POSITION}"))
    subscription = orders(name=name, topic=topic)
    check_id("idempotency_key", subscription.dedupe_id(f"{topic}:{LAST_POSITION}"))
    check_id("job_id", subscription.derived_job_id(f"{topic}:{LAST_POSITION}"))
    error = refused(name=name, topic=topic + "t")
    assert "message ids" in error and "201 characters" in error and "business key" in error
    # With a business key the message's own key is its id: no bound on the topic here.
    assert orders(name=name, topic=topic + "t", key="{value.order}").key == "{value.order}"


def test_the_input_is_the_value_or_the_part_of_it_input_names() -> None:
    assert orders().input_of(message()) == ORDER
    assert orders(input="value.items.0").input_of(message()) == {"sku": "a"}
    error = message_error(lambda: orders(input="value.customer").input_of(message()))
    assert (error.reason, error.detail) == ("input", "the message value has no value.customer")
    error = message_error(lambda: orders(input="value.items").input_of(message()))
    assert (error.reason, error.detail) == ("input", "the input must be a JSON object, not list")
    for where in ("values", "key", "value.", "value..x", ""):
        assert "expected 'value' or 'value.PATH'" in refused(input=where)


class Order(BaseModel):
    order: str
    amount: float = Field(ge=0)
    currency: str = "EUR"


def test_a_pydantic_model_checks_the_input_and_the_job_gets_its_dump() -> None:
    subscription = orders(input_model=Order)
    assert subscription.input_of(message({"order": "o-1", "amount": "3"})) == {
        "order": "o-1",
        "amount": 3.0,
        "currency": "EUR",
    }
    error = message_error(lambda: subscription.input_of(message({"order": "o-1", "amount": -1})))
    assert error.reason == "schema"
    assert error.detail.startswith("amount: ") and "greater than or equal to 0" in error.detail
    error = message_error(lambda: subscription.input_of(message({"amount": 1})))
    assert (error.reason, error.detail) == ("schema", "order: Field required")


def test_an_inline_json_schema_checks_the_input_naming_where_it_fails() -> None:
    subscription = orders(input_schema=SCHEMA)
    assert subscription.input_json_schema == SCHEMA
    assert subscription.input_of(message()) == ORDER
    error = message_error(lambda: subscription.input_of(message({"order": "o", "amount": -3})))
    assert error.reason == "schema"
    assert error.detail.startswith("amount: ") and "minimum of 0" in error.detail
    error = message_error(lambda: subscription.input_of(message({"amount": 3})))
    assert (error.reason, error.detail) == ("schema", "the input: 'order' is a required property")


def test_a_json_schema_file_is_read_once_when_the_subscription_is_made(tmp_path: Path) -> None:
    schema_file = tmp_path / "order.json"
    schema_file.write_text(json.dumps(SCHEMA))
    subscription = orders(input_schema=schema_file)
    schema_file.unlink()  # read at configuration, not per message
    assert subscription.input_json_schema == SCHEMA
    assert message_error(lambda: subscription.input_of(message({"amount": 3}))).reason == "schema"
    assert "No such file" in refused(input_schema=tmp_path / "missing.json")
    (tmp_path / "list.json").write_text("[1]")
    assert "is not a JSON object" in refused(input_schema=tmp_path / "list.json")
    (tmp_path / "bad.json").write_text("{nope")
    assert "bad.json" in refused(input_schema=tmp_path / "bad.json")


@pytest.mark.parametrize(
    ("schema", "said"),
    [
        ({"type": "nonsense"}, "'nonsense' is not valid"),
        ({"type": "object", "minimum": "zero"}, "'zero' is not of type 'number'"),
        ({"required": "order"}, "'order' is not of type 'array'"),
    ],
)
def test_an_invalid_json_schema_is_refused_at_config_time(
    schema: dict[str, Any], said: str
) -> None:
    error = refused(input_schema=schema)
    assert "input_schema is not a valid JSON Schema" in error and said in error
    with pytest.raises(ValidationError, match="input_schema is not a valid JSON Schema"):
        EngineConfig(subscriptions=[{**base_entry(), "input_schema": schema}])


# ---- what each action takes ------------------------------------------------------------------


def payments(**fields: Any) -> Subscription:
    return Subscription(
        **{
            "name": "payments",
            "topic": "t.payments",
            "action": "signal",
            "tenant": "acme",
            "job_id": "{value.job}",
            "event": "paid",
            **fields,
        }
    )


def test_a_submit_needs_its_workflow_and_takes_no_event() -> None:
    assert "submits jobs: name its workflow" in refused(workflow=None)
    assert "event is for action 'signal'" in refused(event="paid")


def test_a_signal_needs_its_job_and_event_and_takes_none_of_a_submits_keys() -> None:
    assert payments().job_id == "{value.job}"
    for missing in ("job_id", "event"):
        with pytest.raises(ValidationError, match=r"set job_id .* and event"):
            payments(**{missing: None})
    submit_only = {
        "workflow": "fulfil",
        "workflow_version": 2,
        "correlation_id": "{key}",
        "priority": 3,
        "budget": {"max_steps": 5},
    }
    for key, value in submit_only.items():
        with pytest.raises(ValidationError, match=f"{key} is for action 'submit'"):
            payments(**{key: value})


def test_other_fields_are_checked_when_the_subscription_is_made() -> None:
    assert "unknown subscription key 'topics' (known: name, topic, action" in refused(topics=["x"])
    assert "String should match pattern" in refused(name="has space")
    assert "String should match pattern" in refused(topic="bad topic")
    assert "less than or equal to 9" in refused(priority=10)
    assert "invalid job budget: max_steps" in refused(budget={"max_steps": "many"})
    assert "invalid job budget: nope" in refused(budget={"nope": 1})
    assert "dlq_topic is its own topic" in refused(dlq_topic="t.orders")
    assert orders().dead_letter_topic == "t.orders.dlq"
    assert orders(dlq_topic="t.errors").dead_letter_topic == "t.errors"


# ---- a configuration's subscriptions ---------------------------------------------------------


def base_entry(**fields: Any) -> dict[str, Any]:
    return {"name": "orders", "topic": "t.orders", "tenant": "acme", "workflow": "fulfil", **fields}


def test_two_subscriptions_of_one_name_are_refused() -> None:
    again = base_entry(topic="t.other")
    with pytest.raises(ValidationError, match="two subscriptions are named 'orders'"):
        EngineConfig(subscriptions=[base_entry(), again])


def kafka(*subscriptions: Subscription) -> KafkaSettings:
    return KafkaSettings.of(EngineConfig(transport="kafka", subscriptions=list(subscriptions)))


def test_two_subscriptions_of_one_topic_are_refused() -> None:
    settings = kafka(orders(), payments())
    assert settings.subscription_for("t.payments") == payments()
    assert settings.dlq_for("t.orders") == "t.orders.dlq"
    assert {"t.orders", "t.orders.dlq", "t.payments", "t.payments.dlq"} <= set(settings.topics)
    both = "'orders' and 'payments' both read topic 't.orders'"
    with pytest.raises(ConfigError, match=re.escape(both)):
        kafka(orders(), payments(topic="t.orders"))


def test_a_subscriptions_dead_letters_never_go_to_a_topic_another_one_reads() -> None:
    with pytest.raises(ConfigError, match=r"'payments' and 'orders' share topic 't\.payments'"):
        kafka(orders(dlq_topic="t.payments"), payments())


@pytest.mark.parametrize(
    ("fields", "said"),
    [
        ({"topic": "jobledger.ticks"}, "topic 'jobledger.ticks'"),
        ({"topic": "jobledger.signals"}, "topic 'jobledger.signals'"),
        ({"topic": "jobledger.events"}, "topic 'jobledger.events'"),
        ({"dlq_topic": "jobledger.ticks.dlq"}, "dlq_topic 'jobledger.ticks.dlq'"),
        ({"dlq_topic": "jobledger.signals"}, "dlq_topic 'jobledger.signals'"),
    ],
)
def test_a_subscription_to_jobledgers_own_topics_is_refused(
    fields: dict[str, Any], said: str
) -> None:
    settings = EngineConfig(transport="kafka")
    assert settings.kafka.ticks_topic == "jobledger.ticks"
    with pytest.raises(ConfigError, match=f"'orders': {re.escape(said)} is one of jobledger's own"):
        kafka(orders(**fields))


def test_subscriptions_come_from_the_environment_as_a_json_list(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    entries = [base_entry(key="{value.order}"), {**base_entry(), "name": "late", "topic": "t.late"}]
    monkeypatch.setenv("JOBLEDGER_SUBSCRIPTIONS", json.dumps(entries))
    subscriptions = EngineConfig().subscribing.subscriptions
    assert [(s.name, s.topic, s.key) for s in subscriptions] == [
        ("orders", "t.orders", "{value.order}"),
        ("late", "t.late", None),
    ]
    monkeypatch.setenv("JOBLEDGER_SUBSCRIPTIONS", json.dumps([{**base_entry(), "workflow": None}]))
    with pytest.raises(ValidationError, match=r"subscriptions\.0\n.*name its workflow"):
        EngineConfig()
    monkeypatch.setenv("JOBLEDGER_SUBSCRIPTIONS", '[{"name": "orders",')
    with pytest.raises(ConfigError, match="JOBLEDGER_SUBSCRIPTIONS is not valid JSON"):
        EngineConfig()


TOML = """
store_url = "sqlite:///jobs.db"
transport = "kafka"

[[subscriptions]]
name = "orders"
topic = "shop.orders"
tenant = "{header.tenant}"
tenants = ["acme", "globex"]
workflow = "fulfil"
key = "{value.order}"
input_schema = "schemas/order.json"

[[subscriptions]]
name = "payments"
topic = "shop.payments"
action = "signal"
tenant = "acme"
job_id = "order-{value.order}"
event = "paid"
input = "value.payment"
input_schema = { type = "object", required = ["amount"] }
"""


def test_subscriptions_in_jobledger_toml_with_a_schema_file_beside_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    project = tmp_path / "project"
    (project / "schemas").mkdir(parents=True)
    (project / "schemas" / "order.json").write_text(json.dumps(SCHEMA))
    (project / "jobledger.toml").write_text(TOML)
    monkeypatch.chdir(tmp_path)  # elsewhere: the schema file is found beside the config
    config = load_settings(Path("project/jobledger.toml"), None).engine
    order, payment = config.subscribing.subscriptions
    assert (order.name, order.tenants, order.input_json_schema) == (
        "orders",
        ("acme", "globex"),
        SCHEMA,
    )
    assert order.tenant_of(message(tenant=b"acme")) == "acme"
    assert payment.action == "signal" and payment.input == "value.payment"
    assert payment.input_json_schema == {"type": "object", "required": ["amount"]}
    settings = KafkaSettings.of(config)
    assert {"shop.orders", "shop.orders.dlq", "shop.payments", "shop.payments.dlq"} <= set(
        settings.topics
    )


def test_a_bad_subscription_in_jobledger_toml_is_named(tmp_path: Path) -> None:
    config_file = tmp_path / "jobledger.toml"
    config_file.write_text(TOML.replace('tenant = "{header.tenant}"', 'tenant = "{tenant}"'))
    (tmp_path / "schemas").mkdir()
    (tmp_path / "schemas" / "order.json").write_text(json.dumps(SCHEMA))
    with pytest.raises(ConfigError, match=r"subscriptions\.0\.tenant.*unknown field \{tenant\}"):
        load_settings(config_file, None)
    config_file.write_text(TOML.replace("schemas/order.json", "schemas/missing.json"))
    with pytest.raises(ConfigError, match=re.escape("missing.json")):
        load_settings(config_file, None)


# ---- who reads them ---------------------------------------------------------------------------


def test_the_supervisor_refuses_subscriptions_under_the_local_transport(tmp_path: Path) -> None:
    config = EngineConfig(
        store_url=f"sqlite:///{tmp_path}/jobs.db",
        token_secret=TOKEN_SECRET,
        subscriptions=[base_entry()],
    )
    registry = linear_registry({"fulfil": [STEP, DONE]})
    with open_engine(registry=registry, executor=CountingExecutor(), config=config) as engine:
        for services in (Services.of("run", kafka=False), Services.of("worker", kafka=False)):
            with pytest.raises(ConfigError, match="read by Kafka workers: set transport = kafka"):
                Supervisor(engine, services)
        # A process without workers reads no topic: nothing to refuse.
        Supervisor(engine, Services.of("projections", kafka=False))
