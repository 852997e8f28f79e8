"""One composition root and one supervisor (issue 10, items 2 and 3).

- The wiring is decided once (``jobledger.engine.bootstrap.build``): the facade and the
  orchestrator run on the same ports, the transport is chosen when the engine is built,
  and nothing downcasts the facade's ports to find the adapters behind them.
- Every process runs its services through ``jobledger.runtime.supervisor.Supervisor``: what a
  command runs is the library's decision (``Services.of``), a service that dies is
  started again, and a reconcile pass by hand is a library call.
"""

from __future__ import annotations

import ast
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from jobledger import Engine
from jobledger.adapters.kafka import KafkaQueue
from jobledger.adapters.local_queue import LocalQueue
from jobledger.domain.errors import ConfigError
from jobledger.domain.status import JobStatus
from jobledger.runtime.kafka_runner import KafkaRunner
from jobledger.runtime.supervisor import Services, Supervisor
from jobledger.workflows import DefinitionRegistry
from tests.support.audit import MISSION_V1, ScoringAgent, definition, mission

ROOT = Path(__file__).resolve().parent.parent
PORTS = {"store", "queue", "clock", "ops", "cost", "tokens", "notifier", "leases", "registry"}


def test_the_facade_and_the_orchestrator_run_on_one_wiring(
    make_engine: Callable[..., Engine],
) -> None:
    engine = make_engine()
    deps, orchestrator = engine.deps, engine.orchestrator

    assert orchestrator.store is engine.store is deps.store
    assert orchestrator.queue is engine.queue is deps.queue is deps.local_queue
    assert orchestrator.clock is engine.clock is deps.clock
    assert orchestrator.ops is engine.ops is deps.ops
    assert orchestrator.tokens is engine.tokens is deps.tokens is not None
    assert orchestrator.cost is deps.cost is not None
    assert orchestrator.heartbeats is not None and orchestrator.heartbeats.leases is deps.leases


def test_the_transport_is_chosen_when_the_engine_is_built(
    make_engine: Callable[..., Engine],
) -> None:
    kafka = make_engine(config={"transport": "kafka"})  # the producer connects on first use

    assert isinstance(kafka.queue, KafkaQueue) and kafka.deps.kafka_queue is kafka.queue
    assert kafka.deps.local_queue is None
    with pytest.raises(ConfigError, match="drives the local queue"):
        kafka.run_until_idle()
    with pytest.raises(ConfigError, match="transport = kafka"):
        KafkaRunner(make_engine())
    assert not hasattr(kafka, "use_queue")  # no swapping queues after the fact


def test_a_queue_handed_in_is_the_local_queue_only_when_it_is_one(
    make_engine: Callable[..., Engine], clock: Any
) -> None:
    class Elsewhere:
        def enqueue(self, tick: Any, *, delay_ms: int = 0, dedupe_key: str | None = None) -> None:
            pass

    local = LocalQueue(clock)
    assert make_engine(queue=local).deps.local_queue is local
    other = make_engine(queue=Elsewhere())
    assert other.deps.local_queue is None and other.deps.kafka_queue is None
    with pytest.raises(ConfigError, match="workers need the local queue or the Kafka"):
        Supervisor(other, Services(workers=1))


def downcasts(path: Path) -> list[str]:
    """``isinstance(x.store, ...)`` and the like: a caller finding the adapter behind a
    port, which only the composition root may know."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id == "isinstance"
            and isinstance(node.args[0], ast.Attribute)
            and node.args[0].attr in PORTS
        ):
            found.append(f"{path}:{node.lineno}")
    return found


def test_nothing_downcasts_the_facades_ports() -> None:
    sources = [*(ROOT / "src").rglob("*.py"), *(ROOT / "projections").rglob("*.py")]
    assert [hit for path in sources for hit in downcasts(path)] == []


def test_the_downcast_check_sees_one(tmp_path: Path) -> None:
    source = tmp_path / "x.py"
    source.write_text("if not isinstance(engine.queue, LocalQueue):\n    pass\n")
    found = downcasts(source)
    assert len(found) == 1 and found[0].endswith(":1")


@pytest.mark.parametrize(
    ("command", "kafka", "expected"),
    [
        ("run", False, Services(workers=2, views=True, reconciler=True, archiving=True)),
        (
            "run",
            True,
            Services(workers=2, views=True, outbox=True, reconciler=True, archiving=True),
        ),
        ("worker", False, Services(workers=2, reconciler=True)),
        ("worker", True, Services(workers=2)),
        ("reconcile", False, Services(workers=1, reconciler=True)),
        ("reconcile", True, Services(reconciler=True)),
        ("projections", False, Services(views=True)),
    ],
)
def test_what_each_command_runs_is_the_librarys_decision(
    command: Any, kafka: bool, expected: Services
) -> None:
    assert Services.of(command, kafka=kafka, workers=2) == expected


def test_projections_run_with_the_outbox_publishes_too() -> None:
    assert Services.of("projections", kafka=False, outbox=True).outbox


def test_reconcile_once_runs_what_another_process_left_queued(
    make_engine: Callable[..., Engine],
) -> None:
    submitter = make_engine()  # its in-process queue dies with it: the tick is lost
    submitter.submit("t", "j", "agent3")
    reconciling = make_engine()

    result, handled = Supervisor(
        reconciling, Services.of("reconcile", kafka=False)
    ).reconcile_once()

    assert (result.acted, result.enqueued) == (True, 1)
    assert handled >= 1
    assert reconciling.job("t", "j").status is JobStatus.COMPLETED


def test_a_service_that_dies_is_started_again(
    make_engine: Callable[..., Engine], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("jobledger.runtime.supervisor.RESTART_BACKOFF_SECONDS", 0.01)
    engine = make_engine()
    supervisor = Supervisor(engine, Services(views=True))
    views = supervisor.views
    assert views is not None
    catch_up = views.catch_up
    calls = 0

    def dies_once() -> int:
        nonlocal calls
        calls += 1
        if calls == 2:  # the first is the start-up's; the second, the follower's
            raise RuntimeError("a bug in the follower")
        return catch_up()

    monkeypatch.setattr(views, "catch_up", dies_once)
    supervisor.start()
    try:
        engine.submit("t", "later", "agent3")
        deadline = time.monotonic() + 10
        while not views.jobs(tenant_id="t"):
            assert time.monotonic() < deadline, "the follower was not started again"
            time.sleep(0.05)
    finally:
        supervisor.stop()
    assert calls > 2


def test_replay_all_replays_the_jobs_the_status_view_lists(
    make_engine: Callable[..., Engine],
) -> None:
    v1 = definition(MISSION_V1)
    engine = make_engine(registry=DefinitionRegistry([v1]), executor=ScoringAgent())
    for job in ("b", "a"):
        engine.submit("acme", job, "mission")
    engine.submit("other", "c", "mission")
    engine.run_until_idle()
    seen: list[tuple[int, int]] = []

    reports = engine.replay_all(v1, tenant_id="acme", progress=lambda *p: seen.append(p))

    assert [(r.tenant_id, r.job_id, r.safe) for r in reports] == [
        ("acme", "a", True),
        ("acme", "b", True),
    ]
    assert seen == [(0, 2), (1, 2), (2, 2)]
    assert engine.replay_all(v1, statuses=["completed"]) == []
    changed = definition(mission(2, ("params: {task: plan}", "params: {task: outline}")))
    assert not any(report.safe for report in engine.replay_all(changed))
