"""Read-only means read-only; a missing store is not an empty one.

Reading commands never create a SQLite store (a typo must not audit as "all intact"),
and reading an existing store writes nothing to its directory: no lock file, no DDL.
On a really read-only filesystem (an evidence copy) they work as usual.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import psycopg
import pytest

from tests.support.cli import JOBLEDGER, TICKET, Cli, make_cli
from tests.test_cli_hostile import run_in_process

READS = [
    ("list",),
    ("show", "acme", "t1"),
    ("history", "acme", "t1"),
    ("verify", "--all"),
    ("verify", "acme", "t1"),
    ("export", "--all"),
    ("replay", "--definition", "ticket.yaml", "acme", "t1"),
]
# Commands that change a job but cannot create one: a missing store is an error too.
CHANGES = [
    ("tick", "acme", "t1"),
    ("cancel", "acme", "t1", "--reason", "r", "--by", "ops"),
    ("approve", "acme", "t1", "--by", "lead"),
    ("migrate", "acme", "t1", "--to-version", "1"),
    ("anchor", "--file", "anchors.jsonl"),
    ("projections", "status"),
]


def listing(directory: Path) -> dict[str, tuple[int, int]]:
    """Every file below ``directory`` with its size and modification time."""
    return {
        str(path.relative_to(directory)): (path.stat().st_size, path.stat().st_mtime_ns)
        for path in sorted(directory.rglob("*"))
        if path.is_file()
    }


def test_a_missing_sqlite_store_is_an_error_and_is_not_created(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    cli = make_cli(tmp_path, "sqlite:///typo.db")
    (tmp_path / "ticket.yaml").write_text(TICKET)
    monkeypatch.chdir(tmp_path)
    before = listing(tmp_path)
    for args in READS + CHANGES:
        assert cli.config is not None
        code, out, err = run_in_process([*args, "--config", str(cli.config)], capsys)
        # The config file's relative path is the file beside it, named whole.
        missing = f"error: no store at {tmp_path / 'typo.db'} (no such file)\n"
        assert (code, out, err) == (3, "", missing), args
        assert listing(tmp_path) == before, args  # no typo.db, no lock file


def test_commands_that_write_still_create_the_store(tmp_path: Path) -> None:
    cli = make_cli(tmp_path, "sqlite:///fresh.db")
    cli.ok("submit", "acme", "t1", "ticket")
    assert (tmp_path / "fresh.db").exists()
    assert "verified 1 job(s)" in cli.ok("verify", "--all")


@pytest.fixture
def evidence(tmp_path: Path) -> tuple[Cli, Path]:
    """A store with a job at a wait, its views caught up, copied to ``evidence/``: the
    CLI's store URL points at the copy."""
    live = make_cli(tmp_path, f"sqlite:///{tmp_path}/live/jobs.db")
    (tmp_path / "live").mkdir()
    live.ok("submit", "acme", "t1", "ticket")
    live.ok("tick", "acme", "t1")
    live.ok("list")  # the views catch up: a read of the copy has nothing to write
    copy = tmp_path / "evidence"
    copy.mkdir()
    shutil.copy(tmp_path / "live" / "jobs.db", copy / "jobs.db")  # the database file only
    (tmp_path / "ticket.yaml").write_text(TICKET)
    config = tmp_path / "evidence.toml"
    config.write_text(live.config.read_text().replace("/live/", "/evidence/"))  # type: ignore[union-attr]
    return Cli(tmp_path, config, live.env), copy


