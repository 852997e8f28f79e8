"""``jobledger bulk`` and ``jobledger batches``, run for real."""

from __future__ import annotations

import json
from pathlib import Path

from tests.support.cli import FAIL_VARIABLE, Cli, make_cli

T = "acme"


def waiting(cli: Cli, *jobs: str) -> None:
    for job in jobs:
        cli.ok("submit", T, job, "ticket")
        cli.ok("tick", T, job)  # triage, then the wait for invoice.paid


def test_bulk_cancel_dry_run_refusal_run_and_the_batch_listed(tmp_path: Path) -> None:
    cli = make_cli(tmp_path, f"sqlite:///{tmp_path}/jobs.db")
    waiting(cli, "a", "b", "c")

    refused = cli.fails(1, "bulk", "cancel", T, "--by", "ops", "--reason", "x")
    assert "matches every job of the tenant" in refused
    bad = cli.fails(2, "bulk", "cancel", T, "--status", "nope", "--by", "ops", "--reason", "x")
    assert "unknown status nope" in bad

    preview = cli.json(
        "bulk",
        "cancel",
        T,
        "--status",
        "waiting_event",
        "--dry-run",
        "--by",
        "ops",
        "--reason",
        "x",
    )
    assert preview["count"] == 3 and {s["status"] for s in preview["sample"]} == {"waiting_event"}
    assert cli.json("batches", "list", T) == []  # the dry run wrote nothing

    done = cli.json(
        "bulk", "cancel", T, "--workflow", "ticket", "--by", "ops", "--reason", "campaign off"
    )
    assert (done["total"], done["applied"], done["finished"]) == (3, 3, True)
    assert json.loads(cli.ok("show", T, "b", "--json"))["status"] == "cancelled"

    [row] = cli.json("batches", "list", T)
    assert (row["batch_id"], row["action"], row["applied"]) == (done["batch_id"], "cancel", 3)
    shown = cli.json("batches", "show", T, done["batch_id"])
    assert sorted(o["job_id"] for o in shown["outcomes"]) == ["a", "b", "c"]
    table = cli.ok("batches", "show", T, done["batch_id"])
    assert "3 applied, 0 skipped, 0 failed" in table
    assert cli.json("batches", "resume", T, done["batch_id"])["finished"] is True
    assert "no batch 'nope'" in cli.fails(1, "batches", "show", T, "nope")


def test_bulk_signal_resumes_the_waiting_jobs(tmp_path: Path) -> None:
    cli = make_cli(tmp_path, f"sqlite:///{tmp_path}/jobs.db")
    waiting(cli, "a", "b")
    out = cli.ok(
        "bulk",
        "signal",
        T,
        "invoice.paid",
        "--status",
        "waiting_event",
        "--by",
        "ops",
        "--reason",
        "paid by wire",
    )
    assert "2 applied" in out
    for job in ("a", "b"):
        assert json.loads(cli.ok("show", T, job, "--json"))["status"] == "queued"


def test_bulk_raise_budget_and_migrate_check_their_parameters(tmp_path: Path) -> None:
    cli = make_cli(tmp_path, f"sqlite:///{tmp_path}/jobs.db")
    waiting(cli, "a")
    query = ("--status", "waiting_event", "--by", "ops", "--reason", "r")
    refused = cli.fails(1, "bulk", "raise-budget", T, *query)
    assert "needs max_steps, max_cost_usd or deadline_at" in refused
    raised = cli.json("bulk", "raise-budget", T, "--max-steps", "40", "--max-cost", "9.5", *query)
    assert (raised["action"], raised["params"]) == (
        "raise-budget",
        {"max_steps": 40, "max_cost_usd": "9.5"},
    )
    assert raised["applied"] == 1
    moved = cli.json("bulk", "migrate", T, "--to-version", "1", "--dry-run", *query)
    assert (moved["dry_run"], moved["count"]) == (True, 1)
    assert cli.json("batches", "list", T)[0]["action"] == "raise-budget"


def test_bulk_retry_reopens_the_failed_jobs_and_bulk_reset_skips_a_step_out_of_range(
    tmp_path: Path,
) -> None:
    cli = make_cli(tmp_path, f"sqlite:///{tmp_path}/jobs.db")
    cli.env[FAIL_VARIABLE] = "triage"
    for job in ("a", "b"):
        cli.ok("submit", T, job, "ticket")
        cli.ok("tick", T, job)
        assert status(cli, job) == "failed"
    del cli.env[FAIL_VARIABLE]
    waiting(cli, "c")
    query = ("--workflow", "ticket", "--by", "ops", "--reason", "fixed")

    preview = cli.json("bulk", "retry", T, "--status", "failed", "--dry-run", *query)
    assert (preview["action"], preview["count"]) == ("retry", 2)
    assert "--step" in cli.fails(2, "bulk", "reset", T, *query)
    retried = cli.json("bulk", "retry", T, *query)
    assert (retried["applied"], retried["skipped"], retried["total"]) == (2, 1, 3)
    [skipped] = [o for o in retried["outcomes"] if o["outcome"] == "skipped"]
    assert skipped["job_id"] == "c" and "only a failed job is retried" in skipped["detail"]
    for job in ("a", "b"):
        cli.ok("tick", T, job)  # triage again, under the same key, then the wait
        assert status(cli, job) == "waiting_event"
    assert cli.effects()[f"{T}/a:step:1"] == 2

    out = cli.ok("bulk", "reset", T, "--step", "9", *query)
    assert "0 applied, 3 skipped, 0 failed" in out
    reset = cli.json("bulk", "reset", T, "--step", "0", *query)
    assert (reset["applied"], reset["params"]) == (3, {"step": 0, "to_version": None})
    assert [b["action"] for b in cli.json("batches", "list", T)][:2] == ["reset", "reset"]


def status(cli: Cli, job: str) -> str:
    return str(json.loads(cli.ok("show", T, job, "--json"))["status"])
