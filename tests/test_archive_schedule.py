"""Retention that runs by itself: the runner (``jobledger run``) with
``retention_archive_to`` archives the finished jobs past their retention every
``retention_interval_seconds``, on SQLite and PostgreSQL."""

from __future__ import annotations

import logging
import signal
import subprocess
import time
from pathlib import Path
from typing import Any
from uuid import uuid4

import pytest

from jobledger import Engine, JobStatus
from jobledger.adapters.clock import FakeClock
from jobledger.adapters.kafka.settings import KafkaSettings
from jobledger.adapters.ops import MemoryOps
from jobledger.audit.kafka_archive import archive_reader
from jobledger.cli.config_file import engine_config, load_settings
from jobledger.domain.errors import ConfigError
from jobledger.projections.archive_schedule import PASS_EVENT, ScheduledArchiving
from jobledger.runtime.embedded_runner import EmbeddedRunner
from tests.support.cli import JOBLEDGER, NOTE, TICKET, announced, make_cli
from tests.support.engines import EngineFactory, agent_steps, store_of
from tests.support.retention import LATER, archiver
from tests.support.scrape import parse, value
from tests.support.workflows import DONE, STEP, linear_registry, wait_event


def archiving_config(target: Path | str, **more: Any) -> dict[str, Any]:
    return {
        "retention_default_days": 30,
        "retention_archive_to": str(target),
        "retention_interval_seconds": 0.2,
        **more,
    }


def registry() -> Any:
    return linear_registry({"agent3": agent_steps(3), "waiter": [STEP, wait_event("go"), DONE]})


def passes(ops: MemoryOps) -> list[Any]:
    return [e for e in ops.events if e.eventType == PASS_EVENT]


def wait_for(condition: Any, seconds: float = 20) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def test_the_runner_archives_finished_jobs_past_their_retention_and_nothing_else(
    make_engine: EngineFactory, clock: FakeClock, ops: MemoryOps, tmp_path: Path
) -> None:
    archive = tmp_path / "archive"
    engine = make_engine(registry=registry(), config=archiving_config(archive), metrics=True)
    for job_id in ("old-1", "old-2"):
        engine.submit("acme", job_id, "agent3")
    engine.submit("acme", "running", "waiter")  # as old, never finished
    engine.run_until_idle()
    clock.advance(LATER)
    engine.submit("acme", "recent", "agent3")  # finished, within its retention
    engine.run_until_idle()

    runner = EmbeddedRunner(engine)
    runner.start()
    try:
        wait_for(lambda: len(store_of(engine).tombstones.all()) == 2)
        wait_for(lambda: len(passes(ops)) >= 2)  # a later pass finds nothing more
    finally:
        runner.stop()

    tombstones = store_of(engine).tombstones.all()
    assert sorted(t.job_id for t in tombstones) == ["old-1", "old-2"]
    assert all(t.archive_ref.startswith(f"dir:{archive.resolve()}/") for t in tombstones)
    assert engine.job("acme", "running").status is JobStatus.WAITING_EVENT
    assert engine.job("acme", "recent").status is JobStatus.COMPLETED
    first, *later = passes(ops)
    assert (first.status, first.metadata["due"], first.metadata["archived"]) == ("done", 2, 2)
    assert all(p.metadata["archived"] == 0 for p in later)
    assert engine.deps.metrics is not None
    scraped = parse(engine.deps.metrics.render().decode())
    assert value(scraped, "jobledger_archived_jobs_total") == 2
    assert value(scraped, "jobledger_archive_passes_total", outcome="done") == len(passes(ops))


def test_a_pass_while_another_holds_the_store_is_a_quiet_skip(
    make_engine: EngineFactory,
    clock: FakeClock,
    ops: MemoryOps,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="jobledger.projections.archive_schedule")
    engine = make_engine(config=archiving_config(tmp_path / "archive"))
    engine.submit("acme", "old", "agent3")
    engine.run_until_idle()
    clock.advance(LATER)
    engine.submit("tail", "recent", "agent3")
    archiving = ScheduledArchiving(store_of(engine), engine.deps.clock, ops, engine.config)
    other = store_of(engine).backend.lock("archive")  # another runner's pass under way
    assert other.try_acquire()
    try:
        assert archiving.archive_once() is None
    finally:
        other.release()
    assert [p.status for p in passes(ops)] == ["busy"]
    (skipped,) = caplog.records
    assert skipped.levelno == logging.INFO and "this pass is skipped" in skipped.message
    assert store_of(engine).tombstones.all() == []

    run = archiving.archive_once()
    assert run is not None and [t.job_id for t in run.archived] == ["old"]
    assert [p.status for p in passes(ops)] == ["busy", "done"]


