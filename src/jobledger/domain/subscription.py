"""Subscriptions: jobs from your own topics (``[[subscriptions]]`` in jobledger.toml,
``JOBLEDGER_SUBSCRIPTIONS``, or :class:`Subscription` in Python).

A subscription maps each message of a topic to a job: ``action = "submit"`` starts one
job of ``workflow`` per message, ``action = "signal"`` delivers the message as a signal to
the job its ``job_id`` template names (a correlation field). Tenant, job id, business key
and signal event are templates over the message: literal text around fields in braces,
``{key}``, ``{topic}``, ``{partition}``, ``{offset}``, ``{header.NAME}`` and
``{value.PATH}`` (a dotted path into the JSON value; a number indexes a list).

The message's identity is its business ``key`` when the subscription declares one, else
its position ``topic:partition:offset``: the submit's idempotency key and the signal's id
derive from it, so a message delivered again finds the job (or the signal) it made.
"""

from __future__ import annotations

import hashlib
import importlib
import json
import re
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final, Literal, Self

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    ValidationError,
    field_validator,
    model_validator,
)

from jobledger.domain.budget import parse_budget
from jobledger.domain.errors import InvalidPayloadError
from jobledger.domain.event_routes import KAFKA_TOPIC
from jobledger.domain.setting_problems import refuse_unknown_keys

NAME: Final = r"^[A-Za-z0-9._-]{1,100}$"
MAX_ID: Final = 200
"""Longest idempotency key and signal id the engine takes (``engine.ids.MAX_ID_LENGTH``)."""
LAST_POSITION: Final = f"{2**31 - 1}:{2**63 - 1}"
"""The longest ``partition:offset`` a message can have (Kafka's int32 and int64)."""
_FIELD: Final = re.compile(r"\{([^{}]*)\}")
_SIMPLE_FIELDS: Final = ("key", "topic", "partition", "offset")
MISSING: Final = object()


class SubscriptionMessageError(Exception):
    """A message this subscription cannot make a job (or a signal) of: dead-lettered
    with ``reason`` (``template``, ``schema``, ``tenant_not_allowed``, ...)."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


@dataclass(frozen=True)
class Message:
    """What a template reads of one consumed message: its value already parsed."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    headers: tuple[tuple[str, bytes], ...]
    value: Any

    @property
    def position(self) -> str:
        return f"{self.topic}:{self.partition}:{self.offset}"

    def header(self, name: str) -> bytes | None:
        # The last one wins, as a later header of one name overrides an earlier.
        found = [value for key, value in self.headers if key == name]
        return found[-1] if found else None


def check_template(template: str) -> str:
    """``template`` if every field in it is known; a ValueError naming the first that
    is not (or an unbalanced brace)."""
    stripped = _FIELD.sub("", template)
    if "{" in stripped or "}" in stripped:
        raise ValueError(f"template {template!r} has an unmatched brace")
    for field in _FIELD.findall(template):
        if field in _SIMPLE_FIELDS:
            continue
        head, _, rest = field.partition(".")
        if head in ("header", "value") and rest and all(rest.split(".")):
            continue
        raise ValueError(
            f"template {template!r}: unknown field {{{field}}} (known: {{key}}, {{topic}}, "
            "{partition}, {offset}, {header.NAME}, {value.PATH})"
        )
    return template


def render(template: str, message: Message) -> str:
    """The template with each field replaced by the message's; a field the message
    lacks (no key, no such header, no such path) raises ``template``."""

    def field(match: re.Match[str]) -> str:
        value = _field(match.group(1), message)
        if value is MISSING or value is None:
            raise SubscriptionMessageError(
                "template", f"{template!r}: the message has no {match.group(0)}"
            )
        if isinstance(value, dict | list):
            raise SubscriptionMessageError(
                "template", f"{template!r}: {match.group(0)} is not a single value"
            )
        return _text(value)

    return _FIELD.sub(field, template)


