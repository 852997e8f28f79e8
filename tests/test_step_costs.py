"""Per-step work the engine no longer does (issue 11 item 5), without giving up what the
work protected: the executor's view of the job is not a deep copy, yet the executor cannot
change the job through it; the first tick after a submit finds the job in the cache."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from copy import deepcopy
from typing import Any

from jobledger import StepRequest, StepResult
from jobledger.adapters.event_store import EventSourcedJobStore
from jobledger.domain.read_only import FrozenDict, thaw
from tests.support.engines import EngineFactory

T = "acme"
INPUT = {"goal": "x", "nested": {"k": [1, 2]}, "budget_note": "ünïcode"}


class MutatingExecutor:
    """Tries every way of changing the job it is handed, then returns parts of it."""

    def __init__(self) -> None:
        self.refused: list[str] = []
        self.attempts = 0

    def execute(self, request: StepRequest) -> StepResult:
        state, budget = request.job.state, request.job.budget
        attempts: list[Callable[[], object]] = [
            lambda: state.__setitem__("goal", "hijacked"),  # type: ignore[attr-defined]
            lambda: state.pop("goal"),  # type: ignore[attr-defined]
            lambda: state["nested"].update(k=[]),
            lambda: state["nested"]["k"].append(9),
            lambda: state["nested"]["k"].__setitem__(0, 9),
            lambda: budget.clear(),  # type: ignore[attr-defined]
        ]
        for attempt in attempts:
            self.attempts += 1
            try:
                attempt()
            except (TypeError, AttributeError) as refused:
                self.refused.append(type(refused).__name__)
        mine = deepcopy(state)  # a copy is the executor's own to change
        mine["nested"]["k"].append(3)
        return StepResult(output={"seen": state["nested"]}, state_patch={"mine": mine["nested"]})


def test_an_executor_cannot_change_the_job_through_its_view(make_engine: EngineFactory) -> None:
    executor = MutatingExecutor()
    engine = make_engine(executor=executor)
    engine.submit(T, "j", "agent3", input=INPUT)
    engine.run_until_idle()
    assert executor.attempts == 18 and len(executor.refused) == 18, executor.refused
    job = engine.job(T, "j")
    assert job.state == {**INPUT, "mine": {"k": [1, 2, 3]}}
    assert json.dumps(dict(job.state))  # plain JSON again, nothing of a view kept
    outputs = [e.data["output"] for e in engine.history(T, "j") if e.event_type == "StepRecorded"]
    assert outputs[:3] == [{"seen": {"k": [1, 2]}}] * 3  # parts of the view, returned


def test_a_view_reads_like_the_json_it_shows() -> None:
    data: dict[str, Any] = {"a": {"b": [1, {"c": 2}]}, "d": None}
    view = FrozenDict(data)
    assert view == data and view["a"]["b"][1] == {"c": 2} and list(view) == ["a", "d"]
    assert view["a"]["b"][-1:] == [{"c": 2}] and len(view["a"]["b"]) == 2
    copied = deepcopy(view)
    assert copied == data and type(copied) is dict and copied["a"] is not data["a"]
    assert thaw(view) == data and type(thaw(view)["a"]["b"]) is list


def counted_reads(store: EventSourcedJobStore) -> dict[str, int]:
    """Wrap (on the instances) every recorder's select_events to count reads by kind."""
    reads = {"events": 0, "snapshots": 0}

    def wrap(recorder: Any, kind: str) -> None:
        select: Callable[..., Sequence[Any]] = recorder.select_events

        def counted(*args: Any, **kwargs: Any) -> Sequence[Any]:
            reads[kind] += 1
            return select(*args, **kwargs)

        recorder.select_events = counted

    for partition in store.partitions:
        wrap(partition.recorder, "events")
        assert partition.snapshots is not None
        wrap(partition.snapshots.recorder, "snapshots")
    return reads


def test_the_first_tick_after_submit_reads_the_job_once(make_engine: EngineFactory) -> None:
    engine = make_engine(config={"max_steps_per_tick": 1})
    engine.submit(T, "j", "agent3", input=INPUT)
    assert isinstance(engine.store, EventSourcedJobStore)
    reads = counted_reads(engine.store)
    assert engine.run_until_idle(max_ticks=1) == 1
    # One read: the cached job fast-forwarded. Rebuilding it would read its snapshot too.
    assert reads == {"events": 1, "snapshots": 0}
    assert engine.job(T, "j").total_steps_executed == 1
