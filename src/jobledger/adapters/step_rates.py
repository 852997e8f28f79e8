"""The StepRates port: one row per scope holding the next moment a step may take.

A reservation is ONE upsert (the generic cell rate algorithm, without a burst): the
database serialises the workers, each takes the next free moment and moves it on by
one interval, so the fleet never steps faster than the rate however many workers ask.
"""

from __future__ import annotations

from datetime import datetime

from jobledger.adapters.backends import STEP_RATE_TABLE, StoreBackend
from jobledger.adapters.store_errors import store_errors


class StepRateTable:
    def __init__(self, backend: StoreBackend) -> None:
        self.backend = backend

    def reserve(self, scope: str, per_second: float, now: datetime) -> float:
        b = self.backend
        interval = max(1, round(1_000_000 / per_second))
        at = round(now.timestamp() * 1_000_000)
        statement = (
            f"INSERT INTO {b.table(STEP_RATE_TABLE)} AS r (scope, next_at) "
            "VALUES (:scope, :first) ON CONFLICT (scope) DO UPDATE SET "
            f"next_at = {b.greatest}(r.next_at, :now) + :interval RETURNING next_at"
        )
        params = {"scope": scope, "first": at + interval, "now": at, "interval": interval}
        with store_errors("reserving a step under its rate"), b.transaction() as curs:
            curs.execute(b.sql(statement), params)
            next_at = int(b.row(curs.fetchone())["next_at"])
        # The moment reserved is the one before the next free one.
        return max(0.0, (next_at - interval - at) / 1_000_000)
