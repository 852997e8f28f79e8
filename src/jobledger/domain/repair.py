"""The rules of repairing a job: which jobs may be retried, reset or forked, and where.

- **retry** reopens a failed job at the step that failed. Only a failure before that step
  recorded anything can be retried: a step's error (``step``) or its resolution's
  (``definition``). The other ends of a job recorded their step already (a wait that timed
  out, an approval rejected or expired, a join failed, a ``fail`` step, a deadline that
  passed mid-wait): reset the job to the step before to run it again.
- **reset** runs the job again from after step N (0 <= N < the last step it recorded, or
  up to that step for a job a retry would take): the steps recorded after N are
  superseded.
- **fork** starts a new job after step N (1 <= N <= the last step recorded), with the state
  as of N.

A job mid-step (a live lease), a cancelled job, and a child of a map step (its parent
took in its end already) are repaired by none of them.

The history keeps every superseded step; :func:`live_steps` says which records count now.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Final

from jobledger.domain.errors import RepairStatusError, RepairStepError
from jobledger.domain.job import Job
from jobledger.domain.status import JobStatus

RETRYABLE_CAUSES: Final = frozenset({"step", "definition"})
"""The ``Failed`` causes a retry reopens: the failed step recorded nothing."""


def check_repairable(job: Job, what: str, now: datetime, kept_until: datetime | None) -> None:
    """What every repair refuses: a cancelled job, a job mid-step, a child job."""
    if job.status is JobStatus.CANCELLED:
        raise RepairStatusError(f"job {job.job_id!r} was cancelled: it cannot be {what}")
    lease = max((t for t in (job.lease_until, kept_until) if t is not None), default=None)
    if job.status is JobStatus.RUNNING and lease is not None and lease > now:
        raise RepairStatusError(
            f"job {job.job_id!r} is running a step (worker {job.worker_id}, lease until "
            f"{lease.isoformat()}): it can be {what} once it parks"
        )
    if job.parent is not None:
        raise RepairStatusError(
            f"job {job.job_id!r} is a child of job {job.parent['job_id']!r}, which took in "
            f"its end already: repair the parent instead"
        )


def check_deadline(job: Job, what: str, now: datetime) -> None:
    """A job past its deadline would fail again at its next tick: a fork (with a budget
    of its own) runs it on instead."""
    deadline = job.deadline_at
    if deadline is not None and deadline <= now:
        raise RepairStatusError(
            f"job {job.job_id!r} is past its deadline ({deadline.isoformat()}): "
            f"{what}, it would fail again at once; fork it (a fork has a budget of its own)"
        )


def failure(job: Job, events: Sequence[Job.Event]) -> Job.Failed | None:
    """The ``Failed`` that ended the job in its next step, before that step recorded
    anything (None: not failed, or failed by a step it recorded, a ``fail`` step)."""
    if job.status is not JobStatus.FAILED:
        return None
    failed = next((e for e in reversed(events) if isinstance(e, Job.Failed)), None)
    return failed if failed is not None and failed.step_number == job.current_step + 1 else None


def retry_cause(job: Job, events: Sequence[Job.Event]) -> str:
    """The cause of the failure a retry reopens, or the error that says why not."""
    if job.status is not JobStatus.FAILED:
        raise RepairStatusError(f"job {job.job_id!r} is {job.status}: only a failed job is retried")
    failed = failure(job, events)
    if failed is None:
        raise RepairStatusError(
            f"job {job.job_id!r} failed in its recorded step {job.current_step} (a fail step): "
            f"reset it to step {job.current_step - 1} to run that step again"
        )
    if failed.cause not in RETRYABLE_CAUSES:
        raise RepairStatusError(
            f"job {job.job_id!r} failed by {failed.cause} after step {job.current_step} was "
            f"recorded: reset it to step {max(job.current_step - 1, 0)} to run that step again"
        )
    return failed.cause


def check_reset_step(job: Job, step_number: int, events: Sequence[Job.Event]) -> None:
    """0 <= N < the last step recorded; a job a retry would take may also be reset to
    that step (its failed step then re-runs under a new key). Not a job that failed after
    its last step: that step's end (a wait timed out, a rejection) left it nowhere to go."""
    failed = failure(job, events)
    retryable = failed is not None and failed.cause in RETRYABLE_CAUSES
    last = job.current_step if retryable else job.current_step - 1
    if not 0 <= step_number <= last:
        allowed = f"0 to {last}" if last >= 0 else "none"
        raise RepairStepError(
            f"job {job.job_id!r} cannot be reset to step {step_number}: it recorded "
            f"{job.current_step} step(s) and is {job.status} (steps allowed: {allowed})"
        )


def check_fork_step(job: Job, step_number: int) -> None:
    """1 <= N <= the last step recorded."""
    if not 1 <= step_number <= job.current_step:
        raise RepairStepError(
            f"job {job.job_id!r} cannot be forked at step {step_number}: it recorded "
            f"{job.current_step} step(s) (steps allowed: 1 to {job.current_step})"
            if job.current_step
            else f"job {job.job_id!r} recorded no step yet: nothing to fork"
        )


def live_steps(events: Sequence[Job.Event]) -> dict[int, int]:
    """Step number -> the index in ``events`` of the record that counts now: a reset to N
    supersedes the records of the steps after N."""
    live: dict[int, int] = {}
    for index, event in enumerate(events):
        if isinstance(event, Job.StepRecorded):
            live[event.step_number] = index
        elif isinstance(event, Job.Reset):
            live = {n: i for n, i in live.items() if n <= event.step_number}
    return live


def as_of(events: Sequence[Job.Event], step_number: int) -> Sequence[Job.Event]:
    """The events that make the job as it stood after step N, just before its next step
    was recorded (its wait's resume, its approval's decision included): all of them when
    no step after N counts now."""
    after = live_steps(events).get(step_number + 1)
    return events if after is None else events[:after]


def superseded(events: Sequence[Job.Event]) -> frozenset[int]:
    """Indices of the records a replay does not compare: the steps (and resolution
    failures) a later reset superseded, and the failures a later retry reopened."""
    found: set[int] = set()
    steps: list[tuple[int, int]] = []  # (index, step number) of records since the start
    for index, event in enumerate(events):
        if isinstance(event, Job.StepRecorded | Job.Failed):
            steps.append((index, event.step_number))
        elif isinstance(event, Job.Retried):
            found.update(i for i, _ in steps if isinstance(events[i], Job.Failed))
        elif isinstance(event, Job.Reset):
            found.update(i for i, n in steps if n > event.step_number)
            steps = [(i, n) for i, n in steps if n <= event.step_number]
    return frozenset(found)
