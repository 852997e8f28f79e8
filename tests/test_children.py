"""Child jobs: a map step fans out one child per item and joins them, on both stores."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from datetime import timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from jobledger import Engine, EngineConfig, FunctionRegistry, JobStatus, Resolution, linear_workflow
from jobledger.adapters.clock import FakeClock, SystemClock
from jobledger.adapters.event_store import EventSourcedJobStore
from jobledger.adapters.kafka.messages import TickMessage
from jobledger.adapters.kafka.worker import KafkaWorker
from jobledger.adapters.local_queue import LocalQueue
from jobledger.adapters.locks import lock_for
from jobledger.adapters.ops import MemoryOps
from jobledger.adapters.store_url import parse_store_url
from jobledger.audit import export as exporting
from jobledger.audit import verifier
from jobledger.config import ConcurrencyLimit
from jobledger.domain.identity import job_uuid, step_key
from jobledger.domain.job import Job
from jobledger.orchestration.child_jobs import Family
from jobledger.orchestration.orchestrator import TickReport
from jobledger.orchestration.reconciler import Reconciler
from jobledger.projections import JobViews
from jobledger.runtime.embedded_runner import EmbeddedRunner
from jobledger.workflows.definition import DefinitionError
from jobledger.workflows.loader import parse_definition
from jobledger.workflows.resolver import DefinitionRegistry
from tests.support import pythonpath, spawn_worker
from tests.support.cli import make_cli
from tests.support.crash_worker import read_counts
from tests.support.engines import TOKEN_SECRET, CountingExecutor, EngineFactory, open_engine
from tests.support.http import start_api, token
from tests.support.kafka_broker import KafkaTopics, wait_for
from tests.support.scrape import total, value
from tests.test_console_http import signed_in
from tests.test_metrics import scraped

TENANT = "acme"

CHILD = """
type: research_task
version: 1
start: check
steps:
  check:
    kind: branch
    cases:
      - {when: {path: topic, op: "==", value: bad}, next: broken}
      - {when: {path: topic, op: "==", value: slow}, next: stall}
    default: work
  work: {kind: run_interaction_task, params: {task: research}, next: done}
  stall: {kind: wait_event, event: never, next: done}
  broken: {kind: fail, reason: "no sources found"}
  done: {kind: complete}
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
    return make_engine(registry=registry(CHILD, *documents), **options)


def children_of(engine: Engine, job_id: str) -> list[Job]:
    job = engine.jobs.load(TENANT, job_id)
    return [engine.jobs.load(TENANT, child) for child in sorted(job.children)]


def test_a_map_step_fans_out_and_joins_all_children(make_engine: EngineFactory) -> None:
    engine = engine_for(make_engine, parent())
    engine.submit(TENANT, "m1", "mission", input={"topics": ["a", "b", "c"], "brief": "x"})
    engine.run_until_idle()

    job = engine.jobs.load(TENANT, "m1")
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


def statuses(engine: Engine, job_id: str) -> dict[str, JobStatus]:
    return {child.job_id: child.status for child in children_of(engine, job_id)}


def results_by_status(engine: Engine, job_id: str) -> list[str]:
    return [entry["status"] for entry in engine.jobs.load(TENANT, job_id).state["findings"]]


def test_fail_fast_fails_the_parent_and_cancels_the_children_still_running(
    make_engine: EngineFactory,
) -> None:
    engine = engine_for(make_engine, parent())
    engine.submit(TENANT, "m", "mission", input={"topics": ["bad", "slow", "slow"], "brief": "x"})
    engine.run_until_idle()

    job = engine.jobs.load(TENANT, "m")
    assert job.status is JobStatus.FAILED
    assert job.last_error == "child m.1.0 failed: no sources found"
    assert statuses(engine, "m") == {
        "m.1.0": JobStatus.FAILED,
        "m.1.1": JobStatus.CANCELLED,
        "m.1.2": JobStatus.CANCELLED,
    }


