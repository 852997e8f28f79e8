"""Prometheus metrics (issue 14): counters the ops events move, gauges read at scrape
time from the status view and the log readers' positions, labels that stay bounded, and
``/metrics`` on the HTTP API. On SQLite and PostgreSQL; the scraped processes, the Kafka
consumer lag and the outbox are in tests/test_metrics_processes.py."""

from __future__ import annotations

import json
import re
from datetime import timedelta
from pathlib import Path

import pytest

from jobledger import Engine, StepError, StepRequest
from jobledger.adapters.clock import FakeClock
from jobledger.adapters.metrics import OTHER, Metrics
from jobledger.api.auth import Role
from jobledger.orchestration.ports import OpsEvent
from jobledger.projections import JobViews
from tests.support.engines import CountingExecutor, EngineFactory
from tests.support.http import api_key, api_registry, start_api
from tests.support.outage import Outage
from tests.support.scrape import Samples, names, parse, total, value


def metrics_of(engine: Engine) -> Metrics:
    kept = engine.deps.metrics
    assert kept is not None
    return kept


def scraped(engine: Engine) -> Samples:
    return parse(metrics_of(engine).render().decode())


def by_label(samples: Samples, name: str, label: str) -> dict[str, float]:
    """``name``'s values by one label (summed over the others), rounded to cents."""
    found: dict[str, float] = {}
    for (sample, labels), v in samples.items():
        if sample == name:
            key = dict(labels)[label]
            found[key] = round(found.get(key, 0.0) + v, 6)
    return found


def test_ticks_steps_spend_and_durations_are_counted(make_engine: EngineFactory) -> None:
    engine = make_engine(metrics=True)
    for n in range(3):
        engine.submit("acme", f"j{n}", "agent3")

    engine.run_until_idle()

    s = scraped(engine)
    assert value(s, "jobledger_jobs_submitted_total", workflow="agent3") == 3
    # Three side effects and the completion, per job.
    assert value(s, "jobledger_steps_total", workflow="agent3", outcome="completed") == 12
    assert value(s, "jobledger_step_duration_seconds_count", workflow="agent3") == 12
    assert value(s, "jobledger_ticks_total", outcome="advanced") == 3
    assert value(s, "jobledger_tick_duration_seconds_count") == 3
    assert value(s, "jobledger_tick_duration_seconds_sum") > 0
    assert value(s, "jobledger_cost_usd_total") == pytest.approx(0.9)  # no tenant label
    assert value(s, "jobledger_jobs_finished_total", outcome="completed") == 3
    assert not any(dict(labels).get("tenant") for _, labels in s)


def test_executor_errors_retries_and_failures_are_counted_by_kind(
    make_engine: EngineFactory, executor: CountingExecutor
) -> None:
    engine = make_engine(metrics=True)
    engine.submit("acme", "flaky", "agent3")
    engine.submit("acme", "broken", "agent3")

    def fail(request: StepRequest) -> Exception | None:
        if request.job.job_id == "broken":
            return StepError("no such tool", retryable=False, kind="bad_tool")
        first_two = executor.calls[request.idempotency_key] <= 2 and request.step_number == 1
        return StepError("slow down", retryable=True, kind="rate_limit") if first_two else None

    executor.fail_with = fail
    engine.run_until_idle(wait_for_timers=True)

    s = scraped(engine)
    assert value(s, "jobledger_executor_errors_total", kind="rate_limit") == 2
    assert value(s, "jobledger_executor_errors_total", kind="bad_tool") == 1
    assert value(s, "jobledger_step_retries_total") == 2
    assert value(s, "jobledger_steps_total", workflow="agent3", outcome="retry_scheduled") == 2
    assert value(s, "jobledger_steps_total", workflow="agent3", outcome="failed") == 1
    assert value(s, "jobledger_jobs_finished_total", outcome="failed") == 1
    assert value(s, "jobledger_jobs_finished_total", outcome="completed") == 1


