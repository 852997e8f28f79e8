"""The Ed25519 signer and the keyring: round trips, every reason a signature fails,
rotation by validity windows, and the key files' errors in words."""

from __future__ import annotations

import hashlib
import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ec import SECP256R1, generate_private_key
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from jobledger.adapters.signing import (
    Ed25519Signer,
    Keyring,
    SigningKey,
    SigningKeyError,
    Window,
    b64url,
    from_b64url,
    message,
    private_pem,
)
from jobledger.domain.errors import ConfigError

T0 = datetime(2026, 1, 1, tzinfo=UTC)
SWITCH = datetime(2026, 7, 1, tzinfo=UTC)
HASH = hashlib.sha256(b"an event").hexdigest()


def key(key_id: str, not_before: datetime = T0, not_after: datetime | None = None) -> SigningKey:
    return SigningKey(key_id, Ed25519PrivateKey.generate(), Window(not_before, not_after))


def keyring_of(signer: Ed25519Signer) -> Keyring:
    return Keyring(signer.public_keys())


def test_a_signature_verifies_by_the_published_key_and_matches_the_contract() -> None:
    signer = Ed25519Signer([key("k1")])
    key_id, signature = signer.sign(HASH, T0 + timedelta(days=1))
    assert key_id == "k1"
    assert "=" not in signature and "+" not in signature and "/" not in signature
    public = signer.public_keys()[0].public_key
    public.verify(from_b64url(signature), b"jobledger.event/1\nk1\n" + HASH.encode())
    assert keyring_of(signer).check(key_id, signature, HASH, T0 + timedelta(days=1)) is None


def test_each_failure_has_its_reason() -> None:
    signer = Ed25519Signer([key("k1", T0, SWITCH)])
    keyring = keyring_of(signer)
    at = T0 + timedelta(days=1)
    key_id, signature = signer.sign(HASH, at)

    assert keyring.check(None, None, HASH, at) == "unsigned (no signature)"
    assert keyring.check("k1", "", HASH, at) == "unsigned (no signature)"
    unknown = keyring.check("k9", signature, HASH, at)
    assert unknown == "signed by key 'k9', which is not in the keyring"
    late = keyring.check(key_id, signature, HASH, SWITCH)
    assert late is not None and "not valid at 2026-07-01T00:00:00+00:00" in late
    assert "from 2026-01-01T00:00:00+00:00 until 2026-07-01T00:00:00+00:00" in late
    other_hash = hashlib.sha256(b"another event").hexdigest()
    assert "bad signature by key 'k1'" in str(keyring.check(key_id, signature, other_hash, at))
    assert "bad signature" in str(keyring.check(key_id, "not*base64", HASH, at))
    # A signature by one key presented as another's: the key id is in the signed message.
    twin = Ed25519Signer([SigningKey("k2", signer.keys[0].private_key, Window(T0))])
    both = Keyring([*signer.public_keys(), *twin.public_keys()])
    assert "bad signature by key 'k2'" in str(both.check("k2", signature, HASH, at))


def test_rotation_signs_each_event_by_the_key_of_its_time() -> None:
    signer = Ed25519Signer([key("old", T0, SWITCH), key("new", SWITCH)])
    keyring = keyring_of(signer)
    before, after = SWITCH - timedelta(microseconds=1), SWITCH
    old_id, old_signature = signer.sign(HASH, before)
    new_id, new_signature = signer.sign(HASH, after)
    assert (old_id, new_id) == ("old", "new")
    assert keyring.check(old_id, old_signature, HASH, before) is None
    assert keyring.check(new_id, new_signature, HASH, after) is None
    # The old key's signature on an event dated after its retirement does not count.
    assert "not valid at" in str(keyring.check(old_id, old_signature, HASH, after))
    assert "not valid at" in str(keyring.check(new_id, new_signature, HASH, before))


def test_overlapping_windows_sign_by_the_newest_key() -> None:
    signer = Ed25519Signer([key("old", T0), key("new", SWITCH)])
    assert signer.sign(HASH, SWITCH + timedelta(days=1))[0] == "new"
    assert signer.sign(HASH, SWITCH - timedelta(days=1))[0] == "old"


def test_no_key_valid_names_the_windows() -> None:
    signer = Ed25519Signer([key("k1", T0, SWITCH)])
    with pytest.raises(SigningKeyError) as raised:
        signer.sign(HASH, SWITCH + timedelta(days=1))
    assert "no signing key is valid at 2026-07-02T00:00:00+00:00" in str(raised.value)
    assert "'k1' from 2026-01-01T00:00:00+00:00 until 2026-07-01T00:00:00+00:00" in str(
        raised.value
    )


def test_a_window_must_end_after_it_starts() -> None:
    with pytest.raises(ValueError, match="later than not_before"):
        Window(SWITCH, T0)


def test_a_naive_time_is_utc() -> None:
    signer = Ed25519Signer([key("k1", T0, SWITCH)])
    naive = datetime(2026, 3, 1)
    key_id, signature = signer.sign(HASH, naive)
    assert keyring_of(signer).check(key_id, signature, HASH, naive.replace(tzinfo=UTC)) is None


# ---- the files ---------------------------------------------------------------------------


def write_key(directory: Path, name: str, private: Ed25519PrivateKey | None = None) -> str:
    (directory / name).write_bytes(private_pem(private or Ed25519PrivateKey.generate()))
    return name


