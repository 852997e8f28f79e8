"""Batches over HTTP, against a real uvicorn server on SQLite and PostgreSQL: a dry run,
a batch run in the background and its progress, who may do which, bad input refused
with nothing written, and a batch a dead process left unfinished taken up at start."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import httpx

from jobledger import JobStatus, StepError, StepRequest
from jobledger.api.auth import Role
from jobledger.engine.engine import Engine
from tests.support.engines import CountingExecutor, writes
from tests.support.http import ApiServer, problem, start_api

TENANT = "acme"
BASE = f"/v1/tenants/{TENANT}/batches"
WAITING = {"status": ["waiting_event"]}


def waiting(engine: Engine, n: int) -> list[str]:
    ids = [f"w{i}" for i in range(n)]
    for job_id in ids:
        engine.submit(TENANT, job_id, "wait")
    engine.run_until_idle()
    return ids


def finished(http: httpx.Client, location: str) -> dict[str, Any]:
    deadline = time.monotonic() + 30
    while True:
        body: dict[str, Any] = http.get(location).json()
        if body["finished"]:
            return body
        assert time.monotonic() < deadline, body
        time.sleep(0.05)


def test_a_batch_is_202_runs_in_the_background_and_shows_its_progress(
    api: ApiServer, engine: Engine
) -> None:
    ids = waiting(engine, 3)
    with api.as_role(Role.OPERATOR, sub="olga") as http:
        started = http.post(BASE, json={"action": "cancel", "query": WAITING, "reason": "off"})
        assert started.status_code == 202, started.text
        body = started.json()
        assert (body["total"], body["by"], body["action"]) == (3, "olga", "cancel")
        location = started.headers["location"]
        assert location == f"{BASE}/{body['batch_id']}"
        done = finished(http, location)
    assert (done["applied"], done["skipped"], done["failed"], done["done"]) == (3, 0, 0, 3)
    assert sorted(o["job_id"] for o in done["outcomes"]) == ids
    assert {engine.job(TENANT, j).status for j in ids} == {JobStatus.CANCELLED}
    with api.as_role(Role.AUDITOR) as http:
        [row] = http.get(BASE).json()["batches"]
        assert (row["batch_id"], row["applied"], row["finished"]) == (body["batch_id"], 3, True)
        assert http.get(location).json() == done
    with api.as_role(Role.OPERATOR) as http:
        again = http.post(f"{location}/resume")
        assert again.status_code == 202 and again.json()["finished"] is True


def test_a_dry_run_is_200_with_the_count_and_a_sample_and_writes_nothing(
    api: ApiServer, engine: Engine
) -> None:
    waiting(engine, 2)
    before = writes(engine)
    with api.as_role(Role.OPERATOR) as http:
        answer = http.post(
            BASE,
            json={
                "action": "signal",
                "query": WAITING,
                "params": {"event_name": "invoice.paid"},
                "reason": "paid",
                "dry_run": True,
            },
        )
    assert answer.status_code == 200, answer.text
    assert answer.json()["count"] == 2
    assert {s["status"] for s in answer.json()["sample"]} == {"waiting_event"}
    assert writes(engine) == before


def test_bad_input_is_400_naming_what_was_wrong_and_writes_nothing(
    api: ApiServer, engine: Engine
) -> None:
    waiting(engine, 1)
    before = writes(engine)
    cases = [
        ({"action": "cancel", "query": {}}, "every job of the tenant"),
        ({"action": "cancel", "query": {"status": ["nope"]}}, "unknown status nope"),
        ({"action": "cancel", "query": {"colour": "red"}}, "colour"),
        ({"action": "delete", "query": WAITING}, "action"),
        ({"action": "signal", "query": WAITING, "params": {}}, "event name"),
        ({"action": "raise-budget", "query": WAITING, "params": {"max_steps": 0}}, "max_steps"),
        ({"action": "reset", "query": WAITING, "params": {}}, "reset needs step"),
        ({"action": "retry", "query": WAITING, "params": {"step": 1}}, "no parameter step"),
    ]
    with api.as_role(Role.ADMIN) as http:
        for body, words in cases:
            refused = problem(http.post(BASE, json={"reason": "r", **body}), 400)
            assert words in refused["detail"], refused
        assert problem(http.get(f"{BASE}/nope"), 404)["error"] == "UnknownBatchError"
    assert writes(engine) == before


def test_roles_operators_act_admins_migrate_every_role_reads_other_tenants_see_nothing(
    api: ApiServer, engine: Engine
) -> None:
    waiting(engine, 1)
    cancel = {"action": "cancel", "query": WAITING, "reason": "r"}
    migrate = {"action": "migrate", "query": WAITING, "params": {"to_version": 1}, "reason": "r"}
    for role in (Role.AUDITOR, Role.APPROVER):
        with api.as_role(role) as http:
            refused = problem(http.post(BASE, json=cancel), 403)
            assert "the operator role" in refused["detail"]
            assert http.get(BASE).status_code == 200
    with api.as_role(Role.OPERATOR) as http:
        assert "the admin role" in problem(http.post(BASE, json=migrate), 403)["detail"]
    with api.as_role(Role.ADMIN, tenant="other") as http:
        assert problem(http.post(BASE, json=cancel), 404)
        assert problem(http.get(BASE), 404)
    assert engine.bulk.batches(TENANT) == []
    with api.as_role(Role.ADMIN) as http:
        started = http.post(BASE, json=migrate)
        assert started.status_code == 202, started.text
        assert finished(http, started.headers["location"])["total"] == 1


def test_an_unfinished_batch_is_taken_up_when_the_api_starts(
    engine: Engine, tmp_path: Path
) -> None:
    ids = waiting(engine, 3)
    left = engine.bulk.start(TENANT, "cancel", WAITING, by="ops", reason="before a crash")
    assert engine.bulk.unfinished() == [(TENANT, left.batch_id)]
    with start_api(engine, tmp_path) as api, api.as_role(Role.AUDITOR) as http:
        done = finished(http, f"{BASE}/{left.batch_id}")
        assert done["applied"] == 3
        resumed = problem(http.post(f"{BASE}/{left.batch_id}/resume"), 403)
        assert "the operator role" in resumed["detail"]
    assert {engine.job(TENANT, j).status for j in ids} == {JobStatus.CANCELLED}


def test_an_operator_retries_the_failed_jobs_and_resets_the_others_by_step(
    api: ApiServer, engine: Engine, executor: CountingExecutor
) -> None:
    def fail(request: StepRequest) -> Exception | None:
        return StepError("bug", retryable=False) if request.step_number == 3 else None

    executor.fail_with = fail
    for job_id in ("f0", "f1"):
        engine.submit(TENANT, job_id, "agent3")
    engine.run_until_idle()
    executor.fail_with = None
    waiting(engine, 1)
    retry = {"action": "retry", "query": {"workflow_type": "agent3"}, "reason": "fixed"}
    reset = {"action": "reset", "query": WAITING, "params": {"step": 1}, "reason": "again"}
    with api.as_role(Role.OPERATOR, sub="olga") as http:
        started = http.post(BASE, json=retry)
        assert started.status_code == 202, started.text
        retried = finished(http, started.headers["location"])
        rewound = finished(http, http.post(BASE, json=reset).headers["location"])
    assert (retried["applied"], retried["skipped"], retried["params"]) == (
        2,
        0,
        {"to_version": None},
    )
    assert (rewound["applied"], rewound["params"]) == (1, {"step": 1, "to_version": None})
    engine.run_until_idle()
    assert {engine.job(TENANT, j).status for j in ("f0", "f1")} == {JobStatus.COMPLETED}
    assert engine.job(TENANT, "w0").status is JobStatus.WAITING_EVENT
    assert [e.event_type for e in engine.history(TENANT, "w0")].count("Reset") == 1
