"""Dead letters: read, filter and redrive what the worker could not handle.

A dead letter is a message the worker copied to ``jobledger.ticks.dlq`` or
``jobledger.signals.dlq`` (see worker.py), named ``ticks:P:O`` / ``signals:P:O`` by its
partition and offset there. Redriving one sends the original message (key, value, its own
headers) back to its source topic with ``jobledger.redrive.of`` (the letter's id) and
``jobledger.redrive.count``; then a marker record (``jobledger.dlq.redrive_of``) goes to the
dead-letter topic, so the next redrive skips the letter unless forced.

Messages go out in batches: a batch is sent and flushed, then its markers are sent and
flushed. A redrive killed between the two sends that batch again when it is run again (at
least once, never lost); the engine makes that harmless: a tick only moves a job on from
what its store holds, and a signal's id is consumed once.
"""

from __future__ import annotations

import json
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any, Literal

from kafka import KafkaConsumer, TopicPartition
from kafka.errors import KafkaError

from jobledger.adapters.kafka import clients
from jobledger.adapters.kafka.clients import KafkaUnavailableError
from jobledger.adapters.kafka.settings import KafkaSettings
from jobledger.domain.errors import DeadLetterError, UnknownDeadLetterError

Kind = Literal["ticks", "signals"]
KINDS: tuple[Kind, ...] = ("ticks", "signals")
DLQ_PREFIX = "jobledger.dlq."
REDRIVE_PREFIX = "jobledger.redrive."
REDRIVE_OF = "jobledger.redrive.of"
REDRIVE_COUNT = "jobledger.redrive.count"
MARKER_OF = "jobledger.dlq.redrive_of"
MARKER_BY = "jobledger.dlq.redrive_by"
MARKER_COUNT = "jobledger.dlq.redrive_count"
MARKER_AT = "jobledger.dlq.redrive_at"
BATCH_SIZE = 100
"""Messages per flush: one round trip per batch, not per message (a redrive of 2,000
letters took 5.5 s sent one at a time, 1.2 s in batches, its read of the topics included)."""

Progress = Callable[[int, int], None]
Header = tuple[str, bytes]


@dataclass(frozen=True, order=True)
class LetterId:
    """``ticks:P:O`` or ``signals:P:O``: where the letter sits on its dead-letter topic."""

    kind: Kind
    partition: int
    offset: int

    @classmethod
    def parse(cls, text: str) -> LetterId:
        kind, _, rest = text.partition(":")
        partition, _, offset = rest.partition(":")
        if kind not in KINDS or not partition.isdigit() or not offset.isdigit():
            raise DeadLetterError(
                f"bad dead letter id {text!r}: expected ticks:PARTITION:OFFSET or "
                "signals:PARTITION:OFFSET"
            )
        return cls(kind, int(partition), int(offset))

    def __str__(self) -> str:
        return f"{self.kind}:{self.partition}:{self.offset}"


@dataclass(frozen=True)
class Redrive:
    """One marker: the letter was sent back, by whom, when, the how-manieth time."""

    by: str
    at: str
    count: int


@dataclass(frozen=True)
class DeadLetter:
    id: LetterId
    key: bytes | None
    value: bytes | None
    headers: tuple[Header, ...]
    dead_lettered_at: datetime
    redrives: tuple[Redrive, ...] = ()

    def header(self, name: str) -> str | None:
        """The last value of header ``name`` (a redriven message dead-lettered again
        carries its earlier dead-letter headers too)."""
        found = [value for key, value in self.headers if key == name]
        return found[-1].decode("utf-8", "replace") if found else None

    @property
    def reason(self) -> str:
        return self.header(f"{DLQ_PREFIX}reason") or "unknown"

    @property
    def error(self) -> str:
        return self.header(f"{DLQ_PREFIX}error") or ""

    @property
    def key_text(self) -> str | None:
        return None if self.key is None else self.key.decode("utf-8", "replace")

    @property
    def redriven(self) -> bool:
        return bool(self.redrives)

    def original_headers(self) -> list[Header]:
        """The message's own headers (its trace context, say), without what the dead
        letter and an earlier redrive added."""
        return [
            (name, value)
            for name, value in self.headers
            if not name.startswith((DLQ_PREFIX, REDRIVE_PREFIX))
        ]

    def document(self) -> dict[str, Any]:
        """What ``show --json`` and the API print."""
        return {
            "id": str(self.id),
            "kind": self.id.kind,
            "reason": self.reason,
            "error": self.error,
            "key": self.key_text,
            "value": None if self.value is None else self.value.decode("utf-8", "replace"),
            "source_topic": self.header(f"{DLQ_PREFIX}topic"),
            "source_partition": _int(self.header(f"{DLQ_PREFIX}partition")),
            "source_offset": _int(self.header(f"{DLQ_PREFIX}offset")),
            "worker": self.header(f"{DLQ_PREFIX}worker"),
            "dead_lettered_at": self.dead_lettered_at.isoformat(),
            "redrive_of": self.header(REDRIVE_OF),
            "headers": {n: v.decode("utf-8", "replace") for n, v in self.original_headers()},
            "redrives": [{"by": r.by, "at": r.at, "count": r.count} for r in self.redrives],
        }


