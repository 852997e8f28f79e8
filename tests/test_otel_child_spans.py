"""A tick's and a step's spans are ChildSpans (jobledger.adapters.otel): recorded by
jobledger, not by the SDK's span class, and handed to the SDK's processors. What a
processor and an exporter see of one must be what the SDK would have made of the same
calls: each test does the same thing once through the SDK's own tracer and once through
the OtelTracer, and compares.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from typing import Any

import pytest
from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, SpanLimits, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.sampling import (
    ALWAYS_OFF,
    ALWAYS_ON,
    Decision,
    ParentBased,
    ParentBasedTraceIdRatio,
    Sampler,
    SamplingResult,
)
from opentelemetry.trace import Link, SpanContext, Status, StatusCode, TraceFlags
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from jobledger.adapters.otel import ChildSpan, OtelTracer

PARENT = {"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}
Calls = Callable[[trace.Span], None]


class Recorder:
    """A provider exporting to memory, and both ways to open a span under a local parent."""

    def __init__(self, **provider: Any) -> None:
        self.exported = InMemorySpanExporter()
        self.provider = TracerProvider(**provider)
        self.provider.add_span_processor(SimpleSpanProcessor(self.exported))
        self.tracer = OtelTracer(self.provider)
        self.sdk = self.provider.get_tracer("jobledger")

    def child(self, calls: Calls, *, ours: bool, fail: bool = False) -> ReadableSpan:
        """A tick span continuing PARENT; under it a step span made ``ours`` (a ChildSpan)
        or by the SDK, ``calls`` made on it as an executor makes them (the API's current
        span); an exception out of it when ``fail``. Returns the step span as exported."""
        self.exported.clear()
        with self.tracer.span("jobledger.tick", parent=PARENT, attributes={"a": 1}):
            try:
                if ours:
                    with self.tracer.span("jobledger.step", attributes={"n": 1}):
                        self.run(calls, fail=fail)
                else:
                    with self.sdk.start_as_current_span("jobledger.step", attributes={"n": 1}):
                        self.run(calls, fail=fail)
            except RuntimeError:
                pass
        step, tick = self.exported.get_finished_spans()
        assert step.parent is not None and tick.context is not None
        assert step.parent.span_id == tick.context.span_id
        return step

    @staticmethod
    def run(calls: Calls, *, fail: bool) -> None:
        calls(trace.get_current_span())
        if fail:
            raise RuntimeError("the executor broke")


def shape(span: ReadableSpan, caller: SpanContext | None = None) -> dict[str, Any]:
    """What an exporter reads of a span, less its own ids and times (and the ids of the
    ``caller`` it links to, different each time)."""
    assert span.context is not None and span.parent is not None
    return {
        "name": span.name,
        "kind": span.kind,
        "trace_id": span.context.trace_id,
        "flags": span.context.trace_flags,
        "trace_state": span.context.trace_state,
        "remote": span.context.is_remote,
        "parent_trace_id": span.parent.trace_id,
        "attributes": dict(span.attributes or {}),
        "dropped_attributes": span.dropped_attributes,
        "events": [
            (event.name, dict(event.attributes or {}), event.dropped_attributes)
            for event in span.events
        ],
        "dropped_events": span.dropped_events,
        "links": [
            ("caller" if link.context == caller else link.context, dict(link.attributes or {}))
            for link in span.links
        ],
        "status": (span.status.status_code, span.status.description),
        "resource": span.resource.attributes,
        "scope": span.instrumentation_scope,
    }


def executor_calls(span: trace.Span) -> None:
    """What an executor may do to the current span, bad values included."""
    span.set_attribute("model", "gpt")
    span.set_attributes({"tokens": 1200, "cost": 0.25, "cached": False, "tags": ["a", "b"]})
    span.set_attribute("bad", {"not": "allowed"})  # dropped, warned
    span.add_event("prompt.sent", {"size": 3, "text": "a long prompt"})
    span.add_event("bare")
    span.add_link(SpanContext(1, 2, is_remote=True), {"why": "fan-in"})
    span.add_link(SpanContext(0, 0, is_remote=False))  # invalid, says nothing: ignored
    span.add_link(SpanContext(0, 0, is_remote=False), {"kept": "it says why"})
    span.update_name("jobledger.step.renamed")
    for n in range(5):
        span.add_event(f"tick-{n}", {"n": n})
        span.set_attribute(f"extra-{n}", "x" * 10)


@pytest.mark.parametrize(
    "limits",
    [
        SpanLimits(),
        SpanLimits(max_span_attributes=3, max_events=2, max_attribute_length=4),
        SpanLimits(max_event_attributes=1, max_links=0, max_span_attribute_length=2),
    ],
    ids=["default-limits", "tight-limits", "other-limits"],
)
def test_a_step_span_is_exported_as_the_sdk_would_export_it(limits: SpanLimits) -> None:
    recorder = Recorder(span_limits=limits)
    ours = recorder.child(executor_calls, ours=True)
    theirs = recorder.child(executor_calls, ours=False)
    assert shape(ours) == shape(theirs)
    assert shape(ours)["parent_trace_id"] == int(PARENT["traceparent"][3:35], 16)


def test_a_failed_step_records_the_exception_and_the_error_as_the_sdk_does() -> None:
    recorder = Recorder()
    ours = recorder.child(lambda span: None, ours=True, fail=True)
    theirs = recorder.child(lambda span: None, ours=False, fail=True)
    assert ours.status.status_code is StatusCode.ERROR
    assert ours.status.description == "RuntimeError: the executor broke"
    (event,) = ours.events
    assert event.name == "exception"
    attributes = dict(event.attributes or {})
    assert attributes["exception.type"] == "RuntimeError"
    assert attributes["exception.message"] == "the executor broke"
    assert attributes["exception.escaped"] == "False"  # as the SDK records it
    assert "the executor broke" in str(attributes["exception.stacktrace"])
    (their_event,) = theirs.events
    assert {k: v for k, v in attributes.items() if k != "exception.stacktrace"} == {
        k: v for k, v in dict(their_event.attributes or {}).items() if k != "exception.stacktrace"
    }
    assert (ours.status.status_code, ours.status.description) == (
        theirs.status.status_code,
        theirs.status.description,
    )


def test_status_rules_are_the_sdks() -> None:
    def calls(span: trace.Span) -> None:
        span.set_status(StatusCode.UNSET)  # changes nothing
        span.set_status(Status(StatusCode.ERROR, "first"))
        span.set_status(StatusCode.OK, "ignored with OK")
        span.set_status(Status(StatusCode.ERROR, "after OK"))  # OK is final

    recorder = Recorder()
    ours = recorder.child(calls, ours=True)
    theirs = recorder.child(calls, ours=False)
    assert ours.status.status_code is StatusCode.OK
    assert (ours.status.status_code, ours.status.description) == (
        theirs.status.status_code,
        theirs.status.description,
    )


class DropSteps(Sampler):
    """Keeps every span but steps: proof the sampler is asked about each step span."""

    def __init__(self) -> None:
        self.asked: list[str] = []

    def should_sample(
        self, parent_context: Any, trace_id: int, name: str, *args: Any, **kw: Any
    ) -> SamplingResult:
        self.asked.append(name)
        if name == "jobledger.step":
            return SamplingResult(Decision.DROP)
        return ParentBased(ALWAYS_ON).should_sample(parent_context, trace_id, name, *args, **kw)

    def get_description(self) -> str:
        return "DropSteps"


def test_the_providers_sampler_decides_each_step_span() -> None:
    sampler = DropSteps()
    recorder = Recorder(sampler=sampler)
    with recorder.tracer.span("jobledger.tick", parent=PARENT, attributes={}) as tick:
        with recorder.tracer.span("jobledger.step", attributes={"n": 1}) as step:
            step.set({"ignored": True})
            step.event("ignored", {})
            # The dropped span still carries the trace on: not sampled, same trace.
            assert step.carrier["traceparent"].startswith("00-0af7651916cd43dd8448eb211c80319c-")
            assert step.carrier["traceparent"].endswith("-00")
            inner = recorder.sdk.start_span("executor.call")  # a child of the dropped one
            assert not inner.get_span_context().trace_flags.sampled
            inner.end()
        assert tick.carrier["traceparent"].endswith("-01")
    assert [span.name for span in recorder.exported.get_finished_spans()] == ["jobledger.tick"]
    assert sampler.asked.count("jobledger.step") == 1


@pytest.mark.parametrize("flags", ["01", "03", "00"])
@pytest.mark.parametrize("caller", [False, True], ids=["alone", "in-a-callers-trace"])
def test_a_tick_span_continuing_its_jobs_trace_is_exported_as_the_sdk_would_export_it(
    flags: str, caller: bool
) -> None:
    """The job's trace context names the parent (sampled or not, W3C level 2's random-id
    flag or not); a caller's span of another trace, when there is one, becomes a link."""
    carrier = {"traceparent": PARENT["traceparent"][:-2] + flags}
    recorder = Recorder()

    def tick(ours: bool) -> list[dict[str, Any]]:
        recorder.exported.clear()
        outer = recorder.sdk.start_as_current_span("http.request") if caller else nullcontext()
        with outer:
            calling = trace.get_current_span().get_span_context()
            if ours:
                opened: AbstractContextManager[object] = recorder.tracer.span(
                    "jobledger.tick", parent=carrier, attributes={"a": 1}
                )
            else:
                links = [Link(calling)] if calling.is_valid else []
                opened = recorder.sdk.start_as_current_span(
                    "jobledger.tick",
                    context=TraceContextTextMapPropagator().extract(carrier),
                    links=links,
                    attributes={"a": 1},
                )
            with opened:
                trace.get_current_span().add_event("claimed")
        ticks = [s for s in recorder.exported.get_finished_spans() if s.name == "jobledger.tick"]
        for span in ticks:
            assert span.parent is not None and span.parent.is_remote
            assert span.parent.span_id == int(PARENT["traceparent"][36:52], 16)
        return [shape(span, calling) for span in ticks]

    ours = tick(True)
    assert ours == tick(False)
    assert len(ours) == (0 if flags == "00" else 1)
    for span in ours:
        assert span["links"] == ([("caller", {})] if caller else [])


