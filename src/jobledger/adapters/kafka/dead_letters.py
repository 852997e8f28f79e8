"""Dead letters: read, filter and redrive what the worker could not handle.

A dead letter is a message the worker copied to ``jobledger.ticks.dlq``,
``jobledger.signals.dlq`` or a subscription's dead-letter topic (see worker.py), named
``ticks:P:O``, ``signals:P:O`` or ``sub:NAME:P:O`` by its partition and offset there.
Redriving one sends the original message (key, value, its own headers) back to its source
topic (a subscription's: the topic it reads now) with ``jobledger.redrive.of`` (the
letter's id), ``jobledger.redrive.count`` and ``jobledger.redrive.origin`` (where it was
first read, ``topic:partition:offset``: a subscription's message keeps that identity, so
its redrive makes the job its first delivery would have made, once); then a marker record
(``jobledger.dlq.redrive_of``) goes to the dead-letter topic, so the next redrive skips
the letter unless forced.

Messages go out in batches: a batch is sent and flushed, then its markers are sent and
flushed. A redrive killed between the two sends that batch again when it is run again (at
least once, never lost); the engine makes that harmless: a tick only moves a job on from
what its store holds, a signal's id is consumed once, and a subscription's message finds
the job (or the signal) its identity made.
"""

from __future__ import annotations

import json
import time
from collections import Counter, defaultdict
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

Kind = Literal["ticks", "signals", "subscription"]
SUBSCRIPTION_PREFIX = "sub:"
DLQ_PREFIX = "jobledger.dlq."
REDRIVE_PREFIX = "jobledger.redrive."
REDRIVE_OF = "jobledger.redrive.of"
REDRIVE_COUNT = "jobledger.redrive.count"
REDRIVE_ORIGIN = "jobledger.redrive.origin"
MARKER_OF = "jobledger.dlq.redrive_of"
MARKER_BY = "jobledger.dlq.redrive_by"
MARKER_COUNT = "jobledger.dlq.redrive_count"
MARKER_AT = "jobledger.dlq.redrive_at"
BATCH_SIZE = 100
"""Messages per flush: one round trip per batch, not per message (a redrive of 2,000
letters took 5.5 s sent one at a time, 1.2 s in batches, its read of the topics included)."""

Progress = Callable[[int, int], None]
Header = tuple[str, bytes]


@dataclass(frozen=True)
class LetterSource:
    """Where letters come from and go back to: ``ticks``, ``signals`` or a subscription's
    ``sub:NAME``, with its source topic and its dead-letter topic."""

    name: str
    topic: str
    dlq_topic: str

    @property
    def kind(self) -> Kind:
        return _kind(self.name)

    @property
    def subscription(self) -> str | None:
        return self.name.removeprefix(SUBSCRIPTION_PREFIX) if self.kind == "subscription" else None


def _kind(source: str) -> Kind:
    if source.startswith(SUBSCRIPTION_PREFIX):
        return "subscription"
    return "ticks" if source == "ticks" else "signals"


def letter_sources(settings: KafkaSettings) -> list[LetterSource]:
    """Every source of letters, in the order they are listed: ticks, signals, then the
    subscriptions as configured."""
    return [
        LetterSource("ticks", settings.ticks_topic, settings.ticks_dlq_topic),
        LetterSource("signals", settings.signals_topic, settings.signals_dlq_topic),
        *(
            LetterSource(f"{SUBSCRIPTION_PREFIX}{s.name}", s.topic, s.dead_letter_topic)
            for s in settings.subscriptions
        ),
    ]


def source_named(settings: KafkaSettings, name: str) -> LetterSource:
    """``ticks``, ``signals`` or ``sub:NAME``; an unknown subscription is named with the
    known ones."""
    if name.startswith(SUBSCRIPTION_PREFIX):
        settings.subscription(name.removeprefix(SUBSCRIPTION_PREFIX))
    return next(source for source in letter_sources(settings) if source.name == name)


@dataclass(frozen=True, order=True)
class LetterId:
    """``ticks:P:O``, ``signals:P:O`` or ``sub:NAME:P:O``: where the letter sits on its
    dead-letter topic."""

    source: str
    partition: int
    offset: int

    @classmethod
    def parse(cls, text: str) -> LetterId:
        source, _, rest = text.partition(":")
        if source == SUBSCRIPTION_PREFIX[:-1]:
            name, _, rest = rest.partition(":")
            source = f"{SUBSCRIPTION_PREFIX}{name}" if name else ""
        partition, _, offset = rest.partition(":")
        if source not in ("ticks", "signals") and not source.startswith(SUBSCRIPTION_PREFIX):
            source = ""
        if not source or not partition.isdigit() or not offset.isdigit():
            raise DeadLetterError(
                f"bad dead letter id {text!r}: expected ticks:PARTITION:OFFSET, "
                "signals:PARTITION:OFFSET or sub:SUBSCRIPTION:PARTITION:OFFSET"
            )
        return cls(source, int(partition), int(offset))

    @property
    def kind(self) -> Kind:
        return _kind(self.source)

    def __str__(self) -> str:
        return f"{self.source}:{self.partition}:{self.offset}"


@dataclass(frozen=True)
class Redrive:
    """One marker: the letter was sent back, by whom, when, the how-manieth time."""

    by: str
    at: str
    count: int


