"""The example service's workflow, tested without a broker (``jobledger_env``): a paid
order ships, an unpaid one fails after its three days, an underpaid one at once. The
service end to end, on a real broker: tests/test_kafka_service_example.py."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta

import pytest
from shop import PAYMENT_EVENT, Shipment, order

from jobledger import JobStatus
from jobledger.testing import JobHandle, WorkflowTestEnv, assert_steps

ORDER = {
    "order_id": "o-1",
    "customer": "c-1",
    "lines": [{"sku": "lamp", "quantity": 2}, {"sku": "bulb", "quantity": 3}],
    "total": "25.00",
}


@pytest.fixture
def env(jobledger_env: Callable[..., WorkflowTestEnv]) -> WorkflowTestEnv:
    return jobledger_env([order])


def waiting(env: WorkflowTestEnv) -> JobHandle:
    job = env.start(order, ORDER, job_id="o-1")
    assert job.status is JobStatus.WAITING_EVENT
    return job


def test_a_paid_order_ships(env: WorkflowTestEnv) -> None:
    job = waiting(env)
    env.signal(job, PAYMENT_EVENT, {"payment_id": "p-1", "order_id": "o-1", "amount": "25.00"})
    shipment = job.result()
    assert isinstance(shipment, Shipment)
    assert shipment.payment_id == "p-1" and shipment.reservation == "R-test/o-1:step:1"
    assert job.steps()[0].result["units"] == 5
    assert_steps(job, ["reserve", "wait_event", "ship", "complete"])


def test_an_unpaid_order_fails_after_three_days(env: WorkflowTestEnv) -> None:
    job = waiting(env)
    env.advance(timedelta(days=3))
    assert job.status is JobStatus.FAILED
    assert "no payment within 3 days" in (job.view.last_error or "")


def test_an_underpaid_order_fails(env: WorkflowTestEnv) -> None:
    job = waiting(env)
    env.signal(job, PAYMENT_EVENT, {"payment_id": "p-1", "amount": "20"})
    assert job.status is JobStatus.FAILED
    assert "paid 20 of 25.00" in (job.view.last_error or "")
