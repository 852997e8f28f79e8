"""The commands on schedules (``engine.schedules``) and their firing by the reconciler.

A firing is two writes: the job's submit, under a key of the schedule's and the fire
time's, then ``Fired`` on the schedule. Whoever fires (two reconcilers racing, or a
reconciler restarted after dying between the two writes) submits the same key and job id,
so it finds the job already there and only records it: one job per fire time.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from datetime import datetime
from typing import TYPE_CHECKING, Any
from uuid import UUID

from jobledger.domain import erasure
from jobledger.domain.cron import CronTimes
from jobledger.domain.errors import (
    InvalidPayloadError,
    InvalidScheduleError,
    JobConflictError,
    ScheduleExistsError,
    UnknownScheduleError,
    UnknownWorkflowError,
    VersionConflict,
)
from jobledger.domain.identity import schedule_uuid
from jobledger.domain.payloads import json_object
from jobledger.domain.schedule import (
    JSON,
    Due,
    Policies,
    Schedule,
    ScheduleEntry,
    ScheduleView,
    firing_key,
)
from jobledger.engine.bootstrap import Deps
from jobledger.engine.ids import check_id
from jobledger.engine.job_commands import JobCommands
from jobledger.engine.job_finder import JobFinder

if TYPE_CHECKING:
    from jobledger.projections.job_views import JobViews

log = logging.getLogger(__name__)

MAX_NAME_LENGTH = 100
"""A firing's job id is the name and the fire time: it must stay a valid job id."""
ATTEMPTS = 5
"""How often a command (or a firing) reloads a schedule another writer moved on."""
_NOT_SUBMITTED = (InvalidPayloadError, JobConflictError)
"""A submit refused for what the schedule asks (an input a newer definition refuses):
the firing is recorded as skipped, with the reason. An unknown workflow is not among
them: it says what this process was deployed with (a reconciler without the
definitions), so the firing stays due for a process that has them."""


