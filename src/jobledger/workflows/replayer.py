"""The resolver made from code: a code workflow's next step is found by replaying its body
against the job's recorded history.

The history is read as a journal: one entry per recorded step, with what the body gets
back once it ends (a step's return value, an event's payload, a decision, the children's
results). Replaying feeds entry k to the body's k-th command, checking first that the
command is the step the history recorded there (its kind and name, and for waits what
they wait for): any other command is a :class:`NonDeterminismError` and the job is left
as it is. The first command past the journal is the next step.

Replaying from the start costs one pass over the history, so the registry keeps each
hot job's suspended body (a coroutine cannot be copied, only kept): the next step feeds
it just the entries recorded since. A body is replayed cold only when the registry has
none for the job (a restart, another worker) or the history moved in a way it did not
expect (another worker's step).
"""

from __future__ import annotations

import threading
import traceback
from collections import Counter, OrderedDict, deque
from collections.abc import Coroutine, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Final
from uuid import UUID

from jobledger.domain.errors import (
    NonDeterminismError,
    StepError,
    WorkflowBodyError,
)
from jobledger.domain.job import Job
from jobledger.domain.status import JobStatus
from jobledger.domain.steps import Resolution, ResolveRequest
from jobledger.domain.transition import input_sha256
from jobledger.orchestration.registry import newest_version, unknown_workflow
from jobledger.workflows.code import (
    APPROVED,
    EXPIRED,
    REJECTED,
    Approval,
    ChildResult,
    CodeWorkflow,
    Command,
    WorkflowContext,
    WorkflowFailed,
    describe,
)
from jobledger.workflows.tasks import RESULT_KEY

HOT_JOBS: Final = 10_000
"""How many suspended bodies a registry keeps (the least recently used go first)."""
RUN_STEP: Final = "run_interaction_task"


# ---- the journal ---------------------------------------------------------------------------


@dataclass
class Entry:
    """One recorded step as the body sees it."""

    step_number: int
    step_type: str
    step_name: str | None
    input_sha256: str | None
    params_hint: dict[str, Any]
    ended: bool
    value: Any = None
    ended_at: datetime | None = None

    @property
    def label(self) -> str:
        return describe(self.step_type, self.step_name, self.params_hint)


@dataclass
class Journal:
    """The entries of a job's history, built one event at a time (cold: all of them; hot:
    those recorded since the body was suspended)."""

    entries: deque[Entry] = field(default_factory=deque)
    """Recorded steps the body has not been fed yet (fed ones are dropped: a hot body
    holds only what it has still to read)."""
    version: int = 0
    """The last event's version taken in."""
    submitted: Job.Submitted | None = None

    def take(self, events: Iterable[Any]) -> None:
        for event in events:
            self._take(event)
            self.version = event.originator_version

    def _take(self, event: Any) -> None:
        if isinstance(event, Job.Submitted):
            self.submitted = event
        elif isinstance(event, Job.StepRecorded):
            self._recorded(event)
        elif isinstance(event, Job.Resumed):
            self._end(event.timestamp, dict(event.payload))
        elif isinstance(event, Job.WaitTimedOut):
            self._end(event.timestamp, None)
        elif isinstance(event, Job.ApprovalDecided):
            decision = APPROVED if event.decision == APPROVED else REJECTED
            answer = Approval(decision, event.decided_by, event.comment, event.data)
            self._end(event.timestamp, answer)
        elif isinstance(event, Job.ApprovalExpired):
            self._end(event.timestamp, Approval(EXPIRED))
        elif isinstance(event, Job.JoinEnded):
            self._end(event.timestamp, [_child_result(r) for r in event.results])
        elif isinstance(event, Job.Reset):
            # The steps after the reset's are superseded: the body runs them again.
            kept = [e for e in self.entries if e.step_number <= event.step_number]
            self.entries = deque(kept)

    def _recorded(self, event: Job.StepRecorded) -> None:
        status = JobStatus(event.next_status)
        output = dict(event.output)
        value = output.get(RESULT_KEY, output) if event.step_type == RUN_STEP else None
        # A timer ends when it fires: the body goes on at resume_at, nothing records it.
        ended = status in (JobStatus.QUEUED, JobStatus.RUNNING, JobStatus.WAITING_TIME)
        ended_at = event.resume_at if status is JobStatus.WAITING_TIME else event.ended_at
        self.entries.append(
            Entry(
                step_number=event.step_number,
                step_type=event.step_type,
                step_name=event.step_name,
                input_sha256=getattr(event, "input_sha256", None),
                params_hint=_hint(event),
                ended=ended,
                value=value,
                ended_at=ended_at if ended else None,
            )
        )

    def _end(self, at: datetime, value: Any) -> None:
        if self.entries and not self.entries[-1].ended:
            last = self.entries[-1]
            last.ended, last.value, last.ended_at = True, value, at


