"""Child jobs: a map step fans out one child per item and joins them, on both stores."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

from jobledger import Engine, JobStatus
from jobledger.job import Job
from jobledger.workflows.loader import parse_definition
from jobledger.workflows.resolver import DefinitionRegistry
from tests.support.engines import EngineFactory

TENANT = "acme"

CHILD = """
type: research_task
version: 1
start: work
steps:
  work: {kind: run_interaction_task, params: {task: research}, next: done}
  done: {kind: complete}
"""

FAILING_CHILD = """
type: doomed_task
version: 1
start: work
steps:
  work: {kind: fail, reason: "no sources found"}
"""


def parent(**map_fields: Any) -> str:
    fields = {
        "items_from": "topics",
        "workflow": "research_task",
        "version": 1,
        "input": {"topic": "$item", "brief": "$state.brief"},
        "results": "findings",
        "next": "done",
        **map_fields,
    }
    rendered = ", ".join(f"{k}: {_yaml(v)}" for k, v in fields.items())
    gave_up = (
        '  gave_up: {kind: fail, reason: "the join timed out"}' if "on_timeout" in fields else ""
    )
    return f"""
type: mission
version: 1
start: fan_out
steps:
  fan_out: {{kind: map, {rendered}}}
  done: {{kind: complete}}
{gave_up}
"""


def _yaml(value: Any) -> str:
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {_yaml(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list):
        return "[" + ", ".join(_yaml(v) for v in value) + "]"
    if isinstance(value, str) and (value.startswith("$") or " " in value):
        return f'"{value}"'
    return str(value)


def registry(*documents: str) -> DefinitionRegistry:
    return DefinitionRegistry(parse_definition(d, f"d{i}.yaml") for i, d in enumerate(documents))


def engine_for(make_engine: EngineFactory, *documents: str, **options: Any) -> Engine:
    return make_engine(registry=registry(CHILD, FAILING_CHILD, *documents), **options)


def children_of(engine: Engine, job_id: str) -> list[Job]:
    job = engine._load(TENANT, job_id)
    return [engine._load(TENANT, child) for child in sorted(job.children)]


def test_a_map_step_fans_out_and_joins_all_children(make_engine: EngineFactory) -> None:
    engine = engine_for(make_engine, parent())
    engine.submit(TENANT, "m1", "mission", input={"topics": ["a", "b", "c"], "brief": "x"})
    engine.run_until_idle()

    job = engine._load(TENANT, "m1")
    assert job.status is JobStatus.COMPLETED
    kids = children_of(engine, "m1")
    assert [k.job_id for k in kids] == ["m1.1.0", "m1.1.1", "m1.1.2"]
    assert all(k.status is JobStatus.COMPLETED for k in kids)
    assert [k.parent for k in kids] == [
        {"job_id": "m1", "step_number": 1, "index": i} for i in range(3)
    ]
    findings = job.state["findings"]
    assert [f["item"] for f in findings] == ["a", "b", "c"]
    assert [f["result"]["topic"] for f in findings] == ["a", "b", "c"]
    assert all(f["result"]["brief"] == "x" and f["status"] == "completed" for f in findings)
    # Each child ran one costly step (0.10): the parent counts what they spent.
    assert job.children_cost_usd == Decimal("0.30")
