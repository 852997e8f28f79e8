"""What the retention tests share: finished jobs to archive, and the raw rows of a job
(what "byte for byte" compares)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from jobledger import Engine
from jobledger.adapters.clock import FakeClock
from jobledger.domain.identity import job_uuid
from jobledger.domain.retention import RetentionPolicy
from jobledger.projections.job_views import JobViews
from jobledger.projections.retention import Archiver, Scope
from tests.support.engines import store_of

POLICY = RetentionPolicy(default_days=30)
LATER = timedelta(days=31)


def finished_jobs(
    engine: Engine, n: int, *, tenant: str = "acme", prefix: str = "j", tail: bool = True
) -> list[str]:
    ids = [f"{prefix}{i}" for i in range(n)]
    for job_id in ids:
        engine.submit(tenant, job_id, "agent3", input={"n": job_id})
    engine.run_until_idle()
    if tail:
        # A job submitted after them holds the newest event of the log (never archived).
        engine.submit("tail", f"{tenant}-{prefix}", "agent3")
    return ids


def raw_rows(engine: Engine, tenant: str, job_id: str) -> list[tuple[Any, ...]]:
    """The job's stored rows as the database holds them (their log positions aside)."""
    store = store_of(engine)
    uuid = job_uuid(tenant, job_id)
    partition = store.partition(uuid)
    rows = store.backend.fetch(
        "SELECT originator_version, topic, state FROM "
        f"{store.backend.table(partition.events_table)} WHERE originator_id = :id "
        "ORDER BY originator_version",
        {"id": store.backend.uuid(uuid)},
    )
    return [(r["originator_version"], r["topic"], bytes(r["state"])) for r in rows]


def archiver(engine: Engine) -> Archiver:
    return Archiver(store_of(engine), JobViews(store_of(engine)))


def due_later(engine: Engine, clock: FakeClock, scope: Scope | None = None) -> list[Any]:
    return archiver(engine).due(scope or Scope(POLICY), clock.now() + LATER)
