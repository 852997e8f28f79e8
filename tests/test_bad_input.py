"""Bad input at every door: each is refused with a clear error, and nothing is written.

"Nothing is written" is checked from the store itself: the job's own events, and the
highest notification id of every partition (which moves on any append, of a job or a key).
"""

from __future__ import annotations

import os
import re
import tempfile
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from decimal import Decimal
from typing import Any

import pytest

from jobledger import (
    ConfigError,
    Engine,
    IdempotencyKeyReusedError,
    InvalidPayloadError,
    JobConflictError,
    JobStatus,
    Outcome,
    StepRequest,
    StepResult,
    StoreUnavailableError,
    Tick,
    UnknownJobError,
    UnknownWorkflowError,
    linear_workflow,
)
from jobledger.adapters.local_queue import LocalQueue
from jobledger.adapters.ops import MemoryOps
from jobledger.domain.identity import job_uuid, key_uuid
from jobledger.domain.keys import KeyKind
from jobledger.orchestration.ports import JobStore
from tests.support.engines import (
    CountingExecutor,
    EngineFactory,
    agent_steps,
    default_registry,
    store_of,
    writes,
)

# ---- helpers -----------------------------------------------------------------------------


def events_of(engine: Engine, tenant_id: str, job_id: str) -> list[tuple[int, str, str]]:
    """The job's events straight from the store: (version, type, chain hash)."""
    return [
        (event.originator_version, type(event).__name__, event.chain_hash)
        for event in store_of(engine).events(job_uuid(tenant_id, job_id))
    ]


def queued(engine: Engine) -> int:
    assert isinstance(engine.queue, LocalQueue)
    return len(engine.queue)


def assert_absent(engine: Engine, tenant_id: str, job_id: str) -> None:
    assert events_of(engine, tenant_id, job_id) == []
    with pytest.raises(UnknownJobError):
        engine.job(tenant_id, job_id)


# ---- unknown jobs and other tenants' jobs -----------------------------------------------


def test_a_tick_for_an_unknown_job_is_refused_and_writes_nothing(
    make_engine: EngineFactory, executor: CountingExecutor
) -> None:
    engine = make_engine()
    engine.submit("t", "real", "agent3")
    before = writes(engine)

    with pytest.raises(UnknownJobError, match=r"no job 'ghost' for tenant 't'") as raised:
        engine.tick("t", "ghost")

    assert (raised.value.tenant_id, raised.value.job_id) == ("t", "ghost")
    assert writes(engine) == before
    assert_absent(engine, "t", "ghost")
    assert executor.calls == {}


def test_handling_a_tick_for_an_unknown_job_reports_and_drops_it(
    make_engine: EngineFactory, executor: CountingExecutor, ops: MemoryOps
) -> None:
    engine = make_engine()
    before = writes(engine)

    assert engine.handle(Tick("t", "ghost", "redelivery")) is None

    rejected = [e for e in ops.events if e.eventType == "job.tick.rejected"]
    assert len(rejected) == 1
    assert (rejected[0].jobId, rejected[0].tenantId) == ("ghost", "t")
    assert "no job 'ghost'" in rejected[0].metadata["error"]
    assert rejected[0].metadata["reason"] == "redelivery"
    assert writes(engine) == before
    assert_absent(engine, "t", "ghost")
    assert queued(engine) == 0  # dropped, not retried
    assert executor.calls == {}


def test_another_tenants_job_is_invisible_and_untouched(
    make_engine: EngineFactory, executor: CountingExecutor, ops: MemoryOps
) -> None:
    engine = make_engine()
    engine.submit("owner", "shared-id", "agent3", input={"secret": 1})
    history = events_of(engine, "owner", "shared-id")
    before = writes(engine)

    with pytest.raises(UnknownJobError, match=r"no job 'shared-id' for tenant 'intruder'"):
        engine.tick("intruder", "shared-id")
    with pytest.raises(UnknownJobError, match="intruder"):
        engine.job("intruder", "shared-id")
    with pytest.raises(UnknownJobError, match="intruder"):
        engine.history("intruder", "shared-id")
    assert engine.handle(Tick("intruder", "shared-id")) is None
    ended = [e.metadata["outcome"] for e in ops.events if e.eventType == "job.tick.ended"]
    assert ended == ["rejected", "rejected"]  # the tick by hand, and the handled one
    reported = [t for t in ops.types("shared-id") if t != "job.tick.ended"]
    assert reported == ["job.submitted", "job.tick.rejected"]

    assert writes(engine) == before
    assert events_of(engine, "owner", "shared-id") == history
    assert engine.job("owner", "shared-id").status is JobStatus.QUEUED
    assert executor.calls == {}


