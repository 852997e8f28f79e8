"""Erasure reaches everywhere issue 16 promises, shown end to end on SQLite and PostgreSQL:
the events topic on the real broker (sealed values only; the Erased event published; once
the key is gone nothing on the topic opens), the CLI (show, history, verify, export and
both standalone verifiers, replay, import into a fresh store) and signed events (erase
leaves every signature valid and rewrites no stored event)."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any, Final

import pytest

from jobledger.adapters.event_store import EventSourcedJobStore
from jobledger.adapters.kafka.publisher import KafkaEventPublisher
from jobledger.api.approvals import approval
from jobledger.domain import chain, event_decoding, transition
from jobledger.domain.erasure import ERASED, unreadable_fields
from jobledger.domain.identity import job_uuid
from jobledger.domain.job import Job
from jobledger.domain.views import JobView
from jobledger.orchestration.ports import FieldSealer
from jobledger.projections.outbox import Outbox, decode_event
from jobledger.workflows import DefinitionRegistry
from jobledger.workflows.loader import parse_definition
from tests.support import ROOT, pythonpath
from tests.support.cli import Cli, make_cli
from tests.support.engines import EngineFactory
from tests.support.erasure import (
    ADA,
    CONFIRMED_EMAIL,
    GRACE,
    ONBOARDING,
    PLAINTEXT,
    Greeter,
    confirmation,
    run_onboarding,
)
from tests.support.kafka_broker import KafkaTopics, headers, read_topic

TENANT: Final = "acme"
SEALED: Final = b'"$sealed":"aes-256-gcm/1"'
SEALED_PER_JOB: Final = 7
"""Submitted state (email, name), the step's output (email) and patch (email, name), the
Resumed payload (email, name)."""
GRACE_PLAINTEXT: Final = (b"grace@example.com", b"Grace Hopper")
ADA_ERASED: Final = {"email": ERASED, "name": ERASED, "plan": "gold"}
"""Ada's customer record as every reader shows it once erased (the signal replaced it whole)."""
PATHS: Final = ["customer.email", "customer.name"]
REASON: Final = "GDPR art. 17 request #42"
VERIFY_SCRIPT: Final = Path(sys.executable).parent / "jobledger-verify"
INDEPENDENT: Final = ROOT / "tests" / "independent_verifier.py"


# ---- the events topic -----------------------------------------------------------------------


def opened(event: Job.Event, sealer: FieldSealer) -> Job.Event:
    """A topic's event read by the engine's own reader of sealed values, as the store's
    mapper reads a row: plaintext while the key lives, [erased] once it is gone; the stored
    form (what the chain hashed) kept."""
    return event_decoding.make(type(event), sealer.open(dict(vars(event))))


def fold_topic(records: list[Any], sealer: FieldSealer | None = None) -> dict[str, Job]:
    """What a consumer of the topic alone makes of it: each job folded from its events in
    version order (a duplicate dropped), its chain checked."""
    events: dict[str, dict[int, Job.Event]] = defaultdict(dict)
    for record in records:
        event = decode_event(record.value)
        events[record.key.decode()][event.originator_version] = (
            event if sealer is None else opened(event, sealer)
        )
    jobs = {}
    for key, by_version in events.items():
        history = [by_version[v] for v in sorted(by_version)]
        assert chain.verify(history) is None, key
        job: Job | None = None
        for event in history:
            job = event.mutate(job)  # type: ignore[arg-type]
        assert job is not None
        jobs[key] = job
    return jobs


def topic_bytes(records: list[Any]) -> bytes:
    """Every byte a consumer receives: keys, headers and values."""
    parts = [record.key + record.value for record in records]
    parts += [value for record in records for _, value in record.headers]
    return b"\n".join(parts)


