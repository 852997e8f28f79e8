"""Tracing as the core sees it: the Tracer port, its no-op default, and the log context.

The core names what it does (a tick, a step, a resume) as spans with attributes and events;
an adapter (:mod:`jobledger.adapters.otel`) makes them OpenTelemetry spans. A span's
``carrier`` is its W3C trace context (``traceparent``, ``tracestate``): recorded on the job
when it is submitted and carried by the ticks it enqueues, so one trace follows one job
across processes and waits. Without an adapter, :data:`NOOP` costs a call and no more.

The log context is what this thread is working on (tenant, job, step, trace and span id):
a logging filter adds it to each line, so logs and traces join.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from contextlib import AbstractContextManager, nullcontext
from contextvars import ContextVar, Token
from typing import NamedTuple, Protocol, TypeGuard

Carrier = Mapping[str, str]
"""W3C trace context headers: ``traceparent`` and, when set, ``tracestate``."""
Attribute = str | int | float | bool
Attributes = Mapping[str, Attribute]
"""Span attributes (OpenTelemetry has no null: an attribute not known is left out)."""

CARRIER_HEADERS = ("traceparent", "tracestate")
MAX_HEADER_LENGTH = 512
"""W3C's limit for tracestate (traceparent is 55 characters): a longer one is not a trace."""


class Span(Protocol):
    def set(self, attributes: Attributes) -> None:
        """Add (or overwrite) attributes: an outcome known only at the end."""

    def event(self, name: str, attributes: Attributes) -> None:
        """Something that happened at one moment of the span (a claim, an append)."""

    @property
    def carrier(self) -> dict[str, str]:
        """This span's W3C trace context; empty when nothing is traced."""

    @property
    def ids(self) -> tuple[str, str] | None:
        """(trace id, span id) in hex, as logs carry them; None when nothing is traced."""


class Tracer(Protocol):
    def span(
        self, name: str, *, parent: Carrier | None = None, attributes: Attributes
    ) -> AbstractContextManager[Span]:
        """Open a span, current until it ends. With ``parent`` (a job's trace context),
        it continues that trace, linked to the span that was current when that one belongs
        to another trace (a caller's request); without, it is a child of the current span,
        or the root of a new trace. An exception leaving it marks it failed."""

    def current(self) -> Span:
        """The span this thread is in (a no-op span outside any)."""


class _NoopSpan:
    def set(self, attributes: Attributes) -> None:
        pass

    def event(self, name: str, attributes: Attributes) -> None:
        pass

    @property
    def carrier(self) -> dict[str, str]:
        return {}

    @property
    def ids(self) -> tuple[str, str] | None:
        return None


class NoopTracer:
    """The default: no spans, nothing recorded, nothing exported."""

    _span = _NoopSpan()
    _opened = nullcontext(_span)  # reusable: one object for every span never made

    def span(
        self, name: str, *, parent: Carrier | None = None, attributes: Attributes
    ) -> AbstractContextManager[Span]:
        return self._opened

    def current(self) -> Span:
        return self._span


NOOP: Tracer = NoopTracer()


def trace_headers(carrier: Mapping[str, str] | None) -> list[tuple[str, bytes]]:
    """A trace context as message headers (W3C's names): ticks and job events carry the
    trace of the job they are about to the process that reads them."""
    if not carrier:
        return []
    return [(name, carrier[name].encode()) for name in CARRIER_HEADERS if name in carrier]


def trace_context(headers: Iterable[tuple[str, bytes]] | None) -> dict[str, str] | None:
    """The trace context among a message's headers, None without one. A header that is
    not short ASCII text is ignored: a trace is a courtesy, never a reason to refuse a
    message (and a malformed traceparent starts a new trace, the tracer decides)."""
    found: dict[str, str] = {}
    for name, value in headers or ():
        if name in CARRIER_HEADERS and _short_text(value):
            found[name] = value.decode("ascii")
    return found or None


def _short_text(value: object) -> TypeGuard[bytes]:
    return isinstance(value, bytes) and 0 < len(value) <= MAX_HEADER_LENGTH and value.isascii()


# ---- the log context ---------------------------------------------------------------------

LogFields = Mapping[str, str | int]


class _LogContext(NamedTuple):  # a tuple: made once per step, cheaper than a dataclass
    fields: LogFields
    span: Span | None
    """Its ids are formatted only when a line is logged: most spans log nothing."""


_log_context: ContextVar[_LogContext | None] = ContextVar("jobledger_log_context", default=None)


def log_fields() -> dict[str, str | int]:
    """What this thread is working on: ``tenant``, ``job``, ``step``, ``trace_id``,
    ``span_id`` (those known)."""
    context = _log_context.get()
    if context is None:
        return {}
    found = dict(context.fields)
    if context.span is not None:
        found.update(span_fields(context.span))
    return found


class logged:  # lower case: it reads as the function it replaced, `with tracing.logged(...)`
    """Add ``fields`` (those not None) and ``span``'s ids to the log context until the
    block ends. A class, not a generator: it runs once per step of every tick."""

    __slots__ = ("_context", "_token")

    def __init__(self, span: Span | None = None, **fields: str | int | None) -> None:
        outer = _log_context.get()
        known = {name: value for name, value in fields.items() if value is not None}
        if outer is not None:
            known = {**outer.fields, **known}
            span = span if span is not None else outer.span
        self._context = _LogContext(known, span)
        self._token: Token[_LogContext | None] | None = None

    def __enter__(self) -> None:
        self._token = _log_context.set(self._context)

    def __exit__(self, *_: object) -> None:
        assert self._token is not None
        _log_context.reset(self._token)


def span_fields(span: Span) -> dict[str, str]:
    """A span's ids as log fields (none when nothing is traced)."""
    ids = span.ids
    return {} if ids is None else {"trace_id": ids[0], "span_id": ids[1]}
