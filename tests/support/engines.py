"""Building engines for tests: a counting executor, the default registry, and
:func:`open_engine`, the ONE place a test's engine is wired (the
``make_engine`` fixture, the crash and Kafka worker processes all go through it).

The worker processes import this module: it imports neither pytest nor a driver of its own."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import replace
from typing import Any
from uuid import UUID

from jobledger import Engine, FunctionRegistry, Resolution, StepRequest, StepResult
from jobledger.adapters.event_store import EventSourcedJobStore
from jobledger.domain.job import Job
from jobledger.domain.keys import ConsumedKey
from jobledger.orchestration.ports import JobStore
from tests.support.workflows import DONE, STEP, linear_registry, sleep_ms

TOKEN_SECRET = "test-secret-test-secret-test-secret-0123"

EngineFactory = Callable[..., Engine]
"""What the ``make_engine`` fixture returns: ``make_engine(config={...}, **open_engine)``."""
StoreWrapper = Callable[[JobStore], JobStore]


def open_engine(*, wrap_store: StoreWrapper | None = None, **options: Any) -> Engine:
    """``Engine.open(**options)``; with ``wrap_store``, the engine is built around
    ``wrap_store(store)`` instead of the store it opened (a test's flaky or crashing
    store), so every part of it (commands and ticks alike) sees the wrapper from the
    start, the way a real store failing would be seen."""
    opened = Engine.open(**options)
    if wrap_store is None:
        return opened
    # Why rebuild rather than patch: the engine's wiring (its Deps) decides who holds
    # the store; a test only says what the store does.
    return Engine(replace(opened.deps, store=wrap_store(opened.deps.store)))


class StoreAround:
    """A test's store around the real one (``inner``): what a subclass does not override
    is the real store's."""

    def __init__(self, inner: JobStore) -> None:
        self.inner = inner

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def load(self, job_uuid: UUID) -> Job | None:
        return self.inner.load(job_uuid)

    def find_key(self, job_uuid: UUID, key_id: UUID) -> ConsumedKey | None:
        return self.inner.find_key(job_uuid, key_id)

    def events(self, job_uuid: UUID, **window: int | None) -> list[Job.Event]:
        return self.inner.events(job_uuid, **window)


class CountingExecutor:
    """Counts every side effect by idempotency key, outside the engine's store."""

    def __init__(self, cost: str = "0.10") -> None:
        self.calls: Counter[str] = Counter()
        self.cost = cost
        self.fail_with: Callable[[StepRequest], Exception | None] | None = None

    def execute(self, request: StepRequest) -> StepResult:
        self.calls[request.idempotency_key] += 1
        if self.fail_with is not None and (error := self.fail_with(request)) is not None:
            raise error
        return StepResult(
            output={"step": request.step_number},
            state_patch={f"s{request.step_number}": True},
            cost_usd=self.cost,
        )


def agent_steps(n: int) -> list[Resolution]:
    """n side-effecting agent steps, then complete."""
    return [*[STEP] * n, DONE]


def default_registry() -> FunctionRegistry:
    return linear_registry(
        {"agent3": agent_steps(3), "timer": [STEP, sleep_ms(3 * 86_400_000), STEP, DONE]}
    )


def store_of(engine: Engine) -> EventSourcedJobStore:
    assert isinstance(engine.store, EventSourcedJobStore)
    return engine.store


def writes(engine: Engine) -> list[int]:
    """Per partition, the id of the newest stored event: any append moves one of them."""
    return [
        partition.recorder.max_notification_id() or 0 for partition in store_of(engine).partitions
    ]
