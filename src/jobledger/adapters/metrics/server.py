"""``/metrics`` on a port of its own: prometheus_client's HTTP server, in a thread."""

from __future__ import annotations

import threading
from wsgiref.simple_server import WSGIServer

from prometheus_client import CollectorRegistry, start_http_server

from jobledger.domain.errors import ConfigError


class MetricsServer:
    """Bound when made (a port in use stops the process before anything starts); serves
    every path as the metrics, until stopped. It asks for no credential: bind it to a
    network only the scraper reaches (loopback by default)."""

    def __init__(self, registry: CollectorRegistry, host: str, port: int) -> None:
        try:
            server, thread = start_http_server(port, addr=host, registry=registry)
        except OSError as error:
            raise ConfigError(f"cannot serve metrics on {host}:{port}: {error}") from None
        self._server: WSGIServer = server
        self._thread: threading.Thread = thread
        self.host = host

    @property
    def port(self) -> int:
        """The port it listens on (the one picked, when asked for port 0)."""
        return int(self._server.server_port)

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}/metrics"

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)
