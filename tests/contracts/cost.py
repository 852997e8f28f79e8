"""The Cost port's promises (jobledger.orchestration.ports.Cost): a tenant's spend per UTC day, from
the step costs on the log."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timedelta
from decimal import Decimal

from jobledger import Engine
from jobledger.adapters.clock import FakeClock
from jobledger.orchestration.ports import Cost

CostReader = Callable[[], Cost]
"""The adapter as it reads the store now (a view caught up with the log, say)."""


def day(clock: FakeClock) -> datetime:
    return clock.now().replace(hour=0, minute=0, second=0, microsecond=0)


def run_job(engine: Engine, tenant_id: str, job_id: str) -> None:
    """agent3: three steps of 0.10 each (the counting executor's cost)."""
    engine.submit(tenant_id, job_id, "agent3")
    engine.run_until_idle()


class CostContract:
    """Subclasses provide ``cost``: a :data:`CostReader` over the ``engine`` fixture's
    store (the engine below, whose executor charges 0.10 a step)."""

    def test_a_tenant_that_spent_nothing_spent_zero(
        self, engine: Engine, cost: CostReader, clock: FakeClock
    ) -> None:
        run_job(engine, "t", "j")
        assert cost().tenant_day_spend_usd("nobody", day(clock)) == Decimal("0")

    def test_spend_is_summed_per_tenant_and_utc_day(
        self, engine: Engine, cost: CostReader, clock: FakeClock
    ) -> None:
        first_day = day(clock)
        run_job(engine, "t", "a")
        run_job(engine, "u", "b")
        clock.advance(timedelta(days=1))
        run_job(engine, "t", "c")
        run_job(engine, "t", "d")

        reader = cost()
        assert reader.tenant_day_spend_usd("t", first_day) == Decimal("0.30")
        assert reader.tenant_day_spend_usd("u", first_day) == Decimal("0.30")
        assert reader.tenant_day_spend_usd("t", day(clock)) == Decimal("0.60")
        assert reader.tenant_day_spend_usd("u", day(clock)) == Decimal("0")
        assert reader.tenant_day_spend_usd("t", day(clock) + timedelta(days=1)) == Decimal("0")

    def test_spend_appended_after_a_read_is_in_the_next_read(
        self, engine: Engine, cost: CostReader, clock: FakeClock
    ) -> None:
        run_job(engine, "t", "a")
        assert cost().tenant_day_spend_usd("t", day(clock)) == Decimal("0.30")
        run_job(engine, "t", "b")
        assert cost().tenant_day_spend_usd("t", day(clock)) == Decimal("0.60")
