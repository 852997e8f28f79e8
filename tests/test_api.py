"""The HTTP API against a real uvicorn server on a loopback port, on SQLite and PostgreSQL."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import pytest

from jobledger.api.auth import Role
from jobledger.engine import Engine
from tests.support.engines import EngineFactory
from tests.support.http import ApiServer, api_key, api_registry, start_api, token

PROBLEM = "application/problem+json"

StartApi = Callable[..., AbstractContextManager[ApiServer]]


@pytest.fixture
def engine(make_engine: EngineFactory) -> Engine:
    return make_engine(registry=api_registry())


@pytest.fixture
def api(engine: Engine, tmp_path: Path) -> Iterator[ApiServer]:
    with start_api(engine, tmp_path) as server:
        yield server


def problem(response: Any, status: int) -> dict[str, Any]:
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == PROBLEM
    body: dict[str, Any] = response.json()
    assert body["status"] == status
    return body


# ---- health ----------------------------------------------------------------------------


def test_health_and_readiness_answer_without_credentials(api: ApiServer) -> None:
    with api.client() as http:
        assert http.get("/healthz").json() == {"status": "ok"}
        assert http.get("/readyz").json() == {"status": "ok"}


# ---- reading a job ---------------------------------------------------------------------


def test_a_job_is_read_with_a_jwt_or_an_api_key(api: ApiServer, engine: Engine) -> None:
    engine.submit("acme", "j1", "agent3", input={"q": 1})

    with api.as_role(Role.AUDITOR) as http:
        body = http.get("/v1/jobs/acme/j1").json()
    with api.client(api_key("acme", Role.OPERATOR)) as http:
        again = http.get("/v1/jobs/acme/j1").json()

    assert body["job_id"] == "j1" and body["state"] == {"q": 1} and body["status"] == "queued"
    assert again == body


def test_another_tenants_job_is_not_found_exactly_as_a_missing_one(
    api: ApiServer, engine: Engine
) -> None:
    engine.submit("acme", "j1", "agent3")

    with api.client(token(tenants="globex", roles="admin")) as http:
        hidden = problem(http.get("/v1/jobs/acme/j1"), 404)
    with api.client(token(tenants="acme", roles="admin")) as http:
        missing = problem(http.get("/v1/jobs/acme/nope"), 404)

    assert hidden["error"] == missing["error"] == "UnknownJobError"
    assert hidden["detail"] == "no job 'j1' for tenant 'acme'"


def test_no_credentials_is_401_with_a_bearer_challenge(api: ApiServer) -> None:
    with api.client() as http:
        response = http.get("/v1/jobs/acme/j1")
    problem(response, 401)
    assert response.headers["www-authenticate"] == "Bearer"