def _field(name: str, message: Message) -> Any:
    if name == "key":
        return message.key
    if name in ("topic", "partition", "offset"):
        return getattr(message, name)
    head, _, rest = name.partition(".")
    if head == "header":
        return message.header(rest)
    return path_value(message.value, rest)


def _text(value: Any) -> str:
    if isinstance(value, bytes):
        try:
            return value.decode("utf-8")
        except UnicodeDecodeError:
            raise SubscriptionMessageError("template", "a field is not UTF-8 text") from None
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def path_value(document: Any, path: str) -> Any:
    """The value at a dotted path (``order.items.0.sku``), or MISSING."""
    current = document
    for part in path.split(".") if path else ():
        if isinstance(current, dict) and part in current:
            current = current[part]
        elif isinstance(current, list) and part.isdigit() and int(part) < len(current):
            current = current[int(part)]
        else:
            return MISSING
    return current


class Subscription(BaseModel):
    """One topic's messages as jobs of one workflow (``action = "submit"``) or as
    signals to the jobs they name (``action = "signal"``)."""

    model_config = ConfigDict(extra="forbid", frozen=True, arbitrary_types_allowed=True)

    name: str = Field(pattern=NAME)
    """Names the subscription in ``jobledger subscriptions``, its idempotency keys and
    signal ids: renaming one makes its old messages new ones."""
    topic: str = Field(pattern=KAFKA_TOPIC)
    action: Literal["submit", "signal"] = "submit"
    tenant: str
    """Template of the tenant id (``acme``, ``{header.tenant}``, ``{value.tenant}``)."""
    tenants: tuple[str, ...] | None = None
    """The tenants this topic may speak for; a message naming another is dead-lettered
    (``tenant_not_allowed``). Left out: any tenant the template yields."""
    workflow: str | None = None
    """The workflow type each message starts (``submit``)."""
    workflow_version: int | None = Field(default=None, ge=1)
    job_id: str | None = None
    """Template of the job id. ``submit``: left out, one derived from the message's
    identity (``<name>-<hash>``). ``signal``: required, the job the message is for."""
    key: str | None = None
    """Template of the business key the message is deduplicated by; left out, its
    position (``topic:partition:offset``)."""
    event: str | None = None
    """Template of the signal's event name (``signal``)."""
    input: str = "value"
    """Where the job's input (the signal's payload) is: ``value``, or ``value.PATH``."""
    input_schema: Path | dict[str, Any] | None = None
    """A JSON Schema (a file, or inline) the input must satisfy (the ``jsonschema``
    library: ``pip install 'jobledger[subscriptions]'``)."""
    input_model: type[BaseModel] | None = Field(default=None, exclude=True)
    """A pydantic model the input must satisfy: the class, or in a config file its
    ``module:Class`` (importable beside the file); the job gets the model's dump."""
    correlation_id: str | None = None
    """Template of the job's correlation id (``submit``)."""
    priority: int | None = Field(default=None, ge=0, le=9)
    budget: dict[str, Any] | None = None
    dlq_topic: str | None = Field(default=None, pattern=KAFKA_TOPIC)
    """Where messages that cannot become jobs go; left out, ``<topic>.dlq``."""
    _schema: dict[str, Any] | None = PrivateAttr(default=None)
    _validator: Any = PrivateAttr(default=None)

    @model_validator(mode="before")
    @classmethod
    def _known_keys(cls, values: Any) -> Any:
        """An unknown key is named with the subscription's keys (not every setting's)."""
        return refuse_unknown_keys(values, cls.model_fields, "subscription")

    @field_validator("tenant", "job_id", "key", "event", "correlation_id")
    @classmethod
    def _templates(cls, template: str | None) -> str | None:
        if template is not None:
            if not template:
                raise ValueError("a template must not be empty")
            check_template(template)
        return template

    @field_validator("input_model", mode="before")
    @classmethod
    def _imported(cls, model: Any) -> Any:
        return import_model(model) if isinstance(model, str) else model

    @field_validator("input")
    @classmethod
    def _input_path(cls, where: str) -> str:
        head, dot, rest = where.partition(".")
        if head != "value" or (dot and not all(rest.split("."))):
            raise ValueError(f"input {where!r}: expected 'value' or 'value.PATH'")
        return where

    @field_validator("budget")
    @classmethod
    def _a_budget(cls, budget: dict[str, Any] | None) -> dict[str, Any] | None:
        """Checked now: a budget the engine refuses would dead-letter every message."""
        if budget is not None:
            try:
                parse_budget(budget, now=datetime.now(UTC))
            except InvalidPayloadError as error:
                raise ValueError(str(error)) from None
        return budget

    @field_validator("tenants")
    @classmethod
    def _some_tenants(cls, tenants: tuple[str, ...] | None) -> tuple[str, ...] | None:
        if tenants is not None and not tenants:
            raise ValueError("an empty list allows no tenant: leave it out to allow any")
        return tenants

    @model_validator(mode="after")
    def _fits_its_action(self) -> Self:
        if self.action == "submit":
            if self.workflow is None:
                raise ValueError(f"subscription {self.name!r} submits jobs: name its workflow")
            if self.event is not None:
                raise ValueError(f"subscription {self.name!r}: event is for action 'signal'")
        else:
            if self.job_id is None or self.event is None:
                raise ValueError(
                    f"subscription {self.name!r} delivers signals: set job_id (the job "
                    "the message is for) and event"
                )
            unused = [
                name
                for name in ("workflow", "workflow_version", "correlation_id", "priority", "budget")
                if getattr(self, name) is not None
            ]
            if unused:
                raise ValueError(f"subscription {self.name!r}: {unused[0]} is for action 'submit'")
        if self.dead_letter_topic == self.topic:
            raise ValueError(f"subscription {self.name!r}: dlq_topic is its own topic")
        self._check_id_length()
        if self.input_schema is not None:
            # Read once: a schema file is not read again per message.
            self._schema = self._read_schema()
            self._validator = schema_validator(self.name, self._schema)
        return self

    def _check_id_length(self) -> None:
        """A message's id (idempotency key, signal id) by its position must fit in an
        id, or every message would be dead-lettered; a business key is the message's."""
        if self.key is not None:
            return
        longest = len(self.dedupe_id(f"{self.topic}:{LAST_POSITION}"))
        if longest > MAX_ID:
            raise ValueError(
                f"subscription {self.name!r}: its message ids "
                f"(sub:<name>:<topic>:<partition>:<offset>) reach {longest} characters, "
                f"over the {MAX_ID} an id may have: shorten its name or topic, or declare "
                "a business key"
            )

    @property
    def dead_letter_topic(self) -> str:
        return self.dlq_topic or f"{self.topic}.dlq"

    @property
    def input_json_schema(self) -> dict[str, Any] | None:
        """The JSON Schema the input must satisfy, if the subscription names one."""
        return self._schema

    def _read_schema(self) -> dict[str, Any]:
        schema = self.input_schema
        if isinstance(schema, Path):
            try:
                schema = json.loads(schema.read_text(encoding="utf-8"))
            except (OSError, ValueError) as error:
                raise ValueError(f"input_schema {str(self.input_schema)!r}: {error}") from None
            if not isinstance(schema, dict):
                raise ValueError(f"input_schema {str(self.input_schema)!r} is not a JSON object")
        assert schema is not None
        return schema

    # ---- one message --------------------------------------------------------------

    def identity(self, message: Message) -> str:
        """The message's identity: its business key, else its position."""
        return render(self.key, message) if self.key is not None else message.position

    def tenant_of(self, message: Message) -> str:
        tenant = render(self.tenant, message)
        if self.tenants is not None and tenant not in self.tenants:
            raise SubscriptionMessageError(
                "tenant_not_allowed",
                f"tenant {tenant!r} is not one subscription {self.name!r} may submit for "
                f"(allowed: {', '.join(self.tenants)})",
            )
        return tenant

    def job_id_of(self, message: Message, identity: str) -> str:
        if self.job_id is not None:
            return render(self.job_id, message)
        return self.derived_job_id(identity)

    def derived_job_id(self, identity: str) -> str:
        """The job id of a message with this identity when no ``job_id`` template names
        one: ``<name>-<hash>``, so the job of a known message can be looked up."""
        digest = hashlib.sha256(identity.encode()).hexdigest()[:24]
        return f"{self.name}-{digest}"

    def dedupe_id(self, identity: str) -> str:
        """The submit's idempotency key and the signal's id (``sub:<name>:<identity>``):
        one per subscription and message identity."""
        return f"sub:{self.name}:{identity}"

    def input_of(self, message: Message) -> dict[str, Any]:
        """The job's input: the value (or the part ``input`` names), checked against
        the subscription's model or schema."""
        _, _, path = self.input.partition(".")
        document = path_value(message.value, path)
        if document is MISSING:
            raise SubscriptionMessageError("input", f"the message value has no {self.input}")
        if self.input_model is not None:
            try:
                document = self.input_model.model_validate(document).model_dump(mode="json")
            except ValidationError as error:
                raise SubscriptionMessageError("schema", _first_error(error)) from None
        elif self._validator is not None:
            validate_schema(self._validator, document)
        if not isinstance(document, dict):
            kind = type(document).__name__
            raise SubscriptionMessageError("input", f"the input must be a JSON object, not {kind}")
        return document


