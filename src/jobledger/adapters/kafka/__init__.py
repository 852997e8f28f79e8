"""Apache Kafka adapters: ticks in and out (the Queue port), the consumer-group worker
(``worker``), signals in, the publisher the event outbox writes through
(``publisher``), and the dead letters read and redriven (``dead_letters``).

Topics (names configurable, see :class:`KafkaSettings`): ``jobledger.ticks`` (keyed by
tenant/job so one job's ticks stay in order on one partition), ``jobledger.ticks.dlq``,
``jobledger.signals``, ``jobledger.signals.dlq`` and ``jobledger.events``.
"""

from jobledger.adapters.kafka.clients import KafkaUnavailableError, ensure_topics
from jobledger.adapters.kafka.messages import MalformedMessage, SignalMessage, job_key
from jobledger.adapters.kafka.queue import KafkaQueue
from jobledger.adapters.kafka.settings import KafkaSettings

__all__ = [
    "KafkaQueue",
    "KafkaSettings",
    "KafkaUnavailableError",
    "MalformedMessage",
    "SignalMessage",
    "ensure_topics",
    "job_key",
]
