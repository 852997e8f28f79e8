"""Migration: moving a job that has not finished to another version of its definition.

The move is one ``Migrated`` event in the job's history (chain-hashed like every event),
carrying the replay verdict that allowed it. It is allowed when replaying the job's
recorded decisions against the target version changes none of them, or when forced, and
then the event records who forced it and why.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime

from jobledger.audit.errors import MigrationRefusedError
from jobledger.audit.replay import ReplayReport, Resolver, replay_job
from jobledger.domain.job import Job
from jobledger.domain.status import JobStatus
from jobledger.domain.substate import ApprovalGate


def check_movable(
    job: Job, to_version: int, now: datetime, kept_until: datetime | None = None
) -> None:
    """Not finished, not on that version already, and no worker mid-step (a step in
    flight was resolved on the old version; the job moves once it parks). ``kept_until``
    is the lease its worker's heartbeat keeps, beyond its Claimed event's."""
    if job.status.is_terminal:
        raise MigrationRefusedError(f"job {job.job_id!r} is {job.status}: a finished job stays")
    if to_version == job.workflow_version:
        raise MigrationRefusedError(f"job {job.job_id!r} is already on v{to_version}")
    lease = max((t for t in (job.lease_until, kept_until) if t is not None), default=None)
    if job.status is JobStatus.RUNNING and lease is not None and lease > now:
        raise MigrationRefusedError(
            f"job {job.job_id!r} is running a step (worker {job.worker_id}, lease until "
            f"{lease.isoformat()}): migrate it once it parks"
        )


def plan(
    job: Job,
    events: list[Job.Event],
    resolver: Resolver,
    to_version: int,
    *,
    force: bool,
    now: datetime,
    default_wait_ms: int,
    kept_until: datetime | None = None,
    step_inputs: bool = True,
) -> ReplayReport:
    """Replay the job against ``to_version``; refuse on divergence unless forced.
    ``step_inputs``: see :func:`~jobledger.audit.replay.replay_job` (False for code)."""
    check_movable(job, to_version, now, kept_until)
    report = replay_job(
        events,
        resolver,
        version=to_version,
        default_wait_ms=default_wait_ms,
        step_inputs=step_inputs,
    )
    if not report.safe and not force:
        raise MigrationRefusedError(
            f"job {job.job_id!r} cannot move to v{to_version}: replay {report.verdict} "
            "(--force with --by and --reason moves it anyway)"
        )
    return report


def migrate(
    job: Job,
    report: ReplayReport,
    to_version: int,
    *,
    by: str | None,
    reason: str | None,
    now: datetime,
) -> None:
    """Append the Migrated event (``forced`` when replay did not say safe). An open
    approval request moves with the job, as the new version words it."""
    job.migrate(
        to_version=to_version,
        forced=not report.safe,
        migrated_by=by,
        reason=reason,
        replay_verdict=report.verdict,
        now=now,
        approval=approval_on(job, report, to_version),
    )


def approval_on(job: Job, report: ReplayReport, to_version: int) -> ApprovalGate | None:
    """The job's open approval request under ``to_version``: the same request (its id,
    step, attempt and the action it is bound to), decided by the approvers and routed by
    the decisions the new version's step names. None when no request is open. A version
    that does not gate that step with an approval cannot take the job while it waits for
    one: the request would be left with nobody entitled to it and nowhere to lead."""
    gate = job.pending_approval
    if gate is None:
        return None
    opened = next((s for s in report.steps if s.step_number == gate.step_number), None)
    replayed = opened.replayed if opened is not None else None
    if replayed is None or replayed.next_status is not JobStatus.AWAITING_APPROVAL:
        would = replayed.describe() if replayed is not None else "not reach that step"
        raise MigrationRefusedError(
            f"job {job.job_id!r} awaits approval {gate.approval_id} (step {gate.step_number}), "
            f"which v{to_version} does not gate with an approval (it would {would}): "
            "decide it first, or migrate to a version that gates it"
        )
    wait = replayed.wait or {}
    expires = wait.get("expires_at")
    return replace(
        gate,
        approvers=tuple(wait.get("approvers") or ()),
        expires_at=datetime.fromisoformat(expires) if isinstance(expires, str) else gate.expires_at,
        on_approve=wait.get("on_approve"),
        on_reject=wait.get("on_reject"),
        on_expire=wait.get("on_expire"),
        quorum=wait.get("quorum"),
    )
