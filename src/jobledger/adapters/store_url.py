"""Store URLs: ``sqlite:///path`` (the embedded default) or ``postgresql://user:pw@host/db``."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Final
from urllib.parse import SplitResult, parse_qs, unquote, urlsplit

from jobledger.domain.errors import ConfigError
from jobledger.domain.redaction import redact

SQLITE_FACTORY = "jobledger.adapters.sqlite_durable:DurableSQLiteFactory"
POSTGRES_FACTORY = "eventsourcing.postgres"
SCHEMA_RULE: Final = (
    "a lower-case identifier (a letter or _, then letters, digits or _; at most 63 characters)"
)
# PostgreSQL folds unquoted names to lower case and eventsourcing quotes some of them and
# not others: an upper-case schema reads fine and every append fails. 63 is NAMEDATALEN-1.
_SCHEMA: Final = re.compile(r"[a-z_][a-z0-9_]{0,62}")


@dataclass(frozen=True)
class StoreLocation:
    kind: str
    env: dict[str, str]
    """eventsourcing environment settings for this store."""


def parse_store_url(url: str) -> StoreLocation:
    """Every error names the URL with its password hidden."""
    try:
        parts = urlsplit(url)
    except ValueError as error:
        raise ConfigError(f"store URL {redact(url)!r} is not a URL: {error}") from None
    if parts.scheme == "sqlite":
        return _sqlite(url, parts.netloc, parts.path)
    if parts.scheme in ("postgresql", "postgres"):
        return _postgres(redact(url), parts)
    raise ConfigError(
        f"unsupported store URL {redact(url)!r}: use sqlite:///path/to/file.db or "
        "postgresql://user:password@host:port/database"
    )


def _sqlite(url: str, netloc: str, path: str) -> StoreLocation:
    if netloc or not path or path == "/":
        raise ConfigError(
            f"SQLite URL {url!r} needs a file path: sqlite:///relative.db or "
            "sqlite:////absolute/path.db"
        )
    file = Path(unquote(path[1:]))
    if not file.parent.exists():
        raise ConfigError(f"SQLite URL {url!r}: directory {str(file.parent)!r} does not exist")
    return StoreLocation(
        "sqlite", {"PERSISTENCE_MODULE": SQLITE_FACTORY, "SQLITE_DBNAME": str(file)}
    )


def _postgres(shown: str, parts: SplitResult) -> StoreLocation:
    """``shown`` is the URL with its password hidden, for the errors."""
    database = parts.path.lstrip("/")
    if not parts.hostname or not database:
        raise ConfigError(f"PostgreSQL URL {shown!r} needs a host and a database name")
    try:
        port = 5432 if parts.port is None else parts.port
    except ValueError:  # not a number, or over 65535
        port = 0
    if not 1 <= port <= 65535:
        raise ConfigError(f"PostgreSQL URL {shown!r}: port must be a number from 1 to 65535")
    options = {k: v[-1] for k, v in parse_qs(parts.query, keep_blank_values=True).items()}
    env = {
        "PERSISTENCE_MODULE": POSTGRES_FACTORY,
        "POSTGRES_DBNAME": database,
        "POSTGRES_HOST": parts.hostname,
        "POSTGRES_PORT": str(port),
        "POSTGRES_USER": unquote(parts.username or ""),
        "POSTGRES_PASSWORD": unquote(parts.password or ""),
        "POSTGRES_CONNECT_TIMEOUT": _whole(shown, options, "connect_timeout", "5"),
        "POSTGRES_POOL_SIZE": _whole(shown, options, "pool_size", "4"),
    }
    if "schema" in options:
        schema = options["schema"]
        if not _SCHEMA.fullmatch(schema):
            raise ConfigError(
                f"PostgreSQL URL {shown!r}: schema {schema!r} is not allowed: use {SCHEMA_RULE}"
            )
        env["POSTGRES_SCHEMA"] = schema
    return StoreLocation("postgresql", env)


def _whole(shown: str, options: dict[str, str], name: str, default: str) -> str:
    value = options.get(name, default)
    if not value.isascii() or not value.isdigit() or int(value) < 1:
        raise ConfigError(
            f"PostgreSQL URL {shown!r}: {name} must be a whole number of at least 1, got {value!r}"
        )
    return value