@dataclass(frozen=True)
class DeadLetter:
    id: LetterId
    source: LetterSource
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

    @property
    def origin(self) -> str | None:
        """Where the message was first read, ``topic:partition:offset``: the position an
        earlier redrive carried, else the one the worker dead-lettered it from."""
        carried = self.header(REDRIVE_ORIGIN)
        if carried is not None:
            return carried
        topic = self.header(f"{DLQ_PREFIX}topic")
        partition = _int(self.header(f"{DLQ_PREFIX}partition"))
        offset = _int(self.header(f"{DLQ_PREFIX}offset"))
        if topic is None or partition is None or offset is None:
            return None  # a letter made by hand says nothing of where it came from
        return f"{topic}:{partition}:{offset}"

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
            "kind": self.source.kind,
            "subscription": self.source.subscription,
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
            "origin": self.origin,
            "headers": {n: v.decode("utf-8", "replace") for n, v in self.original_headers()},
            "redrives": [{"by": r.by, "at": r.at, "count": r.count} for r in self.redrives],
        }


@dataclass(frozen=True)
class LetterFilter:
    """Every given criterion must hold: ``reason`` exactly, dead-lettered at or after
    ``since`` and before ``until``, ``key`` exactly (or, ending in ``*``, as a prefix),
    ``topic`` the source (``ticks``, ``signals``, or a source or dead-letter topic's
    name), ``subscription`` the subscription of that name."""

    reason: str | None = None
    since: datetime | None = None
    until: datetime | None = None
    key: str | None = None
    topic: str | None = None
    subscription: str | None = None

    @property
    def is_empty(self) -> bool:
        criteria = (self.reason, self.since, self.until, self.key, self.topic, self.subscription)
        return all(v is None for v in criteria)

    def matches(self, letter: DeadLetter) -> bool:
        at = letter.dead_lettered_at
        return (
            (self.reason is None or letter.reason == self.reason)
            and (self.since is None or at >= _aware(self.since))
            and (self.until is None or at < _aware(self.until))
            and (self.key is None or _key_matches(self.key, letter.key_text))
        )

    def sources(self, settings: KafkaSettings) -> list[LetterSource]:
        """The sources worth reading for ``subscription`` and ``topic``; an unknown
        subscription, or a topic of no source, is refused (it would silently match
        nothing)."""
        sources = letter_sources(settings)
        if self.subscription is not None:
            sources = [source_named(settings, SUBSCRIPTION_PREFIX + self.subscription)]
        if self.topic is None:
            return sources
        chosen = [s for s in sources if self.topic in (s.name, s.topic, s.dlq_topic)]
        if not chosen:
            known = ", ".join(["ticks", "signals", *(s.topic for s in sources)])
            raise DeadLetterError(f"unknown topic {self.topic!r}: expected one of {known}")
        return chosen


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
        """The letters the filter matches, ticks, signals, then each subscription's, in
        partition and offset order, each with the redrives its markers record."""
        chosen = letter_filter or LetterFilter()
        letters = self._load(chosen.sources(self.settings))
        return [letter for letter in letters if chosen.matches(letter)]

    def get(self, letter_id: str) -> DeadLetter:
        wanted = LetterId.parse(letter_id)
        for letter in self._load([source_named(self.settings, wanted.source)]):
            if letter.id == wanted:
                return letter
        raise UnknownDeadLetterError(letter_id)

    def waiting(self) -> Counter[str]:
        """Per subscription: its letters not redriven yet."""
        sources = [s for s in letter_sources(self.settings) if s.subscription is not None]
        return Counter(
            letter.source.subscription or ""
            for letter in self._load(sources)
            if not letter.redriven
        )

    def _load(self, sources: Sequence[LetterSource]) -> list[DeadLetter]:
        records = _read_topics(self.settings, {source.dlq_topic: source for source in sources})
        redrives: dict[str, list[Redrive]] = defaultdict(list)
        letters: list[DeadLetter] = []
        for source, record in records:
            headers = tuple(record.headers or ())
            names = dict(headers)
            if MARKER_OF in names:
                redrives[names[MARKER_OF].decode("utf-8", "replace")].append(_redrive(names))
                continue
            letters.append(
                DeadLetter(
                    LetterId(source.name, record.partition, record.offset),
                    source,
                    record.key,
                    record.value,
                    headers,
                    _dead_lettered_at(names, record.timestamp),
                )
            )
        order = {source.name: n for n, source in enumerate(sources)}
        return [
            _with_redrives(letter, redrives.get(str(letter.id), []))
            for letter in sorted(letters, key=lambda each: (order[each.id.source], each.id))
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
        for source in {w.source for w in wanted}:
            source_named(self.settings, source)  # a subscription not configured is named
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
        origin = letter.origin
        headers = [
            *letter.original_headers(),
            (REDRIVE_OF, str(letter.id).encode()),
            (REDRIVE_COUNT, str(count).encode()),
            *([] if origin is None else [(REDRIVE_ORIGIN, origin.encode())]),
        ]
        return _Outgoing(letter.source.topic, letter.key, letter.value, headers)

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
        return _Outgoing(letter.source.dlq_topic, letter.key, json.dumps(value).encode(), headers)

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


def _read_topics(
    settings: KafkaSettings, topics: dict[str, LetterSource]
) -> list[tuple[LetterSource, Any]]:
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


def _drain(
    consumer: Any, topics: dict[str, LetterSource], timeout: float
) -> Iterator[tuple[LetterSource, Any]]:
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


def _chunks(items: Sequence[DeadLetter], size: int) -> Iterator[Sequence[DeadLetter]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]
