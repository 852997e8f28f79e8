"""``jobledger keys``: make, list and retire the Ed25519 keys writers sign events with.

Two files: the signing-keys file (what a writer loads: each key's id, window and private
key file) and the keyring (the public keys published to whoever verifies). Each command
reads them from ``--keys`` / ``--keyring``, else from the configuration (``[signing]``,
``JOBLEDGER_SIGNING_KEYS``, ``JOBLEDGER_KEYRING``); ``generate`` falls back to files in
its ``--dir``. Every file is checked before any is written, and each is replaced whole
(written beside, then renamed), so a refused command leaves them as they were.
"""

from __future__ import annotations

import json
import os
import re
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any

import typer
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from rich.table import Table

from jobledger.adapters.signing import (
    KEYRING_FORMAT,
    Ed25519Signer,
    Keyring,
    PublicKey,
    SigningKeyError,
    Window,
    parse_time,
    private_pem,
    read_json,
    read_signing_keys,
    utc,
)
from jobledger.cli.config_file import load_settings
from jobledger.cli.params import parse_moment
from jobledger.cli.session import OneShot, one_shot_with
from jobledger.domain.errors import ConfigError
from jobledger.presentation.json_output import print_json
from jobledger.presentation.terminal import console

app = typer.Typer(help="Signing keys: make, list and retire them.", no_args_is_help=True)

KEYS_FILE = "signing-keys.json"
KEYRING_FILE = "keyring.json"
# A key id names its private key file, so it is kept to characters safe in a file name.
KEY_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")

KeysOption = Annotated[
    Path | None,
    typer.Option(
        "--keys",
        metavar="FILE",
        help="The signing-keys file (default: [signing] keys, or JOBLEDGER_SIGNING_KEYS).",
        show_default=False,
    ),
]
KeyringOption = Annotated[
    Path | None,
    typer.Option(
        "--keyring",
        metavar="FILE",
        help="The keyring of public keys (default: [signing] keyring, or JOBLEDGER_KEYRING).",
        show_default=False,
    ),
]


def _moment(name: str, help: str) -> Any:
    return typer.Option(name, parser=parse_moment, metavar="TIME", help=help, show_default=False)


@app.command()
@one_shot_with("config", "json", "logs")
def generate(
    cmd: OneShot,
    key_id: Annotated[str, typer.Argument(metavar="ID", help="The new key's id.")],
    directory: Annotated[
        Path,
        typer.Option("--dir", metavar="DIR", help="Where the private key file is written."),
    ],
    not_before: Annotated[
        datetime | None, _moment("--not-before", "Valid from (ISO 8601; default: now).")
    ] = None,
    not_after: Annotated[
        datetime | None, _moment("--not-after", "Valid until (ISO 8601; default: no end).")
    ] = None,
    keys: KeysOption = None,
    keyring: KeyringOption = None,
) -> None:
    """Make an Ed25519 key: write DIR/ID.pem (mode 0600, never over a file), add it to the
    signing-keys file and its public key to the keyring (each created if missing; by
    default DIR/signing-keys.json and DIR/keyring.json unless configured)."""
    if not KEY_ID.match(key_id):
        raise typer.BadParameter(
            f"{key_id!r}: use letters, digits, '.', '_' and '-' (at most 64, starting with "
            "a letter or digit)",
            param_hint="ID",
        )
    keys_file, keyring_file = _files(keys, keyring, cmd.config, default_dir=directory)
    assert keys_file is not None and keyring_file is not None
    window = _window(not_before or datetime.now(UTC), not_after)
    entries = _signing_entries(keys_file) if keys_file.exists() else []
    published = _keyring(keyring_file) if keyring_file.exists() else {"format": KEYRING_FORMAT}
    for where, ids in ((keys_file, [e["id"] for e in entries]), (keyring_file, _ids(published))):
        if key_id in ids:
            raise ConfigError(f"key {key_id!r} is already in {str(where)!r}")
    pem = directory / f"{key_id}.pem"
    private = Ed25519PrivateKey.generate()
    _write_private_key(pem, private)
    entry = {
        "id": key_id,
        "private_key_file": os.path.relpath(pem.absolute(), keys_file.absolute().parent),
        "not_before": window.not_before.isoformat(),
        "not_after": None if window.not_after is None else window.not_after.isoformat(),
    }
    public = PublicKey(key_id, private.public_key(), window).entry()
    try:
        _replace(keys_file, [*entries, entry])
        _replace(keyring_file, {**published, "keys": [*published.get("keys", []), public]})
    except OSError as error:
        pem.unlink()  # no private key that no file names
        raise ConfigError(f"cannot write the key files: {error}") from None
    if cmd.json:
        print_json({"key": entry, "keys_file": keys_file, "keyring": keyring_file})
        return
    out = console()
    out.print(f"generated key {key_id!r}, valid {window}")
    out.print(f"private key: {pem} (mode 0600: keep it to the writers)")
    out.print(f"signing-keys file: {keys_file}")
    out.print(f"keyring: {keyring_file} (publish it to whoever verifies)")


