"""The Tracer port on OpenTelemetry (the ``otel`` extra): spans made by the SDK, their W3C
trace context propagated as ``traceparent``/``tracestate``, exported over OTLP (to
``OTEL_EXPORTER_OTLP_ENDPOINT`` and the SDK's other ``OTEL_*`` settings) or to the console.

A span given a ``parent`` continues that trace (a job's); the span that was current, if it
belongs to another trace (a caller's request), is kept as a link rather than lost.

A span that starts a new trace is the SDK's own. A span with a parent (a tick under its
job's trace context, a step under its tick) is a :class:`ChildSpan`: the same sampler,
ids, limits and processors, without the SDK span's per-call locks and checks, which cost a
step as much as all of its other tracing (issue 14's budget).
"""

from __future__ import annotations

import logging
import sys
import traceback
from collections.abc import Mapping, Sequence
from contextlib import AbstractContextManager
from contextvars import Token
from time import time_ns
from types import TracebackType
from typing import Literal, TypeVar

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.attributes import BoundedAttributes
from opentelemetry.context import Context
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import Event, ReadableSpan, SpanLimits, TracerProvider
from opentelemetry.sdk.trace import Tracer as SdkTracer
from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter, SpanExporter
from opentelemetry.sdk.trace.sampling import ALWAYS_OFF, ALWAYS_ON, Decision, ParentBased, Sampler
from opentelemetry.sdk.util import BoundedList
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import (
    Link,
    NonRecordingSpan,
    SpanContext,
    SpanKind,
    Status,
    StatusCode,
    TraceFlags,
    TraceState,
)
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
from opentelemetry.util import types

from jobledger.domain.errors import ConfigError
from jobledger.orchestration.tracing import Attributes, Carrier
from jobledger.orchestration.tracing import Span as CoreSpan

log = logging.getLogger(__name__)

Exporter = Literal["console", "otlp"]
SCOPE = "jobledger"
_PROPAGATOR = TraceContextTextMapPropagator()
_UNSET = Status(StatusCode.UNSET)
_Item = TypeVar("_Item")


class OtelSpan:
    __slots__ = ("_span",)

    def __init__(self, span: trace.Span) -> None:
        self._span = span

    def set(self, attributes: Attributes) -> None:
        self._span.set_attributes(attributes)

    def event(self, name: str, attributes: Attributes) -> None:
        if attributes:
            self._span.add_event(name, attributes)
        else:  # the SDK's own cheaper path: no attribute set to build
            self._span.add_event(name)

    @property
    def carrier(self) -> dict[str, str]:
        carrier: dict[str, str] = {}
        _PROPAGATOR.inject(carrier, context=trace.set_span_in_context(self._span))
        return carrier

    @property
    def ids(self) -> tuple[str, str] | None:
        context = self._span.get_span_context()
        if not context.is_valid:
            return None
        return format(context.trace_id, "032x"), format(context.span_id, "016x")


class OtelTracer:
    """Spans from ``provider``: a test's with an in-memory exporter, a benchmark's with
    none attached, or :meth:`exporting`'s."""

    def __init__(self, provider: TracerProvider) -> None:
        self.provider = provider
        self._tracer = provider.get_tracer(SCOPE)
        # OTEL_SDK_DISABLED makes the provider hand out no-op tracers: nothing to record.
        self._children = _ChildSpans(self._tracer) if isinstance(self._tracer, SdkTracer) else None

    @classmethod
    def exporting(cls, exporter: Exporter, *, service_name: str) -> OtelTracer:
        provider = TracerProvider(resource=Resource.create({"service.name": service_name}))
        # Batched: a tick never waits on the collector; shutdown() sends what is left.
        provider.add_span_processor(BatchSpanProcessor(_exporter(exporter)))
        return cls(provider)

    def span(
        self, name: str, *, parent: Carrier | None = None, attributes: Attributes
    ) -> AbstractContextManager[CoreSpan]:
        context = otel_context.get_current()
        links: list[Link] = []
        if parent:
            extracted = _PROPAGATOR.extract(dict(parent))
            wanted = trace.get_current_span(extracted).get_span_context()
            if wanted.is_valid:
                current = trace.get_current_span(context).get_span_context()
                if current.is_valid and current.trace_id != wanted.trace_id:
                    links.append(Link(current))
                context = extracted
        above = trace.get_current_span(context).get_span_context()
        if self._children is not None and above.is_valid:
            return self._children.open(name, above, context, attributes, links)
        # A new trace: the SDK's span, with the SDK's rules for a root's ids and flags.
        span = self._tracer.start_span(name, context=context, links=links, attributes=attributes)
        return _Current(span)

    def current(self) -> CoreSpan:
        span = trace.get_current_span()
        return span if isinstance(span, ChildSpan) else OtelSpan(span)

    def shutdown(self) -> None:
        self.provider.shutdown()


