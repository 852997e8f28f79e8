"""The workflow definitions a process runs with, held in one place."""

from __future__ import annotations

from dataclasses import dataclass

from jobledger.orchestration.ports import WorkflowRegistry


@dataclass
class Deployment:
    """The one reference to the registry: the engine's parts and the orchestrator read it
    at each use, so a reload (SIGHUP) swaps it once for all of them. Each resolution
    reads one registry, the old or the new, never a mix."""

    registry: WorkflowRegistry
