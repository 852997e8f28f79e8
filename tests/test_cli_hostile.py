"""Hostile input at the console script: each gives its documented exit code and a one-line
error naming what was wrong, never a traceback, a hang or a password, and writes nothing.

Exit codes (README): 1 refused or invalid, 2 usage, 3 store or configuration.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import typer.main

from jobledger.cli import app, main
from jobledger.domain.identity import job_uuid
from tests.support.audit import RawEvents
from tests.support.cli import TICKET, Cli, make_cli
from tests.test_hostile_input import alias_bomb

SECRET = "S3CRET-pw"


@pytest.fixture
def sqlite_cli(tmp_path: Path) -> Cli:
    return make_cli(tmp_path, f"sqlite:///{tmp_path}/jobs.db")


def one_line(cli: Cli, code: int, *args: str, config: bool = True) -> str:
    """The command exits ``code`` with nothing on stdout and one ``error:`` line (exit 2:
    typer's usage box) on stderr; returns that line."""
    result = cli(*args, config=config)
    assert result.returncode == code, (args, result.returncode, result.stdout, result.stderr)
    if code == 2:
        return " ".join(result.stderr.replace("│", " ").split())
    assert result.stdout == "", (args, result.stdout)
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), (args, result.stderr)
    return lines[0]


# ---- definitions, JSON arguments and numbers ---------------------------------------------


def test_an_alias_bomb_in_the_definitions_folder_is_a_definition_problem(sqlite_cli: Cli) -> None:
    (sqlite_cli.tmp / "definitions" / "bomb.yaml").write_text(alias_bomb(9))
    line = one_line(sqlite_cli, 1, "definitions", "check")
    assert "bomb.yaml: malformed YAML" in line and "expands to more than 100000 nodes" in line
    line = one_line(sqlite_cli, 1, "submit", "acme", "t1", "ticket")
    assert "expands to more than 100000 nodes" in line
    assert not (sqlite_cli.tmp / "jobs.db").exists()


def test_a_deep_or_huge_input_is_a_usage_error(sqlite_cli: Cli) -> None:
    deep = "{" + '"a":[' * 100_000 + "]" * 100_000 + "}"
    (sqlite_cli.tmp / "deep.json").write_text(deep)
    says = one_line(sqlite_cli, 2, "submit", "acme", "t1", "ticket", "--input", "@deep.json")
    assert "Invalid value for '--input': nested deeper than 100 levels" in says
    huge = '{"n": ' + "7" * 5000 + "}"
    says = one_line(sqlite_cli, 2, "submit", "acme", "t1", "ticket", "--input", huge)
    assert "Invalid value for '--input': an integer of 5000 digits is over the limit" in says
    says = one_line(
        sqlite_cli, 2, "signal", "acme", "t1", "e", "--id", "s", "--payload", "@deep.json"
    )
    assert "Invalid value for '--payload': nested deeper than 100 levels" in says
    assert not (sqlite_cli.tmp / "jobs.db").exists()


@pytest.mark.parametrize("constant", ["NaN", "Infinity", "-Infinity"])
def test_a_json_constant_that_is_not_json_is_a_usage_error(sqlite_cli: Cli, constant: str) -> None:
    """Python's json reads NaN and Infinity; RFC 8259 has no such numbers: JSON that
    does not parse, exit 2 as README says (it was exit 1, refused later by the engine)."""
    says = one_line(
        sqlite_cli, 2, "submit", "acme", "t1", "ticket", "--input", f'{{"a": {constant}}}'
    )
    assert f"Invalid value for '--input': {constant} is not a JSON number" in says
    assert not (sqlite_cli.tmp / "jobs.db").exists()


