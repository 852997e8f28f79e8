"""The Cost port for the embedded default: tenant spend per UTC day, folded from the log.

It follows each partition's notification log from where it last stopped, so a call costs
only the events appended since the previous one. Kept in memory and rebuilt from the log
on start; the durable spend projection replaces it where one runs.
"""

from __future__ import annotations

import threading
from collections import defaultdict
from datetime import UTC, date, datetime
from decimal import Decimal
from uuid import UUID

from eventsourcing.utils import get_topic

from jobledger.adapters.event_store import EventSourcedJobStore, LedgerPartition
from jobledger.adapters.store_errors import store_errors
from jobledger.job import Job

_TOPICS = (get_topic(Job.Submitted), get_topic(Job.StepRecorded))
_PAGE = 500


class LogSpend:
    def __init__(self, store: EventSourcedJobStore) -> None:
        self.store = store
        self._positions = [0] * len(store.partitions)
        self._tenants: dict[UUID, str] = {}
        self._spend: dict[tuple[str, date], Decimal] = defaultdict(Decimal)
        self._lock = threading.Lock()

    @store_errors("reading the tenant's spend")
    def tenant_day_spend_usd(self, tenant_id: str, day_start: datetime) -> Decimal:
        with self._lock:
            for index, partition in enumerate(self.store.partitions):
                self._follow(index, partition)
            return self._spend[(tenant_id, day_start.astimezone(UTC).date())]

    def _follow(self, index: int, partition: LedgerPartition) -> None:
        while True:
            page = partition.recorder.select_notifications(
                self._positions[index], _PAGE, topics=_TOPICS, inclusive_of_start=False
            )
            for notification in page:
                self._fold(partition.mapper.to_domain_event(notification))
                self._positions[index] = notification.id
            if len(page) < _PAGE:
                return

    def _fold(self, event: object) -> None:
        if isinstance(event, Job.Submitted):
            self._tenants[event.originator_id] = event.tenant_id
        elif isinstance(event, Job.StepRecorded) and event.cost_usd:
            tenant = self._tenants[event.originator_id]
            self._spend[(tenant, event.ended_at.astimezone(UTC).date())] += event.cost_usd
