"""The demo mission written as code (jobledger/demo/mission_code.py) passes the same ten
checks as its YAML, on both stores, and ``jobledger demo --code`` says so."""

from __future__ import annotations

import io
import re
import subprocess
import sys
from pathlib import Path

from rich.console import Console

from jobledger.config import EngineConfig
from jobledger.demo.run import run_demo

CHECKS = (
    "agent step",
    "worker crash",
    "no step re-run",
    "durable timer",
    "outside event",
    "human approval",
    "cost ceiling",
    "completed",
    "chain verified",
    "fan-out join",
)


def demo_output(store_url: str | None, *, code: bool) -> tuple[bool, str]:
    out = io.StringIO()
    passed = run_demo(
        base=EngineConfig(),
        store_url=store_url,
        keep=False,
        out=Console(file=out, width=200, no_color=True),
        code=code,
    )
    return passed, out.getvalue()


def checks_passed(output: str) -> list[str]:
    return re.findall(r"^  PASS  (.+?)\s{2,}", output, flags=re.MULTILINE)


def test_the_code_mission_passes_the_same_checks_as_the_yaml_one(store_url: str) -> None:
    passed, output = demo_output(store_url, code=True)
    assert passed, output
    assert checks_passed(output) == list(CHECKS)
    assert "FAIL" not in output and "all 10 checks passed" in output
    assert "'demo_mission_code' v1" in output and "mission_code.py" in output
    # The same story, told by the code mission's own records.
    assert "took over from worker-1 (lease expired)" in output
    assert "the resume token was already used" in output
    assert "CostCeilingDeferred" in output and "total cost $1.40" in output
    for step in ("count_words", "summarise", "sleep", "wait_event", "draft_brief", "review"):
        assert f"│ {step}" in output, step


def test_the_yaml_mission_is_still_the_default(store_url: str) -> None:
    passed, output = demo_output(store_url, code=False)
    assert passed and checks_passed(output) == list(CHECKS)
    assert "'demo_mission' v1" in output and "mission.yaml" in output
    assert "demo_mission_code" not in output


def test_jobledger_demo_code_from_the_command_line(tmp_path: Path) -> None:
    result = subprocess.run(
        [str(Path(sys.executable).parent / "jobledger"), "demo", "--code"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=120,
        env={"PATH": str(Path(sys.executable).parent), "COLUMNS": "80", "HOME": str(tmp_path)},
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.rstrip().endswith("all 10 checks passed")
    assert "…" not in result.stdout  # fits 80 columns without cutting anything
