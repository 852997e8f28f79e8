"""Anchors outside the store, for real: on a Kafka topic of a real broker, stamped by a
local RFC 3161 TSA (openssl ts behind a small HTTP server), taken by hand and by the
runner on a schedule. A history rolled back in the real store (rows deleted, or an
earlier copy of the SQLite file put back) is caught by ``verify --anchors``; an edited
anchor line, a tampered token and a token for another root are reported. On SQLite and
PostgreSQL."""

from __future__ import annotations

import base64
import itertools
import json
import shutil
import signal
import subprocess
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from kafka import KafkaConsumer

from jobledger.audit.anchor_schedule import AnchorSettings, load_anchor_settings, parse_duration
from jobledger.audit.anchors import ANCHOR_TOPIC, Head, line_sha256, make_anchor
from jobledger.audit.destinations import Destination, open_sink, read_log
from jobledger.domain.errors import ConfigError
from jobledger.domain.identity import job_uuid
from tests.support.audit import RawEvents
from tests.support.cli import JOBLEDGER, Cli, make_cli
from tests.support.kafka_broker import read_topic, wait_for
from tests.support.tsa import LocalTsa


@pytest.fixture
def cli(tmp_path: Path, store_url: str) -> Cli:
    return make_cli(tmp_path, store_url)


def two_jobs(cli: Cli) -> None:
    """t1 and t2 each triaged, waiting for invoice.paid (at v4)."""
    for job in ("t1", "t2"):
        cli.ok("submit", "acme", job, "ticket")
        cli.ok("tick", "acme", job)


def pay(cli: Cli, job: str) -> None:
    """The payment arrives: the job goes on to wait for its review (past v4)."""
    cli.ok("signal", "acme", job, "invoice.paid", "--id", f"paid-{job}")
    cli.ok("tick", "acme", job)


def topic_url(bootstrap: str) -> tuple[str, str]:
    topic = f"anchors.{uuid.uuid4().hex[:10]}"
    return topic, f"kafka://{bootstrap}/{topic}"


def values(bootstrap: str, topic: str, at_least: int = 0) -> list[str]:
    """The topic's values in offset order ([] while the topic does not exist)."""
    if topic not in KafkaConsumer(bootstrap_servers=bootstrap).topics():
        return []
    return [r.value.decode() for r in read_topic(bootstrap, topic, at_least=at_least)]


def verify_fails(cli: Cli, *args: str) -> dict[str, Any]:
    result = cli("verify", "--json", *args)
    assert result.returncode == 1, (result.stdout, result.stderr)
    return dict(json.loads(result.stdout))


# ---- Kafka ---------------------------------------------------------------------------------


def test_kafka_anchors_catch_a_rollback_and_an_edited_dump_line(
    cli: Cli, store_url: str, kafka_bootstrap: str
) -> None:
    topic, url = topic_url(kafka_bootstrap)
    two_jobs(cli)
    first = cli.json("anchor", "--to", url)
    assert (first["line"], first["jobs"]) == (1, 2)
    pay(cli, "t2")
    assert cli.json("anchor", "--to", url)["line"] == 2

    # On the topic: one partition, the two lines in order, the second chained to the first.
    lines = values(kafka_bootstrap, topic, at_least=2)
    assert len(lines) == 2 and json.loads(lines[0])["merkle_root"] == first["merkle_root"]
    assert json.loads(lines[1])["previous_sha256"] == line_sha256(lines[0])
    assert {r.partition for r in read_topic(kafka_bootstrap, topic)} == {0}
    assert cli.json("verify", "--anchors", url)["intact"] is True

    # Roll t2 back to before its payment: consistent without anchors, caught with them.
    RawEvents(store_url).delete(job_uuid("acme", "t2"), 5, and_after=True)
    assert cli.json("verify")["intact"] is True
    report = verify_fails(cli, "--anchors", url)
    [broken] = report["broken"]
    assert (broken["job"], broken["version"], broken["kind"]) == ("t2", 5, "truncated")
    assert report["anchors"]["source"] == url and report["anchors"]["anchors"] == 2
    assert "nothing anchored" in cli.fails(1, "anchor", "--to", url)
    assert len(values(kafka_bootstrap, topic)) == 2  # the refusal published nothing

    # The auditor's copy: the values one per line in offset order; it is an anchor file.
    assert "wrote 2 anchor line(s)" in cli.ok("anchor", "--dump", url, "dump.jsonl")
    dump = cli.tmp / "dump.jsonl"
    assert dump.read_text().splitlines() == lines
    assert verify_fails(cli, "--anchors", "file:dump.jsonl")["broken"] == report["broken"]

    # An anchor line edited in the dump (the pinned version of t2 lowered) is reported.
    edited = json.loads(lines[1])
    for head in edited["heads"]:
        head["version"] = 4 if head["job"] == "t2" else head["version"]
    dump.write_text(lines[0] + "\n" + json.dumps(edited, sort_keys=True) + "\n")
    problems = verify_fails(cli, "--anchors", "dump.jsonl")["anchors"]["problems"]
    assert problems == [
        "dump.jsonl line 2: the Merkle root does not match its heads (the anchor line was edited)"
    ]


