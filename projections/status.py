"""The job status view: one row per job, what the reconciler and ``list`` read.

Rows are folded with the aggregate's own ``evolve()`` on a shell that carries only the
projected fields, so the view can never disagree with the domain about a transition.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from datetime import datetime
from decimal import Decimal
from typing import Any

from jobledger.adapters.backends import Cursor, StoreBackend
from jobledger.domain.job import Job, due_moment
from jobledger.domain.status import JobStatus
from jobledger.domain.substate import ApprovalGate, EventWait, JobBudget

MICROS = Decimal(1_000_000)


@dataclass
class StatusRow:
    job_uuid: str
    tenant_id: str
    job_id: str
    workflow_type: str
    workflow_version: int
    status: str
    current_step: int
    next_step: str | None
    resume_at: datetime | None
    lease_until: datetime | None
    deadline_at: datetime | None
    worker_id: str | None
    wait_event: str | None
    pending_approval: str | None
    cost_micros: int
    steps_executed: int
    last_error: str | None
    created_at: datetime
    updated_at: datetime
    version: int
    mission_id: str | None = None
    correlation_id: str | None = None

    @property
    def due_at(self) -> datetime | None:
        """When the reconciler should look at this job: the domain's own rule."""
        return due_moment(
            JobStatus(self.status),
            resume_at=self.resume_at,
            lease_until=self.lease_until,
            deadline_at=self.deadline_at,
            since=self.updated_at,
        )

    @property
    def cost_usd(self) -> Decimal:
        return Decimal(self.cost_micros) / MICROS


COLUMNS = [f.name for f in fields(StatusRow)]
_MOMENTS = ("resume_at", "lease_until", "deadline_at", "created_at", "updated_at")


def create_statements(d: StoreBackend) -> list[str]:
    t = d.table("jobledger_job_status")
    ts = d.timestamp_type
    return [
        f"CREATE TABLE IF NOT EXISTS {t} ("
        "job_uuid TEXT PRIMARY KEY, tenant_id TEXT NOT NULL, job_id TEXT NOT NULL, "
        "workflow_type TEXT NOT NULL, workflow_version INTEGER NOT NULL, "
        "status TEXT NOT NULL, current_step INTEGER NOT NULL, next_step TEXT, "
        f"resume_at {ts}, lease_until {ts}, deadline_at {ts}, worker_id TEXT, wait_event TEXT, "
        f"pending_approval TEXT, cost_micros {d.big_int} NOT NULL, "
        "steps_executed INTEGER NOT NULL, last_error TEXT, "
        f"created_at {ts} NOT NULL, updated_at {ts} NOT NULL, version INTEGER NOT NULL, "
        f"due_at {ts}, mission_id TEXT, correlation_id TEXT)",
        # The reconciler's question: which jobs in this status are due by now.
        f"CREATE INDEX IF NOT EXISTS jobledger_job_status_due ON {t} (status, due_at)",
        # list --tenant --status
        f"CREATE INDEX IF NOT EXISTS jobledger_job_status_tenant ON {t} "
        "(tenant_id, status, updated_at)",
    ]


def upgrade(d: StoreBackend, curs: Cursor) -> bool:
    """Add the columns a view made by an older release lacks. True when it did: the rows
    then lack those values, and the caller folds the views again from the log."""
    added = {"deadline_at": d.timestamp_type, "mission_id": "TEXT", "correlation_id": "TEXT"}
    present = d.columns(curs, "jobledger_job_status")
    missing = {name: kind for name, kind in added.items() if name not in present}
    t = d.table("jobledger_job_status")
    for name, kind in missing.items():
        curs.execute(d.sql(f"ALTER TABLE {t} ADD COLUMN {name} {kind}"))
    return bool(missing)


def add_taken_marks(d: StoreBackend, curs: Cursor) -> None:
    """The columns a worker marks a due job with when it takes it (``taken_version``,
    ``taken_until``). The fold never writes them, so no row needs folding again."""
    present = d.columns(curs, "jobledger_job_status")
    t = d.table("jobledger_job_status")
    for name, kind in (("taken_version", "INTEGER"), ("taken_until", d.timestamp_type)):
        if name not in present:
            curs.execute(d.sql(f"ALTER TABLE {t} ADD COLUMN {name} {kind}"))


