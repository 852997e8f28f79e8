"""What an approver answers besides yes or no: an edit of the params of the step the
approval leads to, and data for the steps after it. Each is recorded in the decision with
its sha256, and an edit is applied to that step's resolution by the tick and by replay
alike, so the step runs, and replays, with exactly the params the approver approved."""

from __future__ import annotations

import hashlib
import json
from dataclasses import replace
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the job imports this module, and the steps module imports the job
    from jobledger.domain.steps import Resolution

JSON = dict[str, Any]


def answer_sha256(answer: JSON) -> str:
    """sha256 of an edit or a data answer, over its canonical JSON (sorted keys)."""
    encoded = json.dumps(answer, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(encoded.encode()).hexdigest()


def approved_edit(step: str, params: JSON) -> JSON:
    """The edit a job keeps until the step it was made for runs."""
    return {"step": step, "params": params}


def with_edit(edit: JSON | None, resolution: Resolution) -> Resolution:
    """The resolution the step runs with: its params with the approver's edit over them,
    when the edit was made for this step; else the resolution unchanged."""
    if edit is None or edit["step"] != resolution.step_name:
        return resolution
    return replace(resolution, params={**resolution.params, **edit["params"]})