def test_verifying_an_unknown_or_other_tenants_job_is_refused_not_reported_intact(
    make_engine: EngineFactory,
) -> None:
    engine = make_engine()
    engine.submit("owner", "shared-id", "agent3")

    assert engine.verify("owner", "shared-id") is None
    # An audit of a job that does not exist must not come back "intact".
    with pytest.raises(UnknownJobError, match="intruder"):
        engine.verify("intruder", "shared-id")
    with pytest.raises(UnknownJobError, match="ghost"):
        engine.verify("owner", "ghost")


# ---- repeated submits ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("change", "fragment"),
    [
        ({"workflow_type": "timer"}, "workflow_type 'timer' (the first: 'agent3')"),
        ({"workflow_version": 2}, "workflow_version 2 (the first: 1)"),
        ({"input": {"goal": "other"}}, "input"),
        ({"input": None}, "input"),
        ({"priority": 7}, "priority 7 (the first: None)"),
    ],
    ids=["type", "version", "input", "no-input", "priority"],
)
def test_a_conflicting_submit_of_an_existing_job_is_refused(
    make_engine: EngineFactory, change: dict[str, Any], fragment: str
) -> None:
    registry = default_registry()
    registry.register("agent3", 2, linear_workflow(agent_steps(3)))
    engine = make_engine(registry=registry)
    engine.submit("t", "j", "agent3", workflow_version=1, input={"goal": "x"})
    engine.tick("t", "j")  # the job moves on; the conflict is judged against its submit
    history = events_of(engine, "t", "j")
    before = writes(engine)

    request: dict[str, Any] = {"workflow_type": "agent3", "input": {"goal": "x"}}
    request.update(change)
    workflow_type = request.pop("workflow_type")
    with pytest.raises(JobConflictError) as raised:
        engine.submit("t", "j", workflow_type, **request)

    assert str(raised.value) == (
        f"job 'j' of tenant 't' already exists as 'agent3' v1; this submit differs in {fragment}"
    )
    assert writes(engine) == before
    assert events_of(engine, "t", "j") == history


def test_the_identical_submit_again_returns_the_existing_job_and_writes_nothing(
    make_engine: EngineFactory, ops: MemoryOps
) -> None:
    engine = make_engine()
    first = engine.submit("t", "j", "agent3", input={"goal": "x"})
    engine.tick("t", "j")
    current = engine.job("t", "j")
    history = events_of(engine, "t", "j")
    before = writes(engine)
    submitted = ops.types("j").count("job.submitted")

    again = engine.submit("t", "j", "agent3", input={"goal": "x"})

    assert again == current
    assert (again.job_id, again.created_at) == (first.job_id, first.created_at)
    assert again.status is JobStatus.COMPLETED
    assert writes(engine) == before
    assert events_of(engine, "t", "j") == history
    assert ops.types("j").count("job.submitted") == submitted


def _job_ids_in_different_partitions(partitions: int) -> tuple[str, str]:
    first = "job-0"
    for n in range(1, 1_000):
        other = f"job-{n}"
        if partitions == 1 or (
            job_uuid("t", other).int % partitions != job_uuid("t", first).int % partitions
        ):
            return first, other
    raise AssertionError("no job id in another partition")


@pytest.mark.parametrize("partitions", [1, 8])
def test_a_repeated_submit_key_returns_the_existing_job_for_the_same_request(
    make_engine: EngineFactory, partitions: int
) -> None:
    engine = make_engine(config={"partitions": partitions})
    first = engine.submit("t", "job-0", "agent3", input={"n": 1}, idempotency_key="order-42")
    engine.tick("t", "job-0")  # the job moves on; the repeat is judged against its submit
    current = engine.job("t", "job-0")
    history = events_of(engine, "t", "job-0")
    before = writes(engine)

    same_id = engine.submit("t", "job-0", "agent3", input={"n": 1}, idempotency_key="order-42")
    # A request that names no job id (nor version) asks for whatever the first one got.
    no_id = engine.submit("t", None, "agent3", input={"n": 1}, idempotency_key="order-42")

    assert same_id == no_id == current
    assert same_id.created_at == first.created_at
    assert writes(engine) == before
    assert events_of(engine, "t", "job-0") == history