def entry(key_id: str, key_file: str, not_after: str | None = None) -> dict[str, object]:
    return {
        "id": key_id,
        "private_key_file": key_file,
        "not_before": "2026-01-01T00:00:00+00:00",
        "not_after": not_after,
    }


def test_signing_keys_and_keyring_files_round_trip(tmp_path: Path) -> None:
    (tmp_path / "private").mkdir()
    keys_file = tmp_path / "signing-keys.json"
    keys_file.write_text(
        json.dumps(
            [
                entry("old", write_key(tmp_path, "private/old.pem"), "2026-07-01T00:00:00Z"),
                {
                    **entry("new", write_key(tmp_path, "private/new.pem")),
                    "not_before": "2026-07-01",
                },
            ]
        )
    )
    signer = Ed25519Signer.from_file(keys_file)
    keyring_file = tmp_path / "keyring.json"
    keyring_file.write_text(json.dumps(keyring_of(signer).document()))
    keyring = Keyring.from_file(keyring_file)
    assert json.loads(keyring_file.read_text())["format"] == "jobledger.keyring/1"
    for at in (SWITCH - timedelta(seconds=1), SWITCH):
        assert keyring.check(*signer.sign(HASH, at), HASH, at) is None


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        ("{", "is not valid JSON: Expecting property name enclosed in double quotes at line 1"),
        ("[]", "must be a non-empty JSON list"),
        ('[{"id": "k1"}]', "key 1: missing private_key_file, not_before, not_after"),
        (
            json.dumps([{**entry("k1", "k1.pem"), "extra": 1}]),
            "key 1: unknown extra",
        ),
        (json.dumps([entry("k1", "absent.pem")]), "cannot read private key"),
        (json.dumps([{**entry("k1", "k1.pem"), "not_before": "soon"}]), "not_before is not an"),
        (
            json.dumps([entry("k1", "k1.pem", "2025-01-01T00:00:00Z")]),
            "not_after must be later than not_before",
        ),
        (json.dumps([entry("k1", "k1.pem"), entry("k1", "k1.pem")]), "'k1' appears twice"),
        (json.dumps([{**entry("k1", "k1.pem"), "id": ""}]), "id must be a non-empty string"),
    ],
)
def test_a_malformed_signing_keys_file_says_what_is_wrong(
    tmp_path: Path, content: str, expected: str
) -> None:
    write_key(tmp_path, "k1.pem")
    keys_file = tmp_path / "signing-keys.json"
    keys_file.write_text(content)
    with pytest.raises(ConfigError) as raised:
        Ed25519Signer.from_file(keys_file)
    assert expected in str(raised.value)
    assert "signing-keys file" in str(raised.value) or "private key" in str(raised.value)


def test_a_private_key_that_is_not_usable_says_why(tmp_path: Path) -> None:
    keys_file = tmp_path / "signing-keys.json"
    keys_file.write_text(json.dumps([entry("k1", "k1.pem")]))
    cases = {
        b"not a key": "is not a PEM (PKCS8) private key",
        generate_private_key(SECP256R1()).private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        ): "is not an Ed25519 key",
        Ed25519PrivateKey.generate().private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.BestAvailableEncryption(b"secret"),
        ): "is encrypted",
    }
    for pem, expected in cases.items():
        (tmp_path / "k1.pem").write_bytes(pem)
        with pytest.raises(ConfigError) as raised:
            Ed25519Signer.from_file(keys_file)
        assert expected in str(raised.value)


def good_keyring_entry() -> dict[str, object]:
    return Keyring(Ed25519Signer([key("k1")]).public_keys()).document()["keys"][0]


@pytest.mark.parametrize(
    ("document", "expected"),
    [
        ([], "must be a JSON object with format and keys"),
        ({"keys": []}, "format must be 'jobledger.keyring/1' (got None)"),
        ({"format": "jobledger.keyring/1"}, "keys must be a list"),
        ({"format": "jobledger.keyring/1", "keys": [{"id": "k1"}]}, "key 1: missing algorithm"),
        (
            {
                "format": "jobledger.keyring/1",
                "keys": [{**good_keyring_entry(), "algorithm": "rsa"}],
            },
            "algorithm must be 'ed25519' (got 'rsa')",
        ),
        (
            {
                "format": "jobledger.keyring/1",
                "keys": [{**good_keyring_entry(), "public_key": b64url(b"short")}],
            },
            "public_key must be the base64url of 32 raw Ed25519 bytes",
        ),
        (
            {"format": "jobledger.keyring/1", "keys": [good_keyring_entry(), good_keyring_entry()]},
            "'k1' appears twice",
        ),
        (
            {"format": "jobledger.keyring/1", "keys": [{**good_keyring_entry(), "not_after": 5}]},
            "not_after must be an ISO 8601 time (got 5)",
        ),
    ],
)
def test_a_malformed_keyring_says_what_is_wrong(
    tmp_path: Path, document: object, expected: str
) -> None:
    path = tmp_path / "keyring.json"
    path.write_text(json.dumps(document))
    with pytest.raises(ConfigError) as raised:
        Keyring.from_file(path)
    assert expected in str(raised.value)
    assert str(path) in str(raised.value)


def test_the_message_binds_the_key_id() -> None:
    assert message("k1", "ab") == b"jobledger.event/1\nk1\nab"