def test_a_failed_pass_is_logged_and_the_next_one_goes_on(
    make_engine: EngineFactory,
    clock: FakeClock,
    ops: MemoryOps,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    archive = tmp_path / "archive"
    engine = make_engine(config=archiving_config(archive))
    engine.submit("acme", "old", "agent3")
    engine.run_until_idle()
    clock.advance(LATER)
    engine.submit("tail", "recent", "agent3")
    archiving = ScheduledArchiving(store_of(engine), engine.deps.clock, ops, engine.config)
    archive.rmdir()
    archive.write_text("not a directory")  # the target broke after start

    assert archiving.archive_once() is None
    assert [p.status for p in passes(ops)] == ["failed"]
    assert "cannot use" in passes(ops)[0].metadata["error"]
    failed = [r for r in caplog.records if "archive pass" in r.message]
    assert [r.levelno for r in failed] == [logging.ERROR]
    archive.unlink()
    run = archiving.archive_once()
    assert run is not None and [t.job_id for t in run.archived] == ["old"]


def test_a_directory_that_cannot_be_made_stops_the_runner_at_start(
    make_engine: EngineFactory, tmp_path: Path
) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    engine = make_engine(config=archiving_config(blocker / "archive"))
    with pytest.raises(ConfigError, match="retention_archive_to: cannot use"):
        EmbeddedRunner(engine)


@pytest.mark.parametrize(
    ("values", "problem"),
    [
        ({"retention_archive_to": "/srv/archive"}, "retention_archive_to needs a retention"),
        (
            {"retention_archive_to": "kafka:no topic", "retention_default_days": 1},
            "retention_archive_to: Value error, archive target 'kafka:no topic'",
        ),
        (
            {"retention_archive_to": " ", "retention_default_days": 1},
            "an archive target must not be empty",
        ),
        (
            {"retention_interval_seconds": 0, "retention_default_days": 1},
            "retention_interval_seconds must be more than 0",
        ),
    ],
)
def test_a_bad_archiving_config_is_a_config_error(values: dict[str, Any], problem: str) -> None:
    with pytest.raises(ConfigError, match=problem):
        engine_config(values, None)


def test_without_a_target_the_runner_does_not_archive(
    make_engine: EngineFactory, clock: FakeClock, ops: MemoryOps
) -> None:
    engine: Engine = make_engine(config={"retention_default_days": 30})
    assert EmbeddedRunner(engine).archiving is None


def test_the_runner_archives_to_a_kafka_topic(
    make_engine: EngineFactory, clock: FakeClock, ops: MemoryOps, kafka_bootstrap: str
) -> None:
    topic = f"archive-{uuid4().hex[:8]}"
    engine = make_engine(
        config=archiving_config(
            f"kafka:{topic}", kafka_bootstrap_servers=kafka_bootstrap, kafka_topic_partitions=1
        )
    )
    engine.submit("acme", "old", "agent3")
    engine.run_until_idle()
    clock.advance(LATER)
    engine.submit("tail", "recent", "agent3")
    archiving = ScheduledArchiving(store_of(engine), engine.deps.clock, ops, engine.config)

    run = archiving.archive_once()

    assert run is not None and [t.archive_ref for t in run.archived] == [f"kafka:{topic}/0@0"]
    assert archiving.describe() == f"archiving: to kafka:{topic} every 0.2s"
    restored = archiver(engine).restore(
        "acme", "old", archive_reader(KafkaSettings.of(engine.config)), None
    )
    assert restored.job_id == "old" and engine.job("acme", "old").status is JobStatus.COMPLETED


def test_a_relative_archive_directory_in_a_config_file_is_beside_the_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config_file = tmp_path / "etc" / "jobledger.toml"
    config_file.parent.mkdir()
    config_file.write_text('retention_default_days = 7\nretention_archive_to = "archive"\n')
    monkeypatch.chdir(tmp_path)
    settings = load_settings(config_file, None)
    assert settings.engine.retention.archive_to == str(config_file.parent / "archive")
    config_file.write_text('retention_default_days = 7\nretention_archive_to = "kafka:a.b"\n')
    assert load_settings(config_file, None).engine.retention.archive_to == "kafka:a.b"


def test_jobledger_run_archives_by_itself_and_refuses_a_target_without_retention(
    tmp_path: Path, store_url: str
) -> None:
    settings = 'retention_default_days = 0\nretention_archive_to = "archive"\n'
    cli = make_cli(
        tmp_path,
        store_url,
        definitions={"note.yaml": NOTE, "ticket.yaml": TICKET},
        settings=settings + "retention_interval_seconds = 0.5\n",
    )
    cli.ok("submit", "acme", "t1", "ticket")  # will wait for an event: never archived
    cli.ok("submit", "acme", "n1", "note")
    cli.ok("tick", "acme", "n1")
    runner = subprocess.Popen(
        [str(JOBLEDGER), "run", "--config", str(cli.config)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=cli.env,
        cwd=tmp_path,
    )
    try:
        banner = announced(runner, r"(archiving: .*)", "the runner's banner")
        assert banner.strip() == f"archiving: to {tmp_path / 'archive'} every 0.5s"
        wait_for(lambda: len(cli.json("tombstones", "list")) == 1, seconds=60)
    finally:
        runner.send_signal(signal.SIGTERM)
        assert runner.wait(timeout=60) == 0
    (tombstone,) = cli.json("tombstones", "list")
    assert tombstone["job"] == "n1"
    assert tombstone["archive"].startswith(f"dir:{(tmp_path / 'archive').resolve()}/")
    assert cli.json("show", "acme", "t1")["status"] == "waiting_event"

    cli.config.write_text(cli.config.read_text().replace("retention_default_days = 0\n", ""))
    refused = cli.fails(3, "run")
    assert "retention_archive_to needs a retention to archive by" in refused
    (tmp_path / "blocker").write_text("")
    cli.config.write_text(
        cli.config.read_text().replace('"archive"', '"blocker/archive"')
        + "retention_default_days = 1\n"
    )
    assert "retention_archive_to: cannot use" in cli.fails(3, "run")
