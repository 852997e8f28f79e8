"""Export streamed as JSON lines and replay against a posted definition (auditor), against
a real uvicorn server on SQLite and PostgreSQL."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from jobledger import Engine, JobStatus
from jobledger.api.auth import Role
from jobledger.audit import export as exporting
from jobledger.workflows import DefinitionRegistry
from tests.support.audit import MISSION_V1, ScoringAgent, definition, mission
from tests.support.engines import EngineFactory, store_of
from tests.support.http import ApiServer, token


@pytest.fixture
def engine(make_engine: EngineFactory) -> Engine:
    """Missions waiting for their payment: two in acme, one in globex."""
    engine = make_engine(
        registry=DefinitionRegistry([definition(MISSION_V1)]), executor=ScoringAgent()
    )
    for tenant, job in (("acme", "a1"), ("acme", "a2"), ("globex", "g1")):
        engine.submit(tenant, job, "mission")
    engine.run_until_idle()
    assert engine.job("acme", "a1").status is JobStatus.WAITING_EVENT
    return engine


def test_a_tenants_export_streams_its_jobs_as_json_lines_that_import_elsewhere(
    api: ApiServer, engine: Engine, make_engine: EngineFactory, fresh_store_url: str,
    tmp_path: Path,
) -> None:  # fmt: skip
    path = tmp_path / "acme.jsonl"
    with api.as_role(Role.AUDITOR) as http, http.stream("GET", "/v1/tenants/acme/export") as got:
        assert got.status_code == 200
        assert got.headers["content-type"].startswith("application/jsonl")
        assert "acme.jsonl" in got.headers["content-disposition"]
        with path.open("wb") as out:
            for chunk in got.iter_bytes():
                out.write(chunk)
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    *events, manifest = lines
    assert {(e["tenant"], e["job"]) for e in events} == {("acme", "a1"), ("acme", "a2")}
    assert manifest["record"] == "manifest" and manifest["jobs"] == 2
    assert manifest["events"] == len(events) and manifest["broken"] == []
    # What was streamed is a whole export: another store loads it, chains and all.
    target = make_engine(config={"store_url": fresh_store_url})
    summary = exporting.import_file(store_of(target), path)
    assert (summary.jobs, summary.events) == (2, len(events))
    assert target.job("acme", "a1").version == engine.job("acme", "a1").version


def test_one_jobs_export_and_who_may_export(api: ApiServer, engine: Engine) -> None:
    with api.as_role(Role.AUDITOR) as http:
        one = http.get("/v1/jobs/acme/a1/export")
        missing = http.get("/v1/jobs/acme/nope/export")
    with api.as_role(Role.OPERATOR) as http:
        operator = http.get("/v1/tenants/acme/export")
    with api.client(token(tenants="globex", roles="admin")) as http:
        hidden = http.get("/v1/tenants/acme/export")
        hidden_job = http.get("/v1/jobs/acme/a1/export")
    *events, manifest = [json.loads(line) for line in one.text.splitlines()]
    assert {e["job"] for e in events} == {"a1"} and manifest["jobs"] == 1
    assert missing.status_code == 404 and missing.json()["error"] == "UnknownJobError"
    assert operator.status_code == 403
    assert hidden.status_code == hidden_job.status_code == 404
    assert hidden_job.json() == {**missing.json(), "detail": "no job 'a1' for tenant 'acme'",
                                 "instance": "/v1/jobs/acme/a1/export"}  # fmt: skip


def post_definition(http: Any, path: str, text: str, kind: str = "application/yaml") -> Any:
    return http.post(path, content=text.encode(), headers={"Content-Type": kind})


def test_replay_against_a_posted_definition_returns_the_diff(
    api: ApiServer, engine: Engine
) -> None:
    changed = mission(2, ("value: 0.8}, next: payment", "value: 0.6}, next: payment"))
    as_json = definition(mission(2)).model_dump(mode="json", exclude_unset=True)
    with api.as_role(Role.AUDITOR) as http:
        diverged = post_definition(http, "/v1/jobs/acme/a1/replay", changed)
        same = post_definition(
            http, "/v1/jobs/acme/a1/replay", json.dumps(as_json), "application/json"
        )
        tenant = post_definition(http, "/v1/tenants/acme/replay", changed)
    assert diverged.status_code == 200, diverged.text
    report = diverged.json()
    assert (report["tenant"], report["job"], report["safe"]) == ("acme", "a1", False)
    assert report["diverged_at_step"] == 4 and report["definition_version"] == 2
    step = report["steps"][3]
    assert step["outcome"] == "different next step"
    assert "next 'revise'" in step["recorded"]["description"]
    assert "next 'payment'" in step["replayed"]["description"]
    assert same.status_code == 200, same.text
    assert same.json()["safe"] is True and same.json()["verdict"].startswith("safe to migrate")
    assert [(r["tenant"], r["job"]) for r in tenant.json()] == [("acme", "a1"), ("acme", "a2")]
    assert engine.job("acme", "a1").status is JobStatus.WAITING_EVENT  # nothing ran


def test_an_invalid_definition_or_a_caller_without_the_role_is_refused(
    api: ApiServer, engine: Engine
) -> None:
    broken = mission(2, ("default: revise", "default: nowhere"))
    with api.as_role(Role.AUDITOR) as http:
        invalid = post_definition(http, "/v1/jobs/acme/a1/replay", broken)
        not_yaml = post_definition(http, "/v1/jobs/acme/a1/replay", "x", "text/plain")
    with api.as_role(Role.OPERATOR) as http:
        operator = post_definition(http, "/v1/jobs/acme/a1/replay", mission(2))
    with api.client(token(tenants="globex", roles="auditor")) as http:
        hidden = post_definition(http, "/v1/jobs/acme/a1/replay", mission(2))
    assert invalid.status_code == 400 and invalid.json()["error"] == "DefinitionError"
    assert "nowhere" in invalid.json()["detail"]
    assert not_yaml.status_code == 415
    assert operator.status_code == 403
    assert hidden.status_code == 404 and hidden.json()["error"] == "UnknownJobError"
