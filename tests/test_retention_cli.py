"""``jobledger archive``, ``restore`` and ``tombstones list`` run for real on both stores,
an erased job archived and restored in its redacted form; and the API's 410 Gone."""

from __future__ import annotations

import json
from pathlib import Path
from uuid import uuid4

import pytest

from jobledger.adapters.clock import FakeClock
from jobledger.api.auth import Role
from jobledger.audit.archive import DirectoryArchive
from jobledger.engine.engine import Engine
from tests.support.cli import Cli, make_cli
from tests.support.http import ApiServer, problem
from tests.support.retention import archiver, due_later, finished_jobs

PROFILE = """
type: profile
version: 1
personal_data: [customer.email]
start: greet
steps:
  greet: {kind: run_interaction_task, params: {task: greet}, next: done}
  done: {kind: complete}
"""
INPUT = json.dumps({"customer": {"email": "ada@example.com", "plan": "gold"}})


@pytest.fixture
def cli(tmp_path: Path, store_url: str) -> Cli:
    made = make_cli(tmp_path, store_url)
    (tmp_path / "definitions" / "profile.yaml").write_text(PROFILE)
    return made


def test_archive_an_erased_job_then_restore_it_redacted(cli: Cli, tmp_path: Path) -> None:
    cli.ok("submit", "acme", "anon", "profile", "--input", INPUT)
    assert cli.json("tick", "acme", "anon")["job"]["status"] == "completed"
    cli.ok("erase", "acme", "--job", "anon", "--reason", "asked", "--by", "dpo")
    cli.ok("submit", "acme", "later", "profile", "--input", INPUT)  # not finished
    archive = tmp_path / "archive"

    dry = cli.json("archive", "--older-than", "0", "--dry-run")
    assert dry["due"] == 1 and dry["sample"][0]["job"] == "anon"
    run = cli.json("archive", "--older-than", "0", "--to", str(archive))
    assert [t["job"] for t in run["archived"]] == ["anon"] and run["skipped"] == []
    (archived,) = list(archive.iterdir())
    assert b"ada@example.com" not in archived.read_bytes()  # sealed, and its key shredded

    gone = cli.fails(1, "show", "acme", "anon")
    assert gone.startswith("error: job 'anon' of tenant 'acme' was archived to dir:")
    assert [row["job_id"] for row in cli.json("list", "--tenant", "acme")] == ["later"]
    (tombstone,) = cli.json("tombstones", "list")
    assert tombstone["job"] == "anon" and tombstone["archive"] == f"dir:{archived}"
    assert "anon" in cli.ok("tombstones", "list")
    verified = cli.json("verify", "--all")
    assert verified["intact"] is True
    one = cli.json("verify", "acme", "anon")
    assert "archive verified" in one["job"]["archived"]

    moved = tmp_path / "moved.jsonl"  # the archive moved: --from says where it is now
    archived.rename(moved)
    assert "cannot read the archive" in cli.fails(1, "restore", "acme", "anon")
    restored = cli.json("restore", "acme", "anon", "--from", str(moved))
    assert restored["job"] == "anon"
    shown = cli.json("show", "acme", "anon")
    assert shown["status"] == "completed"
    assert shown["state"]["customer"] == {"email": "[erased]", "plan": "gold"}
    again = cli.fails(1, "erase", "acme", "--job", "anon", "--reason", "r", "--by", "dpo")
    assert "was already erased" in again  # its key stays shredded
    assert cli.json("tombstones", "list") == []
    assert cli.json("verify", "--all")["intact"] is True


def test_archive_and_restore_refuse_bad_input(cli: Cli, tmp_path: Path) -> None:
    cli.ok("submit", "acme", "j1", "profile", "--input", INPUT)
    usage = cli.fails(2, "archive", "--older-than", "0")
    assert "give exactly one of --to DIR and --to-topic TOPIC" in usage
    unset = cli.fails(1, "archive", "--to", str(tmp_path / "a"))
    assert "no retention is configured" in unset and "--older-than DAYS" in unset
    assert "not archived" in cli.fails(1, "restore", "acme", "j1")
    assert cli.fails(1, "restore", "acme", "nope") == "error: no job 'nope' for tenant 'acme'"
    assert not (tmp_path / "a").exists() or list((tmp_path / "a").iterdir()) == []


def test_the_api_answers_410_gone_with_the_tombstone(
    api: ApiServer, engine: Engine, clock: FakeClock, tmp_path: Path
) -> None:
    finished_jobs(engine, 1)
    engine.submit("acme", "kept", "agent3")  # not finished: stays listed
    archiver(engine).run(DirectoryArchive(tmp_path / "a"), due_later(engine, clock), clock.now())
    with api.as_role(Role.AUDITOR) as http:
        body = problem(http.get("/v1/jobs/acme/j0"), 410)
        missing = problem(http.get("/v1/jobs/acme/nope"), 404)
        listed = http.get("/v1/jobs/acme").json()["jobs"]
    assert body["error"] == "JobArchivedError" and "was archived to dir:" in body["detail"]
    assert body["tombstone"]["job"] == "j0" and body["tombstone"]["archive"].startswith("dir:")
    assert missing["error"] == "UnknownJobError"
    assert [row["job_id"] for row in listed] == ["kept"]


def test_archive_to_a_topic_from_the_command_line(
    tmp_path: Path, store_url: str, kafka_bootstrap: str
) -> None:
    cli = make_cli(tmp_path, store_url, settings=f'kafka_bootstrap_servers = "{kafka_bootstrap}"\n')
    (tmp_path / "definitions" / "profile.yaml").write_text(PROFILE)
    cli.ok("submit", "acme", "p1", "profile", "--input", INPUT)
    cli.json("tick", "acme", "p1")
    cli.ok("submit", "acme", "later", "profile", "--input", INPUT)
    topic = f"jobledger.archive.{uuid4().hex[:12]}"
    run = cli.json("archive", "--older-than", "0", "--tenant", "acme", "--to-topic", topic)
    (archived,) = run["archived"]
    assert archived["job"] == "p1" and archived["archive"].startswith(f"kafka:{topic}/")
    assert "archive verified" in cli.json("verify", "acme", "p1")["job"]["archived"]
    cli.ok("restore", "acme", "p1")
    assert cli.json("show", "acme", "p1")["status"] == "completed"
    assert cli.json("verify", "--all")["intact"] is True


def test_erasing_a_subject_reaches_its_archived_job(cli: Cli, tmp_path: Path) -> None:
    cli.ok("submit", "acme", "s1", "profile", "--input", INPUT, "--subject", "ada")
    cli.json("tick", "acme", "s1")
    cli.ok("submit", "acme", "later", "profile", "--input", INPUT)
    cli.json("archive", "--older-than", "0", "--to", str(tmp_path / "archive"))
    erased = cli.json("erase", "acme", "--subject", "ada", "--reason", "asked", "--by", "dpo")
    assert erased["erased"] == [] and len(erased["keys"]) == 1  # the key is destroyed
    cli.ok("restore", "acme", "s1")
    shown = cli.json("show", "acme", "s1")
    assert shown["state"]["customer"] == {"email": "[erased]", "plan": "gold"}
    assert cli.json("verify", "--all")["intact"] is True