@app.command("list")
@one_shot_with("config", "json", "logs")
def list_keys(
    cmd: OneShot,
    keys: KeysOption = None,
    keyring: KeyringOption = None,
) -> None:
    """The keys of the signing-keys file and of the keyring: each one's window, whether it
    signs now, and whether the keyring publishes it as the writers hold it."""
    keys_file, keyring_file = _files(keys, keyring, cmd.config)
    if keys_file is None and keyring_file is None:
        raise ConfigError(
            "no signing-keys file or keyring: give --keys or --keyring, or configure them "
            "([signing] keys and keyring, or JOBLEDGER_SIGNING_KEYS and JOBLEDGER_KEYRING)"
        )
    rows = key_rows(keys_file, keyring_file, datetime.now(UTC))
    if cmd.json:
        print_json({"keys_file": keys_file, "keyring": keyring_file, "keys": rows})
        return
    table = Table("id", "not before", "not after", "status", "private key", "keyring")
    for row in rows:
        table.add_row(
            row["id"],
            row["not_before"],
            row["not_after"] or "-",
            row["status"],
            "yes" if row["private_key"] else "no",
            row["keyring"],
        )
    out = console()
    out.print(table)
    out.print(f"signing-keys file: {keys_file or '-'}; keyring: {keyring_file or '-'}")


def key_rows(
    keys_file: Path | None, keyring_file: Path | None, now: datetime
) -> list[dict[str, Any]]:
    """One row per key id, from either file. ``status``: ``active`` (signs events now),
    ``valid`` (valid now, but a newer key signs), ``future``, ``retired``. ``keyring``:
    ``yes``, ``no`` (unpublished: verify will fail the events it signs), or what differs."""
    private = read_signing_keys(keys_file) if keys_file is not None else []
    public = {k.id: k for k in Keyring.from_file(keyring_file).keys} if keyring_file else {}
    signing = None
    if private:
        try:
            signing = Ed25519Signer(private).key_at(now).id
        except SigningKeyError:
            signing = None
    held = {key.id: PublicKey(key.id, key.private_key.public_key(), key.window) for key in private}
    rows = []
    for key_id in [*held, *(i for i in public if i not in held)]:
        key = held.get(key_id) or public[key_id]
        rows.append(
            {
                "id": key_id,
                "not_before": key.window.not_before.isoformat(),
                "not_after": None
                if key.window.not_after is None
                else key.window.not_after.isoformat(),
                "status": _status(key.window, now, key_id == signing),
                "private_key": key_id in held,
                "keyring": _published(held.get(key_id), public.get(key_id), keyring_file),
            }
        )
    return rows