class _Current:
    """The span current in this context until it ends: what the SDK's
    ``start_as_current_span`` does, without its two generator layers (a span per step)."""

    __slots__ = ("_handle", "_span", "_token")

    def __init__(self, span: trace.Span, handle: CoreSpan | None = None) -> None:
        self._span = span
        self._handle = handle if handle is not None else OtelSpan(span)
        self._token: Token[Context] | None = None

    def __enter__(self) -> CoreSpan:
        self._token = otel_context.attach(trace.set_span_in_context(self._span))
        return self._handle

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, _: TracebackType | None
    ) -> None:
        try:
            if isinstance(error, Exception) and self._span.is_recording():
                self._span.record_exception(error)
                self._span.set_status(Status(StatusCode.ERROR, f"{type(error).__name__}: {error}"))
        finally:
            assert self._token is not None
            otel_context.detach(self._token)
            self._span.end()


class _ChildSpans:
    """Starts a :class:`ChildSpan` as the SDK's tracer would start a span with a parent:
    its sampler decides (the SDK's default one by the parent's flag, as it would), its id
    generator numbers, its processors are told."""

    def __init__(self, tracer: SdkTracer) -> None:
        self.tracer = tracer
        # The provider's limits (its own or OTEL_SPAN_*_LIMIT) and the tracer's scope, as
        # its spans carry them: the SDK keeps both private (the comparison tests pin them).
        self.limits: SpanLimits = tracer._span_limits
        self.scope: InstrumentationScope = tracer._instrumentation_scope
        self.follows_parent = _follows_parent(tracer.sampler)

    def open(
        self,
        name: str,
        above: SpanContext,
        context: Context,
        attributes: Attributes,
        links: list[Link],
    ) -> _Current:
        """A span under ``above``, the span ``context`` holds (this process's, or one a
        trace context named)."""
        tracer = self.tracer
        decision, trace_state, initial = self.decide(above, context, name, attributes, links)
        own = SpanContext(
            above.trace_id,
            tracer.id_generator.generate_span_id(),
            is_remote=False,
            trace_flags=_flags(above.trace_flags, sampled=decision is Decision.RECORD_AND_SAMPLE),
            trace_state=trace_state,
        )
        if decision is Decision.DROP:
            return _Current(NonRecordingSpan(own))
        span = ChildSpan(self, name, own, above, initial, links)
        # Processors type it as the SDK's span; it has that span's reads and writes.
        tracer.span_processor.on_start(span, parent_context=context)  # type: ignore[arg-type]
        return _Current(span, span)

    def decide(
        self,
        above: SpanContext,
        context: Context,
        name: str,
        attributes: Attributes,
        links: list[Link],
    ) -> tuple[Decision, TraceState | None, dict[str, types.AttributeValue]]:
        """The sampler's decision, the trace state and the span's first attributes."""
        if self.follows_parent:
            sampled = above.trace_flags.sampled
            decision = Decision.RECORD_AND_SAMPLE if sampled else Decision.DROP
            return decision, above.trace_state, dict(attributes)
        sampling = self.tracer.sampler.should_sample(
            context, above.trace_id, name, SpanKind.INTERNAL, attributes, links
        )
        return sampling.decision, sampling.trace_state, dict(sampling.attributes)

    def ended(self, span: ReadableSpan) -> None:
        self.tracer.span_processor.on_end(span)


