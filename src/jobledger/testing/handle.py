"""A job as a test sees it: its status, its recorded steps, its result, its children."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from jobledger.domain.status import JobStatus
from jobledger.domain.views import HistoryEntry, JobView
from jobledger.engine.engine import Engine
from jobledger.testing.notices import ApprovalNotice, RecordingNotifier, TokenNotice
from jobledger.workflows.tasks import RESULT_KEY

STEP_RECORDED = "StepRecorded"
COMPLETE = "complete"


class WorkflowTestError(AssertionError):
    """A test asked for what a job cannot give: a result it never returned, a status it
    can no longer reach, a token or approval it was never handed. An AssertionError, so
    pytest reports it as a failed check."""


@dataclass(frozen=True)
class StepRecord:
    """One recorded step of a job, in order."""

    number: int
    name: str
    """A code workflow's: the task's name, ``sleep``, ``wait_event``, ``approval``,
    ``map`` or ``complete``; a definition's: the step's id."""
    type: str
    """``run_interaction_task``, ``wait_time``, ``wait_event``, ``await_approval``, ..."""
    output: dict[str, Any]
    cost_usd: Decimal
    reason: str | None

    @property
    def result(self) -> Any:
        """A step function's return value, as recorded (JSON); None for other steps."""
        return self.output.get(RESULT_KEY)

    @classmethod
    def of(cls, entry: HistoryEntry) -> StepRecord:
        data = entry.data
        return cls(
            number=data["step_number"],
            name=data.get("step_name") or data["step_type"],
            type=data["step_type"],
            output=dict(data.get("output") or {}),
            cost_usd=Decimal(str(data.get("cost_usd", 0))),
            reason=data.get("transition_reason"),
        )


class JobHandle:
    """A job of a :class:`~jobledger.testing.WorkflowTestEnv`: every read is fresh from the
    store. ``decode``: turns the recorded return value into the workflow's declared type."""

    def __init__(
        self,
        engine: Engine,
        notifier: RecordingNotifier,
        tenant_id: str,
        job_id: str,
        decode: Callable[[str, int, Any], Any],
    ) -> None:
        self.engine = engine
        self.notifier = notifier
        self.tenant_id = tenant_id
        self.job_id = job_id
        self._decode = decode

    def __repr__(self) -> str:
        return f"<job {self.tenant_id}/{self.job_id}>"

    @property
    def view(self) -> JobView:
        """The job now (``engine.job``)."""
        return self.engine.job(self.tenant_id, self.job_id)

    @property
    def status(self) -> JobStatus:
        return self.view.status

    @property
    def last_error(self) -> str | None:
        return self.view.last_error

    @property
    def state(self) -> dict[str, Any]:
        return dict(self.view.state)

    def describe(self) -> str:
        """The job's status, what it waits for and its last error: what a failed check
        says about it."""
        view = self.view
        parts = [f"job {self.tenant_id}/{self.job_id} is {view.status}"]
        if view.wait_event_name is not None:
            parts.append(f"waiting for event {view.wait_event_name!r}")
        if view.pending_approval_id is not None:
            parts.append(f"awaiting approval {view.pending_approval_id!r}")
        if view.resume_at is not None and not view.status.is_terminal:
            parts.append(f"due at {view.resume_at.isoformat()}")
        if view.last_error:
            parts.append(f"last_error: {view.last_error}")
        return "; ".join(parts)

    def history(self) -> list[HistoryEntry]:
        """Every event of the job, in order (``engine.history``)."""
        return self.engine.history(self.tenant_id, self.job_id)

    def event_types(self) -> list[str]:
        """The history's event types, in order: ``Submitted``, ``Claimed``, ``StepRecorded``, ..."""
        return [entry.event_type for entry in self.history()]

    def steps(self) -> list[StepRecord]:
        """The job's recorded steps, in order."""
        return [StepRecord.of(e) for e in self.history() if e.event_type == STEP_RECORDED]

    def step_names(self) -> list[str]:
        return [record.name for record in self.steps()]

    def result(self) -> Any:
        """What the workflow returned, as its declared return type (a code workflow's), or
        the job's final state (a definition's). A :class:`WorkflowTestError` unless the job
        completed."""
        view = self.view
        if view.status is not JobStatus.COMPLETED:
            raise WorkflowTestError(f"no result: {self.describe()}")
        completes = [s for s in self.steps() if s.type == COMPLETE and RESULT_KEY in s.output]
        if not completes:
            return dict(view.state)
        return self._decode(view.workflow_type, view.workflow_version, completes[-1].result)

    def children(self) -> list[JobHandle]:
        """The child jobs its ``wf.map`` steps spawned, in order."""
        family = self.engine.family(self.tenant_id, self.job_id)
        return [
            JobHandle(self.engine, self.notifier, self.tenant_id, row.job_id, self._decode)
            for row in family.children
        ]

    def tokens(self) -> list[TokenNotice]:
        """The resume tokens handed out for this job's event waits, oldest first."""
        return self.notifier.tokens_of(self.tenant_id, self.job_id)

    def approvals(self) -> list[ApprovalNotice]:
        """The approval requests handed out for this job, oldest first."""
        return self.notifier.approvals_of(self.tenant_id, self.job_id)

    @property
    def approval(self) -> ApprovalNotice | None:
        """The approval request the job waits on now, or None."""
        pending = self.view.pending_approval_id
        found = [a for a in self.approvals() if a.request.approval_id == pending]
        return found[-1] if pending is not None and found else None


def assert_steps(handle: JobHandle, expected: Sequence[str]) -> None:
    """Check the job recorded exactly these steps, by name, in this order."""
    recorded = handle.step_names()
    if recorded != list(expected):
        raise WorkflowTestError(
            f"job {handle.tenant_id}/{handle.job_id} recorded steps {recorded}, "
            f"expected {list(expected)} ({handle.describe()})"
        )