def test_collect_keeps_failures_as_results_and_goes_on(make_engine: EngineFactory) -> None:
    engine = engine_for(make_engine, parent(on_failure="collect"))
    engine.submit(TENANT, "m", "mission", input={"topics": ["bad", "a"], "brief": "x"})
    engine.run_until_idle()

    job = engine.jobs.load(TENANT, "m")
    assert job.status is JobStatus.COMPLETED
    bad, good = job.state["findings"]
    assert bad == {
        "job_id": "m.1.0",
        "item": "bad",
        "status": "failed",
        "error": "no sources found",
    }
    assert good["status"] == "completed" and good["result"]["topic"] == "a"


def test_join_any_goes_on_with_the_first_child_and_cancels_the_rest(
    make_engine: EngineFactory,
) -> None:
    engine = engine_for(make_engine, parent(join="any"))
    engine.submit(TENANT, "m", "mission", input={"topics": ["slow", "a", "slow"], "brief": "x"})
    engine.run_until_idle()

    assert engine.jobs.load(TENANT, "m").status is JobStatus.COMPLETED
    assert results_by_status(engine, "m") == ["unfinished", "completed", "unfinished"]
    assert statuses(engine, "m") == {
        "m.1.0": JobStatus.CANCELLED,
        "m.1.1": JobStatus.COMPLETED,
        "m.1.2": JobStatus.CANCELLED,
    }


def test_join_n_fails_once_too_few_children_can_complete(make_engine: EngineFactory) -> None:
    engine = engine_for(make_engine, parent(join=2, on_failure="collect"))
    engine.submit(TENANT, "m", "mission", input={"topics": ["bad", "slow", "bad"], "brief": "x"})
    engine.run_until_idle()

    job = engine.jobs.load(TENANT, "m")
    assert job.status is JobStatus.FAILED
    assert job.last_error == "only 1 children can still complete; join 2"
    assert statuses(engine, "m")["m.1.1"] is JobStatus.CANCELLED


def test_a_join_that_times_out_takes_on_timeout_with_the_results_so_far(
    make_engine: EngineFactory, clock: FakeClock
) -> None:
    engine = engine_for(make_engine, parent(timeout=60, on_timeout="gave_up", on_failure="collect"))
    engine.submit(TENANT, "m", "mission", input={"topics": ["a", "slow"], "brief": "x"})
    engine.run_until_idle()
    assert engine.jobs.load(TENANT, "m").status is JobStatus.WAITING_CHILDREN

    clock.advance(timedelta(seconds=61))
    engine.run_until_idle(wait_for_timers=True)

    job = engine.jobs.load(TENANT, "m")
    assert job.status is JobStatus.FAILED and job.last_error == "the join timed out"
    assert results_by_status(engine, "m") == ["completed", "unfinished"]
    assert statuses(engine, "m")["m.1.1"] is JobStatus.CANCELLED


def test_cancelling_a_parent_cancels_its_unfinished_children(make_engine: EngineFactory) -> None:
    engine = engine_for(make_engine, parent())
    engine.submit(TENANT, "m", "mission", input={"topics": ["a", "slow"], "brief": "x"})
    engine.run_until_idle()
    assert statuses(engine, "m") == {"m.1.0": JobStatus.COMPLETED, "m.1.1": JobStatus.WAITING_EVENT}

    engine.cancel(TENANT, "m", reason="not needed", by="ops")

    assert statuses(engine, "m") == {"m.1.0": JobStatus.COMPLETED, "m.1.1": JobStatus.CANCELLED}
    cancelled = engine.history(TENANT, "m.1.1")[-1]
    assert cancelled.event_type == "Cancelled"
    assert cancelled.data["reason"] == "parent m is cancelled"


