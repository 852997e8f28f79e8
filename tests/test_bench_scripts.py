"""The benchmark scripts still run and report every figure (a smoke test, never a timed one:
no assertion here is about speed)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCENARIO_FIGURES = (
    "steps_per_second",
    "ratio",
    "commits_per_step",
    "rows_per_step",
    "p50_step_ms",
    "p99_step_ms",
    "cpu_us_per_step",
)


def run_script(name: str, tmp_path: Path, *extra: str, timeout: float = 120) -> dict[str, Any]:
    command = [sys.executable, str(ROOT / "scripts" / name)]
    command += ["--quick", "--json", "--store", "sqlite", "--dir", str(tmp_path), *extra]
    paths = [str(ROOT / "src"), str(ROOT), os.environ.get("PYTHONPATH", "")]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in paths if p)}
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=timeout)
    assert done.returncode == 0, done.stderr
    report: dict[str, Any] = json.loads(done.stdout)
    return report


def test_bench_steps_quick_reports_every_figure(tmp_path: Path) -> None:
    report = run_script("bench_steps.py", tmp_path)
    assert report["many_jobs_mode"] == "run_until_idle, group commit" and report["quick"] is True
    [sqlite] = report["results"]
    assert sqlite["store"] == "sqlite"
    assert sqlite["raw"]["commits_per_second"] > 0
    scenarios = sqlite["scenarios"]
    assert [(s["name"], s["concurrency"]) for s in scenarios] == [
        ("sequential", 1),
        ("many", 1),
        ("many", 4),
        ("many", 16),
        ("many", 64),
    ]
    for scenario in scenarios:
        assert scenario["incomplete_jobs"] == 0
        for figure in SCENARIO_FIGURES:
            assert scenario[figure] > 0, (scenario["name"], scenario["concurrency"], figure)
        # Counted, not estimated: every step is at least its own record row, and a job
        # alone its own commit (K jobs at once share commits: issue 11's group commit).
        assert scenario["rows_per_step"] >= 1
        if scenario["concurrency"] == 1:
            assert scenario["commits_per_step"] >= 1
        assert scenario["p99_step_ms"] >= scenario["p50_step_ms"]


def test_bench_steps_processes_runs_one_backlog_by_one_and_by_two_processes(
    tmp_path: Path,
) -> None:
    report = run_script("bench_steps.py", tmp_path, "--processes", "1,2", "--processes-only")
    assert report["results"] == []
    [sqlite] = report["processes"]
    assert sqlite["store"] == "sqlite" and sqlite["raw"]["commits_per_second"] > 0
    assert [run["processes"] for run in sqlite["runs"]] == [1, 2]
    for run in sqlite["runs"]:
        assert run["steps"] > 0 and run["steps_per_second"] > 0
        assert run["cpu_busy"] is None or 0 <= run["cpu_busy"] <= 1
        assert run["ratio"] == run["steps_per_second"] / sqlite["raw"]["commits_per_second"]
    one, two = (run["steps_per_second"] for run in sqlite["runs"])
    assert sqlite["two_vs_one"] == two / one and sqlite["target"] == 1.7


def test_bench_steps_sign_runs_each_scenario_signed_beside_unsigned(tmp_path: Path) -> None:
    report = run_script("bench_steps.py", tmp_path, "--sign", "--concurrency", "1,16")
    [sqlite] = report["results"]
    assert report["signed"] is True
    unsigned, signed = sqlite["scenarios"], sqlite["signed"]
    assert [(s["name"], s["concurrency"]) for s in signed] == [
        (s["name"], s["concurrency"]) for s in unsigned
    ]
    for plain, scenario in zip(unsigned, signed, strict=True):
        assert scenario["signed"] is True and scenario["incomplete_jobs"] == 0
        # Counted in the rows written: every event of the signed engine carries a
        # signature, none of the other's.
        assert scenario["signed_rows"] == scenario["rows"] > 0
        assert plain["signed_rows"] == 0 and plain["signed_vs_unsigned"] is None
        ratio = scenario["steps_per_second"] / plain["steps_per_second"]
        assert scenario["signed_vs_unsigned"] == ratio


def test_bench_steps_metrics_runs_each_scenario_with_metrics_beside_without(
    tmp_path: Path,
) -> None:
    report = run_script("bench_steps.py", tmp_path, "--metrics", "--concurrency", "1,16")
    [sqlite] = report["results"]
    assert report["metrics"] is True
    plain, metered = sqlite["scenarios"], sqlite["metrics"]
    assert [(s["name"], s["concurrency"]) for s in metered] == [
        (s["name"], s["concurrency"]) for s in plain
    ]
    for off, on in zip(plain, metered, strict=True):
        assert on["metrics"] is True and on["incomplete_jobs"] == 0 and off["metrics"] is False
        assert on["metrics_vs_off"] == on["steps_per_second"] / off["steps_per_second"]
        assert off["metrics_vs_off"] is None


def test_bench_steps_code_runs_each_mission_as_code_and_as_a_definition(tmp_path: Path) -> None:
    report = run_script("bench_steps.py", tmp_path, "--code", "--concurrency", "1")
    [sqlite] = report["results"]
    assert report["code"] is True
    raw = sqlite["raw"]["commits_per_second"]
    assert [(c["noop_steps"], c["concurrency"]) for c in sqlite["code"]] == [
        (10, 1),
        (10, 16),
        (100, 1),
        (100, 16),
    ]
    for pair in sqlite["code"]:
        code, declared = pair["code"], pair["declarative"]
        assert (code["written"], declared["written"]) == ("code", "declarative")
        assert pair["target"] == 0.9
        assert pair["code_vs_declarative"] == pytest.approx(
            code["steps_per_second"] / declared["steps_per_second"], rel=1e-3
        )
        for side in (code, declared):
            # Both missions record their no-op steps and the completion, every job.
            assert side["incomplete_jobs"] == 0 and side["steps_per_job"] == pair["noop_steps"] + 1
            assert side["steps"] == side["jobs"] * side["steps_per_job"]
            assert side["ratio"] == pytest.approx(side["steps_per_second"] / raw, rel=1e-3)
        # The hot path: a body kept between its steps reads the store once a job (its
        # first, cold, replay), never once a step.
        assert code["reads_per_step"] <= 1 / pair["noop_steps"] + 1e-9
    replay = sqlite["replay"]
    assert replay["steps"] == 200  # --quick
    assert replay["events"] > replay["steps"] and replay["replay_ms"] > 0
    # The figures are rounded for printing: the multiple is checked to the rounding.
    assert replay["replay_vs_step"] == pytest.approx(
        replay["replay_ms"] / replay["step_ms"], rel=1e-2
    )
    assert all(s.get("written") is None for s in sqlite["scenarios"])


def test_bench_steps_tracing_runs_each_scenario_traced_beside_untraced(tmp_path: Path) -> None:
    report = run_script("bench_steps.py", tmp_path, "--tracing", "--concurrency", "1,16")
    [sqlite] = report["results"]
    assert report["traced"] is True and sqlite["signed"] == []
    untraced, traced = sqlite["scenarios"], sqlite["traced"]
    assert [(s["name"], s["concurrency"]) for s in traced] == [
        (s["name"], s["concurrency"]) for s in untraced
    ]
    for plain, scenario in zip(untraced, traced, strict=True):
        assert scenario["traced"] is True and scenario["incomplete_jobs"] == 0
        assert plain["traced"] is False and plain["traced_vs_untraced"] is None
        ratio = scenario["steps_per_second"] / plain["steps_per_second"]
        assert scenario["traced_vs_untraced"] == ratio


def test_bench_resume_quick_reports_every_figure(tmp_path: Path) -> None:
    report = run_script("bench_resume.py", tmp_path)
    [sqlite] = report["results"]
    assert [k["kind"] for k in sqlite["kinds"]] == ["token", "signal"]
    for kind in sqlite["kinds"]:
        assert kind["incomplete_jobs"] == 0 and kind["samples"] == 20
        assert 0 < kind["p50_ms"] <= kind["p99_ms"] <= kind["max_ms"]
        # Counted: the resume (with its key and the woken tick's claim), then the step.
        assert kind["commits_per_resume"] == 2 and kind["rows_per_resume"] == 3
        # No history is read: the resume takes the job its wait's tick handed back, the tick
        # the job the resume handed back, and each finds nothing newer in the store.
        assert kind["reads_per_resume"] == 0 and kind["empty_reads_per_resume"] == 2
        assert kind["cpu_us_per_resume"] > 0
    # LangGraph beside it, on the same kind of store, or why not (the bench extra).
    if sqlite["langgraph"] is None:
        assert "pip install -e '.[bench]'" in sqlite["langgraph_missing"]
    else:
        assert sqlite["langgraph"]["samples"] == 20 and sqlite["langgraph"]["p50_ms"] > 0


def test_bench_http_quick_reports_every_figure(tmp_path: Path) -> None:
    report = run_script("bench_http.py", tmp_path)
    [sqlite] = report["results"]
    assert report["quick"] is True and sqlite["store"] == "sqlite"
    scenarios = sqlite["scenarios"]
    assert [(s["op"], s["clients"]) for s in scenarios] == [
        ("submit", 1),
        ("signal", 1),
        ("submit", 4),
        ("signal", 4),
    ]
    for scenario in scenarios:
        assert scenario["http_to_engine"] > 0
        for way in ("engine", "http"):
            figures = scenario[way]
            assert figures["requests"] == 40 and figures["failed"] == 0, (scenario, way)
            assert 0 < figures["p50_ms"] <= figures["p99_ms"]
            assert figures["requests_per_second"] > 0
    sse = sqlite["sse"]
    assert sse["events"] == 10 and 0 <= sse["p50_ms"] <= sse["p99_ms"] <= sse["max_ms"]


def test_bench_steps_metrics_and_tracing_together_trace_the_engine_that_keeps_metrics(
    tmp_path: Path,
) -> None:
    """Issue 14's budget is for both on at once: the traced runs keep metrics too, and
    their ratio is over the plain engine's steps/s, pooled over the rounds run."""
    report = run_script(
        "bench_steps.py", tmp_path, "--metrics", "--tracing", "--concurrency", "4", "--rounds", "2"
    )
    [sqlite] = report["results"]
    plain, both = sqlite["scenarios"], sqlite["traced"]
    assert len(both) == len(plain) == 2
    for off, on in zip(plain, both, strict=True):
        assert on["metrics"] is True and on["traced"] is True and on["incomplete_jobs"] == 0
        assert off["rounds"] == on["rounds"] == 2 and len(on["round_ratios"]) == 2
        assert off["jobs"] == 2 * off["concurrency"]  # each round's jobs, pooled
        assert on["steps"] == off["steps"] == off["jobs"] * off["steps_per_job"]
        assert on["traced_vs_untraced"] == on["steps_per_second"] / off["steps_per_second"]
        assert on["traced_cpu_vs_untraced"] == on["cpu_us_per_step"] / off["cpu_us_per_step"]
        assert off["traced_cpu_vs_untraced"] is None


