"""A worker process for tests/test_children.py: ``python -m tests.support.spawn_worker --help``.

It opens an engine on a store URL (system clock, local queue, one tick at a time) and runs a
fan-out mission to its end, as a restarted worker beside a reconciler would: reconciler
passes that take every queued or waiting job at once, then the local queue until idle.
With ``--hang-after-spawns N`` it hangs (and says so through a marker file) once the
mission's tick has submitted N of its children, so the test can SIGKILL it mid-spawn.
Every side effect appends its idempotency key to a counter file, which survives SIGKILL.
"""

from __future__ import annotations

import argparse
import sys
import time
from datetime import timedelta
from pathlib import Path

from jobledger import Engine, EngineConfig
from jobledger.adapters.locks import lock_for
from jobledger.adapters.store_url import parse_store_url
from jobledger.domain.job import JSON, Job
from jobledger.orchestration.reconciler import Reconciler
from jobledger.projections import JobViews
from jobledger.workflows import DefinitionRegistry, parse_definition
from tests.support.crash_worker import FileCountingExecutor, hang
from tests.support.engines import open_engine

TENANT = "spawn-tenant"
MISSION = "mission-1"
CHILD = """
type: sub_task
version: 1
start: work
steps:
  work: {kind: run_interaction_task, params: {task: work}, next: done}
  done: {kind: complete}
"""
PARENT = """
type: fan_out
version: 1
start: spread
steps:
  spread:
    kind: map
    items: [a, b, c]
    workflow: sub_task
    version: 1
    input: {topic: $item}
    results: done_items
    next: done
  done: {kind: complete}
"""


def registry() -> DefinitionRegistry:
    return DefinitionRegistry(
        [parse_definition(CHILD, "child.yaml"), parse_definition(PARENT, "parent.yaml")]
    )


def hang_after_spawns(engine: Engine, count: int, marker: Path) -> None:
    """Hang inside the spawner once ``count`` children are submitted."""
    spawner = engine.orchestrator.family.spawner
    assert spawner is not None
    spawned = 0

    def spawn(parent: Job, plan: JSON) -> None:
        nonlocal spawned
        spawner(parent, plan)
        spawned += 1
        if spawned == count:
            hang(marker)

    engine.orchestrator.family.spawner = spawn


def run(engine: Engine, store_url: str, deadline: float) -> None:
    """Reconciler passes (every queued or waiting job due at once) and the local queue,
    until the mission is terminal."""
    views = JobViews(engine.deps.store)
    lock = lock_for(parse_store_url(store_url), "spawn-worker-reconciler")
    reconciler = Reconciler(
        views=views, queue=engine.queue, clock=engine.clock, lock=lock, ops=engine.ops
    )
    try:
        while not engine.job(TENANT, MISSION).status.is_terminal:
            if time.monotonic() > deadline:
                raise SystemExit("deadline passed with the mission unfinished")
            views.catch_up()
            reconciler.reconcile(lost_tick_after=timedelta(0))
            engine.run_until_idle(wait_for_timers=True)
            time.sleep(0.01)
    finally:
        reconciler.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--store", required=True, help="store URL")
    parser.add_argument("--counter", required=True, type=Path, help="side-effect counter file")
    parser.add_argument("--hang-after-spawns", type=int, help="hang once N children are submitted")
    parser.add_argument("--marker", type=Path, help="touched when the worker hangs")
    parser.add_argument("--timeout", type=float, default=60.0)
    args = parser.parse_args(argv)
    deadline = time.monotonic() + args.timeout
    config = EngineConfig(store_url=args.store, worker_id="spawn-worker", concurrency=1)
    executor = FileCountingExecutor(args.counter)
    with open_engine(registry=registry(), executor=executor, config=config) as engine:
        if args.hang_after_spawns is not None:
            hang_after_spawns(engine, args.hang_after_spawns, args.marker)
            engine.submit(TENANT, MISSION, "fan_out")
            engine.run_until_idle()
            raise SystemExit("the mission's tick never reached the spawn to hang in")
        run(engine, args.store, deadline)
    return 0


if __name__ == "__main__":
    sys.exit(main())
