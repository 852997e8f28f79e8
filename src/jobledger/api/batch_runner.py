"""Batches run in the background of the API process, one thread each.

A request starts a batch (its jobs frozen) and hands it here; the answer (202) does not
wait for the jobs. A batch whose runner died with its process is taken up again when the
API starts (``resume_unfinished``) or on request: it goes on from the first job without
an outcome, and the marks in the jobs' own appends keep any job from being acted on
twice, even when two processes take up the same batch (the loser stops at its next
outcome: ``BatchBusyError``).
"""

from __future__ import annotations

import logging
import threading

from jobledger.domain.errors import BatchBusyError, JobLedgerError
from jobledger.engine.engine import Engine

log = logging.getLogger(__name__)


class BatchRunner:
    def __init__(self, engine: Engine) -> None:
        self._engine = engine
        self._lock = threading.Lock()
        self._running: dict[tuple[str, str], threading.Thread] = {}
        self._resumer: threading.Thread | None = None
        self._stopping = threading.Event()

    def run(self, tenant_id: str, batch_id: str) -> None:
        """Run the batch in a thread of its own, unless this process runs it already."""
        key = (tenant_id, batch_id)
        with self._lock:
            if key in self._running or self._stopping.is_set():
                return
            thread = threading.Thread(
                target=self._run, args=key, name=f"jobledger-batch-{batch_id}", daemon=True
            )
            self._running[key] = thread
        thread.start()

    def _run(self, tenant_id: str, batch_id: str) -> None:
        try:
            self._engine.bulk.run(tenant_id, batch_id, stopping=self._stopping)
        except BatchBusyError:
            log.info("batch %s/%s is run by another process", tenant_id, batch_id)
        except JobLedgerError as error:  # a store outage: resumed on the next start or request
            log.warning("batch %s/%s stopped: %s", tenant_id, batch_id, error)
        finally:
            with self._lock:
                del self._running[(tenant_id, batch_id)]

    def resume_unfinished(self) -> None:
        """Take up every batch not finished (in a thread: the API need not wait for it)."""

        def resume() -> None:
            try:
                unfinished = self._engine.bulk.unfinished()
            except JobLedgerError as error:
                log.warning("unfinished batches not resumed: %s", error)
                return
            for tenant_id, batch_id in unfinished:
                self.run(tenant_id, batch_id)

        self._resumer = threading.Thread(target=resume, name="jobledger-batch-resume", daemon=True)
        self._resumer.start()

    def wait(self, timeout: float | None = None) -> None:
        """Until the batches running now end (a server stopping, a test)."""
        with self._lock:
            threads = list(self._running.values())
        for thread in threads:
            thread.join(timeout)

    def close(self, timeout: float | None = None) -> None:
        """Stop taking batches up and wait for those running to stop after their current
        job: the engine they use is closed next (an unfinished batch is resumed later)."""
        self._stopping.set()
        if self._resumer is not None:
            self._resumer.join(timeout)
        self.wait(timeout)
