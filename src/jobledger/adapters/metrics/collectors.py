"""What is read at scrape time, never by scanning the log: the status view's counts,
the readers' positions in each partition's log, and the Kafka workers' lag."""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from datetime import datetime
from typing import Protocol

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from jobledger.adapters.follower import Lag
from jobledger.adapters.metrics.labels import CappedLabel
from jobledger.domain.errors import JobLedgerError

log = logging.getLogger(__name__)

Now = Callable[[], datetime]


class StatusSource(Protocol):
    """The status view's answers (``projections.JobViews`` is one)."""

    def status_totals(self) -> Sequence[tuple[str, str, int]]:
        """(tenant, status, jobs) for every pair with a job."""

    def ready_jobs(self) -> tuple[int, datetime | None]:
        """Jobs queued for a worker, and when the longest-waiting one was queued."""


class LogReaderSource(Protocol):
    """A reader of the log (the views, the outbox): where it is against each partition."""

    def lag(self) -> Sequence[Lag]: ...

    def pending_since(self) -> Mapping[str, datetime | None]:
        """Per partition: when its oldest event not yet read was written (None: none)."""


class ConsumerLag(Protocol):
    """A Kafka worker: per (topic, partition) it holds, how many messages it is behind,
    and which subscriptions it finds paused."""

    @property
    def consumer_lag(self) -> Mapping[tuple[str, int], int]: ...

    @property
    def paused_subscriptions(self) -> frozenset[str]: ...


class Source(Protocol):
    """One thing read at scrape time."""

    name: str

    def families(self) -> Iterator[GaugeMetricFamily]: ...


class ScrapeTime(Collector):
    """Every source read at scrape time, as one collector: two sources may fill the same
    family (the views' and the outbox's lag), and a source that fails (the store away)
    yields nothing this scrape but says so in ``jobledger_metrics_source_up``, rather
    than failing the whole scrape."""

    def __init__(self) -> None:
        self.sources: dict[str, Source] = {}

    def add(self, source: Source) -> None:
        """Once per name: the HTTP API and the supervisor may both ask for the views."""
        self.sources.setdefault(source.name, source)

    def collect(self) -> Iterator[GaugeMetricFamily]:
        up = GaugeMetricFamily(
            "jobledger_metrics_source_up",
            "1 when this source answered the scrape, 0 when it failed (the store away).",
            labels=["source"],
        )
        merged: dict[str, GaugeMetricFamily] = {}
        for name, source in list(self.sources.items()):
            try:
                families = list(source.families())
            except JobLedgerError as error:
                log.warning("metrics source %s failed: %s", name, error)
                up.add_metric([name], 0)
                continue
            up.add_metric([name], 1)
            for family in families:
                if family.name in merged:
                    merged[family.name].samples.extend(family.samples)
                else:
                    merged[family.name] = family
        yield from merged.values()
        yield up

    def describe(self) -> Iterator[GaugeMetricFamily]:
        return iter(())  # nothing read at registration: the store is read at scrape only


class StatusCollector:
    """Jobs by status (by tenant when configured), and the ready jobs' queue."""

    name = "status_view"

    def __init__(self, views: StatusSource, now: Now, tenants: CappedLabel | None) -> None:
        self.views = views
        self.now = now
        self.tenants = tenants

    def families(self) -> Iterator[GaugeMetricFamily]:
        labels = ["status"] if self.tenants is None else ["status", "tenant"]
        jobs = GaugeMetricFamily(
            "jobledger_jobs", "Jobs by status, from the status view.", labels=labels
        )
        counts: Counter[tuple[str, ...]] = Counter()
        for tenant, status, n in self.views.status_totals():
            by_tenant = () if self.tenants is None else (self.tenants(tenant),)
            counts[(status, *by_tenant)] += n
        for labelled, n in sorted(counts.items()):
            jobs.add_metric(list(labelled), n)
        yield jobs
        ready, oldest = self.views.ready_jobs()
        yield GaugeMetricFamily(
            "jobledger_jobs_ready", "Jobs queued for a worker and not yet claimed.", value=ready
        )
        age = 0.0 if oldest is None else max(0.0, (self.now() - oldest).total_seconds())
        yield GaugeMetricFamily(
            "jobledger_jobs_ready_oldest_age_seconds",
            "How long the longest-waiting ready job has been queued (0: none).",
            value=age,
        )


class LogLagCollector:
    """How far a reader of the log (the views, the outbox) is behind, per partition."""

    def __init__(self, reader: str, source: LogReaderSource, now: Now) -> None:
        self.reader = reader
        self.name = f"{reader}_lag"
        self.log_reader = source
        self.now = now

    def families(self) -> Iterator[GaugeMetricFamily]:
        labels = ["reader", "partition"]
        events = GaugeMetricFamily(
            "jobledger_projection_lag_events",
            "Events a reader of the log has not processed yet, per partition.",
            labels=labels,
        )
        seconds = GaugeMetricFamily(
            "jobledger_projection_lag_seconds",
            "Age of the oldest event a reader has not processed yet (0: caught up).",
            labels=labels,
        )
        since = self.log_reader.pending_since()
        for entry in self.log_reader.lag():
            events.add_metric([self.reader, entry.partition], entry.behind)
            oldest = since.get(entry.partition)
            age = 0.0 if oldest is None else max(0.0, (self.now() - oldest).total_seconds())
            seconds.add_metric([self.reader, entry.partition], age)
        yield events
        yield seconds


class KafkaLagCollector:
    """The Kafka workers' consumer lag, per partition they hold (as of their last poll),
    and per subscription (``subscriptions``: name to topic) its lag and pause."""

    name = "kafka_consumer_lag"

    def __init__(
        self, workers: Sequence[ConsumerLag], group: str, subscriptions: Mapping[str, str]
    ) -> None:
        self.workers = workers
        self.group = group
        self.subscriptions = subscriptions

    def families(self) -> Iterator[GaugeMetricFamily]:
        lag = GaugeMetricFamily(
            "jobledger_kafka_consumer_lag",
            "Messages between a worker's position and the partition's end.",
            labels=["group", "topic", "partition"],
        )
        by_topic: Counter[str] = Counter()
        for worker in self.workers:
            for (topic, partition), behind in sorted(worker.consumer_lag.items()):
                lag.add_metric([self.group, topic, str(partition)], behind)
                by_topic[topic] += behind
        yield lag
        if self.subscriptions:
            yield from self._subscriptions(by_topic)

    def _subscriptions(self, by_topic: Counter[str]) -> Iterator[GaugeMetricFamily]:
        lag = GaugeMetricFamily(
            "jobledger_subscription_lag",
            "Messages of a subscription's topic not made jobs of yet, over the partitions "
            "this process's workers hold.",
            labels=["subscription"],
        )
        paused = GaugeMetricFamily(
            "jobledger_subscription_paused",
            "1 while a subscription is paused (jobledger subscriptions pause), else 0.",
            labels=["subscription"],
        )
        switched = {name for worker in self.workers for name in worker.paused_subscriptions}
        for name, topic in sorted(self.subscriptions.items()):
            lag.add_metric([name], by_topic[topic])
            paused.add_metric([name], 1 if name in switched else 0)
        yield lag
        yield paused
