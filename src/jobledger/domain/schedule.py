"""The Schedule aggregate: a cron that submits jobs, and the record of every firing.

Each firing submits a job whose idempotency key is the schedule's and the fire time's
(:func:`firing_key`), and then appends ``Fired``: a second reconciler, or a retry after a
crash between the two, submits the same key, finds the same job and only records it.
Which firings are due, and how missed ones are caught up, is decided here, purely.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Any, Literal, TypeVar

from eventsourcing.domain import Aggregate

from jobledger.domain.cron import CronTimes
from jobledger.domain.errors import InvalidScheduleError, ScheduleStateError
from jobledger.domain.identity import schedule_uuid
from jobledger.domain.stored_topics import keep_stored_topics

JSON = dict[str, Any]

MISSED_AFTER = timedelta(minutes=1)
"""A firing still due this long after its time is on time (a reconciler pass is a few
seconds apart); one older than that was missed while nothing ran, and follows the
schedule's catch-up policy."""
MAX_CATCH_UP = 1_000
"""The largest bound ``catch_up=all`` takes: each caught-up firing is one job."""


class CatchUp(StrEnum):
    SKIP = "skip"
    """Fire none of the missed firings; go on from the next one."""
    ONE = "one"
    """Fire the latest missed firing once."""
    ALL = "all"
    """Fire the missed firings, at most ``catch_up_max`` (the latest ones)."""


class Overlap(StrEnum):
    ALLOW = "allow"
    SKIP = "skip"
    """Skip a firing while the schedule's previous job has not finished."""
    BUFFER_ONE = "buffer_one"
    """Keep at most one firing pending while the previous job runs; fire it when it ends."""


class ScheduleState(StrEnum):
    ACTIVE = "active"
    PAUSED = "paused"
    DELETED = "deleted"


class Trigger(StrEnum):
    """Why a job was fired: its time came, it was caught up, buffered, or asked for."""

    CRON = "cron"
    CATCH_UP = "catch_up"
    BUFFERED = "buffered"
    MANUAL = "manual"


E = TypeVar("E", bound=StrEnum)


def _enum(kind: type[E], value: str, what: str) -> E:
    try:
        return kind(value)
    except ValueError:
        allowed = ", ".join(member.value for member in kind)
        raise InvalidScheduleError(f"{what} must be one of {allowed}, got {value!r}") from None


@dataclass(frozen=True)
class Policies:
    catch_up: CatchUp = CatchUp.SKIP
    catch_up_max: int = 1
    overlap: Overlap = Overlap.ALLOW

    @classmethod
    def parse(cls, catch_up: str, catch_up_max: int | None, overlap: str) -> Policies:
        mode = _enum(CatchUp, catch_up, "catch-up")
        if catch_up_max is not None and mode is not CatchUp.ALL:
            raise InvalidScheduleError("catch-up-max applies to catch-up 'all' only")
        bound = 1 if catch_up_max is None else catch_up_max
        if isinstance(bound, bool) or not isinstance(bound, int) or not 1 <= bound <= MAX_CATCH_UP:
            raise InvalidScheduleError(
                f"catch-up-max must be a whole number from 1 to {MAX_CATCH_UP}, got {bound!r}"
            )
        if mode is CatchUp.ALL and catch_up_max is None:
            raise InvalidScheduleError("catch-up 'all' needs its bound: catch-up-max N")
        return cls(mode, bound, _enum(Overlap, overlap, "overlap"))


@dataclass(frozen=True)
class Due:
    """One decision of a pass: fire ``fire_time``, or record the run of missed firings
    ending there as skipped (``missed`` of them)."""

    action: Literal["fire", "skip"]
    fire_time: datetime
    next_fire_at: datetime | None
    trigger: Trigger = Trigger.CRON
    missed: int = 0
    reason: str = ""


def firing_key(name: str, fire_time: datetime, trigger: Trigger = Trigger.CRON) -> str:
    """The submit key (and the job id) of a firing: the same for every attempt at it. A
    manual firing's carries its microseconds and says so: never a cron firing's key."""
    stamp = fire_time.strftime("%Y-%m-%dT%H:%M:%S")
    if trigger is Trigger.MANUAL:
        return f"{name}@{stamp}.{fire_time.microsecond:06d}Z/manual"
    return f"{name}@{stamp}Z"


