"""Shared fixtures: every store-facing test runs on a SQLite file and on PostgreSQL."""

from __future__ import annotations

import os
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from jobledger import (
    Engine,
    EngineConfig,
    FunctionRegistry,
    JobStatus,
    Resolution,
    StepRequest,
    StepResult,
    linear_workflow,
)
from jobledger.adapters.clock import FakeClock
from jobledger.adapters.ops import MemoryOps
from kafka_support import kafka_bootstrap, kafka_topics  # noqa: F401  (one broker per run)

POSTGRES_URL = os.environ.get("JOBLEDGER_TEST_POSTGRES_URL")
REQUIRE_SERVICES = os.environ.get("JOBLEDGER_REQUIRE_SERVICES") == "1"
TOKEN_SECRET = "test-secret-test-secret-test-secret-0123"


def postgres_schema_url() -> Iterator[str]:
    """A fresh schema per test, dropped afterwards, so tests never see each other's jobs."""
    if not POSTGRES_URL:
        if REQUIRE_SERVICES:
            pytest.fail("JOBLEDGER_TEST_POSTGRES_URL is not set but services are required")
        pytest.skip("PostgreSQL not configured (set JOBLEDGER_TEST_POSTGRES_URL)")
    schema = f"t_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(POSTGRES_URL, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {schema}")
    try:
        yield f"{POSTGRES_URL}?schema={schema}"
    finally:
        with psycopg.connect(POSTGRES_URL, autocommit=True) as conn:
            conn.execute(f"DROP SCHEMA {schema} CASCADE")


@pytest.fixture(params=["sqlite", "postgres"])
def store_url(request: pytest.FixtureRequest, tmp_path: Any) -> Iterator[str]:
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path}/jobs.db"
    else:
        yield from postgres_schema_url()


@pytest.fixture
def fresh_store_url(store_url: str, tmp_path: Path) -> Iterator[str]:
    """A second, empty store of the same kind."""
    if store_url.startswith("sqlite"):
        yield f"sqlite:///{tmp_path}/copy.db"
    else:
        yield from postgres_schema_url()


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def ops() -> MemoryOps:
    return MemoryOps()


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
    steps = [Resolution("run_interaction_task", JobStatus.QUEUED) for _ in range(n)]
    return [*steps, Resolution("complete", JobStatus.COMPLETED)]


def default_registry() -> FunctionRegistry:
    registry = FunctionRegistry()
    registry.register("agent3", 1, linear_workflow(agent_steps(3)))
    registry.register(
        "timer",
        1,
        linear_workflow(
            [
                Resolution("run_interaction_task", JobStatus.QUEUED),
                Resolution("wait_time", JobStatus.WAITING_TIME, resume_delay_ms=3 * 86_400_000),
                Resolution("run_interaction_task", JobStatus.QUEUED),
                Resolution("complete", JobStatus.COMPLETED),
            ]
        ),
    )
    return registry


@pytest.fixture
def executor() -> CountingExecutor:
    return CountingExecutor()


EngineFactory = Callable[..., Engine]


@pytest.fixture
def make_engine(
    store_url: str, clock: FakeClock, ops: MemoryOps, executor: CountingExecutor
) -> Iterator[EngineFactory]:
    """Open engines on the test's store; several engines act as several workers."""
    opened: list[Engine] = []

    def make(**overrides: Any) -> Engine:
        config_fields = overrides.pop("config", {})
        defaults = {"store_url": store_url, "worker_id": f"w{len(opened)}"}
        config = EngineConfig(**{**defaults, "token_secret": TOKEN_SECRET, **config_fields})
        kwargs: dict[str, Any] = {
            "registry": default_registry(),
            "executor": executor,
            "clock": clock,
            "ops": ops,
            "config": config,
        }
        kwargs.update(overrides)
        engine = Engine.open(**kwargs)
        opened.append(engine)
        return engine

    yield make
    for engine in opened:
        engine.close()
