"""Event routes: which job events the outbox also sends to a user's own topic, as
CloudEvents 1.0 (``[[event_routes]]`` in jobledger.toml, ``JOBLEDGER_EVENT_ROUTES``).

A route names a topic, the workflow types and event types it takes (left out: all of
them) and the CloudEvents Kafka binding's content mode: ``structured`` (the whole event,
``application/cloudevents+json``, in the value) or ``binary`` (``ce_*`` headers, the
event's data as the value).
"""

from __future__ import annotations

from typing import Any, Final, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from jobledger.domain.setting_problems import refuse_unknown_keys

KAFKA_TOPIC: Final = r"^[A-Za-z0-9._-]{1,249}$"
"""Kafka's legal topic names."""


class EventRoute(BaseModel):
    """Job events of these workflow types and event types (``None``: every one) go to
    ``topic`` as CloudEvents in ``mode``, besides the events topic."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    topic: str = Field(pattern=KAFKA_TOPIC)
    workflows: tuple[str, ...] | None = None
    """Workflow types; an empty list would route nothing, so it is refused: leave it out
    to route every workflow."""
    event_types: tuple[str, ...] | None = None
    """Job event type names (``StepRecorded``, ``Completed``, ...)."""
    mode: Literal["structured", "binary"] = "structured"

    @model_validator(mode="before")
    @classmethod
    def _known_keys(cls, values: Any) -> Any:
        """An unknown key is named with the route's keys (not every setting's)."""
        return refuse_unknown_keys(values, cls.model_fields, "event route")

    @field_validator("workflows", "event_types")
    @classmethod
    def _not_empty(cls, names: tuple[str, ...] | None) -> tuple[str, ...] | None:
        if names is not None and not names:
            raise ValueError("an empty list routes nothing: leave it out to route every one")
        if names is not None and not all(names):
            raise ValueError("a name must not be empty")
        return names

    @field_validator("event_types")
    @classmethod
    def _known(cls, event_types: tuple[str, ...] | None) -> tuple[str, ...] | None:
        if event_types is None:
            return None
        known = job_event_types()
        unknown = [name for name in event_types if name not in known]
        if unknown:
            raise ValueError(
                f"unknown job event type {unknown[0]!r} (known: {', '.join(sorted(known))})"
            )
        return event_types

    def matches(self, workflow: str, event_type: str) -> bool:
        """Whether an event of this type, of a job of this workflow type, takes the route."""
        return (self.workflows is None or workflow in self.workflows) and (
            self.event_types is None or event_type in self.event_types
        )


def job_event_types() -> frozenset[str]:
    """The names of the job's event types, as routes and the outbox's headers spell them."""
    # Imported here: the settings (config.py) import this module, and the job model
    # imports what imports the settings.
    from jobledger.domain.job import Job

    # Created is eventsourcing's default creation event: a job is created by Submitted.
    skipped = {Job.Event, Job.Created}
    classes = [cls for cls in vars(Job).values() if isinstance(cls, type)]
    return frozenset(
        cls.__name__ for cls in classes if issubclass(cls, Job.Event) and cls not in skipped
    )
