"""Issue 26 item 1 through the real console script: the ``workflows`` setting (config
file, JOBLEDGER_WORKFLOWS, ``--workflows``) serves code workflows and their step
functions beside definitions; ``definitions check`` names task names missing on either
side; a deployment that names an unserved task is refused at load; ``migrate`` moves a
job to a new code version that replays it; SIGHUP keeps the code workflows served."""

from __future__ import annotations

import json
import logging
import os
import signal
import textwrap
from pathlib import Path

import pytest

from jobledger import JobStatus
from jobledger.cli.reloading import reload_on_sighup
from jobledger.cli.session import open_engine
from tests.support.cli import NOTE, Cli, make_cli
from tests.support.engines import TOKEN_SECRET

FLOW = """
from jobledger import WorkflowContext, step, workflow


@step
def draft(topic: str) -> str:
    return f"draft of {topic}"


@step
def polish(text: str) -> str:
    return text.upper()


@workflow("brief", version=1)
async def brief(wf: WorkflowContext, topic: str) -> str:
    text = await wf.step(draft, topic)
    await wf.wait_event("go")
    return await wf.step(polish, text)
"""
FLOW_V2 = FLOW.replace("version=1)", "version=2)").replace(
    "    return await wf.step(polish, text)",
    '    polished = await wf.step(polish, text)\n    return polished + "!"',
)
WRITE = """
from jobledger import step


@step
def write() -> dict[str, bool]:
    return {"written": True}
"""


@pytest.fixture(autouse=True)
def _writer(tmp_path: Path) -> None:
    """A module of one step function, ``write`` (the note's task)."""
    (tmp_path / "writer.py").write_text(WRITE)


def code_cli(tmp_path: Path, *, definitions: dict[str, str] | None = None) -> Cli:
    """A config with ``workflows = ["flow"]`` (beside it) and no executor; definitions
    only when given (the directory is always made, empty otherwise)."""
    (tmp_path / "flow.py").write_text(FLOW)
    cli = make_cli(
        tmp_path,
        f"sqlite:///{tmp_path}/jobs.db",
        definitions=definitions or {},
        executor="",
        settings='workflows = ["flow"]',
    )
    assert cli.config is not None
    lines = cli.config.read_text().splitlines()
    kept = [line for line in lines if not line.startswith(("executor", "definitions"))]
    if definitions:
        kept.append('definitions = "definitions"')
    cli.config.write_text("\n".join(kept) + "\n")
    return cli


def test_a_code_only_deployment_runs_with_no_definitions_and_no_executor(tmp_path: Path) -> None:
    cli = code_cli(tmp_path)
    assert cli.json("submit", "acme", "b1", "brief", "--input", '{"topic": "tea"}')["status"]
    assert cli.json("tick", "acme", "b1")["job"]["status"] == "waiting_event"
    cli.ok("signal", "acme", "b1", "go", "--id", "s1")
    done = cli.json("tick", "acme", "b1")["job"]
    assert done["status"] == "completed", done
    assert done["state"]["result"] == "DRAFT OF TEA"
    shown = cli.json("config", "show")
    row = next(r for r in shown["settings"] if r["setting"] == "workflows")
    assert row["value"] == ["flow"] and row["source"].startswith("file")


def test_workflows_from_the_environment_and_clear_errors(tmp_path: Path) -> None:
    cli = code_cli(tmp_path)
    assert cli.config is not None
    cli.config.write_text(
        "\n".join(ln for ln in cli.config.read_text().splitlines() if "workflows" not in ln)
    )
    (tmp_path / "broken.py").write_text("value = 1 / 0\n")
    (tmp_path / "empty.py").write_text("NOTHING = 1\n")

    cli.env["JOBLEDGER_WORKFLOWS"] = "flow, broken"
    error = cli.fails(3, "submit", "acme", "b1", "brief")
    assert "workflows module 'broken' does not import: ZeroDivisionError: division by zero" in error
    cli.env["JOBLEDGER_WORKFLOWS"] = "empty"
    error = cli.fails(3, "submit", "acme", "b1", "brief")
    assert "workflows module 'empty' defines no @workflow (nor @step) at module level" in error
    cli.env["JOBLEDGER_WORKFLOWS"] = "flow"
    assert cli.json("submit", "acme", "b1", "brief", "--input", '{"topic": "x"}')