@pytest.mark.parametrize("partitions", [1, 8])
@pytest.mark.parametrize(
    ("change", "says"),
    [
        ({"job_id": "OTHER"}, "job_id 'OTHER' (the first: 'job-0')"),
        ({"input": {"n": 2}}, "input"),
        ({"input": None}, "input"),
        ({"workflow_type": "timer"}, "workflow_type 'timer' (the first: 'agent3')"),
        ({"workflow_version": 2}, "workflow_version 2 (the first: 1)"),
        ({"mission_id": "m-2"}, "mission_id 'm-2' (the first: None)"),
        ({"priority": 9}, "priority 9 (the first: None)"),
    ],
    ids=["job-id", "input", "no-input", "type", "version", "mission", "priority"],
)
def test_a_submit_key_reused_for_another_request_is_refused_naming_both(
    make_engine: EngineFactory, partitions: int, change: dict[str, Any], says: str
) -> None:
    """The IETF Idempotency-Key draft's rule: a key reused with a different payload is
    refused, not answered with the first request's result (that would drop this one)."""
    registry = default_registry()
    registry.register("agent3", 2, linear_workflow(agent_steps(3)))
    engine = make_engine(registry=registry, config={"partitions": partitions})
    engine.submit(
        "t", "job-0", "agent3", workflow_version=1, input={"n": 1}, idempotency_key="order-42"
    )
    engine.tick("t", "job-0")
    history = events_of(engine, "t", "job-0")
    before = writes(engine)

    request: dict[str, Any] = {"job_id": "job-0", "workflow_type": "agent3", "input": {"n": 1}}
    request.update(change)
    job_id, workflow_type = request.pop("job_id"), request.pop("workflow_type")
    with pytest.raises(IdempotencyKeyReusedError) as raised:
        engine.submit("t", job_id, workflow_type, idempotency_key="order-42", **request)

    message = str(raised.value)
    assert "idempotency key 'order-42' of tenant 't' was used for job 'job-0'" in message
    assert f"this request differs in {says}" in message
    assert isinstance(raised.value, JobConflictError)
    assert (raised.value.key, raised.value.job_id) == ("order-42", "job-0")
    assert raised.value.differences == (says.split(" ")[0],)
    assert writes(engine) == before
    assert events_of(engine, "t", "job-0") == history
    if job_id != "job-0":
        assert_absent(engine, "t", job_id)


def test_a_submit_key_whose_submit_died_before_its_job_keeps_its_job_id(
    make_engine: EngineFactory,
) -> None:
    """With several partitions the key is reserved first, then the job written: a submit
    that died between the two left the key naming a job id. A retry finishes that job; a
    request naming another job id is refused, not silently given the reserved one."""
    first_id, _ = _job_ids_in_different_partitions(8)
    key = _key_in_another_partition_than("t", first_id, 8)
    dying = make_engine(config={"partitions": 8}, wrap_store=DiesOnJobAppend)
    with pytest.raises(StoreUnavailableError, match="died"):
        dying.submit("t", first_id, "agent3", input={"n": 1}, idempotency_key=key)
    engine = make_engine(config={"partitions": 8})
    assert_absent(engine, "t", first_id)

    with pytest.raises(IdempotencyKeyReusedError, match=f"job_id 'elsewhere' .*'{first_id}'"):
        engine.submit("t", "elsewhere", "agent3", input={"n": 1}, idempotency_key=key)
    assert_absent(engine, "t", "elsewhere")
    finished = engine.submit("t", None, "agent3", input={"n": 1}, idempotency_key=key)

    assert finished.job_id == first_id
    assert engine.submit("t", first_id, "agent3", input={"n": 1}, idempotency_key=key) == finished


class DiesOnJobAppend:
    """A store whose every job append fails, as if the process died right before it:
    what the submit wrote before (its key's reservation) stays."""

    def __init__(self, inner: JobStore) -> None:
        self.inner = inner

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def append(self, job: Any, *keys: Any) -> None:
        raise StoreUnavailableError("the submit died before its job was written")