def import_model(spec: str) -> type[BaseModel]:
    """The pydantic model ``module:Class`` names; a ValueError saying what is wrong."""
    module_name, _, attribute = spec.partition(":")
    if not module_name or not attribute:
        raise ValueError(f"input_model {spec!r}: expected module:Class")
    try:
        found = getattr(importlib.import_module(module_name), attribute)
    except Exception as error:  # whatever the import raised: say which model, and why
        raise ValueError(f"input_model {spec!r} does not import: {error}") from None
    if not (isinstance(found, type) and issubclass(found, BaseModel)):
        raise ValueError(f"input_model {spec!r} is not a pydantic model class")
    return found


def _first_error(error: ValidationError) -> str:
    first = error.errors()[0]
    where = ".".join(str(part) for part in first["loc"]) or "the input"
    return f"{where}: {first['msg']}"


def validate_schema(validator: Any, document: Any) -> None:
    """Raise ``schema`` with the first violation, as the jsonschema library words it."""
    import jsonschema

    failure = jsonschema.exceptions.best_match(validator.iter_errors(document))
    if failure is not None:
        where = ".".join(str(part) for part in failure.absolute_path) or "the input"
        raise SubscriptionMessageError("schema", f"{where}: {failure.message}")


def schema_validator(name: str, schema: dict[str, Any]) -> Any:
    """The jsonschema validator of ``schema``, made once for every message; a ValueError
    when it is not a valid JSON Schema (by the version its ``$schema`` names). Without
    the jsonschema library, None: :func:`check_libraries` says what to install."""
    try:
        import jsonschema
    except ImportError:
        return None
    validator_class = jsonschema.validators.validator_for(schema)
    try:
        validator_class.check_schema(schema)
    except jsonschema.exceptions.SchemaError as error:
        raise ValueError(
            f"subscription {name!r}: input_schema is not a valid JSON Schema: {error.message}"
        ) from None
    return validator_class(schema)


def check_libraries(subscriptions: Iterable[Subscription]) -> None:
    """A subscription naming a JSON Schema needs the jsonschema library: say so at the
    start, not at the first message."""
    if not any(s.input_json_schema is not None for s in subscriptions):
        return
    try:
        import jsonschema  # noqa: F401
    except ImportError:
        raise ValueError(
            "input_schema needs the jsonschema library: pip install 'jobledger[subscriptions]'"
        ) from None


def check_unique(subscriptions: Iterable[Subscription]) -> None:
    names = [s.name for s in subscriptions]
    twice = sorted({name for name in names if names.count(name) > 1})
    if twice:
        raise ValueError(f"two subscriptions are named {twice[0]!r}: each needs its own name")
