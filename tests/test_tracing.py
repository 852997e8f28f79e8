"""Traces that follow a job (orchestration.tracing, adapters.otel) and the JSON log
lines that join them: a span per tick, a child span per step, the job's trace recorded at
submit and continued by a resume, across the local queue (both stores) and a real Kafka
broker, with the OpenTelemetry SDK's in-memory exporter.
"""

from __future__ import annotations

import asyncio
import io
import json
import logging
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import pytest
from kafka import KafkaProducer
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

from jobledger import Engine, EngineConfig, FunctionRegistry, JobStatus, StepRequest, StepResult
from jobledger.adapters.kafka.messages import SignalMessage
from jobledger.adapters.kafka.publisher import KafkaEventPublisher
from jobledger.adapters.kafka.worker import KafkaWorker
from jobledger.adapters.otel import OtelTracer
from jobledger.cli.logs import JobContext, JsonLines
from jobledger.domain import chain
from jobledger.domain.identity import job_uuid, step_key
from jobledger.domain.job import Job
from jobledger.orchestration import tracing
from jobledger.orchestration.tracing import trace_context, trace_headers
from jobledger.projections.outbox import Outbox
from tests.support.engines import TOKEN_SECRET, CountingExecutor, EngineFactory, store_of
from tests.support.engines import open_engine as build_engine
from tests.support.kafka_broker import KafkaTopics, headers, read_topic, wait_for
from tests.support.workflows import LAST_STEP, STEP, linear_registry, wait_event

TENANT = "acme"


def three_steps() -> FunctionRegistry:
    """An agent step, a wait for ``go``, an agent step that completes the job."""
    return linear_registry({"traced": [STEP, wait_event("go"), LAST_STEP]})


@pytest.fixture
def exported() -> InMemorySpanExporter:
    return InMemorySpanExporter()


def otel(exported: InMemorySpanExporter) -> OtelTracer:
    """A process's tracer: its own provider, exporting to the test's memory."""
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exported))
    return OtelTracer(provider)


def by_name(spans: Sequence[ReadableSpan], name: str) -> list[ReadableSpan]:
    return [span for span in spans if span.name == name]


def parent_of(span: ReadableSpan) -> int | None:
    return span.parent.span_id if span.parent is not None else None


def span_id(span: ReadableSpan) -> int:
    assert span.context is not None
    return span.context.span_id


def trace_of(span: ReadableSpan) -> int:
    assert span.context is not None
    return span.context.trace_id


def attributes(span: ReadableSpan) -> dict[str, Any]:
    return dict(span.attributes or {})


def events(span: ReadableSpan) -> list[str]:
    return [event.name for event in span.events]


def assert_job_trace(spans: Sequence[ReadableSpan], job_id: str) -> None:
    """submit -> tick (create) -> steps 1, 2; submit -> wake -> tick (signal) -> step 3:
    one trace, each span the child the tree says, each carrying what it is about."""
    (submit,) = by_name(spans, "jobledger.submit")
    assert submit.parent is None  # the root: the job's trace began at its submit
    assert {trace_of(span) for span in spans} == {trace_of(submit)}
    first, second = sorted(by_name(spans, "jobledger.tick"), key=lambda s: s.start_time or 0)
    (wake,) = by_name(spans, "jobledger.wake")
    assert parent_of(first) == span_id(submit)
    assert parent_of(wake) == span_id(submit)  # the resume continues the job's trace
    assert parent_of(second) == span_id(wake)
    steps = {attributes(s)["jobledger.step.number"]: s for s in by_name(spans, "jobledger.step")}
    assert sorted(steps) == [1, 2, 3]
    assert parent_of(steps[1]) == parent_of(steps[2]) == span_id(first)
    assert parent_of(steps[3]) == span_id(second)
    for number, step in steps.items():
        assert attributes(step) == {
            "jobledger.step.number": number,
            "jobledger.step.idempotency_key": step_key(TENANT, job_id, number),
            "jobledger.step.type": "wait_event" if number == 2 else "run_interaction_task",
            "jobledger.next_status": {1: "queued", 2: "waiting_event", 3: "completed"}[number],
            "jobledger.outcome": "continued" if number == 1 else "advanced",
        }
        assert events(step)[0] == "jobledger.resolution"
        assert events(step)[-1] == "jobledger.append"
    for tick in (first, second):
        assert attributes(tick)["jobledger.tenant_id"] == TENANT
        assert attributes(tick)["jobledger.job_id"] == job_id
        assert attributes(tick)["jobledger.workflow.type"] == "traced"
        assert attributes(tick)["jobledger.workflow.version"] == 1
    # A step that runs a side effect claims the job first (unless a resume folded the
    # claim in, on the local queue): the claim is an event of that step's span.
    assert "jobledger.claim" in events(steps[1])
    assert attributes(first)["jobledger.tick.reason"] == "create"
    assert attributes(first)["jobledger.outcome"] == "advanced"
    assert attributes(first)["jobledger.tick.steps"] == 2
    assert attributes(second)["jobledger.tick.reason"] == "signal"
    assert attributes(second)["jobledger.job.status"] == "completed"
    assert attributes(wake)["jobledger.wake.reason"] == "signal"