SAMPLERS = {
    "default": ParentBased(ALWAYS_ON),
    "ratio-0-follows-the-parent": ParentBasedTraceIdRatio(0.0),
    "local-parent-delegate-drops": ParentBased(ALWAYS_ON, local_parent_sampled=ALWAYS_OFF),
    "remote-parent-delegate-drops": ParentBased(ALWAYS_ON, remote_parent_sampled=ALWAYS_OFF),
    "always-on-ignores-the-parent": ALWAYS_ON,
    "always-off": ALWAYS_OFF,
}


@pytest.mark.parametrize("flags", ["01", "00"])
@pytest.mark.parametrize("sampler", list(SAMPLERS.values()), ids=list(SAMPLERS))
def test_each_sampler_decides_the_tick_and_step_spans_as_it_would_the_sdks(
    sampler: Sampler, flags: str
) -> None:
    """The SDK's default sampler is not asked (its answer is the parent's flag): with any
    other, or other delegates, the exported spans must still be the SDK's."""
    carrier = {"traceparent": PARENT["traceparent"][:-2] + flags}

    def run(ours: bool) -> list[tuple[str, int, dict[str, Any]]]:
        recorder = Recorder(sampler=sampler)
        if ours:
            tick = recorder.tracer.span("jobledger.tick", parent=carrier, attributes={"a": 1})
            with tick, recorder.tracer.span("jobledger.step", attributes={"n": 1}):
                pass
        else:
            parent = TraceContextTextMapPropagator().extract(carrier)
            start = recorder.sdk.start_as_current_span
            tick = start("jobledger.tick", context=parent, attributes={"a": 1})
            with tick, start("jobledger.step", attributes={"n": 1}):
                pass
        return [
            (span.name, int(span.context.trace_flags), dict(span.attributes or {}))
            for span in recorder.exported.get_finished_spans()
            if span.context is not None
        ]

    assert run(True) == run(False)


