"""Serving the API (``jobledger.api.server``): its socket, and stopping it."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import resource
import select
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from jobledger.api.auth import Role
from jobledger.api.connections import Connections
from jobledger.api.server import listen
from jobledger.api.settings import ApiSettings
from jobledger.domain.errors import ConfigError
from tests.support import pythonpath
from tests.support.engines import EngineFactory
from tests.support.http import ApiServer, api_key, api_registry, start_api, write_keys_file
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


# ---- connections: idle ones closed, their number bounded, ambiguous framing refused ------


def _connect(server: ApiServer) -> socket.socket:
    host, port = server.url.removeprefix("http://").rsplit(":", 1)
    return socket.create_connection((host, int(port)), timeout=10)


def _read_to_close(sock: socket.socket, within: float) -> tuple[bytes, float]:
    """Everything the server sends until it closes the connection, and how long that took;
    fails if it is still open after ``within`` seconds."""
    started = time.monotonic()
    received = b""
    sock.settimeout(0.2)
    while time.monotonic() - started < within:
        try:
            chunk = sock.recv(65536)
        except TimeoutError:
            continue
        except ConnectionResetError:
            break
        if not chunk:
            break
        received += chunk
    else:
        raise AssertionError(f"still open after {within} s; received {received!r}")
    return received, time.monotonic() - started


@contextlib.contextmanager
def _serving(
    make_engine: EngineFactory, tmp_path: Path, keep_alive_seconds: int
) -> Iterator[ApiServer]:
    engine = make_engine(registry=api_registry())
    engine.submit("acme", "j1", "agent3")
    with start_api(
        engine,
        tmp_path,
        keep_alive_seconds=keep_alive_seconds,
        max_connections=8,
        sse_heartbeat_seconds=0.5,
    ) as server:
        yield server


@pytest.fixture
def bounded(make_engine: EngineFactory, tmp_path: Path) -> Iterator[ApiServer]:
    """At most 8 connections, idle ones closed after a second."""
    with _serving(make_engine, tmp_path, keep_alive_seconds=1) as server:
        yield server


@pytest.fixture
def bounded_patient(make_engine: EngineFactory, tmp_path: Path) -> Iterator[ApiServer]:
    """At most 8 connections, idle ones kept for 30 s: only the bound closes them."""
    with _serving(make_engine, tmp_path, keep_alive_seconds=30) as server:
        yield server


def test_a_connection_without_a_request_under_way_is_closed_after_the_keep_alive(
    bounded: ApiServer,
) -> None:
    """Silent from the start, between requests, and a request head sent a byte at a time
    (uvicorn disarmed its timer at each byte): each is closed after
    ``keep_alive_seconds``, however long its peer would hold it."""
    silent = _connect(bounded)
    silent_bytes, silent_after = _read_to_close(silent, within=5)

    between = _connect(bounded)
    between.sendall(b"GET /healthz HTTP/1.1\r\nHost: t\r\n\r\n")
    answered, between_after = _read_to_close(between, within=5)

    trickling = _connect(bounded)
    started = time.monotonic()
    with contextlib.suppress(OSError):  # the server may close it while it sends
        for byte in b"GET /healthz HTTP/1.1\r\nHost: t\r\n":  # 3.4 s at a byte a 0.1 s
            trickling.sendall(bytes([byte]))
            time.sleep(0.1)
    trickled, _ = _read_to_close(trickling, within=5)
    trickle_after = time.monotonic() - started

    assert silent_bytes == b"" and 0.8 < silent_after < 3, silent_after
    assert answered.startswith(b"HTTP/1.1 200 ") and answered.count(b"HTTP/1.1") == 1
    assert 0.8 < between_after < 3, between_after
    assert trickled == b"" and trickle_after < 4.5  # no whole head: no request, no answer
    for sock in (silent, trickling, between):
        sock.close()


def test_connections_past_the_bound_close_the_longest_idle_first(
    bounded_patient: ApiServer,
) -> None:
    idle = []
    for _ in range(12):
        idle.append(_connect(bounded_patient))
        time.sleep(0.02)  # one after the other: their order is how long each was idle
    time.sleep(0.3)

    with bounded_patient.client() as http:
        health = http.get("/healthz", timeout=5)

    assert health.status_code == 200
    # 12 idle and one asking: 8 fit, so the five oldest went, the newest stayed.
    assert _closed(idle) == [0, 1, 2, 3, 4]
    for sock in idle:
        sock.close()


def test_a_connection_past_the_bound_when_none_is_idle_is_refused_503(
    bounded: ApiServer,
) -> None:
    key = api_key("acme", Role.AUDITOR)
    streams = [_connect(bounded) for _ in range(8)]
    for sock in streams:
        sock.sendall(
            b"GET /v1/jobs/acme/j1/events HTTP/1.1\r\nHost: t\r\n"
            + f"Authorization: Bearer {key}\r\n\r\n".encode()
        )
    for sock in streams:
        assert sock.recv(12) == b"HTTP/1.1 200"  # each a live stream: busy, not idle

    refused = _connect(bounded)
    answer, after = _read_to_close(refused, within=5)

    assert answer.startswith(b"HTTP/1.1 503 ") and after < 1, answer
    head, _, body = answer.partition(b"\r\n\r\n")
    assert b"retry-after: 1" in head.lower() and b"connection: close" in head.lower()
    assert json.loads(body)["error"] == "TooManyConnections"
    assert _closed(streams) == []
    for sock in streams:
        sock.close()


def _closed(socks: list[socket.socket]) -> list[int]:
    """Which of these connections the server closed (a read sees its end, or a reset)."""
    readable, _, _ = select.select(socks, [], [], 0.3)
    closed = []
    for n, sock in enumerate(socks):
        if sock not in readable:
            continue
        try:
            if sock.recv(65536) == b"":
                closed.append(n)
        except ConnectionResetError:
            closed.append(n)
    return closed


def test_a_request_framed_by_both_content_length_and_transfer_encoding_is_400_and_closed(
    bounded: ApiServer,
) -> None:
    """RFC 9112 6.3: such a request is how one request is smuggled inside another (a
    proxy frames it by Content-Length, the server by Transfer-Encoding). Refused, and the
    connection closed: the bytes after it are never read as a request."""
    sock = _connect(bounded)
    sock.sendall(
        b"POST /v1/jobs/acme HTTP/1.1\r\nHost: t\r\nContent-Length: 5\r\n"
        b"Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n"
        b"GET /healthz HTTP/1.1\r\nHost: t\r\n\r\n"
    )

    answer, after = _read_to_close(sock, within=5)

    assert after < 1
    assert answer.startswith(b"HTTP/1.1 400 ") and answer.count(b"HTTP/1.1") == 1, answer
    head, _, body = answer.partition(b"\r\n\r\n")
    assert b"connection: close" in head.lower()
    assert b"content-type: application/problem+json" in head.lower()
    problem = json.loads(body)
    assert problem["status"] == 400 and problem["error"] == "InvalidRequest"
    assert "both Content-Length and Transfer-Encoding" in problem["detail"]
    sock.close()


def test_a_flood_of_idle_connections_at_the_fd_limit_leaves_health_answering_and_the_log_quiet(
    store_url: str, tmp_path: Path
) -> None:
    """The report: 1,100 idle sockets against `serve` at an open-file limit of 1,024 made
    /healthz time out and wrote 30,550 log lines in 13 s (asyncio's accept loop logs
    every failed accept of its batch and schedules a retry for each). With the defaults,
    the connections are bounded below the limit, the oldest idle ones go first, and the
    server answers."""
    _enough_files_for(1_200)
    keys = write_keys_file(tmp_path / "keys.json")
    stderr = tmp_path / "stderr.log"
    with stderr.open("w") as err:
        process = subprocess.Popen(
            [sys.executable, "-m", "tests.support.serve_main", store_url, str(keys)],
            env={**os.environ, "PYTHONPATH": pythonpath()},
            stdout=subprocess.PIPE,
            stderr=err,
            text=True,
            preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (1024, 1024)),
        )
    flood: list[socket.socket] = []
    try:
        assert process.stdout is not None
        line = process.stdout.readline()
        assert line.startswith("serving "), stderr.read_text()
        url = line.split()[1]
        host, port = url.removeprefix("http://").rsplit(":", 1)
        flood = [socket.create_connection((host, int(port)), timeout=10) for _ in range(1_100)]
        time.sleep(1)
        started = time.monotonic()
        with httpx.Client(base_url=url, timeout=5) as http:
            health = [http.get("/healthz").status_code for _ in range(3)]
        took = time.monotonic() - started
        time.sleep(2)
    finally:
        for sock in flood:
            sock.close()
        process.terminate()
        process.communicate(timeout=20)
    assert health == [200, 200, 200] and took < 3, (health, took)
    lines = stderr.read_text().splitlines()
    assert len(lines) < 20, lines[:40]


def _enough_files_for(count: int) -> None:
    """This test's own process holds the flood's sockets: raise its soft limit if needed."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < count:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(count * 2, hard), hard))


def test_max_connections_defaults_below_the_open_file_limit_and_may_not_reach_it() -> None:
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    assert Connections.of(ApiSettings()).max_connections == soft // 2
    assert Connections.of(ApiSettings(max_connections=soft - 1)).max_connections == soft - 1
    with pytest.raises(ConfigError, match=f"max_connections {soft} is not below the open-file"):
        Connections.of(ApiSettings(max_connections=soft))