# ---- the local queue, on both stores -----------------------------------------------------


def test_a_job_is_one_trace_from_submit_through_its_wait_to_completion(
    make_engine: EngineFactory, exported: InMemorySpanExporter
) -> None:
    engine = make_engine(registry=three_steps(), tracer=otel(exported))
    engine.submit(TENANT, "j", "traced")
    engine.run_until_idle()
    assert engine.job(TENANT, "j").status is JobStatus.WAITING_EVENT
    engine.signal(TENANT, "j", "go", signal_id="s1")
    engine.run_until_idle()
    assert engine.job(TENANT, "j").status is JobStatus.COMPLETED
    spans = exported.get_finished_spans()
    assert_job_trace(spans, "j")
    (submit,) = by_name(spans, "jobledger.submit")
    # The trace is recorded on the job, in its Submitted event, and the chain covers it.
    first = store_of(engine).events(job_uuid(TENANT, "j"), to_version=1)[0]
    assert isinstance(first, Job.Submitted) and first.trace_context is not None
    assert f"{trace_of(submit):032x}-{span_id(submit):016x}" in first.trace_context["traceparent"]
    assert engine.verify(TENANT, "j") is None


def test_a_resume_in_another_trace_continues_the_jobs_and_links_the_callers(
    make_engine: EngineFactory, exported: InMemorySpanExporter
) -> None:
    tracer = otel(exported)
    engine = make_engine(registry=three_steps(), tracer=tracer)
    engine.submit(TENANT, "j", "traced")
    engine.run_until_idle()
    # A caller's own request, in a trace of its own, delivers the signal days later.
    with tracer.span("http.request", attributes={}) as request:
        engine.signal(TENANT, "j", "go", signal_id="s1")
    engine.run_until_idle()
    spans = exported.get_finished_spans()
    (submit,) = by_name(spans, "jobledger.submit")
    (wake,) = by_name(spans, "jobledger.wake")
    (caller,) = by_name(spans, "http.request")
    assert request.ids is not None and trace_of(caller) != trace_of(submit)
    assert trace_of(wake) == trace_of(submit) and parent_of(wake) == span_id(submit)
    assert [link.context.span_id for link in wake.links] == [span_id(caller)]


def test_a_job_reloaded_from_a_snapshot_keeps_its_trace(
    make_engine: EngineFactory, exported: InMemorySpanExporter
) -> None:
    engine = make_engine(
        registry=three_steps(), tracer=otel(exported), config={"snapshot_interval": 2}
    )
    engine.submit(TENANT, "j", "traced")
    engine.run_until_idle()
    again = make_engine(registry=three_steps(), tracer=otel(exported), config={"cache_size": 0})
    again.signal(TENANT, "j", "go", signal_id="s1")
    again.run_until_idle()
    assert again.job(TENANT, "j").status is JobStatus.COMPLETED
    assert_job_trace(exported.get_finished_spans(), "j")


def test_without_a_tracer_the_job_records_no_trace_and_stores_what_it_did_before(
    make_engine: EngineFactory,
) -> None:
    engine = make_engine(registry=three_steps())
    engine.submit(TENANT, "j", "traced")
    engine.run_until_idle()
    job = store_of(engine).load(job_uuid(TENANT, "j"))
    assert job is not None and job.trace_context is None
    first = store_of(engine).events(job.id, to_version=1)[0]
    assert "trace_context" not in chain.event_fields(first)
    assert "trace_context" not in Job.Snapshot.take(job).state


