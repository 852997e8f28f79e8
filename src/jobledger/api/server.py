"""Serving the API with uvicorn in a thread of a process that does other things too (the
``run`` command's supervisor, the tests, the HTTP benchmark).

The socket is bound when the server is made, not when its thread starts: a port in use
is a one-line error before anything else starts, and port 0 gives a free port whose
number is known at once. Stopping first closes the live streams (an SSE stream never
ends on its own, and uvicorn's graceful shutdown waits for every open response), then
lets uvicorn finish the requests in hand.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import socket
import threading
from collections.abc import Callable, Iterator
from dataclasses import KW_ONLY, dataclass, field
from types import FrameType
from typing import Final

import uvicorn
from starlette.types import ASGIApp

from jobledger.api.app import create_app
from jobledger.api.auth import Authenticator
from jobledger.api.batch_runner import BatchRunner
from jobledger.api.connections import AcceptErrors, Connections, Listener
from jobledger.api.live import LogBell
from jobledger.api.settings import ApiSettings
from jobledger.domain.errors import ConfigError
from jobledger.engine.engine import Engine

log = logging.getLogger(__name__)

GRACEFUL_SHUTDOWN_SECONDS: Final = 10
"""How long requests in hand may take to finish once the server stops."""


def listen(host: str, port: int) -> socket.socket:
    """A listening TCP socket on ``host:port`` (IPv6 if ``host`` is an IPv6 address)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # IPPROTO_TCP spelled out: asyncio sets TCP_NODELAY only on sockets whose proto says
    # TCP, and with Nagle on, a response written as headers then body waits for the
    # client's delayed ACK (40 ms a request on Linux).
    sock = Listener(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(2048)
    except OSError as error:
        sock.close()
        raise ConfigError(f"cannot listen on {host}:{port}: {error.strerror or error}") from None
    sock.set_inheritable(True)
    return sock


def serve_engine(engine: Engine, settings: ApiSettings) -> ApiServer:
    """The API over ``engine``, bound to the settings' host and port (not yet serving)."""
    app = create_app(engine, settings)
    connections = Connections.of(settings)
    try:
        return ApiServer(
            app,
            settings.host,
            settings.port,
            bell=app.state.live,
            keys=app.state.authenticator,
            connections=connections,
            batches=app.state.batches,
        )
    except ConfigError:
        # The app's batch threads already use the engine, which the caller closes next.
        app.state.batches.close()
        raise


@dataclass(eq=False)  # eq=False: compared and hashed by identity
class ApiServer:
    """uvicorn on a socket bound up front; ``run`` blocks (a thread's target), ``stop``
    may be called from any thread."""

    app: ASGIApp
    host: str
    port: int
    """The port it listens on (given 0, the one the OS chose)."""
    _: KW_ONLY
    bell: LogBell | None
    connections: Connections
    keys: Authenticator | None = None
    """The app's authenticator, whose key files SIGHUP reads again (the CLI's handler)."""
    batches: BatchRunner | None = None
    """The app's batch threads, stopped when the server ends (before the engine closes)."""
    socket: socket.socket = field(init=False)
    stopping: threading.Event = field(default_factory=threading.Event, init=False)
    server: uvicorn.Server | None = field(default=None, init=False)
    started: threading.Event = field(default_factory=threading.Event, init=False)
    """Set once it accepts connections."""

    def __post_init__(self) -> None:
        self.socket = listen(self.host, self.port)
        self.port = self.socket.getsockname()[1]

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    def run(self) -> None:
        """Serve until :meth:`stop` (or, in the main thread, SIGINT or SIGTERM). A server
        that ends on its own (its start-up failed) raises, so a supervisor restarts it,
        on the same port."""
        if self.socket.fileno() == -1:  # uvicorn closed it when it last stopped
            self.socket = listen(self.host, self.port)
        config = uvicorn.Config(
            self.app,
            log_config=None,  # the process's logging, as configured by the CLI
            access_log=False,
            server_header=False,
            timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_SECONDS,
            http=self.connections.protocol(),
            timeout_keep_alive=self.connections.keep_alive_seconds,
        )
        server = _Server(config, self.started, self.stop)
        self.server = server
        if self.stopping.is_set():
            return
        try:
            server.run(sockets=[self.socket])
        except SystemExit:  # uvicorn's way of saying its start-up failed
            raise RuntimeError("the HTTP server failed to start") from None
        finally:
            if self.batches is not None and self.stopping.is_set():
                self.batches.close(GRACEFUL_SHUTDOWN_SECONDS)
        if not self.stopping.is_set():
            raise RuntimeError("the HTTP server stopped on its own")

    def stop(self) -> None:
        self.stopping.set()
        if self.bell is not None:
            self.bell.close()
        if self.server is not None:
            self.server.should_exit = True


class _Server(uvicorn.Server):
    """Says when it accepts connections, and ends the live streams when a signal stops it
    (run in the main thread, uvicorn handles SIGINT and SIGTERM itself)."""

    def __init__(
        self, config: uvicorn.Config, listening: threading.Event, on_exit: Callable[[], None]
    ) -> None:
        super().__init__(config)
        self.listening = listening
        self.on_exit = on_exit

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        super().handle_exit(sig, frame)
        self.on_exit()

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        """uvicorn's, but without raising the signal again once it has shut down: that
        would kill the process (SIGTERM) or raise KeyboardInterrupt (SIGINT) before its
        caller closes the engine. A stop by signal returns from :meth:`run` instead."""
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        handled = (signal.SIGINT, signal.SIGTERM)
        previous = {sig: signal.signal(sig, self.handle_exit) for sig in handled}
        try:
            yield
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        asyncio.get_running_loop().set_exception_handler(AcceptErrors())
        await super().startup(sockets)
        self.listening.set()
