"""The example service's workflow: an order from the ``shop.orders`` topic reserves its
stock, waits for its payment from the ``shop.payments`` topic, then ships.

``jobledger.toml`` beside this file serves it (``workflows = ["shop"]``) and subscribes
the two topics to it; ``test_shop.py`` tests it without a broker.
"""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal

from pydantic import BaseModel

from jobledger import StepContext, WorkflowContext, step, workflow

PAYMENT_EVENT = "payment.received"
"""The event the payments subscription delivers (its ``event``)."""


class Line(BaseModel):
    sku: str
    quantity: int


class Reservation(BaseModel):
    order_id: str
    reference: str
    units: int


class Payment(BaseModel):
    """A message of the payments topic, as the subscription delivers it."""

    payment_id: str
    amount: Decimal


class Shipment(BaseModel):
    order_id: str
    reservation: str
    payment_id: str


@step
def reserve(ctx: StepContext, order_id: str, lines: list[Line]) -> Reservation:
    """Stand-in for the stock service: the step's idempotency key makes the reference,
    so a step delivered again reserves under the same one."""
    units = sum(line.quantity for line in lines)
    return Reservation(order_id=order_id, reference=f"R-{ctx.idempotency_key}", units=units)


@step
def ship(ctx: StepContext, reservation: Reservation, payment: Payment) -> Shipment:
    return Shipment(
        order_id=reservation.order_id,
        reservation=reservation.reference,
        payment_id=payment.payment_id,
    )


@workflow("order", version=1)
async def order(
    wf: WorkflowContext, order_id: str, customer: str, lines: list[Line], total: Decimal
) -> Shipment:
    reservation = await wf.step(reserve, order_id, lines)
    paid = await wf.wait_event(PAYMENT_EVENT, timeout=timedelta(days=3))
    if paid is None:
        wf.fail("no payment within 3 days")
    payment = Payment.model_validate(paid)
    if payment.amount < total:
        wf.fail(f"paid {payment.amount} of {total}")
    shipment: Shipment = await wf.step(ship, reservation, payment)
    return shipment