def test_a_step_that_fails_marks_its_span_with_the_error_kind(
    make_engine: EngineFactory, exported: InMemorySpanExporter, executor: CountingExecutor
) -> None:
    executor.fail_with = lambda request: RuntimeError("the model went away")
    engine = make_engine(registry=three_steps(), tracer=otel(exported))
    engine.submit(TENANT, "j", "traced")
    engine.run_until_idle()
    (step,) = by_name(exported.get_finished_spans(), "jobledger.step")
    assert attributes(step)["jobledger.outcome"] == "failed"
    (error,) = [e for e in step.events if e.name == "jobledger.step.error"]
    assert dict(error.attributes or {}) == {"jobledger.error.kind": "RuntimeError"}


def test_a_tick_that_raises_is_a_failed_span_with_the_exception(
    make_engine: EngineFactory, exported: InMemorySpanExporter
) -> None:
    """No executor deployed: the tick leaves the job untouched (a deployment error), and
    its spans say why."""
    engine = make_engine(registry=three_steps(), tracer=otel(exported), executor=None)
    engine.submit(TENANT, "j", "traced")
    engine.run_until_idle()
    (tick,) = by_name(exported.get_finished_spans(), "jobledger.tick")
    (step,) = by_name(exported.get_finished_spans(), "jobledger.step")
    for span in (tick, step):
        assert span.status.status_code is StatusCode.ERROR
        assert "DeploymentError" in (span.status.description or "")
        assert "exception" in events(span)
    assert parent_of(step) == span_id(tick)


def test_an_otel_exporter_is_chosen_by_the_config_and_shut_down_with_the_engine(
    store_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    config = EngineConfig(store_url=store_url, otel_exporter="console", token_secret=TOKEN_SECRET)
    engine = build_engine(registry=three_steps(), executor=CountingExecutor(), config=config)
    assert isinstance(engine.tracer, OtelTracer)
    engine.submit(TENANT, "j", "traced")
    engine.run_until_idle()
    engine.close()  # the batch still held is exported
    printed = capsys.readouterr().out
    assert '"name": "jobledger.step"' in printed and '"service.name": "jobledger"' in printed


def test_an_unknown_exporter_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match="otel_exporter"):
        EngineConfig(otel_exporter="zipkin")  # type: ignore[arg-type]


# ---- the trace context on message headers --------------------------------------------------


def test_trace_headers_round_trip_and_bad_ones_are_ignored() -> None:
    carrier = {"traceparent": "00-" + "a" * 32 + "-" + "b" * 16 + "-01", "tracestate": "k=v"}
    assert trace_context(trace_headers(carrier)) == carrier
    assert trace_headers(None) == [] and trace_context(None) is None
    assert trace_context([("traceparent", b"\xff\xfe"), ("other", b"x")]) is None
    assert trace_context([("traceparent", b"x" * 600)]) is None


# ---- JSON log lines name the job and its span -----------------------------------------------


@contextmanager
def json_log() -> Iterator[io.StringIO]:
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.setFormatter(JsonLines())
    handler.addFilter(JobContext())
    root = logging.getLogger()
    level = root.level
    root.addHandler(handler)
    root.setLevel(logging.INFO)
    try:
        yield out
    finally:
        root.removeHandler(handler)
        root.setLevel(level)


class LoggingExecutor:
    def execute(self, request: StepRequest) -> StepResult:
        logging.getLogger("executor").info("calling the model")
        return StepResult()


def test_json_log_lines_carry_the_job_step_and_the_span_they_were_logged_in(
    make_engine: EngineFactory, exported: InMemorySpanExporter
) -> None:
    engine = make_engine(registry=three_steps(), tracer=otel(exported), executor=LoggingExecutor())
    with json_log() as out:
        engine.submit(TENANT, "j", "traced")
        engine.run_until_idle()
    lines = [json.loads(line) for line in out.getvalue().splitlines()]
    spans = exported.get_finished_spans()
    (step,) = [
        s for s in by_name(spans, "jobledger.step") if attributes(s)["jobledger.step.number"] == 1
    ]
    (tick,) = by_name(spans, "jobledger.tick")
    (called,) = [line for line in lines if line["logger"] == "executor"]
    assert called["tenant"] == TENANT and called["job"] == "j" and called["step"] == 1
    assert called["trace_id"] == f"{trace_of(step):032x}"
    assert called["span_id"] == f"{span_id(step):016x}"
    (ticked,) = [line for line in lines if line["logger"] == "jobledger.engine.ticks"]
    assert ticked["span_id"] == f"{span_id(tick):016x}" and ticked["step"] == 2
    assert tracing.log_fields() == {}  # nothing is left behind once the work is done


