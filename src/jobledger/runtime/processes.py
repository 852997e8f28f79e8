"""Several processes of one command on one store (``run --processes N``): a parent that
starts them, starts again one that dies, and stops them together.

Each child is an ordinary ``jobledger run`` (or ``worker``) with the same options: the
store is what they share (on the local transport each takes its share of the due jobs
from it, see ``Reconciler.take``; on Kafka each is a member of the consumer group). The
children are in a process group of their own, so a terminal's Ctrl-C reaches the parent
only, and the parent forwards one SIGTERM to each: every child then finishes the tick in
hand and stops cleanly, as it would alone.
"""

from __future__ import annotations

import logging
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field

log = logging.getLogger(__name__)

RESTART_BACKOFF_SECONDS = 2.0
STARTUP_SECONDS = 10.0
"""A child that exits sooner than this after its start failed to start (a bad store, a
port in use): starting it again would fail again, so the group stops with its status."""
STOP_TIMEOUT_SECONDS = 60.0
"""How long a child may take to finish its ticks in hand after SIGTERM before it is killed."""


@dataclass
class _Child:
    number: int
    process: subprocess.Popen[bytes]
    started: float = field(default_factory=time.monotonic)


class ProcessGroup:
    """``count`` copies of ``jobledger <args>``, run until SIGINT or SIGTERM."""

    def __init__(self, args: Sequence[str], count: int) -> None:
        if count < 1:
            raise ValueError(f"a process group needs at least one process, not {count}")
        self.command = [sys.executable, "-m", "jobledger", *args]
        self.count = count
        self.stopping = threading.Event()
        self.children: list[_Child] = []

    def run(self) -> int:
        """Start the children, keep them running until asked to stop, stop them; the
        exit status is 0 if every child stopped cleanly."""
        with self._stop_on_signals():
            self.children = [self._start(n) for n in range(self.count)]
            failed = self._supervise()
        return self._stop() or failed

    def _start(self, number: int) -> _Child:
        process = subprocess.Popen(self.command, process_group=0)
        log.info("process %d started (pid %d)", number, process.pid)
        return _Child(number, process)

    def _supervise(self) -> int:
        """Until stopped: a child that died is started again after a pause, unless it
        died starting (then the group stops, with that child's status)."""
        while not self.stopping.wait(0.2):
            for n, child in enumerate(self.children):
                status = child.process.poll()
                if status is None:
                    continue
                if time.monotonic() - child.started < STARTUP_SECONDS:
                    log.error("process %d exited with %d while starting", n, status)
                    return status or 1
                log.warning("process %d exited with %d; starting it again", n, status)
                if self.stopping.wait(RESTART_BACKOFF_SECONDS):
                    return 0
                self.children[n] = self._start(n)
        return 0

    def _stop(self) -> int:
        """SIGTERM to each child still running, then wait for all (a child past the
        timeout is killed); 0 if every child stopped cleanly."""
        for child in self.children:
            if child.process.poll() is None:
                child.process.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + STOP_TIMEOUT_SECONDS
        statuses = []
        for child in self.children:
            try:
                statuses.append(child.process.wait(max(0.0, deadline - time.monotonic())))
            except subprocess.TimeoutExpired:
                log.error("process %d did not stop in time; killing it", child.number)
                child.process.kill()
                statuses.append(child.process.wait())
        # A child still starting dies of the SIGTERM itself (no handler yet): it had
        # nothing in hand, so that is a clean stop too.
        clean = (0, -signal.SIGTERM)
        return next((status for status in statuses if status not in clean), 0)

    @contextmanager
    def _stop_on_signals(self) -> Iterator[None]:
        previous = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
        for sig in previous:
            signal.signal(sig, lambda *_: self.stopping.set())
        try:
            yield
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
