"""The server's connections: how long an idle one stays, how many there may be, and what
is refused before it reaches the app.

uvicorn (h11) arms its keep-alive timer only after a response and disarms it at any byte
received, so a connection that sends nothing, or a request head a byte at a time, is held
for ever; and it holds as many as the process can open. Here a connection with no request
under way (none yet, between requests, or a head not all in) is closed after
``keep_alive_seconds``; past ``max_connections`` the longest idle one is closed for a new
one, or the new one is refused (503) when none is idle. A request framed both by
Content-Length and Transfer-Encoding is refused and its connection closed (RFC 9112 6.3:
the way one request is smuggled inside another).
"""

from __future__ import annotations

import asyncio
import errno
import logging
import math
import resource
import socket
import time
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any, ClassVar, Final

import h11
from h11._connection import DEFAULT_MAX_INCOMPLETE_EVENT_SIZE
from uvicorn.protocols.http.h11_impl import H11Protocol

from jobledger.api.problems import Problem
from jobledger.api.settings import ApiSettings
from jobledger.domain.errors import ConfigError

log = logging.getLogger(__name__)

OUT_OF_RESOURCES: Final = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})
"""The accept errors asyncio backs off from (it retries a second later)."""
ACCEPT_ERROR_REPORT_SECONDS: Final = 60.0
UNBOUNDED_FILES_MAX_CONNECTIONS: Final = 10_000


