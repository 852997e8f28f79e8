"""jobledger: a durable, event-sourced job and mission engine."""

from jobledger.config import EngineConfig
from jobledger.engine import Engine
from jobledger.errors import (
    ConfigError,
    DuplicateKeyError,
    InvalidPayloadError,
    JobConflictError,
    JobLedgerError,
    StepError,
    StoreUnavailableError,
    UnknownJobError,
    UnknownWorkflowError,
    VersionConflict,
)
from jobledger.orchestrator import Outcome, TickReport
from jobledger.ports import Resolution, ResolveRequest, RetryPolicy, StepRequest, StepResult, Tick
from jobledger.registry import FunctionRegistry, linear_workflow
from jobledger.status import JobStatus
from jobledger.views import HistoryEntry, JobView

__all__ = [
    "ConfigError",
    "DuplicateKeyError",
    "Engine",
    "EngineConfig",
    "FunctionRegistry",
    "HistoryEntry",
    "InvalidPayloadError",
    "JobConflictError",
    "JobLedgerError",
    "JobStatus",
    "JobView",
    "Outcome",
    "Resolution",
    "ResolveRequest",
    "RetryPolicy",
    "StepError",
    "StepRequest",
    "StepResult",
    "StoreUnavailableError",
    "Tick",
    "TickReport",
    "UnknownJobError",
    "UnknownWorkflowError",
    "VersionConflict",
    "linear_workflow",
]
