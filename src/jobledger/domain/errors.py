"""Every error a caller can see, each saying what was wrong."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from jobledger.domain.redaction import redact


class JobLedgerError(Exception):
    """Base class of every error jobledger raises on purpose."""


class UnknownJobError(JobLedgerError):
    def __init__(self, tenant_id: str, job_id: str) -> None:
        super().__init__(f"no job {job_id!r} for tenant {tenant_id!r}")
        self.tenant_id = tenant_id
        self.job_id = job_id


class UnknownWorkflowError(JobLedgerError):
    pass


class JobConflictError(JobLedgerError):
    """A submit names an existing job but asks for something different."""


class IdempotencyKeyReusedError(JobConflictError):
    """A submit's idempotency key was used before for a different request (another job
    id, workflow, input, ids or priority): answering it with the first job would drop
    this request unseen, so it is refused (the HTTP API's 422, as the IETF
    Idempotency-Key draft says)."""

    def __init__(
        self, tenant_id: str, key: str, job_id: str, differences: tuple[str, ...], detail: str
    ) -> None:
        super().__init__(
            f"idempotency key {key!r} of tenant {tenant_id!r} was used for job {job_id!r} "
            f"by another request; this request differs in {detail}"
        )
        self.tenant_id = tenant_id
        self.key = key
        self.job_id = job_id
        """The job the key's first request made."""
        self.differences = differences
        """The request's fields that differ from the first's (``input``, ``job_id``...)."""


class InvalidPayloadError(JobLedgerError):
    """A payload is not JSON, is too large, or has the wrong shape."""


class ConfigError(JobLedgerError):
    pass


class DeploymentError(ConfigError):
    """This worker cannot run the job as deployed (no executor, no token secret, or not
    the job's pinned workflow definition). Never a job failure: the job is left as it
    was and the tick is retried later, by this worker once fixed or by another."""

    tenant_id: str | None = None
    job_id: str | None = None
    version: int | None = None
    """Set by the orchestrator: the job, and its version when the tick was refused."""


class WorkflowNotDeployedError(DeploymentError):
    """The worker's registry has no definition for the job's (type, version): in a
    rolling deploy, a worker not yet (or no longer) carrying that version."""


class NonDeterminismError(DeploymentError):
    """A code workflow's body, replayed against the job's recorded history, asked for
    something other than what the history holds at ``step_number`` (a step renamed,
    reordered, inserted or removed, a wait changed). The job is left untouched, blocked
    as a job whose pinned version is missing is: deploy the code that recorded it (or a
    new version for new jobs) and it goes on."""

    def __init__(self, message: str, *, step_number: int, recorded: str, requested: str) -> None:
        super().__init__(message)
        self.step_number = step_number
        self.recorded = recorded
        self.requested = requested


class WorkflowBodyError(Exception):
    """A code workflow's body raised while it was replayed: the job fails with this message
    (the traceback included), or retries under ``retry_policy`` when the body raised
    ``StepError(retryable=True)``. Raised by a registry, handled by the tick."""

    def __init__(self, message: str, *, retryable: bool, kind: str, retry_policy: Any) -> None:
        super().__init__(message)
        self.retryable = retryable
        self.kind = kind
        self.retry_policy = retry_policy
        """The workflow's ``RetryPolicy``, or None (the default policy)."""


class StoreMissingError(ConfigError):
    """A command that only reads (or changes a job) was pointed at a store that does not
    exist: it is never created by such a command, so a typo cannot pass for an empty
    store."""


class StoreSchemaError(ConfigError):
    """The store's tables were migrated by a newer jobledger than this one: it may hold
    tables or rows this release would misread, so it is not opened."""