class AsyncLoggingExecutor:
    """An ``async def execute`` (run on the worker's shared event loop, another thread)
    that logs and makes a span of its own, as a model client would."""

    def __init__(self, tracer: OtelTracer) -> None:
        self.tracer = tracer

    async def execute(self, request: StepRequest) -> StepResult:
        await asyncio.sleep(0)
        logging.getLogger("executor").info("calling the model")
        with self.tracer.span("model.call", attributes={}):
            await asyncio.sleep(0)
        return StepResult()


def test_an_async_executors_log_lines_and_spans_belong_to_its_step(
    make_engine: EngineFactory, exported: InMemorySpanExporter
) -> None:
    tracer = otel(exported)
    executor = AsyncLoggingExecutor(tracer)
    engine = make_engine(registry=three_steps(), tracer=tracer, executor=executor)
    with json_log() as out:
        engine.submit(TENANT, "j", "traced")
        engine.run_until_idle()
    lines = [json.loads(line) for line in out.getvalue().splitlines()]
    spans = exported.get_finished_spans()
    (step,) = [
        s for s in by_name(spans, "jobledger.step") if attributes(s)["jobledger.step.number"] == 1
    ]
    (called,) = [line for line in lines if line["logger"] == "executor"]
    assert called["tenant"] == TENANT and called["job"] == "j" and called["step"] == 1
    assert called["trace_id"] == f"{trace_of(step):032x}"
    assert called["span_id"] == f"{span_id(step):016x}"
    (call,) = by_name(spans, "model.call")
    assert trace_of(call) == trace_of(step) and parent_of(call) == span_id(step)


# ---- across a real Kafka broker ----------------------------------------------------------


@contextmanager
def running(worker: KafkaWorker) -> Iterator[None]:
    thread = threading.Thread(target=worker.run, daemon=True)
    thread.start()
    try:
        yield
    finally:
        worker.stop()
        thread.join(timeout=30)


def kafka_engine(store_url: str, topics: KafkaTopics, tracer: OtelTracer, worker_id: str) -> Engine:
    config = EngineConfig(
        store_url=store_url, worker_id=worker_id, token_secret=TOKEN_SECRET, **topics.config()
    )
    return build_engine(
        registry=three_steps(), executor=CountingExecutor(), config=config, tracer=tracer
    )


def test_one_trace_follows_a_job_across_a_kafka_hop_and_a_wait(
    store_url: str, kafka_topics: KafkaTopics, exported: InMemorySpanExporter
) -> None:
    """The submitter and the worker are two engines with two tracers (two processes, as
    far as the trace knows): only the ticks' headers on the broker carry it between them."""
    submitter = kafka_engine(store_url, kafka_topics, otel(exported), "api")
    worker_engine = kafka_engine(store_url, kafka_topics, otel(exported), "w1")
    worker = KafkaWorker(worker_engine, kafka_topics.settings())
    try:
        with running(worker):
            submitter.submit(TENANT, "k", "traced")
            wait_for(
                lambda: submitter.job(TENANT, "k").status is JobStatus.WAITING_EVENT, 30, "waits"
            )
            submitter.signal(TENANT, "k", "go", signal_id="s1")
            wait_for(
                lambda: submitter.job(TENANT, "k").status is JobStatus.COMPLETED, 30, "completes"
            )
        spans = exported.get_finished_spans()
        assert_job_trace(spans, "k")
        for tick in by_name(spans, "jobledger.tick"):
            assert attributes(tick)["jobledger.worker_id"] == "w1"
        # The job's events on the events topic carry its trace too.
        publisher = KafkaEventPublisher(kafka_topics.settings())
        published = Outbox(store_of(submitter), publisher).publish_pending()
        publisher.close()
        records = read_topic(kafka_topics.bootstrap, kafka_topics.events, at_least=published)
        (submit,) = by_name(spans, "jobledger.submit")
        first = store_of(submitter).events(job_uuid(TENANT, "k"), to_version=1)[0]
        assert isinstance(first, Job.Submitted) and first.trace_context is not None
        traceparent = first.trace_context["traceparent"]
        assert f"-{trace_of(submit):032x}-{span_id(submit):016x}-" in traceparent
        assert published == len(submitter.history(TENANT, "k")) == len(records)
        assert {headers(record)["traceparent"] for record in records} == {traceparent}
    finally:
        submitter.close()
        worker_engine.close()


