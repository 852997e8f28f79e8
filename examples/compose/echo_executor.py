"""The executor docker-compose.yml runs: a stand-in for your agent that echoes the step's
params. Point JOBLEDGER_EXECUTOR at your own ``module:attr`` instead."""

from __future__ import annotations

from jobledger import StepRequest, StepResult


class Echo:
    def execute(self, request: StepRequest) -> StepResult:
        name = request.resolution.step_name or f"step_{request.step_number}"
        return StepResult(
            output={"echo": dict(request.resolution.params), "key": request.idempotency_key},
            state_patch={name: "done"},
        )
