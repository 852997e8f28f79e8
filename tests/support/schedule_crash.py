"""A reconciler process for tests/test_schedules.py that dies mid-firing.

``python -m tests.support.schedule_crash STORE_URL MOMENT MARKER``: one reconcile pass at
MOMENT (ISO 8601) with the schedules firing. The first ``Fired`` it is about to append is
never written: the process touches MARKER and waits for the test's SIGKILL, so the job of
that firing is submitted and the schedule does not record it yet.
"""

from __future__ import annotations

import sys
import time
from datetime import datetime
from pathlib import Path
from typing import Any

from jobledger.adapters.clock import FakeClock
from jobledger.adapters.event_store import EventSourcedJobStore
from jobledger.adapters.locks import lock_for
from jobledger.adapters.ops import MemoryOps
from jobledger.config import EngineConfig
from jobledger.domain.schedule import Schedule
from jobledger.engine.schedule_commands import ScheduleFiring
from jobledger.orchestration.ports import JobStore
from jobledger.orchestration.reconciler import Reconciler
from jobledger.projections import JobViews
from tests.support.engines import default_registry, open_engine


class DiesBeforeFired:
    """The store, except that appending a ``Fired`` stops the process there."""

    def __init__(self, store: JobStore, marker: Path) -> None:
        self.store = store
        self.marker = marker

    def append_schedule(self, schedule: Schedule) -> None:
        if any(isinstance(e, Schedule.Fired) for e in schedule.pending_events):
            self.marker.touch()
            while True:
                time.sleep(60)  # the test's SIGKILL lands here
        self.store.append_schedule(schedule)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.store, name)


def main(store_url: str, moment: str, marker: str) -> None:
    clock = FakeClock(datetime.fromisoformat(moment))
    engine = open_engine(
        registry=default_registry(),
        clock=clock,
        config=EngineConfig(store_url=store_url),
        wrap_store=lambda store: DiesBeforeFired(store, Path(marker)),
    )
    inner = engine.deps.store.store
    assert isinstance(inner, EventSourcedJobStore)
    views = JobViews(inner)
    views.catch_up()
    reconciler = Reconciler(
        views=views,
        queue=engine.queue,
        clock=clock,
        lock=lock_for(engine.deps.store.location, "reconciler"),
        ops=MemoryOps(),
        schedules=ScheduleFiring(engine.schedules, views),
    )
    reconciler.reconcile()


if __name__ == "__main__":
    main(*sys.argv[1:4])
