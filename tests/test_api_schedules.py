"""Schedules over HTTP, against a real uvicorn server on SQLite and PostgreSQL: create,
read, list, pause, resume, trigger, delete and history; who may do which; bad input
refused naming what was wrong, with nothing written."""

from __future__ import annotations

import uuid
from typing import Any
from urllib.parse import quote

import httpx
import pytest

from jobledger.api.auth import Role
from jobledger.api.paths import id_path
from jobledger.domain.identity import schedule_uuid
from jobledger.engine.engine import Engine
from tests.support.http import ApiServer, api_key, problem, token

TENANT = "acme"
BASE = f"/v1/tenants/{TENANT}/schedules"
DAILY = {
    "cron": "0 7 * * *",
    "timezone": "Europe/Paris",
    "workflow_type": "agent3",
    "input": {"report": "daily"},
}
"""07:00 in Paris: 06:00 UTC in winter (the FakeClock starts on 2026-01-01 00:00 UTC)."""


def at(name: str, tail: str = "") -> str:
    return f"{BASE}/{quote(name, safe='')}{tail}"


def create(api: ApiServer, name: str, **fields: Any) -> httpx.Response:
    with api.as_role(Role.OPERATOR) as http:
        return http.post(BASE, json={"name": name, **DAILY, **fields})


def events(engine: Engine, name: str) -> list[str]:
    return [entry.event_type for entry in engine.schedules.history(TENANT, name)]


def test_a_schedule_is_created_read_listed_and_its_next_firing_given_in_utc_and_local(
    api: ApiServer,
) -> None:
    made = create(api, "reports/daily", catch_up="all", catch_up_max=3, overlap="skip")
    assert made.status_code == 201, made.text
    assert made.headers["location"] == at("reports/daily")
    body = made.json()
    assert body["state"] == "active" and body["input"] == {"report": "daily"}
    assert (body["catch_up"], body["catch_up_max"], body["overlap"]) == ("all", 3, "skip")
    assert body["next_fire_at"] == "2026-01-01T06:00:00Z"
    assert body["next_fire_local"] == "2026-01-01T07:00:00+01:00"

    with api.as_role(Role.AUDITOR) as http:
        assert http.get(at("reports/daily")).json() == body
        listed = http.get(BASE).json()["schedules"]
        history = http.get(at("reports/daily", "/history")).json()["events"]
    assert [(s["name"], s["state"], s["workflow_type"]) for s in listed] == [
        ("reports/daily", "active", "agent3")
    ]
    assert listed[0]["next_fire_at"] == body["next_fire_at"]
    assert listed[0]["next_fire_local"] == body["next_fire_local"]
    assert [e["event_type"] for e in history] == ["Created"]
    assert history[0]["data"]["cron"] == "0 7 * * *"


def test_pause_resume_trigger_and_delete_change_it_and_a_command_that_does_not_apply_is_409(
    api: ApiServer, engine: Engine
) -> None:
    assert create(api, "s").status_code == 201
    with api.as_role(Role.OPERATOR) as http:
        paused = http.post(at("s", "/pause")).json()
        assert paused["state"] == "paused" and paused["next_fire_at"] is None
        again = problem(http.post(at("s", "/pause")), 409)
        assert again["error"] == "ScheduleStateError" and "it is paused" in again["detail"]
        assert http.get(BASE).json()["schedules"][0]["next_fire_at"] is None
        assert http.post(at("s", "/resume")).json()["state"] == "active"

        fired = http.post(at("s", "/trigger"))
        # A new job, as a submit answers one: 201, and where the job is.
        assert fired.status_code == 201, fired.text
        job_id = fired.json()["job_id"]
        assert fired.headers["Location"] == f"/v1/jobs/{id_path(TENANT, job_id)}"
        assert http.get(fired.headers["Location"]).json()["job_id"] == job_id
        assert fired.json()["schedule"]["last_job_id"] == job_id
        assert engine.job(TENANT, job_id).workflow_type == "agent3"
        history = http.get(at("s", "/history")).json()["events"]
        assert history[-1]["event_type"] == "Fired"
        assert history[-1]["data"]["job_id"] == job_id
        assert history[-1]["data"]["trigger"] == "manual"

        assert http.delete(at("s")).json()["state"] == "deleted"
        assert http.get(BASE).json()["schedules"] == []
        kept = http.get(BASE, params={"deleted": "true"}).json()["schedules"]
        assert [(s["name"], s["state"]) for s in kept] == [("s", "deleted")]
        gone = problem(http.post(at("s", "/resume")), 409)
        assert "was deleted" in gone["detail"]
        taken = problem(http.post(BASE, json={"name": "s", **DAILY}), 409)
        assert taken["error"] == "ScheduleExistsError" and "keeps its name" in taken["detail"]
    assert events(engine, "s") == ["Created", "Paused", "Resumed", "Fired", "Deleted"]