def _hint(event: Job.StepRecorded) -> dict[str, Any]:
    """What a non-determinism report says of a recorded wait (its params are hashed only)."""
    if event.step_type == "wait_event" and event.wait_event:
        return {"event": event.wait_event.get("name")}
    if event.step_type == "wait_time" and event.resume_at is not None:
        return {"until": event.resume_at.isoformat()}
    return {}


def _child_result(result: dict[str, Any]) -> ChildResult:
    final = result.get("result")
    value = final.get(RESULT_KEY, final) if isinstance(final, dict) else final
    return ChildResult(
        job_id=result["job_id"],
        item=result.get("item"),
        status=result["status"],
        result=value,
        error=result.get("error"),
    )


# ---- one body, suspended between its steps ----------------------------------------------


class Suspended:
    """A workflow body replayed up to the command it waits on."""

    def __init__(self, workflow: CodeWorkflow, journal: Journal) -> None:
        submitted = journal.submitted
        if submitted is None:
            raise ValueError("the job's history does not start with its submit")
        self.workflow = workflow
        self.journal = journal
        self.context = WorkflowContext(
            tenant_id=submitted.tenant_id,
            job_id=submitted.job_id,
            workflow_type=workflow.type,
            workflow_version=workflow.version,
            _job_uuid=str(submitted.originator_id),
            _now=submitted.timestamp,
        )
        self.position = 0
        """How many journal entries the body has been fed."""
        self.visits: Counter[str] = Counter()
        """How often the body's fed steps were recorded, by step name (``max_visits``)."""
        self.pending: Command | None = None
        """The command the body waits on (not in the journal yet), once it has one."""
        self.resolution: Resolution | None = None
        self.finished = False
        arguments = workflow.arguments(submitted.state)
        self.body: Coroutine[Any, Any, Any] = workflow.body(self.context, **arguments)

    def advance(self) -> Resolution:
        """Feed the body every entry it has not had, checking each against what it asks
        for, and return its next step."""
        self._feed(open_wait=False)
        assert self.resolution is not None
        return self.resolution

    def check(self) -> None:
        """Feed the body the ended entries and check them all, the last one included
        when it is a wait still open (it is checked, not fed)."""
        self._feed(open_wait=True)

    def _feed(self, *, open_wait: bool) -> None:
        entries = self.journal.entries
        if self.pending is None and not self.finished:
            self._send(None, first=True)
        while entries:
            entry = entries[0]
            self._check(entry)
            if self.finished:  # the history's record of the body's own end: nothing follows
                entries.popleft()
                continue
            if not entry.ended:
                if open_wait:
                    return
                raise RuntimeError(f"step {entry.step_number} has not ended: nothing to resolve")
            entries.popleft()
            self.position += 1
            self.visits[entry.step_name or entry.step_type] += 1
            self.context._woken(self.position, entry.ended_at or self.context.now())
            self._send(entry.value)

    def _check(self, entry: Entry) -> None:
        """The body's command must be the step the history recorded at this place."""
        if self.finished or self.pending is None:
            ended = self.resolution
            assert ended is not None
            if len(self.journal.entries) == 1 and (
                ended.step_type,
                ended.step_name,
            ) == (entry.step_type, entry.step_name):
                return
            self._diverged(entry, _final_label(ended))
        assert self.pending is not None
        asked = self.pending.resolution
        same = (asked.step_type, asked.step_name) == (entry.step_type, entry.step_name)
        # A step's arguments may change with the code that computes them; what a wait
        # waits for, and for how long, may not (the recorded timer or gate would lie).
        if same and asked.step_type != RUN_STEP and entry.input_sha256 is not None:
            same = input_sha256(asked) == entry.input_sha256
        if not same:
            self._diverged(entry, self.pending.label)

    def _diverged(self, entry: Entry, requested: str) -> None:
        workflow = self.workflow
        raise NonDeterminismError(
            f"{workflow.label} does not replay its history: at step {entry.step_number} the "
            f"history holds {entry.label}, the code asks for {requested}",
            step_number=entry.step_number,
            recorded=entry.label,
            requested=requested,
        )

    def _send(self, value: Any, *, first: bool = False) -> None:
        try:
            yielded = self.body.send(None if first else value)
        except StopIteration as done:
            self._finish(done.value)
            return
        except WorkflowFailed as failed:
            self._close(_failure(failed.reason))
            return
        except NonDeterminismError:
            raise
        except Exception as error:
            raise _body_error(self.workflow, error) from None
        if not isinstance(yielded, Command):
            self.body.close()
            raise _body_error(
                self.workflow,
                TypeError(
                    f"a workflow body may await only wf.* commands, not {yielded!r} (its "
                    "replay must not depend on anything outside the history)"
                ),
            )
        self.pending = yielded
        self.resolution = self._bounded(yielded.resolution)

    def _bounded(self, resolution: Resolution) -> Resolution:
        """A step name past ``max_visits`` fails the job, saying so (a runaway loop)."""
        name = resolution.step_name or resolution.step_type
        if self.visits[name] < self.workflow.max_visits:
            return resolution
        return _failure(
            f"step {name!r} reached its bound of max_visits={self.workflow.max_visits} "
            f"({self.workflow.label})"
        )

    def _finish(self, value: Any) -> None:
        try:
            encoded = self.workflow.encode_result(value)
        except ValueError as error:
            raise _body_error(self.workflow, error) from None
        self._close(
            Resolution(
                step_type="complete",
                next_status=JobStatus.COMPLETED,
                step_name="complete",
                transition_reason=f"{self.workflow.label} returned",
                output={RESULT_KEY: encoded},
                state_patch={RESULT_KEY: encoded},
            )
        )

    def _close(self, resolution: Resolution) -> None:
        self.finished, self.pending, self.resolution = True, None, resolution