def test_bench_fairness_quick_reports_every_figure(tmp_path: Path) -> None:
    report = run_script("bench_fairness.py", tmp_path)
    [sqlite] = report["results"]
    windowed, ungated = sqlite["fairness"]
    assert (windowed["window"], ungated["window"]) == (16, 0)
    for run in (windowed, ungated):
        assert run["submitted_per_second"] > 0 and run["jobs_per_second"] > 0
        assert len(run["small_first_step_ms"]) == 3
    # The order, not the speed: the window, and without it the local queue's turns, both
    # start the small tenant's jobs ahead of most of the backlog.
    for run in (windowed, ungated):
        assert max(run["big_started_before_small"]) < run["backlog"] // 4
    for run in sqlite["one_tenant"]:
        assert run["p99_submit_to_completed_ms"] >= run["p50_submit_to_completed_ms"] > 0


def test_bench_instructions_counts_a_positive_cost_per_step() -> None:
    """Under callgrind (valgrind, installed by .ci/run): two short runs of one job."""
    command = [sys.executable, str(ROOT / "scripts" / "bench_instructions.py")]
    command += ["--steps", "20", "--scenario", "one", "--json"]
    paths = [str(ROOT / "src"), str(ROOT), os.environ.get("PYTHONPATH", "")]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in paths if p)}
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    # A no-op step is hundreds of thousands of instructions at least: a positive count of
    # that order shows the two runs differed by their steps, not by noise.
    assert report["one"] > 100_000