def test_the_events_topic_carries_sealed_values_only_and_after_erase_nothing_on_it_opens(
    make_engine: EngineFactory, kafka_topics: KafkaTopics
) -> None:
    registry = DefinitionRegistry([parse_definition(ONBOARDING, "onboarding.yaml")])
    engine = make_engine(registry=registry, executor=Greeter())
    run_onboarding(engine, "ada-1", "ada", ADA)
    run_onboarding(engine, "grace-1", "grace", GRACE)
    store = engine.store
    assert isinstance(store, EventSourcedJobStore)
    sealer = store.partitions[0].sealer
    assert sealer is not None and engine.deps.subject_keys is not None
    publisher = KafkaEventPublisher(kafka_topics.settings())
    try:
        outbox = Outbox(store, publisher)
        published = outbox.publish_pending()
        records = read_topic(kafka_topics.bootstrap, kafka_topics.events, at_least=published)
        assert len(records) == published == 12

        # On the topic: ciphertext for every personal value, the rest as it is.
        on_topic = topic_bytes(records)
        for plaintext in (*PLAINTEXT, *GRACE_PLAINTEXT):
            assert plaintext not in on_topic
        assert on_topic.count(SEALED) == 2 * SEALED_PER_JOB
        assert b'"plan":"gold"' in on_topic and b'"plan":"basic"' in on_topic
        # The engine's reader opens them while the keys live: the topic is the store.
        for key, folded in fold_topic(records, sealer).items():
            assert JobView.of(folded) == engine.job(TENANT, key.partition("/")[2])

        report = engine.erase(TENANT, "ada", by="dpo@acme", reason=REASON)
        assert report.erased == ("ada-1",)
        assert outbox.publish_pending() == 1
        records = read_topic(kafka_topics.bootstrap, kafka_topics.events, at_least=published + 1)
        assert len(records) == published + 1
        (erased,) = [r for r in records if headers(r)["event_type"] == "Erased"]
        assert (headers(erased)["job"], headers(erased)["job_version"]) == ("ada-1", "7")
        fields = chain.event_fields(decode_event(erased.value))
        assert {k: fields[k] for k in ("key_id", "paths", "erased_by", "reason")} == {
            "key_id": report.key_ids[0],
            "paths": PATHS,
            "erased_by": "dpo@acme",
            "reason": REASON,
        }
        assert not any(plaintext in topic_bytes(records) for plaintext in PLAINTEXT)

        # The key rows are gone: a consumer reading the topic end to end, with the engine's
        # own reader, opens none of ada's sealed values; grace's still open.
        assert engine.deps.subject_keys.keys_of(TENANT, "ada") == {}
        for record in records:
            event = opened(decode_event(record.value), sealer)
            unread = unreadable_fields(type(event).__qualname__, vars(event), PATHS)
            sealed = record.value.count(SEALED)
            assert len(unread) == (sealed if headers(record)["job"] == "ada-1" else 0)
        after = fold_topic(records, sealer)
        for job in ("ada-1", "grace-1"):
            assert JobView.of(after[f"{TENANT}/{job}"]) == engine.job(TENANT, job)
        assert after[f"{TENANT}/ada-1"].state["customer"] == ADA_ERASED
        assert after[f"{TENANT}/grace-1"].state["customer"]["email"] == CONFIRMED_EMAIL
        # A consumer holding no key at all folds the same erased state (Erased says which).
        blind = fold_topic(records)[f"{TENANT}/ada-1"]
        assert blind.state["customer"] == ADA_ERASED and blind.personal_data_erased
    finally:
        publisher.close()


# ---- the CLI end to end ----------------------------------------------------------------------


@pytest.fixture
def cli(tmp_path: Path, store_url: str) -> Cli:
    return onboarding_cli(tmp_path, store_url)


def onboarding_cli(tmp_path: Path, store_url: str, settings: str = "") -> Cli:
    return make_cli(
        tmp_path,
        store_url,
        definitions={"onboarding.yaml": ONBOARDING},
        executor="tests.support.erasure:Greeter",
        settings=settings,
    )


def onboard(cli: Cli, job: str, subject: str, state: dict[str, Any]) -> None:
    """As run_onboarding does, through the CLI: submit, tick, signal, tick."""
    cli.ok("submit", TENANT, job, "onboarding", "--subject", subject, "--input", json.dumps(state))
    cli.ok("tick", TENANT, job)
    payload = json.dumps(confirmation(state))
    cli.ok("signal", TENANT, job, "customer.confirmed", "--id", f"{job}-ok", "--payload", payload)
    cli.ok("tick", TENANT, job)
    assert cli.json("show", TENANT, job)["status"] == "completed"


def no_plaintext(text: str) -> bool:
    return not any(plaintext.decode() in text for plaintext in PLAINTEXT)


def run(*command: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(part) for part in command],
        capture_output=True,
        text=True,
        timeout=60,
        env={"PYTHONPATH": pythonpath(ROOT / "src")},
    )


def verified_by_all(export: Path, *keyring: str) -> None:
    """jobledger-verify, python -m jobledger.audit.verifier and the independent verifier accept
    the export, and agree on every job."""
    script = run(VERIFY_SCRIPT, export, *keyring, "--json")
    module = run(sys.executable, "-m", "jobledger.audit.verifier", export, *keyring, "--json")
    independent = run(sys.executable, INDEPENDENT, export, *keyring)
    for result in (script, module, independent):
        assert result.returncode == 0, result.stdout + result.stderr
    assert json.loads(script.stdout) == json.loads(module.stdout)
    ours = {job["job_uuid"]: job["verified"] for job in json.loads(script.stdout)["jobs"]}
    theirs = {line.split()[1]: line.split()[2] == "OK" for line in independent.stdout.splitlines()}
    assert ours == theirs == {str(job_uuid(TENANT, j)): True for j in ("ada-1", "grace-1")}


