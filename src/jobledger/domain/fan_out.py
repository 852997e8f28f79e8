"""Child jobs: what a map step fans out, and when its join is met. Pure functions over
plain JSON (the shapes ``Job.ChildrenSpawned`` and ``Job.ChildFinished`` store), read
alike by the tick, replay and the views.

Each child's identity derives from the parent's step: its job id from the parent's job
id, step number and item index, its submit key from the step's idempotency key and the
index. Submitting it again (a re-delivered tick, a restart mid-spawn) finds the same job.
"""

from __future__ import annotations

from collections.abc import Mapping
from copy import deepcopy
from dataclasses import dataclass
from typing import Any, Final, Literal
from uuid import NAMESPACE_URL, uuid5

from jobledger.domain.status import JobStatus

JSON = dict[str, Any]
MAX_JOB_ID: Final = 200
"""Longest job id a submit takes (``engine.ids.MAX_ID_LENGTH``)."""


@dataclass(frozen=True)
class MapRequest:
    """What a map step's resolution asks for: the children (each one's item and input),
    their workflow, and the join."""

    workflow_type: str
    workflow_version: int
    items: tuple[tuple[Any, JSON], ...]
    """(item, the child's input), in item order."""
    need: int | None
    """How many children must complete; None: all of them must finish."""
    on_failure: Literal["fail_fast", "collect"]
    results: str
    on_timeout: str | None

    def to_params(self) -> JSON:
        """The request as the step's params: what its input hash (and replay) covers."""
        return {
            "workflow": self.workflow_type,
            "version": self.workflow_version,
            "items": [{"item": item, "input": data} for item, data in self.items],
            "need": self.need,
            "on_failure": self.on_failure,
            "results": self.results,
            "on_timeout": self.on_timeout,
        }


def child_job_id(parent_job_id: str, step_number: int, index: int, epoch: int = 0) -> str:
    """``{parent}.{step}.{index}``, readable in listings; a parent id too long for that
    gets a derived id of fixed length instead. A parent reset (``epoch`` > 0) spawns new
    children: ``{parent}.{step}@e{epoch}.{index}``."""
    step = f"{step_number}" if epoch == 0 else f"{step_number}@e{epoch}"
    readable = f"{parent_job_id}.{step}.{index}"
    if len(readable) <= MAX_JOB_ID:
        return readable
    return f"child-{uuid5(NAMESPACE_URL, readable).hex}"


def child_submit_key(step_key: str, index: int) -> str:
    """The child's submit idempotency key: the parent's step key and the item index."""
    return f"child:{uuid5(NAMESPACE_URL, f'{step_key}#{index}').hex}"


def plans(
    request: MapRequest, *, parent_job_id: str, step_number: int, step_key: str, epoch: int = 0
) -> list[JSON]:
    """The children a map step spawns, as ``Job.ChildrenSpawned`` stores them."""
    return [
        {
            "index": index,
            "step_number": step_number,
            "job_id": child_job_id(parent_job_id, step_number, index, epoch),
            "submit_key": child_submit_key(step_key, index),
            "workflow_type": request.workflow_type,
            "workflow_version": request.workflow_version,
            "item": deepcopy(item),
            "input": deepcopy(data),
        }
        for index, (item, data) in enumerate(request.items)
    ]


def join_spec(request: MapRequest, step_number: int, next_step: str | None) -> JSON:
    return {
        "step_number": step_number,
        "need": request.need,
        "on_failure": request.on_failure,
        "results": request.results,
        "next_step": next_step,
        "on_timeout": request.on_timeout,
    }


@dataclass(frozen=True)
class Verdict:
    """A join decided: go on (``joined``) or fail the parent, saying why."""

    joined: bool
    reason: str


def verdict(join: Mapping[str, Any], children: Mapping[str, JSON]) -> Verdict | None:
    """Whether the children's ends meet the join, fail it, or leave it open (None).

    fail_fast: any child that ends without completing fails the parent. collect: such
    ends are kept as results; the join is met when ``need`` children completed (every
    child finished, for ``all``), and fails once too few are left to reach ``need``."""
    ours = joined(join, children)
    ends = [c["end"] for c in ours if c["end"] is not None]
    completed = sum(1 for end in ends if end["status"] == JobStatus.COMPLETED)
    unsuccessful = [c for c in ours if c["end"] is not None and c["end"]["status"] != "completed"]
    if unsuccessful and join["on_failure"] == "fail_fast":
        first = unsuccessful[0]
        error = first["end"]["error"]
        why = f": {error}" if error else ""
        return Verdict(False, f"child {first['job_id']} {first['end']['status']}{why}")
    need = join["need"]
    if need is None:
        if len(ends) == len(ours):
            return Verdict(True, f"all {len(ours)} children finished ({completed} completed)")
        return None
    if completed >= need:
        return Verdict(True, f"{completed} of {len(ours)} children completed (join {need})")
    if len(ours) - len(unsuccessful) < need:
        return Verdict(
            False, f"only {len(ours) - len(unsuccessful)} children can still complete; join {need}"
        )
    return None


def results(join: Mapping[str, Any], children: Mapping[str, JSON]) -> list[JSON]:
    """One entry per item, in item order: the child, its status, and its result (its
    final state) or error. A child still running is ``unfinished``."""
    ours = sorted(joined(join, children), key=lambda c: int(c["index"]))
    return [_result(child) for child in ours]


def joined(join: Mapping[str, Any], children: Mapping[str, JSON]) -> list[JSON]:
    """The children the join waits on: its step's, but those a reset superseded (the
    step's children of an earlier epoch, ``SUPERSEDED``)."""
    step = join["step_number"]
    return [c for c in children.values() if c["step_number"] == step and not c.get(SUPERSEDED)]


def _result(child: Mapping[str, Any]) -> JSON:
    end = child["end"]
    entry: JSON = {"job_id": child["job_id"], "item": deepcopy(child["item"])}
    if end is None:
        return {**entry, "status": "unfinished"}
    if end["status"] == JobStatus.COMPLETED:
        return {**entry, "status": end["status"], "result": deepcopy(end["result"])}
    return {**entry, "status": end["status"], "error": end["error"]}


SUPERSEDED = "superseded"
"""Set on a child whose map step a reset superseded (``Job.Reset``): no join counts it, it
is never spawned if it was not yet, and it is cancelled if it still runs."""


def unfinished(children: Mapping[str, JSON]) -> list[JSON]:
    """The children whose end is not recorded yet, in spawn order."""
    waiting = (c for c in children.values() if c["end"] is None)
    return sorted(waiting, key=lambda c: (int(c["step_number"]), int(c["index"])))


def ended(
    status: JobStatus, state: Mapping[str, Any], error: str | None
) -> tuple[JSON, str | None]:
    """A finished child's (result, error) as its parent records them: a completed
    child's final state, or why it failed (None for a cancelled child: its
    ``Cancelled`` event says why)."""
    if status is JobStatus.COMPLETED:
        return deepcopy(dict(state)), None
    return {}, error if status is JobStatus.FAILED else None