class Schedule(Aggregate):
    tenant_id: str
    name: str
    cron: str
    timezone: str
    workflow_type: str
    workflow_version: int | None
    input: JSON
    policies: Policies
    state: ScheduleState
    next_fire_at: datetime | None
    buffered_fire_at: datetime | None
    last_job_id: str | None
    last_fired_at: datetime | None
    fired: int
    skipped: int

    def __init__(self) -> None:
        """State is set by ``Created``: the events, not the constructor, define a schedule."""

    @property
    def times(self) -> CronTimes:
        return CronTimes(self.cron, self.timezone)

    def next_firing(self) -> tuple[datetime | None, datetime | None]:
        """The next cron firing in UTC and on the schedule's own clock; none unless active
        (a paused schedule keeps its next cron time, but does not fire at it)."""
        if self.state is not ScheduleState.ACTIVE or self.next_fire_at is None:
            return None, None
        return self.next_fire_at, self.times.local(self.next_fire_at)

    @property
    def due_at(self) -> datetime | None:
        """When the reconciler should look at it: its next firing, or a buffered one."""
        if self.state is not ScheduleState.ACTIVE:
            return None
        moments = [m for m in (self.next_fire_at, self.buffered_fire_at) if m is not None]
        return min(moments, default=None)

    class Event(Aggregate.Event):
        def apply(self, aggregate: Any) -> None:
            assert isinstance(aggregate, Schedule)
            self.evolve(aggregate)

        def evolve(self, schedule: Schedule) -> None:
            """What this event changes; overridden by each event type."""

    class Created(Event, Aggregate.Created):
        tenant_id: str
        name: str
        cron: str
        timezone: str
        workflow_type: str
        workflow_version: int | None
        input: JSON
        catch_up: str
        catch_up_max: int
        overlap: str
        next_fire_at: datetime | None

        def evolve(self, schedule: Schedule) -> None:
            schedule.tenant_id, schedule.name = self.tenant_id, self.name
            schedule.cron, schedule.timezone = self.cron, self.timezone
            schedule.workflow_type = self.workflow_type
            schedule.workflow_version = self.workflow_version
            schedule.input = dict(self.input)
            schedule.policies = Policies(
                CatchUp(self.catch_up), self.catch_up_max, Overlap(self.overlap)
            )
            schedule.state = ScheduleState.ACTIVE
            schedule.next_fire_at = self.next_fire_at
            schedule.buffered_fire_at = None
            schedule.last_job_id = schedule.last_fired_at = None
            schedule.fired = schedule.skipped = 0

    class Paused(Event):
        def evolve(self, schedule: Schedule) -> None:
            schedule.state = ScheduleState.PAUSED

    class Resumed(Event):
        next_fire_at: datetime | None

        def evolve(self, schedule: Schedule) -> None:
            schedule.state = ScheduleState.ACTIVE
            schedule.next_fire_at = self.next_fire_at

    class Deleted(Event):
        def evolve(self, schedule: Schedule) -> None:
            schedule.state = ScheduleState.DELETED
            schedule.buffered_fire_at = None

    class Fired(Event):
        """A job was submitted for ``fire_time`` (its time came, caught up, buffered or
        asked for: ``trigger``)."""

        fire_time: datetime
        job_id: str
        trigger: str
        next_fire_at: datetime | None

        def evolve(self, schedule: Schedule) -> None:
            schedule.last_job_id, schedule.last_fired_at = self.job_id, self.fire_time
            schedule.next_fire_at = self.next_fire_at
            schedule.fired += 1
            if self.trigger == Trigger.BUFFERED:
                schedule.buffered_fire_at = None

    class Skipped(Event):
        """No job for ``fire_time`` (and the ``missed`` - 1 firings before it, caught up
        by a ``skip`` policy), and why."""

        fire_time: datetime
        reason: str
        missed: int
        next_fire_at: datetime | None

        def evolve(self, schedule: Schedule) -> None:
            schedule.next_fire_at = self.next_fire_at
            schedule.skipped += self.missed

    class Buffered(Event):
        """The firing at ``fire_time`` waits for the previous job to end (``buffer_one``)."""

        fire_time: datetime
        next_fire_at: datetime | None

        def evolve(self, schedule: Schedule) -> None:
            schedule.buffered_fire_at = self.fire_time
            schedule.next_fire_at = self.next_fire_at

    # ---- creation -------------------------------------------------------------------

    @classmethod
    def create(
        cls,
        *,
        tenant_id: str,
        name: str,
        times: CronTimes,
        workflow_type: str,
        workflow_version: int | None,
        input: JSON,
        policies: Policies,
        now: datetime,
    ) -> Schedule:
        return cls._create(
            cls.Created,
            id=schedule_uuid(tenant_id, name),
            timestamp=now,
            tenant_id=tenant_id,
            name=name,
            cron=times.expression,
            timezone=times.timezone,
            workflow_type=workflow_type,
            workflow_version=workflow_version,
            input=input,
            catch_up=str(policies.catch_up),
            catch_up_max=policies.catch_up_max,
            overlap=str(policies.overlap),
            next_fire_at=times.after(now),
        )

    # ---- commands: each checks its precondition, then appends one event ---------------

    def pause(self, *, now: datetime) -> None:
        self._require(ScheduleState.ACTIVE, "pause")
        self.trigger_event(self.Paused, timestamp=now)

    def resume(self, *, now: datetime) -> None:
        """Firings missed while paused are not caught up: it goes on from the next one."""
        self._require(ScheduleState.PAUSED, "resume")
        self.trigger_event(self.Resumed, timestamp=now, next_fire_at=self.times.after(now))

    def delete(self, *, now: datetime) -> None:
        self._check_not_deleted()
        self.trigger_event(self.Deleted, timestamp=now)

    def record_fired(self, due: Due, job_id: str, *, now: datetime) -> None:
        self.trigger_event(
            self.Fired,
            timestamp=now,
            fire_time=due.fire_time,
            job_id=job_id,
            trigger=str(due.trigger),
            next_fire_at=due.next_fire_at,
        )

    def record_skipped(self, due: Due, reason: str, *, now: datetime) -> None:
        self.trigger_event(
            self.Skipped,
            timestamp=now,
            fire_time=due.fire_time,
            reason=reason,
            missed=max(due.missed, 1),
            next_fire_at=due.next_fire_at,
        )

    def record_buffered(self, due: Due, *, now: datetime) -> None:
        self.trigger_event(
            self.Buffered, timestamp=now, fire_time=due.fire_time, next_fire_at=due.next_fire_at
        )

    # ---- deciding ---------------------------------------------------------------------

    def manual(self, now: datetime) -> Due:
        """``trigger``: a firing now, outside the cron; the next cron firing is unchanged."""
        self._check_not_deleted()
        return Due("fire", now, self.next_fire_at, Trigger.MANUAL)

    def buffered(self) -> Due | None:
        if self.buffered_fire_at is None or self.state is not ScheduleState.ACTIVE:
            return None
        return Due("fire", self.buffered_fire_at, self.next_fire_at, Trigger.BUFFERED)

    def due(self, now: datetime) -> list[Due]:
        """The cron firings due by ``now``, in order: on-time ones fired, missed ones (older
        than ``MISSED_AFTER``) as the catch-up policy says. Stepping through a long outage
        keeps only the missed times the policy may fire, and the one before them."""
        if self.state is not ScheduleState.ACTIVE:
            return []
        times, moment = self.times, self.next_fire_at
        keep = self._catch_up_keeps()
        missed: deque[datetime] = deque(maxlen=keep + 1)
        on_time: list[datetime] = []
        first_missed, count = None, 0
        while moment is not None and moment <= now:
            if moment < now - MISSED_AFTER:
                first_missed = first_missed or moment
                count += 1
                missed.append(moment)
            else:
                on_time.append(moment)
            moment = times.after(moment)
        dues: list[Due] = []
        if first_missed is not None:
            kept = list(missed)[-keep:] if keep else []
            dues = [Due("fire", t, times.after(t), Trigger.CATCH_UP) for t in kept]
            if count > keep:
                skipped = list(missed)[-keep - 1]
                dues.insert(0, self._skip_missed(first_missed, skipped, count - keep, dues))
        return dues + [Due("fire", t, times.after(t)) for t in on_time]

    def _catch_up_keeps(self) -> int:
        """How many of the latest missed firings the catch-up policy fires."""
        if self.policies.catch_up is CatchUp.SKIP:
            return 0
        return 1 if self.policies.catch_up is CatchUp.ONE else self.policies.catch_up_max

    def _skip_missed(self, first: datetime, last: datetime, missed: int, fired: list[Due]) -> Due:
        """One ``Skipped`` for the run of missed firings the policy does not fire."""
        next_at = fired[0].fire_time if fired else self.times.after(last)
        reason = (
            f"missed {missed} firing(s) from {first.isoformat()} to {last.isoformat()} "
            f"(catch-up {self.policies.catch_up})"
        )
        return Due("skip", last, next_at, missed=missed, reason=reason)

    def overlap_action(self, previous_running: bool) -> Literal["fire", "skip", "buffer"]:
        """What the overlap policy does with a cron firing."""
        if not previous_running or self.policies.overlap is Overlap.ALLOW:
            return "fire"
        if self.policies.overlap is Overlap.BUFFER_ONE and self.buffered_fire_at is None:
            return "buffer"
        return "skip"

    def _require(self, state: ScheduleState, doing: str) -> None:
        self._check_not_deleted()
        if self.state is not state:
            raise ScheduleStateError(
                f"cannot {doing} schedule {self.name!r} of tenant {self.tenant_id!r}: "
                f"it is {self.state}"
            )

    def _check_not_deleted(self) -> None:
        if self.state is ScheduleState.DELETED:
            raise ScheduleStateError(
                f"schedule {self.name!r} of tenant {self.tenant_id!r} was deleted"
            )


