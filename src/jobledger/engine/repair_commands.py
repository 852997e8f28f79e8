"""Repairing a job: retry a failed one at the step that failed, reset one to an earlier
step, or fork a new job from one at a step (the rules: :mod:`jobledger.domain.repair`).

Each is one event in the job's history, chain-hashed and signed like the others, written
in one append with nothing else; the job goes back on the queue after it. A newer version
is taken only when replaying the steps that stay recorded against it decides each of them
the same (``jobledger.audit.replay``); otherwise the repair is refused with the diff.

A fork is two jobs' writes: the fork (``Submitted`` and ``ForkedFrom``, one append) and
then its origin's ``Forked``. A crash between them leaves a fork its origin does not name
yet: asking the same fork again (the same new job id) writes the missing ``Forked`` and
never a second fork.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from jobledger.audit.replay import replay_job
from jobledger.domain import repair
from jobledger.domain.budget import parse_budget
from jobledger.domain.errors import (
    JobConflictError,
    RepairDivergesError,
    RepairStatusError,
    UnknownWorkflowError,
    VersionConflict,
)
from jobledger.domain.job import Job
from jobledger.domain.keys import ConsumedKey
from jobledger.domain.payloads import json_object, text
from jobledger.domain.views import JobView
from jobledger.engine.admission_gate import Gatekeeper
from jobledger.engine.bootstrap import Deps
from jobledger.engine.ids import check_id
from jobledger.engine.job_commands import JobCommands
from jobledger.engine.job_finder import JobFinder
from jobledger.orchestration.orchestrator import Orchestrator
from jobledger.orchestration.ports import Tick
from jobledger.workflows.registries import code_workflow

SAME_VERSION = "not replayed: the same version"
"""The replay verdict a repair on the job's own version records (nothing to compare)."""


@dataclass(frozen=True)
class Repaired:
    """A repair's outcome: the job that runs now (for a fork, the fork) and the replay
    verdict that let it run on its version."""

    job: JobView
    replay_verdict: str
    origin: JobView | None = None
    """For a fork: the job it was forked from, as it stands now (naming the fork)."""


@dataclass(frozen=True)
class _Target:
    version: int
    verdict: str