def _key_in_another_partition_than(tenant_id: str, job_id: str, partitions: int) -> str:
    for n in range(1_000):
        key = f"order-{n}"
        marker = key_uuid(tenant_id, KeyKind.SUBMIT, key)
        if marker.int % partitions != job_uuid(tenant_id, job_id).int % partitions:
            return key
    raise AssertionError("no key in another partition")


def test_racing_submits_with_one_key_all_get_the_one_job(make_engine: EngineFactory) -> None:
    """Submits with the same idempotency key from several engines at once: one creates
    the job, and every other gets it back, as a later repeat would (none is told to
    try again, none creates a second job)."""
    engines = [make_engine() for _ in range(4)]
    for round_ in range(5):
        key = f"order-{round_}"
        barrier = threading.Barrier(len(engines))

        def submit(engine: Engine, barrier: threading.Barrier = barrier, key: str = key) -> str:
            barrier.wait()
            return engine.submit("t", None, "agent3", idempotency_key=key).job_id

        with ThreadPoolExecutor(len(engines)) as pool:
            job_ids = list(pool.map(submit, engines))
        assert len(set(job_ids)) == 1, job_ids


def test_racing_submits_of_different_requests_with_one_key_make_one_job_and_refuse_the_rest(
    make_engine: EngineFactory,
) -> None:
    """The loser of a race is judged as a later repeat would be: its request differs
    from the winner's, so it is refused, whichever of them wins."""
    engines = [make_engine() for _ in range(4)]
    for round_ in range(5):
        key = f"order-{round_}"
        barrier = threading.Barrier(len(engines))

        def submit(index: int, barrier: threading.Barrier = barrier, key: str = key) -> str:
            barrier.wait()
            try:
                made = engines[index].submit(
                    "t", None, "agent3", input={"n": index}, idempotency_key=key
                )
            except IdempotencyKeyReusedError as refused:
                assert refused.differences == ("input",)
                return f"refused:{refused.job_id}"
            return made.job_id

        with ThreadPoolExecutor(len(engines)) as pool:
            answers = list(pool.map(submit, range(len(engines))))
        made = [a for a in answers if not a.startswith("refused:")]
        assert len(made) == 1, answers
        assert sorted(answers) == sorted([made[0], *[f"refused:{made[0]}"] * 3])


# ---- payloads -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "value",
    [set(), object(), float("nan"), float("inf"), b"bytes", Decimal("1.5")],
    ids=["set", "object", "nan", "inf", "bytes", "decimal"],
)
@pytest.mark.parametrize("field", ["input", "budget"])
def test_a_payload_that_is_not_json_is_refused_and_no_job_is_created(
    make_engine: EngineFactory, value: object, field: str
) -> None:
    engine = make_engine()
    before = writes(engine)
    what = "job input" if field == "input" else "job budget"

    payload = {"nested": {"value": value}}
    with pytest.raises(InvalidPayloadError, match=f"{what} is not serialisable as JSON"):
        if field == "input":
            engine.submit("t", "j", "agent3", input=payload)
        else:
            engine.submit("t", "j", "agent3", budget=payload)

    assert writes(engine) == before
    assert_absent(engine, "t", "j")
    assert queued(engine) == 0


@pytest.mark.parametrize("value", [["a", "list"], "text", 42], ids=["list", "str", "int"])
def test_a_payload_that_is_not_a_json_object_is_refused(
    make_engine: EngineFactory, value: object
) -> None:
    engine = make_engine()
    before = writes(engine)

    with pytest.raises(InvalidPayloadError, match="job input must be a JSON object"):
        engine.submit("t", "j", "agent3", input=value)  # type: ignore[arg-type]

    assert writes(engine) == before
    assert_absent(engine, "t", "j")


def test_an_oversized_payload_is_refused(make_engine: EngineFactory) -> None:
    engine = make_engine(config={"max_payload_bytes": 64})
    before = writes(engine)

    with pytest.raises(InvalidPayloadError, match=r"job input is \d+ bytes, over the limit of 64"):
        engine.submit("t", "j", "agent3", input={"text": "x" * 100})

    assert writes(engine) == before
    assert_absent(engine, "t", "j")
    # Just under the limit is fine.
    engine.submit("t", "j", "agent3", input={"text": "x" * 40})
    assert engine.job("t", "j").state == {"text": "x" * 40}


