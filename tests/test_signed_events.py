"""Signed events end to end, on SQLite and PostgreSQL: a runner configured with signing
keys signs every event it writes, ``jobledger verify`` checks them against the keyring
(given, or configured), and a row re-signed by a key the keyring does not hold fails; a
rotation signs each event by the key of its time, and a retired key cannot sign later."""

from __future__ import annotations

import json
import signal
import subprocess
import time
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from jobledger.adapters.clock import FakeClock
from jobledger.adapters.signing import Ed25519Signer, Keyring, SigningKey, Window, b64url, message
from jobledger.audit import tamper
from jobledger.domain.identity import job_uuid
from tests.support.audit import RawEvents
from tests.support.cli import JOBLEDGER, Cli, make_cli
from tests.support.engines import EngineFactory, store_of
from tests.support.workflows import tasks_definition

NOTE = tasks_definition("note", "draft", "publish")


def signing_cli(tmp_path: Path, store_url: str) -> Cli:
    """The CLI project of tests.support.cli, with a key made by ``keys generate`` and the
    ``[signing]`` table naming its files."""
    cli = make_cli(tmp_path, store_url)
    (tmp_path / "definitions" / "note.yaml").write_text(NOTE)
    cli.ok("keys", "generate", "w1", "--dir", "keys", "--not-before", "2020-01-01")
    assert cli.config is not None
    with cli.config.open("a") as config:
        config.write('[signing]\nkeys = "keys/signing-keys.json"\nkeyring = "keys/keyring.json"\n')
    return cli


def run_until_completed(cli: Cli, tenant: str, job: str) -> None:
    """``jobledger run`` (a real runner process) until the job completes, then SIGTERM."""
    assert cli.config is not None
    runner = subprocess.Popen(
        [str(JOBLEDGER), "run", "--workers", "1", "--config", str(cli.config)],
        env=cli.env,
        cwd=cli.tmp,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 60
        while json.loads(cli.ok("show", tenant, job, "--json"))["status"] != "completed":
            assert runner.poll() is None, runner.stderr.read() if runner.stderr else ""
            assert time.monotonic() < deadline, "the runner did not complete the job"
            time.sleep(0.2)
    finally:
        runner.send_signal(signal.SIGTERM)
        runner.wait(timeout=30)


def stored(store_url: str, tenant: str, job: str) -> list[dict[str, Any]]:
    return [json.loads(row.state) for row in RawEvents(store_url).rows(job_uuid(tenant, job))]


def test_a_runner_signs_every_event_and_verify_checks_them(store_url: str, tmp_path: Path) -> None:
    cli = signing_cli(tmp_path, store_url)
    cli.ok("submit", "acme", "n1", "note")
    run_until_completed(cli, "acme", "n1")
    rows = stored(store_url, "acme", "n1")
    assert len(rows) >= 4  # submitted, claimed, two steps
    assert {row["signer"] for row in rows} == {"w1"}
    assert all(row["signature"] for row in rows)

    report = cli.json("verify", "--all", "--keyring", "keys/keyring.json")
    assert report["intact"] is True, report
    assert cli.json("verify", "--all")["intact"] is True  # the configured keyring

    # Someone with write access to the store but not the key re-signs an event with a
    # key of their own: it is not in the keyring, and verify names it.
    rogue = Ed25519PrivateKey.generate()
    raw = RawEvents(store_url)
    uuid = job_uuid("acme", "n1")
    victim = raw.rows(uuid)[1]
    row = json.loads(victim.state)
    forged = b64url(rogue.sign(message("rogue", row["chain_hash"])))
    state = victim.state.replace(row["signature"].encode(), forged.encode())
    state = state.replace(b'"signer":"w1"', b'"signer":"rogue"')
    raw.set_state(uuid, 2, victim.topic, state)
    broken = cli("verify", "--all", "--keyring", "keys/keyring.json", "--json")
    assert broken.returncode == 1, broken.stderr
    [failure] = json.loads(broken.stdout)["broken"]
    assert failure["version"] == 2
    assert "not in the keyring" in failure["reason"]

    # The same forgery under the writer's own key id: the signature does not match.
    raw.set_state(uuid, 2, victim.topic, state.replace(b'"signer":"rogue"', b'"signer":"w1"'))
    again = cli("verify", "--all", "--json")  # the configured keyring
    assert again.returncode == 1, again.stderr
    [failure] = json.loads(again.stdout)["broken"]
    assert failure["version"] == 2 and "bad signature by key 'w1'" in failure["reason"]


def test_a_rotation_signs_each_event_by_the_key_of_its_time(
    make_engine: EngineFactory, clock: FakeClock, store_url: str
) -> None:
    switch = clock.now() + timedelta(days=1)
    old = SigningKey("old", Ed25519PrivateKey.generate(), Window(clock.now(), switch))
    new = SigningKey("new", Ed25519PrivateKey.generate(), Window(switch))
    engine = make_engine(signer=Ed25519Signer([old, new]))
    engine.submit("acme", "r1", "timer")
    engine.run_until_idle(wait_for_timers=True)  # a step, three days' wait, a step
    uuid = job_uuid("acme", "r1")
    rows = stored(store_url, "acme", "r1")
    when = [datetime.fromisoformat(row["event"]["fields"]["timestamp"]) for row in rows]
    signers = [(row["signer"], at >= switch) for row, at in zip(rows, when, strict=True)]
    assert ("old", False) in signers and ("new", True) in signers
    assert all((signer == "new") == after for signer, after in signers)
    signatures = tamper.Signatures(Keyring(Ed25519Signer([old, new]).public_keys()))
    assert tamper.verify_one(store_of(engine), uuid, signatures=signatures).intact

    # The old key, leaked after its retirement, signs an event dated after the switch:
    # the signature is genuine, but the key was not valid then.
    raw = RawEvents(store_url)
    last = raw.rows(uuid)[-1]
    row = json.loads(last.state)
    forged = b64url(old.private_key.sign(message("old", row["chain_hash"])))
    state = last.state.replace(row["signature"].encode(), forged.encode())
    raw.set_state(
        uuid, last.version, last.topic, state.replace(b'"signer":"new"', b'"signer":"old"')
    )
    broken = tamper.verify_one(store_of(engine), uuid, signatures=signatures).jobs[0].broken
    assert broken is not None and broken.version == last.version
    assert "signed by key 'old', which was not valid at" in broken.reason
