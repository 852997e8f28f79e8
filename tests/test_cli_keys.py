"""``jobledger keys`` as a user runs it (the console script), and where a process finds its
signing keys and keyring: flag > environment > the config file's ``[signing]`` table."""

from __future__ import annotations

import json
import stat
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from jobledger.adapters.signing import Ed25519Signer, Keyring
from jobledger.cli.config_file import load_settings
from jobledger.domain.errors import ConfigError
from tests.support.cli import NOTE, run_jobledger


def ok(cwd: Path, *args: str, **env: str) -> str:
    result = run_jobledger(*args, cwd=cwd, **env)
    assert result.returncode == 0, (args, result.stderr)
    assert "Traceback" not in result.stderr
    return result.stdout


def fails(cwd: Path, code: int, *args: str, **env: str) -> str:
    result = run_jobledger(*args, cwd=cwd, **env)
    assert result.returncode == code, (args, result.returncode, result.stdout, result.stderr)
    assert "Traceback" not in result.stderr
    return " ".join(result.stderr.replace("│", " ").split())


def listed(cwd: Path, *args: str, **env: str) -> dict[str, Any]:
    document: dict[str, Any] = json.loads(ok(cwd, "keys", "list", "--json", *args, **env))
    return document


def test_generate_writes_a_private_key_an_entry_and_a_public_key(tmp_path: Path) -> None:
    out = ok(tmp_path, "keys", "generate", "k1", "--dir", "keys", "--not-before", "2026-01-01")
    assert "generated key 'k1'" in out
    pem = tmp_path / "keys" / "k1.pem"
    assert stat.S_IMODE(pem.stat().st_mode) == 0o600
    entries = json.loads((tmp_path / "keys" / "signing-keys.json").read_text())
    assert entries == [
        {
            "id": "k1",
            "private_key_file": "k1.pem",
            "not_before": "2026-01-01T00:00:00+00:00",
            "not_after": None,
        }
    ]
    keyring = json.loads((tmp_path / "keys" / "keyring.json").read_text())
    assert keyring["format"] == "jobledger.keyring/1"
    assert [k["id"] for k in keyring["keys"]] == ["k1"]
    # What the files hold works: the writer's signature verifies by the published key.
    signer = Ed25519Signer.from_file(tmp_path / "keys" / "signing-keys.json")
    at = datetime(2026, 2, 1, tzinfo=UTC)
    assert (
        Keyring.from_file(tmp_path / "keys" / "keyring.json").check(
            *signer.sign("ab" * 32, at), "ab" * 32, at
        )
        is None
    )


def test_generate_refuses_to_overwrite_or_reuse_an_id(tmp_path: Path) -> None:
    ok(tmp_path, "keys", "generate", "k1", "--dir", "keys")
    before = {p.name: p.read_bytes() for p in (tmp_path / "keys").iterdir()}
    assert "key 'k1' is already in" in fails(tmp_path, 3, "keys", "generate", "k1", "--dir", "keys")
    # Another keys file, the same directory: the private key file is not overwritten.
    error = fails(
        tmp_path,
        3,
        "keys",
        "generate",
        "k1",
        "--dir",
        "keys",
        "--keys",
        "o.json",
        "--keyring",
        "r.json",
    )
    assert "exists: a key file is never overwritten" in error
    assert not (tmp_path / "o.json").exists() and not (tmp_path / "r.json").exists()
    assert {p.name: p.read_bytes() for p in (tmp_path / "keys").iterdir()} == before
    assert "use letters, digits" in fails(tmp_path, 2, "keys", "generate", "../k", "--dir", "keys")
    window = fails(
        tmp_path, 3, "keys", "generate", "k2", "--dir", "keys",
        "--not-before", "2026-02-01", "--not-after", "2026-01-01",
    )  # fmt: skip
    assert "not_after must be later than not_before" in window
    assert not (tmp_path / "keys" / "k2.pem").exists()


