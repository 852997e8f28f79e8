"""Time is the store's (issue 29 item 10): a worker whose own clock is wrong still sets
and fires timers, and judges leases, on the store's clock. On SQLite and PostgreSQL."""

from __future__ import annotations

import threading
import time
from collections import Counter
from datetime import UTC, datetime, timedelta

from jobledger import FunctionRegistry, JobStatus, StepRequest, StepResult
from jobledger.adapters.clock import StoreTimeClock, SystemClock
from jobledger.adapters.event_store import EventSourcedJobStore
from jobledger.adapters.store_url import parse_store_url
from tests.support.engines import CountingExecutor, EngineFactory
from tests.support.workflows import DONE, STEP, linear_registry, sleep_ms

TENANT = "acme"
FIVE_MINUTES = timedelta(minutes=5)
SKEW = timedelta(minutes=10)
CLOSE = timedelta(seconds=1)
"""How near the store's time a corrected clock must read (a round trip is milliseconds)."""


class SkewedClock:
    """This host's clock, set ``ahead`` of the store's (negative: behind)."""

    def __init__(self, ahead: timedelta) -> None:
        self.ahead = ahead

    def now(self) -> datetime:
        return datetime.now(UTC) + self.ahead

    def sleep(self, seconds: float) -> None:
        time.sleep(max(0.0, seconds))


def napping() -> FunctionRegistry:
    return linear_registry(
        {"nap": [STEP, sleep_ms(round(FIVE_MINUTES.total_seconds() * 1000)), STEP, DONE]}
    )


def test_a_worker_ten_minutes_ahead_does_not_fire_a_five_minute_timer_at_once(
    make_engine: EngineFactory, executor: CountingExecutor
) -> None:
    right = make_engine(registry=napping(), clock=SystemClock())
    ahead = make_engine(registry=napping(), clock=SkewedClock(SKEW))
    right.submit(TENANT, "nap-1", "nap")
    right.run_until_idle()
    assert right.job(TENANT, "nap-1").status is JobStatus.WAITING_TIME

    ahead.tick(TENANT, "nap-1", "timer")
    ahead.run_until_idle()

    job = ahead.job(TENANT, "nap-1")
    assert job.status is JobStatus.WAITING_TIME, "the timer fired 5 minutes early"
    assert sum(executor.calls.values()) == 1  # the first step only
    assert abs(ahead.clock.now() - datetime.now(UTC)) < CLOSE


def test_a_worker_ahead_or_behind_sets_a_timer_five_minutes_from_the_stores_time(
    make_engine: EngineFactory,
) -> None:
    for n, skew in enumerate((SKEW, -SKEW)):
        skewed = make_engine(registry=napping(), clock=SkewedClock(skew))
        skewed.submit(TENANT, f"nap-{n}", "nap")
        skewed.run_until_idle()

        resume_at = skewed.job(TENANT, f"nap-{n}").resume_at
        assert resume_at is not None
        assert abs(resume_at - (datetime.now(UTC) + FIVE_MINUTES)) < CLOSE


class FirstStepHangs:
    """The first step runs until released; any later call returns at once."""

    def __init__(self) -> None:
        self.calls: Counter[str] = Counter()
        self.started = threading.Event()
        self.release = threading.Event()

    def execute(self, request: StepRequest) -> StepResult:
        self.calls[request.idempotency_key] += 1
        if not self.started.is_set():
            self.started.set()
            self.release.wait(10)
        return StepResult()


def test_a_worker_ten_minutes_ahead_does_not_take_over_a_live_lease(
    make_engine: EngineFactory,
) -> None:
    executor = FirstStepHangs()
    right = make_engine(registry=napping(), executor=executor, clock=SystemClock())
    ahead = make_engine(registry=napping(), executor=executor, clock=SkewedClock(SKEW))
    right.submit(TENANT, "held", "nap")
    running = threading.Thread(target=right.run_until_idle)
    running.start()
    try:
        assert executor.started.wait(10)
        # The lease is 15 s long: lapsed by a clock 10 minutes ahead, live by the store's.
        ahead.tick(TENANT, "held", "lease")
    finally:
        executor.release.set()
        running.join()

    assert list(executor.calls.values()) == [1], "the live step ran a second time"
    assert right.job(TENANT, "held").status is JobStatus.WAITING_TIME


def test_a_clock_that_jumps_is_set_to_the_stores_again(store_url: str) -> None:
    store = EventSourcedJobStore(parse_store_url(store_url))
    local = SkewedClock(SKEW)
    clock = StoreTimeClock(local, store.clock, refresh=0.05)
    try:
        assert abs(clock.now() - store.clock()) < CLOSE
        local.ahead = -SKEW  # the host's clock stepped 20 minutes back
        deadline = time.monotonic() + 5
        while abs(clock.now() - store.clock()) >= CLOSE:
            assert time.monotonic() < deadline, "the new offset was never measured"
            time.sleep(0.02)
    finally:
        clock.close()
        store.close()
