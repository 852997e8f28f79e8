"""Tenant spend per UTC day, in integer micro-dollars (exact on both stores)."""

from __future__ import annotations

from datetime import UTC, datetime
from decimal import Decimal

from jobledger.adapters.backends import Cursor, StoreBackend
from jobledger.domain.job import Job
from jobledger.domain.spend import spend_of
from jobledger.projections.status import MICROS


def create_statements(d: StoreBackend) -> list[str]:
    return [
        f"CREATE TABLE IF NOT EXISTS {d.table('jobledger_tenant_spend')} ("
        f"tenant_id TEXT NOT NULL, day TEXT NOT NULL, spend_micros {d.big_int} NOT NULL, "
        "PRIMARY KEY (tenant_id, day))"
    ]


def apply(d: StoreBackend, curs: Cursor, tenant_id: str, event: Job.Event) -> None:
    spent = spend_of(tenant_id, event)
    if spent is None:
        return
    curs.execute(
        d.sql(
            f"INSERT INTO {d.table('jobledger_tenant_spend')} (tenant_id, day, spend_micros) "
            "VALUES (:tenant_id, :day, :micros) ON CONFLICT (tenant_id, day) "
            f"DO UPDATE SET spend_micros = {d.table('jobledger_tenant_spend')}.spend_micros "
            "+ excluded.spend_micros"
        ),
        {
            "tenant_id": tenant_id,
            "day": spent.day.isoformat(),
            "micros": int(spent.usd * MICROS),
        },
    )


def day_spend(d: StoreBackend, tenant_id: str, day_start: datetime) -> Decimal:
    rows = d.fetch(
        f"SELECT spend_micros FROM {d.table('jobledger_tenant_spend')} "
        "WHERE tenant_id = :tenant_id AND day = :day",
        {"tenant_id": tenant_id, "day": day_start.astimezone(UTC).date().isoformat()},
    )
    return sum((Decimal(r["spend_micros"]) / MICROS for r in rows), Decimal(0))


def days(d: StoreBackend, tenant_id: str, limit: int) -> list[tuple[str, Decimal]]:
    """The tenant's spend per UTC day (ISO date), newest day first."""
    rows = d.fetch(
        f"SELECT day, spend_micros FROM {d.table('jobledger_tenant_spend')} "
        "WHERE tenant_id = :tenant_id ORDER BY day DESC LIMIT :limit",
        {"tenant_id": tenant_id, "limit": limit},
    )
    return [(str(r["day"]), Decimal(r["spend_micros"]) / MICROS) for r in rows]
