"""Schedules: cron firings as jobs, exactly once, on both stores, with an injected clock."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from zoneinfo import ZoneInfo

import pytest

from jobledger import Engine, FunctionRegistry, JobStatus, linear_workflow
from jobledger.adapters.clock import FakeClock
from jobledger.adapters.event_store import EventSourcedJobStore
from jobledger.adapters.locks import lock_for
from jobledger.adapters.ops import MemoryOps
from jobledger.adapters.store_url import parse_store_url
from jobledger.domain.errors import (
    InvalidScheduleError,
    ScheduleExistsError,
    ScheduleStateError,
    UnknownScheduleError,
    UnknownWorkflowError,
)
from jobledger.domain.identity import schedule_uuid
from jobledger.engine.schedule_commands import ScheduleFiring
from jobledger.orchestration.reconciler import Reconciler
from jobledger.projections import JobViews
from jobledger.runtime.supervisor import Services, Supervisor
from tests.support.cli import make_cli
from tests.support.engines import EngineFactory, agent_steps, default_registry

ROOT = Path(__file__).resolve().parent.parent
T = "sched-tenant"
START = datetime(2026, 1, 1, tzinfo=UTC)  # the FakeClock's start: a Thursday


def firing(engine: Engine) -> ScheduleFiring:
    assert isinstance(engine.store, EventSourcedJobStore)
    views = JobViews(engine.store)
    views.catch_up()
    return ScheduleFiring(engine.schedules, views)


def fire(engine: Engine, clock: FakeClock) -> int:
    """One firing pass as the reconciler runs it: views caught up, then what is due."""
    return firing(engine).fire_due(clock.now(), 1_000)


def events(engine: Engine, name: str) -> list[tuple[str, dict[str, object]]]:
    return [(e.event_type, e.data) for e in engine.schedules.history(T, name)]


def fired_jobs(engine: Engine, name: str) -> list[str]:
    return [str(data["job_id"]) for kind, data in events(engine, name) if kind == "Fired"]


def hourly(engine: Engine, name: str, **policies: object) -> None:
    engine.schedules.create(
        T,
        name,
        cron="0 * * * *",
        timezone="UTC",
        workflow_type="agent3",
        input={"report": name},
        **policies,  # type: ignore[arg-type]
    )


# ---- firing --------------------------------------------------------------------------------


def test_a_schedule_fires_its_job_at_the_cron_time_on_its_own_clock_once(
    make_engine: EngineFactory, clock: FakeClock, store_url: str
) -> None:
    engine = make_engine()
    view = engine.schedules.create(
        T,
        "morning",
        cron="0 7 * * *",
        timezone="Europe/Paris",
        workflow_type="agent3",
        input={"topic": "tides"},
    )
    # 07:00 in Paris in January is 06:00 UTC.
    assert view.next_fire_at == datetime(2026, 1, 1, 6, tzinfo=UTC)
    assert view.next_fire_local is not None and view.next_fire_local.hour == 7
    assert view.state == "active"

    clock.set(datetime(2026, 1, 1, 5, 59, tzinfo=UTC))
    assert fire(engine, clock) == 0
    assert engine.schedules.history(T, "morning")[-1].event_type == "Created"

    clock.set(datetime(2026, 1, 1, 6, 0, 3, tzinfo=UTC))
    assert isinstance(engine.store, EventSourcedJobStore)
    views = JobViews(engine.store)
    views.catch_up()
    reconciler = Reconciler(
        views=views,
        queue=engine.queue,
        clock=clock,
        lock=lock_for(parse_store_url(store_url), "sched-reconciler"),
        ops=MemoryOps(),
        schedules=ScheduleFiring(engine.schedules, views),
    )
    assert reconciler.reconcile().fired == 1
    # The view has not followed the firing yet: the pass asks the schedule itself again.
    assert reconciler.reconcile().fired == 0
    reconciler.stop()
    assert fire(engine, clock) == 0

    [job_id] = fired_jobs(engine, "morning")
    assert job_id == "morning@2026-01-01T06:00:00Z"
    job = engine.job(T, job_id)
    assert job.state == {"topic": "tides"} and job.workflow_type == "agent3"
    fired = engine.schedules.history(T, "morning")[-1]
    assert fired.data["fire_time"] == datetime(2026, 1, 1, 6, tzinfo=UTC)
    after = engine.schedules.get(T, "morning")
    assert after.next_fire_at == datetime(2026, 1, 2, 6, tzinfo=UTC)
    assert (after.last_job_id, after.fired) == (job_id, 1)
    engine.run_until_idle()
    assert engine.job(T, job_id).status is JobStatus.COMPLETED


def test_the_supervisors_reconciler_fires_due_schedules_and_runs_their_jobs(
    make_engine: EngineFactory, clock: FakeClock
) -> None:
    engine = make_engine()
    hourly(engine, "sup")
    clock.set(datetime(2026, 1, 1, 1, 0, 2, tzinfo=UTC))
    result, handled = Supervisor(engine, Services.of("reconcile", kafka=False)).reconcile_once()
    assert result.fired == 1 and handled >= 1
    assert engine.job(T, "sup@2026-01-01T01:00:00Z").status is JobStatus.COMPLETED


def test_the_view_lists_a_tenants_schedules_and_indexes_what_is_due(
    make_engine: EngineFactory, clock: FakeClock
) -> None:
    engine = make_engine()
    hourly(engine, "b-hourly")
    engine.schedules.create(
        T, "a-daily", cron="30 6 * * 1-5", timezone="America/New_York", workflow_type="agent3"
    )
    engine.schedules.create("other", "x", cron="0 * * * *", timezone="UTC", workflow_type="agent3")
    assert isinstance(engine.store, EventSourcedJobStore)
    views = JobViews(engine.store)
    views.catch_up()
    rows = views.tenant_schedules(T)
    assert [r.name for r in rows] == ["a-daily", "b-hourly"]
    assert rows[0].next_fire_at == datetime(2026, 1, 1, 11, 30, tzinfo=UTC)  # 06:30 EST
    due = views.due_schedules(START + timedelta(hours=1), 100)
    assert sorted(r.name for r in due) == ["b-hourly", "x"]
    engine.schedules.pause(T, "b-hourly")
    engine.schedules.delete("other", "x")
    views.catch_up()
    assert views.due_schedules(START + timedelta(hours=1), 100) == []
    assert [r.name for r in views.tenant_schedules("other")] == []
    assert [r.state for r in views.tenant_schedules("other", deleted=True)] == ["deleted"]
    views.rebuild()
    assert [(r.name, r.state) for r in views.tenant_schedules(T)] == [
        ("a-daily", "active"),
        ("b-hourly", "paused"),
    ]


@pytest.mark.parametrize(
    ("cron", "zone", "problem"),
    [
        ("0 7 * *", "UTC", "must have 5 fields"),
        ("61 * * * *", "UTC", "invalid cron expression"),
        ("0 7 * * * *", "UTC", "must have 5 fields"),
        ("0 7 * * *", "Europe/Atlantis", "unknown time zone"),
        ("0 7 * * *", "", "unknown time zone"),
    ],
)
def test_a_bad_cron_or_zone_is_refused_naming_it_and_nothing_is_written(
    make_engine: EngineFactory, cron: str, zone: str, problem: str
) -> None:
    engine = make_engine()
    with pytest.raises(InvalidScheduleError, match=problem):
        engine.schedules.create(T, "bad", cron=cron, timezone=zone, workflow_type="agent3")
    assert engine.store.load_schedule(schedule_uuid(T, "bad")) is None


def test_an_unknown_workflow_a_bad_policy_or_a_taken_name_is_refused(
    make_engine: EngineFactory,
) -> None:
    engine = make_engine()
    with pytest.raises(UnknownWorkflowError, match="nope"):
        engine.schedules.create(T, "s", cron="0 7 * * *", timezone="UTC", workflow_type="nope")
    with pytest.raises(InvalidScheduleError, match="overlap must be one of"):
        hourly(engine, "s", overlap="queue")
    with pytest.raises(InvalidScheduleError, match="needs its bound"):
        hourly(engine, "s", catch_up="all")
    with pytest.raises(InvalidScheduleError, match="catch-up-max applies"):
        hourly(engine, "s", catch_up="one", catch_up_max=3)
    assert engine.store.load_schedule(schedule_uuid(T, "s")) is None
    hourly(engine, "s")
    with pytest.raises(ScheduleExistsError):
        hourly(engine, "s")
    with pytest.raises(UnknownScheduleError):
        engine.schedules.pause(T, "missing")
    engine.schedules.delete(T, "s")
    with pytest.raises(ScheduleStateError, match="was deleted"):
        engine.schedules.resume(T, "s")
    with pytest.raises(ScheduleExistsError, match="keeps its name"):
        hourly(engine, "s")


def test_a_reconciler_without_the_workflow_leaves_the_firing_due_for_one_that_has_it(
    make_engine: EngineFactory, clock: FakeClock
) -> None:
    engine = make_engine()
    hourly(engine, "d")
    undeployed = make_engine(registry=FunctionRegistry())  # e.g. a reconciler without definitions
    clock.set(datetime(2026, 1, 1, 1, 0, 5, tzinfo=UTC))
    assert fire(undeployed, clock) == 0
    assert [kind for kind, _ in events(engine, "d")] == ["Created"]
    assert engine.schedules.get(T, "d").next_fire_at == datetime(2026, 1, 1, 1, tzinfo=UTC)
    assert fire(engine, clock) == 1
    assert fired_jobs(engine, "d") == ["d@2026-01-01T01:00:00Z"]


def test_an_input_holding_the_workflows_personal_data_is_refused(
    make_engine: EngineFactory,
) -> None:
    """A schedule's input sits unsealed in its own history, out of an erasure's reach."""
    registry = default_registry()
    registry.register(
        "letter", 1, linear_workflow(agent_steps(1)), personal_data=("customer.email",)
    )
    engine = make_engine(registry=registry)
    with pytest.raises(InvalidScheduleError, match=r"personal data .* customer.email"):
        engine.schedules.create(
            T,
            "letters",
            cron="0 9 * * 1",
            timezone="Europe/Paris",
            workflow_type="letter",
            input={"customer": {"email": "a@example.org"}},
        )
    assert engine.store.load_schedule(schedule_uuid(T, "letters")) is None
    engine.schedules.create(
        T, "letters", cron="0 9 * * 1", timezone="UTC", workflow_type="letter", input={"n": 1}
    )


# ---- catch-up and overlap ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("policy", "bound", "expected_fires", "expected_skipped"),
    [
        ("skip", None, ["10:00"], 9),  # 01:00 .. 09:00 missed: none fired
        ("one", None, ["09:00", "10:00"], 8),  # the latest missed one, then the on-time one
        ("all", 3, ["07:00", "08:00", "09:00", "10:00"], 6),  # the latest three
        ("all", 50, [f"{h:02d}:00" for h in range(1, 11)], 0),
    ],
)
def test_missed_firings_follow_the_catch_up_policy(
    make_engine: EngineFactory,
    clock: FakeClock,
    policy: str,
    bound: int | None,
    expected_fires: list[str],
    expected_skipped: int,
) -> None:
    engine = make_engine()
    hourly(engine, "h", catch_up=policy, catch_up_max=bound)
    # Everything was down from 00:00 to 10:00:20: ten firings are due, nine of them missed.
    clock.set(datetime(2026, 1, 1, 10, 0, 20, tzinfo=UTC))
    assert fire(engine, clock) == len(expected_fires)
    jobs = fired_jobs(engine, "h")
    assert jobs == [f"h@2026-01-01T{t}:00Z" for t in expected_fires]
    assert all(engine.job(T, j).status is JobStatus.QUEUED for j in jobs)
    skipped = [data for kind, data in events(engine, "h") if kind == "Skipped"]
    assert sum(int(str(s["missed"])) for s in skipped) == expected_skipped
    if expected_skipped:
        assert f"missed {expected_skipped} firing(s)" in str(skipped[0]["reason"])
    view = engine.schedules.get(T, "h")
    assert view.next_fire_at == datetime(2026, 1, 1, 11, tzinfo=UTC)
    assert (view.fired, view.skipped) == (len(expected_fires), expected_skipped)
    assert fire(engine, clock) == 0


def test_overlap_skip_skips_while_the_previous_job_runs(
    make_engine: EngineFactory, clock: FakeClock
) -> None:
    engine = make_engine()
    hourly(engine, "o", overlap="skip")
    clock.set(datetime(2026, 1, 1, 1, 0, 1, tzinfo=UTC))
    assert fire(engine, clock) == 1
    clock.set(datetime(2026, 1, 1, 2, 0, 1, tzinfo=UTC))  # 01:00's job has not run yet
    assert fire(engine, clock) == 0
    kind, data = events(engine, "o")[-1]
    assert kind == "Skipped" and "has not finished" in str(data["reason"])
    engine.run_until_idle()  # the 01:00 job finishes
    clock.set(datetime(2026, 1, 1, 3, 0, 1, tzinfo=UTC))
    assert fire(engine, clock) == 1
    assert fired_jobs(engine, "o") == ["o@2026-01-01T01:00:00Z", "o@2026-01-01T03:00:00Z"]


def test_overlap_buffer_one_keeps_one_firing_and_fires_it_when_the_previous_job_ends(
    make_engine: EngineFactory, clock: FakeClock
) -> None:
    engine = make_engine()
    hourly(engine, "b", overlap="buffer_one")
    clock.set(datetime(2026, 1, 1, 1, 0, 1, tzinfo=UTC))
    assert fire(engine, clock) == 1
    clock.set(datetime(2026, 1, 1, 2, 0, 1, tzinfo=UTC))
    assert fire(engine, clock) == 0  # buffered
    clock.set(datetime(2026, 1, 1, 3, 0, 1, tzinfo=UTC))
    assert fire(engine, clock) == 0  # one is buffered already: this one is skipped
    assert [kind for kind, _ in events(engine, "b")][-2:] == ["Buffered", "Skipped"]
    assert engine.schedules.get(T, "b").buffered_fire_at == datetime(2026, 1, 1, 2, tzinfo=UTC)
    clock.set(datetime(2026, 1, 1, 3, 5, tzinfo=UTC))
    assert fire(engine, clock) == 0  # still running: the buffered one waits
    engine.run_until_idle()  # the 01:00 job ends
    assert fire(engine, clock) == 1
    kind, data = events(engine, "b")[-1]
    assert (kind, data["trigger"]) == ("Fired", "buffered")
    assert fired_jobs(engine, "b") == ["b@2026-01-01T01:00:00Z", "b@2026-01-01T02:00:00Z"]
    assert engine.schedules.get(T, "b").buffered_fire_at is None


def test_overlap_allow_fires_whatever_runs(make_engine: EngineFactory, clock: FakeClock) -> None:
    engine = make_engine()
    hourly(engine, "a")
    for hour in (1, 2, 3):
        clock.set(datetime(2026, 1, 1, hour, 0, 1, tzinfo=UTC))
        assert fire(engine, clock) == 1
    assert len(fired_jobs(engine, "a")) == 3


# ---- pause, resume, delete, trigger ------------------------------------------------------


def test_pause_stops_firing_and_resume_goes_on_from_the_next_time_without_catching_up(
    make_engine: EngineFactory, clock: FakeClock
) -> None:
    engine = make_engine()
    hourly(engine, "p", catch_up="all", catch_up_max=10)
    assert engine.schedules.pause(T, "p").state == "paused"
    with pytest.raises(ScheduleStateError, match="it is paused"):
        engine.schedules.pause(T, "p")
    clock.set(datetime(2026, 1, 1, 3, 30, tzinfo=UTC))
    assert fire(engine, clock) == 0
    assert engine.schedules.fire(T, "p") == []  # asked directly too: nothing while paused
    resumed = engine.schedules.resume(T, "p")
    assert resumed.next_fire_at == datetime(2026, 1, 1, 4, tzinfo=UTC)
    assert fire(engine, clock) == 0
    clock.set(datetime(2026, 1, 1, 4, 0, 1, tzinfo=UTC))
    assert fire(engine, clock) == 1
    engine.schedules.delete(T, "p")
    clock.set(datetime(2026, 1, 1, 5, 0, 1, tzinfo=UTC))
    assert fire(engine, clock) == 0
    assert [kind for kind, _ in events(engine, "p")] == [
        "Created",
        "Paused",
        "Resumed",
        "Fired",
        "Deleted",
    ]


def test_trigger_fires_now_under_its_own_key_and_leaves_the_cron_alone(
    make_engine: EngineFactory, clock: FakeClock
) -> None:
    engine = make_engine()
    hourly(engine, "t")
    clock.set(datetime(2026, 1, 1, 0, 20, 0, 123456, tzinfo=UTC))
    job_id = engine.schedules.trigger(T, "t")
    assert job_id == "t@2026-01-01T00:20:00.123456Z/manual"
    assert engine.job(T, job_id).state == {"report": "t"}
    clock.advance(timedelta(seconds=1))
    assert engine.schedules.trigger(T, "t") != job_id
    view = engine.schedules.get(T, "t")
    assert view.next_fire_at == datetime(2026, 1, 1, 1, tzinfo=UTC) and view.fired == 2
    kind, data = events(engine, "t")[1]
    assert (kind, data["trigger"]) == ("Fired", "manual")


# ---- exactly once ------------------------------------------------------------------------


def test_two_reconcilers_racing_fire_each_time_once(
    make_engine: EngineFactory, clock: FakeClock
) -> None:
    first, second = make_engine(), make_engine()
    for n in range(4):
        hourly(first, f"r{n}", catch_up="all", catch_up_max=5)
    clock.set(datetime(2026, 1, 1, 3, 0, 1, tzinfo=UTC))  # 01:00, 02:00 missed; 03:00 on time
    firings = [firing(first), firing(second)]
    start = threading.Barrier(2)
    counts: list[int] = []

    def run(which: ScheduleFiring) -> None:
        start.wait()
        counts.append(which.fire_due(clock.now(), 1_000))

    threads = [threading.Thread(target=run, args=(f,)) for f in firings]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert sum(counts) == 12  # each Fired recorded by one of them
    for n in range(4):
        jobs = fired_jobs(first, f"r{n}")
        assert jobs == [f"r{n}@2026-01-01T0{h}:00:00Z" for h in (1, 2, 3)]
        assert first.schedules.get(T, f"r{n}").fired == 3


def test_a_crash_between_the_submit_and_fired_is_finished_by_the_retry(
    make_engine: EngineFactory, clock: FakeClock
) -> None:
    """In process: the Fired append fails once (a store that died mid-firing)."""
    crashed: list[bool] = []

    class DiesOnce:
        def __init__(self, store: object) -> None:
            self.store = store

        def append_schedule(self, schedule: object) -> None:
            if not crashed:
                crashed.append(True)
                raise ConnectionError("the reconciler died here")
            self.store.append_schedule(schedule)  # type: ignore[attr-defined]

        def __getattr__(self, name: str) -> object:
            return getattr(self.store, name)

    engine = make_engine()
    hourly(engine, "c")
    flaky = make_engine(wrap_store=DiesOnce)
    clock.set(datetime(2026, 1, 1, 1, 0, 1, tzinfo=UTC))
    with pytest.raises(ConnectionError):
        flaky.schedules.fire(T, "c")
    assert engine.job(T, "c@2026-01-01T01:00:00Z").status is JobStatus.QUEUED
    assert fired_jobs(engine, "c") == []
    assert flaky.schedules.fire(T, "c") == ["c@2026-01-01T01:00:00Z"]
    assert fired_jobs(engine, "c") == ["c@2026-01-01T01:00:00Z"]


def test_kill_9_during_a_schedule_firing_leaves_exactly_one_job_for_that_time(
    make_engine: EngineFactory, clock: FakeClock, store_url: str, tmp_path: Path
) -> None:
    engine = make_engine()
    hourly(engine, "k")
    moment = datetime(2026, 1, 1, 1, 0, 5, tzinfo=UTC)
    marker = tmp_path / "at-the-crash-point"
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tests.support.schedule_crash",
            store_url,
            moment.isoformat(),
            str(marker),
        ],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": f"{ROOT / 'src'}{os.pathsep}{ROOT}"},
    )
    try:
        deadline = time.monotonic() + 60
        while not marker.exists():
            assert process.poll() is None, "the reconciler ended before the crash point"
            assert time.monotonic() < deadline, "the reconciler never reached the crash point"
            time.sleep(0.05)
        process.send_signal(signal.SIGKILL)
        assert process.wait(30) == -signal.SIGKILL
    finally:
        if process.poll() is None:
            process.kill()
    job_id = "k@2026-01-01T01:00:00Z"
    assert engine.job(T, job_id).status is JobStatus.QUEUED  # submitted before it died
    assert fired_jobs(engine, "k") == []  # not recorded yet

    clock.set(moment)  # the restarted reconciler
    assert fire(engine, clock) == 1
    assert fired_jobs(engine, "k") == [job_id]
    assert isinstance(engine.store, EventSourcedJobStore)
    views = JobViews(engine.store)
    views.catch_up()
    assert [r.job_id for r in views.jobs(tenant_id=T)] == [job_id]  # one job for 01:00
    assert fire(engine, clock) == 0


# ---- DST -----------------------------------------------------------------------------------


def fire_times(engine: Engine, clock: FakeClock, name: str, firings: int) -> list[str]:
    """Each of the next ``firings`` firings, the clock set a few seconds past each: their
    times in UTC and on the schedule's clock."""
    for _ in range(firings):
        due = engine.schedules.get(T, name).next_fire_at
        assert due is not None
        clock.set(due + timedelta(seconds=5))
        assert fire(engine, clock) == 1
    zone = ZoneInfo(engine.schedules.get(T, name).timezone)
    history = engine.schedules.history(T, name)
    times = [e.data["fire_time"] for e in history if e.event_type == "Fired"]
    assert all(isinstance(t, datetime) for t in times)
    return [f"{t:%d %H:%M} UTC = {t.astimezone(zone):%H:%M %Z}" for t in times]  # type: ignore[str-format]