class StoreUnavailableError(JobLedgerError):
    """The store failed mid-operation. The write may or may not have landed (a commit
    whose acknowledgement was lost): retry, and the retry sees what the store holds."""

    def __init__(self, message: str) -> None:
        # Its message often quotes the driver's, which may quote the store URL and runs
        # over several lines (psycopg adds a hint line): one line, password hidden.
        super().__init__(" ".join(redact(message).split()))

    claim_id: str | None = None
    """Set by the orchestrator: the claim the interrupted tick held, for its retry."""


class StoreUnreachableError(StoreUnavailableError):
    """The store could not be opened at all: unreachable, or refusing these credentials.
    Nothing was attempted; unlike a store lost mid-operation, retrying at once rarely helps."""


class StoreCorruptError(StoreUnavailableError):
    """The store's database is damaged (SQLite: a malformed page, or a file that is not
    a database; PostgreSQL: data or an index reported corrupted). Broken, not
    temporary: the same read fails the same way, so a command exits 3, not 4. A
    service still backs off and retries, as for an unreachable store, until the file
    is restored from a backup."""


class BrokenHistoryError(JobLedgerError):
    """A job's stored events cannot be folded: one is missing, or no longer decodes.
    Nothing is written on top of it; ``jobledger verify`` says what happened there."""

    def __init__(
        self, job_uuid: str, version: int, tenant_id: str | None = None, job_id: str | None = None
    ) -> None:
        label = f"{tenant_id}/{job_id}" if tenant_id is not None else f"job {job_uuid}"
        super().__init__(f"history of {label} is broken at v{version} (run jobledger verify)")
        self.job_uuid = job_uuid
        self.version = version
        self.tenant_id = tenant_id
        self.job_id = job_id

    def of(self, tenant_id: str, job_id: str) -> BrokenHistoryError:
        """The same error, naming the job as its caller knows it."""
        return BrokenHistoryError(self.job_uuid, self.version, tenant_id, job_id)


class ConcurrencyError(JobLedgerError):
    """An append lost a race: the job moved on since it was loaded."""


class VersionConflict(ConcurrencyError):
    pass


class DuplicateKeyError(ConcurrencyError):
    """An at-most-once key was already consumed by an earlier append."""

    def __init__(self, kind: str, key: str) -> None:
        super().__init__(f"{kind} key {key!r} was already used")
        self.kind = kind
        self.key = key


class JobNotWaitingError(JobLedgerError):
    """The job is not waiting for what this call delivers (finished, or on another wait)."""


class JobFinishedError(JobLedgerError):
    """The job is completed, failed or cancelled: nothing can change it any more."""


class TokenError(JobLedgerError):
    """A resume token was refused; nothing was written."""


class InvalidTokenError(TokenError):
    """Malformed, forged, signed with an unknown key, or for another issuer/audience."""


class ExpiredTokenError(TokenError):
    pass


class TokenMismatchError(TokenError):
    """The token is genuine but bound to another tenant, job, step or event."""


class TokenReplayedError(TokenError):
    """The token's nonce was already consumed: a token resumes a job once."""


class ApprovalError(JobLedgerError):
    """A decision was refused; nothing was written."""


class StaleApprovalError(ApprovalError):
    """The decision names a request that is not the open one (an earlier attempt, or a
    changed action)."""


class ApprovalAlreadyDecidedError(ApprovalError):
    pass


class UnauthorisedDeciderError(ApprovalError):
    pass


class AlreadyVotedError(ApprovalError):
    """An approver of a quorum request voted on it before: each approver votes once."""


class ErasureError(JobLedgerError):
    """An erasure was refused; nothing was written."""


class UnknownSubjectError(ErasureError):
    """An erasure names a data subject the tenant has no key for, nor ever erased."""


class SubjectErasedError(ErasureError):
    """An erasure names a data subject whose keys were already destroyed."""


class JobErasedError(ErasureError):
    """An erasure names a job whose key was already destroyed (or is not in this store)."""


class NoPersonalDataError(ErasureError):
    """An erasure names a job that holds no personal data (its workflow declares none)."""


