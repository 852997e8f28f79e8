"""What the audit operations refuse, each saying why (all exit 1 on the command line)."""

from __future__ import annotations

from jobledger.domain.errors import JobLedgerError


class AuditError(JobLedgerError):
    """Base class of the audit package's refusals."""


class NoSuchVersionError(AuditError):
    """Time travel asked for a version or moment the job's history does not have."""


class ReplayError(AuditError):
    """A replay cannot run: the definition is for another workflow, or the history does
    not fold."""


class MigrationRefusedError(AuditError):
    """Replay against the target version diverges (and ``force`` was not given), or the
    job cannot move now (finished, running a step, already on that version)."""


class AnchorRefusedError(AuditError):
    """A chain is broken: anchoring now would pin a tampered history."""


class ImportRefusedError(AuditError):
    """The export file is malformed, does not verify, or the target store is not empty.
    Nothing was written."""


class TimeStampError(AuditError):
    """The time-stamping authority did not stamp an anchor (unreachable, refused, or its
    answer does not hold): nothing was anchored."""