def test_the_step_span_keeps_its_parents_flags() -> None:
    recorder = Recorder()
    flags = "03"  # sampled, and W3C level 2's random trace id
    parent = {"traceparent": PARENT["traceparent"][:-2] + flags}
    tick = recorder.tracer.span("jobledger.tick", parent=parent, attributes={})
    with tick, recorder.tracer.span("jobledger.step", attributes={}) as step:
        assert step.carrier["traceparent"].endswith("-" + flags)
    step_span, tick_span = recorder.exported.get_finished_spans()
    assert step_span.context is not None and tick_span.context is not None
    assert step_span.context.trace_flags == TraceFlags(0x03)


class StartWatcher(SpanProcessor):
    """A processor that reads and tags each span as it starts, as some do."""

    def __init__(self) -> None:
        self.started: list[tuple[str, dict[str, Any], bool]] = []

    def on_start(self, span: Any, parent_context: otel_context.Context | None = None) -> None:
        parent = trace.get_current_span(parent_context).get_span_context()
        self.started.append((span.name, dict(span.attributes), parent.is_valid))
        span.set_attribute("watched", True)


def test_processors_are_told_of_a_step_span_starting_and_may_tag_it() -> None:
    watcher = StartWatcher()
    recorder = Recorder()
    recorder.provider.add_span_processor(watcher)
    ours = recorder.child(lambda span: None, ours=True)
    theirs = recorder.child(lambda span: None, ours=False)
    assert dict(ours.attributes or {}) == dict(theirs.attributes or {}) == {"n": 1, "watched": True}
    assert watcher.started[1] == watcher.started[3] == ("jobledger.step", {"n": 1}, True)


