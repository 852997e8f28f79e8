"""The Notifier port's promises (jobledger.orchestration.ports.Notifier): when a job starts waiting
for the outside world, the notifier is told, with what it takes to answer."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from jobledger import Engine, FunctionRegistry, JobStatus
from jobledger.domain.steps import ApprovalSpec
from jobledger.orchestration.ports import ApprovalRequest, Notifier
from tests.support.workflows import DONE, STEP, linear_registry, review, wait_event

Open = Callable[[Notifier, FunctionRegistry], Engine]
"""An engine on the test's store that tells ``notifier``."""


def waits_then_asks() -> FunctionRegistry:
    """A step, a wait for ``invoice.paid``, an approval by alice, then done."""
    return linear_registry(
        {
            "gate": [
                STEP,
                wait_event("invoice.paid"),
                review(ApprovalSpec(approvers=("alice",))),
                DONE,
            ]
        }
    )


class NotifierContract:
    """Subclasses provide ``notifier`` and say where it keeps what it was told."""

    def tokens(self, notifier: Notifier) -> list[str]:
        """The resume tokens it was handed, oldest first."""
        raise NotImplementedError

    def approvals(self, notifier: Notifier) -> list[ApprovalRequest]:
        """The approval requests it was handed, oldest first."""
        raise NotImplementedError

    @pytest.fixture
    def engine(self, notifier: Notifier, open_engine: Open) -> Engine:
        return open_engine(notifier, waits_then_asks())

    def test_a_wait_hands_over_the_token_that_resumes_the_job(
        self, notifier: Notifier, engine: Engine
    ) -> None:
        engine.submit("t", "j", "gate")
        engine.run_until_idle()
        assert engine.job("t", "j").status is JobStatus.WAITING_EVENT
        (token,) = self.tokens(notifier)
        assert self.approvals(notifier) == []

        engine.resume(token, {"paid": True})
        engine.run_until_idle()
        assert engine.job("t", "j").status is JobStatus.AWAITING_APPROVAL

    def test_an_approval_hands_over_the_request_its_approver_decides(
        self, notifier: Notifier, engine: Engine
    ) -> None:
        engine.submit("t", "j", "gate")
        engine.run_until_idle()
        engine.resume(self.tokens(notifier)[0], {"paid": True})
        engine.run_until_idle()
        (request,) = self.approvals(notifier)
        assert request.approvers == ("alice",)

        engine.decide("t", "j", request.approval_id, "approve", "alice")
        engine.run_until_idle()
        assert engine.job("t", "j").status is JobStatus.COMPLETED

    def test_each_waiting_job_is_told_about_once(self, notifier: Notifier, engine: Engine) -> None:
        for job_id in ("a", "b"):
            engine.submit("t", job_id, "gate")
        engine.run_until_idle()
        engine.run_until_idle()  # nothing more to do: nobody is told twice
        assert len(set(self.tokens(notifier))) == len(self.tokens(notifier)) == 2
