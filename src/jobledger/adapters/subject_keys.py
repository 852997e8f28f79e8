"""The SubjectKeys port: data subjects' keys in the store's own database, outside the log.

Three tables of the ``erasure`` component (migrated like the store's own, on open):
``jobledger_subject_keys`` (key id, tenant, subject, key bytes, created), one row per data
subject of a tenant (subject NULL: a job's own key); ``jobledger_subject_jobs`` (key id,
job uuid), which jobs hold values sealed with a key, noted before the job is written so
erasure finds every one; ``jobledger_erasures`` (key id, tenant, sha256 of the subject -
or, for a job's own key, of the job - erased at, shredded at), so a second erase of a
subject or job is told it was done, without keeping the subject's name, or finishes its
shred.

Key bytes are stored base64url, wrapped (AES-256-GCM, the key id as associated data) by
a master key from the configuration when one is set, so a copy of the database alone does
not open the values. Deleting a key leaves no copy the database can reach: on SQLite the
delete runs with ``secure_delete`` on (its bytes are zeroed in the page) and a checkpoint
then truncates the write-ahead log; on PostgreSQL a ``VACUUM FULL`` of the key table
rewrites it without the dead row. That shred is what ``shredded_at`` records: another
connection's read transaction can keep the old pages past the wait (SQLite's checkpoint
is busy; PostgreSQL's vacuum waits for the table's lock, or keeps the dead row for the
reader's snapshot), and then it is left pending, for the next erasure to finish.
"""

from __future__ import annotations

import base64
import hashlib
import os
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Final
from uuid import uuid4

from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from jobledger.adapters.backends import StoreBackend
from jobledger.adapters.backends.base import Cursor, Migration
from jobledger.adapters.store_errors import store_errors
from jobledger.domain.erasure import Erasure, KeyState

COMPONENT: Final = "erasure"
KEYS: Final = "jobledger_subject_keys"
JOBS: Final = "jobledger_subject_jobs"
ERASURES: Final = "jobledger_erasures"
KEY_BYTES: Final = 32
NONCE_BYTES: Final = 12


def _tables(b: StoreBackend, curs: Cursor) -> None:
    curs.execute(
        b.sql(
            f"CREATE TABLE IF NOT EXISTS {b.table(KEYS)} (key_id TEXT PRIMARY KEY, "
            "tenant_id TEXT NOT NULL, subject TEXT, key_bytes TEXT NOT NULL, "
            f"wrapped INTEGER NOT NULL, created_at {b.timestamp_type} NOT NULL, "
            "UNIQUE (tenant_id, subject))"
        )
    )
    curs.execute(
        b.sql(
            f"CREATE TABLE IF NOT EXISTS {b.table(JOBS)} (key_id TEXT NOT NULL, "
            "job_id TEXT NOT NULL, PRIMARY KEY (key_id, job_id))"
        )
    )
    curs.execute(
        b.sql(
            f"CREATE TABLE IF NOT EXISTS {b.table(ERASURES)} (key_id TEXT PRIMARY KEY, "
            "tenant_id TEXT NOT NULL, subject_sha256 TEXT NOT NULL, "
            f"erased_at {b.timestamp_type} NOT NULL)"
        )
    )


def _shredded(b: StoreBackend, curs: Cursor) -> None:
    """When each destroyed key's bytes were gone from the database's files. An erasure
    made before it is not known to be shredded: the next erasure shreds it again. Like
    version 1, it adopts a store that has it already without a schema row saying so."""
    if "shredded_at" not in b.columns(curs, ERASURES):
        curs.execute(
            b.sql(f"ALTER TABLE {b.table(ERASURES)} ADD COLUMN shredded_at {b.timestamp_type}")
        )


MIGRATIONS: Final = (
    Migration(1, "the data subjects' keys, their jobs, the erasures", _tables),
    Migration(2, "when each erased key was shredded from the database's files", _shredded),
)


class MasterKeyError(ValueError):
    """The configured master key is not 32 bytes of base64url, or does not open a key."""


def master_key(encoded: str) -> bytes:
    """The master key from its configured form (base64url of 32 bytes)."""
    try:
        raw = base64.urlsafe_b64decode(encoded + "=" * (-len(encoded) % 4))
    except ValueError:
        raw = b""
    if len(raw) != KEY_BYTES:
        raise MasterKeyError("the erasure master key must be 32 bytes, base64url-encoded")
    return raw