BAD_IDS: list[tuple[object, str]] = [
    ("", "must be a non-empty string"),
    ("a\x00b", "must not contain control characters"),
    ("line\nbreak", "must not contain control characters"),
    ("tab\there", "must not contain control characters"),
    ("x" * 201, "must be a non-empty string of at most 200 characters"),
    (42, "must be a non-empty string"),
    (b"bytes", "must be a non-empty string"),
    (".", "must not be '.' or '..': a URL path resolves it away"),
    ("..", "must not be '.' or '..': a URL path resolves it away"),
    ("a\ud800b", "must not contain a lone surrogate"),
]


@pytest.mark.parametrize(
    ("bad", "fragment"),
    BAD_IDS,
    ids=["empty", "nul", "newline", "tab", "too-long", "int", "bytes", "dot", "dots", "surrogate"],
)
@pytest.mark.parametrize("field", ["tenant_id", "job_id", "idempotency_key"])
def test_a_bad_id_is_refused(
    make_engine: EngineFactory, field: str, bad: object, fragment: str
) -> None:
    engine = make_engine()
    before = writes(engine)
    ids: dict[str, Any] = {"tenant_id": "t", "job_id": "j", "idempotency_key": "k"}
    ids[field] = bad

    with pytest.raises(InvalidPayloadError, match=re.escape(f"{field} {fragment}")):
        engine.submit(
            ids["tenant_id"], ids["job_id"], "agent3", idempotency_key=ids["idempotency_key"]
        )

    assert writes(engine) == before
    assert_absent(engine, "t", "j")


def test_a_none_tenant_is_refused(make_engine: EngineFactory) -> None:
    engine = make_engine()
    before = writes(engine)

    with pytest.raises(InvalidPayloadError, match="tenant_id must be a non-empty string"):
        engine.submit(None, "j", "agent3")  # type: ignore[arg-type]

    assert writes(engine) == before


def test_an_id_of_exactly_the_maximum_length_is_accepted(make_engine: EngineFactory) -> None:
    engine = make_engine()
    longest = "x" * 200

    engine.submit(longest, longest, "agent3", idempotency_key=longest)

    assert engine.job(longest, longest).job_id == longest


# ---- workflows ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("workflow_type", "version", "fragment"),
    [
        ("no-such-flow", None, "unknown workflow type 'no-such-flow'"),
        ("no-such-flow", 1, "unknown workflow 'no-such-flow' v1"),
        ("agent3", 99, "unknown workflow 'agent3' v99"),
    ],
    ids=["type", "type-and-version", "version"],
)
def test_an_unknown_workflow_is_refused(
    make_engine: EngineFactory, workflow_type: str, version: int | None, fragment: str
) -> None:
    engine = make_engine()
    before = writes(engine)

    with pytest.raises(UnknownWorkflowError, match=fragment):
        engine.submit("t", "j", workflow_type, workflow_version=version)

    assert writes(engine) == before
    assert_absent(engine, "t", "j")


# ---- store URLs ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "fragment"),
    [
        ("mysql://x", r"unsupported store URL 'mysql://x': use sqlite:///"),
        ("sqlite://", r"SQLite URL 'sqlite://' needs a file path"),
        ("sqlite:///", r"needs a file path"),
        ("sqlite:///no/such/dir/x.db", r"directory 'no/such/dir' does not exist"),
        ("postgresql:///db", r"PostgreSQL URL 'postgresql:///db' needs a host and a database"),
        ("postgresql://localhost", r"needs a host and a database name"),
        ("not a url", r"unsupported store URL"),
    ],
)
def test_a_bad_store_url_is_a_config_error(url: str, fragment: str) -> None:
    with pytest.raises(ConfigError, match=fragment):
        Engine.open(url, registry=default_registry())


def test_a_sqlite_url_in_a_missing_directory_creates_nothing() -> None:
    with tempfile.TemporaryDirectory() as root:
        missing = os.path.join(root, "missing")
        with pytest.raises(ConfigError, match="does not exist"):
            Engine.open(f"sqlite:///{missing}/jobs.db", registry=default_registry())
        assert not os.path.exists(missing)


