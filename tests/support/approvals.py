"""The approval tests' workflows: ``payout`` (2 of alice, bob and carol approve, a
rejection goes to a fail step) and ``refund`` (alice alone), both leading to a ``pay``
step with params to edit; and an executor that keeps the params each step ran with."""

from __future__ import annotations

from typing import Any

from jobledger import StepRequest, StepResult
from jobledger.workflows import DefinitionRegistry
from jobledger.workflows.loader import parse_definition

PAYOUT = """
type: payout
version: 1
start: draft
steps:
  draft: {kind: run_interaction_task, params: {task: draft}, next: review}
  review:
    kind: await_approval
    approvers: [alice, bob, carol]
    quorum: 2
    on_approve: pay
    on_reject: declined
  pay: {kind: run_interaction_task, params: {task: pay, amount: 100, currency: EUR}, next: done}
  declined: {kind: fail, reason: declined}
  done: {kind: complete}
"""
REFUND = """
type: refund
version: 1
start: draft
steps:
  draft: {kind: run_interaction_task, params: {task: draft}, next: review}
  review: {kind: await_approval, approvers: [alice], on_approve: pay}
  pay: {kind: run_interaction_task, params: {task: pay, amount: 100, currency: EUR}, next: done}
  done: {kind: complete}
"""


def approvals_registry() -> DefinitionRegistry:
    texts = (PAYOUT, REFUND)
    return DefinitionRegistry(parse_definition(t, f"d{i}.yaml") for i, t in enumerate(texts))


class Recorder:
    """The executor: keeps the params each step ran with, by step name."""

    def __init__(self) -> None:
        self.params: dict[str, dict[str, Any]] = {}

    def execute(self, request: StepRequest) -> StepResult:
        self.params[str(request.resolution.step_name)] = dict(request.resolution.params)
        return StepResult(output={"ran": request.resolution.step_name})