class SubjectKeyError(ErasureError):
    """An erasure by job names a job sealed with its data subject's key, which the
    subject's other jobs share: only erasing the subject destroys it."""


class StepError(Exception):
    """Raise from a step executor to say whether the failure is worth retrying.

    Any other exception from an executor is a permanent step failure.
    """

    def __init__(self, message: str, *, retryable: bool = False, kind: str = "error") -> None:
        super().__init__(message)
        self.retryable = retryable
        self.kind = kind


class InvalidScheduleError(InvalidPayloadError):
    """A schedule's cron expression, time zone or policy is not usable; nothing is written."""


class UnknownScheduleError(JobLedgerError):
    def __init__(self, tenant_id: str, name: str) -> None:
        super().__init__(f"no schedule {name!r} for tenant {tenant_id!r}")
        self.tenant_id = tenant_id
        self.name = name


class ScheduleExistsError(JobLedgerError):
    """A schedule of that name exists (or existed: a deleted schedule keeps its name and
    its history)."""


class ScheduleStateError(JobLedgerError):
    """The command does not apply to the schedule as it is (pausing a paused schedule,
    anything but reading a deleted one)."""


class DeadLetterError(JobLedgerError):
    """A dead-letter command was refused (a bad id or filter, or a redrive that names
    nothing and would take every letter without ``--all``); nothing was sent."""


class UnknownDeadLetterError(DeadLetterError):
    def __init__(self, letter_id: str) -> None:
        super().__init__(f"no dead letter {letter_id!r}")
        self.letter_id = letter_id


class UnknownSubscriptionError(JobLedgerError):
    """No configured subscription has that name; nothing was read or written."""

    def __init__(self, name: str, known: Sequence[str]) -> None:
        listed = ", ".join(known) if known else "none is configured"
        super().__init__(f"no subscription {name!r} (known: {listed})")
        self.name = name
        self.known = tuple(known)


class UnboundedBulkError(InvalidPayloadError):
    """A bulk action's query names nothing beyond its tenant, and ``all`` was not said:
    acting on every job of a tenant must be asked for in so many words."""


class UnknownBatchError(JobLedgerError):
    def __init__(self, tenant_id: str, batch_id: str) -> None:
        super().__init__(f"no batch {batch_id!r} for tenant {tenant_id!r}")
        self.tenant_id = tenant_id
        self.batch_id = batch_id


class BatchExistsError(JobLedgerError):
    """A batch of that id exists in the tenant already."""


class BatchBusyError(ConcurrencyError):
    """Another runner recorded an outcome of the batch meanwhile: it is on it."""


class RepairError(JobLedgerError):
    """A retry, reset or fork refused (``jobledger.domain.repair``): nothing was written."""


class RepairStatusError(RepairError):
    """The job's status (or how it ended) does not allow this repair now."""


class RepairStepError(RepairError):
    """The step named is not one the job can be reset or forked at."""


class RepairDivergesError(RepairError):
    """Replay of the steps kept against the version asked for diverges: that version would
    not have recorded them."""


class RetentionError(JobLedgerError):
    """An archive or a restore that cannot be done as asked."""


class JobArchivedError(UnknownJobError):
    """The job was archived: its events left the store, its tombstone stayed. An
    UnknownJobError too, so every caller that handles a missing job handles it; the API
    answers 410 Gone with the tombstone."""

    def __init__(self, tenant_id: str, job_id: str, tombstone: dict[str, Any]) -> None:
        JobLedgerError.__init__(
            self,
            f"job {job_id!r} of tenant {tenant_id!r} was archived to {tombstone['archive']} "
            f"at {tombstone['archived_at']} (jobledger restore brings it back)",
        )
        self.tenant_id = tenant_id
        self.job_id = job_id
        self.tombstone = tombstone
        """The tombstone's document (``Tombstone.document``)."""


class ArchiveMismatchError(RetentionError):
    """An archive does not hold what its tombstone says (another file, edited, cut off)."""
