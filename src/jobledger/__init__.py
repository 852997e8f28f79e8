"""jobledger: a durable, event-sourced job and mission engine."""

from jobledger.config import EngineConfig
from jobledger.engine import Engine
from jobledger.errors import (
    ConfigError,
    DeploymentError,
    DuplicateKeyError,
    IdempotencyKeyReusedError,
    InvalidPayloadError,
    JobConflictError,
    JobLedgerError,
    StepError,
    StoreUnavailableError,
    UnknownJobError,
    UnknownWorkflowError,
    VersionConflict,
    WorkflowNotDeployedError,
)
from jobledger.orchestrator import Outcome, TickReport
from jobledger.ports import Resolution, ResolveRequest, RetryPolicy, StepRequest, StepResult, Tick
from jobledger.registry import FunctionRegistry, linear_workflow
from jobledger.status import JobStatus
from jobledger.views import HistoryEntry, JobView

__all__ = [
    "ConfigError",
    "DeploymentError",
    "DuplicateKeyError",
    "Engine",
    "EngineConfig",
    "FunctionRegistry",
    "HistoryEntry",
    "IdempotencyKeyReusedError",
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
    "WorkflowNotDeployedError",
    "linear_workflow",
]