class RepairCommands:
    """Retry, reset and fork, through the commands' writes."""

    def __init__(
        self,
        deps: Deps,
        orchestrator: Orchestrator,
        jobs: JobFinder,
        commands: JobCommands,
        gatekeeper: Gatekeeper,
    ) -> None:
        self._deps = deps
        self._store = deps.store
        self._clock = deps.clock
        self._orchestrator = orchestrator
        self._jobs = jobs
        self._commands = commands
        self._gatekeeper = gatekeeper

    def retry(
        self, tenant_id: str, job_id: str, *, by: str, reason: str, to_version: int | None = None
    ) -> Repaired:
        """Reopen a failed job at the step that failed, as a new attempt of it with the
        same step key (the executor de-duplicates a half-done call by it); ``to_version``:
        on that version of its definition, if the recorded steps replay the same on it."""
        self._check_who(by, reason, "retry reason")
        targets: list[_Target] = []

        def reopen(job: Job) -> list[ConsumedKey]:
            now = self._clock.now()
            repair.check_repairable(job, "retried", now, self._jobs.kept_until(job))
            events = self._store.events(job.id, to_version=job.version)
            repair.check_deadline(job, "retried", now)
            cause = repair.retry_cause(job, events)
            # The failure itself is what the retry takes back: the steps before it stay.
            failed_at = max(i for i, e in enumerate(events) if isinstance(e, Job.Failed))
            target = self._target(job, to_version, events[:failed_at])
            job.retry(
                cause=cause,
                to_version=target.version,
                retried_by=by,
                reason=reason,
                replay_verdict=target.verdict,
                now=now,
            )
            targets.append(target)
            return []

        job = self._commands.apply(tenant_id, job_id, reopen)
        self._requeue(job, "retried", was_finished=True)
        self._orchestrator.report(
            job, "job.retried", stepNumber=job.current_step + 1, by=by, reason=reason
        )
        return Repaired(JobView.of(job), targets[-1].verdict)

    def reset(
        self,
        tenant_id: str,
        job_id: str,
        step: int,
        *,
        by: str,
        reason: str,
        to_version: int | None = None,
    ) -> Repaired:
        """Run the job again from after its step ``step`` (0: from the start): the later
        steps re-run under a new epoch, with new step keys; its waits and approvals open
        again; the state is the one it had then. A completed or failed job too."""
        self._check_who(by, reason, "reset reason")
        targets: list[_Target] = []
        finished: list[bool] = []

        def rewind(job: Job) -> list[ConsumedKey]:
            now = self._clock.now()
            repair.check_repairable(job, "reset", now, self._jobs.kept_until(job))
            events = self._store.events(job.id, to_version=job.version)
            repair.check_reset_step(job, step, events)
            repair.check_deadline(job, "reset", now)
            finished.append(job.status.is_terminal)
            kept = repair.as_of(events, step)
            target = self._target(job, to_version, kept)
            job.reset(
                step_number=step,
                as_of=_folded(kept),
                to_version=target.version,
                reset_by=by,
                reason=reason,
                replay_verdict=target.verdict,
                now=now,
            )
            targets.append(target)
            return []

        job = self._commands.apply(tenant_id, job_id, rewind)
        self._requeue(job, "reset", was_finished=finished[-1])
        self._orchestrator.report(job, "job.reset", stepNumber=step, by=by, reason=reason)
        return Repaired(JobView.of(job), targets[-1].verdict)

    def fork(
        self,
        tenant_id: str,
        job_id: str,
        step: int,
        *,
        new_job_id: str,
        by: str,
        reason: str,
        input_patch: Mapping[str, Any] | None = None,
        to_version: int | None = None,
    ) -> Repaired:
        """A new job ``new_job_id`` from this one after its step ``step``: the state as of
        then (with ``input_patch`` merged over it), on ``to_version`` if given. It starts
        after that step (the steps before are not run again: it has no record of them
        but its origin's) with keys of its own; each history names the other."""
        self._check_who(by, reason, "fork reason")
        check_id("new_job_id", new_job_id)
        limit = self._deps.config.limits.max_payload_bytes
        patch = json_object(input_patch, what="fork input patch", max_bytes=limit)
        origin = self._jobs.load(tenant_id, job_id)
        existing = self._jobs.fetch(tenant_id, new_job_id)
        if existing is not None:
            return self._finish_fork(origin, existing, step, by, reason)
        now = self._clock.now()
        repair.check_repairable(origin, "forked", now, self._jobs.kept_until(origin))
        repair.check_fork_step(origin, step)
        self._check_forkable(origin)
        kept = repair.as_of(self._store.events(origin.id, to_version=origin.version), step)
        target = self._target(origin, to_version, kept)
        then = _folded(kept)
        fork = self._new_fork(origin, then, new_job_id, target, patch, now)
        fork.start_fork(origin=then, step_number=step, forked_by=by, reason=reason, now=now)
        try:
            self._store.append(fork)
        except VersionConflict:
            # A racing fork of the same id landed first: finished as a repeat is.
            found = self._jobs.load(tenant_id, new_job_id)
            return self._finish_fork(origin, found, step, by, reason)
        self._orchestrator.report(fork, "job.forked", origin=job_id, stepNumber=step, by=by)
        self._gatekeeper.enter(fork, Tick(tenant_id, new_job_id, "forked"))
        return self._finish_fork(origin, fork, step, by, reason, verdict=target.verdict)

    # ---- the parts --------------------------------------------------------------------

    def _check_who(self, by: str, reason: str, what: str) -> None:
        check_id("by", by)
        text(reason, what=what, max_bytes=self._deps.config.limits.max_payload_bytes)

    def _target(self, job: Job, to_version: int | None, kept: Sequence[Job.Event]) -> _Target:
        """The version the job runs on after the repair, and the replay verdict: the
        steps that stay recorded must replay the same on a version it moves to."""
        if to_version is None or to_version == job.workflow_version:
            return _Target(job.workflow_version, SAME_VERSION)
        registry = self._deps.deployment.registry
        if not registry.has(job.workflow_type, to_version):
            raise UnknownWorkflowError(f"unknown workflow {job.workflow_type!r} v{to_version}")
        report = replay_job(
            kept,
            registry.resolve,
            version=to_version,
            default_wait_ms=self._deps.config.ticks.default_wait_ms,
            # A code workflow is checked as the engine checks its replay.
            step_inputs=code_workflow(registry, job.workflow_type, to_version) is None,
        )
        if not report.safe:
            raise RepairDivergesError(
                f"job {job.job_id!r} cannot run on v{to_version}: replay {report.verdict}"
            )
        return _Target(to_version, f"{len(report.steps)} recorded step(s) replay the same")

    def _requeue(self, job: Job, reason: str, *, was_finished: bool) -> None:
        """Put the reopened job back on the queue: through the admission gate when it
        had left it (a finished job), straight to the queue otherwise."""
        tick = Tick(job.tenant_id, job.job_id, reason)
        if was_finished:
            self._gatekeeper.enter(job, tick)
        else:
            self._deps.queue.enqueue(tick, dedupe_key=f"{reason}:{job.version}")

    def _check_forkable(self, origin: Job) -> None:
        registry = self._deps.deployment.registry
        if code_workflow(registry, origin.workflow_type, origin.workflow_version) is not None:
            raise RepairStatusError(
                f"job {origin.job_id!r} runs a code workflow, whose body replays its own "
                "history from its first step: reset it instead of forking it"
            )
        if origin.personal_data:
            raise RepairStatusError(
                f"job {origin.job_id!r} holds personal data, sealed with a key erasure "
                "tracks per job: it cannot be copied into a fork"
            )

    def _new_fork(
        self,
        origin: Job,
        as_of: Job,
        new_job_id: str,
        target: _Target,
        patch: dict[str, Any],
        now: datetime,
    ) -> Job:
        """The fork, as its own new job: the workflow's budget defaults from now on."""
        registry = self._deps.deployment.registry
        defaults = registry.budget_defaults(origin.workflow_type, target.version)
        return Job.submit(
            tenant_id=origin.tenant_id,
            job_id=new_job_id,
            workflow_type=origin.workflow_type,
            workflow_version=target.version,
            state={**as_of.state, **patch},
            budget=parse_budget(dict(defaults), now=now),
            mission_id=origin.mission_id,
            employee_id=origin.employee_id,
            correlation_id=origin.correlation_id,
            submit_key=None,
            timestamp=now,
            priority=origin.priority,
        )

    def _finish_fork(
        self,
        origin: Job,
        fork: Job,
        step: int,
        by: str,
        reason: str,
        verdict: str = "a fork asked again",
    ) -> Repaired:
        """The origin's ``Forked``, once: a fork asked again (after a crash between the
        two writes, or a repeat) writes it if missing. A job of that id that is not this
        fork is refused."""
        made = fork.forked_from
        if made != {"job_id": origin.job_id, "step_number": step}:
            raise JobConflictError(
                f"job {fork.job_id!r} of tenant {fork.tenant_id!r} already exists and is "
                f"not a fork of job {origin.job_id!r} at step {step}"
            )

        def name_fork(job: Job) -> list[ConsumedKey]:
            if _names_fork(self._store.events(job.id, to_version=job.version), fork.job_id):
                raise _Named(job)
            job.note_fork(
                fork_job_id=fork.job_id,
                step_number=step,
                forked_by=by,
                reason=reason,
                now=self._clock.now(),
            )
            return []

        try:
            named = self._commands.apply(origin.tenant_id, origin.job_id, name_fork)
        except _Named as already:
            named = already.job
        return Repaired(JobView.of(fork), verdict, origin=JobView.of(named))


class _Named(Exception):
    """The origin names the fork already: nothing to append."""

    def __init__(self, job: Job) -> None:
        super().__init__(job.job_id)
        self.job = job


def _folded(events: Sequence[Job.Event]) -> Job:
    """The job as those events leave it (copied: they are the store's reads)."""
    job: Job | None = None
    for event in events:
        job = event.mutate(job)
    assert job is not None
    return job


def _names_fork(events: Sequence[Job.Event], fork_job_id: str) -> bool:
    return any(isinstance(e, Job.Forked) and e.fork_job_id == fork_job_id for e in events)
