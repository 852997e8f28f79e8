"""examples/kafka_service end to end on the real broker, run the two ways the docs say:

- as its README.md runs it: ``jobledger run`` in the example's directory (its
  jobledger.toml: the subscriptions, the workflow module, the JSON Schema),
  ``python producer.py orders``, then ``payments``, then ``letters``, ``jobledger list``;
  on SQLite and on PostgreSQL (``JOBLEDGER_STORE_URL``);
- as docker-compose.yml's ``kafka-service`` profile runs it: the service's own command
  and environment, from the image's working directory (``/app``, here a copy of the
  repository's examples), with the test's broker and PostgreSQL schema in place of the
  compose ones.

The example is copied and its topic and group names get a prefix of the test's own, so
runs on one broker do not read each other's messages; nothing else is changed."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tomllib
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from kafka import KafkaAdminClient

from jobledger import Engine, JobStatus
from jobledger.domain.errors import UnknownJobError
from tests.support import ROOT, pythonpath
from tests.support.kafka_broker import wait_for
from tests.support.services import postgres_schema_url

EXAMPLE = Path("examples") / "kafka_service"
PAID = {("acme", "o-1001"), ("acme", "o-1002"), ("globex", "o-2001")}


@dataclass(frozen=True)
class Service:
    """Where the example's commands run, and how."""

    app: Path
    """A copy of the repository's examples/kafka_service under ``app/``."""
    cwd: Path
    env: dict[str, str]
    producer: str
    """The producer script as the commands name it from ``cwd``."""

    @property
    def home(self) -> Path:
        return self.app / EXAMPLE

    def run(self, *args: str) -> str:
        done = subprocess.run(
            list(args), cwd=self.cwd, env=self.env, capture_output=True, text=True, timeout=120
        )
        assert done.returncode == 0, done.stdout + done.stderr
        return done.stdout

    def produce(self, what: str) -> str:
        return self.run(sys.executable, self.producer, what)

    def jobledger(self, *args: str) -> str:
        return self.run(sys.executable, "-m", "jobledger", *args)


@contextmanager
def copy_example(app: Path, bootstrap: str) -> Iterator[None]:
    """examples/kafka_service under ``app``, its topics and group named for this test
    (deleted from the broker afterwards)."""
    home = app / EXAMPLE
    shutil.copytree(ROOT / EXAMPLE, home, ignore=shutil.ignore_patterns("__pycache__", "*.db*"))
    prefix = f"t{uuid.uuid4().hex[:10]}"
    config = home / "jobledger.toml"
    text = config.read_text()
    assert text.count('"shop.') == 7 and text.count('"shop-workers"') == 1
    text = text.replace('"shop.', f'"{prefix}.shop.').replace('"shop-workers"', f'"{prefix}"')
    config.write_text(text)
    yield
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        admin.delete_topics([t for t in admin.list_topics() if t.startswith(f"{prefix}.")])
    except Exception:
        pass  # best effort: the broker is thrown away at the end of the run
    finally:
        admin.close()


