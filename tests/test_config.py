"""EngineConfig's settings in groups (``config.kafka.ticks_topic``), each still set by its
flat name: the keyword, the config file's key and the ``JOBLEDGER_*`` variable."""

from __future__ import annotations

import os
import subprocess
import sys
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from pydantic import SecretStr, ValidationError

from jobledger import EngineConfig
from jobledger.config import GROUPS, SETTINGS, ConcurrencyLimit
from jobledger.domain.errors import ConfigError
from jobledger.domain.event_routes import EventRoute
from jobledger.domain.subscription import Subscription

SECRET = "0123456789abcdef0123456789abcdef"

# Every setting's variable before the settings were grouped, a value for it and the value
# it sets (the field read through its group, below).
VARIABLES: dict[str, tuple[str, Any]] = {
    "STORE_URL": ("sqlite:///elsewhere.db", "sqlite:///elsewhere.db"),
    "PARTITIONS": ("4", 4),
    "WORKER_ID": ("w-7", "w-7"),
    "MAX_STEPS_PER_TICK": ("3", 3),
    "INLINE_RESUME_MAX_DELAY_MS": ("5", 5),
    "DEFAULT_WAIT_MS": ("6", 6),
    "COST_CEILING_USD": ("1.50", Decimal("1.50")),
    "TENANT_COST_CEILINGS_USD": ('{"acme": "2"}', {"acme": Decimal(2)}),
    "RESUME_MODE": ("scan_only", "scan_only"),
    "LEASE_MS": ("7", 7),
    "MAX_PAYLOAD_BYTES": ("8", 8),
    "CONCURRENCY": ("9", 9),
    "MAX_BATCH": ("10", 10),
    "MAX_BATCH_WAIT_MS": ("0.5", 0.5),
    "ADMISSION_WINDOW": ("11", 11),
    "PRIORITY_AGING_SECONDS": ("12.5", 12.5),
    "CONCURRENCY_LIMITS": ('[{"tenant": "acme"}]', [ConcurrencyLimit(tenant="acme")]),
    "CACHE_SIZE": ("13", 13),
    "SNAPSHOT_INTERVAL": ("14", 14),
    "TOKEN_SECRET": (SECRET, SecretStr(SECRET)),
    "TOKEN_KEY_ID": ("k9", "k9"),
    "TOKEN_PREVIOUS_KEYS": ('{"k0": "old"}', {"k0": SecretStr("old")}),
    "TOKEN_TTL_SECONDS": ("15", 15),
    "TOKEN_ISSUER": ("me", "me"),
    "TOKEN_AUDIENCE": ("you", "you"),
    "ERASURE_MASTER_KEY": ("a-key", SecretStr("a-key")),
    "NOTIFIER": ("stdout", "stdout"),
    "NOTIFIER_SECRET": ("shh", SecretStr("shh")),
    "OTEL_EXPORTER": ("console", "console"),
    "OTEL_SERVICE_NAME": ("svc", "svc"),
    "SIGNING_KEYS": ("keys.json", Path("keys.json")),
    "KEYRING": ("ring.json", Path("ring.json")),
    "TRANSPORT": ("kafka", "kafka"),
    "KAFKA_BOOTSTRAP_SERVERS": ("k1:9092,k2:9092", "k1:9092,k2:9092"),
    "KAFKA_TICKS_TOPIC": ("t.ticks", "t.ticks"),
    "KAFKA_TICKS_DLQ_TOPIC": ("t.ticks.dlq", "t.ticks.dlq"),
    "KAFKA_SIGNALS_TOPIC": ("t.signals", "t.signals"),
    "KAFKA_SIGNALS_DLQ_TOPIC": ("t.signals.dlq", "t.signals.dlq"),
    "KAFKA_EVENTS_TOPIC": ("t.events", "t.events"),
    "KAFKA_GROUP_ID": ("g", "g"),
    "KAFKA_CLIENT_ID": ("c", "c"),
    "KAFKA_CREATE_TOPICS": ("false", False),
    "KAFKA_TOPIC_PARTITIONS": ("16", 16),
    "KAFKA_REPLICATION_FACTOR": ("3", 3),
    "KAFKA_SESSION_TIMEOUT_MS": ("2000", 2000),
    "KAFKA_SEND_TIMEOUT_MS": ("3000", 3000),
    "EVENT_ROUTES": ('[{"topic": "t.out"}]', [EventRoute(topic="t.out")]),
    "SUBSCRIPTIONS": (
        '[{"name": "orders", "topic": "t.orders", "tenant": "acme", "workflow": "w"}]',
        [Subscription(name="orders", topic="t.orders", tenant="acme", workflow="w")],
    ),
    "METRICS_PORT": ("9100", 9100),
    "METRICS_HOST": ("0.0.0.0", "0.0.0.0"),
    "METRICS_TENANT_LABEL": ("true", True),
    "METRICS_TENANT_CAP": ("17", 17),
    "RETENTION_DEFAULT_DAYS": ("90", 90),
    "RETENTION_TENANTS": ('{"acme": 365}', {"acme": 365}),
    "RETENTION_WORKFLOWS": ('{"nightly": 7}', {"nightly": 7}),
    "RETENTION_ARCHIVE_TO": ("kafka:jobs.archive", "kafka:jobs.archive"),
    "RETENTION_INTERVAL_SECONDS": ("60", 60.0),
}


