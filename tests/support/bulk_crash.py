"""A bulk runner process for tests/test_bulk.py that dies mid-batch.

``python -m tests.support.bulk_crash STORE_URL TENANT BATCH_ID MARKER``: runs the batch;
after its third job's append is written (the job acted on, its outcome not recorded), the
process touches MARKER and waits for the test's SIGKILL.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

from jobledger import FunctionRegistry, linear_workflow
from jobledger.config import EngineConfig
from jobledger.orchestration.ports import JobStore
from tests.support.engines import agent_steps, open_engine
from tests.support.workflows import DONE, STEP, wait_event

WAITER = [STEP, wait_event("go"), STEP, DONE]


def bulk_registry() -> FunctionRegistry:
    """tests/test_bulk.py's workflows: agent3, and waiter (v1 and v2) waiting for ``go``."""
    registry = FunctionRegistry()
    registry.register("agent3", 1, linear_workflow(agent_steps(3)))
    registry.register("waiter", 1, linear_workflow(WAITER))
    registry.register("waiter", 2, linear_workflow(WAITER))
    return registry


class DiesAfterThirdJob:
    def __init__(self, store: JobStore, marker: Path) -> None:
        self.store = store
        self.marker = marker
        self.appends = 0

    def append(self, job: Any, *keys: Any) -> None:
        self.store.append(job, *keys)
        self.appends += 1
        if self.appends == 3:
            self.marker.touch()
            while True:
                time.sleep(60)  # the test's SIGKILL lands here

    def __getattr__(self, name: str) -> Any:
        return getattr(self.store, name)


def main(store_url: str, tenant_id: str, batch_id: str, marker: str) -> None:
    engine = open_engine(
        registry=bulk_registry(),
        config=EngineConfig(store_url=store_url),
        wrap_store=lambda store: DiesAfterThirdJob(store, Path(marker)),
    )
    engine.bulk.run(tenant_id, batch_id)


if __name__ == "__main__":
    main(*sys.argv[1:5])
