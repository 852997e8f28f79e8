"""The counters and histograms the engine's ops events move (an Ops sink)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram

from jobledger.adapters.metrics.labels import CappedLabel
from jobledger.orchestration.ports import OpsEvent

SECONDS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 900)
"""From a step that records only (milliseconds) to a model call of minutes."""
KIND_CAP = 50
"""Error kinds and workflow types come from code the deployment runs, but a bug that puts
an id into one must not grow the series without bound."""
FINISHED = {"job.completed": "completed", "job.failed": "failed", "job.cancelled": "cancelled"}


class OpsMetrics:
    """Counts what the ops events report; an event it has no use for costs one lookup."""

    def __init__(self, registry: CollectorRegistry, *, tenants: CappedLabel | None) -> None:
        self.tenants = tenants
        self.kinds = CappedLabel(KIND_CAP)
        self.workflows = CappedLabel(KIND_CAP)
        by_tenant = ["tenant"] if tenants is not None else []

        def counter(name: str, help: str, labels: list[str] | None = None) -> Counter:
            return Counter(name, help, labels or [], registry=registry)

        def histogram(name: str, help: str, labels: list[str] | None = None) -> Histogram:
            return Histogram(name, help, labels or [], buckets=SECONDS, registry=registry)

        self.ticks = counter("jobledger_ticks", "Ticks run, by how they ended.", ["outcome"])
        self.tick_seconds = histogram("jobledger_tick_duration_seconds", "How long ticks took.")
        self.steps = counter(
            "jobledger_steps", "Steps run, by workflow and outcome.", ["workflow", "outcome"]
        )
        self.step_seconds = histogram(
            "jobledger_step_duration_seconds", "How long recorded steps took.", ["workflow"]
        )
        self.executor_errors = counter(
            "jobledger_executor_errors", "Errors raised by the step executor.", ["kind"]
        )
        self.retries = counter("jobledger_step_retries", "Step retries scheduled.")
        self.claims_lost = counter(
            "jobledger_claims_lost", "Ticks that lost the job to another claim.", ["when"]
        )
        self.cost = counter("jobledger_cost_usd", "Spend recorded by steps, in USD.", by_tenant)
        self.store_errors = counter(
            "jobledger_store_errors", "Ticks interrupted by a store error.", ["kind"]
        )
        self.dead_lettered = counter(
            "jobledger_dlq_messages", "Messages dead-lettered.", ["topic", "reason"]
        )
        self.reconcile_seconds = histogram(
            "jobledger_reconciler_pass_duration_seconds", "How long reconciler passes took."
        )
        self.reconciled = counter(
            "jobledger_reconciler_enqueued_jobs",
            "Due jobs the reconciler enqueued, or local workers took from the store.",
        )
        self.archived = counter(
            "jobledger_archived_jobs", "Finished jobs the runner's archive passes archived."
        )
        self.archive_passes = counter(
            "jobledger_archive_passes", "The runner's archive passes, by outcome.", ["outcome"]
        )
        self.submitted = counter(
            "jobledger_jobs_submitted", "Jobs submitted.", ["workflow", *by_tenant]
        )
        self.finished = counter("jobledger_jobs_finished", "Jobs that finished.", ["outcome"])
        self.completed: dict[str, tuple[Counter, Histogram]] = {}
        self.handlers: dict[str, Callable[[OpsEvent], None]] = {
            "job.tick.ended": self.tick_ended,
            "job.step.completed": self.step_completed,
            "job.step.errored": self.step_errored,
            "job.step.retry_scheduled": lambda _: self.retries.inc(),
            "job.step.discarded": lambda _: self.claims_lost.labels("during_step").inc(),
            "job.tick.dead_lettered": self.dead_letter,
            "job.signal.dead_lettered": self.dead_letter,
            "reconciler.pass": self.reconciler_pass,
            # One per due job enqueued by a pass, or taken by a local worker (Reconciler.take).
            "job.reconciled": lambda _: self.reconciled.inc(),
            "job.submitted": self.job_submitted,
            "retention.pass": self.archive_pass,
            **{name: self.job_finished for name in FINISHED},
        }

    def record(self, event: OpsEvent) -> None:
        handler = self.handlers.get(event.eventType)
        if handler is not None:
            handler(event)

    def tick_ended(self, event: OpsEvent) -> None:
        data = event.metadata
        outcome = str(data.get("outcome"))
        self.ticks.labels(outcome).inc()
        self.tick_seconds.observe(_seconds(data))
        if outcome == "claim_lost":
            self.claims_lost.labels("before_step").inc()
        elif outcome == "store_error":
            self.store_errors.labels(self.kinds(str(data.get("errorKind")))).inc()

    def step_completed(self, event: OpsEvent) -> None:
        workflow = self.workflows(str(event.metadata.get("workflowType")))
        series = self.completed.get(workflow)
        if series is None:  # one per capped label, so as bounded as the series are
            series = self.completed[workflow] = self.completed_series(workflow)
        steps, seconds = series
        steps.inc()
        seconds.observe(_seconds(event.metadata))
        cost = _amount(event.metadata.get("costUsd"))
        if cost > 0:
            spent = (
                self.cost
                if self.tenants is None
                else self.cost.labels(self.tenants(event.tenantId))
            )
            spent.inc(cost)

    def completed_series(self, workflow: str) -> tuple[Counter, Histogram]:
        """A workflow's completed-steps count and step durations. Kept per workflow:
        ``labels()`` takes a lock and checks its values, once per step otherwise."""
        return self.steps.labels(workflow, "completed"), self.step_seconds.labels(workflow)

    def step_errored(self, event: OpsEvent) -> None:
        data = event.metadata
        outcome = "retry_scheduled" if data.get("willRetry") else "failed"
        self.steps.labels(self.workflows(str(data.get("workflowType"))), outcome).inc()
        self.executor_errors.labels(self.kinds(str(data.get("errorKind")))).inc()

    def dead_letter(self, event: OpsEvent) -> None:
        reason = self.kinds(str(event.metadata.get("reason")))
        self.dead_lettered.labels(event.queueName, reason).inc()

    def reconciler_pass(self, event: OpsEvent) -> None:
        self.reconcile_seconds.observe(_seconds(event.metadata))

    def archive_pass(self, event: OpsEvent) -> None:
        self.archive_passes.labels(event.status).inc()
        self.archived.inc(int(event.metadata.get("archived", 0)))

    def job_submitted(self, event: OpsEvent) -> None:
        labels = [self.workflows(str(event.metadata.get("workflowType")))]
        if self.tenants is not None:
            labels.append(self.tenants(event.tenantId))
        self.submitted.labels(*labels).inc()

    def job_finished(self, event: OpsEvent) -> None:
        self.finished.labels(FINISHED[event.eventType]).inc()


def _seconds(metadata: dict[str, Any]) -> float:
    return float(metadata.get("durationMs", 0)) / 1000


def _amount(value: object) -> float:
    """A step's cost as the ops event carries it (a Decimal's string: float reads them)."""
    try:
        return float(str(value))
    except ValueError:
        return 0.0