def test_reading_writes_nothing_to_the_store_directory(
    evidence: tuple[Cli, Path], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    cli, copy = evidence
    monkeypatch.chdir(cli.tmp)
    before = listing(copy)
    for args in READS:
        assert cli.config is not None
        code, out, err = run_in_process([*args, "--config", str(cli.config)], capsys)
        assert code == 0 and out.strip(), (args, code, out, err)
        assert listing(copy) == before, args  # no lock file, no -wal/-shm left, file untouched


def read_only_mount(copy: Path) -> list[str] | None:
    """A command prefix that runs the rest in a private mount namespace where ``copy`` is
    read-only (root ignores permission bits, so only a read-only mount proves anything),
    or None when this machine does not allow it."""
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        return None
    probe = subprocess.run(
        [
            "unshare",
            "-m",
            "sh",
            "-c",
            f"mount --bind {copy} {copy} && mount -o remount,ro,bind {copy}",
        ],
        capture_output=True,
    )
    if probe.returncode != 0:
        return None
    script = f'mount --bind {copy} {copy} && mount -o remount,ro,bind {copy} && exec "$@"'
    return ["unshare", "-m", "sh", "-c", script, "sh"]


def test_reading_an_evidence_copy_on_a_read_only_filesystem_works(
    evidence: tuple[Cli, Path],
) -> None:
    cli, copy = evidence
    before = listing(copy)
    prefix = read_only_mount(copy)
    if prefix is None:
        if os.geteuid() == 0:
            pytest.skip("no read-only bind mount here (root ignores chmod)")
        copy.chmod(0o555)
        (copy / "jobs.db").chmod(0o444)
        prefix = []

    def run(args: tuple[str, ...]) -> subprocess.CompletedProcess[str]:
        command = [*prefix, str(JOBLEDGER), *args, "--config", str(cli.config)]
        return subprocess.run(
            command, capture_output=True, text=True, env=cli.env, cwd=cli.tmp, timeout=60
        )

    try:
        with ThreadPoolExecutor(max_workers=3) as pool:
            results = list(pool.map(run, READS))
    finally:
        copy.chmod(0o755)
    for args, result in zip(READS, results, strict=True):
        assert result.returncode == 0, (args, result.stdout, result.stderr)
        assert result.stdout.strip(), args
    assert listing(copy) == before


def read_only_runner(cli: Cli, store_url: str) -> tuple[Cli, list[str]]:
    """A CLI, and the command prefix, that read the store of ``cli`` where nothing may be
    written: on SQLite a copy of its file on a read-only filesystem (or, for a user that
    is not root, in a directory and file without write permission); on PostgreSQL a
    session whose every transaction is read-only, as on a hot standby."""
    if store_url.startswith("postgresql"):
        options = "-c default_transaction_read_only=on"
        return Cli(cli.tmp, cli.config, {**cli.env, "PGOPTIONS": options}), []
    copy = cli.tmp / "evidence"
    copy.mkdir()
    shutil.copy(cli.tmp / "jobs.db", copy / "jobs.db")  # the database file only
    config = cli.tmp / "evidence.toml"
    assert cli.config is not None
    config.write_text(cli.config.read_text().replace("/jobs.db", "/evidence/jobs.db"))
    prefix = read_only_mount(copy)
    if prefix is None:
        if os.geteuid() == 0:
            pytest.skip("no read-only bind mount here (root ignores chmod)")
        (copy / "jobs.db").chmod(0o444)
        copy.chmod(0o555)
        prefix = []
    return Cli(cli.tmp, config, cli.env), prefix


def run_prefixed(cli: Cli, prefix: list[str], *args: str) -> str:
    command = [*prefix, str(JOBLEDGER), *args, "--config", str(cli.config)]
    result = subprocess.run(
        command, capture_output=True, text=True, env=cli.env, cwd=cli.tmp, timeout=60
    )
    assert result.returncode == 0, (args, result.returncode, result.stderr)
    return result.stdout


def view_tables(store_url: str) -> list[str]:
    """The status view's tables as the store's catalog lists them."""
    if store_url.startswith("sqlite"):
        return []  # the copy is read-only: nothing can have been made there
    schema = store_url.rsplit("schema=", 1)[1]
    with psycopg.connect(store_url.split("?")[0]) as conn:
        rows = conn.execute(
            "SELECT tablename FROM pg_catalog.pg_tables WHERE schemaname = %s "
            "AND tablename = 'jobledger_job_status'",
            (schema,),
        ).fetchall()
    return [row[0] for row in rows]


@pytest.mark.parametrize("views", ["never made", "behind the log"])
def test_list_and_show_work_on_a_read_only_store_without_current_views(
    tmp_path: Path, store_url: str, views: str
) -> None:
    """The views are made by the first command that lists and kept up by the next; a
    store read where nothing may be written, whose views were never made or are behind
    its log, lists from its events instead (exit 0, the same rows as the views once they
    are made), and shows its jobs."""
    live = make_cli(tmp_path, store_url)
    live.ok("submit", "acme", "t1", "ticket")
    if views == "behind the log":
        live.ok("list")
    live.ok("tick", "acme", "t1")
    live.ok("submit", "acme", "t2", "ticket", "--mission", "m7")
    live.ok("submit", "globex", "t3", "ticket")
    reader, prefix = read_only_runner(live, store_url)
    before = listing(tmp_path / "evidence") if store_url.startswith("sqlite") else {}
    try:
        listed = json.loads(run_prefixed(reader, prefix, "list", "--json"))
        narrowed = json.loads(
            run_prefixed(reader, prefix, "list", "--tenant", "acme", "--status", "queued", "--json")
        )
        plain = run_prefixed(reader, prefix, "list", "-o", "plain")
        shown = json.loads(run_prefixed(reader, prefix, "show", "acme", "t1", "--json"))
        status = json.loads(run_prefixed(reader, prefix, "projections", "status", "--json"))
    finally:
        if store_url.startswith("sqlite"):
            (tmp_path / "evidence").chmod(0o755)
    if views == "never made":
        assert view_tables(store_url) == []  # nothing was made in the store
        # Truthful about the store's views: none applied anything.
        assert [entry["last_tracked"] for entry in status] == [0]
    else:
        assert [entry["last_tracked"] for entry in status] == [1]
    if store_url.startswith("sqlite"):
        assert listing(tmp_path / "evidence") == before
    # The store's own views: made by a list that may write.
    assert listed == live.json("list")
    assert [row["job_id"] for row in narrowed] == ["t2"]
    assert narrowed == live.json("list", "--tenant", "acme", "--status", "queued")
    assert plain == live.ok("list", "-o", "plain")
    assert shown == live.json("show", "acme", "t1")
    assert shown["status"] == "waiting_event"
