"""Ops sinks: structured JSON log lines, a list kept in memory, or several at once."""

from __future__ import annotations

import dataclasses
import json
import logging
import threading

from jobledger.orchestration.ports import Ops, OpsEvent


class LoggingOps:
    """One JSON object per ops event on the ``jobledger.ops`` logger."""

    def __init__(self, logger: logging.Logger | None = None) -> None:
        self.logger = logger or logging.getLogger("jobledger.ops")

    def record(self, event: OpsEvent) -> None:
        if self.logger.isEnabledFor(logging.INFO):
            self.logger.info(json.dumps(dataclasses.asdict(event), default=str))


class MemoryOps:
    def __init__(self) -> None:
        self.events: list[OpsEvent] = []
        self._lock = threading.Lock()

    def record(self, event: OpsEvent) -> None:
        with self._lock:
            self.events.append(event)

    def types(self, job_id: str | None = None) -> list[str]:
        return [e.eventType for e in self.events if job_id is None or e.jobId == job_id]


class TeeOps:
    """Every event to each sink in turn (the log and the metrics): a sink that fails is
    logged and the others still get it, since an ops event never fails a tick."""

    def __init__(self, *sinks: Ops) -> None:
        self.sinks = sinks

    def record(self, event: OpsEvent) -> None:
        for sink in self.sinks:
            try:
                sink.record(event)
            except Exception:
                logging.getLogger(__name__).exception("ops sink %r failed", sink)
