"""The live event source under the SSE endpoint, without HTTP: a stream follows one job's
log from a version, rung by the bell that follows the store's notification log."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest

from jobledger import Engine
from jobledger.api.live import HEARTBEAT, LogBell, job_events
from jobledger.domain.identity import job_uuid
from tests.support.audit import RawEvents
from tests.support.engines import EngineFactory, store_of


def parse(frame: str) -> dict[str, str]:
    fields: dict[str, str] = {}
    for line in frame.strip("\n").split("\n"):
        name, _, value = line.partition(": ")
        fields[name] = value
    return fields


async def take(stream: AsyncIterator[str], n: int, *, timeout: float = 10.0) -> list[str]:
    """The next ``n`` event frames (comments and the retry line skipped)."""
    got: list[str] = []
    while len(got) < n:
        frame = await asyncio.wait_for(anext(stream), timeout)
        if frame.startswith("id: "):
            got.append(frame)
    return got


def versions(frames: list[str]) -> list[int]:
    return [int(parse(f)["id"]) for f in frames]


def run(body: Callable[[], Awaitable[Any]]) -> Any:
    return asyncio.run(body())


@pytest.fixture
def engines(make_engine: EngineFactory) -> tuple[Engine, Engine]:
    """One engine serving streams, another (another process, as far as the store can
    tell) appending."""
    return make_engine(), make_engine()


def test_a_stream_sends_the_past_then_what_another_engine_appends(
    engines: tuple[Engine, Engine], store_url: str
) -> None:
    server, writer = engines
    writer.submit("acme", "j1", "agent3")
    # On PostgreSQL the poll interval is far longer than we wait: only the NOTIFY wakes it.
    postgres = store_url.startswith("postgresql")
    bell = LogBell(store_of(server), poll_interval=30.0 if postgres else 0.05)

    async def body() -> tuple[list[str], float, list[str]]:
        stream = job_events(bell, job_uuid("acme", "j1"), 0, heartbeat_seconds=60)
        past = await take(stream, 1)
        await asyncio.sleep(0.2)  # the stream is waiting now
        started = time.monotonic()
        await asyncio.to_thread(writer.cancel, "acme", "j1", "no longer needed", "ops")
        new = await take(stream, 1)
        waited = time.monotonic() - started
        await stream.aclose()
        return past, waited, new

    try:
        past, waited, new = run(body)
    finally:
        bell.close()
    assert [(parse(f)["id"], parse(f)["event"]) for f in past + new] == [
        ("1", "Submitted"),
        ("2", "Cancelled"),
    ]
    assert waited < 5.0, f"the append took {waited:.3f}s to reach the stream"
    assert bell.streams == 0, "a closed stream leaves the bell"


def test_resuming_after_a_version_sends_exactly_what_followed(
    engines: tuple[Engine, Engine],
) -> None:
    server, writer = engines
    writer.submit("acme", "j1", "agent3")
    writer.run_until_idle()
    head = len(writer.history("acme", "j1"))
    bell = LogBell(store_of(server), poll_interval=0.05)

    async def body() -> list[int]:
        stream = job_events(bell, job_uuid("acme", "j1"), 2, heartbeat_seconds=60)
        frames = await take(stream, head - 2)
        await stream.aclose()
        return versions(frames)

    try:
        assert run(body) == list(range(3, head + 1))
    finally:
        bell.close()


def test_a_quiet_stream_sends_heartbeats_and_closing_the_bell_ends_it(
    engines: tuple[Engine, Engine],
) -> None:
    server, writer = engines
    writer.submit("acme", "j1", "agent3")
    bell = LogBell(store_of(server), poll_interval=0.05)

    async def body() -> list[str]:
        stream = job_events(bell, job_uuid("acme", "j1"), 1, heartbeat_seconds=0.05)
        frames = [await anext(stream), await anext(stream)]
        await asyncio.to_thread(bell.close)
        frames += [frame async for frame in stream]  # ends: the bell closed
        return frames

    frames = asyncio.run(asyncio.wait_for(body(), 10))
    assert frames[0].startswith("retry: ")
    assert frames[1] == HEARTBEAT
    assert not any(f.startswith("id: ") for f in frames)


def test_closing_the_bell_ends_its_wait_at_once_not_after_the_poll(
    engines: tuple[Engine, Engine],
) -> None:
    server, _ = engines
    bell = LogBell(store_of(server), poll_interval=30.0)
    bell.start()
    time.sleep(1.0)  # its first pass is done: it waits for new events (or 30 s)
    started = time.monotonic()
    bell.close()
    assert bell._thread is not None and not bell._thread.is_alive()
    assert time.monotonic() - started < 5.0


def test_a_history_that_breaks_under_an_open_stream_ends_it_with_an_error(
    engines: tuple[Engine, Engine], store_url: str
) -> None:
    server, writer = engines
    writer.submit("acme", "j1", "agent3")
    writer.run_until_idle()
    raw = RawEvents(store_url)
    uuid = job_uuid("acme", "j1")
    raw.set_state(uuid, 3, raw.rows(uuid)[2].topic, b"{not json")
    bell = LogBell(store_of(server), poll_interval=0.05)

    async def body() -> list[str]:
        stream = job_events(bell, uuid, 0, heartbeat_seconds=60)
        return [frame async for frame in stream]  # it ends by itself

    try:
        frames = asyncio.run(asyncio.wait_for(body(), 10))
    finally:
        bell.close()
    assert versions([f for f in frames if f.startswith("id: ")]) == [1, 2]
    error = parse(frames[-1])
    assert error["event"] == "error"
    assert json.loads(error["data"])["error"] == "BrokenHistoryError"
    assert "broken at v3" in json.loads(error["data"])["detail"]
