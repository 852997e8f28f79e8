"""docker-compose.yml: the API service and its healthcheck (the file validates when
docker-compose is installed; its shape is checked either way)."""

from __future__ import annotations

import shutil
import subprocess
import tomllib
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent


def test_the_api_service_serves_on_8080_and_is_healthy_when_ready() -> None:
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    api = compose["services"]["api"]
    assert api["command"] == ["serve"]
    assert api["environment"]["JOBLEDGER_HTTP_HOST"] == "0.0.0.0"
    assert api["environment"]["JOBLEDGER_HTTP_PORT"] == "8080"
    assert "8080:8080" in api["ports"]
    test = " ".join(api["healthcheck"]["test"])
    assert "http://127.0.0.1:8080/readyz" in test
    assert api["depends_on"]["postgres"]["condition"] == "service_healthy"
    # The image has the API's dependencies (and the subscriptions' JSON Schema library).
    assert 'pip install --no-cache-dir ".[http,subscriptions]"' in (ROOT / "Dockerfile").read_text()


@pytest.mark.skipif(shutil.which("docker-compose") is None, reason="docker-compose not installed")
@pytest.mark.parametrize("profile", [[], ["--profile", "kafka-service"]], ids=["default", "kafka"])
def test_docker_compose_config_validates(profile: list[str]) -> None:
    done = subprocess.run(
        ["docker-compose", *profile, "config", "-q"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr


def test_the_kafka_service_profile_runs_the_example_beside_the_other_services() -> None:
    """Its own store schema, and (from the example's jobledger.toml) its own topics and
    consumer group: the default workers, which do not serve its workflow, never get its
    ticks. The run itself: tests/test_kafka_service_example.py."""
    services = yaml.safe_load((ROOT / "docker-compose.yml").read_text())["services"]
    [name] = [name for name, s in services.items() if "kafka-service" in s.get("profiles", [])]
    service = services[name]
    config = service["command"][service["command"].index("--config") + 1]
    assert (ROOT / config.removeprefix("/app/")).is_file()
    assert service["environment"]["JOBLEDGER_STORE_URL"].endswith("?schema=shop")
    assert "JOBLEDGER_DEFINITIONS" not in service["environment"]  # it would replace the file's
    assert service["depends_on"]["kafka"]["condition"] == "service_healthy"
    settings = tomllib.loads((ROOT / config.removeprefix("/app/")).read_text())
    # The default workers set no topic or group of their own: they use the defaults.
    assert not any(k.endswith(("_TOPIC", "_GROUP_ID")) for k in services["worker-1"]["environment"])
    assert settings["kafka_group_id"] != "jobledger-workers"
    assert settings["kafka_ticks_topic"] != "jobledger.ticks"


def test_the_observability_profile_scrapes_every_jobledger_service() -> None:
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    services = compose["services"]
    extra = {"prometheus", "grafana", "otel-collector"}
    assert {name for name, s in services.items() if "observability" in s.get("profiles", [])} == (
        extra
    )
    for name in extra:
        for volume in services[name].get("volumes", []):
            source = volume.split(":")[0]
            if source.startswith("./"):
                assert (ROOT / source).exists(), (name, source)
    scrape = yaml.safe_load((ROOT / "examples/observability/prometheus.yml").read_text())
    [job] = [j for j in scrape["scrape_configs"] if j["job_name"] == "jobledger"]
    targets = {t for group in job["static_configs"] for t in group["targets"]}
    # Every long-running jobledger service but the API (which asks for a credential).
    running = {
        f"{name}:{s['environment']['JOBLEDGER_METRICS_PORT']}"
        for name, s in services.items()
        if "JOBLEDGER_METRICS_PORT" in s.get("environment", {}) and name != "api"
    }
    assert targets == running and len(running) == 4