def test_claims_lost_and_store_errors_are_counted(
    make_engine: EngineFactory,
    executor: CountingExecutor,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    first, second = make_engine(metrics=True), make_engine(metrics=True)
    first.submit("t", "j", "agent3")

    def during_step(request: StepRequest) -> None:
        if request.step_number == 1:
            second.tick("t", "j", "duplicate")  # the first holds the claim
        return None

    executor.fail_with = during_step
    first.tick("t", "j")
    assert value(scraped(second), "jobledger_claims_lost_total", when="before_step") == 1
    assert value(scraped(second), "jobledger_ticks_total", outcome="claim_lost") == 1

    first.submit("t", "k", "agent3")
    outage = Outage(first.deps.store, monkeypatch)
    outage.during(first.deps.store, "load")
    with pytest.raises(Exception, match="store error"):
        first.tick("t", "k")
    driver_error = "OperationalError"  # sqlite3's and psycopg's alike
    s = scraped(first)
    assert value(s, "jobledger_store_errors_total", kind=driver_error) == 1
    assert value(s, "jobledger_ticks_total", outcome="store_error") == 1


def test_jobs_by_status_and_the_ready_queue_are_read_from_the_status_view(
    make_engine: EngineFactory, clock: FakeClock
) -> None:
    engine = make_engine(metrics=True)
    views = JobViews(engine.deps.store)
    metrics_of(engine).watch_status(views)
    engine.submit("acme", "done", "agent3")
    engine.run_until_idle()
    engine.submit("acme", "waiting-1", "agent3")
    clock.advance(timedelta(seconds=30))
    engine.submit("globex", "waiting-2", "agent3")
    clock.advance(timedelta(seconds=15))

    views.catch_up()
    s = scraped(engine)

    assert value(s, "jobledger_jobs", status="completed") == 1
    assert value(s, "jobledger_jobs", status="queued") == 2
    assert total(s, "jobledger_jobs") == sum(
        sum(views.status_counts(t).values()) for t in ("acme", "globex")
    )
    assert value(s, "jobledger_jobs_ready") == 2
    assert value(s, "jobledger_jobs_ready_oldest_age_seconds") == 45  # waiting-1, by the clock
    assert value(s, "jobledger_metrics_source_up", source="status_view") == 1

    engine.run_until_idle()
    views.catch_up()
    s = scraped(engine)
    assert value(s, "jobledger_jobs", status="completed") == 3
    assert value(s, "jobledger_jobs_ready") == 0
    assert value(s, "jobledger_jobs_ready_oldest_age_seconds") == 0


def test_projection_lag_is_read_in_positions_and_seconds(
    make_engine: EngineFactory, clock: FakeClock
) -> None:
    engine = make_engine(metrics=True, config={"partitions": 2})
    views = JobViews(engine.deps.store)
    metrics_of(engine).watch_log_reader("views", views)
    views.catch_up()
    engine.submit("acme", "a", "agent3")
    clock.advance(timedelta(seconds=20))
    for n in range(6):
        engine.submit("acme", f"b{n}", "agent3")
    clock.advance(timedelta(seconds=5))

    s = scraped(engine)
    behind = {
        dict(labels)["partition"]: v
        for (name, labels), v in s.items()
        if name == "jobledger_projection_lag_events"
    }
    assert set(behind) == {lag.partition for lag in views.lag()}
    assert sum(behind.values()) == 7 == views.lag_total()
    ages = [v for (name, _), v in s.items() if name == "jobledger_projection_lag_seconds"]
    assert max(ages) == 25  # "a" waits longest, wherever it landed
    assert min(ages) >= 5

    views.catch_up()
    s = scraped(engine)
    assert total(s, "jobledger_projection_lag_events") == 0
    assert total(s, "jobledger_projection_lag_seconds") == 0


def test_a_source_that_fails_is_reported_down_and_the_rest_is_still_scraped(
    make_engine: EngineFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine = make_engine(metrics=True)
    views = JobViews(engine.deps.store)
    metrics_of(engine).watch_status(views)
    engine.submit("acme", "j", "agent3")
    engine.run_until_idle()
    Outage(engine.deps.store, monkeypatch).down = True

    s = scraped(engine)

    assert value(s, "jobledger_metrics_source_up", source="status_view") == 0
    assert "jobledger_jobs" not in names(s)
    assert value(s, "jobledger_steps_total", workflow="agent3", outcome="completed") == 4


def test_tenants_are_a_label_only_when_configured_and_fold_into_other_beyond_the_cap(
    make_engine: EngineFactory,
) -> None:
    engine = make_engine(
        metrics=True, config={"metrics_tenant_label": True, "metrics_tenant_cap": 2}
    )
    views = JobViews(engine.deps.store)
    metrics_of(engine).watch_status(views)
    tenants = ["alpha", "bravo", "charlie", "delta"]
    for tenant in tenants:
        engine.submit(tenant, "job-id-never-a-label", "agent3")
    engine.run_until_idle()
    views.catch_up()

    s = scraped(engine)

    spend = by_label(s, "jobledger_cost_usd_total", "tenant")
    assert spend == {"alpha": 0.3, "bravo": 0.3, OTHER: 0.6}  # the first two, then the rest
    assert by_label(s, "jobledger_jobs", "tenant") == {"alpha": 1, "bravo": 1, OTHER: 2}
    assert value(s, "jobledger_jobs_submitted_total", workflow="agent3", tenant=OTHER) == 2
    text = metrics_of(engine).render().decode()
    assert "job-id-never-a-label" not in text
    assert "charlie" not in text and "delta" not in text


def test_workflow_types_beyond_the_cap_fold_into_other_and_every_step_is_still_counted() -> None:
    """A bug that makes each job's workflow type unique must not grow the series, nor what
    the counting keeps per series; a cost the event cannot say counts as none."""
    metrics = Metrics()
    cap = metrics.counting.workflows.cap
    for n in range(cap + 10):
        for cost in ("0.25", "1E-2", "not a number"):
            metrics.record(
                OpsEvent(
                    jobId=f"j{n}",
                    tenantId="acme",
                    eventType="job.step.completed",
                    status="running",
                    metadata={"workflowType": f"wf-{n}", "durationMs": 20, "costUsd": cost},
                )
            )

    s = parse(metrics.render().decode())
    steps = by_label(s, "jobledger_steps_total", "workflow")
    assert len(steps) == cap + 1
    assert steps[OTHER] == 30
    assert sum(steps.values()) == 3 * (cap + 10)
    assert len(metrics.counting.completed) == cap + 1
    assert by_label(s, "jobledger_step_duration_seconds_count", "workflow")[OTHER] == 30
    assert value(s, "jobledger_cost_usd_total") == pytest.approx(0.26 * (cap + 10))


def test_the_api_serves_metrics_to_a_caller_of_every_tenant_only(
    make_engine: EngineFactory, tmp_path: Path
) -> None:
    engine = make_engine(registry=api_registry(), metrics=True)
    engine.submit("acme", "j", "agent3")
    engine.run_until_idle()
    JobViews(engine.deps.store).catch_up()  # what `projections run` does beside `serve`
    with start_api(engine, tmp_path) as api:
        with api.client() as anonymous:
            assert anonymous.get("/metrics").status_code == 401
        with api.client(api_key("acme", Role.ADMIN)) as one_tenant:
            refused = one_tenant.get("/metrics")
            assert refused.status_code == 403 and "every tenant" in refused.json()["detail"]
        with api.as_role("auditor", tenant="*") as scraper:
            response = scraper.get("/metrics")
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("text/plain; version=0.0.4")
    s = parse(response.text)
    assert value(s, "jobledger_steps_total", workflow="agent3", outcome="completed") == 4
    assert value(s, "jobledger_jobs", status="completed") == 1
    assert total(s, "jobledger_projection_lag_events", reader="views") == 0


def test_the_api_of_an_engine_without_metrics_says_so(
    make_engine: EngineFactory, tmp_path: Path
) -> None:
    engine = make_engine(registry=api_registry())
    with start_api(engine, tmp_path) as api, api.as_role("auditor", tenant="*") as scraper:
        response = scraper.get("/metrics")
    assert response.status_code == 404
    assert response.json()["detail"] == "this process keeps no metrics"


ROOT = Path(__file__).resolve().parent.parent


def documented() -> set[str]:
    table_rows = (ROOT / "docs" / "metrics.md").read_text().splitlines()
    return {
        m
        for row in table_rows
        if row.startswith("| `")
        for m in re.findall(r"`(jobledger_\w+)`", row)
    }


def test_every_metric_is_documented_and_the_dashboard_reads_only_those() -> None:
    code = "".join(p.read_text() for p in (ROOT / "src/jobledger/adapters/metrics").glob("*.py"))
    defined = set(re.findall(r'"(jobledger_\w+)"', code))
    docs = documented()
    assert len(defined) >= 20
    for name in defined:
        assert name in docs or f"{name}_total" in docs, f"{name} is not in docs/metrics.md"
    dashboard = (ROOT / "examples/observability/grafana/dashboards/jobledger.json").read_text()
    queried = {
        re.sub(r"_(bucket|count|sum)$", "", m) for m in re.findall(r"jobledger_\w+", dashboard)
    }
    assert queried - {"jobledger"} <= docs, queried - docs
    panels = json.loads(dashboard)["panels"]
    titles = " ".join(p["title"].lower() for p in panels)
    for topic in ("throughput", "latency", "lag", "errors", "spend"):
        assert topic in titles