def test_a_broker_that_is_down_fails_anchor_and_writes_nothing(
    cli: Cli, kafka_bootstrap: str, local_tsa: LocalTsa
) -> None:
    two_jobs(cli)
    cli.env["JOBLEDGER_KAFKA_SEND_TIMEOUT_MS"] = "2000"
    started = time.monotonic()
    message = cli.fails(4, "anchor", "--to", "kafka://127.0.0.1:9/jobledger.anchors")
    assert "cannot reach Kafka at 127.0.0.1:9" in message
    assert time.monotonic() - started < 30
    message = cli.fails(4, "verify", "--anchors", "kafka://127.0.0.1:9")
    assert "cannot reach Kafka at 127.0.0.1:9" in message
    # A topic that does not exist is named, and reading it does not create it.
    topic, url = topic_url(kafka_bootstrap)
    assert f"no Kafka topic {topic!r}" in cli.fails(4, "verify", "--anchors", url)
    assert f"no Kafka topic {topic!r}" in cli.fails(4, "anchor", "--dump", url, "out.jsonl")
    assert not (cli.tmp / "out.jsonl").exists()
    # A TSA that does not answer: the line goes nowhere.
    message = cli.fails(1, "anchor", "--to", "a.jsonl", "--tsa", "http://127.0.0.1:9/tsa")
    assert "cannot reach TSA http://127.0.0.1:9/tsa" in message
    assert not (cli.tmp / "a.jsonl").exists()
    # The same anchor with a TSA that answers, to a file, then to the topic.
    assert cli.json("anchor", "--to", "a.jsonl", "--tsa", local_tsa.url)["line"] == 1
    cli.ok("anchor", "--to", url, "--tsa", local_tsa.url, "--tsa-ca", str(local_tsa.ca_file))
    [line] = values(kafka_bootstrap, topic, at_least=1)
    assert json.loads(line)["rfc3161"]["tsa"] == local_tsa.url


def test_a_restored_copy_of_the_sqlite_file_is_caught_by_stamped_kafka_anchors(
    tmp_path: Path, kafka_bootstrap: str, local_tsa: LocalTsa
) -> None:
    cli = make_cli(tmp_path, f"sqlite:///{tmp_path}/jobs.db")
    _, url = topic_url(kafka_bootstrap)
    two_jobs(cli)
    shutil.copy(tmp_path / "jobs.db", tmp_path / "earlier.db")
    pay(cli, "t1")
    pay(cli, "t2")
    stamp = ("--tsa", local_tsa.url, "--tsa-ca", str(local_tsa.ca_file))
    cli.ok("anchor", "--to", url, *stamp)
    shutil.copy(tmp_path / "earlier.db", tmp_path / "jobs.db")  # the operator's "restore"

    report = verify_fails(cli, "--anchors", url, "--tsa-ca", str(local_tsa.ca_file))
    assert sorted((b["job"], b["version"], b["kind"]) for b in report["broken"]) == [
        ("t1", 5, "truncated"),
        ("t2", 5, "truncated"),
    ]
    [stamped] = report["anchors"]["rfc3161"]
    assert stamped["signature_checked"] is True and stamped["problem"] is None
    assert stamped["gen_time"] is not None and stamped["tsa"] == local_tsa.url


