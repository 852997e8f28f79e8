"""Serving the API (``jobledger.api.server``): its socket, and stopping it."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from jobledger.api.auth import Role
from jobledger.api.server import listen
from jobledger.errors import ConfigError
from tests.support import pythonpath
from tests.support.engines import EngineFactory
from tests.support.http import api_key, write_keys_file
from tests.support.sse import SseReader


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


def test_a_signal_stops_a_server_in_the_main_thread_and_ends_its_streams(
    make_engine: EngineFactory, store_url: str, tmp_path: Path
) -> None:
    make_engine().submit("acme", "j1", "agent3")
    keys = write_keys_file(tmp_path / "keys.json")
    env = {**os.environ, "PYTHONPATH": pythonpath()}
    process = subprocess.Popen(
        [sys.executable, "-m", "tests.support.serve_main", store_url, str(keys)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert process.stdout is not None
        line = process.stdout.readline()
        assert line.startswith("serving "), process.stderr.read() if process.stderr else line
        url = line.split()[1]
        headers = {"Authorization": f"Bearer {api_key('acme', Role.AUDITOR)}"}
        with httpx.Client(base_url=url, headers=headers, timeout=30) as http:
            # No heartbeat for 30 s: only the stop can end this stream in time.
            stream = SseReader(http, "/v1/jobs/acme/j1/events").__enter__()
            stream.take(1)
            process.send_signal(signal.SIGINT)
            out, err = process.communicate(timeout=20)
            assert stream.ended.wait(10) and stream.error is None, stream.error
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()
    assert process.returncode == 0, err
    assert out.strip() == "stopped"
