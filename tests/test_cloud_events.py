"""Job events as CloudEvents 1.0 on Kafka (the encoding, without a broker) and the event
routes that choose them: from the config file, the environment and Python, and every
bad route a clear error."""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from cloudevents.core.bindings.kafka import KafkaMessage, from_binary, from_structured
from cloudevents.core.formats.json import JSONFormat
from pydantic import ValidationError

from jobledger import EngineConfig
from jobledger.adapters.cloud_events import JobEventFacts, cloud_event_message, event_id
from jobledger.adapters.event_store import EventSourcedJobStore
from jobledger.adapters.kafka.settings import KafkaSettings
from jobledger.cli.config_file import load_settings
from jobledger.domain.errors import ConfigError
from jobledger.domain.event_routes import EventRoute
from jobledger.orchestration.ports import OutboxMessage
from jobledger.projections.outbox import Outbox
from tests.support.cli import run_jobledger
from tests.support.engines import EngineFactory

UUID = "6f1c0d3e-8a43-5c1e-9f6b-0a1b2c3d4e5f"
VALUE = b'{"fields":{"chain_hash":"abc","originator_version":3},"type":"Job.StepRecorded"}'
AT = datetime(2026, 12, 5, 15, 0, 1, 250_000, tzinfo=UTC)


def facts(**changes: Any) -> JobEventFacts:
    given: dict[str, Any] = {
        "tenant_id": "acme",
        "job_id": "order-7",
        "workflow": "agent3",
        "job_uuid": UUID,
        "version": 3,
        "event_type": "StepRecorded",
        "time": AT,
        "chain_hash": "abc",
        "signer": None,
        "value": VALUE,
    }
    return JobEventFacts(**(given | changes))


def kafka_message(encoded: Any) -> KafkaMessage:
    return KafkaMessage(headers=dict(encoded.headers), key=encoded.key, value=encoded.value)


def test_structured_mode_carries_the_whole_event_in_the_value() -> None:
    encoded = cloud_event_message(facts(), "structured")
    assert encoded.key == b"acme/order-7"
    assert encoded.headers == [("content-type", b"application/cloudevents+json")]
    event = from_structured(kafka_message(encoded), JSONFormat())
    attributes = event.get_attributes()
    assert attributes["specversion"] == "1.0"
    assert event.get_id() == f"{UUID}/3" == event_id(UUID, 3)
    assert event.get_type() == "jobledger.job.StepRecorded"
    assert event.get_source() == "jobledger/acme/agent3"
    assert event.get_subject() == "order-7"
    assert event.get_time() == AT
    assert event.get_datacontenttype() == "application/json"
    assert attributes["jobledgertenant"] == "acme"
    assert attributes["jobledgerjobversion"] == "3"
    assert attributes["jobledgerchainhash"] == "abc"
    assert "jobledgersigner" not in attributes  # unsigned
    assert event.get_data() == json.loads(VALUE)
    assert json.loads(encoded.value)["data"] == json.loads(VALUE)


def test_binary_mode_carries_ce_headers_and_the_events_topic_bytes_as_the_value() -> None:
    encoded = cloud_event_message(facts(signer="k2026"), "binary")
    assert encoded.key == b"acme/order-7"
    assert encoded.value == VALUE  # the very bytes the events topic carries
    headers = dict(encoded.headers)
    assert headers["ce_id"] == f"{UUID}/3".encode()
    assert headers["ce_type"] == b"jobledger.job.StepRecorded"
    assert headers["ce_specversion"] == b"1.0"
    assert headers["ce_jobledgersigner"] == b"k2026"
    assert headers["content-type"] == b"application/json"
    event = from_binary(kafka_message(encoded), JSONFormat())
    assert (event.get_id(), event.get_subject(), event.get_time()) == (f"{UUID}/3", "order-7", AT)
    assert event.get_extension("jobledgerchainhash") == "abc"
    assert event.get_extension("jobledgersigner") == "k2026"
    assert event.get_data() == json.loads(VALUE)


def test_the_same_event_encodes_to_the_same_message_and_names_are_quoted_in_the_source() -> None:
    assert cloud_event_message(facts(), "structured") == cloud_event_message(facts(), "structured")
    odd = cloud_event_message(facts(tenant_id="a/b c", workflow="w?x"), "binary")
    assert dict(odd.headers)["ce_source"] == b"jobledger/a%2Fb%20c/w%3Fx"
    assert dict(odd.headers)["ce_jobledgertenant"] == b"a/b c"
    assert odd.key == b"a/b c/order-7"


def test_a_route_matches_by_workflow_and_by_event_type() -> None:
    every = EventRoute(topic="all")
    assert every.mode == "structured" and every.matches("anything", "Failed")
    by_workflow = EventRoute(topic="o", workflows=["agent3"])
    assert by_workflow.matches("agent3", "Failed") and not by_workflow.matches("timer", "Failed")
    both = EventRoute(topic="o", workflows=["agent3"], event_types=["Cancelled"], mode="binary")
    assert both.matches("agent3", "Cancelled")
    assert not both.matches("agent3", "StepRecorded")
    assert not both.matches("timer", "Cancelled")


