"""Reading a Server-Sent Events stream in a thread: each message lands in a queue with
the moment it arrived, so a test can wait for the next one with a timeout."""

from __future__ import annotations

import queue
import threading
import time
from dataclasses import dataclass
from typing import Any

import httpx


@dataclass(frozen=True)
class Message:
    id: str | None
    event: str | None
    data: str
    received: float
    """time.monotonic() when its blank line arrived."""


class SseReader:
    """``GET path`` with ``headers`` as a stream; messages (not comments) go to a queue;
    ``comments`` counts the comment lines (heartbeats). Closing takes effect at the next
    line the server sends (a blocking read cannot be interrupted from another thread):
    serve the stream with short heartbeats."""

    def __init__(self, http: httpx.Client, path: str, **headers: str) -> None:
        self.http = http
        self.path = path
        self.headers = headers
        self.messages: queue.Queue[Message] = queue.Queue()
        self.comments = 0
        self.status: int | None = None
        self.content_type: str | None = None
        self.connected = threading.Event()
        self.ended = threading.Event()
        self.error: BaseException | None = None
        self.closing = threading.Event()
        self.thread = threading.Thread(target=self._read, daemon=True)

    def __enter__(self) -> SseReader:
        self.thread.start()
        if not self.connected.wait(15):
            raise AssertionError("the stream did not answer")
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def close(self) -> None:
        self.closing.set()
        self.thread.join(10)
        assert not self.thread.is_alive(), "the stream sent nothing to close on"

    def next(self, timeout: float = 10.0) -> Message:
        return self.messages.get(timeout=timeout)

    def take(self, n: int, timeout: float = 10.0) -> list[Message]:
        return [self.next(timeout) for _ in range(n)]

    def _read(self) -> None:
        try:
            with self.http.stream("GET", self.path, headers=self.headers) as response:
                self.status = response.status_code
                self.content_type = response.headers.get("content-type")
                self.connected.set()
                fields: dict[str, Any] = {}
                for line in response.iter_lines():
                    if self.closing.is_set():
                        return
                    if line == "":
                        if "data" in fields:
                            self.messages.put(
                                Message(
                                    fields.get("id"),
                                    fields.get("event"),
                                    fields["data"],
                                    time.monotonic(),
                                )
                            )
                        fields = {}
                    elif line.startswith(":"):
                        self.comments += 1
                    else:
                        name, _, value = line.partition(":")
                        fields[name] = value.removeprefix(" ")
        except (httpx.StreamClosed, httpx.ReadError, httpx.RemoteProtocolError) as error:
            self.error = error  # closed by us, or by the server
        finally:
            self.connected.set()
            self.ended.set()