class SubjectKeyTable:
    """Keys by id for the cipher (``key``), and by subject for erasure (the port).

    Made before the store (the store's cipher holds it), it is given the store's backend
    once the store is open (:meth:`attach`), as the backend is given its datastore."""

    backend: StoreBackend

    def __init__(self, *, master: bytes | None = None) -> None:
        self._master = None if master is None else AESGCM(master)
        self._present = True

    def attach(self, backend: StoreBackend, *, create: bool = True) -> None:
        """Use the open store's database; a writer creates or migrates the tables, a
        reader checks they are not newer than this code (a store made before them holds
        no sealed value: every key then reads as absent)."""
        self.backend = backend
        with store_errors("opening the subject key table"):
            if create:
                with backend.schema_lock():
                    backend.migrate(COMPONENT, MIGRATIONS)
            else:
                backend.check_schema(COMPONENT, MIGRATIONS)
                self._present = backend.has_tables(KEYS)

    # ---- the SubjectKeys port ------------------------------------------------------------

    def key_for(self, tenant_id: str, subject: str | None, job_id: str) -> str:
        with store_errors("using the subject key table"), self.backend.transaction() as curs:
            key_id = None if subject is None else self._subject_key(curs, tenant_id, subject)
            if key_id is None:
                key_id = self._new_key(curs, tenant_id, subject)
            curs.execute(
                self.backend.sql(
                    f"INSERT INTO {self.backend.table(JOBS)} (key_id, job_id) "
                    "VALUES (:key_id, :job_id) ON CONFLICT DO NOTHING"
                ),
                {"key_id": key_id, "job_id": job_id},
            )
        return key_id

    def keys_of(self, tenant_id: str, subject: str) -> dict[str, list[str]]:
        k, j = self.backend.table(KEYS), self.backend.table(JOBS)
        with store_errors("reading the subject key table"):
            rows = self.backend.fetch(
                f"SELECT k.key_id, j.job_id FROM {k} k LEFT JOIN {j} j ON j.key_id = k.key_id "
                "WHERE k.tenant_id = :tenant_id AND k.subject = :subject ORDER BY j.job_id",
                {"tenant_id": tenant_id, "subject": subject},
            )
        found: dict[str, list[str]] = {}
        for row in rows:
            jobs = found.setdefault(row["key_id"], [])
            if row["job_id"] is not None:
                jobs.append(row["job_id"])
        return found

    def jobs_of(self, key_ids: Sequence[str]) -> dict[str, list[str]]:
        found: dict[str, list[str]] = {key_id: [] for key_id in key_ids}
        with store_errors("reading the subject key table"):
            for key_id in key_ids:
                rows = self.backend.fetch(
                    f"SELECT job_id FROM {self.backend.table(JOBS)} WHERE key_id = :key_id "
                    "ORDER BY job_id",
                    {"key_id": key_id},
                )
                found[key_id] = [row["job_id"] for row in rows]
        return found

    def erasure(self, tenant_id: str, subject: str) -> Erasure | None:
        with store_errors("reading the erasures"):
            rows = self.backend.fetch(
                f"SELECT key_id, erased_at, shredded_at FROM {self.backend.table(ERASURES)} "
                "WHERE tenant_id = :tenant_id AND subject_sha256 = :digest ORDER BY key_id",
                {"tenant_id": tenant_id, "digest": subject_sha256(tenant_id, subject)},
            )
        if not rows:
            return None
        erased_at = max(_moment(row["erased_at"]) for row in rows)
        shredded = all(row["shredded_at"] is not None for row in rows)
        return Erasure(tuple(row["key_id"] for row in rows), erased_at, shredded)

    def destroy(self, tenant_id: str, subject: str, key_ids: Sequence[str], at: datetime) -> bool:
        return self._destroy(tenant_id, subject_sha256(tenant_id, subject), key_ids, at)

    def key_state(self, tenant_id: str, key_id: str) -> KeyState:
        b = self.backend
        where = "WHERE key_id = :key_id AND tenant_id = :tenant_id"
        found = {"key_id": key_id, "tenant_id": tenant_id}
        with store_errors("reading the subject key table"):
            held = b.fetch(f"SELECT subject FROM {b.table(KEYS)} {where}", found)
            erased = b.fetch(
                f"SELECT erased_at, shredded_at FROM {b.table(ERASURES)} {where}", found
            )
        return KeyState(
            held=bool(held),
            subject=bool(held) and held[0]["subject"] is not None,
            erased_at=_timestamp(erased[0]["erased_at"] if erased else None),
            shredded=bool(erased) and erased[0]["shredded_at"] is not None,
        )

    def destroy_job_key(self, tenant_id: str, job_id: str, key_id: str, at: datetime) -> bool:
        return self._destroy(tenant_id, job_sha256(tenant_id, job_id), [key_id], at, own=True)

    def shred(self, at: datetime) -> bool:
        """Scrub the key table, then note ``at`` as the shred of every erasure that was
        pending before it began (one recorded later may have missed it: it has its own)."""
        b = self.backend
        with store_errors("reading the erasures"):
            pending = b.fetch(
                f"SELECT key_id FROM {b.table(ERASURES)} WHERE shredded_at IS NULL", {}
            )
        with store_errors("scrubbing the deleted keys"):
            if not b.scrub(KEYS):
                return False
        with store_errors("noting the shred"), b.transaction() as curs:
            for row in pending:
                curs.execute(
                    b.sql(
                        f"UPDATE {b.table(ERASURES)} SET shredded_at = :at "
                        "WHERE key_id = :key_id AND shredded_at IS NULL"
                    ),
                    {"key_id": row["key_id"], "at": b.ts(at)},
                )
        return True

    def _destroy(
        self,
        tenant_id: str,
        digest: str,
        key_ids: Sequence[str],
        at: datetime,
        *,
        own: bool = False,
    ) -> bool:
        """Delete the keys and record their erasure under ``digest``, in one transaction;
        ``own``: only a job's own key (never a subject's, which other jobs share). Then
        shred: whether that is done."""
        b = self.backend
        only_own = " AND subject IS NULL" if own else ""
        with store_errors("erasing keys"), b.transaction() as curs:
            # The page that held the key is zeroed as it is freed (a no-op elsewhere).
            b.secure_delete(curs)
            for key_id in key_ids:
                curs.execute(
                    b.sql(f"DELETE FROM {b.table(KEYS)} WHERE key_id = :key_id{only_own}"),
                    {"key_id": key_id},
                )
                curs.execute(
                    b.sql(
                        f"INSERT INTO {b.table(ERASURES)} "
                        "(key_id, tenant_id, subject_sha256, erased_at) "
                        "VALUES (:key_id, :tenant_id, :digest, :at) ON CONFLICT DO NOTHING"
                    ),
                    {"key_id": key_id, "tenant_id": tenant_id, "digest": digest, "at": b.ts(at)},
                )
        return self.shred(at)

    # ---- for the cipher ------------------------------------------------------------------

    def key(self, key_id: str) -> bytes | None:
        """The key's bytes; None once it is erased (or never was)."""
        if not self._present:
            return None
        with store_errors("reading the subject key table"):
            rows = self.backend.fetch(
                f"SELECT key_bytes, wrapped FROM {self.backend.table(KEYS)} WHERE key_id = :key_id",
                {"key_id": key_id},
            )
        if not rows:
            return None
        stored = _b64decode(rows[0]["key_bytes"])
        if not rows[0]["wrapped"]:
            return stored
        if self._master is None:
            raise MasterKeyError(
                f"key {key_id} is wrapped by a master key: set JOBLEDGER_ERASURE_MASTER_KEY"
            )
        try:
            return self._master.decrypt(stored[:NONCE_BYTES], stored[NONCE_BYTES:], key_id.encode())
        except Exception:
            raise MasterKeyError(f"the configured master key does not open key {key_id}") from None

    # ---- the rows ------------------------------------------------------------------------

    def _subject_key(self, curs: Cursor, tenant_id: str, subject: str) -> str | None:
        curs.execute(
            self.backend.sql(
                f"SELECT key_id FROM {self.backend.table(KEYS)} "
                "WHERE tenant_id = :tenant_id AND subject = :subject"
            ),
            {"tenant_id": tenant_id, "subject": subject},
        )
        found = curs.fetchone()
        return None if found is None else str(self.backend.row(found)["key_id"])

    def _new_key(self, curs: Cursor, tenant_id: str, subject: str | None) -> str:
        """A fresh key. Two first submits for one subject race on (tenant, subject): the
        loser's insert does nothing and it takes the winner's key."""
        key_id = str(uuid4())
        raw = AESGCM.generate_key(bit_length=KEY_BYTES * 8)
        stored = raw
        if self._master is not None:
            nonce = os.urandom(NONCE_BYTES)
            stored = nonce + self._master.encrypt(nonce, raw, key_id.encode())
        curs.execute(
            self.backend.sql(
                f"INSERT INTO {self.backend.table(KEYS)} "
                "(key_id, tenant_id, subject, key_bytes, wrapped, created_at) "
                "VALUES (:key_id, :tenant_id, :subject, :key_bytes, :wrapped, :created_at) "
                "ON CONFLICT DO NOTHING"
            ),
            {
                "key_id": key_id,
                "tenant_id": tenant_id,
                "subject": subject,
                "key_bytes": _b64encode(stored),
                "wrapped": int(self._master is not None),
                "created_at": self.backend.ts(datetime.now(UTC)),
            },
        )
        if subject is None:
            return key_id
        taken = self._subject_key(curs, tenant_id, subject)
        assert taken is not None
        return taken


def subject_sha256(tenant_id: str, subject: str) -> str:
    """How an erasure names its subject: a digest, never the name (it may be personal)."""
    return hashlib.sha256(f"jobledger.subject/1\n{tenant_id}\n{subject}".encode()).hexdigest()


def job_sha256(tenant_id: str, job_id: str) -> str:
    """How the erasure of a job's own key names the job (apart from any subject's digest)."""
    return hashlib.sha256(f"jobledger.job/1\n{tenant_id}\n{job_id}".encode()).hexdigest()


def _timestamp(stored: str | datetime | None) -> datetime | None:
    return None if stored is None else _moment(stored)


def _moment(stored: str | datetime) -> datetime:
    """A timestamp column as read: text on SQLite, a datetime on PostgreSQL."""
    return datetime.fromisoformat(stored) if isinstance(stored, str) else stored


def _b64encode(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def _b64decode(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