def test_bench_retention_quick_reports_every_figure(tmp_path: Path) -> None:
    report = run_script("bench_retention.py", tmp_path)
    figures = report["sqlite"]
    assert report["quick"] is True and figures["jobs"] == 20 and figures["skipped"] == 0
    assert figures["events"] == 120 and figures["archive_bytes"] > 0
    for name in ("archive_jobs_per_second", "restore_jobs_per_second"):
        assert figures[name] > 0


def test_bench_subscriptions_quick_turns_messages_into_jobs_with_one_and_two_processes(
    tmp_path: Path, kafka_bootstrap: str
) -> None:
    """Real ``jobledger worker --processes N`` on the test broker: every message of the
    12-partition topic made a job that completed, the group's partitions split between
    the processes, each figure a ratio to the raw commits of the same run."""
    report = run_script(
        "bench_subscriptions.py", tmp_path, "--bootstrap", kafka_bootstrap, timeout=300
    )
    assert report["quick"] is True and report["skipped"] == {}
    [sqlite] = report["results"]
    assert sqlite["store"] == "sqlite" and sqlite["partitions"] == 12
    raw = sqlite["raw"]["commits_per_second"]
    assert raw > 0
    one, two = sqlite["runs"]
    assert (one["processes"], two["processes"]) == (1, 2)
    # Every partition is read, by one process or shared by both.
    assert one["partitions_per_process"] == [12] and two["partitions_per_process"] == [6, 6]
    for run in (one, two):
        assert run["messages"] == 60 and run["latency_messages"] == 10
        assert run["incomplete_jobs"] == 0
        assert run["messages_per_second"] == pytest.approx(run["messages"] / run["seconds"])
        assert run["ratio"] == run["messages_per_second"] / raw
        # A job's first step comes after its message was sent.
        assert 0 < run["p50_ms"] <= run["p99_ms"] <= run["max_ms"]
        assert 0 < run["burst_p50_ms"] <= run["burst_p99_ms"]
        assert run["cpu_busy"] is None or 0 <= run["cpu_busy"] <= 1
    assert sqlite["two_vs_one"] == two["messages_per_second"] / one["messages_per_second"]
    assert sqlite["target"] == 1.7
