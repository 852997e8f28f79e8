"""A failed job retried after its code is fixed, its paid steps not run again.

An order takes three agent steps: ``quote`` ($0.40) and ``reserve`` ($0.60) cost money;
``settle`` has a bug in version 1 (it divides by the discounted units, zero for an order
without a discount). The job fails in step 3 with $1.00 spent. Version 2 fixes ``settle``;
the job is retried on it: replay checks that version 2 would have recorded steps 1-2 as
they are, step 3 runs again (under the key its failed attempt had) and the job completes.
``CALLS`` counts each step function's calls: quote and reserve ran once.

Run it: ``python examples/repair_mission/orders.py [STORE_URL]``; its test is
``test_orders.py`` beside it.
"""

from __future__ import annotations

import sys
import tempfile
from collections import Counter
from decimal import Decimal
from pathlib import Path

from pydantic import BaseModel

from jobledger import Engine, JobStatus, StepContext, WorkflowContext, step, workflow

TENANT = "shop"
CALLS: Counter[str] = Counter()
"""How often each step function ran: the side effects a retry must not repeat."""


class Order(BaseModel):
    item: str
    quantity: int
    unit_price: Decimal
    discounted_units: int = 0


class Quote(BaseModel):
    order: Order
    total: Decimal


class Reservation(BaseModel):
    quote: Quote
    reference: str


class Receipt(BaseModel):
    reference: str
    total: Decimal
    per_unit: Decimal


@step
def quote(ctx: StepContext, order: Order) -> Quote:
    CALLS["quote"] += 1
    ctx.spend("0.40")
    return Quote(order=order, total=order.unit_price * order.quantity)


@step
def reserve(ctx: StepContext, quote: Quote) -> Reservation:
    CALLS["reserve"] += 1
    ctx.spend("0.60")
    return Reservation(quote=quote, reference=f"R-{ctx.idempotency_key}")


@step("settle")
def settle_v1(ctx: StepContext, reservation: Reservation) -> Receipt:
    """The bug: divides by the discounted units, which an order without a discount has none of."""
    CALLS["settle"] += 1
    order = reservation.quote.order
    per_unit = reservation.quote.total / (order.quantity // order.discounted_units)
    total = reservation.quote.total
    return Receipt(reference=reservation.reference, total=total, per_unit=per_unit)


@step("settle")
def settle(ctx: StepContext, reservation: Reservation) -> Receipt:
    """The fix: the price per unit over every unit ordered."""
    CALLS["settle"] += 1
    total = reservation.quote.total
    per_unit = total / reservation.quote.order.quantity
    return Receipt(reference=reservation.reference, total=total, per_unit=per_unit)


@workflow("order", version=1)
async def order_v1(wf: WorkflowContext, order: Order) -> Receipt:
    reservation = await wf.step(reserve, await wf.step(quote, order))
    receipt: Receipt = await wf.step(settle_v1, reservation)
    return receipt


@workflow("order", version=2)
async def order_v2(wf: WorkflowContext, order: Order) -> Receipt:
    reservation = await wf.step(reserve, await wf.step(quote, order))
    receipt: Receipt = await wf.step(settle, reservation)
    return receipt


ORDER = Order(item="lamp", quantity=4, unit_price=Decimal("12.50"))


def run(store_url: str, job_id: str = "o1") -> Engine:
    """The story, on ``store_url``: deployed with version 1, the job fails in step 3;
    redeployed with version 2 (the fix), it is retried there and completes. Returns the
    second engine, closed (its store is still readable by a new one)."""
    with Engine.open(store_url, workflows=[order_v1]) as first:
        first.submit(TENANT, job_id, "order", input={"order": ORDER.model_dump(mode="json")})
        first.run_until_idle()
        failed = first.job(TENANT, job_id)
        assert failed.status is JobStatus.FAILED, failed
        spent = failed.total_cost_usd
        print(f"v1: {job_id} {failed.status}, ${spent} spent: {failed.last_error}")
    with Engine.open(store_url, workflows=[order_v2]) as fixed:
        repaired = fixed.retry(TENANT, job_id, by="dev", reason="settle fixed in v2", to_version=2)
        print(f"retry on v2: {repaired.replay_verdict}")
        fixed.run_until_idle()
        done = fixed.job(TENANT, job_id)
        print(f"v2: {job_id} {done.status}, ${done.total_cost_usd} spent; calls {dict(CALLS)}")
    return fixed


if __name__ == "__main__":
    if len(sys.argv) > 1:
        run(sys.argv[1])
    else:
        with tempfile.TemporaryDirectory() as directory:
            run(f"sqlite:///{Path(directory) / 'orders.db'}")
