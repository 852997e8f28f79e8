"""The Kafka runner: the supervisor configured for a Kafka-driven service.

Any mix of consumer-group workers, the views, the event outbox and the reconciler, in one
process (``jobledger run --transport kafka`` runs all of them; see
:mod:`jobledger.runtime.supervisor`).
"""

from __future__ import annotations

from jobledger.adapters.kafka.worker import RecordHook, TickObserver
from jobledger.domain.errors import ConfigError
from jobledger.engine.engine import Engine
from jobledger.runtime.supervisor import Services, Supervisor

KafkaRunnerSettings = Services
"""The roles a Kafka-driven process runs (the supervisor's :class:`Services`)."""


class KafkaRunner(Supervisor):
    def __init__(
        self,
        engine: Engine,
        settings: Services | None = None,
        *,
        on_tick: TickObserver | None = None,
        after_effect: RecordHook | None = None,
    ) -> None:
        settings = settings or Services(workers=1)
        if (settings.workers or settings.reconciler) and engine.deps.kafka_queue is None:
            raise ConfigError("Kafka workers and the Kafka reconciler need transport = kafka")
        super().__init__(engine, settings, on_tick=on_tick, after_effect=after_effect)
