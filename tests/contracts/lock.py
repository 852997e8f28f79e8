"""The Lock port's promises (jobledger.orchestration.ports.Lock): mutual exclusion across processes,
released by the OS or the database when the holder dies."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable

from jobledger.orchestration.ports import Lock
from tests.support import pythonpath

LockMaker = Callable[[str], Lock]
"""A new instance of the lock named so, as another process would build it."""
LockCode = Callable[[str], str]
"""Python that builds the lock named so in a fresh process, as ``lock``."""


class LockContract:
    """Subclasses provide the fixtures ``make_lock`` (a :data:`LockMaker`) and
    ``lock_code`` (a :data:`LockCode`)."""

    def test_the_holder_holds_it_again_without_blocking(self, make_lock: LockMaker) -> None:
        lock = make_lock("reconciler")
        assert lock.try_acquire()
        assert lock.try_acquire()  # re-entrant
        lock.release()

    def test_a_second_instance_is_refused_until_the_holder_releases(
        self, make_lock: LockMaker
    ) -> None:
        first, second = make_lock("reconciler"), make_lock("reconciler")
        assert first.try_acquire()
        assert not second.try_acquire()
        assert not second.try_acquire()  # refused again, and never blocked
        first.release()
        assert second.try_acquire()
        assert not first.try_acquire()  # now the other way round
        second.release()

    def test_locks_of_different_names_do_not_exclude_each_other(self, make_lock: LockMaker) -> None:
        reconciler, views = make_lock("reconciler"), make_lock("views")
        assert reconciler.try_acquire() and views.try_acquire()
        reconciler.release()
        views.release()

    def test_releasing_a_lock_not_held_is_harmless(self, make_lock: LockMaker) -> None:
        lock, other = make_lock("reconciler"), make_lock("reconciler")
        lock.release()
        assert other.try_acquire()
        lock.release()  # not the holder: the other instance keeps it
        assert not lock.try_acquire()
        other.release()

    def test_a_dead_holders_lock_is_taken_over(
        self, make_lock: LockMaker, lock_code: LockCode
    ) -> None:
        """Moved from tests/test_projections.py (the reconciler's lock)."""
        code = "\n".join(
            [
                "import time",
                lock_code("reconciler"),
                "assert lock.try_acquire()",
                'print("held", flush=True)',
                "time.sleep(60)",
            ]
        )
        holder = subprocess.Popen(
            [sys.executable, "-c", code],
            stdout=subprocess.PIPE,
            text=True,
            env={**os.environ, "PYTHONPATH": pythonpath()},
        )
        try:
            assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
            lock = make_lock("reconciler")
            assert not lock.try_acquire()
            holder.kill()
            holder.wait()
            deadline = time.monotonic() + 10
            while not lock.try_acquire():
                assert time.monotonic() < deadline, "the dead holder's lock was never released"
                time.sleep(0.1)
            lock.release()
        finally:
            holder.kill()
