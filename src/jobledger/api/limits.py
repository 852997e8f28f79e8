"""The API's limits: request body size (413), a rate per credential (429), and how long a
request may take before its response starts (503)."""

from __future__ import annotations

import asyncio
import math
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from jobledger.api.problems import Problem

MAX_BUCKETS = 100_000
"""Credentials remembered at once; the least recently seen are forgotten first (a full
bucket again: the limit is about bursts, and a forgotten caller had been quiet)."""


class RateLimiter:
    """A token bucket per credential: ``burst`` requests at once, then ``per_minute``.
    Thread-safe: the dependency calling it runs on the server's thread pool."""

    def __init__(
        self, per_minute: int, burst: int, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.rate = per_minute / 60.0
        self.burst = float(burst)
        self.clock = clock
        self._buckets: OrderedDict[str, tuple[float, float]] = OrderedDict()
        self._lock = threading.Lock()

    def take(self, who: str) -> None:
        """Spend one request of ``who``'s; raise the 429 problem when none is left."""
        if self.rate <= 0:
            return
        with self._lock:
            now = self.clock()
            tokens, then = self._buckets.pop(who, (self.burst, now))
            tokens = min(self.burst, tokens + (now - then) * self.rate)
            if tokens < 1:
                self._buckets[who] = (tokens, now)
                wait = math.ceil((1 - tokens) / self.rate)
                raise Problem(
                    429,
                    f"rate limit of {round(self.rate * 60)} requests a minute reached; "
                    f"retry in {wait} s",
                    error="RateLimited",
                    headers={"Retry-After": str(wait)},
                )
            self._buckets[who] = (tokens - 1, now)
            while len(self._buckets) > MAX_BUCKETS:
                self._buckets.popitem(last=False)


class BodyLimit:
    """ASGI middleware: a body over ``max_bytes`` is refused with 413, whether its
    Content-Length says so up front or a chunked body grows past it (read no further)."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = _content_length(scope)
        if declared is not None and declared > self.max_bytes:
            await self._refuse(scope, send)
            return
        # Read the body up front (at most max_bytes): the endpoint then never starts on a
        # body that turns out too large, and nothing is half-written.
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_bytes:
                await self._refuse(scope, send)
                return
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        await self.app(scope, _replay(b"".join(chunks), receive), send)

    async def _refuse(self, scope: Scope, send: Send) -> None:
        problem = Problem(
            413,
            f"the request body is larger than {self.max_bytes} bytes",
            error="RequestTooLarge",
            headers={"Connection": "close"},
        )
        await problem.response(scope.get("path"))(scope, _nothing, send)


class RequestTimeout:
    """ASGI middleware: a request whose response has not started within ``seconds`` is
    answered 503. The engine call it was waiting for runs on in its thread (a thread
    cannot be stopped): a write may still land, as after any lost acknowledgement, and
    its retry (the same idempotency key or signal id) sees what the store holds. A
    streamed response (the live events) is not limited once it has started."""

    def __init__(self, app: ASGIApp, seconds: float) -> None:
        self.app = app
        self.seconds = seconds
        self._abandoned: set[asyncio.Future[None]] = set()
        """Requests answered 503 whose engine call still runs: held until it ends (the
        event loop keeps only weak references to tasks)."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = asyncio.Event()

        async def sending(message: Message) -> None:
            if message["type"] == "http.response.start":
                started.set()
            await send(message)

        task = asyncio.ensure_future(self.app(scope, receive, sending))
        waiter = asyncio.ensure_future(started.wait())
        done, _ = await asyncio.wait(
            {task, waiter}, timeout=self.seconds, return_when="FIRST_COMPLETED"
        )
        waiter.cancel()
        if task in done or started.is_set():
            await task
            return
        task.cancel()
        self._abandoned.add(task)
        task.add_done_callback(self._abandoned.discard)
        problem = Problem(
            503,
            f"the request took longer than {self.seconds:g} s; it may or may not have taken "
            "effect: retry it (with the same idempotency key or signal id)",
            error="RequestTimeout",
            headers={"Retry-After": "1"},
        )
        await problem.response(scope.get("path"))(scope, _nothing, send)


def _content_length(scope: Scope) -> int | None:
    for name, value in scope.get("headers", ()):
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None


def _replay(body: bytes, receive: Receive) -> Receive:
    sent = False

    async def replayed() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()  # then the disconnect, when it comes

    return replayed


async def _nothing() -> Any:
    return {"type": "http.disconnect"}