@dataclass(frozen=True)
class ScheduleView:
    """A schedule as callers read it; next firing in UTC and on the schedule's clock."""

    tenant_id: str
    name: str
    cron: str
    timezone: str
    workflow_type: str
    workflow_version: int | None
    input: Mapping[str, Any]
    catch_up: str
    catch_up_max: int
    overlap: str
    state: str
    next_fire_at: datetime | None
    next_fire_local: datetime | None
    buffered_fire_at: datetime | None
    last_job_id: str | None
    last_fired_at: datetime | None
    fired: int
    skipped: int
    version: int

    @classmethod
    def of(cls, schedule: Schedule) -> ScheduleView:
        next_at, next_local = schedule.next_firing()
        return cls(
            tenant_id=schedule.tenant_id,
            name=schedule.name,
            cron=schedule.cron,
            timezone=schedule.timezone,
            workflow_type=schedule.workflow_type,
            workflow_version=schedule.workflow_version,
            input=dict(schedule.input),
            catch_up=str(schedule.policies.catch_up),
            catch_up_max=schedule.policies.catch_up_max,
            overlap=str(schedule.policies.overlap),
            state=str(schedule.state),
            next_fire_at=next_at,
            next_fire_local=next_local,
            buffered_fire_at=schedule.buffered_fire_at,
            last_job_id=schedule.last_job_id,
            last_fired_at=schedule.last_fired_at,
            fired=schedule.fired,
            skipped=schedule.skipped,
            version=schedule.version,
        )


@dataclass(frozen=True)
class ScheduleEntry:
    """One event of a schedule as its history reads it."""

    version: int
    event_type: str
    timestamp: datetime
    data: dict[str, Any]

    @classmethod
    def of(cls, event: Schedule.Event) -> ScheduleEntry:
        data = {
            name: value
            for name, value in vars(event).items()
            if name not in ("originator_id", "originator_version", "timestamp", "originator_topic")
        }
        return cls(event.originator_version, type(event).__name__, event.timestamp, data)


keep_stored_topics("jobledger.schedule", Schedule)
