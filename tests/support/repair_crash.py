"""A process for tests/test_repair_crash.py that dies inside a repair:
``python -m tests.support.repair_crash --help``.

It opens an engine on a store URL and runs one repair (retry, reset or fork) of the job
``job-1`` of tests.support.crash_worker's tenant, through a store that hangs (touching a
marker file) right after the repair's first append committed, so the test can SIGKILL it
there: before it put the job back on the queue and, for a fork, before its origin named it.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from jobledger import EngineConfig
from jobledger.domain.job import Job
from jobledger.domain.keys import ConsumedKey
from jobledger.orchestration.ports import JobStore
from tests.support.crash_worker import TENANT, hang, registry
from tests.support.engines import CountingExecutor, StoreAround, open_engine

JOB = "job-1"
FORK = "fork-1"


class HangAfterRepair(StoreAround):
    """Hangs once an append holding a repair's event has committed."""

    def __init__(self, inner: JobStore, marker: Path) -> None:
        super().__init__(inner)
        self.marker = marker

    def append(self, job: Job, *keys: ConsumedKey) -> None:
        repair = (Job.Retried, Job.Reset, Job.ForkedFrom)
        repairs = any(isinstance(event, repair) for event in job.pending_events)
        self.inner.append(job, *keys)
        if repairs:
            hang(self.marker)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--store", required=True, help="store URL")
    parser.add_argument("--repair", required=True, choices=("retry", "reset", "fork"))
    parser.add_argument("--marker", required=True, type=Path, help="touched when it hangs")
    args = parser.parse_args(argv)
    marker: Path = args.marker
    with open_engine(
        registry=registry(),
        executor=CountingExecutor(),
        config=EngineConfig(store_url=args.store, worker_id="doomed"),
        wrap_store=lambda store: HangAfterRepair(store, marker),
    ) as engine:
        if args.repair == "retry":
            engine.retry(TENANT, JOB, by="ops", reason="fixed")
        elif args.repair == "reset":
            engine.reset(TENANT, JOB, 1, by="ops", reason="again")
        else:
            engine.fork(TENANT, JOB, 2, new_job_id=FORK, by="ops", reason="variant")
    return 1  # never reached: it hangs until killed


if __name__ == "__main__":
    sys.exit(main())
