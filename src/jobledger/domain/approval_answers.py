"""What an approver answers besides yes or no: an edit of the params of the step the
approval leads to, and data for the steps after it. Each is recorded in the decision with
its sha256, and an edit is applied to that step's resolution by the tick and by replay
alike, so the step runs, and replays, with exactly the params the approver approved."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Collection
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from jobledger.domain.errors import InvalidPayloadError
from jobledger.domain.substate import APPROVED, ApprovalGate

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


def check_edit(
    approval: ApprovalGate, decision: str, edit: JSON, editable: Collection[str] | None
) -> None:
    """An edit changes what runs next: it goes with an approval by one decider, of a
    request that leads to a named step, and sets only params that step has
    (``editable``; None: no definition says which: a code workflow's step). A key the
    step lacks would be an input its author never meant."""
    if decision != APPROVED:
        raise InvalidPayloadError("an edit goes with an approval, not a rejection")
    if approval.quorum is not None:
        # Another voter would have approved params they never saw.
        raise InvalidPayloadError(
            f"approval {approval.approval_id!r} needs {approval.quorum} votes; "
            "a request decided by several approvers takes no edits"
        )
    if approval.on_approve is None:
        raise InvalidPayloadError(
            f"approval {approval.approval_id!r} leads to no named step; there are no params to edit"
        )
    step = approval.on_approve
    if editable is None:
        raise InvalidPayloadError(
            f"step {step!r} has no declarative definition here; only the params of a "
            "definition's step can be edited"
        )
    unknown = sorted(set(edit) - set(editable))
    if unknown:
        allowed = ", ".join(sorted(editable)) or "none"
        raise InvalidPayloadError(
            f"step {step!r} has no param {', '.join(map(repr, unknown))} to edit "
            f"(its params: {allowed})"
        )
