"""``jobledger erase TENANT (--subject S | --job J)`` and ``submit --subject``, run for
real as subprocesses on both stores."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.support.cli import Cli, make_cli

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


def test_erase_by_job_and_by_subject(cli: Cli) -> None:
    cli.ok("submit", "acme", "anon", "profile", "--input", INPUT)
    for job in ("s1", "s2"):
        cli.ok("submit", "acme", job, "profile", "--input", INPUT, "--subject", "ada")

    erased = cli.json("erase", "acme", "--job", "anon", "--reason", "asked", "--by", "dpo")
    assert erased["tenant"] == "acme" and len(erased["keys"]) == 1
    assert (erased["erased"], erased["already_erased"]) == (["anon"], [])
    anon = cli.json("show", "acme", "anon")
    assert anon["state"]["customer"] == {"email": "[erased]", "plan": "gold"}
    assert cli.json("show", "acme", "s1")["state"]["customer"]["email"] == "ada@example.com"
    last = cli.json("history", "acme", "anon")["events"][-1]
    assert last["event_type"] == "Erased" and last["data"]["erased_by"] == "dpo"

    again = cli.fails(1, "erase", "acme", "--job", "anon", "--reason", "r", "--by", "dpo")
    assert again.startswith("error: job 'anon' of tenant 'acme' was already erased at ")
    shared = cli.fails(1, "erase", "acme", "--job", "s1", "--reason", "r", "--by", "dpo")
    assert "sealed with its data subject's key" in shared and "erase the data subject" in shared
    assert "ada" not in shared
    missing = cli.fails(1, "erase", "acme", "--job", "nope", "--reason", "r", "--by", "dpo")
    assert missing == "error: no job 'nope' for tenant 'acme'"

    out = cli.ok("erase", "acme", "--subject", "ada", "--reason", "asked", "--by", "dpo")
    assert "erased: 2 job(s) of tenant acme, 1 key(s) destroyed at" in out
    assert "s1: Erased recorded" in out and "s2: Erased recorded" in out
    assert cli.json("show", "acme", "s2")["state"]["customer"]["email"] == "[erased]"
    assert cli.json("verify", "--all")["intact"] is True


def test_erase_takes_exactly_one_of_subject_and_job(cli: Cli) -> None:
    cli.ok("submit", "acme", "anon", "profile", "--input", INPUT)
    neither = cli.fails(2, "erase", "acme", "--reason", "r", "--by", "dpo")
    assert "give exactly one of --subject S and --job J" in neither
    both = cli.fails(
        2, "erase", "acme", "--subject", "ada", "--job", "anon", "--reason", "r", "--by", "dpo"
    )
    assert "give exactly one of --subject S and --job J" in both
    assert cli.json("show", "acme", "anon")["state"]["customer"]["email"] == "ada@example.com"
    assert "[erased]" not in cli.ok("history", "acme", "anon")
