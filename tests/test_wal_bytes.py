"""Bytes the store's write-ahead log takes per step (issue 25, item 3).

SQLite logs whole pages, so what a step costs on disk is the pages it dirties, not its
event's bytes: a new store's file has pages of ``PAGE_SIZE`` (1 KiB), and a step logs
about half the bytes it logged on SQLite's default 4 KiB pages. A store made with
other pages (by an earlier release) keeps them and works as before."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from jobledger import Engine, EngineConfig, FunctionRegistry
from jobledger.adapters.backends.sqlite import PAGE_SIZE
from tests.support.engines import CountingExecutor, agent_steps
from tests.support.workflows import linear_registry

STEPS = 30
"""Side-effecting steps of a job; a completion follows them."""


def registry() -> FunctionRegistry:
    return linear_registry({"long": agent_steps(STEPS)})


def open_engine(path: Path) -> Engine:
    url = f"sqlite:///{path}"
    return Engine.open(
        url,
        registry=registry(),
        executor=CountingExecutor(),
        config=EngineConfig(store_url=url, worker_id="w", max_steps_per_tick=STEPS + 1),
    )


def made_by_an_earlier_release(path: Path) -> None:
    """A file as releases before this one made it: SQLite's default 4 KiB pages."""
    connection = sqlite3.connect(path, isolation_level=None)
    connection.execute("PRAGMA page_size = 4096")
    connection.execute("PRAGMA journal_mode = WAL")
    connection.close()


def pragma(path: Path, name: str) -> object:
    connection = sqlite3.connect(path)
    try:
        return connection.execute(f"PRAGMA {name}").fetchone()[0]
    finally:
        connection.close()


def frames(path: Path) -> int:
    connection = sqlite3.connect(path, isolation_level=None)
    try:
        _, logged, _ = connection.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
        return int(logged)
    finally:
        connection.close()


@contextmanager
def wal_bytes(path: Path) -> Iterator[list[int]]:
    """The bytes the -wal file grows by while inside. A read transaction held throughout
    keeps any checkpoint from starting the log over, so every frame is still there."""
    grown: list[int] = []
    reader = sqlite3.connect(path, isolation_level=None)
    reader.execute("BEGIN")
    reader.execute("SELECT count(*) FROM sqlite_master").fetchone()
    before = frames(path)
    try:
        yield grown
    finally:
        page = int(pragma(path, "page_size"))  # type: ignore[call-overload]
        grown.append((frames(path) - before) * (page + 24))
        reader.close()


def bytes_per_step(path: Path) -> float:
    """One job run alone, every step a commit of its own."""
    engine = open_engine(path)
    try:
        for n in range(3):  # an index of several jobs, as a store in use has
            engine.submit("t", f"other-{n}", "long")
        engine.run_until_idle()
        engine.submit("t", "measured", "long")
        with wal_bytes(path) as grown:
            engine.run_until_idle()
        assert engine.job("t", "measured").status == "completed"
    finally:
        engine.close()
    return grown[0] / (STEPS + 1)  # the run steps and the completion


def test_a_new_store_is_made_with_small_pages_in_wal_mode(tmp_path: Path) -> None:
    path = tmp_path / "jobs.db"
    open_engine(path).close()

    assert pragma(path, "page_size") == PAGE_SIZE == 1024
    assert pragma(path, "journal_mode") == "wal"


def test_a_store_of_an_earlier_release_keeps_its_pages_and_runs(tmp_path: Path) -> None:
    path = tmp_path / "jobs.db"
    made_by_an_earlier_release(path)
    engine = open_engine(path)
    engine.submit("t", "j", "long")
    engine.run_until_idle()

    assert engine.job("t", "j").status == "completed"
    assert engine.verify("t", "j") is None
    engine.close()
    assert pragma(path, "page_size") == 4096


def test_a_step_logs_about_half_the_bytes_it_did_on_4k_pages(tmp_path: Path) -> None:
    old = tmp_path / "old.db"
    made_by_an_earlier_release(old)

    small = bytes_per_step(tmp_path / "new.db")
    large = bytes_per_step(old)

    # Measured 5.1 KB against 10.6 KB here (5.3 against 12.2 over 300 steps): the
    # row's page and the job's index leaf, logged whole at every commit, are a quarter
    # of the size, but more of them split and the file grows a page more often.
    assert small < 0.6 * large, (small, large)