@pytest.mark.parametrize(
    ("option", "args"),
    [
        ("--limit", ("list",)),
        ("--at-version", ("show", "acme", "t1")),
        ("--version", ("submit", "acme", "t1", "ticket")),
        ("--to-version", ("migrate", "acme", "t1")),
    ],
)
def test_a_huge_number_is_a_usage_error(
    sqlite_cli: Cli, option: str, args: tuple[str, ...]
) -> None:
    says = one_line(sqlite_cli, 2, *args, option, "99999999999999999999")
    assert f"Invalid value for '{option}': Input should be less than or equal to {2**63 - 1}" in (
        says
    )


def test_a_deeply_nested_config_file_is_a_config_error(sqlite_cli: Cli) -> None:
    (sqlite_cli.tmp / "deep.toml").write_text("x = " + "[" * 100_000 + "]" * 100_000 + "\n")
    line = one_line(sqlite_cli, 3, "list", "--config", "deep.toml", config=False)
    assert line == "error: config file 'deep.toml' is not valid TOML: nested too deep"


# ---- store URLs, and passwords never printed ---------------------------------------------


def unreachable(schema: str = "") -> str:
    query = "connect_timeout=1" + (f"&schema={schema}" if schema else "")
    return f"postgresql://jobledger:{SECRET}@127.0.0.1:1/jobledger?{query}"


@pytest.mark.parametrize(
    ("url", "says"),
    [
        (
            f"postgresql://u:{SECRET}@127.0.0.1:99999/db",
            "error: PostgreSQL URL 'postgresql://u:***@127.0.0.1:99999/db': port must be a "
            "number from 1 to 65535",
        ),
        (
            unreachable("Audit"),
            "error: PostgreSQL URL 'postgresql://jobledger:***@127.0.0.1:1/jobledger?"
            "connect_timeout=1&schema=Audit': schema 'Audit' is not allowed: use a lower-case "
            "identifier (a letter or _, then letters, digits or _; at most 63 characters)",
        ),
        (
            f"postgresql://u:{SECRET}@/db",
            "error: PostgreSQL URL 'postgresql://u:***@/db' needs a host and a database name",
        ),
        (unreachable(), "error: cannot open the postgresql store: "),
    ],
)
def test_a_bad_or_unreachable_store_url_is_exit_3_without_its_password(
    sqlite_cli: Cli, url: str, says: str
) -> None:
    for command in (("list",), ("show", "acme", "t1")):
        line = one_line(sqlite_cli, 3, *command, "--store", url)
        assert line.startswith(says), line
        assert SECRET not in line


HOSTLESS = f"postgresql://jobledger:{SECRET}@/jobledger"
ORDERS = json.dumps([{"name": "orders", "topic": "orders", "tenant": "acme", "workflow": "ticket"}])


def every_command() -> list[tuple[str, ...]]:
    """The path of every command of the app, subcommands included."""
    found: list[tuple[str, ...]] = []

    def walk(command: object, path: tuple[str, ...]) -> None:
        children = getattr(command, "commands", None)
        if children is None:
            found.append(path)
            return
        for name, child in children.items():
            walk(child, (*path, name))

    walk(typer.main.get_command(app), ())
    return sorted(found)