@pytest.mark.parametrize(
    ("start", "name", "cron", "expected"),
    [
        # 2026-03-29: 02:00 CET becomes 03:00 CEST. cronsim (Debian cron's rule) runs a job
        # of the skipped hour at once when the clocks resume: 02:30 fires at 03:00 CEST.
        pytest.param(
            datetime(2026, 3, 27, 12, tzinfo=UTC),
            "night",
            "30 2 * * *",
            [
                "28 01:30 UTC = 02:30 CET",
                "29 01:00 UTC = 03:00 CEST",
                "30 00:30 UTC = 02:30 CEST",
                "31 00:30 UTC = 02:30 CEST",
            ],
            id="spring-forward-fires-the-skipped-time-when-the-clocks-resume",
        ),
        # 2026-10-25: 03:00 CEST becomes 02:00 CET, so 02:30 happens twice; cronsim fires
        # it once, at its first occurrence (CEST).
        pytest.param(
            datetime(2026, 10, 23, 12, tzinfo=UTC),
            "night",
            "30 2 * * *",
            ["24 00:30 UTC = 02:30 CEST", "25 00:30 UTC = 02:30 CEST", "26 01:30 UTC = 02:30 CET"],
            id="fall-back-fires-the-repeated-time-once",
        ),
        # cronsim schedules expressions finer than an hour normally: 02:00 comes twice.
        pytest.param(
            datetime(2026, 10, 24, 23, 30, tzinfo=UTC),
            "hourly",
            "0 * * * *",
            [
                "25 00:00 UTC = 02:00 CEST",
                "25 01:00 UTC = 02:00 CET",
                "25 02:00 UTC = 03:00 CET",
                "25 03:00 UTC = 04:00 CET",
            ],
            id="an-hourly-schedule-fires-every-real-hour-across-fall-back",
        ),
    ],
)
def test_a_schedule_in_paris_across_a_clock_change(
    make_engine: EngineFactory,
    clock: FakeClock,
    start: datetime,
    name: str,
    cron: str,
    expected: list[str],
) -> None:
    engine = make_engine()
    clock.set(start)
    engine.schedules.create(T, name, cron=cron, timezone="Europe/Paris", workflow_type="agent3")
    assert fire_times(engine, clock, name, len(expected)) == expected


