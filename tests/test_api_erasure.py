"""Erasure over the HTTP API, on a real uvicorn server (SQLite and PostgreSQL): ``POST
/v1/tenants/{tenant}/erasures`` by subject or by job (admin; the erasing caller recorded,
never a body field), and ``data_subject`` on submit. Every refusal writes nothing."""

from __future__ import annotations

from datetime import datetime
from typing import Any

import httpx
import pytest

from jobledger import linear_workflow
from jobledger.api.auth import Role
from jobledger.domain.erasure import ERASED
from jobledger.engine.engine import Engine
from tests.support.engines import EngineFactory, agent_steps
from tests.support.http import PROBLEM, ApiServer, api_key, api_registry, token

ERASURES = "/v1/tenants/acme/erasures"
ADA = {"customer": {"email": "ada@example.com", "plan": "gold"}}


@pytest.fixture
def engine(make_engine: EngineFactory) -> Engine:
    registry = api_registry()
    registry.register(
        "profile", 1, linear_workflow(agent_steps(1)), personal_data=("customer.email",)
    )
    return make_engine(registry=registry)


def problem(response: httpx.Response, status: int, error: str) -> str:
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == PROBLEM
    body: dict[str, Any] = response.json()
    assert body["error"] == error, body
    detail: str = body["detail"]
    return detail


def submit(api: ApiServer, job_id: str, subject: str | None = None) -> None:
    body = {"workflow_type": "profile", "job_id": job_id, "input": ADA}
    if subject is not None:
        body["data_subject"] = subject
    with api.as_role(Role.OPERATOR) as http:
        assert http.post("/v1/jobs/acme", json=body).status_code == 201


def email(engine: Engine, job_id: str) -> str:
    found: str = engine.job("acme", job_id).state["customer"]["email"]
    return found


def test_an_admin_erases_a_job_and_a_subject_recorded_as_the_caller(
    api: ApiServer, engine: Engine
) -> None:
    submit(api, "anon")
    submit(api, "s1", "ada")
    submit(api, "s2", "ada")
    engine.run_until_idle()
    with api.as_role(Role.ADMIN, sub="dpo@acme") as http:
        by_job = http.post(ERASURES, json={"job_id": "anon", "reason": "art. 17 #7"})
        assert by_job.status_code == 200, by_job.text
        erased = by_job.json()
        assert (erased["tenant"], erased["erased"], erased["already_erased"]) == (
            "acme",
            ["anon"],
            [],
        )
        assert len(erased["keys"]) == 1 and datetime.fromisoformat(erased["erased_at"])
        job = http.get("/v1/jobs/acme/anon").json()
        assert job["state"]["customer"] == {"email": ERASED, "plan": "gold"}
        assert email(engine, "s1") == "ada@example.com"  # the subject's jobs are untouched

        by_subject = http.post(ERASURES, json={"subject": "ada", "reason": "art. 17 #8"})
        assert by_subject.status_code == 200, by_subject.text
        assert sorted(by_subject.json()["erased"]) == ["s1", "s2"]
        assert http.get("/v1/tenants/acme/verify").json()["intact"] is True
    assert email(engine, "s2") == ERASED
    last = engine.history("acme", "anon")[-1]
    assert last.event_type == "Erased"
    assert (last.data["erased_by"], last.data["reason"]) == ("dpo@acme", "art. 17 #7")


