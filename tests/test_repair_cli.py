"""``jobledger retry | reset | fork`` on SQLite and PostgreSQL, with a signing runner's
config: each repair is recorded as one signed event, bad input exits 1 and writes
nothing, and ``verify`` with the keyring passes after every repair."""

from __future__ import annotations

import json
from pathlib import Path

from tests.support.cli import FAIL_VARIABLE, Cli
from tests.test_evidence_verifier import INDEPENDENT, VERIFIER, run
from tests.test_signed_events import NOTE, signing_cli

DRAFT, PUBLISH = "acme/n1:step:1", "acme/n1:step:2"


def status(cli: Cli, job: str) -> str:
    return str(json.loads(cli.ok("show", "acme", job, "--json"))["status"])


def tick_until(cli: Cli, job: str, wanted: str) -> None:
    for _ in range(10):
        if status(cli, job) == wanted:
            return
        cli.ok("tick", "acme", job)
    assert status(cli, job) == wanted


def test_the_cli_retries_resets_and_forks_a_job_and_every_chain_verifies(
    store_url: str, tmp_path: Path
) -> None:
    cli = signing_cli(tmp_path, store_url)
    (tmp_path / "definitions" / "note_v2.yaml").write_text(NOTE.replace("version: 1", "version: 2"))
    cli.ok("submit", "acme", "n1", "note", "--version", "1")
    cli.env[FAIL_VARIABLE] = "publish"
    tick_until(cli, "n1", "failed")
    del cli.env[FAIL_VARIABLE]

    retried = cli.json(
        "retry", "acme", "n1", "--by", "ops", "--reason", "fixed", "--to-version", "2"
    )
    assert retried["job"]["status"] == "queued"
    assert retried["replay_verdict"] == "1 recorded step(s) replay the same"
    tick_until(cli, "n1", "completed")
    assert cli.effects() == {DRAFT: 1, PUBLISH: 2}  # the failed step again, same key

    out = cli.ok("reset", "acme", "n1", "--step", "1", "--by", "ops", "--reason", "again")
    assert "reset to step 1 by ops: acme/n1 is now queued after step 1, on v2" in out
    tick_until(cli, "n1", "completed")
    assert cli.effects()[PUBLISH + "@e1"] == 1

    forked = cli.json(
        "fork", "acme", "n1", "--step", "1", "--new-job-id", "f1", "--by", "ops",
        "--reason", "variant", "--input-patch", '{"variant": 2}',
    )  # fmt: skip
    assert forked["job"]["job_id"] == "f1" and forked["job"]["state"]["variant"] == 2
    tick_until(cli, "f1", "completed")
    assert cli.effects()["acme/f1:step:2"] == 1 and cli.effects()[DRAFT] == 1
    history = cli.ok("history", "acme", "n1")
    assert "forked into job f1 after step 1: variant" in history
    assert "retried after its step failure on v2 -> queued: fixed" in history

    events_before = cli.ok("history", "acme", "n1", "--json")
    refused = cli.fails(1, "reset", "acme", "n1", "--step", "9", "--by", "o", "--reason", "r")
    assert "cannot be reset to step 9" in refused
    assert "only a failed job is retried" in cli.fails(
        1, "retry", "acme", "n1", "--by", "o", "--reason", "r"
    )
    assert "no job" in cli.fails(1, "retry", "acme", "nope", "--by", "o", "--reason", "r")
    assert cli.ok("history", "acme", "n1", "--json") == events_before

    report = cli.json("verify", "--all", "--keyring", "keys/keyring.json")
    assert report["intact"] is True, report

    # The export of the repaired jobs verifies standalone, by both verifiers.
    export = tmp_path / "export.jsonl"
    export.write_text(cli.ok("export", "--all"))
    keyring = str(tmp_path / "keys" / "keyring.json")
    ours = run(str(VERIFIER), str(export), "--keyring", keyring)
    assert ours.returncode == 0 and "NOT VERIFIED" not in ours.stdout, ours.stdout
    theirs = run(str(INDEPENDENT), str(export), "--keyring", keyring)
    assert theirs.returncode == 0, theirs.stdout