def test_an_unreachable_postgres_is_store_unavailable() -> None:
    url = "postgresql://u:p@127.0.0.1:1/db?connect_timeout=1"

    with pytest.raises(StoreUnavailableError, match="cannot open the postgresql store"):
        Engine.open(url, registry=default_registry())


# ---- executors returning bad results ------------------------------------------------------


def _returning(result: StepResult) -> Callable[[StepRequest], StepResult]:
    return lambda _: result


@pytest.mark.parametrize(
    ("result", "fragment"),
    [
        (StepResult(output={"handle": object()}), "step output is not serialisable as JSON"),
        (StepResult(output={"ratio": float("nan")}), "step output is not serialisable as JSON"),
        (StepResult(state_patch={"tags": {1, 2}}), "step state patch is not serialisable"),
        (StepResult(cost_usd=-1), "step cost -1 must be a finite amount >= 0"),
        (StepResult(cost_usd="-0.01"), "step cost '-0.01' must be a finite amount >= 0"),
        (StepResult(cost_usd=float("nan")), "step cost nan must be a finite amount >= 0"),
        (StepResult(cost_usd=float("inf")), "step cost inf must be a finite amount >= 0"),
        (StepResult(cost_usd="a lot"), "step cost 'a lot' is not a number"),
    ],
    ids=["object", "nan-output", "set-patch", "neg", "neg-str", "nan-cost", "inf-cost", "text"],
)
def test_an_executor_returning_a_bad_result_fails_the_job_not_the_tick(
    make_engine: EngineFactory, ops: MemoryOps, result: StepResult, fragment: str
) -> None:
    class BadExecutor:
        calls = 0

        def execute(self, request: StepRequest) -> StepResult:
            BadExecutor.calls += 1
            return result

    engine = make_engine(executor=BadExecutor())
    engine.submit("t", "j", "agent3", input={"goal": "x"})

    report = engine.tick("t", "j")

    assert report.outcome is Outcome.FAILED
    assert report.status is JobStatus.FAILED
    assert BadExecutor.calls == 1  # never retried: a bad result is not transient
    job = engine.job("t", "j")
    assert job.status is JobStatus.FAILED
    assert job.last_error is not None
    assert job.last_error.startswith("step 1 failed: ")
    assert fragment in job.last_error
    assert job.current_step == 0
    assert job.total_cost_usd == 0
    assert job.state == {"goal": "x"}
    history = engine.history("t", "j")
    assert [h.event_type for h in history] == ["Submitted", "Claimed", "Failed"]
    failed = history[-1].data
    assert failed["step_number"] == 1
    assert failed["cause"] == "step"
    assert fragment in failed["error"]
    assert engine.verify("t", "j") is None
    reported = [e for e in ops.events if e.eventType == "job.failed"]
    assert len(reported) == 1
    assert fragment in reported[0].metadata["error"]
    # The failed job stays failed: a re-delivered tick changes nothing.
    assert engine.tick("t", "j", "redelivery").outcome is Outcome.IDLE
    assert len(engine.history("t", "j")) == 3


@pytest.mark.parametrize(
    ("result", "fragment"),
    [
        (None, "StepResult"),
        ({"output": {"text": "hi"}}, "StepResult"),
        (StepResult(output=["not", "an", "object"]), "step output must be a JSON object"),  # type: ignore[arg-type]
        (StepResult(state_patch="text"), "step state patch must be a JSON object"),  # type: ignore[arg-type]
    ],
    ids=["none", "dict", "list-output", "str-patch"],
)
def test_an_executor_returning_the_wrong_shape_fails_the_job_not_the_tick(
    make_engine: EngineFactory, result: object, fragment: str
) -> None:
    class WrongShapeExecutor:
        def execute(self, request: StepRequest) -> StepResult:
            return result  # type: ignore[return-value]

    engine = make_engine(executor=WrongShapeExecutor())
    engine.submit("t", "j", "agent3")

    report = engine.tick("t", "j")

    # Otherwise the job stays claimed, and every worker that takes it over after the
    # lease re-runs the side effect and crashes again, for ever.
    assert report.outcome is Outcome.FAILED
    job = engine.job("t", "j")
    assert job.status is JobStatus.FAILED
    assert job.last_error is not None
    assert job.last_error.startswith("step 1 failed: ")
    assert fragment in job.last_error
    assert [h.event_type for h in engine.history("t", "j")] == ["Submitted", "Claimed", "Failed"]
