"""Migration: moving a job that has not finished to another version of its definition.

The move is one ``Migrated`` event in the job's history (chain-hashed like every event),
carrying the replay verdict that allowed it. It is allowed when replaying the job's
recorded decisions against the target version changes none of them, or when forced, and
then the event records who forced it and why.
"""

from __future__ import annotations

from datetime import datetime

from jobledger.audit.errors import MigrationRefusedError
from jobledger.audit.replay import ReplayReport, Resolver, replay_job
from jobledger.job import Job
from jobledger.status import JobStatus


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
) -> ReplayReport:
    """Replay the job against ``to_version``; refuse on divergence unless forced."""
    check_movable(job, to_version, now, kept_until)
    report = replay_job(events, resolver, version=to_version, default_wait_ms=default_wait_ms)
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
    """Append the Migrated event (``forced`` when replay did not say safe)."""
    job.migrate(
        to_version=to_version,
        forced=not report.safe,
        migrated_by=by,
        reason=reason,
        replay_verdict=report.verdict,
        now=now,
    )