# ---- the command line ----------------------------------------------------------------------

REPORT = """
type: report
version: 1
start: work
steps:
  work: {kind: run_interaction_task, params: {task: report}, next: done}
  done: {kind: complete}
"""


def test_the_schedule_commands_create_list_pause_resume_trigger_and_delete(
    store_url: str, tmp_path: Path
) -> None:
    cli = make_cli(tmp_path, store_url, definitions={"report.yaml": REPORT})
    created = json.loads(
        cli.ok(
            "schedule",
            "create",
            "acme",
            "morning",
            "--cron",
            "0 7 * * *",
            "--timezone",
            "Europe/Paris",
            "--workflow",
            "report",
            "--input",
            '{"a": 1}',
            "--catch-up",
            "all",
            "--catch-up-max",
            "3",
            "--overlap",
            "buffer_one",
            "--json",
        )
    )
    assert (created["state"], created["catch_up_max"], created["overlap"]) == (
        "active",
        3,
        "buffer_one",
    )
    local = datetime.fromisoformat(created["next_fire_local"])
    assert local.hour == 7 and local == datetime.fromisoformat(created["next_fire_at"])

    for args, problem in [
        (("--cron", "0 7 * *"), "must have 5 fields"),
        (("--timezone", "Mars/Olympus"), "unknown time zone"),
        (("--workflow", "nope"), "unknown workflow"),
    ]:
        options = {"--cron": "0 7 * * *", "--timezone": "UTC", "--workflow": "report"}
        options[args[0]] = args[1]
        flat = [part for pair in options.items() for part in pair]
        result = cli("schedule", "create", "acme", "bad", *flat)
        assert result.returncode == 1 and problem in result.stderr, result.stderr
    assert (
        cli(
            "schedule",
            "create",
            "acme",
            "morning",
            "--cron",
            "0 7 * * *",
            "--timezone",
            "UTC",
            "--workflow",
            "report",
        ).returncode
        == 1
    )  # the name is taken

    [row] = json.loads(cli.ok("schedule", "list", "acme", "--json"))
    assert (row["name"], row["next_fire_at"]) == ("morning", created["next_fire_at"])
    table = cli.ok("schedule", "list", "acme")
    assert "Europe/Paris" in table and local.isoformat() in table
    assert f"{datetime.fromisoformat(created['next_fire_at']):%Y-%m-%d %H:%M:%S} UTC" in table

    fired = json.loads(cli.ok("schedule", "trigger", "acme", "morning", "--json"))
    assert fired["job_id"].startswith("morning@") and fired["job_id"].endswith("/manual")
    reconciled = json.loads(cli.ok("reconcile", "--once", "--json"))
    assert reconciled["fired"] == 0 and reconciled["handled"] >= 1  # ran the triggered job
    shown = json.loads(cli.ok("show", "acme", fired["job_id"], "--json"))
    assert shown["status"] == "completed" and shown["state"]["a"] == 1

    assert json.loads(cli.ok("schedule", "pause", "acme", "morning", "--json"))["state"] == "paused"
    assert cli("schedule", "pause", "acme", "morning").returncode == 1
    assert (
        json.loads(cli.ok("schedule", "resume", "acme", "morning", "--json"))["state"] == "active"
    )
    assert (
        json.loads(cli.ok("schedule", "delete", "acme", "morning", "--json"))["state"] == "deleted"
    )
    assert json.loads(cli.ok("schedule", "list", "acme", "--json")) == []
    history = json.loads(cli.ok("schedule", "history", "acme", "morning", "--json"))["events"]
    assert [e["event_type"] for e in history] == [
        "Created",
        "Fired",
        "Paused",
        "Resumed",
        "Deleted",
    ]
    assert history[1]["data"]["job_id"] == fired["job_id"]
    missing = cli("schedule", "trigger", "acme", "nosuch")
    assert missing.returncode == 1 and "no schedule 'nosuch'" in missing.stderr
