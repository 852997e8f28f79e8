"""Read-only means read-only; a missing store is not an empty one.

Reading commands never create a SQLite store (a typo must not audit as "all intact"),
and reading an existing store writes nothing to its directory: no lock file, no DDL.
On a really read-only filesystem (an evidence copy) they work as usual.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

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
