"""Processes for the Kafka tests: ``python -m tests.support.kafka_procs --help``.

- ``main``: one Kafka worker (the same KafkaWorker ``jobledger worker --transport kafka``
  runs) on a store, counting every side effect in a file (crash_worker's executor). It
  can be told to hang, saying so through a marker file, right after the append that
  records a given step (the tick's effect is durable, its offset not yet committed), so
  the test can SIGKILL it exactly there.
- ``ChaosExecutor``: the executor the chaos test's ``jobledger worker`` processes load
  (``executor = "tests.support.kafka_procs:ChaosExecutor"``): each side effect appends
  ``<idempotency key> <worker id>`` to the counter file.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading
import time
from pathlib import Path

from jobledger import EngineConfig, StepRequest, StepResult
from jobledger.adapters.kafka import KafkaSettings
from jobledger.adapters.kafka.worker import KafkaWorker
from tests.support.crash_worker import (
    FileCountingExecutor,
    HangAfterRecord,
    append_line,
    hang,
    registry,
)
from tests.support.engines import StoreWrapper, open_engine


class ChaosExecutor:
    def __init__(self) -> None:
        self.counter = Path(os.environ["JOBLEDGER_TEST_COUNTER"])
        self.worker_id = os.environ["JOBLEDGER_WORKER_ID"]
        self.effect_s = float(os.environ.get("JOBLEDGER_TEST_EFFECT_MS", "5")) / 1000

    def execute(self, request: StepRequest) -> StepResult:
        append_line(self.counter, f"{request.idempotency_key} {self.worker_id}")
        time.sleep(self.effect_s)
        return StepResult(
            output={"step": request.step_number}, state_patch={f"s{request.step_number}": True}
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--counter", required=True, type=Path, help="side-effect counter file")
    parser.add_argument("--hang-after-record", type=int, help="hang once this step is recorded")
    parser.add_argument(
        "--hang-before-commit",
        action="store_true",
        help="hang once a tick's effect is durable, before its offset is committed",
    )
    parser.add_argument("--marker", type=Path, help="touched when the worker hangs")
    parser.add_argument("--ready", type=Path, help="touched once partitions are assigned")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    logging.getLogger("kafka").setLevel(logging.ERROR)

    config = EngineConfig()  # everything else from JOBLEDGER_* variables
    executor = FileCountingExecutor(args.counter)
    wrap_store: StoreWrapper | None = None
    if args.hang_after_record is not None:
        assert args.marker is not None
        step: int = args.hang_after_record
        marker_file: Path = args.marker
        wrap_store = lambda store: HangAfterRecord(store, step, marker_file)  # noqa: E731
    with open_engine(
        registry=registry(), executor=executor, config=config, wrap_store=wrap_store
    ) as engine:
        worker = KafkaWorker(engine, KafkaSettings.of(config))
        if args.hang_before_commit:
            assert args.marker is not None
            marker: Path = args.marker
            worker.after_effect = lambda record: hang(marker)
        signal.signal(signal.SIGTERM, lambda *_: worker.stop())
        if args.ready is not None:
            ready: Path = args.ready

            def say_ready() -> None:
                if worker.joined.wait(120):
                    ready.touch()

            threading.Thread(target=say_ready, daemon=True).start()
        worker.run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