def test_an_ended_step_span_ignores_changes_with_a_warning_and_is_exported_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    recorder = Recorder()
    with recorder.tracer.span("jobledger.tick", parent=PARENT, attributes={}):
        with recorder.tracer.span("jobledger.step", attributes={}) as step:
            span = trace.get_current_span()
        assert isinstance(span, ChildSpan) and span is step
        assert not span.is_recording()
        with caplog.at_level(logging.WARNING):
            span.set_attribute("late", 1)
            step.event("late", {})
            span.end()
    assert caplog.text.count("on an ended span") == 3
    step_span, _ = recorder.exported.get_finished_spans()
    assert "late" not in dict(step_span.attributes or {})
    assert [event.name for event in step_span.events] == []


def test_with_the_sdk_disabled_nothing_is_recorded_and_nothing_breaks(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("OTEL_SDK_DISABLED", "true")
    recorder = Recorder()
    with recorder.tracer.span("jobledger.tick", parent=PARENT, attributes={}) as tick:
        with recorder.tracer.span("jobledger.step", attributes={}) as step:
            step.set({"a": 1})
            step.event("b", {})
        tick.set({"c": 2})
    assert recorder.exported.get_finished_spans() == ()


def test_a_span_opened_under_a_callers_local_span_is_its_child() -> None:
    """Outside a tick (a command under a web framework's request span), a span without a
    job trace is a child span of whatever local span is current."""
    recorder = Recorder()
    with recorder.sdk.start_as_current_span("http.request") as request:
        with recorder.tracer.span("jobledger.submit", attributes={}) as submit:
            submit.event("checked", {})
        assert trace.get_current_span() is request
    submitted, request_span = recorder.exported.get_finished_spans()
    assert submitted.parent is not None and request_span.context is not None
    assert submitted.parent.span_id == request_span.context.span_id
    assert [event.name for event in submitted.events] == ["checked"]


def test_a_root_span_is_still_the_sdks() -> None:
    recorder = Recorder()
    with recorder.tracer.span("jobledger.submit", attributes={}):
        assert not isinstance(trace.get_current_span(), ChildSpan)
    (root,) = recorder.exported.get_finished_spans()
    assert root.parent is None