# The arguments each command needs to get as far as opening the store.
ARGUMENTS: dict[tuple[str, ...], tuple[str, ...]] = {
    ("anchor",): ("--file", "anchors.jsonl"),
    ("approve",): ("acme", "t1", "--by", "lead"),
    ("archive",): ("--older-than", "30", "--to", "archive"),
    ("batches", "list"): ("acme",),
    ("batches", "resume"): ("acme", "b1"),
    ("batches", "show"): ("acme", "b1"),
    ("bulk", "cancel"): ("acme", "--by", "ops", "--reason", "r", "--status", "failed"),
    ("bulk", "migrate"): (
        *("acme", "--to-version", "2", "--by", "ops", "--reason", "r", "--workflow", "ticket"),
    ),
    ("bulk", "raise-budget"): (
        *("acme", "--by", "ops", "--reason", "r", "--max-steps", "5", "--status", "failed"),
    ),
    ("bulk", "reset"): ("acme", "--step", "1", "--by", "ops", "--reason", "r", "--all"),
    ("bulk", "retry"): ("acme", "--by", "ops", "--reason", "r", "--status", "failed"),
    ("bulk", "signal"): ("acme", "paid", "--by", "ops", "--reason", "r", "--all"),
    ("dead-letters", "list"): (),
    ("dead-letters", "redrive"): ("--all",),
    ("dead-letters", "show"): ("ticks:0:0",),
    ("fork",): ("acme", "t1", "--step", "1", "--new-job-id", "t2", "--by", "ops", "--reason", "r"),
    ("reset",): ("acme", "t1", "--step", "1", "--by", "ops", "--reason", "r"),
    ("restore",): ("acme", "t1"),
    ("retry",): ("acme", "t1", "--by", "ops", "--reason", "r"),
    ("tombstones", "list"): (),
    ("cancel",): ("acme", "t1", "--reason", "r", "--by", "ops"),
    ("config", "show"): (),
    ("definitions", "check"): (),
    ("demo",): (),
    ("erase",): ("acme", "--subject", "ada", "--reason", "asked", "--by", "dpo"),
    ("export",): ("--all",),
    ("history",): ("acme", "t1"),
    ("import",): ("export.jsonl",),
    ("list",): (),
    ("migrate",): ("acme", "t1", "--to-version", "2"),
    ("projections", "rebuild"): (),
    ("raise-budget",): ("acme", "t1", "--by", "ops", "--reason", "r", "--max-steps", "5"),
    ("projections", "run"): (),
    ("projections", "status"): (),
    ("reconcile",): ("--once",),
    ("reject",): ("acme", "t1", "--by", "lead"),
    ("reassign",): ("acme", "t1", "--to", "dave", "--by", "ops", "--reason", "r"),
    ("replay",): ("--definition", "definitions/ticket.yaml", "--all"),
    ("resume",): ("--token", "not-a-token"),
    ("run",): (),
    ("schedule", "create"): (
        *("acme", "s1", "--cron", "0 7 * * *", "--timezone", "UTC", "--workflow", "ticket"),
    ),
    ("schedule", "delete"): ("acme", "s1"),
    ("schedule", "history"): ("acme", "s1"),
    ("schedule", "list"): ("acme",),
    ("schedule", "pause"): ("acme", "s1"),
    ("schedule", "resume"): ("acme", "s1"),
    ("schedule", "trigger"): ("acme", "s1"),
    ("serve",): ("--port", "0"),
    ("subscriptions", "list"): (),
    ("subscriptions", "pause"): ("orders", "--reason", "r"),
    ("subscriptions", "resume"): ("orders",),
    ("show",): ("acme", "t1"),
    ("signal",): ("acme", "t1", "paid", "--id", "s1"),
    ("submit",): ("acme", "t1", "ticket"),
    ("tick",): ("acme", "t1"),
    ("token", "reissue"): ("acme", "t1", "--by", "ops"),
    ("verify",): ("--all",),
    ("worker",): (),
}
# Commands that open no store (they take no --store): their arguments for a run that works.
NO_STORE: dict[tuple[str, ...], tuple[str, ...]] = {
    ("keys", "generate"): ("k1", "--dir", "keys"),
    ("keys", "list"): ("--keyring", "keys/keyring.json"),
    ("keys", "retire"): ("k1", "--at", "2030-01-01T00:00:00Z", "--keys", "keys/signing-keys.json"),
}


