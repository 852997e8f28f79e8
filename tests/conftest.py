"""Shared fixtures: every store-facing test runs on a SQLite file and on PostgreSQL.

Nothing imports this module: helpers that are not fixtures live in ``tests.support``."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from jobledger import Engine, EngineConfig
from jobledger.adapters.clock import FakeClock
from jobledger.adapters.ops import MemoryOps
from tests.support.engines import (
    TOKEN_SECRET,
    CountingExecutor,
    EngineFactory,
    default_registry,
    open_engine,
)
from tests.support.http import ApiServer, api_registry, start_api
from tests.support.kafka_broker import kafka_bootstrap, kafka_topics  # noqa: F401  (one broker per run)
from tests.support.services import postgres_schema_url
from tests.support.tsa import local_tsa  # noqa: F401  (one local RFC 3161 TSA per run)


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


@pytest.fixture
def executor() -> CountingExecutor:
    return CountingExecutor()


@pytest.fixture
def make_engine(
    store_url: str, clock: FakeClock, ops: MemoryOps, executor: CountingExecutor
) -> Iterator[EngineFactory]:
    """Open engines on the test's store; several engines act as several workers.

    ``make_engine(config={...}, queue=..., wrap_store=..., <any Engine.open option>)``:
    ``wrap_store`` builds the engine around a wrapper of its store (a flaky or crashing
    store), see :func:`tests.support.engines.open_engine`."""
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
        engine = open_engine(**kwargs)
        opened.append(engine)
        return engine

    yield make
    for engine in opened:
        engine.close()


@pytest.fixture
def engine(make_engine: EngineFactory) -> Engine:
    """The API tests' engine, on ``api_registry``; a module that needs another defines its own."""
    return make_engine(registry=api_registry())


@pytest.fixture
def api(engine: Engine, tmp_path: Path) -> Iterator[ApiServer]:
    """The API over the module's ``engine``."""
    with start_api(engine, tmp_path) as server:
        yield server
