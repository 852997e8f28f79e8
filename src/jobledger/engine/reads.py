"""Reading jobs: the job now, its history and chain, the job at a version or a time, and
replay against a definition (pure: nothing runs, nothing is written)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from datetime import datetime
from typing import TYPE_CHECKING

from jobledger.domain import chain
from jobledger.domain.errors import (
    UnknownWorkflowError,
)
from jobledger.domain.identity import job_uuid
from jobledger.domain.job import Job
from jobledger.domain.views import ChildRow, FamilyView, HistoryEntry, JobView
from jobledger.engine.bootstrap import Deps
from jobledger.engine.job_finder import JobFinder
from jobledger.workflows.code import CodeWorkflow
from jobledger.workflows.definition import WorkflowDefinition
from jobledger.workflows.registries import code_workflow
from jobledger.workflows.replayer import CodeRegistry

if TYPE_CHECKING:
    from jobledger.audit.replay import ReplayReport


class JobReader:
    """The reads of jobs, over the store; nothing here writes."""

    def __init__(self, deps: Deps, jobs: JobFinder) -> None:
        self._deps = deps
        self._jobs = jobs

    def job(self, tenant_id: str, job_id: str) -> JobView:
        """The job now. A running job's lease is the one its worker's heartbeat keeps
        (the lease row), not only the one its Claimed event recorded."""
        job = self._jobs.load(tenant_id, job_id)
        view = JobView.of(job)
        kept = self._jobs.kept_until(job)
        if kept is not None and (view.lease_until is None or kept > view.lease_until):
            view = replace(view, lease_until=kept)
        return view

    def family(self, tenant_id: str, job_id: str) -> FamilyView:
        """The job's parent, and every child it spawned with that child's status now."""
        job = self._jobs.load(tenant_id, job_id)
        rows = []
        for child_id, plan in sorted(
            job.children.items(), key=lambda c: (c[1]["step_number"], c[1]["index"])
        ):
            child = self._jobs.fetch(tenant_id, child_id)
            rows.append(
                ChildRow(
                    job_id=child_id,
                    step_number=plan["step_number"],
                    index=plan["index"],
                    workflow=f"{plan['workflow_type']} v{plan['workflow_version']}",
                    status=str(child.status) if child is not None else "not spawned yet",
                )
            )
        return FamilyView(parent=job.parent, children=tuple(rows))

    def history(
        self, tenant_id: str, job_id: str, *, after: int = 0, limit: int | None = None
    ) -> list[HistoryEntry]:
        """The job's events in order, with their chain hashes: those after version
        ``after``, at most ``limit`` of them."""
        events = self._deps.store.events(
            self._jobs.load(tenant_id, job_id).id, after=after, limit=limit
        )
        return [HistoryEntry.of(event) for event in events]

    def verify(self, tenant_id: str, job_id: str) -> chain.BrokenLink | None:
        """Recompute the job's chain hashes; the first broken link, or None if intact."""
        return chain.verify(self._deps.store.events(self._jobs.load(tenant_id, job_id).id))

    # ---- audit: time travel, replay, migration (jobledger.audit) ----------------------

    def job_at(
        self, tenant_id: str, job_id: str, *, version: int | None = None, at: datetime | None = None
    ) -> JobView:
        """The job exactly as it was right after event ``version``, or after its last
        event at or before ``at``: status, state, counters."""
        from jobledger.audit import time_travel  # the audit modules load when used

        uuid = self._jobs.load(tenant_id, job_id).id
        return JobView.of(time_travel.job_at(self._deps.store, uuid, version=version, at=at))

    def replay(
        self,
        tenant_id: str,
        job_id: str,
        definition: WorkflowDefinition | CodeWorkflow | None = None,
        *,
        version: int | None = None,
    ) -> ReplayReport:
        """Replay the job's recorded decisions against ``definition`` (a definition or a
        code workflow), or against ``version`` of the registry's (default: the job's
        own). Pure: nothing runs and nothing is written."""
        job = self._jobs.load(tenant_id, job_id)
        events = self._deps.store.events(job.id)
        if definition is not None:
            return self._replay(events, definition)
        target = job.workflow_version if version is None else version
        registry = self._deps.deployment.registry
        if not registry.has(job.workflow_type, target):
            raise UnknownWorkflowError(f"unknown workflow {job.workflow_type!r} v{target}")
        code = code_workflow(registry, job.workflow_type, target)
        if code is not None:
            return self._replay(events, code)
        from jobledger.audit.replay import replay_job

        wait_ms = self._deps.config.ticks.default_wait_ms
        return replay_job(events, registry.resolve, version=target, default_wait_ms=wait_ms)

    def replay_all(
        self,
        definition: WorkflowDefinition | CodeWorkflow,
        *,
        statuses: Sequence[str] = (),
        tenant_id: str | None = None,
        pinned: bool = False,
        progress: Callable[[int, int], None] | None = None,
    ) -> list[ReplayReport]:
        """Replay every job of the definition's (or code workflow's) type (only in
        ``statuses``, only of ``tenant_id``, only those pinned to its version with
        ``pinned``, when given) against it, as the status view lists them after catching
        up with the log; sorted by tenant and job. ``pinned`` is the check before a
        deploy of new code under the same version: would the jobs it runs replay?
        ``progress(done, total)`` is told before the first job and after each. Pure,
        like :meth:`replay`."""
        from jobledger.audit.errors import ReplayError
        from jobledger.audit.log import events_of, read_jobs
        from jobledger.projections import JobViews

        store = self._deps.store
        views = JobViews(store)
        views.catch_up()
        rows = views.jobs(
            tenant_id=tenant_id,
            status_in=list(statuses),
            workflow_type=definition.type,
            workflow_version=definition.version if pinned else None,
            limit=2**62,
        )
        uuids = sorted(job_uuid(row.tenant_id, row.job_id) for row in rows)
        reports = []
        if progress is not None:
            progress(0, len(uuids))
        for found, records in read_jobs(store, uuids):
            try:
                reports.append(self._replay(events_of(records), definition))
            except ReplayError as error:
                raise ReplayError(f"job {found}: {error}") from None
            if progress is not None:
                progress(len(reports), len(uuids))
        return sorted(reports, key=lambda report: (report.tenant_id, report.job_id))

    def _replay(
        self, events: Sequence[Job.Event], definition: WorkflowDefinition | CodeWorkflow
    ) -> ReplayReport:
        """A code workflow replays its body against each step's history, under the rule
        the engine checks it by (a step's arguments may change, not what it is)."""
        from jobledger.audit.errors import ReplayError
        from jobledger.audit.replay import replay_job

        wait_ms = self._deps.config.ticks.default_wait_ms
        if isinstance(definition, WorkflowDefinition):
            return replay_job(events, definition, default_wait_ms=wait_ms)
        submitted = events[0] if events else None
        if isinstance(submitted, Job.Submitted) and submitted.workflow_type != definition.type:
            raise ReplayError(
                f"the job runs workflow {submitted.workflow_type!r}; the code is {definition.label}"
            )
        resolver = CodeRegistry([definition]).resolve
        return replay_job(
            events,
            resolver,
            version=definition.version,
            default_wait_ms=wait_ms,
            step_inputs=False,
        )