def test_a_name_taken_is_409_and_an_unknown_schedule_404(api: ApiServer) -> None:
    assert create(api, "s").status_code == 201
    taken = problem(create(api, "s"), 409)
    assert taken["error"] == "ScheduleExistsError" and "'s'" in taken["detail"]
    with api.as_role(Role.OPERATOR) as http:
        for method, tail in (("GET", ""), ("POST", "/pause"), ("DELETE", ""), ("GET", "/history")):
            missing = problem(http.request(method, at("nope", tail)), 404)
            assert missing["error"] == "UnknownScheduleError"
            assert missing["detail"] == "no schedule 'nope' for tenant 'acme'"


BAD = [
    ({"cron": "0 25 * * *"}, "hour"),
    ({"cron": "every day"}, "cron"),
    ({"timezone": "Mars/Olympus"}, "Mars/Olympus"),
    ({"catch_up": "all"}, "needs its bound"),
    ({"catch_up": "one", "catch_up_max": 3}, "catch-up-max applies"),
    ({"catch_up": "sometimes"}, "catch_up"),
    ({"overlap": "queue"}, "overlap"),
    ({"catch_up": "all", "catch_up_max": 0}, "catch_up_max"),
    ({"workflow_type": "nope"}, "nope"),
    ({"workflow_version": 9}, "v9"),
    ({"input": [1, 2]}, "input"),
    ({"colour": "red"}, "colour"),
    ({"name": "x" * 101}, "name"),
]


@pytest.mark.parametrize(("fields", "named"), BAD, ids=[str(i) for i in range(len(BAD))])
def test_bad_input_is_400_naming_what_was_wrong_and_writes_nothing(
    api: ApiServer, engine: Engine, fields: dict[str, Any], named: str
) -> None:
    name = str(fields.get("name", "bad"))
    body = problem(create(api, **{"name": "bad", **fields}), 400)
    assert named in body["detail"], body
    assert engine.store.load_schedule(schedule_uuid(TENANT, name)) is None
    with api.as_role(Role.AUDITOR) as http:
        assert http.get(BASE).json()["schedules"] == []


def test_only_operators_and_admins_change_schedules_and_every_role_reads_them(
    api: ApiServer, engine: Engine
) -> None:
    assert create(api, "s").status_code == 201
    changes = [("POST", "/pause"), ("POST", "/resume"), ("POST", "/trigger"), ("DELETE", "")]
    for role in (Role.AUDITOR, Role.APPROVER):
        with api.as_role(role) as http:
            for method, tail in changes:
                refused = problem(http.request(method, at("s", tail)), 403)
                assert refused["error"] == "Forbidden" and "the operator role" in refused["detail"]
            assert problem(http.post(BASE, json={"name": "t", **DAILY}), 403)
            for tail in ("", "/history"):
                assert http.get(at("s", tail)).status_code == 200
            assert http.get(BASE).status_code == 200
    assert events(engine, "s") == ["Created"]
    with api.as_role(Role.ADMIN) as http:
        assert http.post(at("s", "/pause")).json()["state"] == "paused"
    with api.client() as http:
        assert problem(http.get(BASE), 401)["error"] == "AuthenticationError"


def test_another_tenants_caller_gets_404_as_for_no_such_schedule_and_writes_nothing(
    api: ApiServer, engine: Engine
) -> None:
    assert create(api, "s").status_code == 201
    calls = [
        ("GET", at("s")),
        ("GET", at("s", "/history")),
        ("POST", at("s", "/pause")),
        ("POST", at("s", "/resume")),
        ("POST", at("s", "/trigger")),
        ("DELETE", at("s")),
    ]
    for role in Role:
        for credential in (api_key("globex", role), token(tenants="globex", roles=str(role))):
            with api.client(credential) as http:
                for method, path in calls:
                    body = problem(http.request(method, path), 404)
                    # Word for word what a schedule that does not exist gets.
                    assert body["detail"] == "no schedule 's' for tenant 'acme'"
                    assert body["error"] == "UnknownScheduleError"
                assert problem(http.get(BASE), 404)["error"] == "UnknownTenant"
                name = f"g-{uuid.uuid4().hex[:6]}"
                assert problem(http.post(BASE, json={"name": name, **DAILY}), 404)
    assert events(engine, "s") == ["Created"]
    with api.as_role(Role.AUDITOR) as http:
        assert [s["name"] for s in http.get(BASE).json()["schedules"]] == ["s"]