@dataclass(frozen=True)
class Connections:
    keep_alive_seconds: int
    max_connections: int

    @classmethod
    def of(cls, settings: ApiSettings) -> Connections:
        """The settings' limits; ``max_connections`` by default half the process's
        open-file limit (the rest for the store, the logs and the engine), and never at or
        over it: accepting would fail before the bound is reached."""
        soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
        files = math.inf if soft == resource.RLIM_INFINITY else soft
        wanted = settings.max_connections
        if wanted is None:
            wanted = UNBOUNDED_FILES_MAX_CONNECTIONS if files == math.inf else max(1, soft // 2)
        elif wanted >= files:
            raise ConfigError(
                f"max_connections {wanted} is not below the open-file limit {soft}: the "
                "server would run out of file descriptors before it reached its bound"
            )
        return cls(settings.keep_alive_seconds, wanted)

    def protocol(self) -> type[H11Protocol]:
        """The uvicorn protocol class that keeps these limits."""
        return type("BoundedConnection", (Connection,), {"max_connections": self.max_connections})


class StrictH11(h11.Connection):
    """h11 frames a request with both Content-Length and Transfer-Encoding by the latter
    and keeps the connection (RFC 9112 allows it); refused instead. Keeps the protocol
    error it raises, for the answer to say what was wrong."""

    def __init__(self, max_incomplete_event_size: int) -> None:
        super().__init__(h11.SERVER, max_incomplete_event_size)
        self.error: h11.RemoteProtocolError | None = None

    def next_event(self) -> Any:
        try:
            event = super().next_event()
            if isinstance(event, h11.Request) and _framed_twice(event):
                raise h11.RemoteProtocolError(
                    "a request with both Content-Length and Transfer-Encoding is refused "
                    "(RFC 9112 6.3): it is framed two ways",
                    400,
                )
        except h11.RemoteProtocolError as error:
            self.error = error
            raise
        return event


def _framed_twice(request: h11.Request) -> bool:
    names = {name.lower() for name, _ in request.headers}
    return b"content-length" in names and b"transfer-encoding" in names


class Connection(H11Protocol):
    """uvicorn's h11 protocol, with the idle timer armed from the start and disarmed only
    by a whole request head, the connections bounded, and bad requests answered as
    problem+json. Its idle timer is uvicorn's keep-alive timer: armed means idle."""

    max_connections: ClassVar[int]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        size = self.config.h11_max_incomplete_event_size or DEFAULT_MAX_INCOMPLETE_EVENT_SIZE
        self.conn = StrictH11(size)

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        if self._has_room():
            self._arm_idle_timer()

    def data_received(self, data: bytes) -> None:
        # Not uvicorn's disarming at every byte: a head sent a byte at a time would hold
        # the connection for ever. handle_events disarms the timer at a whole head.
        self.conn.receive_data(data)
        self.handle_events()

    def send_400_response(self, msg: str) -> None:
        """uvicorn's answer to a request h11 refused, as problem+json saying why."""
        error = self.conn.error if isinstance(self.conn, StrictH11) else None
        status = error.error_status_hint if error is not None else 400
        detail = str(error)[:300] if error is not None else msg
        problem = Problem(status, detail, error="InvalidRequest").response()
        headers = [*problem.raw_headers, (b"connection", b"close")]
        for event in (
            h11.Response(status_code=status, headers=headers, reason=HTTPStatus(status).phrase),
            h11.Data(data=bytes(problem.body)),
            h11.EndOfMessage(),
        ):
            self.transport.write(self.conn.send(event) or b"")
        self.transport.close()

    @property
    def idle(self) -> bool:
        return self.timeout_keep_alive_task is not None and not self.transport.is_closing()

    def _arm_idle_timer(self) -> None:
        self.timeout_keep_alive_task = self.loop.call_later(
            self.timeout_keep_alive, self.timeout_keep_alive_handler
        )

    def _has_room(self) -> bool:
        """Whether this new connection fits: past the bound, the longest idle one is
        closed to make room, or this one is refused when none is idle."""
        open_ = [c for c in self.connections if isinstance(c, Connection) and c is not self]
        open_ = [c for c in open_ if not c.transport.is_closing()]
        if len(open_) < self.max_connections:
            return True
        idle = [c for c in open_ if c.idle]
        if idle:
            min(idle, key=_idle_since).close_idle()
            return True
        self._refuse()
        return False

    def close_idle(self) -> None:
        self._unset_keepalive_if_required()
        self.conn.send(h11.ConnectionClosed())
        self.transport.close()

    def _refuse(self) -> None:
        """503 before any request (h11 answers none before one: written by hand)."""
        problem = Problem(
            503,
            f"the server holds {self.max_connections} connections (its max_connections), "
            "none of them idle: try again",
            error="TooManyConnections",
            headers={"Retry-After": "1"},
        ).response()
        head = [b"HTTP/1.1 503 Service Unavailable"]
        head += [name + b": " + value for name, value in problem.raw_headers]
        head.append(b"connection: close")
        self.transport.write(b"\r\n".join(head) + b"\r\n\r\n" + problem.body)
        self.transport.close()


def _idle_since(connection: Connection) -> float:
    timer = connection.timeout_keep_alive_task
    return timer.when() if timer is not None else math.inf


class Listener(socket.socket):
    """A listening socket whose accept, once it ran out of file descriptors, reports the
    queue empty for the rest of asyncio's batch. asyncio (3.11) goes on accepting after
    EMFILE, logging each failure and scheduling a retry for each, and the retries
    multiply: 1.8 M log lines in 15 s. Now one failure a batch; asyncio retries a second
    later."""

    out_of_resources = False

    def accept(self) -> tuple[socket.socket, Any]:
        if self.out_of_resources:
            self.out_of_resources = False
            raise BlockingIOError(errno.EAGAIN, "accepting again after a back-off")
        try:
            return super().accept()
        except OSError as error:
            self.out_of_resources = error.errno in OUT_OF_RESOURCES
            raise


class AcceptErrors:
    """The event loop's exception handler: an accept that ran out of resources (asyncio
    reports one a second while it lasts, each with a traceback) is logged as one line a
    minute with how many there were; every other error as asyncio would."""

    def __init__(self, every: float = ACCEPT_ERROR_REPORT_SECONDS) -> None:
        self.every = every
        self.reported_at = -math.inf
        self.unreported = 0

    def __call__(self, loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        error = context.get("exception")
        accepting = context.get("message") == "socket.accept() out of system resource"
        if not (accepting and isinstance(error, OSError)):
            loop.default_exception_handler(context)
            return
        self.unreported += 1
        now = time.monotonic()
        if now - self.reported_at < self.every:
            return
        log.error(
            "cannot accept connections: %s (%d failed accepts since the last report); "
            "asyncio retries each second",
            error.strerror or error,
            self.unreported,
        )
        self.reported_at, self.unreported = now, 0
