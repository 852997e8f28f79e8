"""Views and the reconciler on both stores: exactly-once tracking, rebuilds, due jobs."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from collections.abc import Sequence
from datetime import timedelta
from decimal import Decimal
from typing import Any

import pytest
from eventsourcing.persistence import Notification

from jobledger import Engine, JobStatus, Resolution, StepRequest, linear_workflow
from jobledger.adapters.clock import FakeClock
from jobledger.adapters.event_store import EventSourcedJobStore, LedgerPartition
from jobledger.adapters.local_queue import LocalQueue
from jobledger.adapters.locks import lock_for
from jobledger.adapters.ops import MemoryOps
from jobledger.adapters.store_url import parse_store_url
from jobledger.orchestration.reconciler import Reconciler, ReconcileResult
from jobledger.projections import JobViews, ProjectionRunner
from tests.support.engines import CountingExecutor, EngineFactory


def views_of(engine: Engine) -> JobViews:
    assert isinstance(engine.store, EventSourcedJobStore)
    return JobViews(engine.store)


def snapshot(views: JobViews) -> tuple[Any, ...]:
    rows = sorted((vars(r) for r in views.jobs(limit=10_000)), key=lambda r: r["job_uuid"])
    approvals = sorted(views.pending_approvals(), key=lambda r: r["approval_id"])
    spend = views.tenant_day_spend_usd("t", views.jobs()[0].created_at)
    return rows, [a["approval_id"] for a in approvals], spend


def mixed_jobs(engine: Engine, clock: FakeClock) -> None:
    """Completed, waiting on a timer, failed, parked, cancelled: a bit of everything."""
    engine.submit("t", "done", "agent3")
    engine.submit("t", "timer", "timer")
    engine.submit("t", "parked", "agent3", budget={"max_steps": 1})
    engine.submit("t", "cancelled", "agent3")
    engine.cancel("t", "cancelled", reason="no longer needed", by="ops")
    engine.run_until_idle()


def test_incremental_views_equal_a_rebuild_from_zero(
    make_engine: EngineFactory, clock: FakeClock
) -> None:
    engine = make_engine()
    views = views_of(engine)
    mixed_jobs(engine, clock)
    views.catch_up()
    clock.advance(timedelta(days=4))
    engine.run_until_idle(wait_for_timers=True)
    views.catch_up()
    incremental = snapshot(views)

    replayed = views.rebuild()

    assert replayed == sum(entry.last_event for entry in views.lag())
    assert snapshot(views) == incremental
    by_job = {r.job_id: r for r in views.jobs()}
    assert by_job["done"].status == "completed" and by_job["done"].cost_usd == Decimal("0.3")
    assert by_job["timer"].status == "completed"
    assert by_job["parked"].status == "budget_exceeded"
    assert by_job["cancelled"].status == "cancelled"
    assert views.lag_total() == 0


def one_job_pending(
    make_engine: EngineFactory,
) -> tuple[Engine, JobViews, LedgerPartition, Sequence[Notification]]:
    """An engine that ran one job, its views, and the batch its first partition has for them."""
    engine = make_engine()
    views = views_of(engine)
    engine.submit("t", "j", "agent3")
    engine.run_until_idle()
    partition = engine.store.partitions[0]  # type: ignore[attr-defined]
    return engine, views, partition, views.pending(partition)


def test_a_crash_between_view_write_and_tracking_cannot_happen(
    make_engine: EngineFactory, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    _, views, partition, batch = one_job_pending(make_engine)

    def crash(*args: Any, **kwargs: Any) -> None:
        raise RuntimeError("power cut after the view rows were written")

    monkeypatch.setattr(views, "track", crash)
    with pytest.raises(RuntimeError, match="power cut"):
        views.process(partition, batch)
    monkeypatch.undo()

    # The views rolled back with the tracking: nothing half-applied.
    assert views.jobs() == []
    assert views.position(partition) == 0
    views.catch_up()
    assert views.tenant_day_spend_usd("t", clock.now()) == Decimal("0.30")
    assert views.jobs()[0].status == "completed"


def test_a_redelivered_batch_is_ignored(make_engine: EngineFactory, clock: FakeClock) -> None:
    engine, views, partition, batch = one_job_pending(make_engine)

    views.process(partition, batch)
    views.process(partition, batch)

    assert views.tenant_day_spend_usd("t", clock.now()) == Decimal("0.30")
    assert views.jobs()[0].version == engine.job("t", "j").version


def test_lag_is_visible_until_the_runner_catches_up(make_engine: EngineFactory) -> None:
    engine = make_engine()
    views = views_of(engine)
    engine.submit("t", "j", "agent3")
    engine.run_until_idle()
    # One row per event: a step's key is its record's identity (it was + 4 key rows).
    assert views.lag_total() == len(engine.history("t", "j"))

    runner = ProjectionRunner(views, poll_interval=0.05)
    assert runner.run_once()

    assert views.lag_total() == 0


def test_pending_approvals_follow_requests_and_decisions(
    make_engine: EngineFactory,
) -> None:
    from tests.support.notifiers import Inbox
    from tests.test_waits_and_gates import approval_workflow

    inbox = Inbox()
    # One tick at a time: "a" requests its approval first (both at the same fake time).
    engine = make_engine(
        registry=approval_workflow(approvers=("alice",)),
        notifier=inbox,
        config={"concurrency": 1},
    )
    views = views_of(engine)
    engine.submit("t", "a", "gate")
    engine.submit("t", "b", "gate")
    engine.run_until_idle()
    views.catch_up()
    assert [a["job_id"] for a in views.pending_approvals("t")] == ["a", "b"]

    engine.decide("t", "a", inbox.approvals["a"].approval_id, "approve", "alice")
    views.catch_up()

    [open_request] = views.pending_approvals("t")
    assert (open_request["job_id"], open_request["approvers"]) == ("b", "alice")
    assert views.pending_approvals("other") == []


def test_the_spend_view_serves_the_cost_ceiling(
    make_engine: EngineFactory, executor: CountingExecutor
) -> None:
    holder: dict[str, JobViews] = {}

    class ViewCost:
        def tenant_day_spend_usd(self, tenant_id: str, day_start: Any) -> Decimal:
            views = holder["views"]
            views.catch_up()
            return views.tenant_day_spend_usd(tenant_id, day_start)

    engine = make_engine(cost=ViewCost(), config={"cost_ceiling_usd": "0.15"})
    holder["views"] = views_of(engine)
    engine.submit("t", "j", "agent3")

    assert engine.tick("t", "j").outcome == "deferred"
    assert sum(executor.calls.values()) == 2


# ---- the reconciler ---------------------------------------------------------------------


def reconciler_for(
    engine: Engine,
    store_url: str,
    queue: LocalQueue,
    ops: MemoryOps,
    clock: FakeClock,
    name: str = "reconciler",
) -> Reconciler:
    return Reconciler(
        views=views_of(engine),
        queue=queue,
        clock=clock,
        lock=lock_for(parse_store_url(store_url), name),
        ops=ops,
        lost_tick_after=timedelta(seconds=30),
    )


def test_due_timers_expired_leases_and_lost_ticks_are_enqueued_once_per_due_moment(
    make_engine: EngineFactory,
    store_url: str,
    clock: FakeClock,
    ops: MemoryOps,
    executor: CountingExecutor,
) -> None:
    engine = make_engine(config={"lease_ms": 60_000})
    engine.submit("t", "timer", "timer")
    engine.submit("t", "lost", "agent3")  # its tick will be "lost": never handled
    engine.submit("t", "stuck", "agent3")
    engine.tick("t", "timer")  # now waiting three days

    def die_on_stuck(request: StepRequest) -> None:
        if request.job.job_id == "stuck":
            raise SystemExit("worker killed")  # a BaseException: nothing catches it

    executor.fail_with = die_on_stuck
    with pytest.raises(SystemExit):  # the worker dies mid-step: a lease is left behind
        engine.tick("t", "stuck")
    executor.fail_with = None
    views = views_of(engine)
    views.catch_up()
    queue = LocalQueue(clock)
    reconciler = reconciler_for(engine, store_url, queue, ops, clock)

    assert reconciler.reconcile() == ReconcileResult(scanned=0, enqueued=0, skipped=0)

    clock.advance(timedelta(minutes=2))  # the lease lapsed; the queued job sat too long
    first = reconciler.reconcile()
    assert (first.scanned, first.enqueued) == (2, 2)
    assert sorted(t.job_id for _, t, _ in queue.pending()) == ["lost", "stuck"]
    again = reconciler.reconcile()
    assert (again.scanned, again.enqueued, again.skipped) == (2, 0, 2)

    clock.advance(timedelta(days=3))  # the timer is due too
    later = reconciler.reconcile()
    assert [t.job_id for _, t, _ in queue.pending()].count("timer") == 1
    assert later.enqueued == 3  # the timer, and the two others re-sent after resend_after

    worker = make_engine(config={"lease_ms": 60_000}, queue=queue)  # fed by the reconciler
    worker.run_until_idle()
    assert all(worker.job("t", j).status is JobStatus.COMPLETED for j in ("timer", "lost", "stuck"))


def test_two_reconcilers_never_both_act(
    make_engine: EngineFactory, store_url: str, clock: FakeClock, ops: MemoryOps
) -> None:
    engine = make_engine()
    engine.submit("t", "lost", "agent3")
    views_of(engine).catch_up()
    clock.advance(timedelta(minutes=5))
    q1, q2 = LocalQueue(clock), LocalQueue(clock)
    first = reconciler_for(engine, store_url, q1, ops, clock)
    second = reconciler_for(engine, store_url, q2, ops, clock)

    assert first.reconcile().acted
    assert not second.reconcile().acted
    assert (len(q1), len(q2)) == (1, 0)

    first.stop()  # the holder goes away: the other takes over
    assert second.reconcile().acted
    assert len(q2) == 1
    second.stop()


def test_views_ignore_other_workflows_statuses_and_filter_lists(
    make_engine: EngineFactory,
) -> None:
    from tests.support.engines import default_registry

    registry = default_registry()
    registry.register("other", 1, linear_workflow([Resolution("complete", JobStatus.COMPLETED)]))
    engine = make_engine(registry=registry)
    engine.submit("t", "a", "agent3")
    engine.submit("u", "b", "other")
    engine.run_until_idle()
    views = views_of(engine)
    views.catch_up()

    assert [r.job_id for r in views.jobs(tenant_id="u")] == ["b"]
    assert [r.job_id for r in views.jobs(workflow_type="agent3")] == ["a"]
    assert {r.job_id for r in views.jobs(status_in=["completed"])} == {"a", "b"}
    assert views.jobs(status_in=["failed"]) == []


def test_processes_starting_together_on_a_fresh_store_create_the_tables_once(
    store_url: str,
) -> None:
    script = textwrap.dedent(f"""
        import sys
        sys.path.insert(0, "src")
        sys.path.insert(0, ".")
        from jobledger.adapters.event_store import EventSourcedJobStore
        from jobledger.adapters.store_url import parse_store_url
        from jobledger.projections import JobViews
        store = EventSourcedJobStore(parse_store_url({store_url!r}), partitions=2)
        JobViews(store)
        print("ok")
    """)
    starters = [
        subprocess.Popen(
            [sys.executable, "-c", script],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(4)
    ]
    results = [p.communicate(timeout=60) for p in starters]
    assert [out.strip() for out, _ in results] == ["ok"] * 4, [err for _, err in results]