def test_the_cli_reads_erased_values_as_erased_and_every_check_still_passes(
    cli: Cli, tmp_path: Path, fresh_store_url: str
) -> None:
    onboard(cli, "ada-1", "ada", ADA)
    onboard(cli, "grace-1", "grace", GRACE)
    assert "Ada Lovelace" in cli.ok("show", TENANT, "ada-1")  # the key lives: it opens
    before = cli.json("history", TENANT, "ada-1")["events"]

    done = cli.json("erase", TENANT, "--subject", "ada", "--reason", REASON, "--by", "dpo@acme")
    assert done["erased"] == ["ada-1"] and done["already_erased"] == []

    # show: [erased] for the personal values, the rest as it was; time travel too.
    shown = cli.ok("show", TENANT, "ada-1")
    assert no_plaintext(shown) and ERASED in shown and '"plan": "gold"' in shown
    assert "could not read customer.email, customer.name: their key was erased" in shown
    job = cli.json("show", TENANT, "ada-1")
    assert job["state"] == {"customer": ADA_ERASED, "confirmed": True}
    first = cli.json("show", TENANT, "ada-1", "--at-version", "1")
    assert first["state"] == {"customer": ADA_ERASED}
    # history: the Erased event says who and why; every earlier hash is as it was.
    table = cli.ok("history", TENANT, "ada-1")
    assert no_plaintext(table) and "Erased" in table and "dpo@acme" in table
    assert "hash chain: intact" in table
    # Each event that carried a personal value says so (Submitted, the step, Resumed);
    # the JSON below names the fields.
    assert table.count(ERASED) == 3
    history = cli.json("history", TENANT, "ada-1")
    assert history["chain"] == {"intact": True, "broken_at": None}
    *events, last = history["events"]
    assert [e["chain_hash"] for e in events] == [e["chain_hash"] for e in before]
    assert no_plaintext(json.dumps(history)) and "gold" in json.dumps(history)
    assert events[0]["data"]["state"]["customer"] == first["state"]["customer"]
    marked: dict[str, str] = {}
    for e in events:  # the first of each type
        marked.setdefault(e["event_type"], e["transition"].partition("[erased] ")[2])
    assert marked["Submitted"] == "state.customer.email, state.customer.name"
    assert (
        marked["StepRecorded"]
        == "output.customer.email, state_patch.customer.email, state_patch.customer.name"
    )
    assert marked["Resumed"] == "payload.customer.email, payload.customer.name"
    step = next(e["data"] for e in events if e["event_type"] == "StepRecorded")
    assert step["output"] == {"greeted": True, "customer": {"email": ERASED}}
    resumed = next(e["data"] for e in events if e["event_type"] == "Resumed")
    assert resumed["payload"] == {"customer": ADA_ERASED, "confirmed": True}
    assert (last["event_type"], last["data"]["erased_by"], last["data"]["reason"]) == (
        "Erased",
        "dpo@acme",
        REASON,
    )
    assert cli.json("show", TENANT, "grace-1")["state"]["customer"]["name"] == "Grace Hopper"

    # verify, and the export through the standalone verifiers.
    assert "all intact" in cli.ok("verify")
    export = tmp_path / "export.jsonl"
    export.write_text(cli.ok("export", "--all"), encoding="utf-8")
    text = export.read_text(encoding="utf-8")
    assert no_plaintext(text) and text.count(SEALED.decode()) == 2 * SEALED_PER_JOB
    assert '"type":"Erased"' in text
    verified_by_all(export)

    # replay: exits as an intact job's does, and names what it could not read.
    definition = str(tmp_path / "definitions" / "onboarding.yaml")
    erased_replay = cli.json("replay", TENANT, "ada-1", "--definition", definition)
    intact_replay = cli.json("replay", TENANT, "grace-1", "--definition", definition)
    for report in (erased_replay, intact_replay):
        assert report["safe"] and [s["outcome"] for s in report["steps"]] == ["same"] * 3
    assert erased_replay["verdict"] == intact_replay["verdict"]
    assert intact_replay["unreadable"] == []
    assert erased_replay["unreadable"] == [
        "v1 state.customer.email",
        "v1 state.customer.name",
        "v3 output.customer.email",
        "v3 state_patch.customer.email",
        "v3 state_patch.customer.name",
        "v5 payload.customer.email",
        "v5 payload.customer.name",
    ]
    replayed = cli.ok("replay", TENANT, "ada-1", "--definition", definition)
    assert "could not read (erased): v1 state.customer.email" in replayed

    # import into a fresh store: the same bytes, verified; no key travels with an export,
    # so there every personal value reads as [erased], grace's too.
    cli.ok("import", str(export), "--store", fresh_store_url)
    assert "all intact" in cli.ok("verify", "--store", fresh_store_url)
    again = cli.ok("export", "--all", "--store", fresh_store_url).rstrip("\n").split("\n")
    lines = text.rstrip("\n").split("\n")
    assert again[:-1] == lines[:-1]
    assert json.loads(again[-1])["heads"] == json.loads(lines[-1])["heads"]
    for job_id in ("ada-1", "grace-1"):
        imported = cli.json("show", TENANT, job_id, "--store", fresh_store_url)
        customer = imported["state"]["customer"]
        assert (customer["email"], customer["name"]) == (ERASED, ERASED)
    assert "Grace Hopper" not in cli.ok("history", TENANT, "grace-1", "--store", fresh_store_url)


