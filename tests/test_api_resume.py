"""``POST /v1/resume``: the resume token as the outside system's callback, against a real
uvicorn server on SQLite and PostgreSQL. The token alone is the credential, scoped to its
one wait; what is refused is refused with the engine's error type and writes nothing."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import jwt
import pytest

from jobledger.adapters.clock import FakeClock
from jobledger.api.auth import Role
from jobledger.engine.engine import Engine
from tests.support.engines import EngineFactory
from tests.support.http import PROBLEM, ApiServer, api_registry
from tests.support.notifiers import Inbox


@pytest.fixture
def inbox() -> Inbox:
    return Inbox()


@pytest.fixture
def engine(make_engine: EngineFactory, inbox: Inbox) -> Engine:
    return make_engine(registry=api_registry(), notifier=inbox)


def waiting(engine: Engine, inbox: Inbox, job_id: str) -> str:
    """Submit a ``wait`` job, run it to its wait; its resume token."""
    engine.submit("acme", job_id, "wait")
    engine.run_until_idle()
    assert engine.job("acme", job_id).status == "waiting_event"
    return inbox.tokens[job_id].token


def problem(response: Any, status: int, error: str) -> str:
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == PROBLEM
    body = response.json()
    assert (body["status"], body["error"]) == (status, error), body
    return str(body["detail"])


def test_the_token_as_bearer_resumes_its_job_with_the_payload(
    api: ApiServer, engine: Engine, inbox: Inbox
) -> None:
    token = waiting(engine, inbox, "j1")
    with api.client(token) as http:
        answer = http.post("/v1/resume", json={"payload": {"paid": "100.00"}})
    assert answer.status_code == 200, answer.text
    # Only what became of the job: the token does not read the job's data. This engine
    # runs its own ticks, so the resume holds the job for the tick it wakes (running).
    assert answer.json() == {
        "tenant_id": "acme",
        "job_id": "j1",
        "status": "running",
        "version": engine.job("acme", "j1").version,
    }
    engine.run_until_idle()
    assert engine.job("acme", "j1").status == "completed"
    [resumed] = [e for e in engine.history("acme", "j1") if e.event_type == "Resumed"]
    assert resumed.data["payload"] == {"paid": "100.00"}


def test_the_token_in_the_body_resumes_too(api: ApiServer, engine: Engine, inbox: Inbox) -> None:
    token = waiting(engine, inbox, "j1")
    with api.client() as http:
        answer = http.post("/v1/resume", json={"token": token, "payload": {}})
    assert answer.status_code == 200, answer.text
    assert answer.json()["status"] == "running"


def test_a_replayed_token_is_refused_and_writes_nothing(
    api: ApiServer, engine: Engine, inbox: Inbox
) -> None:
    token = waiting(engine, inbox, "j1")
    with api.client(token) as http:
        assert http.post("/v1/resume", json={"payload": {}}).status_code == 200
        version = engine.job("acme", "j1").version
        again = http.post("/v1/resume", json={"payload": {"twice": True}})
    assert problem(again, 409, "TokenReplayedError") == "the resume token was already used"
    assert engine.job("acme", "j1").version == version


def test_an_expired_token_is_refused_by_the_engines_clock(
    api: ApiServer, engine: Engine, inbox: Inbox, clock: FakeClock
) -> None:
    token = waiting(engine, inbox, "j1")
    version = engine.job("acme", "j1").version
    clock.advance(timedelta(seconds=engine.config.tokens.ttl_seconds + 1))
    with api.client(token) as http:
        detail = problem(http.post("/v1/resume", json={}), 401, "ExpiredTokenError")
    assert detail.startswith("resume token expired at ")
    assert engine.job("acme", "j1").version == version


def test_a_forged_token_is_refused(api: ApiServer, engine: Engine, inbox: Inbox) -> None:
    token = waiting(engine, inbox, "j1")
    claims = jwt.decode(token, options={"verify_signature": False})
    header = jwt.get_unverified_header(token)
    forged = jwt.encode(claims, "not-the-secret-not-the-secret-0123456789", headers=header)
    with api.client(forged) as http:
        problem(http.post("/v1/resume", json={}), 401, "InvalidTokenError")
        problem(
            http.post("/v1/resume", headers={"Authorization": "Bearer x.y.z"}),
            401,
            "InvalidTokenError",
        )
    assert engine.job("acme", "j1").status == "waiting_event"


def test_the_token_opens_nothing_else_and_an_api_credential_resumes_nothing(
    api: ApiServer, engine: Engine, inbox: Inbox
) -> None:
    token = waiting(engine, inbox, "j1")
    with api.client(token) as http:
        problem(http.get("/v1/jobs/acme/j1"), 401, "AuthenticationError")
        problem(http.get("/v1/jobs/acme/j1/events"), 401, "AuthenticationError")
    with api.as_role(Role.ADMIN) as http:
        problem(http.post("/v1/resume", json={}), 401, "InvalidTokenError")
    assert engine.job("acme", "j1").status == "waiting_event"


def test_no_token_or_two_different_ones_is_a_clear_problem(
    api: ApiServer, engine: Engine, inbox: Inbox
) -> None:
    token = waiting(engine, inbox, "j1")
    with api.client() as http:
        missing = problem(http.post("/v1/resume", json={}), 401, "InvalidTokenError")
        not_object = http.post("/v1/resume", json={"token": token, "payload": [1]})
    with api.client(token) as http:
        two = problem(http.post("/v1/resume", json={"token": token + "x"}), 400, "InvalidRequest")
    assert missing.startswith("a resume token is required")
    assert not_object.status_code == 400
    assert two == "two different resume tokens: send one"
    assert engine.job("acme", "j1").status == "waiting_event"


def test_a_token_superseded_by_a_reissue_is_refused_and_the_new_one_resumes(
    api: ApiServer, engine: Engine, inbox: Inbox
) -> None:
    old = waiting(engine, inbox, "j1")
    new = engine.reissue_token("acme", "j1", by="ops").token
    with api.client(old) as http:
        detail = problem(http.post("/v1/resume", json={}), 409, "TokenMismatchError")
    assert "superseded by a reissued one" in detail
    with api.client(new) as http:
        assert http.post("/v1/resume", json={}).status_code == 200
