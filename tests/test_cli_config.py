"""Where the CLI finds its settings: ./jobledger.toml, then $JOBLEDGER_CONFIG; every path in
the file relative to the file; every problem reported at once, in the user's words."""

from __future__ import annotations

import subprocess
from pathlib import Path

from tests.support.cli import NOTE, run_jobledger

SECRET = "0123456789abcdef0123456789abcdef"
EXECUTOR = """
from jobledger import StepRequest, StepResult

class Writer:
    def execute(self, request: StepRequest) -> StepResult:
        return StepResult(output={"wrote": request.idempotency_key}, cost_usd="0.01")
"""


def run(cwd: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return run_jobledger(*args, cwd=cwd, **env)


def project(directory: Path) -> Path:
    """A config file naming a SQLite store, definitions and an executor module, all by
    paths relative to the file."""
    directory.mkdir(parents=True)
    (directory / "definitions").mkdir()
    (directory / "definitions" / "note.yaml").write_text(NOTE)
    (directory / "writer_executor.py").write_text(EXECUTOR)
    config = directory / "tick.toml"
    config.write_text(
        'store_url = "sqlite:///tick.db"\n'
        'definitions = "definitions"\n'
        'executor = "writer_executor:Writer"\n'
        f'token_secret = "{SECRET}"\n'
    )
    return config


def test_every_path_in_a_config_file_is_relative_to_the_file(tmp_path: Path) -> None:
    config = project(tmp_path / "s1")
    submitted = run(tmp_path, "submit", "t", "j", "note", "--config", "s1/tick.toml")
    assert submitted.returncode == 0, submitted.stderr
    ran = run(tmp_path, "tick", "t", "j", "--config", "s1/tick.toml")
    assert ran.returncode == 0, ran.stderr
    assert (config.parent / "tick.db").exists()
    assert not (tmp_path / "tick.db").exists()  # not a new, empty store where we stand
    shown = run(tmp_path / "s1", "show", "t", "j", "--json", "--config", "tick.toml")
    assert '"completed"' in shown.stdout, shown.stderr


def test_jobledger_toml_in_the_current_directory_is_found_without_config(tmp_path: Path) -> None:
    config = project(tmp_path / "p")
    config.rename(config.with_name("jobledger.toml"))
    assert run(tmp_path / "p", "submit", "t", "j", "note").returncode == 0
    assert (tmp_path / "p" / "tick.db").exists()


def test_jobledger_config_names_the_file_when_there_is_no_local_one(tmp_path: Path) -> None:
    config = project(tmp_path / "p")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    result = run(elsewhere, "submit", "t", "j", "note", JOBLEDGER_CONFIG=str(config))
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "p" / "tick.db").exists()
    assert not list(elsewhere.iterdir())


def test_every_bad_setting_is_reported_at_once_in_the_users_words(tmp_path: Path) -> None:
    (tmp_path / "jobledger.toml").write_text(
        'token_secret = "short"\npartitions = 0\ntransport = "udp"\nlease_mss = 5\n'
    )
    result = run(tmp_path, "list")
    assert result.returncode == 3
    error = " ".join(result.stderr.split())
    assert "token_secret must be at least 32 characters long (it is 5)" in error
    assert "partitions must be at least 1 (got 0)" in error
    assert "transport must be one of 'local' or 'kafka' (got 'udp')" in error
    assert "unknown setting 'lease_mss'" in error
    assert "items after validation" not in error