def grouped_value(config: EngineConfig, flat: str) -> Any:
    group, field = SETTINGS[flat]
    return getattr(getattr(config, group) if group else config, field)


def test_every_setting_keeps_its_flat_name() -> None:
    assert sorted(SETTINGS) == sorted(name.lower() for name in VARIABLES)


def test_every_old_variable_still_sets_its_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    for name, (raw, _) in VARIABLES.items():
        monkeypatch.setenv(f"JOBLEDGER_{name}", raw)
    config = EngineConfig()
    for name, (_, expected) in VARIABLES.items():
        assert grouped_value(config, name.lower()) == expected, name
        assert config.setting(name.lower()) == expected, name


def test_flat_keywords_set_grouped_fields_and_beat_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("JOBLEDGER_KAFKA_TICKS_TOPIC", "from.env")
    monkeypatch.setenv("JOBLEDGER_KAFKA_GROUP_ID", "env-group")
    config = EngineConfig(kafka_ticks_topic="from.init", lease_ms=5, token_secret=SECRET)
    assert (config.kafka.ticks_topic, config.kafka.group_id) == ("from.init", "env-group")
    assert config.leases.ms == 5
    assert config.tokens.secret == SecretStr(SECRET)


def test_an_unknown_or_bad_flat_setting_is_named_flat() -> None:
    with pytest.raises(ValidationError) as raised:
        EngineConfig(lease_mss=5, kafka_topic_partitions=0, concurrency_limits=[{"tenant": ""}])
    locs = {error["loc"]: error["type"] for error in raised.value.errors()}
    assert locs == {
        ("lease_mss",): "extra_forbidden",
        ("kafka_topic_partitions",): "greater_than_equal",
        ("concurrency_limits", 0, "tenant"): "string_too_short",
    }


def test_model_copy_takes_flat_names_into_their_groups() -> None:
    config = EngineConfig(kafka_group_id="g")
    copy = config.model_copy(update={"store_url": "sqlite:///b.db", "kafka_client_id": "c"})
    assert (copy.store_url, copy.kafka.client_id, copy.kafka.group_id) == (
        "sqlite:///b.db",
        "c",
        "g",
    )
    assert (config.store_url, config.kafka.client_id) == ("sqlite:///jobledger.sqlite", "jobledger")


def test_no_flat_name_is_a_group_name() -> None:
    assert not set(SETTINGS) & set(GROUPS)


def test_a_list_or_table_variable_that_is_not_json_is_named_with_the_problem(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Issue 28's outsider: a malformed JOBLEDGER_SUBSCRIPTIONS crashed every command with
    pydantic-settings' traceback, naming neither the variable nor what was wrong."""
    complex_ones = [name for name, (value, _) in VARIABLES.items() if value[:1] in "[{"]
    assert {"SUBSCRIPTIONS", "EVENT_ROUTES", "RETENTION_TENANTS"} <= set(complex_ones)
    for name in complex_ones:
        for bad in ("[{bad", ""):
            with monkeypatch.context() as patched:
                patched.setenv(f"JOBLEDGER_{name}", bad)
                with pytest.raises(ConfigError, match=f"^JOBLEDGER_{name} is not valid JSON: "):
                    EngineConfig()


def test_a_malformed_subscriptions_variable_stops_a_command_with_exit_3(tmp_path: Path) -> None:
    env = {**os.environ, "JOBLEDGER_SUBSCRIPTIONS": '[{"name": '}
    done = subprocess.run(
        [sys.executable, "-m", "jobledger", "list"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 3, done.stderr
    assert "JOBLEDGER_SUBSCRIPTIONS is not valid JSON" in done.stderr
    assert "Traceback" not in done.stderr
