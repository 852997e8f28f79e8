"""The commands on jobs: submit, and what people and outside systems send a job (resume
tokens, signals, approval decisions, budget raises, cancellation, migration). Each loads
the job, calls one of its commands (the aggregate states the rule and raises the domain
error) and appends, taking turns with the other writers of that job."""

from __future__ import annotations

import hashlib
import itertools
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timedelta
from decimal import Decimal
from enum import StrEnum
from typing import TYPE_CHECKING, Any, TypedDict, Unpack
from uuid import uuid4

from jobledger.domain.admission import check_priority
from jobledger.domain.budget import parse_budget
from jobledger.domain.erasure import check_subject
from jobledger.domain.errors import (
    ApprovalAlreadyDecidedError,
    ConcurrencyError,
    ConfigError,
    DuplicateKeyError,
    IdempotencyKeyReusedError,
    InvalidPayloadError,
    JobConflictError,
    JobLedgerError,
    JobNotWaitingError,
    TokenMismatchError,
    TokenReplayedError,
    UnknownJobError,
    UnknownWorkflowError,
    VersionConflict,
)
from jobledger.domain.identity import LEGACY_KEY_SCHEME, job_uuid, key_uuid
from jobledger.domain.job import WAKE_REASONS, Claim, Job
from jobledger.domain.keys import ConsumedKey, KeyKind, key_id
from jobledger.domain.payloads import json_object, text
from jobledger.domain.status import JobStatus
from jobledger.domain.steps import IssuedToken
from jobledger.domain.views import JobView
from jobledger.engine import batch_marks
from jobledger.engine.admission_gate import Gatekeeper
from jobledger.engine.bootstrap import Deps
from jobledger.engine.ids import check_id
from jobledger.engine.job_finder import JobFinder
from jobledger.orchestration import retry, tracing
from jobledger.orchestration.child_jobs import child_budget
from jobledger.orchestration.orchestrator import Orchestrator
from jobledger.orchestration.ports import ApprovalRequest, Tick, TokenClaims, WorkflowRegistry
from jobledger.workflows.code import CodeWorkflow
from jobledger.workflows.param_edits import editable_params
from jobledger.workflows.registries import code_workflow

if TYPE_CHECKING:
    from jobledger.audit.replay import ReplayReport


_TURN_STRIPES = 64
"""Locks the commands' writers of one job take turns on (a job hashes to one): the
engine's own threads queue here rather than racing each other at the store."""

_DECISIONS = {
    "approve": "approved",
    "approved": "approved",
    "reject": "rejected",
    "rejected": "rejected",
}


class SignalOutcome(StrEnum):
    RESUMED = "resumed"
    BUFFERED = "buffered"
    DUPLICATE = "duplicate"


class SubmitOptions(TypedDict, total=False):
    """What a submit may say besides its tenant, job id and workflow type: the keywords of
    :meth:`JobCommands.submit`, handed on to :meth:`JobCommands.submission` as they are."""

    workflow_version: int | None
    input: Mapping[str, Any] | None
    budget: Mapping[str, Any] | None
    idempotency_key: str | None
    mission_id: str | None
    employee_id: str | None
    correlation_id: str | None
    data_subject: str | None
    priority: int | None


@dataclass(frozen=True)
class Submission:
    job: JobView
    created: bool
    """False when the job (or the idempotency key's job) existed already."""


