"""The embedded runner: the supervisor configured for one process on the local queue.

Workers, the views and the reconciler in one process (``jobledger run``): nothing is lost
to a kill -9, the in-process queue is only a cache of what to do next (see
:mod:`jobledger.runtime.supervisor`).
"""

from __future__ import annotations

from jobledger.domain.errors import ConfigError
from jobledger.engine.engine import Engine
from jobledger.runtime.supervisor import Services, Supervisor

EMBEDDED = Services.of("run", kafka=False)


class EmbeddedRunner(Supervisor):
    def __init__(self, engine: Engine, services: Services = EMBEDDED) -> None:
        if engine.deps.local_queue is None:
            raise ConfigError("the embedded runner needs the local queue")
        super().__init__(engine, services)