@dataclass(frozen=True)
class LetterFilter:
    """Every given criterion must hold: ``reason`` exactly, dead-lettered at or after
    ``since`` and before ``until``, ``key`` exactly (or, ending in ``*``, as a prefix),
    ``topic`` the source (``ticks``, ``signals`` or the topic's name)."""

    reason: str | None = None
    since: datetime | None = None
    until: datetime | None = None
    key: str | None = None
    topic: str | None = None

    @property
    def is_empty(self) -> bool:
        return all(v is None for v in (self.reason, self.since, self.until, self.key, self.topic))

    def matches(self, letter: DeadLetter) -> bool:
        at = letter.dead_lettered_at
        return (
            (self.reason is None or letter.reason == self.reason)
            and (self.since is None or at >= _aware(self.since))
            and (self.until is None or at < _aware(self.until))
            and (self.key is None or _key_matches(self.key, letter.key_text))
        )

    def kinds(self, settings: KafkaSettings) -> tuple[Kind, ...]:
        """The dead-letter topics worth reading for ``topic``; a topic that is neither is
        refused (it would silently match nothing)."""
        if self.topic is None:
            return KINDS
        for kind in KINDS:
            if self.topic in (kind, _source_topic(settings, kind), _dlq_topic(settings, kind)):
                return (kind,)
        raise DeadLetterError(
            f"unknown topic {self.topic!r}: expected ticks, signals, "
            f"{settings.ticks_topic} or {settings.signals_topic}"
        )


@dataclass(frozen=True)
class Selection:
    """What a redrive takes: the letters named by ``ids`` (each must exist), else those
    the filter matches; with neither, only ``every`` (``--all``) takes them all."""

    ids: tuple[str, ...] = ()
    filter: LetterFilter = field(default_factory=LetterFilter)
    every: bool = False


@dataclass
class RedriveReport:
    matched: int
    sent: list[str]
    skipped: list[str]
    """Already redriven, left alone (no ``force``)."""
    dry_run: bool

    def document(self) -> dict[str, Any]:
        return {
            "matched": self.matched,
            "sent": self.sent,
            "skipped": self.skipped,
            "dry_run": self.dry_run,
        }