def test_definitions_check_names_tasks_missing_on_either_side(tmp_path: Path) -> None:
    cli = code_cli(tmp_path, definitions={"note.yaml": NOTE})
    checked = cli.json("definitions", "check", "--workflows", "flow", "--workflows", "writer")
    assert checked["ok"] is True  # both modules: 'write' is served
    # Only flow: the note's 'write' task is missing; nothing of flow is unused.
    (tmp_path / "unused.py").write_text(WRITE.replace("def write", "def erase"))
    result = cli("definitions", "check", "--workflows", "flow", "--workflows", "unused", "--json")
    assert result.returncode == 1
    checked = json.loads(result.stdout)
    by_task = {row["task"]: row for row in checked["tasks"]}
    assert by_task["write"]["served_by"] is None
    assert by_task["write"]["named_by"] == ["note v1"]
    assert by_task["erase"]["named_by"] == [] and by_task["erase"]["served_by"] == "function"
    assert by_task["draft"]["problem"] is None
    assert any("no @step function serves it" in p for p in checked["problems"])
    assert any("'erase': a @step function serves it" in p for p in checked["problems"])
    table = cli("definitions", "check", "--workflows", "flow")
    assert table.returncode == 1
    assert "missing" in table.stdout and "brief" in table.stdout
    assert "task 'write' (named by note v1): no @step function serves it" in table.stderr


def test_a_definition_naming_an_unserved_task_is_refused_at_load(tmp_path: Path) -> None:
    cli = code_cli(tmp_path, definitions={"note.yaml": NOTE})
    cli.ok("submit", "acme", "n1", "note")  # submitting runs no step: no check
    error = cli.fails(3, "tick", "acme", "n1")
    assert "tick: no step function serves task 'write' (named by note v1)" in error
    assert "add @step functions for them to the workflows modules (flow)" in error
    cli.env["JOBLEDGER_WORKFLOWS"] = "flow,writer"
    assert cli.json("tick", "acme", "n1")["job"]["status"] == "completed"


def test_migrate_moves_a_job_to_a_code_version_that_replays_it(tmp_path: Path) -> None:
    cli = code_cli(tmp_path)
    (tmp_path / "flow2.py").write_text(FLOW_V2)
    cli.ok("submit", "acme", "b1", "brief", "--input", '{"topic": "tea"}')
    assert cli.json("tick", "acme", "b1")["job"]["status"] == "waiting_event"
    replayed = cli.json("replay", "acme", "b1", "--workflows", "flow")
    assert replayed["safe"] is True

    moved = cli.json("migrate", "acme", "b1", "--to-version", "2", "--workflows", "flow2")
    assert moved["job"]["workflow_version"] == 2 and moved["replay"]["safe"] is True
    cli.env["JOBLEDGER_WORKFLOWS"] = "flow2"
    cli.ok("signal", "acme", "b1", "go", "--id", "s1")
    done = cli.json("tick", "acme", "b1")["job"]
    assert done["status"] == "completed" and done["state"]["result"] == "DRAFT OF TEA!"


def test_a_sighup_reload_keeps_serving_the_code_workflows(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    code_cli(tmp_path, definitions={"note.yaml": NOTE})
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("JOBLEDGER_TOKEN_SECRET", TOKEN_SECRET)
    with open_engine(
        None,
        tmp_path / "jobledger.toml",
        purpose="run",
        definitions=True,
        executor=True,
        workflows=["flow", "writer"],
        mode="create",
    ) as engine:
        (tmp_path / "definitions" / "note2.yaml").write_text(
            NOTE.replace("version: 1", "version: 2")
        )
        with reload_on_sighup(engine, tmp_path / "definitions", None):
            os.kill(os.getpid(), signal.SIGHUP)
        assert engine.registry.known() == [("brief", 1), ("note", 1), ("note", 2)]
        engine.submit("acme", "b1", "brief", input={"topic": "tea"})
        engine.submit("acme", "n1", "note", workflow_version=2)
        engine.signal("acme", "b1", "go", signal_id="s1")
        engine.run_until_idle()
        assert engine.job("acme", "b1").status is JobStatus.COMPLETED
        assert engine.job("acme", "n1").status is JobStatus.COMPLETED

        # New definitions naming a task nothing serves are refused whole; the old kept.
        (tmp_path / "definitions" / "bad.yaml").write_text(
            textwrap.dedent(NOTE)
            .replace("type: note", "type: other")
            .replace("task: write", "task: zzz")
        )
        with (
            caplog.at_level(logging.WARNING, logger="jobledger"),
            reload_on_sighup(engine, tmp_path / "definitions", None),
        ):
            os.kill(os.getpid(), signal.SIGHUP)
        assert "NOT reloaded" in caplog.text
        assert "no step function serves task 'zzz' (named by other v1)" in caplog.text
        assert ("other", 1) not in engine.registry.known()
        assert ("brief", 1) in engine.registry.known()
