"""The schedules view: one row per schedule, what ``schedule list`` and the reconciler read.

Rows are folded with the aggregate's own ``evolve()`` on a shell built from the row, as
the status view folds jobs, so the view cannot disagree with the domain. ``due_at`` (the
next firing, or a buffered one; NULL while paused or deleted) is indexed: the
reconciler's question costs the number of due schedules, not of all schedules.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from datetime import datetime
from typing import Any

from jobledger.adapters.backends import Cursor, StoreBackend
from jobledger.domain.schedule import CatchUp, Overlap, Policies, Schedule, ScheduleState

TABLE = "jobledger_schedules"


@dataclass
class ScheduleRow:
    schedule_uuid: str
    tenant_id: str
    name: str
    cron: str
    timezone: str
    workflow_type: str
    workflow_version: int | None
    catch_up: str
    catch_up_max: int
    overlap: str
    state: str
    next_fire_at: datetime | None
    buffered_fire_at: datetime | None
    last_job_id: str | None
    last_fired_at: datetime | None
    fired: int
    skipped: int
    created_at: datetime
    updated_at: datetime
    version: int

    @property
    def schedule(self) -> Schedule:
        """A shell carrying what the view keeps (not the job input): evolve() needs no more."""
        shell = Schedule.__new__(Schedule)
        for name in ("tenant_id", "name", "cron", "timezone", "workflow_type"):
            setattr(shell, name, getattr(self, name))
        shell.workflow_version, shell.input = self.workflow_version, {}
        shell.policies = Policies(CatchUp(self.catch_up), self.catch_up_max, Overlap(self.overlap))
        shell.state = ScheduleState(self.state)
        shell.next_fire_at, shell.buffered_fire_at = self.next_fire_at, self.buffered_fire_at
        shell.last_job_id, shell.last_fired_at = self.last_job_id, self.last_fired_at
        shell.fired, shell.skipped = self.fired, self.skipped
        return shell


COLUMNS = [f.name for f in fields(ScheduleRow)]
_MOMENTS = ("next_fire_at", "buffered_fire_at", "last_fired_at", "created_at", "updated_at")


def create_statements(d: StoreBackend) -> list[str]:
    t, ts = d.table(TABLE), d.timestamp_type
    return [
        f"CREATE TABLE IF NOT EXISTS {t} ("
        "schedule_uuid TEXT PRIMARY KEY, tenant_id TEXT NOT NULL, name TEXT NOT NULL, "
        "cron TEXT NOT NULL, timezone TEXT NOT NULL, workflow_type TEXT NOT NULL, "
        "workflow_version INTEGER, catch_up TEXT NOT NULL, catch_up_max INTEGER NOT NULL, "
        f"overlap TEXT NOT NULL, state TEXT NOT NULL, next_fire_at {ts}, "
        f"buffered_fire_at {ts}, last_job_id TEXT, last_fired_at {ts}, "
        "fired INTEGER NOT NULL, skipped INTEGER NOT NULL, "
        f"created_at {ts} NOT NULL, updated_at {ts} NOT NULL, version INTEGER NOT NULL, "
        f"due_at {ts})",
        # The reconciler's question: which schedules are due by now.
        f"CREATE INDEX IF NOT EXISTS jobledger_schedules_due ON {t} (due_at)",
        f"CREATE INDEX IF NOT EXISTS jobledger_schedules_tenant ON {t} (tenant_id, name)",
    ]


def apply(d: StoreBackend, curs: Cursor, event: Schedule.Event) -> None:
    curs.execute(
        d.sql(f"SELECT * FROM {d.table(TABLE)} WHERE schedule_uuid = :schedule_uuid"),
        {"schedule_uuid": str(event.originator_id)},
    )
    found = curs.fetchone()
    row = None if found is None else row_from(d.row(found))
    if row is not None and row.version >= event.originator_version:
        return  # already folded: a replayed batch changes nothing
    save(d, curs, fold(row, event))


def fold(row: ScheduleRow | None, event: Schedule.Event) -> ScheduleRow:
    shell = Schedule.__new__(Schedule) if row is None else row.schedule
    event.evolve(shell)
    return ScheduleRow(
        schedule_uuid=str(event.originator_id),
        tenant_id=shell.tenant_id,
        name=shell.name,
        cron=shell.cron,
        timezone=shell.timezone,
        workflow_type=shell.workflow_type,
        workflow_version=shell.workflow_version,
        catch_up=str(shell.policies.catch_up),
        catch_up_max=shell.policies.catch_up_max,
        overlap=str(shell.policies.overlap),
        state=str(shell.state),
        next_fire_at=shell.next_fire_at,
        buffered_fire_at=shell.buffered_fire_at,
        last_job_id=shell.last_job_id,
        last_fired_at=shell.last_fired_at,
        fired=shell.fired,
        skipped=shell.skipped,
        created_at=row.created_at if row else event.timestamp,
        updated_at=event.timestamp,
        version=event.originator_version,
    )


def save(d: StoreBackend, curs: Cursor, row: ScheduleRow) -> None:
    values = asdict(row)
    for name in _MOMENTS:
        values[name] = d.ts(values[name])
    values["due_at"] = d.ts(row.schedule.due_at)
    names = [*COLUMNS, "due_at"]
    updates = ", ".join(f"{n} = excluded.{n}" for n in names if n != "schedule_uuid")
    curs.execute(
        d.sql(
            f"INSERT INTO {d.table(TABLE)} ({', '.join(names)}) "
            f"VALUES ({', '.join(':' + n for n in names)}) "
            f"ON CONFLICT (schedule_uuid) DO UPDATE SET {updates}"
        ),
        values,
    )


def row_from(data: dict[str, Any]) -> ScheduleRow:
    values = {name: data[name] for name in COLUMNS}
    for name in _MOMENTS:
        if isinstance(values[name], str):
            values[name] = datetime.fromisoformat(values[name])
    return ScheduleRow(**values)


def due(d: StoreBackend, before: datetime, limit: int) -> list[ScheduleRow]:
    """Schedules due at or before ``before``: an index range scan on ``due_at``."""
    statement = (
        f"SELECT * FROM {d.table(TABLE)} WHERE due_at <= :before ORDER BY due_at LIMIT :limit"
    )
    return [row_from(r) for r in d.fetch(statement, {"before": d.ts(before), "limit": limit})]


def of_tenant(d: StoreBackend, tenant_id: str, *, deleted: bool = False) -> list[ScheduleRow]:
    """The tenant's schedules by name; deleted ones only when asked for."""
    statement = f"SELECT * FROM {d.table(TABLE)} WHERE tenant_id = :tenant_id"
    if not deleted:
        statement += " AND state <> :deleted"
    statement += " ORDER BY name"
    params = {"tenant_id": tenant_id, "deleted": str(ScheduleState.DELETED)}
    return [row_from(r) for r in d.fetch(statement, params)]