def test_childrens_cost_counts_toward_the_parents_budget(make_engine: EngineFactory) -> None:
    engine = engine_for(make_engine, parent())
    budget = {"max_cost_usd": "0.25"}
    engine.submit(
        TENANT, "m", "mission", input={"topics": ["a", "b", "c"], "brief": "x"}, budget=budget
    )
    engine.run_until_idle()

    job = engine.jobs.load(TENANT, "m")
    # Three children at 0.10 each: the join is met, then the parent is parked, not completed.
    assert job.status is JobStatus.BUDGET_EXCEEDED
    assert job.last_error == "budget max_cost_usd reached: 0.30 of 0.25"
    # Each child may spend what the parent had left when it was spawned.
    assert engine.jobs.load(TENANT, "m.1.0").budget.max_cost_usd == Decimal("0.25")


def test_a_redelivered_tick_spawns_no_second_child(make_engine: EngineFactory) -> None:
    engine = engine_for(make_engine, parent())
    engine.submit(TENANT, "m", "mission", input={"topics": ["slow", "slow"], "brief": "x"})
    engine.run_until_idle()
    before = [len(engine.history(TENANT, c)) for c in ("m.1.0", "m.1.1")]

    for _ in range(3):
        engine.tick(TENANT, "m", "redelivered")
        engine.run_until_idle()

    assert [len(engine.history(TENANT, c)) for c in ("m.1.0", "m.1.1")] == before
    parent_history = [e.event_type for e in engine.history(TENANT, "m")]
    assert parent_history.count("ChildrenSpawned") == 1


class Crash(Exception):
    """The process died here."""


