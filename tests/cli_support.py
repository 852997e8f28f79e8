"""A step executor for tests/test_cli.py, loaded by the real ``jobledger`` console script
through ``executor = "cli_support:RecordingExecutor"`` (tests/ is on its PYTHONPATH).

Each side effect appends its idempotency key to the file named by CLI_SUPPORT_EFFECTS, so
the test can count them across processes.
"""

from __future__ import annotations

import os

from jobledger import StepRequest, StepResult

EFFECTS_VARIABLE = "CLI_SUPPORT_EFFECTS"


class RecordingExecutor:
    def execute(self, request: StepRequest) -> StepResult:
        task = str(request.resolution.params.get("task", request.step_type))
        path = os.environ.get(EFFECTS_VARIABLE)
        if path:
            with open(path, "a", encoding="utf-8") as effects:
                effects.write(f"{request.idempotency_key}\n")
        return StepResult(output={"task": task}, state_patch={f"did_{task}": True}, cost_usd="0.10")