def _failure(reason: str) -> Resolution:
    return Resolution(
        step_type="fail", next_status=JobStatus.FAILED, step_name="fail", transition_reason=reason
    )


def _final_label(resolution: Resolution) -> str:
    if resolution.next_status is JobStatus.COMPLETED:
        return "its return (no further step)"
    return f"wf.fail({resolution.transition_reason!r})"


def _body_error(workflow: CodeWorkflow, error: BaseException) -> WorkflowBodyError:
    trace = "".join(traceback.format_exception(error)).rstrip()
    return WorkflowBodyError(
        f"{workflow.label} raised {type(error).__name__}: {error}\n{trace}",
        retryable=isinstance(error, StepError) and error.retryable,
        kind=error.kind if isinstance(error, StepError) else type(error).__name__,
        retry_policy=workflow.retry,
    )


# ---- the registry --------------------------------------------------------------------------


class CodeRegistry:
    """The WorkflowRegistry port over code workflows, keeping hot jobs' suspended bodies."""

    def __init__(self, workflows: Iterable[CodeWorkflow] = (), *, hot_jobs: int = HOT_JOBS) -> None:
        self._workflows: dict[tuple[str, int], CodeWorkflow] = {}
        self._hot: OrderedDict[UUID, tuple[int, Suspended]] = OrderedDict()
        self._lock = threading.Lock()
        self.hot_jobs = hot_jobs
        self.cold_replays = 0
        """How many times a body was replayed from the start (for tests and benchmarks)."""
        for workflow in workflows:
            self.add(workflow)

    def add(self, workflow: CodeWorkflow) -> None:
        if not isinstance(workflow, CodeWorkflow):
            raise TypeError(f"not a @workflow: {workflow!r}")
        if workflow.key in self._workflows:
            raise ValueError(f"{workflow.label} is registered twice")
        self._workflows[workflow.key] = workflow

    def get(self, workflow_type: str, workflow_version: int) -> CodeWorkflow:
        found = self._workflows.get((workflow_type, workflow_version))
        if found is None:
            raise unknown_workflow(self._workflows, workflow_type, workflow_version)
        return found

    def workflows(self) -> list[CodeWorkflow]:
        return [self._workflows[key] for key in sorted(self._workflows)]

    # ---- the WorkflowRegistry port ---------------------------------------------------

    def latest_version(self, workflow_type: str) -> int:
        return newest_version(self._workflows, workflow_type)

    def has(self, workflow_type: str, workflow_version: int) -> bool:
        return (workflow_type, workflow_version) in self._workflows

    def known(self) -> list[tuple[str, int]]:
        return sorted(self._workflows)

    def budget_defaults(self, workflow_type: str, workflow_version: int) -> dict[str, Any]:
        return dict(self.get(workflow_type, workflow_version).budget)

    def personal_data(self, workflow_type: str, workflow_version: int) -> tuple[str, ...]:
        return self.get(workflow_type, workflow_version).personal_data

    def check_input(
        self, workflow_type: str, workflow_version: int, state: Mapping[str, Any]
    ) -> None:
        """Raise a ValueError naming each field of ``state`` the body's parameters refuse."""
        self.get(workflow_type, workflow_version).arguments(state)

    def resolve(self, request: ResolveRequest) -> Resolution:
        workflow = self.get(request.workflow_type, request.workflow_version)
        if request.history is None:
            raise ValueError(f"{workflow.label} is resolved from the job's history; none was given")
        key = request.job_uuid
        hot = self._take(key) if key is not None else None
        suspended: Suspended | None = None
        if hot is not None:
            version, kept = hot
            if kept.workflow is workflow and version == request.version and kept.resolution:
                suspended = kept
            elif kept.workflow is workflow and version < request.version:
                suspended = self._warm(kept, request)
        if suspended is None:
            suspended = self._cold(workflow, request)
        resolution = suspended.resolution
        assert resolution is not None
        if key is not None and not suspended.finished:
            self._keep(key, request.version, suspended)
        return resolution

    def check_history(self, request: ResolveRequest) -> None:
        """Raise NonDeterminismError if the body no longer replays the job's history, the
        wait it is in included: asked before the engine ends that wait itself (a timeout),
        so a job the code cannot go on with is left untouched. A body that raises or an
        input it refuses is not checked here: resolving reports those."""
        workflow = self.get(request.workflow_type, request.workflow_version)
        if request.history is None:
            return
        if request.job_uuid is not None:
            with self._lock:
                hot = self._hot.get(request.job_uuid)
            if hot is not None and hot[1].workflow is workflow and hot[0] == request.version:
                return  # this body replayed exactly this history
        journal = Journal()
        journal.take(request.history(0))
        try:
            suspended = Suspended(workflow, journal)
        except ValueError:
            return
        try:
            suspended.check()
        except WorkflowBodyError:
            return
        finally:
            suspended.body.close()

    def _warm(self, kept: Suspended, request: ResolveRequest) -> Suspended | None:
        """Feed a suspended body what was recorded since; None if it no longer fits (the
        history moved in a way only a cold replay can judge)."""
        assert request.history is not None
        since = request.history(kept.journal.version)
        if any(isinstance(event, Job.Reset) for event in since):
            return None  # a body cannot be wound back: a reset is replayed cold
        kept.journal.take(since)
        try:
            kept.advance()
        except (NonDeterminismError, WorkflowBodyError, RuntimeError):
            return None
        return kept

    def _cold(self, workflow: CodeWorkflow, request: ResolveRequest) -> Suspended:
        assert request.history is not None
        self.cold_replays += 1
        journal = Journal()
        journal.take(request.history(0))
        try:
            suspended = Suspended(workflow, journal)
        except ValueError as error:  # the input does not fit the body's parameters
            raise _body_error(workflow, error) from None
        suspended.advance()
        return suspended

    def _take(self, key: UUID) -> tuple[int, Suspended] | None:
        with self._lock:
            return self._hot.pop(key, None)

    def _keep(self, key: UUID, version: int, suspended: Suspended) -> None:
        with self._lock:
            self._hot[key] = (version, suspended)
            while len(self._hot) > self.hot_jobs:
                _, (_, dropped) = self._hot.popitem(last=False)
                dropped.body.close()


def replay_code(workflow: CodeWorkflow, events: Sequence[Any]) -> Resolution:
    """The next step of a job whose history is ``events``, by a cold replay (no registry)."""
    journal = Journal()
    journal.take(events)
    suspended = Suspended(workflow, journal)
    return suspended.advance()