def test_an_anchor_of_many_jobs_is_one_record_past_kafkas_default_size_limit(
    kafka_bootstrap: str,
) -> None:
    """10,000 heads make a 1.7 MB line: past the 1 MB a Kafka topic takes by default."""
    topic, url = topic_url(kafka_bootstrap)
    sink = open_sink(Destination.parse(url))
    heads = [Head(uuid.uuid4(), "acme", f"j{n}", 9, "ab" * 32) for n in range(10_000)]
    first = make_anchor(heads, datetime.now(UTC), sink.last_line())
    sink.append(first.to_line())
    second = make_anchor(heads[:10], datetime.now(UTC), sink.last_line())
    sink.append(second.to_line())
    assert len(first.to_line()) > 1_500_000
    log = read_log(sink)
    assert log.problems == () and [len(a.heads) for a in log.anchors] == [10_000, 10]
    assert values(kafka_bootstrap, topic)[0] == first.to_line()


# ---- RFC 3161 --------------------------------------------------------------------------------


def flip_token_byte(line: str, offset: int) -> str:
    """The line with one byte of its token's DER changed."""
    document = json.loads(line)
    token = bytearray(base64.b64decode(document["rfc3161"]["token"]))
    token[offset] ^= 0x01
    document["rfc3161"]["token"] = base64.b64encode(bytes(token)).decode()
    return json.dumps(document, sort_keys=True, separators=(",", ":"))


def test_tsa_stamped_file_anchors_catch_a_rollback_and_a_forged_token(
    cli: Cli, store_url: str, local_tsa: LocalTsa
) -> None:
    ca = str(local_tsa.ca_file)
    two_jobs(cli)
    cli.ok("anchor", "--to", "file:anchors.jsonl", "--tsa", local_tsa.url, "--tsa-ca", ca)
    pay(cli, "t1")
    second = cli.json("anchor", "--to", "anchors.jsonl", "--tsa", local_tsa.url, "--tsa-ca", ca)
    assert second["rfc3161"] == {"tsa": local_tsa.url}
    anchors = cli.tmp / "anchors.jsonl"
    lines = anchors.read_text().splitlines()
    assert all("rfc3161" in json.loads(line) for line in lines)

    report = cli.json("verify", "--anchors", "anchors.jsonl", "--tsa-ca", ca)
    assert report["intact"] is True
    assert [s["line_number"] for s in report["anchors"]["rfc3161"]] == [1, 2]
    assert all(s["signature_checked"] and s["gen_time"] for s in report["anchors"]["rfc3161"])
    table = cli.ok("verify", "--anchors", "anchors.jsonl")
    assert "RFC 3161 timestamps (2 of 2 anchors)" in table and "NOT checked" in table

    def problems(*extra: str) -> list[str]:
        result = verify_fails(cli, "--anchors", "anchors.jsonl", *extra)
        assert result["broken"] == []
        return list(result["anchors"]["problems"])

    # A token for another root: line 1's token moved onto line 2 (the last line, so the
    # line chain itself still holds: only the token says it).
    other = json.loads(lines[1])
    other["rfc3161"]["token"] = json.loads(lines[0])["rfc3161"]["token"]
    anchors.write_text(lines[0] + "\n" + json.dumps(other, sort_keys=True) + "\n")
    assert problems() == [
        "anchors.jsonl line 2: RFC 3161 token: stamps another Merkle root than this anchor's"
    ]
    # A byte of the signed content changed (near the end: the signature value): the
    # imprint still matches, the signature does not.
    anchors.write_text(lines[0] + "\n" + flip_token_byte(lines[1], -5) + "\n")
    [problem] = problems("--tsa-ca", ca)
    assert problem.startswith("anchors.jsonl line 2: RFC 3161 token: its signature does not")
    # A token signed by a TSA the auditor's CA does not vouch for.
    anchors.write_text("\n".join(lines) + "\n")
    other_ca = str(local_tsa.other_ca_file)
    assert len(problems("--tsa-ca", other_ca)) == 2
    # Garbage where the token was.
    other["rfc3161"]["token"] = base64.b64encode(b"not a token").decode()
    anchors.write_text(lines[0] + "\n" + json.dumps(other, sort_keys=True) + "\n")
    [problem] = problems()
    assert problem.startswith("anchors.jsonl line 2: RFC 3161 token: does not parse")

    # Rolled back (t1 to before its payment): caught by the stamped anchors.
    anchors.write_text("\n".join(lines) + "\n")
    RawEvents(store_url).delete(job_uuid("acme", "t1"), 5, and_after=True)
    [broken] = verify_fails(cli, "--anchors", "anchors.jsonl", "--tsa-ca", ca)["broken"]
    assert (broken["job"], broken["version"], broken["kind"]) == ("t1", 5, "truncated")


