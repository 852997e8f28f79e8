"""README.md is literal: its Python blocks run as written, in order, as one session, and
its set-up command works when pasted into a fresh shell on a fresh copy of the project."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"


def python_blocks() -> list[tuple[int, str]]:
    text = README.read_text(encoding="utf-8")
    return [
        (text.count("\n", 0, match.start()) + 2, match.group(1))
        for match in re.finditer(r"```python\n(.*?)```", text, re.DOTALL)
    ]


def test_the_readme_has_python_blocks_to_run() -> None:
    assert len(python_blocks()) >= 3


def test_every_python_block_of_the_readme_runs_in_order(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "examples").symlink_to(ROOT / "examples")
    monkeypatch.chdir(tmp_path)
    for name in list(os.environ):
        if name.startswith("JOBLEDGER_"):
            monkeypatch.delenv(name)
    session: dict[str, object] = {"__name__": "readme"}
    for line, source in python_blocks():
        try:
            exec(compile(source, f"README.md:{line}", "exec"), session)
        except Exception as error:
            pytest.fail(f"the README's Python block at line {line} raised {error!r}")
    assert (tmp_path / "jobs.db").exists() and (tmp_path / "missions.db").exists()


def readme_command(name: str) -> str:
    result = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "readme-command"), name],
        capture_output=True,
        text=True,
        check=True,
    )
    return result.stdout.strip()


def fresh_copy(destination: Path) -> Path:
    """The project as a new clone has it: the files git tracks, nothing built."""
    files = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"],
        cwd=ROOT,
        capture_output=True,
        check=True,
    ).stdout.split(b"\0")
    for name in filter(None, files):
        source = ROOT / name.decode()
        target = destination / name.decode()
        if source.is_symlink():  # src/jobledger/projections: a clone has the link too
            target.parent.mkdir(parents=True, exist_ok=True)
            target.symlink_to(source.readlink())
        elif source.is_file():
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target)
    return destination


def test_the_readme_demo_command_works_pasted_into_a_fresh_shell(tmp_path: Path) -> None:
    project = fresh_copy(tmp_path / "jobledger")
    # A fresh shell: no virtual environment active, no jobledger on the PATH.
    path = os.pathsep.join(
        entry
        for entry in os.environ["PATH"].split(os.pathsep)
        if not (Path(entry) / "activate").exists()
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith(("JOBLEDGER_", "VIRTUAL_ENV"))}
    env.pop("PYTHONPATH", None)
    env["PATH"] = path
    result = subprocess.run(
        ["bash", "-c", readme_command("demo")],
        cwd=project,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    assert "all 10 checks passed" in result.stdout
    assert (project / ".venv" / "bin" / "jobledger").exists()