@app.command()
@one_shot_with("config", "logs")
def retire(
    cmd: OneShot,
    key_id: Annotated[str, typer.Argument(metavar="ID", help="The key to retire.")],
    at: Annotated[datetime, _moment("--at", "When the key stops being valid (ISO 8601).")],
    keys: KeysOption = None,
    keyring: KeyringOption = None,
) -> None:
    """Set the key's not_after to --at in the signing-keys file and in the keyring
    (rotation: the next key's not_before is the same time). Events dated from --at on no
    longer verify by this key."""
    keys_file, keyring_file = _files(keys, keyring, cmd.config)
    entries = _signing_entries(keys_file) if keys_file is not None else []
    published = _keyring(keyring_file) if keyring_file is not None else {"keys": []}
    found = [e for e in [*entries, *published["keys"]] if e["id"] == key_id]
    if not found:
        named = " or ".join(repr(str(f)) for f in (keys_file, keyring_file) if f is not None)
        raise ConfigError(f"no key {key_id!r} in {named or 'any configured key file'}")
    for entry in found:
        _window(parse_time(entry["not_before"], "not_before"), at)
        ends = entry["not_after"]
        if ends is not None and parse_time(ends, "not_after") < at:
            raise ConfigError(f"key {key_id!r} is already retired at {ends}; a key is not revived")
        entry["not_after"] = at.isoformat()
    if keys_file is not None:
        _replace(keys_file, entries)
    if keyring_file is not None and any(e["id"] == key_id for e in published["keys"]):
        _replace(keyring_file, published)
    out = console()
    out.print(f"retired key {key_id!r} at {at.isoformat()}")
    if keys_file is not None and entries:
        try:
            Ed25519Signer(read_signing_keys(keys_file)).key_at(at)
        except SigningKeyError:
            out.print(
                f"note: no key in {keys_file} is valid at {at.isoformat()}: writers will refuse "
                "to write events from then on; add one (jobledger keys generate --not-before)"
            )


# ---- the files ----------------------------------------------------------------------------


def _files(
    keys: Path | None, keyring: Path | None, config: Path | None, *, default_dir: Path | None = None
) -> tuple[Path | None, Path | None]:
    """The flag, else the configured file (env, then the config file), else DIR's."""
    engine = load_settings(config, None).engine
    keys = keys or engine.signing.signing_keys
    keyring = keyring or engine.signing.keyring
    if default_dir is not None:
        keys = keys or default_dir / KEYS_FILE
        keyring = keyring or default_dir / KEYRING_FILE
    return keys, keyring


def _signing_entries(path: Path) -> list[dict[str, Any]]:
    """The file's entries as they are, after checking the whole file reads as keys."""
    read_signing_keys(path)
    entries: list[dict[str, Any]] = read_json(path, "signing-keys file")
    return entries


def _keyring(path: Path) -> dict[str, Any]:
    document: dict[str, Any] = read_json(path, "keyring")
    Keyring.from_document(document, str(path))
    return document


def _ids(document: dict[str, Any]) -> list[str]:
    return [entry["id"] for entry in document.get("keys", [])]


def _window(not_before: datetime, not_after: datetime | None) -> Window:
    try:
        return Window(not_before, not_after)
    except ValueError as error:
        raise ConfigError(str(error)) from None


def _status(window: Window, now: datetime, signing: bool) -> str:
    if signing:
        return "active"
    if window.contains(now):
        return "valid"
    return "future" if utc(window.not_before) > now else "retired"


def _published(held: PublicKey | None, public: PublicKey | None, keyring: Path | None) -> str:
    if keyring is None:
        return "-"
    if public is None:
        return "no"
    if held is None:
        return "yes"
    if held.entry()["public_key"] != public.entry()["public_key"]:
        return "differs: another public key"
    if held.window != public.window:
        return f"differs: window {public.window}"
    return "yes"


def _write_private_key(path: Path, key: Ed25519PrivateKey) -> None:
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    try:
        descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        raise ConfigError(f"{str(path)!r} exists: a key file is never overwritten") from None
    except OSError as error:
        raise ConfigError(f"cannot write private key {str(path)!r}: {error.strerror}") from None
    with os.fdopen(descriptor, "wb") as file:
        file.write(private_pem(key))


def _replace(path: Path, document: Any) -> None:
    """Write beside, then rename over: a reader sees the old file or the new one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.tmp")
    temporary.write_text(json.dumps(document, indent=2) + "\n", encoding="utf-8")
    os.replace(temporary, path)
