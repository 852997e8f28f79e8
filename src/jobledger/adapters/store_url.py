"""Store URLs: ``sqlite:///path`` (the embedded default) or ``postgresql://user:pw@host/db``."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from urllib.parse import parse_qs, unquote, urlsplit

from jobledger.errors import ConfigError

SQLITE_FACTORY = "jobledger.adapters.sqlite_durable:DurableSQLiteFactory"
POSTGRES_FACTORY = "eventsourcing.postgres"


@dataclass(frozen=True)
class StoreLocation:
    kind: str
    env: dict[str, str]
    """eventsourcing environment settings for this store."""

    @property
    def is_sqlite(self) -> bool:
        return self.kind == "sqlite"


def parse_store_url(url: str) -> StoreLocation:
    parts = urlsplit(url)
    if parts.scheme == "sqlite":
        return _sqlite(url, parts.netloc, parts.path)
    if parts.scheme in ("postgresql", "postgres"):
        return _postgres(url)
    raise ConfigError(
        f"unsupported store URL {url!r}: use sqlite:///path/to/file.db or "
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


def _postgres(url: str) -> StoreLocation:
    parts = urlsplit(url)
    database = parts.path.lstrip("/")
    if not parts.hostname or not database:
        raise ConfigError(f"PostgreSQL URL {url!r} needs a host and a database name")
    options = {k: v[-1] for k, v in parse_qs(parts.query).items()}
    env = {
        "PERSISTENCE_MODULE": POSTGRES_FACTORY,
        "POSTGRES_DBNAME": database,
        "POSTGRES_HOST": parts.hostname,
        "POSTGRES_PORT": str(parts.port or 5432),
        "POSTGRES_USER": unquote(parts.username or ""),
        "POSTGRES_PASSWORD": unquote(parts.password or ""),
        "POSTGRES_CONNECT_TIMEOUT": options.get("connect_timeout", "5"),
        "POSTGRES_POOL_SIZE": options.get("pool_size", "4"),
    }
    if "schema" in options:
        env["POSTGRES_SCHEMA"] = options["schema"]
    return StoreLocation("postgresql", env)
