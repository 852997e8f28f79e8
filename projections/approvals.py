"""Pending approvals: the inbox a person works from."""

from __future__ import annotations

from typing import Any

from jobledger.adapters.backends import Cursor, StoreBackend
from jobledger.domain.job import Job


def create_statements(d: StoreBackend) -> list[str]:
    t = d.table("jobledger_pending_approvals")
    ts = d.timestamp_type
    return [
        f"CREATE TABLE IF NOT EXISTS {t} ("
        "job_uuid TEXT NOT NULL, approval_id TEXT NOT NULL, tenant_id TEXT NOT NULL, "
        "job_id TEXT NOT NULL, step_number INTEGER NOT NULL, attempt INTEGER NOT NULL, "
        f"approvers TEXT NOT NULL, expires_at {ts}, requested_at {ts} NOT NULL, "
        "PRIMARY KEY (job_uuid, approval_id))",
        f"CREATE INDEX IF NOT EXISTS jobledger_pending_approvals_tenant ON {t} "
        "(tenant_id, requested_at)",
    ]


def apply(d: StoreBackend, curs: Cursor, tenant_id: str, job_id: str, event: Job.Event) -> None:
    t = d.table("jobledger_pending_approvals")
    key: dict[str, Any] = {"job_uuid": str(event.originator_id)}
    if isinstance(event, Job.ApprovalRequested):
        curs.execute(
            d.sql(
                f"INSERT INTO {t} (job_uuid, approval_id, tenant_id, job_id, step_number, "
                "attempt, approvers, expires_at, requested_at) VALUES (:job_uuid, "
                ":approval_id, :tenant_id, :job_id, :step_number, :attempt, :approvers, "
                ":expires_at, :requested_at) ON CONFLICT (job_uuid, approval_id) DO NOTHING"
            ),
            {
                **key,
                "approval_id": event.approval_id,
                "tenant_id": tenant_id,
                "job_id": job_id,
                "step_number": event.step_number,
                "attempt": event.attempt,
                "approvers": ",".join(event.approvers),
                "expires_at": d.ts(event.expires_at),
                "requested_at": d.ts(event.timestamp),
            },
        )
    elif isinstance(event, Job.ApprovalReassigned):
        # The inbox shows the request to its new approvers only.
        curs.execute(
            d.sql(
                f"UPDATE {t} SET approvers = :approvers "
                "WHERE job_uuid = :job_uuid AND approval_id = :approval_id"
            ),
            {**key, "approval_id": event.approval_id, "approvers": ",".join(event.approvers)},
        )
    elif isinstance(event, (Job.ApprovalDecided, Job.ApprovalExpired)):
        curs.execute(
            d.sql(f"DELETE FROM {t} WHERE job_uuid = :job_uuid AND approval_id = :approval_id"),
            {**key, "approval_id": event.approval_id},
        )
    elif isinstance(event, (Job.Cancelled, Job.Failed, Job.Reset)):
        curs.execute(d.sql(f"DELETE FROM {t} WHERE job_uuid = :job_uuid"), key)