class DeadLetters:
    """The dead-letter topics of one deployment, read from the beginning on each call
    (no consumer group: reading commits nothing and moves no worker)."""

    def __init__(self, settings: KafkaSettings, *, batch_size: int = BATCH_SIZE) -> None:
        self.settings = settings
        self.batch_size = batch_size

    # ---- reading ---------------------------------------------------------------------

    def read(self, letter_filter: LetterFilter | None = None) -> list[DeadLetter]:
        """The letters the filter matches, ticks then signals, in partition and offset order,
        each with the redrives its markers record."""
        chosen = letter_filter or LetterFilter()
        letters = self._load(chosen.kinds(self.settings))
        return [letter for letter in letters if chosen.matches(letter)]

    def get(self, letter_id: str) -> DeadLetter:
        wanted = LetterId.parse(letter_id)
        for letter in self._load((wanted.kind,)):
            if letter.id == wanted:
                return letter
        raise UnknownDeadLetterError(letter_id)

    def _load(self, kinds: Sequence[Kind]) -> list[DeadLetter]:
        records = _read_topics(self.settings, {_dlq_topic(self.settings, k): k for k in kinds})
        redrives: dict[str, list[Redrive]] = defaultdict(list)
        letters: list[DeadLetter] = []
        for kind, record in records:
            headers = tuple(record.headers or ())
            names = dict(headers)
            if MARKER_OF in names:
                redrives[names[MARKER_OF].decode("utf-8", "replace")].append(_redrive(names))
                continue
            letters.append(
                DeadLetter(
                    LetterId(kind, record.partition, record.offset),
                    record.key,
                    record.value,
                    headers,
                    _dead_lettered_at(names, record.timestamp),
                )
            )
        return [
            _with_redrives(letter, redrives.get(str(letter.id), []))
            for letter in sorted(letters, key=lambda each: (KINDS.index(each.id.kind), each.id))
        ]

    # ---- redriving -------------------------------------------------------------------

    def redrive(
        self,
        selection: Selection,
        *,
        by: str,
        dry_run: bool = False,
        force: bool = False,
        progress: Progress | None = None,
    ) -> RedriveReport:
        """Send the selected letters back to their source topics (those redriven before
        only with ``force``), a batch at a time, each batch's markers after its flush.
        A bad id or filter, an unknown id, or no criterion without ``every`` is refused
        before anything is sent."""
        letters = self._select(selection)
        due = [letter for letter in letters if force or not letter.redriven]
        skipped = [str(letter.id) for letter in letters if not force and letter.redriven]
        report = RedriveReport(len(letters), [str(letter.id) for letter in due], skipped, dry_run)
        if dry_run or not due:
            return report
        producer = clients.producer(self.settings, role="redrive", linger_ms=5)
        try:
            done = 0
            for batch in _chunks(due, self.batch_size):
                self._send(producer, [self._original(letter) for letter in batch])
                self._send(producer, [self._marker(letter, by) for letter in batch])
                done += len(batch)
                if progress is not None:
                    progress(done, len(due))
        finally:
            producer.close(timeout=5)
        return report

    def _select(self, selection: Selection) -> list[DeadLetter]:
        if not selection.ids and selection.filter.is_empty and not selection.every:
            raise DeadLetterError(
                "a redrive without an id or a filter takes every dead letter: "
                "name ids, give a filter, or ask for all of them (--all)"
            )
        wanted = [LetterId.parse(text) for text in selection.ids]
        letters = self.read(selection.filter)
        if not wanted:
            return letters
        found = {letter.id: letter for letter in letters}
        missing = [str(w) for w in wanted if w not in found]
        if missing:
            raise UnknownDeadLetterError(", ".join(missing))
        return [found[w] for w in dict.fromkeys(wanted)]

    def _original(self, letter: DeadLetter) -> _Outgoing:
        count = len(letter.redrives) + 1
        headers = [
            *letter.original_headers(),
            (REDRIVE_OF, str(letter.id).encode()),
            (REDRIVE_COUNT, str(count).encode()),
        ]
        topic = _source_topic(self.settings, letter.id.kind)
        return _Outgoing(topic, letter.key, letter.value, headers)

    def _marker(self, letter: DeadLetter, by: str) -> _Outgoing:
        count = len(letter.redrives) + 1
        at = datetime.now(UTC).isoformat()
        value = {"redrive_of": str(letter.id), "by": by, "count": count, "at": at}
        headers = [
            (MARKER_OF, str(letter.id).encode()),
            (MARKER_BY, by.encode()),
            (MARKER_COUNT, str(count).encode()),
            (MARKER_AT, at.encode()),
        ]
        topic = _dlq_topic(self.settings, letter.id.kind)
        return _Outgoing(topic, letter.key, json.dumps(value).encode(), headers)

    def _send(self, producer: Any, messages: Sequence[_Outgoing]) -> None:
        """Send all, flush once, and check every acknowledgement."""
        timeout = self.settings.send_timeout_ms / 1000
        try:
            futures = [
                producer.send(m.topic, key=m.key, value=m.value, headers=m.headers)
                for m in messages
            ]
            producer.flush(timeout=timeout)
            for future in futures:
                future.get(timeout=timeout)
        except KafkaError as error:
            raise KafkaUnavailableError(f"redrive not acknowledged by Kafka: {error!r}") from error