def test_a_crash_between_a_childs_end_and_its_report_is_repaired_by_the_reconciler(
    make_engine: EngineFactory,
    store_url: str,
    clock: FakeClock,
    ops: MemoryOps,
    executor: CountingExecutor,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    crashing = engine_for(make_engine, parent())
    crashing.submit(TENANT, "m", "mission", input={"topics": ["a", "b"], "brief": "x"})
    crashing.tick(TENANT, "m")  # the map step: children spawned, their ticks queued

    def crash(self: Family, child: Job) -> None:
        raise Crash(child.job_id)

    monkeypatch.setattr(Family, "_notify_parent", crash)
    with pytest.raises(Crash):
        crashing.tick(TENANT, "m.1.0")
    monkeypatch.undo()
    # The child's end committed; its parent never heard. The process and its queue are gone.
    assert crashing.jobs.load(TENANT, "m.1.0").status is JobStatus.COMPLETED
    assert crashing.jobs.load(TENANT, "m").children["m.1.0"]["end"] is None

    queue = LocalQueue(clock)
    fresh = engine_for(make_engine, parent(), queue=queue)
    assert isinstance(fresh.store, EventSourcedJobStore)
    views = JobViews(fresh.store)
    reconciler = Reconciler(
        views=views,
        queue=queue,
        clock=clock,
        lock=lock_for(parse_store_url(store_url), "reconciler"),
        ops=ops,
    )
    clock.advance(timedelta(seconds=31))
    views.catch_up()
    assert reconciler.reconcile().enqueued == 2  # the waiting parent and the lost child tick
    fresh.run_until_idle()
    reconciler.stop()

    job = fresh.jobs.load(TENANT, "m")
    assert job.status is JobStatus.COMPLETED
    assert results_by_status(fresh, "m") == ["completed", "completed"]
    tenant_jobs = sorted(row.job_id for row in views.jobs(limit=100) if row.tenant_id == TENANT)
    assert tenant_jobs == ["m", "m.1.0", "m.1.1"]
    # Each child's one side effect ran once: nothing was spawned or run twice.
    child_calls = {k: n for k, n in executor.calls.items() if "m.1." in k}
    assert sorted(child_calls.values()) == [1, 1]
    assert [e.event_type for e in fresh.history(TENANT, "m")].count("ChildFinished") == 2


def test_replay_verify_and_export_import_keep_the_family(
    make_engine: EngineFactory, fresh_store_url: str, tmp_path: Path
) -> None:
    engine = engine_for(make_engine, parent())
    engine.submit(TENANT, "m", "mission", input={"topics": ["a", "b"], "brief": "x"})
    engine.run_until_idle()

    report = engine.replay(TENANT, "m")
    assert report.safe, report.verdict
    spawn = report.steps[0]
    assert spawn.recorded.wait is not None
    assert [c["job_id"] for c in spawn.recorded.wait["children"]] == ["m.1.0", "m.1.1"]
    # Another item list would spawn other children: replay says so.
    changed = parse_definition(parent(items_from="brief"), "changed.yaml")
    assert not engine.replay(TENANT, "m", changed).safe
    assert all(engine.verify(TENANT, job) is None for job in ("m", "m.1.0", "m.1.1"))

    path = tmp_path / "family.jsonl"
    store = engine.store
    assert isinstance(store, EventSourcedJobStore)
    with path.open("w") as out:
        exporting.export_jobs(store, out, exporting.Selection(TENANT), engine.clock.now())
    assert verifier.verify(path).verified

    target = engine_for(make_engine, parent(), store_url=fresh_store_url)
    assert isinstance(target.store, EventSourcedJobStore)
    exporting.import_file(target.store, path)
    imported = target.jobs.load(TENANT, "m")
    assert sorted(imported.children) == ["m.1.0", "m.1.1"]
    assert target.jobs.load(TENANT, "m.1.1").parent == {"job_id": "m", "step_number": 1, "index": 1}
    assert imported.state["findings"] == engine.jobs.load(TENANT, "m").state["findings"]


def test_the_verifier_finds_a_child_its_parent_never_spawned(
    make_engine: EngineFactory, tmp_path: Path
) -> None:
    engine = engine_for(make_engine, parent())
    engine.submit(TENANT, "m", "mission", input={"topics": ["a"], "brief": "x"})
    engine.run_until_idle()
    # A job that claims the parent, without being among its children.
    engine.submission(
        TENANT, "stray", "research_task", input={"topic": "a"}, parent={"job_id": "m"}
    )
    store = engine.store
    assert isinstance(store, EventSourcedJobStore)
    path = tmp_path / "family.jsonl"
    with path.open("w") as out:
        exporting.export_jobs(store, out, exporting.Selection(TENANT), engine.clock.now())

    report = verifier.verify(path)
    assert [(p.where, p.reason) for p in report.problems] == [
        (
            "family",
            f"{TENANT}/stray ({job_uuid(TENANT, 'stray')}): names 'm' as its parent, "
            "which never spawned it",
        )
    ]


def words(text: str) -> str:
    """A table's text with its column padding collapsed."""
    return " ".join(text.split())


def test_show_and_history_list_the_children_with_their_status(
    tmp_path: Path, store_url: str
) -> None:
    cli = make_cli(tmp_path, store_url, definitions={"child.yaml": CHILD, "mission.yaml": parent()})
    topics = '{"topics": ["a", "slow"], "brief": "x"}'
    cli.ok("submit", TENANT, "m", "mission", "--input", topics)
    assert cli.json("tick", TENANT, "m")["job"]["status"] == "waiting_children"
    cli.ok("tick", TENANT, "m.1.0")
    cli.ok("tick", TENANT, "m.1.1")

    shown = cli.json("show", TENANT, "m")
    assert shown["status"] == "waiting_children" and shown["parent"] is None
    assert [(c["job_id"], c["status"]) for c in shown["children"]] == [
        ("m.1.0", "completed"),
        ("m.1.1", "waiting_event"),
    ]
    table = words(cli.ok("show", TENANT, "m"))
    assert "children 2: 1 completed, 1 waiting_event" in table
    assert "m.1.1 research_task v1 waiting_event" in table
    assert "parent m (step 1, item 0)" in words(cli.ok("show", TENANT, "m.1.0"))
    assert cli.json("show", TENANT, "m.1.0")["parent"] == {
        "job_id": "m",
        "step_number": 1,
        "index": 0,
    }

    audit = words(cli.ok("history", TENANT, "m"))
    assert "spawned m.1.0, m.1.1; join all" in audit
    assert "child m.1.0 completed, cost $0.10" in audit


def test_the_console_job_page_lists_the_children_and_links_the_parent(
    make_engine: EngineFactory, tmp_path: Path
) -> None:
    engine = engine_for(make_engine, parent())
    engine.submit(TENANT, "m", "mission", input={"topics": ["a", "slow"], "brief": "x"})
    engine.run_until_idle()

    with start_api(engine, tmp_path) as server:
        client = signed_in(server, token(sub="ann", roles="auditor", tenants=TENANT))
        page = client.get("/console/job", params={"tenant": TENANT, "job": "m"}).text
        child_page = client.get("/console/job", params={"tenant": TENANT, "job": "m.1.1"}).text

    children = re.search(r'<ul class="children" id="children">(.*?)</ul>', page, re.S)
    assert children is not None
    listed = re.findall(r">(m\.1\.\d)</a> research_task v1 <span[^>]*>(\w+)</span>", children[1])
    assert listed == [("m.1.0", "completed"), ("m.1.1", "waiting_event")]
    assert '<dd id="parent">' in child_page and ">m</a> (step 1, item 1)" in child_page


def test_the_api_job_document_gives_the_parent_and_the_children_in_the_jobs_tenant_only(
    make_engine: EngineFactory, tmp_path: Path
) -> None:
    engine = engine_for(make_engine, parent())
    engine.submit(TENANT, "m", "mission", input={"topics": ["a", "slow"], "brief": "x"})
    engine.run_until_idle()

    with start_api(engine, tmp_path) as server:
        with server.client(token(roles="auditor", tenants=TENANT)) as http:
            job = http.get(f"/v1/jobs/{TENANT}/m").json()
            child = http.get(f"/v1/jobs/{TENANT}/m.1.1").json()
        with server.client(token(roles="admin", tenants="globex")) as http:
            elsewhere = http.get(f"/v1/jobs/{TENANT}/m")

    assert job["status"] == "waiting_children" and job["parent"] is None
    assert job["children"] == [
        {
            "job_id": f"m.1.{i}",
            "step_number": 1,
            "index": i,
            "workflow": "research_task v1",
            "status": status,
        }
        for i, status in enumerate(["completed", "waiting_event"])
    ]
    assert child["parent"] == {"job_id": "m", "step_number": 1, "index": 1}
    assert child["children"] == []
    assert elsewhere.status_code == 404 and elsewhere.json()["error"] == "UnknownJobError"
    assert "children" not in elsewhere.text


def test_sigkill_mid_spawn_then_a_restarted_worker_finishes_with_nothing_twice(
    store_url: str, tmp_path: Path, make_engine: EngineFactory
) -> None:
    counter, marker = tmp_path / "calls", tmp_path / "hung"
    command = [sys.executable, "-m", "tests.support.spawn_worker", "--store", store_url]
    command += ["--counter", str(counter)]
    env = {**os.environ, "PYTHONPATH": pythonpath()}
    crashing = subprocess.Popen(
        [*command, "--hang-after-spawns", "1", "--marker", str(marker)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 60
        while not marker.exists():
            assert crashing.poll() is None, crashing.communicate()[1]
            assert time.monotonic() < deadline, "the worker never reached the spawn"
            time.sleep(0.01)
        crashing.send_signal(signal.SIGKILL)
    finally:
        crashing.kill()
        crashing.communicate()

    # From the store: the spawn is recorded, one child of three was submitted.
    store = make_engine(registry=spawn_worker.registry())
    mission = store.jobs.load(spawn_worker.TENANT, spawn_worker.MISSION)
    assert mission.status is JobStatus.WAITING_CHILDREN and len(mission.children) == 3
    existing = [c for c in sorted(mission.children) if store.jobs.fetch(spawn_worker.TENANT, c)]
    assert existing == ["mission-1.1.0"]

    restarted = subprocess.run(command, env=env, capture_output=True, text=True, timeout=120)
    assert restarted.returncode == 0, restarted.stderr

    mission = store.jobs.load(spawn_worker.TENANT, spawn_worker.MISSION)
    assert mission.status is JobStatus.COMPLETED
    assert [r["status"] for r in mission.state["done_items"]] == ["completed"] * 3
    ids = ["mission-1.1.0", "mission-1.1.1", "mission-1.1.2"]
    for child in ids:
        history = [e.event_type for e in store.history(spawn_worker.TENANT, child)]
        assert history.count("Submitted") == 1 and history[-1] == "StepRecorded"
    # Each child's one side effect ran exactly once, and nothing else ran.
    assert read_counts(counter) == {step_key(spawn_worker.TENANT, child, 1): 1 for child in ids}
    finished = [
        e
        for e in store.history(spawn_worker.TENANT, "mission-1")
        if e.event_type == "ChildFinished"
    ]
    assert sorted(e.data["child_job_id"] for e in finished) == ids


def test_a_fan_out_over_the_real_kafka_broker(store_url: str, kafka_topics: KafkaTopics) -> None:
    executor = CountingExecutor()
    config = EngineConfig(
        store_url=store_url, worker_id="kafka-w", token_secret=TOKEN_SECRET, **kafka_topics.config()
    )
    engine = open_engine(registry=registry(CHILD, parent()), executor=executor, config=config)
    seen: list[tuple[str, str]] = []

    def observe(message: TickMessage, report: TickReport | None) -> None:
        seen.append((message.tick.job_id, message.tick.reason))

    topics = {"topics": ["a", "b", "c"], "brief": "x"}
    engine.submit(TENANT, "k", "mission", input=topics)
    worker = KafkaWorker(engine, kafka_topics.settings(), on_tick=observe, concurrency=2)
    thread = threading.Thread(target=worker.run, daemon=True)
    thread.start()
    try:
        wait_for(lambda: engine.job(TENANT, "k").status.is_terminal, 90, "the mission finished")
    finally:
        worker.stop()
        thread.join(timeout=30)

    job = engine.jobs.load(TENANT, "k")
    assert job.status is JobStatus.COMPLETED
    assert [r["result"]["topic"] for r in job.state["findings"]] == ["a", "b", "c"]
    # The children's first ticks and the parent's wake-up travelled on the ticks topic.
    children = ["k.1.0", "k.1.1", "k.1.2"]
    assert {(child, "create") for child in children} <= set(seen)
    assert ("k", "children_joined") in seen
    assert executor.calls == {step_key(TENANT, child, 2): 1 for child in children}
    engine.close()


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        (
            {"items": ["a"]},
            "field 'items': give either items (a list) or items_from (a state path)",
        ),
        ({"items_from": None}, "field 'items': give either items (a list) or items_from"),
        ({"items": ["a", "b"], "items_from": None, "join": 3}, "field 'join': join 3 is more than"),
        ({"on_timeout": "done"}, "field 'on_timeout': on_timeout needs a timeout"),
        ({"results": "a.b"}, "field 'results': must be one top-level state key, not a dotted"),
        ({"input": {"x": "$itme"}}, "field 'input': input 'x': '$itme' is not $item, $item.<path>"),
        (
            {"join": "most"},
            "field 'join': must be all, any or a number of children (1 or more), got 'most'",
        ),
        ({"on_failure": "retry"}, "field 'on_failure'"),
        ({"version": 0}, "field 'version'"),
        ({"next": "nowhere"}, "field 'next': unknown step 'nowhere'"),
    ],
)
def test_a_bad_map_step_is_refused_at_load_naming_the_field(
    fields: dict[str, Any], expected: str
) -> None:
    document = parent(**{k: v for k, v in fields.items() if v is not None})
    if fields.get("items_from", "") is None:
        document = document.replace("items_from: topics, ", "")
    with pytest.raises(DefinitionError) as refused:
        parse_definition(document, "mission.yaml")
    first = refused.value.problems[0]
    assert first.startswith("mission.yaml: step 'fan_out': ") and expected in first, first


def test_a_state_value_that_is_not_a_list_fails_the_job_saying_so(
    make_engine: EngineFactory,
) -> None:
    engine = engine_for(make_engine, parent())
    engine.submit(TENANT, "m", "mission", input={"topics": "a", "brief": "x"})
    engine.run_until_idle()

    job = engine.jobs.load(TENANT, "m")
    assert job.status is JobStatus.FAILED and not job.children
    assert job.last_error == (
        "workflow resolution failed: map step 'fan_out': 'topics' is str, not a list"
    )


def test_children_never_carry_personal_data(make_engine: EngineFactory) -> None:
    personal_child = CHILD.replace("type: research_task", "type: private_task").replace(
        "start: check", "personal_data: [topic]\nstart: check"
    )
    mission = parent(workflow="private_task").replace("type: mission", "type: private_mission")
    engine = engine_for(make_engine, personal_child, mission)
    engine.submit(TENANT, "p", "private_mission", input={"topics": ["a"], "brief": "x"})
    engine.run_until_idle()

    job = engine.jobs.load(TENANT, "p")
    assert job.status is JobStatus.FAILED and not job.children
    assert job.last_error == (
        "a map step cannot spawn children when 'private_task' declares personal_data "
        "(their inputs and results would be copied unsealed)"
    )


def test_a_snapshot_keeps_the_family(make_engine: EngineFactory) -> None:
    engine = engine_for(make_engine, parent())
    engine.submit(TENANT, "m", "mission", input={"topics": ["a", "slow"], "brief": "x"})
    engine.run_until_idle()
    job, child = engine.jobs.load(TENANT, "m"), engine.jobs.load(TENANT, "m.1.1")

    restored = Job.Snapshot.take(job).mutate(None)
    assert (restored.children, restored.join) == (job.children, job.join)
    assert restored.children_cost_usd == job.children_cost_usd == Decimal("0.10")
    assert Job.Snapshot.take(child).mutate(None).parent == child.parent
    # A job with no family keeps the snapshot bytes it had before families existed.
    plain = engine.submit(TENANT, "solo", "research_task", input={"topic": "a"})
    state = Job.Snapshot.take(engine.jobs.load(TENANT, plain.job_id)).state
    assert not {"parent", "children", "join", "children_cost_usd"} & set(state)


def test_cancelling_a_child_reaches_its_parent_through_the_command(
    make_engine: EngineFactory,
) -> None:
    engine = engine_for(make_engine, parent())
    engine.submit(TENANT, "m", "mission", input={"topics": ["slow", "slow"], "brief": "x"})
    engine.run_until_idle()

    engine.cancel(TENANT, "m.1.0", reason="wrong topic", by="ops")

    job = engine.jobs.load(TENANT, "m")
    assert job.status is JobStatus.FAILED
    assert job.last_error == "child m.1.0 cancelled"
    assert statuses(engine, "m") == {"m.1.0": JobStatus.CANCELLED, "m.1.1": JobStatus.CANCELLED}


def test_a_code_workflow_that_waits_for_no_children_fails_saying_so(
    make_engine: EngineFactory,
) -> None:
    code = FunctionRegistry()
    code.register("odd", 1, linear_workflow([Resolution("map", JobStatus.WAITING_CHILDREN)]))
    engine = make_engine(registry=code)
    engine.submit(TENANT, "odd", "odd")
    engine.run_until_idle()

    job = engine.jobs.load(TENANT, "odd")
    assert job.status is JobStatus.FAILED and job.current_step == 0
    assert job.last_error == "a step waits for children but names none to spawn"


def test_a_parent_waiting_for_its_children_lends_them_its_place_under_a_limit(
    make_engine: EngineFactory,
) -> None:
    # One job of the tenant may run at once: the parent waiting on its join must not
    # hold that place, or its children could never start.
    limits = [ConcurrencyLimit(tenant=TENANT, max_running=1)]
    engine = engine_for(make_engine, parent(), config={"concurrency_limits": limits})
    engine.submit(TENANT, "m1", "mission", input={"topics": ["a", "b"], "brief": "x"})
    engine.run_until_idle()

    assert engine.jobs.load(TENANT, "m1").status is JobStatus.COMPLETED
    assert statuses(engine, "m1") == {"m1.1.0": JobStatus.COMPLETED, "m1.1.1": JobStatus.COMPLETED}
    # The limit still held among the children and the jobs queued behind them.
    engine.submit(TENANT, "other-1", "research_task", input={"topic": "a"})
    engine.submit(TENANT, "other-2", "research_task", input={"topic": "b"})
    assert engine.queued_because(TENANT, "other-2") is not None
    engine.run_until_idle()
    assert engine.jobs.load(TENANT, "other-2").status is JobStatus.COMPLETED


NAPPER = """
type: napper
version: 1
start: nap
steps:
  nap: {kind: wait_time, delay: {minutes: 5}, next: done}
  done: {kind: complete}
"""


def test_a_parent_is_resumed_by_its_childrens_ends_not_by_polling(
    make_engine: EngineFactory,
) -> None:
    # Issue 29 item 11: the parent was re-ticked every millisecond while it waited, so
    # run_until_idle(wait_for_timers=True) never went idle and stopped at max_ticks.
    engine = engine_for(make_engine, NAPPER, parent(workflow="napper"), metrics=True)
    engine.submit(TENANT, "m", "mission", input={"topics": ["a", "b"], "brief": "x"})

    handled = engine.run_until_idle(wait_for_timers=True, max_ticks=1_000)

    assert engine.jobs.load(TENANT, "m").status is JobStatus.COMPLETED
    assert statuses(engine, "m") == {"m.1.0": JobStatus.COMPLETED, "m.1.1": JobStatus.COMPLETED}
    s = scraped(engine)
    # The parent: its map step, then the tick its join woke. Each child: its first tick
    # (into the 5-minute timer), then the timer's.
    assert handled == total(s, "jobledger_ticks_total") == 6
    assert value(s, "jobledger_ticks_total", outcome="idle") == 0


def test_waiting_for_timers_goes_idle_when_only_a_join_that_cannot_move_is_left(
    make_engine: EngineFactory,
) -> None:
    engine = engine_for(make_engine, parent(), metrics=True)
    engine.submit(TENANT, "m", "mission", input={"topics": ["a", "slow"], "brief": "x"})

    # The slow child waits for an event that has not come: nothing is left to run.
    handled = engine.run_until_idle(wait_for_timers=True, max_ticks=1_000)

    assert engine.jobs.load(TENANT, "m").status is JobStatus.WAITING_CHILDREN
    assert statuses(engine, "m") == {"m.1.0": JobStatus.COMPLETED, "m.1.1": JobStatus.WAITING_EVENT}
    assert handled == total(scraped(engine), "jobledger_ticks_total") == 3
    # The event comes: the child ends, and its end resumes the parent.
    engine.signal(TENANT, "m.1.1", "never", signal_id="s1")
    handled += engine.run_until_idle(wait_for_timers=True, max_ticks=1_000)

    assert engine.jobs.load(TENANT, "m").status is JobStatus.COMPLETED
    assert handled == total(scraped(engine), "jobledger_ticks_total") == 5


def test_the_embedded_runner_does_not_poll_a_waiting_parent(make_engine: EngineFactory) -> None:
    # On the wall clock, as ``jobledger run`` runs it: 1,000 ticks a second before.
    engine = engine_for(make_engine, parent(), metrics=True, clock=SystemClock())
    engine.submit(TENANT, "m", "mission", input={"topics": ["a", "slow"], "brief": "x"})
    runner = EmbeddedRunner(engine)
    started = time.monotonic()

    runner.run(until=lambda: time.monotonic() - started > 3)

    assert engine.jobs.load(TENANT, "m").status is JobStatus.WAITING_CHILDREN
    ticks = total(scraped(engine), "jobledger_ticks_total")
    # The three jobs' first ticks, and the reconciler's start-up tick of each job still
    # waiting (it re-enqueues what the in-process queue may have lost).
    assert ticks <= 5, f"{ticks:.0f} ticks in 3 s"