class JobCommands:
    """Submitting, and every input a job takes from outside."""

    def __init__(
        self,
        deps: Deps,
        orchestrator: Orchestrator,
        jobs: JobFinder,
        gatekeeper: Gatekeeper,
    ) -> None:
        self._deps = deps
        self._store = deps.store
        self._clock = deps.clock
        self._config = deps.config
        self._orchestrator = orchestrator
        self._jobs = jobs
        self._gatekeeper = gatekeeper
        self._turns = [threading.Lock() for _ in range(_TURN_STRIPES)]

    @property
    def _registry(self) -> WorkflowRegistry:
        return self._deps.deployment.registry

    # ---- submitting ------------------------------------------------------------------

    def submit(
        self,
        tenant_id: str,
        job_id: str | None,
        workflow_type: str | CodeWorkflow,
        **options: Unpack[SubmitOptions],
    ) -> JobView:
        """Create a job and enqueue its first tick. Submitting the same job again, or
        with an idempotency key already used, returns the existing job unchanged.
        ``data_subject``: whose personal data the job holds (the workflow's
        ``personal_data``), sealed with that subject's key; without one, a key of its own.
        ``priority``: 0-9, the higher admitted first among the tenant's queued jobs
        (default 5); a waiting job gains a level per ``priority_aging_seconds``.
        ``workflow_type`` may be a ``@workflow`` itself: its type, at its version."""
        return self.submission(tenant_id, job_id, workflow_type, **options).job

    def submission(
        self,
        tenant_id: str,
        job_id: str | None,
        workflow_type: str | CodeWorkflow,
        *,
        workflow_version: int | None = None,
        input: Mapping[str, Any] | None = None,
        budget: Mapping[str, Any] | None = None,
        idempotency_key: str | None = None,
        mission_id: str | None = None,
        employee_id: str | None = None,
        correlation_id: str | None = None,
        data_subject: str | None = None,
        parent: Mapping[str, Any] | None = None,
        priority: int | None = None,
    ) -> Submission:
        """:meth:`submit`, saying whether this call created the job or found it (the
        HTTP API answers 201 or 200): decided by the append itself, so two racing
        submits of one job can never both be told they created it."""
        if isinstance(workflow_type, CodeWorkflow):
            code = workflow_type
            if workflow_version not in (None, code.version):
                asked_for = f"v{workflow_version}"
                raise InvalidPayloadError(f"{code.label} cannot be submitted as {asked_for}")
            workflow_type, workflow_version = code.type, code.version
        check_id("tenant_id", tenant_id)
        if job_id is not None:
            check_id("job_id", job_id)
        if priority is not None:
            check_priority(priority)
        asked = _Asked(
            job_id=job_id,
            workflow_type=workflow_type,
            workflow_version=workflow_version,
            state=json_object(
                input, what="job input", max_bytes=self._config.limits.max_payload_bytes
            ),
            mission_id=mission_id,
            employee_id=employee_id,
            correlation_id=correlation_id,
            priority=priority,
        )
        job_id = job_id if job_id is not None else uuid4().hex
        if idempotency_key is not None:
            check_id("idempotency_key", idempotency_key)
            marker = self._submit_key(tenant_id, idempotency_key)
            if marker is not None:
                existing = self._store.load(marker.job_uuid)
                if existing is not None:
                    self._check_same_key(existing, asked, idempotency_key)
                    return self._found(existing)
                # An archived job is not made again under its key (restore brings it back).
                self._jobs.raise_if_archived(tenant_id, marker.job_id)
                # The key was reserved by a submit that died before creating its job.
                if asked.job_id not in (None, marker.job_id):
                    raise _key_reused(
                        tenant_id,
                        idempotency_key,
                        marker.job_id,
                        asked.job_id_differs(marker.job_id),
                    )
                job_id = marker.job_id
        version = self.workflow_version(workflow_type, workflow_version)
        self._check_input(workflow_type, version, asked.state)
        personal, key_id = self._personal_data(
            tenant_id, job_id, workflow_type, version, data_subject
        )
        with self._job_span("jobledger.submit", tenant_id, job_id) as span:
            workflow = {"jobledger.workflow.type": workflow_type}
            span.set({**workflow, "jobledger.workflow.version": version})
            submission = self._submit_new(
                tenant_id,
                job_id,
                version,
                asked,
                budget=budget,
                idempotency_key=idempotency_key,
                personal=(personal, key_id),
                trace_context=span.carrier,
                parent=parent,
            )
            span.set({"jobledger.created": submission.created})
        return submission

    def _check_input(self, workflow_type: str, version: int, state: Mapping[str, Any]) -> None:
        """A registry that knows its workflows' input types (code workflows) refuses an
        input that does not fit before the job exists; the others take any JSON object."""
        check = getattr(self._registry, "check_input", None)
        if check is None:
            return
        try:
            check(workflow_type, version, state)
        except ValueError as error:
            raise InvalidPayloadError(str(error)) from None

    def _submit_new(
        self,
        tenant_id: str,
        job_id: str,
        version: int,
        asked: _Asked,
        *,
        budget: Mapping[str, Any] | None,
        idempotency_key: str | None,
        personal: tuple[tuple[str, ...], str | None],
        trace_context: dict[str, str],
        parent: Mapping[str, Any] | None = None,
    ) -> Submission:
        """Write the job (in the trace the submit span began, recorded on it) and enqueue
        its first tick; or find it written already."""
        workflow_type = asked.workflow_type
        limit = self._config.limits.max_payload_bytes
        job = Job.submit(
            tenant_id=tenant_id,
            job_id=job_id,
            workflow_type=workflow_type,
            workflow_version=version,
            state=asked.state,
            budget=parse_budget(
                {
                    **self._registry.budget_defaults(workflow_type, version),
                    **json_object(budget, what="job budget", max_bytes=limit),
                },
                now=self._clock.now(),
            ),
            mission_id=asked.mission_id,
            employee_id=asked.employee_id,
            correlation_id=asked.correlation_id,
            submit_key=idempotency_key,
            timestamp=self._clock.now(),
            personal_data=personal[0],
            personal_data_key=personal[1],
            trace_context=trace_context,
            parent=dict(parent) if parent is not None else None,
            priority=asked.priority,
        )
        stored = self._create(job, asked)
        if stored is not job:
            return self._found(stored)
        self._orchestrator.report(
            job, "job.submitted", workflowType=workflow_type, workflowVersion=version
        )
        tick = Tick(tenant_id, job_id, "create", trace_context=trace_context or None)
        self._gatekeeper.enter(job, tick)
        return Submission(JobView.of(job), created=True)

    def _found(self, job: Job) -> Submission:
        """A repeat of a submit, answered with the job it finds. A job still as its
        submit wrote it (version 1) may never get its first tick: the first submit may
        have died between writing the job and sending it (a subscription's message read
        again after a worker was killed there). So the repeat sends that tick again, as
        the reconciler would after ``lost_tick_after``, only now. A tick too many is
        harmless: it finds the job held for admission, or under a claim, or moved on."""
        if job.version == 1:
            context = job.trace_context or None
            tick = Tick(job.tenant_id, job.job_id, "create", trace_context=context)
            self._deps.queue.enqueue(tick, dedupe_key="create")
        return Submission(JobView.of(job), created=False)

    def spawn_child(self, parent: Job, plan: Mapping[str, Any]) -> None:
        """Submit a child a map step planned (``orchestration.child_jobs.Spawner``): its submit key
        derives from the parent's step, so a second call finds the child it made."""
        self.submission(
            parent.tenant_id,
            plan["job_id"],
            plan["workflow_type"],
            workflow_version=plan["workflow_version"],
            input=plan["input"],
            budget=child_budget(parent, self._clock.now()),
            idempotency_key=plan["submit_key"],
            mission_id=parent.mission_id,
            correlation_id=parent.correlation_id,
            parent={
                "job_id": parent.job_id,
                "step_number": plan["step_number"],
                "index": plan["index"],
            },
        )

    def workflow_version(self, workflow_type: str, version: int | None) -> int:
        if version is None:
            return self._registry.latest_version(workflow_type)
        if not self._registry.has(workflow_type, version):
            raise UnknownWorkflowError(f"unknown workflow {workflow_type!r} v{version}")
        return version

    def _personal_data(
        self,
        tenant_id: str,
        job_id: str,
        workflow_type: str,
        version: int,
        subject: str | None,
    ) -> tuple[tuple[str, ...], str | None]:
        """The job's personal paths and the id of the key that seals them, taken (and the
        job noted under it) before the job is written, so an erasure finds every job."""
        paths = self._registry.personal_data(workflow_type, version)
        if subject is not None:
            check_subject(subject)
            if not paths:
                raise InvalidPayloadError(
                    f"workflow {workflow_type!r} v{version} declares no personal_data: "
                    "a data subject means nothing for its jobs"
                )
        if not paths:
            return (), None
        if self._deps.subject_keys is None:
            raise ConfigError(
                f"workflow {workflow_type!r} v{version} declares personal_data, and this "
                "engine has no subject key store to seal it with"
            )
        return paths, self._deps.subject_keys.key_for(tenant_id, subject, job_id)

    def _submit_key(self, tenant_id: str, key: str) -> ConsumedKey | None:
        key_id = key_uuid(tenant_id, KeyKind.SUBMIT, key)
        return self._store.find_key(key_id, key_id)

    def _create(self, job: Job, asked: _Asked) -> Job:
        """Append Submitted (and its key); a job or key that already exists is returned
        when it is the same request, refused when it is a different one."""
        key = job.submit_key
        # Handed to the job's first tick: a code workflow's first replay reads its submit
        # from here, not back from the store.
        submitted = list(job.pending_events)
        try:
            if key is None:
                self._store.append(job)
                self._orchestrator.last_appends.keep(job.id, submitted)  # type: ignore[arg-type]
                return job
            holder = self._append_with_submit_key(job, key)
        except VersionConflict:
            existing = self._store.load(job.id)
            assert existing is not None
            first = self._submitted(existing)
            if differences := asked.differences(first):
                raise JobConflictError(
                    f"job {first.job_id!r} of tenant {first.tenant_id!r} already exists as "
                    f"{first.workflow_type!r} v{first.workflow_version}; this submit differs "
                    f"in {_described(differences)}"
                ) from None
            return existing
        if holder is not job:
            # A racing submit with the key won: this one is judged as a later repeat is.
            self._check_same_key(holder, asked, key)
        else:
            self._orchestrator.last_appends.keep(job.id, submitted)  # type: ignore[arg-type]
        return holder

    def _check_same_key(self, holder: Job, asked: _Asked, key: str) -> None:
        """A submit key's repeat must ask for what its first request did (its job, as
        submitted): answering another request with that job would drop the request."""
        if differences := asked.differences(self._submitted(holder)):
            raise _key_reused(holder.tenant_id, key, holder.job_id, differences)

    def _submitted(self, job: Job) -> Job.Submitted:
        """What the job was submitted with, not what it is now."""
        submitted = self._store.events(job.id, to_version=1)[0]
        assert isinstance(submitted, Job.Submitted)
        return submitted

    def _append_with_submit_key(self, job: Job, idempotency_key: str) -> Job:
        """A submit key lives in the partition its own id hashes to, so it is unique per
        tenant whatever the job id. When that is the job's partition, key and job are one
        append; otherwise the key is reserved first and a retry finishes the job. Returns
        the job the key names: this one, or the one a racing submit with the key made
        first (the loser gets the answer a later repeat would)."""
        marker = self._key(job, KeyKind.SUBMIT, idempotency_key)
        if self._store.colocated(marker.id, job.id):
            try:
                self._store.append(job, marker)
            except DuplicateKeyError:
                return self._key_holder(marker, idempotency_key)
            return job
        try:
            self._store.reserve_key(marker)
        except DuplicateKeyError:
            reserved = self._store.find_key(marker.id, marker.id)
            if reserved is None or reserved.job_uuid != job.id:
                return self._key_holder(marker, idempotency_key)
        self._store.append(job)
        return job

    def _key_holder(self, marker: ConsumedKey, idempotency_key: str) -> Job:
        """The job a submit key already names; while its submit has reserved the key but
        not yet written the job, there is nothing to return yet: try again."""
        found = self._store.find_key(marker.id, marker.id)
        holder = self._store.load(found.job_uuid) if found is not None else None
        if holder is None:
            raise ConcurrencyError(
                f"another submit with idempotency key {idempotency_key!r} is in flight; "
                "submit again to get its job"
            )
        return holder

    # ---- outside events: tokens, signals, approvals, budgets, cancellation ----------

    def resume(
        self,
        token: str,
        payload: Mapping[str, Any] | None = None,
        *,
        tenant_id: str | None = None,
    ) -> JobView:
        """Resume the job a token was issued for. The token's nonce is consumed in the
        same append as the resume: a replayed token is refused and changes nothing."""
        if self._deps.tokens is None:
            raise ConfigError("resume tokens need JOBLEDGER_TOKEN_SECRET")
        claims = self._deps.tokens.verify(token, now=self._clock.now())
        if tenant_id is not None and tenant_id != claims.tenant_id:
            raise TokenMismatchError("the resume token belongs to another tenant")
        data = json_object(
            payload, what="resume payload", max_bytes=self._config.limits.max_payload_bytes
        )
        token_sha256 = hashlib.sha256(token.encode()).hexdigest()
        woken = _Wake(self._wake_claim)

        def resume(job: Job) -> list[ConsumedKey]:
            with self._refused_if_used(job, KeyKind.TOKEN, claims.nonce):
                job.resume_by_token(
                    step_number=claims.step_number,
                    event_name=claims.event_name,
                    nonce=claims.nonce,
                    token_sha256=token_sha256,
                    payload=data,
                    now=self._clock.now(),
                    claim=woken.claim(job),
                )
            return [self._key(job, KeyKind.TOKEN, claims.nonce)]

        job = self.apply(
            claims.tenant_id,
            claims.job_id,
            resume,
            missing=TokenMismatchError,
            duplicate=lambda: self._used_token(claims),
        )
        self._orchestrator.report(
            job, "job.resumed", source="token", nonce=claims.nonce, stepNumber=claims.step_number
        )
        view = JobView.of(job)
        self._wake(job, WAKE_REASONS["token"], woken.claim_id)  # last: it may hand the job on
        return view

    def _used_token(self, claims: TokenClaims) -> JobLedgerError:
        """A consumed nonce: used to resume the job, or voided by a reissue."""
        job = self._store.load(job_uuid(claims.tenant_id, claims.job_id))
        wait = job.wait_event if job is not None else None
        if wait is not None and claims.nonce in wait.superseded_nonces:
            return TokenMismatchError(
                "the resume token was superseded by a reissued one; use the new token"
            )
        return TokenReplayedError("the resume token was already used")

    def reissue_token(self, tenant_id: str, job_id: str, *, by: str) -> IssuedToken:
        """A new resume token for a job waiting for an event (the old one was lost, or
        lapsed). The old token's nonce is consumed in the same append that records the
        new one, so from then on only the new token resumes the job. The notifier is
        handed the new token, as when the wait opened."""
        if self._deps.tokens is None:
            raise ConfigError("resume tokens need JOBLEDGER_TOKEN_SECRET")
        tokens = self._deps.tokens
        check_id("by", by)
        issued: list[IssuedToken] = []

        def reissue(job: Job) -> list[ConsumedKey]:
            wait = job.open_wait()
            now = self._clock.now()
            token = tokens.issue(
                JobView.of(job),
                step_number=job.current_step,
                event_name=wait.name,
                now=now,
                lasts_until=job.wait_ends_at,
            )
            job.reissue_token(
                nonce=token.nonce,
                token_sha256=token.token_sha256,
                expires_at=token.expires_at,
                reissued_by=by,
                now=now,
            )
            issued[:] = [token]
            return [self._key(job, KeyKind.TOKEN, wait.nonce)]

        # A duplicate: the old token resumed the job meanwhile, so there is no wait to
        # reissue for.
        job = self.apply(
            tenant_id,
            job_id,
            reissue,
            duplicate=lambda: JobNotWaitingError(
                f"job {job_id!r} was resumed with its token meanwhile; nothing reissued"
            ),
        )
        token = issued[0]
        self._orchestrator.report(
            job,
            "job.resume_token.reissued",
            reissuedBy=by,
            nonce=token.nonce,
            stepNumber=job.current_step,
        )
        notifier = self._orchestrator.notifier
        if notifier is not None and job.wait_event is not None:
            notifier.waiting_for_event(JobView.of(job), job.wait_event.name, token)
        return token

    def signal(
        self,
        tenant_id: str,
        job_id: str,
        event_name: str,
        payload: Mapping[str, Any] | None = None,
        *,
        signal_id: str,
    ) -> SignalOutcome:
        """Deliver an outside event by name (trusted callers). A job waiting for it
        resumes; otherwise the signal is kept and consumed when the wait opens. The
        signal id makes delivery idempotent."""
        check_id("event_name", event_name)
        check_id("signal_id", signal_id)
        data = json_object(
            payload, what="signal payload", max_bytes=self._config.limits.max_payload_bytes
        )
        outcome = SignalOutcome.BUFFERED
        woken = _Wake(self._wake_claim)

        def deliver(job: Job) -> list[ConsumedKey]:
            nonlocal outcome
            with self._refused_if_used(job, KeyKind.SIGNAL, signal_id):
                resumed = job.deliver_signal(
                    signal_id=signal_id,
                    event_name=event_name,
                    payload=data,
                    now=self._clock.now(),
                    claim=woken.claim(job),
                )
            outcome = SignalOutcome.RESUMED if resumed else SignalOutcome.BUFFERED
            return [self._key(job, KeyKind.SIGNAL, signal_id)]

        try:
            job = self.apply(tenant_id, job_id, deliver)
        except DuplicateKeyError:
            return SignalOutcome.DUPLICATE
        self._orchestrator.report(
            job, f"job.signal.{outcome}", signalId=signal_id, eventName=event_name
        )
        if outcome is SignalOutcome.RESUMED:  # last: the wake may hand the job on
            self._wake(job, WAKE_REASONS["signal"], woken.claim_id)
        return outcome

    def decide(
        self,
        tenant_id: str,
        job_id: str,
        approval_id: str,
        decision: str,
        decided_by: str,
        comment: str | None = None,
        *,
        action_sha256: str | None = None,
        edit: Mapping[str, Any] | None = None,
        data: Mapping[str, Any] | None = None,
    ) -> JobView:
        """Approve or reject the job's open approval request, once, by someone allowed;
        on a quorum request, cast this decider's one vote. ``edit``: new values for params
        of the step the approval leads to (it runs with them); ``data``: a JSON object
        that lands in the job's state for the steps after it. Both are recorded with
        their sha256."""
        verdict = _DECISIONS.get(decision)
        if verdict is None:
            raise InvalidPayloadError(f"decision must be approve or reject, got {decision!r}")
        check_id("decided_by", decided_by)
        limit = self._config.limits.max_payload_bytes
        if comment is not None:
            text(comment, what="approval comment", max_bytes=limit)
        edited = None if edit is None else json_object(edit, what="approval edit", max_bytes=limit)
        if edited == {}:
            raise InvalidPayloadError("an approval edit changes one param or more; it is empty")
        answer = None if data is None else json_object(data, what="approval data", max_bytes=limit)

        def decide(job: Job) -> list[ConsumedKey]:
            with self._refused_if_used(job, KeyKind.APPROVAL, approval_id):
                gate = job.pending_approval
                editable = None
                if edited is not None and gate is not None and gate.on_approve is not None:
                    editable = editable_params(
                        self._deps.deployment.registry,
                        (job.workflow_type, job.workflow_version),
                        gate.on_approve,
                        {**job.state, **(answer or {})},
                    )
                job.decide_approval(
                    approval_id=approval_id,
                    decision=verdict,
                    decided_by=decided_by,
                    comment=comment,
                    action_sha256=action_sha256,
                    now=self._clock.now(),
                    edit=edited,
                    editable=editable,
                    data=answer,
                )
            if job.pending_approval is not None:
                return []  # a vote that left the request open: no decision to guard yet
            return [self._key(job, KeyKind.APPROVAL, approval_id)]

        job = self.apply(
            tenant_id,
            job_id,
            decide,
            duplicate=lambda: ApprovalAlreadyDecidedError(
                f"approval {approval_id!r} was already decided"
            ),
        )
        if job.pending_approval is not None:
            self._orchestrator.report(
                job, "job.approval.voted", approvalId=approval_id, vote=verdict, votedBy=decided_by
            )
            return JobView.of(job)
        self._wake(job, "approval_decided")
        self._orchestrator.report(
            job,
            "job.approval.decided",
            approvalId=approval_id,
            decision=verdict,
            decidedBy=decided_by,
        )
        return JobView.of(job)

    def reassign(
        self,
        tenant_id: str,
        job_id: str,
        approval_id: str,
        approvers: list[str],
        *,
        by: str,
        reason: str,
    ) -> JobView:
        """Move the job's open approval request to ``approvers`` (who and why recorded):
        the ones listed before may no longer decide; votes already cast stay counted."""
        check_id("by", by)
        for name in approvers:
            check_id("approver", name)
        text(reason, what="reassign reason", max_bytes=self._config.limits.max_payload_bytes)

        def reassign(job: Job) -> list[ConsumedKey]:
            job.reassign_approval(
                approval_id=approval_id,
                approvers=list(approvers),
                reassigned_by=by,
                reason=reason,
                now=self._clock.now(),
            )
            return []

        job = self.apply(tenant_id, job_id, reassign)
        self._orchestrator.report(
            job,
            "job.approval.reassigned",
            approvalId=approval_id,
            approvers=",".join(approvers),
            reassignedBy=by,
        )
        notifier = self._orchestrator.notifier
        if notifier is not None and job.pending_approval is not None:
            # The new approvers are told as the first ones were.
            notifier.approval_requested(JobView.of(job), ApprovalRequest.of(job.pending_approval))
        return JobView.of(job)

    def raise_budget(
        self,
        tenant_id: str,
        job_id: str,
        *,
        raised_by: str,
        reason: str,
        max_steps: int | None = None,
        max_cost_usd: Decimal | str | float | None = None,
        deadline_at: datetime | None = None,
    ) -> JobView:
        """Lift a job's limits (recorded with who and why); a parked job goes on."""
        check_id("raised_by", raised_by)
        text(reason, what="budget raise reason", max_bytes=self._config.limits.max_payload_bytes)
        changes = {
            k: v
            for k, v in {
                "max_steps": max_steps,
                "max_cost_usd": max_cost_usd,
                "deadline_at": deadline_at,
            }.items()
            if v is not None
        }

        def raise_(job: Job) -> list[ConsumedKey]:
            budget = parse_budget({**job.budget.to_dict(), **changes}, now=self._clock.now())
            job.raise_budget(
                raised_by=raised_by, reason=reason, budget=budget, now=self._clock.now()
            )
            return []

        job = self.apply(tenant_id, job_id, raise_)
        self._wake(job, "budget_raised")
        self._orchestrator.report(job, "job.budget_raised", raisedBy=raised_by, reason=reason)
        return JobView.of(job)

    def cancel(self, tenant_id: str, job_id: str, reason: str, by: str) -> JobView:
        """Terminal. A step still running finishes, but its result is discarded and
        recorded as such; open resume tokens and approvals stop working."""
        check_id("by", by)
        text(reason, what="cancel reason", max_bytes=self._config.limits.max_payload_bytes)

        def cancel(job: Job) -> list[ConsumedKey]:
            job.cancel(reason=reason, cancelled_by=by, now=self._clock.now())
            return []

        job = self.apply(tenant_id, job_id, cancel)
        self._orchestrator.report(job, "job.cancelled", reason=reason, cancelledBy=by)
        self._gatekeeper.left(job)
        return JobView.of(job)

    def apply(
        self,
        tenant_id: str,
        job_id: str,
        command: Callable[[Job], list[ConsumedKey]],
        *,
        missing: type[JobLedgerError] | None = None,
        duplicate: Callable[[], JobLedgerError] | None = None,
    ) -> Job:
        """Load, decide, append; on a lost race decide again on the fresh job, after a
        jittered back-off (``retry.CONTENTION``): many writers to one job all land,
        instead of the losers being told no. Only contention that outlasts the budget
        (in wall-clock time) is reported, as ConcurrencyError: try again, not refused.
        A command whose key was consumed already is refused with ``duplicate()``."""
        backoff = retry.CONTENTION
        deadline = time.monotonic() + backoff.budget_seconds
        for attempt in itertools.count(1):
            try:
                job = self._attempt(tenant_id, job_id, command, deadline)
            except DuplicateKeyError:
                if duplicate is None:
                    raise
                raise duplicate() from None
            except VersionConflict:
                delay = backoff.delay(attempt)
                if time.monotonic() + delay > deadline:
                    break
                # Real time, not the engine's clock: the other writers are real processes,
                # and a fake clock's sleep would wait for none of them.
                time.sleep(delay)
                continue
            if job is None:
                if missing is not None:
                    raise missing(f"no job {job_id!r} for tenant {tenant_id!r}")
                # Every command on a job gone to an archive says so (410 over the API).
                self._jobs.raise_if_archived(tenant_id, job_id)
                raise UnknownJobError(tenant_id, job_id)
            # A command that finished the job (cancel, a rejection) tells its family.
            self._orchestrator.family.settle(job)
            return job
        raise ConcurrencyError(f"job {job_id!r} kept changing; try again")

    def _attempt(
        self,
        tenant_id: str,
        job_id: str,
        command: Callable[[Job], list[ConsumedKey]],
        deadline: float,
    ) -> Job | None:
        """One load, decide, append (None: no such job). The threads of this process take
        turns at a job, so they never race each other at the database; only another
        process can make the append lose (VersionConflict)."""
        turn = self._turns[job_uuid(tenant_id, job_id).int % len(self._turns)]
        if not turn.acquire(timeout=max(0.0, deadline - time.monotonic())):
            raise VersionConflict("other writers in this process held the job throughout")
        try:
            job = self._jobs.fetch(tenant_id, job_id)
            if job is None:
                return None
            keys = command(job)
            # A bulk action's mark lands in the same append as its action (batch_marks).
            self._store.append(job, *keys, *batch_marks.marks(job, self._clock.now()))
            return job
        finally:
            turn.release()

    def _key(self, job: Job, kind: KeyKind, key: str) -> ConsumedKey:
        return ConsumedKey.consume(
            kind=kind,
            key=key,
            tenant_id=job.tenant_id,
            job_id=job.job_id,
            job_uuid=job.id,
            timestamp=self._clock.now(),
        )

    @contextmanager
    def _refused_if_used(self, job: Job, kind: KeyKind, key: str) -> Iterator[None]:
        """Around a command that consumes ``key``: when the job refuses the command, a
        consumed key is the reason given (DuplicateKeyError). The store is asked only
        then: a use that committed first left the job past the wait or gate it names, so
        the command refuses; and a command the job accepts with a used key collides with
        that key in its append. A job of the legacy key scheme is asked first, since its
        keys may sit under ids this append does not write."""
        if job.key_scheme == LEGACY_KEY_SCHEME:
            self._refuse_used(job, kind, key)
        try:
            yield
        except JobLedgerError:
            self._refuse_used(job, kind, key)
            raise

    def _refuse_used(self, job: Job, kind: KeyKind, key: str) -> None:
        """DuplicateKeyError if the job consumed the key already: the loser of a race is
        told it was a replay, not that the job moved on."""
        if self._store.find_key(job.id, key_id(kind, job.tenant_id, job.job_id, key)):
            raise DuplicateKeyError(kind, key)
        if job.key_scheme != LEGACY_KEY_SCHEME:
            return
        # A job submitted before signal ids, nonces and approval ids were scoped to their
        # job may have consumed one under its per-tenant id (never written any more).
        legacy = self._store.find_key(job.id, key_uuid(job.tenant_id, kind, key))
        if legacy is not None and legacy.job_uuid == job.id:
            raise DuplicateKeyError(kind, key)

    def _wake_claim(self, job: Job) -> Claim | None:
        """The claim of the tick a resume wakes, to fold into the resume (so the tick need
        not append one: resume -> next step recorded is two commits, not three). Only
        when that tick goes to this process's own queue and this engine can run its step:
        the claim id rides in the in-process tick, which no one else is handed. A tick
        for another process (Kafka), an engine that runs no steps (a one-shot command),
        or a job pinned to a version this worker lacks leaves the job queued for whoever
        takes it, as before: a claim there would keep every other worker off the job
        until its lease lapsed."""
        if self._deps.local_queue is None or self._deps.executor is None:
            return None
        if not self._orchestrator.has_pinned(job):
            return None
        lease = timedelta(milliseconds=self._config.leases.ms)
        return Claim(self._config.worker_id, uuid4().hex, self._clock.now() + lease)

    def _wake(self, job: Job, reason: str, claim_id: str | None = None) -> None:
        """Enqueue the tick that goes on with a job the command made runnable: queued, or
        running under the claim the command folded in for that tick (``claim_id``). Its
        span continues the job's trace however long the job waited, and its tick is
        that span's child."""
        held = claim_id is not None and job.status is JobStatus.RUNNING
        if job.status is not JobStatus.QUEUED and not (held and job.claim_id == claim_id):
            return
        with self._job_span("jobledger.wake", job.tenant_id, job.job_id, job) as span:
            span.set({"jobledger.wake.reason": reason, "jobledger.job.version": job.version})
            tick = Tick(
                job.tenant_id,
                job.job_id,
                reason,
                claim_id=claim_id if held else None,
                trace_context=span.carrier or None,
            )
            dedupe_key = f"{reason}:{job.version}"
            if held:
                # The command's last use of the object: the tick's load takes it as
                # committed and asks the store only for what another writer added since.
                self._store.keep(job)
            self._deps.queue.enqueue(tick, dedupe_key=dedupe_key)

    @contextmanager
    def _job_span(
        self, name: str, tenant_id: str, job_id: str, job: Job | None = None
    ) -> Iterator[tracing.Span]:
        """A span about one job, in the job's trace when it has one, and its log context."""
        attributes = {"jobledger.tenant_id": tenant_id, "jobledger.job_id": job_id}
        parent = job.trace_context if job is not None else None
        opened = self._deps.tracer.span(name, parent=parent, attributes=attributes)
        with opened as span, tracing.logged(span, tenant=tenant_id, job=job_id):
            yield span

    def migrate(
        self,
        tenant_id: str,
        job_id: str,
        to_version: int,
        *,
        by: str | None = None,
        reason: str | None = None,
        force: bool = False,
    ) -> tuple[JobView, ReplayReport]:
        """Move a job that has not finished to another version of its definition, as a
        ``Migrated`` event in its history. Only when replay against that version says it
        is safe, or with ``force`` (then ``by`` and ``reason`` are required, and kept)."""
        from jobledger.audit import migrate as migration

        if force and not (by and reason):
            raise InvalidPayloadError("a forced migration needs who (by) and why (reason)")
        if by is not None:
            check_id("by", by)
        if reason is not None:
            text(reason, what="migration reason", max_bytes=self._config.limits.max_payload_bytes)
        reports: list[ReplayReport] = []

        def move(job: Job) -> list[ConsumedKey]:
            if not self._registry.has(job.workflow_type, to_version):
                raise UnknownWorkflowError(f"unknown workflow {job.workflow_type!r} v{to_version}")
            now = self._clock.now()
            events = self._store.events(job.id, to_version=job.version)
            report = migration.plan(
                job,
                events,
                self._registry.resolve,
                to_version,
                force=force,
                now=now,
                default_wait_ms=self._config.ticks.default_wait_ms,
                kept_until=self._jobs.kept_until(job),
                # A code workflow is checked as the engine checks its replay.
                step_inputs=code_workflow(self._registry, job.workflow_type, to_version) is None,
            )
            migration.migrate(job, report, to_version, by=by, reason=reason, now=now)
            reports.append(report)
            return []

        job = self.apply(tenant_id, job_id, move)
        report = reports[-1]
        self._orchestrator.report(
            job, "job.migrated", toVersion=to_version, forced=not report.safe, by=by, reason=reason
        )
        return JobView.of(job), report