def test_refused_erasures_are_404_409_or_400_and_write_nothing(
    api: ApiServer, engine: Engine
) -> None:
    submit(api, "anon")
    submit(api, "s1", "ada")
    engine.submit("acme", "plain", "agent3")
    engine.run_until_idle()
    before = {job: engine.history("acme", job) for job in ("anon", "s1", "plain")}
    with api.as_role(Role.ADMIN) as http:

        def erase(body: dict[str, Any]) -> httpx.Response:
            return http.post(ERASURES, json={"reason": "asked", **body})

        assert problem(erase({"subject": "nobody"}), 404, "UnknownSubjectError") == (
            "tenant 'acme' has no such data subject"
        )
        missing = problem(erase({"job_id": "nope"}), 404, "UnknownJobError")
        assert missing == "no job 'nope' for tenant 'acme'"
        shared = problem(erase({"job_id": "s1"}), 409, "SubjectKeyError")
        assert "erase the data subject" in shared and "ada" not in shared
        plain = problem(erase({"job_id": "plain"}), 409, "NoPersonalDataError")
        assert "declares no personal_data" in plain

        malformed: list[dict[str, Any]] = [
            {"subject": "ada", "job_id": "s1", "reason": "both"},
            {"reason": "neither"},
            {"job_id": "anon"},  # no reason
            {"job_id": "anon", "reason": ""},
            {"job_id": "anon", "reason": "r", "erased_by": "mallory"},  # never a field
        ]
        for body in malformed:
            problem(http.post(ERASURES, json=body), 400, "InvalidRequest")
        detail = problem(erase({"subject": "a\nda"}), 400, "InvalidPayloadError")
        assert detail == "a data subject must not contain control characters"
        assert {job: engine.history("acme", job) for job in before} == before

        assert erase({"job_id": "anon"}).status_code == 200
        again = problem(erase({"job_id": "anon"}), 409, "JobErasedError")
        assert again.startswith("job 'anon' of tenant 'acme' was already erased at ")
        assert erase({"subject": "ada"}).status_code == 200
        problem(erase({"subject": "ada"}), 409, "SubjectErasedError")
        problem(erase({"job_id": "s1"}), 409, "JobErasedError")
    assert [e.event_type for e in engine.history("acme", "anon")].count("Erased") == 1


def test_only_an_admin_of_the_tenant_may_erase(api: ApiServer, engine: Engine) -> None:
    submit(api, "anon")
    before = engine.history("acme", "anon")
    body = {"job_id": "anon", "reason": "asked"}
    for role in (Role.OPERATOR, Role.APPROVER, Role.AUDITOR):
        with api.as_role(role) as http:
            detail = problem(http.post(ERASURES, json=body), 403, "Forbidden")
        assert "the admin role in tenant 'acme'" in detail
    # Another tenant's admin is told what a missing job gets (tenants do not leak).
    for credential in (api_key("globex", Role.ADMIN), token(tenants="globex", roles="admin")):
        with api.client(credential) as http:
            detail = problem(http.post(ERASURES, json=body), 404, "UnknownJobError")
            assert detail == "no job 'anon' for tenant 'acme'"
            subject = {"subject": "ada", "reason": "asked"}
            problem(http.post(ERASURES, json=subject), 404, "UnknownTenant")
    with api.client() as http:
        problem(http.post(ERASURES, json=body), 401, "AuthenticationError")
    assert engine.history("acme", "anon") == before
    assert email(engine, "anon") == "ada@example.com"


def test_submit_takes_a_data_subject_only_for_a_workflow_with_personal_data(
    api: ApiServer, engine: Engine
) -> None:
    submit(api, "s1", "ada")
    assert email(engine, "s1") == "ada@example.com"
    with api.as_role(Role.OPERATOR) as http:
        body = {"workflow_type": "agent3", "job_id": "p", "data_subject": "ada"}
        detail = problem(http.post("/v1/jobs/acme", json=body), 400, "InvalidPayloadError")
        assert "declares no personal_data" in detail
        empty = {"workflow_type": "profile", "job_id": "e", "data_subject": ""}
        problem(http.post("/v1/jobs/acme", json=empty), 400, "InvalidRequest")
    with api.as_role(Role.ADMIN) as http:
        erased = http.post(ERASURES, json={"subject": "ada", "reason": "asked"})
        assert erased.status_code == 200 and erased.json()["erased"] == ["s1"]
