"""Lanes: many keys at once up to the width, one item at a time per key, in order."""

from __future__ import annotations

import threading
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

from jobledger import Engine
from jobledger.orchestration.lanes import Lanes
from tests.support.engines import CountingExecutor, default_registry


def test_each_keys_items_run_one_at_a_time_in_the_order_they_were_put() -> None:
    seen: dict[str, list[int]] = defaultdict(list)
    inside: dict[str, int] = defaultdict(int)
    overlaps: list[str] = []
    lock = threading.Lock()

    def handle(item: tuple[str, int]) -> None:
        key, n = item
        with lock:
            inside[key] += 1
            if inside[key] > 1:
                overlaps.append(key)
        time.sleep(0.001)
        with lock:
            inside[key] -= 1
            seen[key].append(n)

    lanes: Lanes[tuple[str, int]] = Lanes(4, handle, lambda item: item[0])
    for n in range(30):
        for key in "abcdef":
            lanes.put((key, n))
    lanes.join()
    assert lanes.close() == []
    assert overlaps == []
    assert dict(seen) == {key: list(range(30)) for key in "abcdef"}


def test_different_keys_run_at_once_up_to_the_width_and_never_beyond() -> None:
    width = 4
    together = threading.Barrier(width, timeout=10)
    running = 0
    most = 0
    lock = threading.Lock()

    def handle(key: int) -> None:
        nonlocal running, most
        with lock:
            running += 1
            most = max(most, running)
        if key < width:
            together.wait()  # only passes if `width` keys run at the same time
        time.sleep(0.002)
        with lock:
            running -= 1

    lanes: Lanes[int] = Lanes(width, handle, lambda key: key)
    for key in range(3 * width):
        lanes.put(key)
    lanes.join()
    lanes.close()
    assert not together.broken
    assert most == width


def test_close_finishes_the_items_in_hand_and_returns_the_rest_in_order() -> None:
    started = threading.Event()
    release = threading.Event()
    handled: list[int] = []

    def handle(n: int) -> None:
        started.set()
        release.wait(10)
        handled.append(n)

    lanes: Lanes[int] = Lanes(1, handle, lambda n: "one key")
    for n in range(5):
        lanes.put(n)
    assert started.wait(10)
    closing = threading.Thread(target=lambda: left.extend(lanes.close()))
    left: list[int] = []
    closing.start()
    release.set()
    closing.join(10)
    assert handled == [0]
    assert left == [1, 2, 3, 4]
    with pytest.raises(RuntimeError, match="closed"):
        lanes.put(9)


def test_a_failing_item_does_not_stall_its_lane() -> None:
    handled: list[int] = []

    def handle(n: int) -> None:
        if n == 1:
            raise ValueError("a bug in one item")
        handled.append(n)

    lanes: Lanes[int] = Lanes(2, handle, lambda n: "k")
    for n in range(4):
        lanes.put(n)
    lanes.join()
    lanes.close()
    assert handled == [0, 2, 3]


def test_wait_below_reports_whether_a_lane_came_free() -> None:
    release = threading.Event()
    lanes: Lanes[int] = Lanes(2, lambda n: release.wait(10) and None, lambda n: n)
    lanes.put(1)
    lanes.put(2)
    assert lanes.busy() == 2
    assert lanes.wait_below(2, timeout=0.05) is False
    release.set()
    assert lanes.wait_below(2, timeout=10) is True
    lanes.close()


def test_a_width_below_one_is_refused() -> None:
    with pytest.raises(ValueError, match="width of at least 1"):
        Lanes(0, print, id)


def test_withdraw_returns_the_items_not_started_and_the_lanes_take_more_work() -> None:
    started = threading.Event()
    release = threading.Event()
    handled: list[tuple[str, int]] = []

    def handle(item: tuple[str, int]) -> None:
        if item == ("a", 0):
            started.set()
            release.wait(10)
        handled.append(item)

    lanes: Lanes[tuple[str, int]] = Lanes(1, handle, lambda item: item[0])
    for item in [("a", 0), ("a", 1), ("b", 0), ("b", 1)]:
        lanes.put(item)
    assert started.wait(10)
    threading.Timer(0.05, release.set).start()
    assert lanes.withdraw() == [("a", 1), ("b", 0), ("b", 1)]
    assert handled == [("a", 0)]  # the one in hand finished before withdraw returned
    lanes.put(("c", 0))
    lanes.join()
    assert handled == [("a", 0), ("c", 0)]
    lanes.close()


def test_draining_the_local_queue_again_starts_no_thread(tmp_path: Path) -> None:
    """Issue 25 item 2: each run_until_idle reuses the lanes' threads of the last one
    (a resume's tick used to pay a thread start)."""
    engine = Engine.open(
        f"sqlite:///{tmp_path}/jobs.db", registry=default_registry(), executor=CountingExecutor()
    )
    started: list[str] = []
    start = threading.Thread.start

    def counted(thread: threading.Thread) -> None:
        started.append(thread.name)
        start(thread)

    try:
        engine.submit("t", "warm", "agent3")
        engine.run_until_idle(concurrency=1)
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(threading.Thread, "start", counted)
            for n in range(5):
                engine.submit("t", f"j{n}", "agent3")
                engine.run_until_idle(concurrency=1)
        assert [engine.job("t", f"j{n}").status for n in range(5)] == ["completed"] * 5
        assert [name for name in started if name.startswith("jobledger-tick")] == []
    finally:
        engine.close()


def test_a_tick_due_alone_runs_in_the_draining_thread_and_ticks_due_together_in_lanes(
    tmp_path: Path,
) -> None:
    """Issue 25 item 5: a resume's tick (due alone) spares the hand-off to a lane's
    thread and back; ticks due together still run side by side."""
    threads: list[str] = []

    class Noting(CountingExecutor):
        def execute(self, request: Any) -> Any:
            threads.append(threading.current_thread().name)
            return super().execute(request)

    engine = Engine.open(
        f"sqlite:///{tmp_path}/jobs.db", registry=default_registry(), executor=Noting()
    )
    try:
        engine.submit("t", "alone", "agent3")
        engine.run_until_idle(concurrency=4)
        assert threads == [threading.current_thread().name] * 3
        threads.clear()
        for n in range(3):
            engine.submit("t", f"together-{n}", "agent3")
        engine.run_until_idle(concurrency=4)
        assert len(threads) == 9
        assert all(name.startswith("jobledger-tick") for name in threads[:3])
    finally:
        engine.close()
