"""The console script's help, version and settings report, run for real."""

from __future__ import annotations

import json
from importlib.metadata import version
from pathlib import Path

import pytest

from tests.support.cli import run_jobledger as run

SECRET = "0123456789abcdef0123456789abcdef-secret"


def test_version() -> None:
    result = run("--version")
    assert result.returncode == 0
    assert result.stdout.strip() == f"jobledger {version('jobledger')}"


@pytest.mark.parametrize(
    "command", [(), ("show",), ("list",), ("verify",), ("projections", "run"), ("config", "show")]
)
def test_help_shows_flags_as_flags_and_arguments_by_name(command: tuple[str, ...]) -> None:
    result = run(*command, "--help")
    assert result.returncode == 0, result.stderr
    assert "<bool>" not in result.stdout
    assert "{" not in result.stdout.splitlines()[1]  # the usage line


def test_help_names_arguments_in_capitals() -> None:
    assert "Usage: jobledger show [OPTIONS] TENANT JOB" in run("show", "--help").stdout
    assert "Usage: jobledger verify [OPTIONS] [TENANT] [JOB]" in run("verify", "--help").stdout
    assert "--install-completion" in run("--help").stdout


def test_config_show_says_where_each_setting_came_from_with_secrets_hidden(
    tmp_path: Path,
) -> None:
    (tmp_path / "jobledger.toml").write_text(
        f'token_secret = "{SECRET}"\ncost_ceiling_usd = "50"\ndefinitions = "defs"\n'
    )
    result = run(
        "config",
        "show",
        "--json",
        "--store",
        "postgresql://app:hunter2@db.example/jobs",
        cwd=tmp_path,
        JOBLEDGER_LEASE_MS="20000",
        JOBLEDGER_COST_CEILING_USD="70",
    )
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["config_file"] == "jobledger.toml"
    rows = {row["setting"]: row for row in report["settings"]}
    assert rows["store_url"] == {
        "setting": "store_url",
        "value": "postgresql://app:***@db.example/jobs",
        "source": "flag",
    }
    assert rows["token_secret"]["value"] == "********"
    assert rows["token_secret"]["source"] == "file jobledger.toml"
    assert rows["lease_ms"] == {
        "setting": "lease_ms",
        "value": 20000,
        "source": "env JOBLEDGER_LEASE_MS",
    }
    assert rows["cost_ceiling_usd"]["value"] == "70"  # the environment beats the file
    assert rows["cost_ceiling_usd"]["source"] == "env JOBLEDGER_COST_CEILING_USD"
    assert rows["partitions"] == {"setting": "partitions", "value": 1, "source": "default"}
    assert rows["definitions"]["value"] == "defs"
    assert SECRET not in result.stdout and "hunter2" not in result.stdout
    table = run("config", "show", cwd=tmp_path)
    assert table.returncode == 0 and "token_secret" in table.stdout and SECRET not in table.stdout