@dataclass(frozen=True)
class _Outgoing:
    topic: str
    key: bytes | None
    value: bytes | None
    headers: list[Header]


# ---- helpers -------------------------------------------------------------------------


def _read_topics(settings: KafkaSettings, topics: dict[str, Kind]) -> list[tuple[Kind, Any]]:
    """Every record of ``topics`` up to the end offsets as the read starts."""
    try:
        consumer = KafkaConsumer(
            bootstrap_servers=settings.servers,
            client_id=f"{settings.client_id}-dead-letters",
            enable_auto_commit=False,
            max_poll_records=2_000,
            fetch_max_wait_ms=100,
            **clients.reach_timeouts(settings),
        )
    except KafkaError as error:
        raise KafkaUnavailableError(
            f"cannot reach Kafka at {settings.bootstrap_servers}: {error!r}"
        ) from error
    try:
        return list(_drain(consumer, topics, settings.send_timeout_ms / 1000))
    except KafkaError as error:
        raise KafkaUnavailableError(f"cannot read the dead-letter topics: {error!r}") from error
    finally:
        consumer.close()


def _drain(consumer: Any, topics: dict[str, Kind], timeout: float) -> Iterator[tuple[Kind, Any]]:
    partitions = [
        TopicPartition(topic, p)
        for topic in topics
        for p in sorted(consumer.partitions_for_topic(topic) or ())
    ]
    if not partitions:
        return
    consumer.assign(partitions)
    consumer.seek_to_beginning(*partitions)
    ends = consumer.end_offsets(partitions)
    left = {tp for tp in partitions if consumer.position(tp) < ends[tp]}
    deadline = time.monotonic() + timeout
    while left:
        # A quiet wait this long means the broker stopped answering mid-read.
        if time.monotonic() > deadline:
            raise KafkaUnavailableError("the dead-letter topics stopped answering mid-read")
        for tp, records in consumer.poll(timeout_ms=200).items():
            deadline = time.monotonic() + timeout
            for record in records:
                if record.offset < ends[tp]:
                    yield topics[tp.topic], record
            if consumer.position(tp) >= ends[tp]:
                left.discard(tp)
                consumer.pause(tp)


def _redrive(names: dict[str, bytes]) -> Redrive:
    return Redrive(
        by=names.get(MARKER_BY, b"").decode("utf-8", "replace"),
        at=names.get(MARKER_AT, b"").decode("utf-8", "replace"),
        count=_int(names.get(MARKER_COUNT, b"").decode("utf-8", "replace")) or 1,
    )


def _with_redrives(letter: DeadLetter, redrives: Iterable[Redrive]) -> DeadLetter:
    # By count: a keyless letter's markers may sit on several partitions.
    return replace(letter, redrives=tuple(sorted(redrives, key=lambda r: r.count)))


def _dead_lettered_at(names: dict[str, bytes], timestamp_ms: int) -> datetime:
    """The worker's ``jobledger.dlq.at``, else the record's own timestamp."""
    stamped = names.get(f"{DLQ_PREFIX}at")
    if stamped is not None:
        try:
            return _aware(datetime.fromisoformat(stamped.decode()))
        except (UnicodeDecodeError, ValueError):
            pass  # a hand-made letter: its record's timestamp will do
    return datetime.fromtimestamp(timestamp_ms / 1000, UTC)


def _aware(moment: datetime) -> datetime:
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)


def _key_matches(pattern: str, key: str | None) -> bool:
    if key is None:
        return False
    if pattern.endswith("*"):
        return key.startswith(pattern[:-1])
    return key == pattern


def _int(text: str | None) -> int | None:
    return int(text) if text is not None and text.isdigit() else None


def _source_topic(settings: KafkaSettings, kind: Kind) -> str:
    return settings.ticks_topic if kind == "ticks" else settings.signals_topic


def _dlq_topic(settings: KafkaSettings, kind: Kind) -> str:
    return settings.ticks_dlq_topic if kind == "ticks" else settings.signals_dlq_topic


def _chunks(items: Sequence[DeadLetter], size: int) -> Iterator[Sequence[DeadLetter]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]