def _follows_parent(sampler: Sampler) -> bool:
    """Whether ``sampler`` decides a span with a parent by the parent's sampled flag alone,
    as the SDK's default does: a ParentBased (whatever its root) with its default parent
    delegates. It is then not asked: what it would answer is known, without its objects."""
    return (
        isinstance(sampler, ParentBased)
        and type(sampler).should_sample is ParentBased.should_sample
        and sampler._remote_parent_sampled is ALWAYS_ON
        and sampler._local_parent_sampled is ALWAYS_ON
        and sampler._remote_parent_not_sampled is ALWAYS_OFF
        and sampler._local_parent_not_sampled is ALWAYS_OFF
    )


def _flags(parent: TraceFlags, *, sampled: bool) -> TraceFlags:
    """The parent's flags (the W3C random-id bit, when the SDK sets it), sampled or not."""
    if sampled:
        return TraceFlags(parent | TraceFlags.SAMPLED)
    return TraceFlags(parent & ~TraceFlags.SAMPLED)


class ChildSpan(trace.Span):
    """A recording span with a parent, handed to the processors as the SDK's
    :class:`ReadableSpan` when it ends, with the SDK span's semantics (limits, status,
    exceptions, warnings on an ended span). Unlike the SDK's it takes no lock: it is
    written by the thread running its tick or step, and a dict or list update is atomic.

    It is both the core's span (``set``, ``event``, ``carrier``, ``ids``: trusted values,
    not checked again) and the API's (what an executor reaches through
    ``trace.get_current_span()``: checked as the SDK checks them)."""

    __slots__ = (
        "_attributes",
        "_carrier",
        "_context",
        "_end_time",
        "_events",
        "_links",
        "_name",
        "_parent",
        "_spans",
        "_start_time",
        "_status",
    )

    def __init__(
        self,
        spans: _ChildSpans,
        name: str,
        context: SpanContext,
        parent: SpanContext,
        attributes: dict[str, types.AttributeValue],
        links: list[Link],
    ) -> None:
        self._spans = spans
        self._name = name
        self._context = context
        self._parent = parent
        self._attributes = attributes
        self._events: list[Event] = []
        self._links = links
        self._status = _UNSET
        self._carrier: dict[str, str] | None = None
        self._end_time: int | None = None
        self._start_time = time_ns()

    # ---- the core's span ----------------------------------------------------------------

    def set(self, attributes: Attributes) -> None:
        if self._open("set"):
            self._attributes.update(attributes)

    def event(self, name: str, attributes: Attributes) -> None:
        if self._open("event"):
            self._events.append(Event(name, attributes, time_ns()))

    @property
    def carrier(self) -> dict[str, str]:
        if self._carrier is None:  # each tick it enqueues carries it: worked out once
            self._carrier = {}
            _PROPAGATOR.inject(self._carrier, context=trace.set_span_in_context(self))
        return self._carrier

    @property
    def ids(self) -> tuple[str, str] | None:
        return format(self._context.trace_id, "032x"), format(self._context.span_id, "016x")

    # ---- the API's span -----------------------------------------------------------------

    def get_span_context(self) -> SpanContext:
        return self._context

    def is_recording(self) -> bool:
        return self._end_time is None

    def set_attributes(self, attributes: Mapping[str, types.AttributeValue]) -> None:
        if self._open("set_attributes"):
            # Checked as the SDK checks them: a value of a wrong type is dropped, warned.
            self._attributes.update(BoundedAttributes(attributes=attributes))

    def set_attribute(self, key: str, value: types.AttributeValue) -> None:
        self.set_attributes({key: value})

    def add_event(
        self, name: str, attributes: types.Attributes = None, timestamp: int | None = None
    ) -> None:
        if self._open("add_event"):
            checked = self._checked(attributes, self._spans.limits.max_event_attributes)
            self._events.append(Event(name, checked, timestamp or time_ns()))

    def add_link(self, context: SpanContext, attributes: types.Attributes = None) -> None:
        # As the SDK: a link to nothing is kept only if it says something.
        if self._open("add_link") and (context.is_valid or attributes or context.trace_state):
            checked = self._checked(attributes, self._spans.limits.max_link_attributes)
            self._links.append(Link(context, checked))

    def update_name(self, name: str) -> None:
        if self._open("update_name"):
            self._name = name

    def set_status(self, status: Status | StatusCode, description: str | None = None) -> None:
        """As the SDK: OK is final, UNSET changes nothing, a description goes with a code."""
        if not self._open("set_status"):
            return
        code = status.status_code if isinstance(status, Status) else status
        if self._status.status_code is StatusCode.OK or code is StatusCode.UNSET:
            return
        self._status = status if isinstance(status, Status) else Status(status, description)

    def record_exception(
        self,
        exception: BaseException,
        attributes: types.Attributes = None,
        timestamp: int | None = None,
        escaped: bool = False,
    ) -> None:
        kind = type(exception)
        module = kind.__module__
        recorded: dict[str, types.AttributeValue] = {
            "exception.type": kind.__qualname__
            if module in ("", "builtins")
            else f"{module}.{kind.__qualname__}",
            "exception.message": str(exception),
            "exception.stacktrace": "".join(traceback.format_exception(exception)),
            "exception.escaped": str(escaped),
        }
        recorded.update(attributes or {})
        self.add_event("exception", recorded, timestamp)

    def end(self, end_time: int | None = None) -> None:
        if not self._open("end"):
            return
        self._end_time = end_time if end_time is not None else time_ns()
        self._spans.ended(self._readable())

    # ---- as the processors read it (the SDK span's ReadableSpan side) --------------------------

    @property
    def name(self) -> str:
        return self._name

    @property
    def context(self) -> SpanContext:
        return self._context

    @property
    def parent(self) -> SpanContext:
        return self._parent

    @property
    def kind(self) -> SpanKind:
        return SpanKind.INTERNAL

    @property
    def attributes(self) -> Mapping[str, types.AttributeValue]:
        limits = self._spans.limits
        return _bounded(
            self._attributes, limits.max_span_attributes, limits.max_span_attribute_length
        )

    @property
    def events(self) -> Sequence[Event]:
        return _bounded_list(self._events, self._spans.limits.max_events)

    @property
    def links(self) -> Sequence[Link]:
        return _bounded_list(self._links, self._spans.limits.max_links)

    @property
    def status(self) -> Status:
        return self._status

    @property
    def start_time(self) -> int:
        return self._start_time

    @property
    def end_time(self) -> int | None:
        return self._end_time

    @property
    def resource(self) -> Resource:
        return self._spans.tracer.resource

    @property
    def instrumentation_scope(self) -> InstrumentationScope:
        return self._spans.scope

    def _checked(self, attributes: types.Attributes, most: int | None) -> BoundedAttributes:
        """An event's or a link's attributes, checked and bounded as the SDK does them."""
        longest = self._spans.limits.max_attribute_length
        return BoundedAttributes(most, attributes, immutable=True, max_value_len=longest)

    def _open(self, call: str) -> bool:
        if self._end_time is None:
            return True
        log.warning("Tried calling %s on an ended span.", call)
        return False

    def _readable(self) -> ReadableSpan:
        return ReadableSpan(
            self._name,
            self._context,
            self._parent,
            self.resource,
            self.attributes,
            self.events,
            self.links,
            SpanKind.INTERNAL,
            status=self._status,
            start_time=self._start_time,
            end_time=self._end_time,
            instrumentation_scope=self._spans.scope,
        )


def _bounded(
    attributes: dict[str, types.AttributeValue], most: int | None, longest: int | None
) -> Mapping[str, types.AttributeValue]:
    """The span's attributes within the limits, bounded as the SDK bounds them (oldest
    dropped first, values cut) only when a limit bites: a step's few never do."""
    if longest is None and (most is None or len(attributes) <= most):
        return attributes
    return BoundedAttributes(most, attributes, immutable=True, max_value_len=longest)


def _bounded_list(items: list[_Item], most: int | None) -> Sequence[_Item]:
    if most is None or len(items) <= most:
        return items
    return BoundedList.from_seq(most, items)  # keeps the newest, counts the dropped


def _exporter(name: Exporter) -> SpanExporter:
    if name == "console":
        # The stdout of now: the SDK's default is the one it saw when it was imported.
        return ConsoleSpanExporter(out=sys.stdout)
    try:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    except ImportError:
        raise ConfigError(
            "otel_exporter otlp needs opentelemetry-exporter-otlp-proto-http: "
            "pip install 'jobledger[otel]'"
        ) from None
    return OTLPSpanExporter()