# ---- scheduled anchoring in the runner -------------------------------------------------------


def start_runner(cli: Cli, *args: str, **env: str) -> subprocess.Popen[str]:
    command = [str(JOBLEDGER), "run", "--config", str(cli.config), *args]
    return subprocess.Popen(
        command,
        cwd=cli.tmp,
        env={**cli.env, **env},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def stop(runner: subprocess.Popen[str]) -> tuple[str, str]:
    runner.send_signal(signal.SIGTERM)
    out, err = runner.communicate(timeout=60)
    assert runner.returncode == 0, err
    return out, err


def heads(line: str) -> dict[str, int]:
    return {head["job"]: head["version"] for head in json.loads(line)["heads"]}


def versions(cli: Cli, *jobs: str) -> dict[str, int]:
    return {job: cli.json("show", "acme", job)["version"] for job in jobs}


def status(cli: Cli, job: str) -> str:
    return str(cli.json("show", "acme", job)["status"])


def test_the_runner_anchors_to_kafka_as_events_accrue(
    cli: Cli, kafka_bootstrap: str, store_url: str
) -> None:
    topic, url = topic_url(kafka_bootstrap)
    runner = start_runner(cli, "--anchor-to", url, "--anchor-events", "3", "--anchor-every", "1h")
    try:
        cli.ok("submit", "acme", "t1", "ticket")
        wait_for(lambda: len(values(kafka_bootstrap, topic)) >= 1, 60, "a first anchor")
        cli.ok("submit", "acme", "t2", "ticket")
        cli.ok("signal", "acme", "t1", "invoice.paid", "--id", "paid-t1")
        wait_for(lambda: status(cli, "t1") == "awaiting_approval", 30, "t1 paid")
        wait_for(lambda: status(cli, "t2") == "waiting_event", 30, "t2 triaged")
        # Each anchor waits for 3 more events: the last one may be up to 2 events behind.
        wait_for(
            lambda: (
                len(values(kafka_bootstrap, topic)) >= 2
                and heads(values(kafka_bootstrap, topic)[-1]).keys() == {"t1", "t2"}
            ),
            60,
            "anchors as events accrue",
        )
        cli.ok("cancel", "acme", "t2", "--reason", "test", "--by", "ops")
    finally:
        out, _ = stop(runner)
    assert f"anchors: to {url} every 3600s or every 3 events" in " ".join(out.split())
    lines = values(kafka_bootstrap, topic)
    # The last anchor, at the latest the clean shutdown's, pins the store as it is.
    assert heads(lines[-1]) == versions(cli, "t1", "t2")
    assert all(
        json.loads(b)["previous_sha256"] == line_sha256(a) for a, b in itertools.pairwise(lines)
    )
    assert cli.json("verify", "--anchors", url)["intact"] is True
    RawEvents(store_url).delete(job_uuid("acme", "t1"), 5, and_after=True)
    assert verify_fails(cli, "--anchors", url)["broken"][0]["kind"] == "truncated"


def test_the_runner_anchors_on_time_keeps_running_when_anchoring_fails_and_anchors_at_shutdown(
    tmp_path: Path,
) -> None:
    cli = make_cli(tmp_path, f"sqlite:///{tmp_path}/jobs.db")
    with (tmp_path / "jobledger.toml").open("a") as config:
        config.write('\n[anchors]\nto = "file:pinned.jsonl"\nevery = "1s"\n')
    pinned = tmp_path / "pinned.jsonl"
    # The file destination is relative to the config file, not to the runner's directory.
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    runner = subprocess.Popen(
        [str(JOBLEDGER), "run", "--config", str(cli.config)],
        cwd=elsewhere,
        env=cli.env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        cli.ok("submit", "acme", "t1", "ticket")
        wait_for(lambda: pinned.exists() and "t1" in pinned.read_text(), 30, "a timed anchor")
        # The destination breaks (a directory where the file was): logged, retried, and
        # the runner goes on running ticks.
        pinned.rename(tmp_path / "kept.jsonl")
        pinned.mkdir()
        cli.ok("submit", "acme", "t2", "ticket")
        wait_for(lambda: status(cli, "t2") == "waiting_event", 30, "t2 ticked all the same")
        time.sleep(1.5)  # an anchor falls due and fails
        pinned.rmdir()
        (tmp_path / "kept.jsonl").rename(pinned)
        wait_for(lambda: "t2" in heads(pinned.read_text().splitlines()[-1]), 40, "a retry")
        cli.ok("signal", "acme", "t2", "invoice.paid", "--id", "paid-t2")
        wait_for(lambda: status(cli, "t2") == "awaiting_approval", 30, "t2 paid")
    finally:
        _, err = stop(runner)
    assert "anchor to " in err and "failed (retrying in" in err
    # The last anchor (at the latest, the clean shutdown's) pins what the store holds.
    assert heads(pinned.read_text().splitlines()[-1]) == versions(cli, "t1", "t2")
    assert cli.json("verify", "--anchors", str(pinned))["intact"] is True


# ---- destinations and settings ---------------------------------------------------------------


def test_destinations_by_url() -> None:
    assert Destination.parse("anchors.jsonl") == Destination("file", path=Path("anchors.jsonl"))
    assert Destination.parse("file:/a/b.jsonl") == Destination("file", path=Path("/a/b.jsonl"))
    kafka = Destination.parse("kafka://k1:9092,k2:9092")
    assert (kafka.kind, kafka.bootstrap, kafka.topic) == ("kafka", "k1:9092,k2:9092", ANCHOR_TOPIC)
    assert Destination.parse("kafka://k1:9092/audit.pins").topic == "audit.pins"
    assert str(Destination.parse("kafka://k1:9092")) == f"kafka://k1:9092/{ANCHOR_TOPIC}"
    for bad in ("kafka://", "kafka://host", "kafka://host:port", "s3://bucket/x", " "):
        with pytest.raises(ConfigError):
            Destination.parse(bad)


def test_anchor_settings_from_the_config_table_env_and_flags(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert [parse_duration(d) for d in ("5m", "30s", "1h", "250ms", "2")] == [
        300,
        30,
        3600,
        0.25,
        2,
    ]
    table = {"to": "pins.jsonl", "every": "5m", "events": 1000, "tsa_ca": "ca.pem"}
    config_file = tmp_path / "jobledger.toml"
    settings = load_anchor_settings(table, config_file)
    plan = settings.plan()
    assert plan is not None and plan.destination.path == tmp_path / "pins.jsonl"
    assert (plan.every_seconds, plan.events, plan.tsa_ca) == (300, 1000, tmp_path / "ca.pem")
    default = AnchorSettings(to="kafka://k:1").plan()
    assert default is not None and default.every_seconds == 300  # neither threshold given
    assert AnchorSettings().plan() is None
    for bad, why in (
        ({"every": "5m"}, "need a destination"),
        ({"to": "x", "every": "soon"}, "not a positive duration"),
        ({"to": "x", "events": 0}, "events"),
        ({"to": "s3://x"}, "expected file:PATH"),
        ({"to": "x", "when": "now"}, "unknown setting 'when'"),
    ):
        with pytest.raises(ConfigError, match=why):
            load_anchor_settings(bad, config_file)
    # The environment beats the file; a flag beats both.
    monkeypatch.setenv("JOBLEDGER_ANCHORS_EVERY", "30s")
    settings = load_anchor_settings(table, config_file, events=5)
    assert (settings.every, settings.events) == (30, 5)
