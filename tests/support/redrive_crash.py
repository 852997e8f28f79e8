"""A redrive that dies at a chosen write: in-process (``Crash``, a BaseException) or, run
as ``python -m tests.support.redrive_crash``, by SIGKILL of its own process.

The write points, by the producer calls of a redrive (batches of ``BATCH``): the Nth
``send`` and the Nth ``flush``, before or after the real call. Flushes alternate: odd ones
send a batch's originals, even ones its markers.

The process imports neither pytest nor the test fixtures: only the adapter under test.
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Callable
from typing import Any

from jobledger.adapters.kafka import clients
from jobledger.adapters.kafka.dead_letters import DeadLetters, Selection
from jobledger.adapters.kafka.settings import KafkaSettings

BATCH = 100


class Crash(BaseException):
    """Not an Exception: nothing on the way up may catch it, as nothing survives a kill."""


class CrashingProducer:
    """The real producer, but ``die()`` at ``point``: ("send" | "flush", n, "before" |
    "after")."""

    def __init__(self, inner: Any, point: tuple[str, int, str], die: Callable[[], None]) -> None:
        self.inner = inner
        self.point = point
        self.die = die
        self.calls = {"send": 0, "flush": 0}

    def _call(self, name: str, *args: Any, **kwargs: Any) -> Any:
        self.calls[name] += 1
        here = (name, self.calls[name])
        if here == self.point[:2] and self.point[2] == "before":
            self.die()
        result = getattr(self.inner, name)(*args, **kwargs)
        if here == self.point[:2] and self.point[2] == "after":
            self.die()
        return result

    def send(self, *args: Any, **kwargs: Any) -> Any:
        return self._call("send", *args, **kwargs)

    def flush(self, *args: Any, **kwargs: Any) -> Any:
        return self._call("flush", *args, **kwargs)

    def close(self, *args: Any, **kwargs: Any) -> Any:
        return self.inner.close(*args, **kwargs)


def crashing(point: tuple[str, int, str], die: Callable[[], None]) -> Callable[..., Any]:
    """A stand-in for ``clients.producer`` whose producers die at ``point``."""
    real = clients.producer

    def make(*args: Any, **kwargs: Any) -> CrashingProducer:
        return CrashingProducer(real(*args, **kwargs), point, die)

    return make


def _kill() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def main(argv: list[str]) -> None:
    """ARGS: BOOTSTRAP TICKS TICKS_DLQ SIGNALS SIGNALS_DLQ WHAT N WHEN."""
    bootstrap, ticks, ticks_dlq, signals, signals_dlq, what, n, when = argv
    settings = KafkaSettings(
        bootstrap_servers=bootstrap,
        ticks_topic=ticks,
        ticks_dlq_topic=ticks_dlq,
        signals_topic=signals,
        signals_dlq_topic=signals_dlq,
    )
    clients.producer = crashing((what, int(n), when), _kill)  # type: ignore[assignment]
    DeadLetters(settings, batch_size=BATCH).redrive(Selection(every=True), by="crash")
    sys.exit(0)  # not killed: the point was never reached


if __name__ == "__main__":
    main(sys.argv[1:])
