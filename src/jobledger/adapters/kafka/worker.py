"""The Kafka worker: a consumer-group member that handles ticks and signals.

The rule that matters: an offset is committed only after the message's effect is
durable, never before (a consumer that commits first loses the message when it dies in
between, as DBOS's Kafka consumer did: dbos-transact-py#733). The effect of a tick is
its appends to the store and the ticks it publishes (acknowledged before ``enqueue``
returns); the effect of a dead-lettered message is its copy on the dead-letter topic.

- A malformed or undecodable message, or one about a job that does not exist, goes to
  the dead-letter topic with the reason in its headers; then its offset is committed.
- An infrastructure error (the store or the broker unavailable) is NOT committed: the
  partition is rewound to the failed message and the worker backs off and retries, so
  no message is ever skipped. The retry of a tick keeps the claim it held.
- A worker that dies mid-message leaves its offset uncommitted: the message is delivered
  again (to this worker after a restart, or to another after the rebalance). Claims and
  step keys make that safe: a recorded step is never recorded or run again.

Commits are sent after every polled batch, before the next poll, without waiting for
the coordinator's answer: the next message does not wait out that round trip, and a
commit that is lost only means messages already handled are delivered again. When the
worker stops, its last offsets are committed again, waiting. Rebalances only happen
inside poll(), so nothing is pending when the rebalance listener runs; the listener
only records assignments (it runs on the client's IO thread, where the blocking
commit() must not be called).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Protocol

from kafka import ConsumerRebalanceListener, OffsetAndMetadata, TopicPartition
from kafka.errors import KafkaError

from jobledger.adapters.kafka import clients, subscriptions
from jobledger.adapters.kafka.clients import KafkaUnavailableError
from jobledger.adapters.kafka.messages import (
    MalformedMessage,
    SignalMessage,
    TickMessage,
    decode_signal,
    decode_tick,
)
from jobledger.adapters.kafka.pauses import PauseBoard
from jobledger.adapters.kafka.settings import KafkaSettings
from jobledger.domain.errors import (
    ConcurrencyError,
    DeploymentError,
    InvalidPayloadError,
    JobFinishedError,
    JobLedgerError,
    StoreUnavailableError,
    UnknownJobError,
)
from jobledger.domain.status import JobStatus
from jobledger.orchestration import retry, tracing
from jobledger.orchestration.lanes import Lanes
from jobledger.orchestration.ports import Ops, OpsEvent, Queue, Tick
from jobledger.orchestration.tracing import Span, Tracer, trace_context

if TYPE_CHECKING:
    from jobledger.orchestration.orchestrator import TickReport

log = logging.getLogger(__name__)

BACKOFF = retry.Backoff(base_seconds=0.2, cap_seconds=5.0)
HANDLER_ATTEMPTS = 3
"""An unexpected exception (a bug) is retried this often before the message is
dead-lettered, so one poison message cannot stall its partition for ever."""
DLQ_HEADER_PREFIX = "jobledger.dlq."
PAUSED_ENDS_SECONDS = 2.0
"""How often the end offsets of paused partitions are asked for: a paused partition is
not fetched, so the last fetch's high-water mark would hide the lag growing behind it."""

Position = tuple[str, int, int]
TickObserver = Callable[[TickMessage, "TickReport | None"], None]
RecordHook = Callable[[Any], None]


@dataclass
class WorkerStats:
    ticks: int = 0
    signals: int = 0
    subscribed: int = 0
    """Messages of subscribed topics made jobs (or signals) of, deliveries again included."""
    dead_lettered: int = 0
    retried: int = 0
    committed: int = 0
    commit_failures: int = 0
    assignments: list[frozenset[TopicPartition]] = field(default_factory=list)
    outcomes: Counter[str] = field(default_factory=Counter)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def count(self, name: str, outcome: str | None = None) -> None:
        """One more of ``name`` (and of ``outcome``): lanes count from their threads."""
        with self._lock:
            setattr(self, name, getattr(self, name) + 1)
            if outcome is not None:
                self.outcomes[outcome] += 1


class TickEngine(subscriptions.SubmittingEngine, Protocol):
    """What the worker needs of the engine (``jobledger.Engine`` is one): the adapter
    knows the facade's shape, never the facade."""

    queue: Queue
    ops: Ops
    tracer: Tracer

    def run_tick(self, tick: Tick) -> TickReport: ...

    def deployment_blocked(self, error: DeploymentError) -> None: ...


