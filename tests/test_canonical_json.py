"""The chain's canonical bytes come from orjson now; they must be byte for byte what the
definition (json.dumps, sorted keys, compact, UTF-8 as is) made, or no stored history
would verify. Hypothesis over event-like documents, then every event of real runs."""

from __future__ import annotations

import json
import math
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jobledger.adapters.clock import FakeClock
from jobledger.adapters.event_store import EventSourcedJobStore
from jobledger.domain import chain
from jobledger.domain.identity import job_uuid
from jobledger.workflows import DefinitionRegistry
from tests.support.audit import MISSION_V1, definition
from tests.support.engines import EngineFactory
from tests.test_audit import MISSION_JOBS, T, run_missions


def definition_form(document: dict[str, Any]) -> str:
    """The canonical form as every stored chain hash was made, written out here so the
    test does not trust the module it checks."""
    return json.dumps(
        document, sort_keys=True, separators=(",", ":"), default=chain._default, ensure_ascii=False
    )


# Floats across the whole range, with the exponents where orjson and json.dumps write
# differently (1e-05 against 0.00001 or 1e-5) drawn on purpose.
finite_floats = st.floats(allow_nan=False, allow_infinity=False) | st.builds(
    lambda m, e: m * 10.0**e, st.integers(-(10**6), 10**6), st.integers(-12, 20)
)
zones = st.sampled_from(
    [UTC, timezone(timedelta(hours=5, minutes=30)), timezone(-timedelta(hours=8))]
)
moments = st.datetimes(timezones=st.none() | zones)
texts = st.text() | st.sampled_from(
    ["é", "日本語", "\u2028", "\x00\x1f\x7f", "😀", "\ufeff", "0.00001"]
)
keys = texts | st.sampled_from(["a", "B", "é", "😀", "\uffff", "\U00010000", "type", "fields"])
scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**64 - 1)
    | st.integers()  # beyond 64 bits: orjson refuses, the definition's way takes over
    | finite_floats
    | texts
    | moments
    | st.decimals(allow_nan=False, allow_infinity=False)
    | st.uuids()
)
documents = st.recursive(
    scalars,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(keys, children, max_size=4),
    max_leaves=15,
)


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(keys, documents, max_size=6), st.sampled_from(["StepRecorded", "Claimed"]))
def test_the_fast_encoder_writes_the_definitions_bytes(
    fields: dict[str, Any], event_type: str
) -> None:
    fields = {**fields, chain.CHAIN_FIELD: "excluded"}
    body = {k: v for k, v in fields.items() if k != chain.CHAIN_FIELD}
    expected = definition_form({"type": event_type, "fields": body})
    assert chain.canonical_bytes(event_type, fields) == expected.encode()
    assert chain.canonical_json({"type": event_type, "fields": body}) == expected


@pytest.mark.parametrize(
    "value",
    [1e-05, -2e-05, 1.234567e-06, 5e-09, 1e16, 1e-10, 2**64, {1: "int key"}, [1.5e-7, "x"]],
)
def test_values_orjson_writes_otherwise_take_the_definitions_way(value: object) -> None:
    document = {"v": value}
    assert chain.canonical_json(document) == json.dumps(
        document, sort_keys=True, separators=(",", ":"), ensure_ascii=False
    )


def test_what_the_definition_refuses_is_still_refused() -> None:
    with pytest.raises(TypeError, match="not canonicalisable: date"):
        chain.canonical_json({"d": datetime(2026, 1, 1).date()})
    with pytest.raises(UnicodeEncodeError):  # a lone surrogate has no UTF-8 bytes
        chain.canonical_bytes("Submitted", {"state": {"x": "\ud800"}})
    assert chain.canonical_json({"x": "\ud800"}) == '{"x":"\ud800"}'


def test_non_finite_floats_never_reach_an_event(make_engine: EngineFactory) -> None:
    """The one value orjson writes differently and no check of its bytes can see: NaN and
    infinities (null against NaN). Payloads refuse them at the boundary, so no event holds
    one; this pins that the boundary still does."""
    engine = make_engine()
    for bad in (math.nan, math.inf, -math.inf):
        with pytest.raises(Exception, match="not serialisable as JSON"):
            engine.submit(T, f"nan-{bad}", "agent3", input={"x": bad})


def test_every_event_of_real_runs_encodes_as_the_definition_did(
    make_engine: EngineFactory, clock: FakeClock
) -> None:
    registry = DefinitionRegistry([definition(MISSION_V1)])
    engine = run_missions(make_engine, clock, registry)
    engine.submit(T, "cancelled", "mission", input={"job": "cancelled", "note": "naïve ☃"})
    engine.run_until_idle()
    engine.raise_budget(T, "cancelled", raised_by="ops", reason="more", max_steps=50)
    engine.cancel(T, "cancelled", reason="no longer needed", by="ops")
    store = engine.store
    assert isinstance(store, EventSourcedJobStore)
    seen: set[str] = set()
    for job in (*MISSION_JOBS, "cancelled"):
        events = store.events(job_uuid(T, job))
        assert chain.verify(events) is None
        for event in events:
            event_type = type(event).__qualname__
            fields = chain.event_fields(event)
            body = {k: v for k, v in fields.items() if k != chain.CHAIN_FIELD}
            document = {"type": event_type, "fields": body}
            # Byte-identical, and by the fast way (no event falls back to json.dumps).
            assert chain._fast_canonical(document) == definition_form(document).encode()
            seen.add(event_type.removeprefix("Job."))
    assert {
        "Submitted", "Claimed", "StepRecorded", "Resumed", "SignalBuffered", "ApprovalDecided",
        "ApprovalExpired", "ApprovalRequested", "WaitTimedOut", "BudgetRaised", "Cancelled",
        "RetryScheduled",
    } <= seen, seen  # fmt: skip
