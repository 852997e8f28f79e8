"""The Tracer port on OpenTelemetry (the ``otel`` extra): spans made by the SDK, their W3C
trace context propagated as ``traceparent``/``tracestate``, exported over OTLP (to
``OTEL_EXPORTER_OTLP_ENDPOINT`` and the SDK's other ``OTEL_*`` settings) or to the console.

A span given a ``parent`` continues that trace (a job's); the span that was current, if it
belongs to another trace (a caller's request), is kept as a link rather than lost.
"""

from __future__ import annotations

import sys
from contextlib import AbstractContextManager
from contextvars import Token
from types import TracebackType
from typing import Literal

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter, SpanExporter
from opentelemetry.trace import Link, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from jobledger.errors import ConfigError
from jobledger.tracing import Attributes, Carrier

Exporter = Literal["console", "otlp"]
_PROPAGATOR = TraceContextTextMapPropagator()


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
        self._tracer = provider.get_tracer("jobledger")

    @classmethod
    def exporting(cls, exporter: Exporter, *, service_name: str) -> OtelTracer:
        provider = TracerProvider(resource=Resource.create({"service.name": service_name}))
        # Batched: a tick never waits on the collector; shutdown() sends what is left.
        provider.add_span_processor(BatchSpanProcessor(_exporter(exporter)))
        return cls(provider)

    def span(
        self, name: str, *, parent: Carrier | None = None, attributes: Attributes
    ) -> AbstractContextManager[OtelSpan]:
        context, links = None, []
        if parent:
            extracted = _PROPAGATOR.extract(dict(parent))
            wanted = trace.get_current_span(extracted).get_span_context()
            if wanted.is_valid:
                current = trace.get_current_span().get_span_context()
                if current.is_valid and current.trace_id != wanted.trace_id:
                    links.append(Link(current))
                context = extracted
        span = self._tracer.start_span(name, context=context, links=links, attributes=attributes)
        return _Current(span)

    def current(self) -> OtelSpan:
        return OtelSpan(trace.get_current_span())

    def shutdown(self) -> None:
        self.provider.shutdown()


class _Current:
    """The span current in this context until it ends: what the SDK's
    ``start_as_current_span`` does, without its two generator layers (a span per step)."""

    __slots__ = ("_span", "_token")

    def __init__(self, span: trace.Span) -> None:
        self._span = span
        self._token: Token[Context] | None = None

    def __enter__(self) -> OtelSpan:
        self._token = otel_context.attach(trace.set_span_in_context(self._span))
        return OtelSpan(self._span)

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, _: TracebackType | None
    ) -> None:
        try:
            if isinstance(error, Exception):
                self._span.record_exception(error)
                self._span.set_status(Status(StatusCode.ERROR, f"{type(error).__name__}: {error}"))
        finally:
            assert self._token is not None
            otel_context.detach(self._token)
            self._span.end()


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