class KafkaWorker:
    def __init__(
        self,
        engine: TickEngine,
        settings: KafkaSettings,
        *,
        stopping: threading.Event | None = None,
        max_poll_records: int = 50,
        concurrency: int = 1,
        on_tick: TickObserver | None = None,
        after_effect: RecordHook | None = None,
    ) -> None:
        self.engine = engine
        self.settings = settings
        self.stopping = stopping if stopping is not None else threading.Event()
        self.max_poll_records = max_poll_records
        self.on_tick = on_tick
        self.after_effect = after_effect
        """Called once a message's effect is durable, before its offset is committed."""
        self.stats = WorkerStats()
        self.assignment: frozenset[TopicPartition] = frozenset()
        self.joined = threading.Event()
        self.failures = 0
        self._claims: dict[Position, str] = {}
        self._errors: Counter[Position] = Counter()
        self._dlq_producer: Any = None
        self.concurrency = concurrency
        self._halted = threading.Event()
        self._done: dict[Position, bool] = {}
        self._sent: dict[TopicPartition, OffsetAndMetadata] = {}
        """The offsets last sent for commit, per partition: committed again at the stop."""
        self.consumer_lag: dict[tuple[str, int], int] = {}
        """Per assigned (topic, partition): messages between this worker's position and
        the partition's end, as of its last poll (replaced whole, so a scrape reads one)."""
        self.pauses = PauseBoard(settings) if settings.subscriptions else None
        self.paused_subscriptions: frozenset[str] = frozenset()
        """The subscriptions paused as of the last loop (replaced whole, as the lag is)."""
        self.paused_topics: frozenset[str] = frozenset()
        self._paused_ends: dict[TopicPartition, int] = {}
        self._paused_ends_at = 0.0

    # ---- the loop ----------------------------------------------------------------------

    def run(self) -> None:
        """Poll, handle, commit until ``stopping`` is set; then leave the group."""
        if self.pauses is not None:
            # Before joining: the partitions of a paused subscription are paused as they
            # are assigned, never fetched first.
            self.pauses.open()
            self.note_pauses()
        listener = _Listener(self)
        try:
            consumer = clients.consumer(
                self.settings,
                topics=[
                    self.settings.ticks_topic,
                    self.settings.signals_topic,
                    *(s.topic for s in self.settings.subscriptions),
                ],
                listener=listener,
                max_poll_records=self.max_poll_records,
            )
        except KafkaUnavailableError:
            self.close_pauses()
            raise
        listener.consumer = consumer
        # Lanes per run: a worker the supervisor restarts after a crash starts afresh. A
        # job's ticks and signals share its key, so they stay in order on one lane.
        lanes: Lanes[Any] = Lanes(
            self.concurrency,
            self._process_in_lane,
            _lane_of,
            name=f"{self.settings.worker_id}-lane",
        )
        try:
            while not self.stopping.is_set():
                self.obey_pauses(consumer)
                try:
                    batch = consumer.poll(timeout_ms=200)
                except KafkaError as error:
                    self.failures += 1
                    delay = self.backoff()
                    log.warning("poll failed, retrying after %.1fs: %r", delay, error)
                    self.stopping.wait(delay)
                    continue
                self.note_lag(consumer, batch)
                if batch:
                    self.process_batch(consumer, batch, lanes)
        finally:
            try:
                lanes.close()
                self.settle(consumer)
                consumer.close(autocommit=False)
            finally:
                self.close_pauses()
                producer, self._dlq_producer = self._dlq_producer, None
                if producer is not None:
                    producer.close(timeout=5)

    def stop(self) -> None:
        self.stopping.set()

    # ---- pausing subscriptions (pauses.py) ---------------------------------------------

    def note_pauses(self) -> None:
        """The configured subscriptions the switches say are paused, and their topics."""
        assert self.pauses is not None
        subscribed = self.settings.subscriptions
        paused = frozenset(s.name for s in subscribed if s.name in self.pauses.paused)
        for name in sorted(paused ^ self.paused_subscriptions):
            state = self.pauses.states.get(name)
            log.info(
                "%s: subscription %s %s%s",
                self.settings.worker_id,
                name,
                "paused" if name in paused else "resumed",
                "" if state is None else f" by {state.by} ({state.reason or 'no reason given'})",
            )
        self.paused_subscriptions = paused
        self.paused_topics = frozenset(s.topic for s in subscribed if s.name in paused)

    def obey_pauses(self, consumer: Any) -> None:
        """Read the switches set since the last loop, pause the partitions held of paused
        subscriptions' topics and resume the others: obeyed before the next poll."""
        if self.pauses is None:
            return
        self.pauses.refresh()
        self.note_pauses()
        topics = self.paused_topics
        consumer.pause(*[tp for tp in consumer.assignment() if tp.topic in topics])
        consumer.resume(*[tp for tp in consumer.paused() if tp.topic not in topics])

    def close_pauses(self) -> None:
        if self.pauses is not None:
            self.pauses.close()

    def paused_ends(self, consumer: Any) -> dict[TopicPartition, int]:
        """The end offsets of the paused partitions held, asked for every few seconds."""
        paused = consumer.paused()
        stale = time.monotonic() - self._paused_ends_at >= PAUSED_ENDS_SECONDS
        if paused and (stale or set(self._paused_ends) != paused):
            self._paused_ends_at = time.monotonic()
            try:
                self._paused_ends = dict(consumer.end_offsets(list(paused), timeout_ms=1_000))
            except KafkaError as error:
                log.debug("end offsets of paused partitions not read: %r", error)
        return {tp: end for tp, end in self._paused_ends.items() if tp in paused}

    def note_lag(self, consumer: Any, batch: dict[TopicPartition, list[Any]]) -> None:
        """Each assigned partition's lag as a poll leaves it, before its batch is handled:
        the messages from the first one in hand (else the position) to the end the last
        fetch reported. No request of its own (but for paused partitions, whose ends no
        fetch reports): a partition not fetched yet is left out."""
        in_hand = {tp: records[0].offset for tp, records in batch.items() if records}
        paused_ends = self.paused_ends(consumer) if self.pauses is not None else {}
        lag: dict[tuple[str, int], int] = {}
        for partition in consumer.assignment():
            end = paused_ends.get(partition)
            if end is None:
                end = consumer.highwater(partition)
            if end is None:
                continue
            position = in_hand.get(partition)
            if position is None:
                try:
                    position = consumer.position(partition, timeout_ms=0)
                except KafkaError:
                    continue
            if position is not None:
                lag[(partition.topic, partition.partition)] = max(0, end - position)
        self.consumer_lag = lag

    def process_batch(
        self, consumer: Any, batch: dict[TopicPartition, list[Any]], lanes: Lanes[Any]
    ) -> None:
        """Handle a polled batch, up to ``concurrency`` jobs at once and each job's
        messages in order; commit each partition up to its first message not done; rewind
        it to that message, and back off when one hit an infrastructure error."""
        self._halted.clear()
        self._done.clear()
        for records in batch.values():
            for record in records:
                lanes.put(record)
        lanes.join()
        done: dict[TopicPartition, int] = {}
        failed = False
        for partition, records in batch.items():
            for record in records:
                outcome = self._done.get((record.topic, record.partition, record.offset))
                if outcome is not True:
                    failed = failed or outcome is False
                    consumer.seek(partition, record.offset)
                    break
                done[partition] = record.offset + 1
        self.commit(consumer, done)
        if failed:
            self.failures += 1
            self.stopping.wait(self.backoff())
        else:
            self.failures = 0

    def _process_in_lane(self, record: Any) -> None:
        """One message of a batch, on a lane's thread. Once one message must be read
        again (the store or the broker is away), the rest of the batch is left for the
        retry; so is everything after a stop, past the messages in hand."""
        if self.stopping.is_set() or self._halted.is_set():
            return
        ok = self.process(record)
        if ok and self.after_effect is not None:
            self.after_effect(record)
        if not ok:
            self._halted.set()
        self._done[(record.topic, record.partition, record.offset)] = ok

    def commit(self, consumer: Any, offsets: dict[TopicPartition, int]) -> None:
        """Send the offsets of handled messages; the answer is counted when it comes."""
        if not offsets:
            return
        stamped = {tp: OffsetAndMetadata(o, "", -1) for tp, o in offsets.items()}
        self._sent.update(stamped)
        try:
            consumer.commit_async(stamped, callback=self._answered)
        except KafkaError as error:
            self._answered(stamped, error)

    def _answered(self, offsets: dict[TopicPartition, Any], response: object) -> None:
        """A commit's answer (on the polling thread). A refusal (the partition was taken
        away, the coordinator is away) means those messages are delivered again, which
        is safe; nothing is skipped."""
        if isinstance(response, Exception):
            self.stats.commit_failures += 1
            log.warning("offset commit failed; the messages will be re-delivered: %r", response)
            return
        self.stats.committed += len(offsets)

    def settle(self, consumer: Any) -> None:
        """At the stop, commit the last offsets sent again and wait for the answer, for
        the partitions this worker still holds: an answer still on its way when the
        consumer closes would be lost, and those messages handled again."""
        held = consumer.assignment()
        offsets = {tp: o for tp, o in self._sent.items() if tp in held}
        self._sent.clear()
        if not offsets:
            return
        try:
            consumer.commit(offsets)
        except KafkaError as error:
            self._answered(offsets, error)

    def backoff(self) -> float:
        """Grows with each consecutive failure, with jitter: workers that lost the same
        store at once do not all come back to it in the same instant."""
        return BACKOFF.delay(self.failures)

    # ---- one message ---------------------------------------------------------------------

    def process(self, record: Any) -> bool:
        """True when the message is done with (its offset may be committed), False when
        it must be read again."""
        position: Position = (record.topic, record.partition, record.offset)
        try:
            subscription = self.settings.subscription_for(record.topic)
            if subscription is not None:
                outcome = subscriptions.handle(self.engine, subscription, record)
                self.stats.count("subscribed", f"{subscription.name}_{outcome}")
            elif record.topic == self.settings.signals_topic:
                self.handle_signal(record)
            else:
                self.handle_tick(record, position)
        except MalformedMessage as bad:
            return self.dead_letter(record, bad.reason, bad.detail)
        except (StoreUnavailableError, ConcurrencyError) as error:
            if isinstance(error, StoreUnavailableError) and error.claim_id:
                self._claims[position] = error.claim_id
            self.stats.count("retried")
            log.warning(
                "%s[%d]@%d hit an infrastructure error; it will be retried: %s",
                *position,
                error,
            )
            return False
        except Exception as error:  # a bug: retry a few times, then dead-letter it
            self._errors[position] += 1
            if self._errors[position] < HANDLER_ATTEMPTS:
                log.exception("%s[%d]@%d failed; it will be retried", *position)
                self.stats.count("retried")
                return False
            log.exception(
                "%s[%d]@%d failed %d times; dead-lettering it", *position, HANDLER_ATTEMPTS
            )
            return self.dead_letter(record, "handler_error", repr(error))
        self._claims.pop(position, None)
        self._errors.pop(position, None)
        return True

    def handle_tick(self, record: Any, position: Position) -> None:
        message = decode_tick(record.value, record.headers)
        # A retry after an infrastructure error goes on with the claim it held.
        tick = replace(message.tick, claim_id=self._claims.get(position))
        report: TickReport | None = None
        try:
            report = self.engine.run_tick(tick)
        except UnknownJobError as error:
            raise MalformedMessage("unknown_job", str(error)) from None
        except InvalidPayloadError as error:
            raise MalformedMessage("invalid", str(error)) from None
        except StoreUnavailableError:
            raise
        except DeploymentError as error:
            # Not this worker's to run (a rolling deploy): the job is untouched, the
            # message is done with, and the reconciler publishes the tick again while the
            # job is due. Rewinding instead would stall the whole partition behind it.
            self.engine.deployment_blocked(error)
        except JobLedgerError as error:
            # What Engine.handle does: reported and dropped (the reconciler re-publishes
            # the tick while the job is due, e.g. once a missing executor is deployed).
            self.ops(tick, "job.tick.rejected", error=str(error), reason=tick.reason)
        self.stats.count("ticks", None if report is None else str(report.outcome))
        if self.on_tick is not None:
            self.on_tick(message, report)

    def handle_signal(self, record: Any) -> None:
        signal = decode_signal(record.value)
        with self.signal_span(signal, record) as span:
            try:
                outcome = self.engine.signal(
                    signal.tenant_id,
                    signal.job_id,
                    signal.event,
                    signal.payload,
                    signal_id=signal.signal_id,
                )
            except UnknownJobError as error:
                raise MalformedMessage("unknown_job", str(error)) from None
            except InvalidPayloadError as error:
                raise MalformedMessage("invalid", str(error)) from None
            except JobFinishedError as error:
                raise MalformedMessage("job_finished", str(error)) from None
            span.set({"jobledger.signal.outcome": str(outcome)})
        self.stats.count("signals", f"signal_{outcome}")
        if outcome == "duplicate":
            self.wake_if_queued(signal)

    @contextmanager
    def signal_span(self, signal: SignalMessage, record: Any) -> Iterator[Span]:
        """A signal sent with a trace context (``traceparent``) is delivered in a span of
        the sender's trace, as an HTTP request's would be: the job's wake span, in the
        job's own trace, links it. Without one, the wake continues the job's trace alone."""
        sender = trace_context(record.headers)
        tracer = self.engine.tracer if sender is not None else tracing.NOOP
        attributes = {
            "jobledger.tenant_id": signal.tenant_id,
            "jobledger.job_id": signal.job_id,
            "jobledger.signal.event": signal.event,
            "jobledger.signal.id": signal.signal_id,
        }
        opened = tracer.span("jobledger.signal", parent=sender, attributes=attributes)
        with opened as span, tracing.logged(span, tenant=signal.tenant_id, job=signal.job_id):
            yield span

    def wake_if_queued(self, signal: SignalMessage) -> None:
        """A re-delivered signal finds its id used. If the first delivery resumed the
        job but died before publishing the tick, the job sits queued: publish it now."""
        view = self.engine.job(signal.tenant_id, signal.job_id)
        if view.status is JobStatus.QUEUED:
            self.engine.queue.enqueue(
                Tick(signal.tenant_id, signal.job_id, "signal"),
                dedupe_key=f"signal:{view.version}",
            )

    # ---- the dead-letter topic -------------------------------------------------------

    def dead_letter(self, record: Any, reason: str, detail: str) -> bool:
        """Copy the message to the dead-letter topic, with why, and wait for the ack.
        False (retry) if the broker did not take it."""
        topic = self.settings.dlq_for(record.topic)
        headers = [
            *list(record.headers or []),
            (f"{DLQ_HEADER_PREFIX}reason", reason.encode()),
            (f"{DLQ_HEADER_PREFIX}error", detail[:2000].encode()),
            (f"{DLQ_HEADER_PREFIX}topic", record.topic.encode()),
            (f"{DLQ_HEADER_PREFIX}partition", str(record.partition).encode()),
            (f"{DLQ_HEADER_PREFIX}offset", str(record.offset).encode()),
            (f"{DLQ_HEADER_PREFIX}worker", self.settings.worker_id.encode()),
            (f"{DLQ_HEADER_PREFIX}at", datetime.now(UTC).isoformat().encode()),
        ]
        try:
            if self._dlq_producer is None:
                self._dlq_producer = clients.producer(self.settings, role="dlq")
            future = self._dlq_producer.send(
                topic, key=record.key, value=record.value, headers=headers
            )
            future.get(timeout=self.settings.send_timeout_ms / 1000)
        except (KafkaError, KafkaUnavailableError) as error:
            log.warning("could not dead-letter %s@%d; retrying: %r", topic, record.offset, error)
            self.stats.count("retried")
            return False
        self.stats.count("dead_lettered")
        log.warning(
            "dead-lettered %s[%d]@%d to %s: %s: %s",
            record.topic,
            record.partition,
            record.offset,
            topic,
            reason,
            detail,
        )
        kind = "signal" if record.topic == self.settings.signals_topic else "tick"
        if self.settings.subscription_for(record.topic) is not None:
            kind = "subscription"
        self.engine.ops.record(
            OpsEvent(
                jobId="",
                tenantId="",
                eventType=f"job.{kind}.dead_lettered",
                status="unknown",
                queueName=record.topic,
                metadata={
                    "reason": reason,
                    "error": detail,
                    "partition": record.partition,
                    "offset": record.offset,
                    "deadLetterTopic": topic,
                },
            )
        )
        return True

    def ops(self, tick: Tick, event_type: str, **metadata: Any) -> None:
        self.engine.ops.record(
            OpsEvent(
                jobId=tick.job_id,
                tenantId=tick.tenant_id,
                eventType=event_type,
                status="unknown",
                queueName=self.settings.ticks_topic,
                metadata=metadata,
            )
        )


class _Listener(ConsumerRebalanceListener):  # type: ignore[misc]
    """Runs on the client's IO thread: it records, and pauses what it must; it never
    commits."""

    def __init__(self, worker: KafkaWorker) -> None:
        self.worker = worker
        self.consumer: Any = None

    def on_partitions_revoked(self, revoked: Any) -> None:
        log.info("%s: partitions revoked: %s", self.worker.settings.worker_id, sorted(revoked))

    def on_partitions_assigned(self, assigned: Any) -> None:
        # Kafka forgets a pause when it assigns the partition again: paused before any
        # fetch of the new assignment.
        paused = [tp for tp in assigned if tp.topic in self.worker.paused_topics]
        if paused and self.consumer is not None:
            self.consumer.pause(*paused)
        self.worker.assignment = frozenset(assigned)
        self.worker.stats.assignments.append(frozenset(assigned))
        self.worker.joined.set()
        log.info("%s: partitions assigned: %s", self.worker.settings.worker_id, sorted(assigned))


def _lane_of(record: Any) -> Any:
    return record.key if record.key is not None else (record.topic, record.partition)