class ScheduleCommands:
    """Create, read, pause, resume, delete and trigger schedules; fire what is due."""

    def __init__(self, deps: Deps, jobs: JobFinder, commands: JobCommands) -> None:
        self._deps = deps
        self._store = deps.store
        self._clock = deps.clock
        self._jobs = jobs
        self._commands = commands

    # ---- commands ----------------------------------------------------------------------

    def create(
        self,
        tenant_id: str,
        name: str,
        *,
        cron: str,
        timezone: str,
        workflow_type: str,
        workflow_version: int | None = None,
        input: Mapping[str, Any] | None = None,
        catch_up: str = "skip",
        catch_up_max: int | None = None,
        overlap: str = "allow",
    ) -> ScheduleView:
        """A schedule firing ``workflow_type`` (at ``workflow_version``, else the newest
        at each firing) with ``input`` at each time of ``cron`` on ``timezone``'s clock.
        Everything is checked before anything is written."""
        check_id("tenant_id", tenant_id)
        _check_name(name)
        times = CronTimes.parse(cron, timezone)
        policies = Policies.parse(catch_up, catch_up_max, overlap)
        version = self._commands.workflow_version(workflow_type, workflow_version)
        limit = self._deps.config.limits.max_payload_bytes
        payload = json_object(input, what="schedule input", max_bytes=limit)
        self._check_no_personal_data(payload, workflow_type, version)
        schedule = Schedule.create(
            tenant_id=tenant_id,
            name=name,
            times=times,
            workflow_type=workflow_type,
            workflow_version=workflow_version,
            input=payload,
            policies=policies,
            now=self._clock.now(),
        )
        try:
            self._store.append_schedule(schedule)
        except VersionConflict:
            raise ScheduleExistsError(
                f"schedule {name!r} of tenant {tenant_id!r} exists already "
                "(a deleted schedule keeps its name and history)"
            ) from None
        return ScheduleView.of(schedule)

    def _check_no_personal_data(self, payload: JSON, workflow_type: str, version: int) -> None:
        """A schedule keeps its input in its own events, unsealed, where an erasure
        cannot reach it: personal values are for the jobs' own state, not a schedule's."""
        paths = self._deps.deployment.registry.personal_data(workflow_type, version)
        held = [p for p in paths if erasure.value_at(payload, erasure.split(p))[0]]
        if held:
            raise InvalidScheduleError(
                f"schedule input holds personal data of workflow {workflow_type!r} "
                f"v{version} at {', '.join(held)}: a schedule's input is not sealed or "
                "erasable, so it must not hold them"
            )

    def get(self, tenant_id: str, name: str) -> ScheduleView:
        return ScheduleView.of(self._load(tenant_id, name))

    def history(self, tenant_id: str, name: str) -> list[ScheduleEntry]:
        """Every event of the schedule in order: each firing with its job, each skip with
        its reason."""
        uuid = self._load(tenant_id, name).id
        return [ScheduleEntry.of(event) for event in self._store.schedule_events(uuid)]

    def pause(self, tenant_id: str, name: str) -> ScheduleView:
        """No firing while paused (``trigger`` still fires)."""
        return self._change(tenant_id, name, lambda s, now: s.pause(now=now))

    def resume(self, tenant_id: str, name: str) -> ScheduleView:
        """Fires again from the next cron time: firings missed while paused are not caught up."""
        return self._change(tenant_id, name, lambda s, now: s.resume(now=now))

    def delete(self, tenant_id: str, name: str) -> ScheduleView:
        """Never fires again; its history (and its name) are kept."""
        return self._change(tenant_id, name, lambda s, now: s.delete(now=now))

    def trigger(self, tenant_id: str, name: str) -> str:
        """Fire now, outside the cron and its overlap policy, under a key of its own (the
        next cron firing is unchanged). Returns the job id."""
        now = self._clock.now()  # fixed: a retry records the job it submitted
        for _ in range(ATTEMPTS):
            schedule = self._load(tenant_id, name)
            due = schedule.manual(now)
            try:
                job_id = self._submit_and_record(schedule, due)
            except VersionConflict:
                continue
            assert job_id is not None, "a manual firing's submit is never skipped"
            return job_id
        raise VersionConflict(f"schedule {name!r} of tenant {tenant_id!r} kept moving; try again")

    # ---- firing ------------------------------------------------------------------------

    def fire(self, tenant_id: str, name: str, now: datetime | None = None) -> list[str]:
        """Fire what is due of one schedule by ``now``; the ids of the jobs it fired."""
        return self.fire_schedule(schedule_uuid(tenant_id, name), now)

    def fire_schedule(self, uuid: UUID, now: datetime | None = None) -> list[str]:
        """Decide again from the schedule itself whenever another writer moved it: the
        view that named it due may be behind, and a racing reconciler may be ahead."""
        moment = now or self._clock.now()
        fired: list[str] = []  # what this call recorded, across attempts
        for _ in range(ATTEMPTS):
            schedule = self._store.load_schedule(uuid)
            if schedule is None:
                return fired
            try:
                self._fire_loaded(schedule, moment, fired)
            except VersionConflict:
                continue
            except UnknownWorkflowError as error:
                log.warning("schedule %s left due: %s", uuid, error)
            return fired
        log.warning("schedule %s kept moving during a firing; the next pass tries again", uuid)
        return fired

    def _fire_loaded(self, schedule: Schedule, now: datetime, fired: list[str]) -> None:
        buffered = schedule.buffered()
        if buffered is not None and not self._previous_running(schedule):
            fired.extend(self._fired(self._submit_and_record(schedule, buffered)))
        for due in schedule.due(now):
            fired.extend(self._fired(self._decide(schedule, due)))

    @staticmethod
    def _fired(job_id: str | None) -> list[str]:
        return [] if job_id is None else [job_id]

    def _decide(self, schedule: Schedule, due: Due) -> str | None:
        """A cron or catch-up firing: as the overlap policy says, unless its job exists
        (an earlier attempt died after the submit): then it is only recorded."""
        now = self._clock.now()
        if due.action == "skip":
            schedule.record_skipped(due, due.reason, now=now)
            self._store.append_schedule(schedule)
            return None
        submitted = self._jobs.fetch(schedule.tenant_id, firing_key(schedule.name, due.fire_time))
        if submitted is None:
            action = schedule.overlap_action(self._previous_running(schedule))
            if action != "fire":
                self._hold(schedule, due, action)
                return None
        return self._submit_and_record(schedule, due)

    def _hold(self, schedule: Schedule, due: Due, action: str) -> None:
        now = self._clock.now()
        if action == "buffer":
            schedule.record_buffered(due, now=now)
        else:
            reason = f"overlap: the previous job {schedule.last_job_id!r} has not finished"
            if schedule.buffered_fire_at is not None:
                reason += " and a firing is already buffered"
            schedule.record_skipped(due, reason, now=now)
        self._store.append_schedule(schedule)

    def _submit_and_record(self, schedule: Schedule, due: Due) -> str | None:
        key = firing_key(schedule.name, due.fire_time, due.trigger)
        try:
            job = self._commands.submit(
                schedule.tenant_id,
                key,
                schedule.workflow_type,
                workflow_version=schedule.workflow_version,
                input=schedule.input,
                idempotency_key=f"schedule:{key}",
            )
        except _NOT_SUBMITTED as error:
            reason = f"the job could not be submitted: {error}"
            schedule.record_skipped(due, reason, now=self._clock.now())
            self._store.append_schedule(schedule)
            return None
        schedule.record_fired(due, job.job_id, now=self._clock.now())
        self._store.append_schedule(schedule)
        return job.job_id

    def _previous_running(self, schedule: Schedule) -> bool:
        if schedule.last_job_id is None:
            return False
        job = self._jobs.fetch(schedule.tenant_id, schedule.last_job_id)
        return job is not None and not job.status.is_terminal

    # ---- loading -----------------------------------------------------------------------

    def _load(self, tenant_id: str, name: str) -> Schedule:
        check_id("tenant_id", tenant_id)
        _check_name(name)
        schedule = self._store.load_schedule(schedule_uuid(tenant_id, name))
        if schedule is None:
            raise UnknownScheduleError(tenant_id, name)
        return schedule

    def _change(
        self, tenant_id: str, name: str, command: Callable[[Schedule, datetime], None]
    ) -> ScheduleView:
        for _ in range(ATTEMPTS):
            schedule = self._load(tenant_id, name)
            command(schedule, self._clock.now())
            try:
                self._store.append_schedule(schedule)
            except VersionConflict:
                continue  # a firing moved it meanwhile: apply the command to what it is now
            return ScheduleView.of(schedule)
        raise VersionConflict(f"schedule {name!r} of tenant {tenant_id!r} kept moving; try again")


class ScheduleFiring:
    """The reconciler's schedules (``ports.ScheduleFirer``): those the view says are due,
    each fired from its own history."""

    def __init__(self, commands: ScheduleCommands, views: JobViews) -> None:
        self.commands = commands
        self.views = views

    def fire_due(self, now: datetime, limit: int) -> int:
        rows = self.views.due_schedules(now, limit)
        return sum(len(self.commands.fire_schedule(UUID(row.schedule_uuid), now)) for row in rows)


def _check_name(name: str) -> None:
    check_id("schedule name", name)
    if len(name) > MAX_NAME_LENGTH:
        raise InvalidPayloadError(
            f"schedule name must be at most {MAX_NAME_LENGTH} characters, got {len(name)}"
        )
