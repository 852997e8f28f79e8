"""The dead-letter routes' request and response bodies: the fields of ``jobledger
dead-letters ... --json``."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import BaseModel, Field

from jobledger.adapters.kafka.dead_letters import DeadLetter, RedriveReport
from jobledger.api.models import Body

MAX_IDS = 10_000


class Redrive(BaseModel):
    """One redrive a marker records."""

    by: str
    at: str
    count: int


class DeadLetterModel(BaseModel):
    """A message the Kafka worker could not handle, as its dead-letter topic holds it."""

    id: str
    """``ticks:PARTITION:OFFSET``, ``signals:PARTITION:OFFSET`` or
    ``sub:NAME:PARTITION:OFFSET`` on the dead-letter topic."""
    kind: str
    """``ticks``, ``signals`` or ``subscription``."""
    subscription: str | None
    """The subscription's name (kind ``subscription``)."""
    reason: str
    error: str
    key: str | None
    value: str | None
    source_topic: str | None
    source_partition: int | None
    source_offset: int | None
    worker: str | None
    dead_lettered_at: datetime
    redrive_of: str | None
    """Set when this letter is a redriven message that failed again."""
    origin: str | None
    """Where the message was first read, ``topic:partition:offset`` (a redrive sends it
    in ``jobledger.redrive.origin``)."""
    headers: dict[str, str]
    """The message's own headers."""
    redrives: list[Redrive]

    @classmethod
    def of(cls, letter: DeadLetter) -> DeadLetterModel:
        return cls.model_validate(letter.document())


class DeadLetterList(BaseModel):
    letters: list[DeadLetterModel]


class RedriveRequest(Body):
    """What to redrive: ``ids``, else the letters the filter matches; with neither, only
    ``all: true`` takes every letter."""

    ids: list[str] = Field(default_factory=list, max_length=MAX_IDS)
    reason: str | None = Field(default=None, min_length=1, max_length=200)
    since: datetime | None = None
    until: datetime | None = None
    key: str | None = Field(default=None, min_length=1, max_length=401)
    topic: str | None = Field(default=None, min_length=1, max_length=249)
    subscription: str | None = Field(default=None, min_length=1, max_length=100)
    all: bool = False
    dry_run: bool = False
    force: bool = False
    """Send letters redriven before again too."""


class RedriveResult(BaseModel):
    matched: int
    sent: list[str]
    """Sent back (with ``dry_run``: would be)."""
    skipped: list[str]
    """Redriven before, left alone (no ``force``)."""
    dry_run: bool

    @classmethod
    def of(cls, report: RedriveReport) -> RedriveResult:
        document: dict[str, Any] = report.document()
        return cls.model_validate(document)