class _Wake:
    """The claim a command folds into a resume, minted once per attempt (a lost race
    decides again, with a fresh lease), and remembered for the tick it wakes."""

    def __init__(self, mint: Callable[[Job], Claim | None]) -> None:
        self._mint = mint
        self.claim_id: str | None = None

    def claim(self, job: Job) -> Claim | None:
        claim = self._mint(job)
        self.claim_id = None if claim is None else claim.claim_id
        return claim


Differences = dict[str, tuple[object, object]]
"""A request's fields that differ from the first's: name -> (this request's, the first's)."""


@dataclass(frozen=True)
class _Asked:
    """What a submit asks for, as its repeat is compared with the job's first request: a
    job id or workflow version left to the engine (None) matches whatever the first got."""

    job_id: str | None
    workflow_type: str
    workflow_version: int | None
    state: dict[str, Any]
    mission_id: str | None
    employee_id: str | None
    correlation_id: str | None
    priority: int | None

    def differences(self, first: Job.Submitted) -> Differences:
        found: Differences = {
            "job_id": (self.job_id, first.job_id),
            "workflow_type": (self.workflow_type, first.workflow_type),
            "workflow_version": (self.workflow_version, first.workflow_version),
            "input": (self.state, first.state),
            "mission_id": (self.mission_id, first.mission_id),
            "employee_id": (self.employee_id, first.employee_id),
            "correlation_id": (self.correlation_id, first.correlation_id),
            "priority": (self.priority, first.priority),
        }
        left_to_the_engine = {"job_id", "workflow_version"}
        return {
            name: (this, was)
            for name, (this, was) in found.items()
            if this != was and not (name in left_to_the_engine and this is None)
        }

    def job_id_differs(self, first_job_id: str) -> Differences:
        return {"job_id": (self.job_id, first_job_id)}


def _described(differences: Differences) -> str:
    """The differing fields, each with both values; the input by name only (it may be
    large, or personal)."""
    return ", ".join(
        name if name == "input" else f"{name} {this!r} (the first: {was!r})"
        for name, (this, was) in differences.items()
    )


def _key_reused(
    tenant_id: str, key: str, first_job_id: str, differences: Differences
) -> IdempotencyKeyReusedError:
    return IdempotencyKeyReusedError(
        tenant_id, key, first_job_id, tuple(differences), _described(differences)
    )