def run_in_process(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    """``jobledger ARGS`` through the console script's own entry point, in this process
    (a subprocess per command would take minutes here); an exception it does not turn
    into an exit code propagates and fails the test, as a traceback would."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(sys, "argv", ["jobledger", *args])
        try:
            main()
            code = 0
        except SystemExit as done:
            code = int(done.code or 0)
    out, err = capsys.readouterr()
    return code, out, err


def test_no_command_prints_the_store_password(
    sqlite_cli: Cli, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every command, given a PostgreSQL URL with a password that is unreachable (by
    --store: the driver's error) or has no host (by JOBLEDGER_STORE_URL: the URL's own
    error, which printed the password before), fails with exit 3 and never prints it."""
    cli = sqlite_cli
    assert every_command() == sorted([*ARGUMENTS, *NO_STORE]), (
        "a new command needs its arguments here"
    )
    monkeypatch.chdir(cli.tmp)
    monkeypatch.syspath_prepend(str(cli.tmp))
    monkeypatch.setenv("JOBLEDGER_STORE_URL", HOSTLESS)
    monkeypatch.setenv("JOBLEDGER_KAFKA_SEND_TIMEOUT_MS", "1000")  # no broker: fail fast
    for path, arguments in NO_STORE.items():
        code, out, err = run_in_process([*path, *arguments], capsys)
        assert code == 0 and SECRET not in out + err, (path, code, out, err)
    (cli.tmp / "export.jsonl").write_text("{}\n")
    for path, arguments in ARGUMENTS.items():
        for by_option in (True, False):
            if by_option:
                monkeypatch.delenv("JOBLEDGER_STORE_URL", raising=False)
                store = ["--store", unreachable()]
            else:
                monkeypatch.setenv("JOBLEDGER_STORE_URL", HOSTLESS)
                store = []
            monkeypatch.setenv("JOBLEDGER_DEFINITIONS", str(cli.tmp / "definitions"))
            monkeypatch.setenv("JOBLEDGER_EXECUTOR", "tests.support.cli:RecordingExecutor")
            # serve checks it can authenticate callers before it opens the store.
            monkeypatch.setenv("JOBLEDGER_HTTP_API_KEYS_FILE", str(cli.tmp / "keys.json"))
            if path[0] == "subscriptions":  # one to list, pause and resume
                monkeypatch.setenv("JOBLEDGER_SUBSCRIPTIONS", ORDERS)
            else:
                monkeypatch.delenv("JOBLEDGER_SUBSCRIPTIONS", raising=False)
            code, out, err = run_in_process([*path, *arguments, *store], capsys)
            assert SECRET not in out + err, (path, store, out, err)
            if path == ("config", "show"):  # it prints the URL, redacted, and opens no store
                assert code == 0 and "***" in out, (path, err)
                continue
            if path in (("definitions", "check"), ("demo",)) and not by_option:
                # definitions check reads a store only when given --store; the demo picks
                # its own unless given one.
                assert code == 0, (path, err)
                continue
            if path[0] in ("dead-letters", "subscriptions"):
                # Dead letters and subscriptions live on Kafka, not in the store: none is
                # reachable here.
                assert code == 4 and "cannot reach Kafka" in err, (path, store, code, err)
                continue
            assert code == 3, (path, store, code, out, err)
            assert "cannot open the postgresql store" in err or "needs a host" in err, (path, err)


# ---- a broken history ---------------------------------------------------------------------


def test_a_broken_history_is_exit_3_naming_where(sqlite_cli: Cli) -> None:
    cli = sqlite_cli
    cli.ok("submit", "acme", "t1", "ticket")
    cli.ok("tick", "acme", "t1")
    url = f"sqlite:///{cli.tmp}/jobs.db"
    assert RawEvents(url).delete(job_uuid("acme", "t1"), 2) == 1
    expected = "error: history of acme/t1 is broken at v2 (run jobledger verify)"
    (cli.tmp / "ticket.yaml").write_text(TICKET)
    for args in (
        ("show", "acme", "t1"),
        ("history", "acme", "t1"),
        ("cancel", "acme", "t1", "--reason", "r", "--by", "ops"),
        ("replay", "--definition", "ticket.yaml", "acme", "t1"),
    ):
        assert one_line(cli, 3, *args) == expected
    broken = cli("verify", "acme", "t1")  # verify reads the raw rows and names the gap
    assert broken.returncode == 1 and "v2" in broken.stderr
