"""Retention: how long a finished job stays in the store, and the tombstone it leaves.

A finished job past its retention is exported to an archive and removed from the store;
its tombstone stays, so ``verify`` still accounts for it (the chain head anchors pinned,
the archive that holds its events and that archive's digest) and ``restore`` can bring
it back byte for byte.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any
from uuid import UUID

KAFKA_TARGET = "kafka:"
_TOPIC = re.compile(r"^[A-Za-z0-9._-]{1,249}$")


@dataclass(frozen=True)
class Tombstone:
    """What is left in the store of an archived job."""

    job_uuid: UUID
    tenant_id: str
    job_id: str
    workflow_type: str
    status: str
    version: int
    """The job's last version: its event count (versions run 1..n without a gap)."""
    chain_hash: str
    """The chain hash of its last event: the head an anchor pins."""
    archive_ref: str
    """Where its archive is: ``dir:<file>`` or ``kafka:<topic>/<partition>@<offset>``."""
    archive_sha256: str
    """The digest of the archive's bytes, checked on every read of it."""
    archived_at: datetime

    def document(self) -> dict[str, Any]:
        return {
            "tenant": self.tenant_id,
            "job": self.job_id,
            "job_uuid": str(self.job_uuid),
            "workflow": self.workflow_type,
            "status": self.status,
            "events": self.version,
            "chain_hash": self.chain_hash,
            "archive": self.archive_ref,
            "archive_sha256": self.archive_sha256,
            "archived_at": self.archived_at.isoformat(),
        }


@dataclass(frozen=True)
class RetentionPolicy:
    """Days a finished job is kept, the most specific rule winning: its workflow's, else
    its tenant's, else the default; no rule at all keeps it for ever."""

    default_days: int | None = None
    tenants: Mapping[str, int] | None = None
    workflows: Mapping[str, int] | None = None

    def days(self, tenant_id: str, workflow_type: str) -> int | None:
        if self.workflows and workflow_type in self.workflows:
            return self.workflows[workflow_type]
        if self.tenants and tenant_id in self.tenants:
            return self.tenants[tenant_id]
        return self.default_days

    def shortest_days(self) -> int | None:
        """The fewest days any rule keeps a job (None: no rule at all)."""
        rules = [self.default_days, *(self.tenants or {}).values()]
        rules += (self.workflows or {}).values()
        return min((days for days in rules if days is not None), default=None)

    def due(self, tenant_id: str, workflow_type: str, ended_at: datetime, now: datetime) -> bool:
        """Whether a job that ended at ``ended_at`` is past its retention at ``now``."""
        days = self.days(tenant_id, workflow_type)
        return days is not None and ended_at <= now - timedelta(days=days)


@dataclass(frozen=True)
class ArchiveTarget:
    """Where the runner archives on its own (``retention_archive_to``): a directory, as
    ``archive --to DIR``, or ``kafka:TOPIC``, as ``archive --to-topic TOPIC``."""

    directory: Path | None = None
    topic: str | None = None

    @classmethod
    def parse(cls, text: str) -> ArchiveTarget:
        """Raises ValueError naming what is wrong (a config validator's error)."""
        text = text.strip()
        if not text:
            raise ValueError("an archive target must not be empty: a directory or kafka:TOPIC")
        if not text.startswith(KAFKA_TARGET):
            return cls(directory=Path(text))
        topic = text.removeprefix(KAFKA_TARGET)
        if not _TOPIC.match(topic):
            raise ValueError(
                f"archive target {text!r}: kafka:TOPIC takes a topic of 1 to 249 letters, "
                "digits, '.', '_' or '-'"
            )
        return cls(topic=topic)

    def __str__(self) -> str:
        return str(self.directory) if self.topic is None else KAFKA_TARGET + self.topic
