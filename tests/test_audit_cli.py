"""The replay and audit commands, run for real as the ``jobledger`` console script:
replay, migrate, show --at-version/--at, verify, anchor, export, import (exit codes and
--json). Every option on SQLite, the commands once more on PostgreSQL; tampering by SQL
on SQLite here (tests/test_audit.py tampers with both stores through the engine API)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from jobledger.adapters.event_store import EventSourcedJobStore
from jobledger.adapters.store_url import parse_store_url
from jobledger.domain.identity import job_uuid
from tests.support.audit import RawEvents
from tests.support.cli import TICKET, Cli, make_cli
from tests.support.services import postgres_schema_url

# v2 renames the event the payment step waits for: a job waiting for it diverges there.
TICKET_V2 = TICKET.replace("version: 1", "version: 2").replace("invoice.paid", "invoice.settled")
# v3 only adds an approver at the review, which a job waiting for its payment has not
# reached: replay says it is safe to move.
TICKET_V3 = TICKET.replace("version: 1", "version: 3").replace("[lead]", "[lead, cfo]")


def with_versions(cli: Cli) -> Cli:
    (cli.tmp / "definitions" / "ticket.v2.yaml").write_text(TICKET_V2)
    (cli.tmp / "definitions" / "ticket.v3.yaml").write_text(TICKET_V3)
    (cli.tmp / "v1.yaml").write_text(TICKET)
    (cli.tmp / "v2.yaml").write_text(TICKET_V2)
    return cli


@pytest.fixture
def postgres_cli(tmp_path: Path) -> Iterator[Cli]:
    for url in postgres_schema_url():
        yield with_versions(make_cli(tmp_path, url))


@pytest.fixture
def sqlite_cli(tmp_path: Path) -> Cli:
    return with_versions(make_cli(tmp_path, f"sqlite:///{tmp_path}/jobs.db"))


def test_on_postgres_replay_migrate_verify_anchor_export_import(postgres_cli: Cli) -> None:
    """The commands on PostgreSQL (the flows below cover every option, on SQLite)."""
    cli = postgres_cli
    cli.ok("submit", "acme", "t1", "ticket", "--version", "1")
    cli.ok("tick", "acme", "t1")  # triage, then waits for invoice.paid
    diverging = cli("replay", "acme", "t1", "--definition", "v2.yaml", "--json")
    assert diverging.returncode == 1
    assert json.loads(diverging.stdout)["diverged_at_step"] == 2
    moved = cli.json("migrate", "acme", "t1", "--to-version", "3", "--by", "ops")
    assert moved["job"]["workflow_version"] == 3 and moved["replay"]["safe"] is True
    assert cli.json("verify", "--all")["intact"] is True
    assert cli.json("anchor", "--file", "anchors.jsonl")["jobs"] == 1
    export = cli("export", "--all")
    assert export.returncode == 0
    (cli.tmp / "export.jsonl").write_text(export.stdout)
    copy = f"sqlite:///{cli.tmp}/copy.db"
    assert cli.json("import", "export.jsonl", "--store", copy)["jobs"] == 1
    copied = cli.json("verify", "--all", "--anchors", "anchors.jsonl", "--store", copy)
    # Submitted, Claimed, two steps (the first carries its continuation claim), Migrated.
    assert copied["intact"] is True and copied["events"] == 5


def test_replay_migrate_show_at_verify_anchor_export_import(sqlite_cli: Cli) -> None:
    cli, tmp_path = sqlite_cli, sqlite_cli.tmp
    cli.ok("submit", "acme", "t1", "ticket", "--version", "1", "--input", '{"n": 1}')
    cli.ok("tick", "acme", "t1")  # triage, then waits for invoice.paid

    safe = cli.json("replay", "acme", "t1", "--definition", "v1.yaml")
    assert safe["safe"] is True and safe["verdict"] == "safe to migrate"
    assert [s["outcome"] for s in safe["steps"]] == ["same", "same"]
    assert "verdict: safe to migrate" in cli.ok("replay", "acme", "t1", "--definition", "v1.yaml")
    diverging = cli("replay", "acme", "t1", "--definition", "v2.yaml", "--json")
    assert diverging.returncode == 1
    report = json.loads(diverging.stdout)
    assert report["diverged_at_step"] == 2 and report["steps"][1]["outcome"] == "different wait"
    assert "error: acme/t1 diverges at step 2: recorded 'payment' (wait_event)" in (
        diverging.stderr
    )

    refused = cli.fails(1, "migrate", "acme", "t1", "--to-version", "2")
    assert "cannot move to v2: replay diverges at step 2" in refused
    cli.fails(2, "migrate", "acme", "t1", "--to-version", "2", "--force")  # who and why?
    moved = cli.json("migrate", "acme", "t1", "--to-version", "3", "--by", "ops")
    assert moved["job"]["workflow_version"] == 3 and moved["forced"] is False
    assert moved["replay"]["verdict"] == "safe to migrate"
    history = cli.json("history", "acme", "t1")
    assert history["chain"]["intact"] is True
    last = history["events"][-1]
    assert last["event_type"] == "Migrated" and last["by"] == "migrated_by ops"
    assert "v1 -> v3; replay: safe to migrate" in last["transition"]

    then = cli.json("show", "acme", "t1", "--at-version", "3")
    # Step 1 hands the job on under its claim in the same event (it was "queued" at v3,
    # with the continuation's Claimed at v4).
    assert (then["version"], then["status"], then["current_step"]) == (3, "running", 1)
    assert then["workflow_version"] == 1
    submitted_at = history["events"][0]["time"]
    at = cli.json("show", "acme", "t1", "--at", submitted_at)
    assert at["status"] == "queued" and at["version"] >= 1
    assert "as it was at version 3" in cli.ok("show", "acme", "t1", "--at-version", "3")
    assert "no v99" in cli.fails(1, "show", "acme", "t1", "--at-version", "99")
    assert "did not exist yet" in cli.fails(1, "show", "acme", "t1", "--at", "2000-01-01")

    waiting = cli.json("replay", "--all", "--status", "waiting_event", "--definition", "v1.yaml")
    assert [(j["job"], j["safe"]) for j in waiting["jobs"]] == [("t1", True)]

    assert "all intact" in cli.ok("verify", "acme", "t1")
    anchored = cli.json("anchor", "--file", "anchors.jsonl")
    assert anchored["jobs"] == 1 and anchored["line"] == 1
    assert cli.json("anchor", "--file", "anchors.jsonl")["line"] == 2
    assert "all intact" in cli.ok("verify")  # every job by default, as anchor does
    cli.fails(2, "verify", "acme")  # a tenant without a job is not a selection

    export = cli("export", "--all")
    assert export.returncode == 0 and "exported 1 job(s)" in export.stderr
    (tmp_path / "export.jsonl").write_text(export.stdout)
    manifest = json.loads(export.stdout.splitlines()[-1])
    assert manifest["record"] == "manifest" and manifest["jobs"] == 1
    copy = f"sqlite:///{tmp_path}/copy.db"
    imported = cli.json("import", "export.jsonl", "--store", copy)
    assert imported["jobs"] == 1 and imported["events"] == manifest["events"]
    assert "not empty" in cli.fails(1, "import", "export.jsonl", "--store", copy)
    # The copy holds the very heads that were anchored.
    copied = cli.json("verify", "--all", "--anchors", "anchors.jsonl", "--store", copy)
    assert copied["intact"] is True and copied["anchors"]["anchors"] == 2


def test_verify_and_import_catch_tampering(sqlite_cli: Cli, tmp_path: Path) -> None:
    cli = sqlite_cli
    for job in ("t1", "t2"):
        cli.ok("submit", "acme", job, "ticket")
        cli.ok("tick", "acme", job)
    cli.ok("anchor", "--file", "anchors.jsonl")
    export = cli("export", "acme", "t2")
    assert export.returncode == 0
    raw = RawEvents(f"sqlite:///{tmp_path}/jobs.db")
    # The last step (v4: the step before it carries its continuation claim; v5 before).
    raw.delete(job_uuid("acme", "t2"), 4, and_after=True)

    assert cli.json("verify", "--all")["intact"] is True  # consistent without anchors
    result = cli("verify", "--all", "--anchors", "anchors.jsonl", "--json")
    assert result.returncode == 1
    report = json.loads(result.stdout)
    [broken] = report["broken"]
    assert (broken["tenant"], broken["job"], broken["version"], broken["kind"]) == (
        "acme", "t2", 4, "truncated",
    )  # fmt: skip
    assert "error: 1 of 2 job(s) broken; first: acme/t2 at v4" in result.stderr

    raw.replace_in_state(job_uuid("acme", "t1"), 3, '"task":"triage"', '"task":"forged"')
    table = cli("verify", "acme", "t1")
    assert table.returncode == 1 and "Job.StepRecorded" in table.stdout and "edited" in table.stdout
    assert "acme/t1 at v3 (Job.StepRecorded)" in table.stderr
    assert "nothing anchored" in cli.fails(1, "anchor", "--file", "more.jsonl")
    assert cli("export", "--all").returncode == 1  # written, but a chain is broken

    lines = export.stdout.splitlines()
    lines[2] = lines[2].replace('"task":"triage"', '"task":"forged"')
    (tmp_path / "forged.jsonl").write_text("\n".join(lines) + "\n")
    copy = f"sqlite:///{tmp_path}/copy.db"
    message = cli.fails(1, "import", "forged.jsonl", "--store", copy)
    assert "v3: the chain hash does not match the event" in message
    assert "nothing written" in message
    assert cli.json("verify", "--all", "--store", copy)["jobs"] == 0


def test_verify_with_a_keyring_catches_a_tail_rehashed_without_the_key(
    sqlite_cli: Cli, tmp_path: Path
) -> None:
    cli = sqlite_cli
    cli.ok("keys", "generate", "k1", "--dir", "keys", "--not-before", "2020-01-01")
    cli.env["JOBLEDGER_SIGNING_KEYS"] = str(tmp_path / "keys" / "signing-keys.json")
    cli.ok("submit", "acme", "t1", "ticket")
    cli.ok("tick", "acme", "t1")
    keyring = "keys/keyring.json"
    signed = cli.json("verify", "--keyring", keyring)
    assert signed["intact"] is True and signed["signatures"]["checked"] is True
    assert "signatures not checked (no keyring)" in cli.ok("verify")
    assert f"signatures checked against {keyring}: all intact" in cli.ok(
        "verify", "--keyring", keyring
    )

    # Someone with the database but without the key rewrites the tail and re-hashes it.
    store = EventSourcedJobStore(parse_store_url(f"sqlite:///{tmp_path}/jobs.db"), mode="read")
    uuid = job_uuid("acme", "t1")
    events = store.events(uuid)
    store.close()
    RawEvents(f"sqlite:///{tmp_path}/jobs.db").rehash_tail(events, 2, lambda e, f: None)
    assert cli.json("verify")["intact"] is True  # the chain alone holds
    failed = cli("verify", "--keyring", keyring, "--json")
    assert failed.returncode == 1
    (broken,) = json.loads(failed.stdout)["broken"]
    assert (broken["version"], broken["kind"]) == (3, "unsigned")
    # Accepting unsigned events from before a moment lets the rewrite through: the option
    # is for stores that predate signing, and says so by its moment.
    later = cli.json("verify", "--keyring", keyring, "--unsigned-before", "2100-01-01T00:00:00Z")
    assert later["intact"] is True and later["signatures"]["unsigned_before"].startswith("2100")
    assert "no zone" in cli.fails(
        2, "verify", "--keyring", keyring, "--unsigned-before", "2026-01-01"
    )
    assert "needs a keyring" in cli.fails(2, "verify", "--unsigned-before", "2026-01-01T00:00Z")
