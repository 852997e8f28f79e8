"""jobledger: a durable, event-sourced job and mission engine."""

from jobledger.config import EngineConfig
from jobledger.domain.errors import (
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
from jobledger.domain.status import JobStatus
from jobledger.domain.steps import Resolution, ResolveRequest, RetryPolicy, StepRequest, StepResult
from jobledger.domain.views import HistoryEntry, JobView
from jobledger.engine.engine import Engine
from jobledger.orchestration.orchestrator import Outcome, TickReport
from jobledger.orchestration.ports import Tick
from jobledger.orchestration.registry import FunctionRegistry, linear_workflow

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