def test_a_signal_from_the_kafka_topic_continues_the_jobs_trace_and_links_its_senders(
    store_url: str, kafka_topics: KafkaTopics, exported: InMemorySpanExporter
) -> None:
    """A signal message that carries a ``traceparent`` is delivered in a span of the
    sender's trace; the job's wake, in the job's own trace, links it (as an HTTP caller's
    span is linked). One without a trace context wakes the job in its trace alone, and
    one with a garbled header is delivered all the same."""
    submitter = kafka_engine(store_url, kafka_topics, otel(exported), "api")
    worker_engine = kafka_engine(store_url, kafka_topics, otel(exported), "w1")
    worker = KafkaWorker(worker_engine, kafka_topics.settings())
    sender = otel(exported)
    raw = KafkaProducer(bootstrap_servers=kafka_topics.bootstrap, acks="all")

    def publish(job_id: str, signal_id: str, carrier: dict[str, str]) -> None:
        message = SignalMessage(TENANT, job_id, "go", signal_id, {"paid": True})
        headers = trace_headers(carrier)
        raw.send(kafka_topics.signals, key=message.key, value=message.encode(), headers=headers)
        raw.flush(10)

    def waiting(job_id: str) -> bool:
        return submitter.job(TENANT, job_id).status is JobStatus.WAITING_EVENT

    def completed(job_id: str) -> bool:
        return submitter.job(TENANT, job_id).status is JobStatus.COMPLETED

    try:
        with running(worker):
            for job_id in ("traced", "plain", "garbled"):
                submitter.submit(TENANT, job_id, "traced")
                wait_for(lambda job_id=job_id: waiting(job_id), 30, f"{job_id} waits")
            with sender.span("billing.paid", attributes={}) as paid:
                publish("traced", "s1", paid.carrier)
            publish("plain", "s2", {})
            publish("garbled", "s3", {"traceparent": "00-not-a-trace-01"})
            for job_id in ("traced", "plain", "garbled"):
                wait_for(lambda job_id=job_id: completed(job_id), 30, f"{job_id} completes")
        assert worker.stats.dead_lettered == 0
        spans = exported.get_finished_spans()
        (sent,) = by_name(spans, "billing.paid")
        delivered, garbled = sorted(
            by_name(spans, "jobledger.signal"),
            key=lambda span: attributes(span)["jobledger.signal.id"],
        )
        assert garbled.parent is None  # a trace of its own
        # The delivery is the sender's: in its trace, the child of the span that sent it.
        assert trace_of(delivered) == trace_of(sent) and parent_of(delivered) == span_id(sent)
        assert attributes(delivered) == {
            "jobledger.tenant_id": TENANT,
            "jobledger.job_id": "traced",
            "jobledger.signal.event": "go",
            "jobledger.signal.id": "s1",
            "jobledger.signal.outcome": "resumed",
        }
        job_spans = {
            job_id: [s for s in spans if trace_of(s) == trace_of(submit)]
            for submit in by_name(spans, "jobledger.submit")
            for job_id in [attributes(submit)["jobledger.job_id"]]
        }
        for job_id, own in job_spans.items():
            assert_job_trace(own, job_id)  # the job's tree, whole, in its own trace
        wakes = {job_id: by_name(own, "jobledger.wake") for job_id, own in job_spans.items()}
        linked = {
            job_id: [link.context.span_id for each in wake for link in each.links]
            for job_id, wake in wakes.items()
        }
        # The sender's delivery, none, and the garbled delivery's trace of its own.
        assert linked == {
            "traced": [span_id(delivered)],
            "plain": [],
            "garbled": [span_id(garbled)],
        }
    finally:
        raw.close()
        submitter.close()
        worker_engine.close()