def test_rotation_by_generate_and_retire_shows_in_list(tmp_path: Path) -> None:
    files = ("--keys", "keys/signing-keys.json", "--keyring", "keys/keyring.json")
    ok(tmp_path, "keys", "generate", "old", "--dir", "keys", "--not-before", "2020-01-01")
    ok(tmp_path, "keys", "generate", "new", "--dir", "keys", "--not-before", "2021-01-01")
    assert [row["status"] for row in listed(tmp_path, *files)["keys"]] == ["valid", "active"]
    assert "retired key 'old' at 2021-01-01T00:00:00+00:00" in ok(
        tmp_path, "keys", "retire", "old", "--at", "2021-01-01", *files
    )
    rows = listed(tmp_path, *files)["keys"]
    assert [(r["id"], r["status"], r["not_after"], r["keyring"]) for r in rows] == [
        ("old", "retired", "2021-01-01T00:00:00+00:00", "yes"),
        ("new", "active", None, "yes"),
    ]
    public = json.loads((tmp_path / "keys" / "keyring.json").read_text())["keys"]
    assert public[0]["not_after"] == "2021-01-01T00:00:00+00:00"
    table = ok(tmp_path, "keys", "list", *files)
    assert "retired" in table and "active" in table
    # A key is not revived by a later retirement, and an unknown key is named.
    assert "already retired" in fails(
        tmp_path, 3, "keys", "retire", "old", "--at", "2022-01-01", *files
    )
    assert "no key 'gone'" in fails(
        tmp_path, 3, "keys", "retire", "gone", "--at", "2022-01-01", *files
    )


def test_retiring_the_last_key_warns_that_writers_will_refuse(tmp_path: Path) -> None:
    ok(tmp_path, "keys", "generate", "k1", "--dir", "keys", "--not-before", "2020-01-01")
    out = ok(
        tmp_path, "keys", "retire", "k1", "--at", "2030-01-01", "--keys", "keys/signing-keys.json"
    )
    assert "no key in keys/signing-keys.json is valid at 2030-01-01T00:00:00+00:00" in out
    # Only the keys file was named: the keyring keeps its window until it is published.
    assert (
        json.loads((tmp_path / "keys" / "keyring.json").read_text())["keys"][0]["not_after"] is None
    )


def test_list_names_keys_the_keyring_does_not_publish(tmp_path: Path) -> None:
    ok(tmp_path, "keys", "generate", "k1", "--dir", "keys", "--not-before", "2020-01-01")
    ok(
        tmp_path, "keys", "generate", "k2", "--dir", "keys", "--not-before", "2020-01-01",
        "--keyring", "other-keyring.json",
    )  # fmt: skip
    rows = listed(tmp_path, "--keys", "keys/signing-keys.json", "--keyring", "keys/keyring.json")
    assert {r["id"]: r["keyring"] for r in rows["keys"]} == {"k1": "yes", "k2": "no"}
    assert "no signing-keys file or keyring" in fails(tmp_path, 3, "keys", "list")


def test_a_malformed_key_file_is_named_by_the_cli(tmp_path: Path) -> None:
    (tmp_path / "keyring.json").write_text('{"format": "jobledger.keyring/0", "keys": []}')
    error = fails(tmp_path, 3, "keys", "list", "--keyring", "keyring.json")
    assert "keyring 'keyring.json': format must be 'jobledger.keyring/1'" in error
    (tmp_path / "keys.json").write_text("[{}]")
    error = fails(tmp_path, 3, "keys", "generate", "k1", "--dir", ".", "--keys", "keys.json")
    assert "key 1: missing id, private_key_file, not_before, not_after" in error
    assert not (tmp_path / "k1.pem").exists()


# ---- where a process finds them ------------------------------------------------------------