def clean_env(bootstrap: str, store_url: str, **variables: str) -> dict[str, str]:
    """This environment without its JOBLEDGER_* settings, with the test's broker, store
    and ``variables``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("JOBLEDGER_")}
    ours = {"JOBLEDGER_KAFKA_BOOTSTRAP_SERVERS": bootstrap, "JOBLEDGER_STORE_URL": store_url}
    return env | variables | ours | {"PYTHONPATH": pythonpath()}


@pytest.fixture
def readme_way(tmp_path: Path, kafka_bootstrap: str, store_url: str) -> Iterator[Service]:
    app = tmp_path / "app"
    with copy_example(app, kafka_bootstrap):
        yield Service(app, app / EXAMPLE, clean_env(kafka_bootstrap, store_url), "producer.py")


def compose_service() -> dict[str, Any]:
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    service: dict[str, Any] = compose["services"]["kafka-service"]
    return service


def compose_value(value: str) -> str:
    """``${NAME:-default}`` as compose reads it with NAME unset."""
    return re.sub(r"\$\{\w+:-([^}]*)\}", r"\1", value)


@pytest.fixture
def compose_way(tmp_path: Path, kafka_bootstrap: str) -> Iterator[tuple[Service, list[str]]]:
    app = tmp_path / "app"
    service = compose_service()
    environment = {k: compose_value(str(v)) for k, v in service["environment"].items()}
    assert environment.pop("JOBLEDGER_KAFKA_BOOTSTRAP_SERVERS") == "kafka:9092"
    assert environment.pop("JOBLEDGER_STORE_URL").endswith("@postgres:5432/jobledger?schema=shop")
    command = [part.replace("/app", str(app)) for part in service["command"]]
    with copy_example(app, kafka_bootstrap):
        for url in postgres_schema_url():
            env = clean_env(kafka_bootstrap, url, **environment)
            yield Service(app, app, env, f"{EXAMPLE}/producer.py"), command


def shop_workflow(home: Path) -> Any:
    """The example's ``order`` workflow, as the runner loads it (the engine that reads
    the jobs here needs it deployed)."""
    spec = importlib.util.spec_from_file_location("shop", home / "shop.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.order


def status(engine: Engine, tenant: str, job_id: str) -> JobStatus | None:
    try:
        return engine.job(tenant, job_id).status
    except UnknownJobError:
        return None


@dataclass
class Outcome:
    letters: str
    listed: list[dict[str, Any]]
    history: list[Any]


def run_the_example(service: Service, command: list[str]) -> Outcome:
    """The runner started with ``command``, the orders sent, their jobs waiting, the
    payments sent, the jobs completed; then the runner stopped (SIGTERM, exit 0)."""
    log_path = service.app / "run.log"
    with log_path.open("wb") as log:
        runner = subprocess.Popen(
            [sys.executable, "-m", "jobledger", *command],
            cwd=service.cwd,
            env=service.env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    try:
        url = service.env["JOBLEDGER_STORE_URL"]
        with Engine.open(url, workflows=[shop_workflow(service.home)]) as engine:
            assert service.produce("orders").count("\n") == 6
            wait_for(
                lambda: all(status(engine, *job) is JobStatus.WAITING_EVENT for job in PAID),
                90,
                "every good order's job waits for its payment",
            )
            listed = json.loads(service.jobledger("list", "--json"))
            service.produce("payments")
            wait_for(
                lambda: all(status(engine, *job) is JobStatus.COMPLETED for job in PAID),
                90,
                "every paid order's job completed",
            )
            history = engine.history("acme", "o-1001")
        letters = service.produce("letters")
    finally:
        runner.send_signal(signal.SIGTERM)
        runner.wait(timeout=60)
    assert runner.returncode == 0, log_path.read_text()[-3000:]
    return Outcome(letters, listed, history)


def check_outcome(outcome: Outcome) -> None:
    # One job per good order (the order sent twice too), none for the bad ones.
    assert {(row["tenant_id"], row["job_id"], row["status"]) for row in outcome.listed} == {
        (tenant, job_id, "waiting_event") for tenant, job_id in PAID
    }
    types = [entry.event_type for entry in outcome.history]
    assert types.count("Submitted") == 1 and types.count("Resumed") == 1
    [submitted] = [e.data for e in outcome.history if e.event_type == "Submitted"]
    assert submitted["submit_key"] == "sub:orders:o-1001"
    assert submitted["correlation_id"] == "c-1001"
    assert submitted["state"]["total"] == "25.00"
    # Its payment was sent twice: one signal, by the payment id.
    [resumed] = [e.data for e in outcome.history if e.event_type == "Resumed"]
    assert resumed["signal_id"] == "sub:payments:p-1"
    assert resumed["payload"]["amount"] == "25.00"
    reasons = sorted(line.split()[2].rstrip(":") for line in outcome.letters.splitlines())
    assert reasons == ["schema", "tenant_not_allowed"], outcome.letters
    assert "o-1003 schema: lines.0.quantity" in outcome.letters
    assert "o-3001 tenant_not_allowed: tenant 'initech'" in outcome.letters


def test_the_example_as_its_readme_runs_it(readme_way: Service) -> None:
    outcome = run_the_example(readme_way, ["run"])
    check_outcome(outcome)
    done = json.loads(readme_way.jobledger("list", "--status", "completed", "--json"))
    assert {(row["tenant_id"], row["job_id"]) for row in done} == PAID
    shown = json.loads(readme_way.jobledger("show", "acme", "o-1001", "--json"))
    assert shown["status"] == "completed"


@pytest.mark.postgres
def test_the_example_as_the_compose_profile_runs_it(
    compose_way: tuple[Service, list[str]],
) -> None:
    service, command = compose_way
    assert command[0] == "run"
    check_outcome(run_the_example(service, command))


def test_the_readme_shows_the_examples_subscriptions_as_they_are() -> None:
    """README.md's "Kafka-driven services" says the example serves the configuration it
    shows: the same subscriptions, key for key."""
    readme = (ROOT / "README.md").read_text()
    blocks = re.findall(r"```toml\n(.*?)```", readme, re.S)
    [shown] = [block for block in blocks if "[[subscriptions]]" in block]
    served = tomllib.loads((ROOT / EXAMPLE / "jobledger.toml").read_text())
    assert tomllib.loads(shown)["subscriptions"] == served["subscriptions"]