# ---- signed events -------------------------------------------------------------------------


SIGNING: Final = '\n[signing]\nkeys = "keys/signing-keys.json"\nkeyring = "keys/keyring.json"\n'


def test_erase_leaves_every_signature_valid_and_rewrites_no_stored_event(
    tmp_path: Path, store_url: str
) -> None:
    cli = onboarding_cli(tmp_path, store_url, settings=SIGNING)
    cli.ok("keys", "generate", "k-1", "--dir", "keys")
    keyring = str(tmp_path / "keys" / "keyring.json")
    onboard(cli, "ada-1", "ada", ADA)
    onboard(cli, "grace-1", "grace", GRACE)
    before = cli.ok("export", "--all").rstrip("\n").split("\n")[:-1]
    assert all(json.loads(line)["signer"] == "k-1" for line in before)

    cli.ok("erase", TENANT, "--subject", "ada", "--reason", REASON, "--by", "dpo@acme")
    checked = cli.json("verify", "--keyring", keyring)
    assert checked["intact"] and checked["signatures"]["checked"]
    assert checked["events"] == len(before) + 1
    after = cli.ok("export", "--all").rstrip("\n").split("\n")
    # Erasure destroyed a key and appended one event: every stored byte before it stays.
    (erased,) = [line for line in after[:-1] if line not in before]
    assert sorted(line for line in after[:-1] if line != erased) == sorted(before)
    assert json.loads(erased)["type"] == "Erased" and json.loads(erased)["signer"] == "k-1"
    export = tmp_path / "signed.jsonl"
    export.write_text("".join(line + "\n" for line in after), encoding="utf-8")
    verified_by_all(export, "--keyring", keyring)

    # The check has teeth: a keyring without k-1 refuses the very same events.
    other = tmp_path / "other"
    ring = ["--keys", str(other / "keys.json"), "--keyring", str(other / "ring.json")]
    cli.ok("keys", "generate", "k-2", "--dir", str(other), *ring)
    refused = cli("verify", "--keyring", str(other / "ring.json"))
    assert refused.returncode == 1
    assert run(VERIFY_SCRIPT, export, "--keyring", other / "ring.json").returncode == 1


# ---- approvals ----------------------------------------------------------------------------


REVIEWED: Final = ONBOARDING.replace(
    "next: confirm}",
    "next: review}\n  review: {kind: await_approval, approvers: [lead], on_approve: confirm, "
    "on_reject: done}",
)


def test_an_approvals_action_hash_confirms_no_guess_once_the_subject_is_erased(
    make_engine: EngineFactory,
) -> None:
    """A sha256 over a state holding an email address would confirm a guess of it after
    the erasure, and the card's hash check would then read as tampering: the hash masks the
    personal paths (the chain pins their sealed values), before and after."""
    registry = DefinitionRegistry([parse_definition(REVIEWED, "onboarding.yaml")])
    engine = make_engine(registry=registry, executor=Greeter())
    engine.submit(TENANT, "ada-1", "onboarding", input=ADA, data_subject="ada")
    engine.run_until_idle()
    approval_id = engine.job(TENANT, "ada-1").pending_approval_id
    assert approval_id is not None
    card = approval(engine, TENANT, "ada-1", approval_id)
    assert card is not None and card.hash_matches and card.params is not None
    engine.erase(TENANT, "ada", by="dpo@acme", reason=REASON)

    erased = approval(engine, TENANT, "ada-1", approval_id)
    assert erased is not None and erased.state["customer"]["email"] == ERASED
    guess = {"customer": {**ADA["customer"], "greeted": True}}
    guessed = transition.action_sha256(erased.step_name, dict(card.params), guess)
    assert guessed != erased.action_sha256
    assert erased.hash_matches
