"""A worker process for tests/test_subscription_crash.py:
``python -m tests.support.subscription_worker --help``.

It runs what ``jobledger worker --transport kafka`` runs (the supervisor's Kafka worker;
with ``--reconcile``, also the reconciler, as ``jobledger run`` does), configured from
``JOBLEDGER_*`` variables, its subscriptions from ``JOBLEDGER_SUBSCRIPTIONS``. Every side
effect appends its idempotency key to the counter file (crash_worker's executor).

With ``--kill-after N`` it SIGKILLs itself once N messages of its subscriptions made a
new job (or delivered a new signal) in this process: in the worker's ``after_effect``
hook, which runs once the message's effect is durable and before its offset is
committed, the exact moment the test is about. It writes the message's position to
``--kills`` first, so the test knows where each kill landed.

``--member`` makes the consumer a static group member (``group.instance.id``): a process
started again under the same id takes its partitions back at once instead of waiting
for the group to notice (after ``kafka_session_timeout_ms``, 6 s at the least) that the
killed one is gone. Offsets and commits work the same either way.

SIGUSR1 prints its threads' stacks to its log (the test does so to a worker it finds hung).
"""

from __future__ import annotations

import argparse
import faulthandler
import functools
import logging
import os
import signal
import sys
import threading
from pathlib import Path
from typing import Any

from jobledger import EngineConfig
from jobledger.adapters.kafka import clients
from jobledger.adapters.kafka.worker import WorkerStats
from jobledger.runtime.supervisor import Services, Supervisor
from tests.support.crash_worker import FileCountingExecutor, append_line
from tests.support.engines import open_engine
from tests.support.subscriptions import registry

NEW_OUTCOMES = ("submitted", "resumed", "buffered")
"""A subscription's outcomes that wrote something new (``found`` and ``duplicate`` did not)."""


class SelfKill:
    """The worker's ``after_effect``: SIGKILL this process right after the ``after``-th
    message of its subscriptions that made something new here. The worker handles one
    message at a time (``JOBLEDGER_CONCURRENCY=1``), so the outcome counted since the
    last call is this message's."""

    def __init__(self, stats: WorkerStats, after: int, kills: Path) -> None:
        self.stats = stats
        self.after = after
        self.kills = kills
        self.made = 0

    def __call__(self, record: Any) -> None:
        outcomes = self.stats.outcomes
        made = sum(n for outcome, n in outcomes.items() if outcome.endswith(NEW_OUTCOMES))
        new, self.made = made > self.made, made
        if new and made >= self.after:
            append_line(self.kills, f"{record.topic}:{record.partition}:{record.offset}")
            os.kill(os.getpid(), signal.SIGKILL)


def static_member(member: str) -> None:
    """The worker's consumer joins as the static member ``member``."""
    consumer = clients.KafkaConsumer
    clients.KafkaConsumer = functools.partial(consumer, group_instance_id=member)  # type: ignore[misc]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--counter", required=True, type=Path, help="side-effect counter file")
    parser.add_argument("--kill-after", type=int, help="SIGKILL after this many new effects")
    parser.add_argument("--kills", type=Path, help="where each self-kill is noted")
    parser.add_argument("--member", help="join as this static group member")
    parser.add_argument("--reconcile", action="store_true", help="run the reconciler too")
    parser.add_argument("--ready", type=Path, help="touched once partitions are assigned")
    args = parser.parse_args(argv)
    faulthandler.register(signal.SIGUSR1)  # a worker the test finds hung shows its threads
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    logging.getLogger("kafka").setLevel(logging.ERROR)
    if args.member is not None:
        static_member(args.member)

    config = EngineConfig()  # everything from JOBLEDGER_* variables
    executor = FileCountingExecutor(args.counter)
    with open_engine(registry=registry(), executor=executor, config=config) as engine:
        # Two messages a poll: offsets are committed along the rounds, not only at the end.
        services = Services(
            workers=1, reconciler=args.reconcile, reconcile_interval=0.5, max_poll_records=2
        )
        supervisor = Supervisor(engine, services)
        (worker,) = supervisor.kafka_workers
        if args.kill_after is not None:
            assert args.kills is not None and engine.config.batching.concurrency == 1
            worker.after_effect = SelfKill(worker.stats, args.kill_after, args.kills)
        signal.signal(signal.SIGTERM, lambda *_: supervisor.stopping.set())
        if args.ready is not None:
            ready: Path = args.ready

            def say_ready() -> None:
                if worker.joined.wait(120):
                    ready.touch()

            threading.Thread(target=say_ready, daemon=True).start()
        supervisor.run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
