"""The Cost port for the embedded default: tenant spend per UTC day, folded from the log.

A reader of the log like the views (the same follower, the same spend fold), kept in
memory: it reads each partition from where it last stopped, so a call costs only the
events appended since the previous one, and is rebuilt from the log on start. The
durable spend view replaces it where one runs.
"""

from __future__ import annotations

import threading
from collections import defaultdict
from collections.abc import Sequence
from datetime import UTC, date, datetime
from decimal import Decimal
from uuid import UUID

from eventsourcing.persistence import Notification
from eventsourcing.utils import get_topic

from jobledger.adapters.event_store import EventSourcedJobStore, LedgerPartition
from jobledger.adapters.follower import LogFollower
from jobledger.adapters.store_errors import store_errors
from jobledger.domain.job import Job
from jobledger.domain.spend import spend_of


class LogSpend:
    topics = (get_topic(Job.Submitted), get_topic(Job.StepRecorded))

    def __init__(self, store: EventSourcedJobStore) -> None:
        self.follower = LogFollower(store, self, batch=500)
        self._positions: dict[str, int] = defaultdict(int)
        self._tenants: dict[UUID, str] = {}
        self._spend: dict[tuple[str, date], Decimal] = defaultdict(Decimal)
        self._lock = threading.Lock()

    @store_errors("reading the tenant's spend")
    def tenant_day_spend_usd(self, tenant_id: str, day_start: datetime) -> Decimal:
        with self._lock:
            self.follower.catch_up()
            return self._spend[(tenant_id, day_start.astimezone(UTC).date())]

    # ---- a reader of the log, tracked in memory --------------------------------------------

    def tracking_name(self, partition: LedgerPartition) -> str:
        return f"{partition.name}.spend"

    def position(self, partition: LedgerPartition) -> int:
        return self._positions[partition.name]

    def process(self, partition: LedgerPartition, notifications: Sequence[Notification]) -> None:
        for notification in notifications:
            self._fold(partition.mapper.to_domain_event(notification))
            self._positions[partition.name] = notification.id

    def _fold(self, event: object) -> None:
        if isinstance(event, Job.Submitted):
            self._tenants[event.originator_id] = event.tenant_id
        elif isinstance(event, Job.StepRecorded):
            spent = spend_of(self._tenants[event.originator_id], event)
            if spent is not None:
                self._spend[(spent.tenant_id, spent.day)] += spent.usd
