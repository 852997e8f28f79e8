"""The repair example's test: the failed order is retried on the fixed version, and the
paid steps before the failure are not run again (counted by the step functions)."""

from __future__ import annotations

from decimal import Decimal
from pathlib import Path

from orders import CALLS, TENANT, order_v2, run

from jobledger import Engine, JobStatus


def test_a_failed_order_is_retried_on_the_fixed_version_without_paying_twice(
    tmp_path: Path,
) -> None:
    CALLS.clear()
    store = f"sqlite:///{tmp_path / 'orders.db'}"
    run(store)

    assert CALLS == {"quote": 1, "reserve": 1, "settle": 2}  # the buggy call, the fixed one
    with Engine.open(store, workflows=[order_v2]) as engine:
        view = engine.job(TENANT, "o1")
        assert (view.status, view.workflow_version) == (JobStatus.COMPLETED, 2)
        assert view.total_cost_usd == Decimal("1.00")  # steps 1-2, paid once
        history = engine.history(TENANT, "o1")
        types = [entry.event_type for entry in history]
        assert types.count("Failed") == 1 and types.count("Retried") == 1
        keys = [e.data["idempotency_key"] for e in history if e.event_type == "StepRecorded"]
        assert keys[:3] == ["shop/o1:step:1", "shop/o1:step:2", "shop/o1:step:3"]
        assert engine.verify(TENANT, "o1") is None
