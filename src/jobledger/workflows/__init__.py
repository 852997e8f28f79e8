"""Declarative, versioned workflow definitions (YAML or JSON), served through the
WorkflowRegistry port by :class:`DefinitionRegistry`."""

from jobledger.workflows.definition import DefinitionError, WorkflowDefinition
from jobledger.workflows.loader import load_definitions, parse_definition
from jobledger.workflows.resolver import DefinitionRegistry, resolve

__all__ = [
    "DefinitionError",
    "DefinitionRegistry",
    "WorkflowDefinition",
    "load_definitions",
    "parse_definition",
    "resolve",
]