def test_the_config_file_names_them_relative_to_itself_and_show_lists_them(tmp_path: Path) -> None:
    (tmp_path / "etc").mkdir()
    (tmp_path / "etc" / "jobledger.toml").write_text(
        '[signing]\nkeys = "keys/signing-keys.json"\nkeyring = "public/keyring.json"\n'
    )
    shown = json.loads(ok(tmp_path, "config", "show", "--json", "--config", "etc/jobledger.toml"))
    rows = {row["setting"]: row for row in shown["settings"]}
    assert rows["signing_keys"]["value"] == "etc/keys/signing-keys.json"
    assert rows["signing_keys"]["source"] == "file etc/jobledger.toml"
    assert rows["keyring"]["value"] == "etc/public/keyring.json"
    # The environment beats the file.
    shown = json.loads(
        ok(
            tmp_path,
            "config",
            "show",
            "--json",
            "--config",
            "etc/jobledger.toml",
            JOBLEDGER_KEYRING="elsewhere.json",
        )
    )
    rows = {row["setting"]: row for row in shown["settings"]}
    assert rows["keyring"] == {
        "setting": "keyring",
        "value": "elsewhere.json",
        "source": "env JOBLEDGER_KEYRING",
    }
    assert rows["signing_keys"]["source"] == "file etc/jobledger.toml"


def test_keys_commands_take_the_flag_over_the_environment_over_the_file(tmp_path: Path) -> None:
    (tmp_path / "jobledger.toml").write_text(
        '[signing]\nkeys = "file-keys.json"\nkeyring = "file-keyring.json"\n'
    )
    ok(tmp_path, "keys", "generate", "f", "--dir", "k")  # the configured files
    ok(tmp_path, "keys", "generate", "e", "--dir", "k", JOBLEDGER_SIGNING_KEYS="env-keys.json")
    ok(tmp_path, "keys", "generate", "x", "--dir", "k", "--keys", "flag-keys.json")
    ids = {
        name: [e["id"] for e in json.loads((tmp_path / name).read_text())]
        for name in ("file-keys.json", "env-keys.json", "flag-keys.json")
    }
    assert ids == {"file-keys.json": ["f"], "env-keys.json": ["e"], "flag-keys.json": ["x"]}
    published = json.loads((tmp_path / "file-keyring.json").read_text())["keys"]
    assert [k["id"] for k in published] == ["f", "e", "x"]
    assert [r["id"] for r in listed(tmp_path)["keys"]] == ["f", "e", "x"]


def test_a_bad_signing_table_is_reported_in_words(tmp_path: Path) -> None:
    config = tmp_path / "jobledger.toml"
    cases = {
        '[signing]\nkey = "k.json"\n': "unknown [signing] setting 'key' (known: keys, keyring)",
        'signing = "k.json"\n': "[signing] must be a table",
        '[signing]\nkeys = ""\n': "signing.keys must be a non-empty string",
        'keyring = "k.json"\n': "set keyring in the [signing] table: keyring = FILE",
    }
    for text, expected in cases.items():
        config.write_text(text)
        try:
            load_settings(config, None)
        except ConfigError as error:
            assert expected in str(error)
        else:
            raise AssertionError(f"{text!r} was accepted")
    config.write_text('[signing]\nkey = "k.json"\n')
    assert "unknown [signing] setting 'key'" in fails(tmp_path, 3, "config", "show")


def test_a_writer_without_a_usable_key_writes_nothing_and_says_why(tmp_path: Path) -> None:
    (tmp_path / "definitions").mkdir()
    (tmp_path / "definitions" / "note.yaml").write_text(NOTE)
    (tmp_path / "jobledger.toml").write_text(
        'store_url = "sqlite:///jobs.db"\ndefinitions = "definitions"\n'
        '[signing]\nkeys = "keys/signing-keys.json"\n'
    )
    missing = fails(tmp_path, 3, "submit", "acme", "n1", "note")
    assert "cannot read signing-keys file" in missing and "keys/signing-keys.json" in missing
    ok(tmp_path, "keys", "generate", "k1", "--dir", "keys", "--not-before", "2020-01-01")
    ok(tmp_path, "keys", "retire", "k1", "--at", "2021-01-01")
    expired = fails(tmp_path, 3, "submit", "acme", "n1", "note")
    assert "no signing key is valid at" in expired
    assert "'k1' from 2020-01-01T00:00:00+00:00 until 2021-01-01T00:00:00+00:00" in expired
    # Nothing was written: the store holds no job (a reading command needs no key).
    assert "no job 'n1'" in fails(tmp_path, 1, "show", "acme", "n1")