ROUTES_TOML = """
[[event_routes]]
topic = "orders.events"
workflows = ["agent3"]

[[event_routes]]
topic = "orders.outcomes"
event_types = ["Cancelled", "Failed"]
mode = "binary"
"""


def test_routes_come_from_the_config_file_the_environment_and_python(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "jobledger.toml").write_text(ROUTES_TOML)
    routes = load_settings(tmp_path / "jobledger.toml", None).engine.outbox.event_routes
    assert routes == [
        EventRoute(topic="orders.events", workflows=["agent3"]),
        EventRoute(topic="orders.outcomes", event_types=["Cancelled", "Failed"], mode="binary"),
    ]
    # The routed topics are made with the others (kafka_create_topics).
    settings = KafkaSettings.of(EngineConfig(event_routes=routes))
    assert settings.topics[-2:] == ["orders.events", "orders.outcomes"]
    assert settings.event_routes == tuple(routes)

    monkeypatch.setenv("JOBLEDGER_EVENT_ROUTES", '[{"topic": "env.out", "mode": "binary"}]')
    from_env = load_settings(tmp_path / "jobledger.toml", None).engine.outbox.event_routes
    assert from_env == [EventRoute(topic="env.out", mode="binary")]  # the environment wins


@pytest.mark.parametrize(
    ("route", "message"),
    [
        ('event_types = ["Finished"]', "unknown job event type 'Finished' (known: "),
        ("workflows = []", "an empty list routes nothing: leave it out"),
        ('workflows = [""]', "a name must not be empty"),
        ('mode = "cbor"', "event_routes.0.mode must be one of 'structured' or 'binary'"),
        ('wrkflows = ["x"]', "unknown event route key 'wrkflows' (known: topic, workflows, "),
    ],
)
def test_a_bad_route_in_the_config_file_is_a_clear_error(
    tmp_path: Path, route: str, message: str
) -> None:
    (tmp_path / "jobledger.toml").write_text(f'[[event_routes]]\ntopic = "out"\n{route}\n')
    with pytest.raises(ConfigError, match="event_routes") as raised:
        load_settings(tmp_path / "jobledger.toml", None)
    assert message in str(raised.value)


def test_a_route_needs_a_legal_topic() -> None:
    with pytest.raises(ValidationError, match="topic"):
        EventRoute(topic="not a topic")
    with pytest.raises(ValidationError, match="topic"):
        EventRoute.model_validate({"workflows": ["agent3"]})
    with pytest.raises(ValidationError, match="event_routes"):
        EngineConfig(event_routes=[{"topic": "o", "event_types": ["Nope"]}])
    config = EngineConfig(event_routes=[{"topic": "t.events"}], kafka_events_topic="t.events")
    with pytest.raises(ConfigError, match=r"'t\.events' is the events topic"):
        KafkaSettings.of(config)


def test_routes_without_the_cloudevents_library_are_a_configuration_error(
    monkeypatch: pytest.MonkeyPatch, make_engine: EngineFactory
) -> None:
    from jobledger.adapters.cloud_events import require_library

    require_library()  # installed here (the dev extra)
    monkeypatch.setitem(sys.modules, "cloudevents.core.bindings.kafka", None)
    with pytest.raises(ConfigError, match=r"pip install 'jobledger\[cloudevents\]'"):
        require_library()
    # The outbox refuses its routes when it is made, not at its first routed event.
    store = make_engine().store
    assert isinstance(store, EventSourcedJobStore)
    with pytest.raises(ConfigError, match="event_routes need the cloudevents library"):
        Outbox(store, Unused(), routes=[EventRoute(topic="out")])
    Outbox(store, Unused())  # without routes it needs no library


class Unused:
    def publish(self, messages: Sequence[OutboxMessage]) -> None:
        raise AssertionError("nothing is published here")


@pytest.mark.parametrize(
    ("routes", "message"),
    [
        ('[{"topic": "out", "mode": "cbor"}]', "event_routes.0.mode must be one of"),
        ('[{"topic": "jobledger.events"}]', "'jobledger.events' is the events topic"),
    ],
)
def test_a_bad_route_stops_the_outbox_command_with_its_message(
    tmp_path: Path, routes: str, message: str
) -> None:
    store = f"sqlite:///{tmp_path}/jobs.db"
    result = run_jobledger(
        "projections", "run", "--outbox", "--store", store, JOBLEDGER_EVENT_ROUTES=routes
    )
    assert result.returncode == 3, result.stderr
    assert message in result.stderr
    assert "Traceback" not in result.stderr
