"""The tick, as the facade offers it: one job by hand, one tick as delivered, the local
queue drained, and what a consumer does with a tick that cannot run as deployed."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Hashable
from dataclasses import replace

from jobledger.adapters.local_queue import LocalQueue
from jobledger.domain.errors import (
    ConfigError,
    DeploymentError,
    JobLedgerError,
    StoreUnavailableError,
)
from jobledger.engine.admission_gate import Gatekeeper
from jobledger.engine.bootstrap import Deps
from jobledger.orchestration import retry, tracing
from jobledger.orchestration.group_commit import GroupCommitter
from jobledger.orchestration.lanes import Lanes
from jobledger.orchestration.orchestrator import Orchestrator, TickReport
from jobledger.orchestration.ports import BlockedNote, BlockedNotes, OpsEvent, Tick

log = logging.getLogger(__name__)


class TickRunner:
    """Runs ticks through the orchestrator, their step appends committed together by
    ``group``, and frees or lends the gate's places of the jobs they moved."""

    def __init__(
        self,
        deps: Deps,
        orchestrator: Orchestrator,
        group: GroupCommitter,
        gatekeeper: Gatekeeper,
    ) -> None:
        self._deps = deps
        self._orchestrator = orchestrator
        self._group = group
        self._gatekeeper = gatekeeper
        self._blocked_notes: BlockedNotes | None = None
        self._draining = threading.Lock()
        """One drain of the local queue at a time: drains share the lanes."""
        self._lanes: Lanes[Tick] | None = None
        self._failed: list[BaseException] = []
        """What the ticks of the current drain raised."""

    def note_blocked_in(self, notes: BlockedNotes) -> None:
        """Note there the jobs a tick leaves untouched for a deployment error, so ``show``
        and ``list`` say why (the supervisor gives its views, when it runs workers)."""
        self._blocked_notes = notes

    def tick(self, tenant_id: str, job_id: str, reason: str = "queue") -> TickReport:
        return self.run_tick(Tick(tenant_id, job_id, reason))

    def run_tick(self, tick: Tick) -> TickReport:
        """One tick as delivered (an interrupted tick's claim included), every error left
        to the caller: what a consumer that answers with offsets needs (``handle`` is the
        local queue's, which answers by re-enqueueing)."""
        started = time.perf_counter()
        try:
            # Counted in flight, whoever runs it (run_until_idle, the run command's workers,
            # a Kafka worker): a group commit waits only for ticks that are running.
            with self._group.running():
                report = self._orchestrator.tick(tick)
        except JobLedgerError as error:
            self._tick_ended(tick, "unknown", _error_outcome(error), started, error=error)
            raise
        self._tick_ended(tick, str(report.status), str(report.outcome), started, report=report)
        self._gatekeeper.after_tick(report, tick)
        # Logged once its span has ended, under its ids, so the line joins the trace.
        with tracing.logged(report.span, tenant=tick.tenant_id, job=tick.job_id, step=report.step):
            log.info(
                "tick %s/%s (%s): %s, %d step(s), now %s at step %d, v%d, %.1f ms",
                tick.tenant_id,
                tick.job_id,
                tick.reason,
                report.outcome,
                report.steps_executed,
                report.status,
                report.step,
                report.version,
                (time.perf_counter() - started) * 1000,
            )
        return report

    def _tick_ended(
        self,
        tick: Tick,
        status: str,
        outcome: str,
        started: float,
        *,
        report: TickReport | None = None,
        error: JobLedgerError | None = None,
    ) -> None:
        """One ops event per tick, however it ended: what tick counts and durations are
        read from (a tick that raised says how, and of a store error which driver error)."""
        metadata: dict[str, object] = {
            "outcome": outcome,
            "reason": tick.reason,
            "durationMs": round((time.perf_counter() - started) * 1000, 3),
        }
        if report is not None:
            metadata["stepsExecuted"] = report.steps_executed
        if error is not None:
            metadata["errorKind"] = _error_kind(error)
        self._deps.ops.record(
            OpsEvent(
                jobId=tick.job_id,
                tenantId=tick.tenant_id,
                eventType="job.tick.ended",
                status=status,
                metadata=metadata,
            )
        )

    def run_until_idle(
        self,
        *,
        wait_for_timers: bool = False,
        max_ticks: int = 100_000,
        concurrency: int | None = None,
    ) -> int:
        """Handle the local queue's ticks until none is due (or, with ``wait_for_timers``,
        until none is pending at all, sleeping on the engine's clock until each is due).
        Up to ``concurrency`` (default: the config's) ticks run at once, one job at a time
        each (lanes), and their step appends are committed together. Returns how many
        ticks were handled; the first error a tick raised is raised once the ticks in
        flight have finished."""
        queue = self._deps.local_queue
        if queue is None:
            raise ConfigError("run_until_idle drives the local queue; this engine has another")
        width = self._deps.config.batching.concurrency if concurrency is None else concurrency
        taken = 0
        with self._draining:
            lanes = self._lanes_of(width)
            self._failed.clear()
            try:
                while not self._failed:
                    busy = lanes.busy()
                    tick = queue.pop_due() if busy < width and taken < max_ticks else None
                    if tick is not None:
                        taken += 1
                        if busy or self._another_due(queue):
                            lanes.put(tick)
                        else:
                            # Due alone: run here, sparing the hand-off to a lane's thread
                            # and back (a resume's tick, a lone job's next steps).
                            self._handle_in_lane(tick)
                    elif busy:
                        lanes.wait_below(busy, timeout=0.05)
                    else:
                        due = queue.next_due()
                        if taken >= max_ticks or due is None or not wait_for_timers:
                            break
                        clock = self._deps.clock
                        clock.sleep((due - clock.now()).total_seconds())
                if not self._failed:
                    lanes.join()
            finally:
                for tick in lanes.withdraw():  # only when a tick raised: the rest stay queued
                    queue.enqueue(tick)
                    taken -= 1
            if self._failed:
                raise self._failed[0]
        return taken

    def _another_due(self, queue: LocalQueue) -> bool:
        due = queue.next_due()
        return due is not None and due <= self._deps.clock.now()

    def _lanes_of(self, width: int) -> Lanes[Tick]:
        """The drains' lanes, made once: their threads wait for the next drain instead of
        being started for each one (a resume's tick would pay a thread start)."""
        if self._lanes is None:
            self._lanes = Lanes(width, self._handle_in_lane, _job_of, name="jobledger-tick")
        self._lanes.widen(width)
        return self._lanes

    def _handle_in_lane(self, tick: Tick) -> None:
        try:
            self.handle(tick)
        except BaseException as error:  # raised in the draining thread, by run_until_idle
            self._failed.append(error)

    def close(self) -> None:
        """Stop the drains' threads (the engine is closing)."""
        if self._lanes is not None:
            self._lanes.close()

    def handle(self, tick: Tick) -> TickReport | None:
        """What a queue consumer does with one tick: bad ticks are reported and dropped;
        an infrastructure error is re-enqueued with a growing, jittered delay, never
        turned into a failure; a deployment error leaves the job as it is (noted, warned)
        for a later tick: the reconciler sends one while the job is due."""
        try:
            return self.run_tick(tick)
        except DeploymentError as error:
            self.deployment_blocked(error)
        except StoreUnavailableError as error:
            log.warning(
                "tick for %s/%s hit a store error, retrying: %s", tick.tenant_id, tick.job_id, error
            )
            # The retry inherits the interrupted tick's claim, so it can go on at once
            # instead of waiting out its own lease.
            again = replace(
                tick, claim_id=error.claim_id or tick.claim_id, attempt=tick.attempt + 1
            )
            delay = retry.INFRASTRUCTURE.delay(again.attempt)
            self._deps.queue.enqueue(again, delay_ms=round(delay * 1000), dedupe_key="infra-retry")
        except JobLedgerError as error:
            self._deps.ops.record(
                OpsEvent(
                    jobId=tick.job_id,
                    tenantId=tick.tenant_id,
                    eventType="job.tick.rejected",
                    status="unknown",
                    metadata={"error": str(error), "reason": tick.reason},
                )
            )
        return None

    def deployment_blocked(self, error: DeploymentError) -> None:
        """This worker could not run a job as deployed: warn in its log and leave a note
        that ``show`` and ``list`` read. The job itself is not written to."""
        log.warning(
            "job %s/%s left untouched, to be retried later: %s",
            error.tenant_id,
            error.job_id,
            error,
        )
        notes = self._blocked_notes
        if notes is None or error.tenant_id is None or error.job_id is None:
            return
        note = BlockedNote(
            tenant_id=error.tenant_id,
            job_id=error.job_id,
            version=error.version or 0,
            reason=str(error),
            worker_id=self._deps.config.worker_id,
            noticed_at=self._deps.clock.now(),
        )
        try:
            notes.note_blocked(note)
        except Exception as failure:  # a note is a courtesy: the warning above was given
            log.warning(
                "could not note why %s/%s is blocked: %r", note.tenant_id, note.job_id, failure
            )


def _error_outcome(error: JobLedgerError) -> str:
    if isinstance(error, StoreUnavailableError):
        return "store_error"
    return "blocked" if isinstance(error, DeploymentError) else "rejected"


def _error_kind(error: JobLedgerError) -> str:
    """A store error by the driver's (or the library's) error class it translated, so
    an outage and a lock timeout count apart; any other by its own class."""
    if isinstance(error, StoreUnavailableError) and error.__cause__ is not None:
        return type(error.__cause__).__name__
    return type(error).__name__


def _job_of(tick: Tick) -> Hashable:
    return tick.job
