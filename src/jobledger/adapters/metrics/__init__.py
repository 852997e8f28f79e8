"""Prometheus metrics: counters the ops events move, gauges read at scrape time.

Needs prometheus-client (the ``metrics`` extra; the ``http`` extra brings it too).
Everything lives in one registry per :class:`Metrics`, never the library's global one,
so two engines in one process (tests, benchmarks) count apart. docs/metrics.md lists
every metric.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    disable_created_metrics,
    generate_latest,
)

from jobledger.adapters.metrics.collectors import (
    ConsumerLag,
    KafkaLagCollector,
    LogLagCollector,
    LogReaderSource,
    Now,
    ScrapeTime,
    StatusCollector,
    StatusSource,
)
from jobledger.adapters.metrics.counting import OpsMetrics
from jobledger.adapters.metrics.labels import OTHER, CappedLabel
from jobledger.adapters.metrics.server import MetricsServer
from jobledger.config import EngineConfig
from jobledger.orchestration.ports import OpsEvent

__all__ = ["CONTENT_TYPE", "OTHER", "CappedLabel", "Metrics", "MetricsServer"]
CONTENT_TYPE = CONTENT_TYPE_LATEST
# A ``_created`` series beside every counter doubles what is scraped for a figure the
# dashboards never read (the library's switch is process wide; so is this process's use).
disable_created_metrics()  # type: ignore[no-untyped-call]


def _utc_now() -> datetime:
    return datetime.now(UTC)


class Metrics:
    """One process's metrics: an Ops sink (tee it beside the log) and what the process
    watches at scrape time (the status view, the readers' lag, the Kafka workers)."""

    def __init__(
        self, *, tenant_label: bool = False, tenant_cap: int = 50, now: Now = _utc_now
    ) -> None:
        self.now = now
        """The engine's clock: ages (of the ready jobs, of a reader's lag) are measured
        against the time the events were stamped with."""
        self.registry = CollectorRegistry()
        self.tenants = CappedLabel(tenant_cap) if tenant_label else None
        self.counting = OpsMetrics(self.registry, tenants=self.tenants)
        self.scraped = ScrapeTime()
        self.registry.register(self.scraped)

    @classmethod
    def of(cls, config: EngineConfig, now: Now = _utc_now) -> Metrics:
        return cls(
            tenant_label=config.metrics.tenant_label, tenant_cap=config.metrics.tenant_cap, now=now
        )

    def record(self, event: OpsEvent) -> None:
        """The Ops port."""
        self.counting.record(event)

    # ---- read at scrape time -----------------------------------------------------------

    def watch_status(self, views: StatusSource) -> None:
        self.scraped.add(StatusCollector(views, self.now, self.tenants))

    def watch_log_reader(self, reader: str, source: LogReaderSource) -> None:
        """``reader`` names it in the ``reader`` label: ``views`` or ``outbox``."""
        self.scraped.add(LogLagCollector(reader, source, self.now))

    def watch_consumers(
        self, workers: list[ConsumerLag], group: str, subscriptions: Mapping[str, str]
    ) -> None:
        """``subscriptions``: each subscription's topic by its name."""
        self.scraped.add(KafkaLagCollector(workers, group, subscriptions))

    # ---- exposition --------------------------------------------------------------------

    def render(self) -> bytes:
        """The text exposition format (``CONTENT_TYPE``), as a scrape gets it."""
        return generate_latest(self.registry)

    def serve(self, host: str, port: int) -> MetricsServer:
        return MetricsServer(self.registry, host, port)