def load(d: StoreBackend, curs: Cursor, job_uuid: str) -> StatusRow | None:
    curs.execute(
        d.sql(f"SELECT * FROM {d.table('jobledger_job_status')} WHERE job_uuid = :job_uuid"),
        {"job_uuid": job_uuid},
    )
    found = curs.fetchone()
    return None if found is None else row_from(d.row(found))


def row_from(data: dict[str, Any]) -> StatusRow:
    values = {name: data[name] for name in COLUMNS}
    for name in _MOMENTS:
        if isinstance(values[name], str):
            values[name] = datetime.fromisoformat(values[name])
    return StatusRow(**values)


def save(d: StoreBackend, curs: Cursor, row: StatusRow) -> None:
    values = asdict(row)
    values["due_at"] = d.ts(row.due_at)
    for name in _MOMENTS:
        values[name] = d.ts(values[name])
    names = [*COLUMNS, "due_at"]
    updates = ", ".join(f"{n} = excluded.{n}" for n in names if n != "job_uuid")
    curs.execute(
        d.sql(
            f"INSERT INTO {d.table('jobledger_job_status')} ({', '.join(names)}) "
            f"VALUES ({', '.join(':' + n for n in names)}) "
            f"ON CONFLICT (job_uuid) DO UPDATE SET {updates}"
        ),
        values,
    )


def fold(row: StatusRow | None, event: Job.Event) -> StatusRow:
    job = _shell(row)
    event.evolve(job)
    created = row.created_at if row else event.timestamp
    return StatusRow(
        job_uuid=str(event.originator_id),
        tenant_id=job.tenant_id,
        job_id=job.job_id,
        workflow_type=job.workflow_type,
        workflow_version=job.workflow_version,
        status=str(job.status),
        current_step=job.current_step,
        next_step=job.cursor,
        resume_at=job.resume_at,
        lease_until=job.lease_until,
        deadline_at=job.deadline_at,
        worker_id=job.worker_id,
        wait_event=job.wait_event.name if job.wait_event else None,
        pending_approval=job.pending_approval.approval_id if job.pending_approval else None,
        cost_micros=int(job.total_cost_usd * MICROS),
        steps_executed=job.total_steps_executed,
        last_error=job.last_error,
        created_at=created,
        updated_at=event.timestamp,
        version=event.originator_version,
        mission_id=job.mission_id,
        correlation_id=job.correlation_id,
    )


def _shell(row: StatusRow | None) -> Job:
    """A Job carrying only what the view keeps; evolve() needs nothing else."""
    job = Job.__new__(Job)
    if row is None:
        return job
    job.tenant_id, job.job_id = row.tenant_id, row.job_id
    job.mission_id, job.correlation_id = row.mission_id, row.correlation_id
    job.workflow_type, job.workflow_version = row.workflow_type, row.workflow_version
    job.status = JobStatus(row.status)
    job.current_step, job.cursor = row.current_step, row.next_step
    job.resume_at, job.lease_until, job.worker_id = row.resume_at, row.lease_until, row.worker_id
    job.claim_id = None
    # The row keeps the wait's name and the approval's id; the rest of each is never read
    # into it, so it is left blank.
    job.wait_event = (
        EventWait(row.wait_event, "", "", row.updated_at, None) if row.wait_event else None
    )
    job.pending_approval = (
        ApprovalGate(row.pending_approval, 0, 0, "", (), None, None, None, None)
        if row.pending_approval
        else None
    )
    job.total_cost_usd = Decimal(row.cost_micros) / MICROS
    job.total_steps_executed = row.steps_executed
    job.last_error = row.last_error
    job.completed_at = None
    job.state, job.visits, job.inbox, job.attempt = {}, {}, (), 0
    job.parent, job.children, job.join, job.children_cost_usd = None, {}, None, Decimal(0)
    # The deadline is all of the budget the view keeps (a BudgetRaised replaces it).
    job.budget = JobBudget(deadline_at=row.deadline_at)
    return job
