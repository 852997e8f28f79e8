"""The Clock port's promises (jobledger.orchestration.ports.Clock)."""

from __future__ import annotations

from datetime import UTC, timedelta

from jobledger.orchestration.ports import Clock


class ClockContract:
    """Subclasses provide ``clock``."""

    def test_now_is_timezone_aware_utc(self, clock: Clock) -> None:
        now = clock.now()
        assert now.tzinfo is not None and now.utcoffset() == timedelta(0)
        assert now.astimezone(UTC) == now

    def test_sleeping_moves_now_on_by_at_least_the_time_slept(self, clock: Clock) -> None:
        before = clock.now()
        clock.sleep(0.02)
        assert clock.now() - before >= timedelta(seconds=0.02)

    def test_now_never_goes_back_and_a_negative_sleep_returns_at_once(self, clock: Clock) -> None:
        readings = [clock.now()]
        for _ in range(5):
            clock.sleep(-1)
            readings.append(clock.now())
        assert readings == sorted(readings)
