"""The socket the API serves on (``jobledger.api.server``)."""

from __future__ import annotations

import asyncio
import socket

import pytest

from jobledger.api.server import listen
from jobledger.errors import ConfigError


def test_accepted_connections_send_without_nagle() -> None:
    """asyncio sets TCP_NODELAY on an accepted connection only when the listening
    socket's proto says TCP; without it every response written as headers then body
    waits for the client's delayed ACK (40 ms a request on loopback)."""
    sock = listen("127.0.0.1", 0)
    nodelay: list[int] = []

    class Probe(asyncio.Protocol):
        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            accepted = transport.get_extra_info("socket")
            nodelay.append(accepted.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))
            transport.close()

    async def accept_one() -> None:
        server = await asyncio.get_running_loop().create_server(Probe, sock=sock)
        port = sock.getsockname()[1]
        _, writer = await asyncio.open_connection("127.0.0.1", port)
        while not nodelay:
            await asyncio.sleep(0.01)
        writer.close()
        server.close()

    asyncio.run(asyncio.wait_for(accept_one(), 10))
    assert nodelay == [1]


def test_a_port_in_use_is_a_one_line_config_error() -> None:
    taken = listen("127.0.0.1", 0)
    port = taken.getsockname()[1]
    try:
        with pytest.raises(ConfigError, match=rf"^cannot listen on 127\.0\.0\.1:{port}: "):
            listen("127.0.0.1", port)
    finally:
        taken.close()
