"""``jobledger run --http HOST:PORT``: the API served inside the runner, a supervisor
service, on SQLite and PostgreSQL; it stops cleanly with the runner, open streams too."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

from jobledger.api.auth import Role, key_sha256
from tests.support import pythonpath
from tests.support.cli import JOBLEDGER, announced, run_jobledger
from tests.support.http import api_key, write_keys_file
from tests.support.sse import SseReader
from tests.support.workflows import tasks_definition

CHORES = tasks_definition("chores", "one", "two")
EXECUTOR = """
from jobledger import StepRequest, StepResult

class Chores:
    def execute(self, request: StepRequest) -> StepResult:
        return StepResult(output={"did": request.resolution.params["task"]})
"""


@pytest.fixture
def home(tmp_path: Path, store_url: str) -> Path:
    (tmp_path / "definitions").mkdir()
    (tmp_path / "definitions" / "chores.yaml").write_text(CHORES)
    (tmp_path / "chores_executor.py").write_text(EXECUTOR)
    # The API's settings as serve reads them: the [http] table, paths beside the file.
    (tmp_path / "jobledger.toml").write_text(
        f'store_url = "{store_url}"\n'
        'definitions = "definitions"\n'
        'executor = "chores_executor:Chores"\n'
        "[http]\n"
        'api_keys_file = "keys.json"\n'
        "sse_heartbeat_seconds = 30\n"
    )
    write_keys_file(tmp_path / "keys.json")
    return tmp_path


def environment(home: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("JOBLEDGER_")}
    env.update(
        PYTHONPATH=pythonpath(),
        PYTHONUNBUFFERED="1",
        COLUMNS="200",
        **extra,
    )
    return env


@contextmanager
def started(home: Path, *args: str) -> Iterator[tuple[subprocess.Popen[str], str]]:
    """``jobledger ARGS`` in ``home``, and the URL it says it serves at."""
    process = subprocess.Popen(
        [str(JOBLEDGER), *args],
        cwd=home,
        env=environment(home),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        yield process, served_at(process)
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate(timeout=30)


@pytest.fixture
def runner(home: Path) -> Iterator[tuple[subprocess.Popen[str], str]]:
    with started(home, "run", "--http", "127.0.0.1:0") as running:
        yield running


def served_at(process: subprocess.Popen[str]) -> str:
    """The URL the runner says it serves the API at (it chose the port)."""
    pattern = r"(?:http|serve): (http://127\.0\.0\.1:\d+)"
    return announced(process, pattern, "the runner did not say where it serves")


def wait_for_status(http: httpx.Client, path: str, status: str) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if http.get(path).json()["status"] == status:
            return
        time.sleep(0.1)
    raise AssertionError(f"{path} never became {status}")


def test_run_http_serves_the_api_beside_the_workers_and_stops_cleanly(
    runner: tuple[subprocess.Popen[str], str],
) -> None:
    process, url = runner
    headers = {"Authorization": f"Bearer {api_key('acme', Role.OPERATOR)}"}
    with httpx.Client(base_url=url, headers=headers, timeout=30) as http:
        assert http.get("/readyz").json() == {"status": "ok"}
        submitted = http.post("/v1/jobs/acme", json={"job_id": "j1", "workflow_type": "chores"})
        assert submitted.status_code == 201, submitted.text
        wait_for_status(http, "/v1/jobs/acme/j1", "completed")  # the runner's workers ran it
        # No heartbeat for 30 s: only the runner stopping can end this stream in time.
        stream = SseReader(http, "/v1/jobs/acme/j1/events").__enter__()
        events = [m.event for m in stream.take(4)]
        process.send_signal(signal.SIGTERM)
        out, err = process.communicate(timeout=60)
        # The open stream ended with the server: neither a hang nor a reset connection.
        assert stream.ended.wait(10) and stream.error is None, stream.error
    assert events[0] == "Submitted"
    assert process.returncode == 0, err
    assert "stopped cleanly after" in out
    assert "Traceback" not in err


def test_a_port_in_use_stops_the_runner_before_it_starts(home: Path) -> None:
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    port = taken.getsockname()[1]
    try:
        done = run_jobledger("run", "--http", f"127.0.0.1:{port}", cwd=home)
    finally:
        taken.close()
    assert done.returncode == 3, done.stderr
    assert done.stderr.startswith(f"error: cannot listen on 127.0.0.1:{port}: "), done.stderr
    assert "worker" not in done.stdout


def test_a_malformed_http_address_is_a_usage_error(home: Path) -> None:
    done = run_jobledger("run", "--http", "8080", cwd=home)
    assert done.returncode == 2
    assert "expected HOST:PORT" in done.stderr


def test_serve_ends_its_open_streams_and_exits_0_on_sigterm(home: Path) -> None:
    run_jobledger("submit", "acme", "j1", "chores", cwd=home)
    with started(home, "serve", "--port", "0") as (process, url):
        headers = {"Authorization": f"Bearer {api_key('acme', Role.AUDITOR)}"}
        with httpx.Client(base_url=url, headers=headers, timeout=30) as http:
            stream = SseReader(http, "/v1/jobs/acme/j1/events").__enter__()
            stream.take(1)
            process.send_signal(signal.SIGTERM)
            out, err = process.communicate(timeout=30)
            assert stream.ended.wait(10) and stream.error is None, stream.error
    assert process.returncode == 0, err
    assert "stopped cleanly" in out


def test_run_http_without_a_way_to_authenticate_refuses_to_start(home: Path) -> None:
    config = home / "jobledger.toml"
    config.write_text(config.read_text().replace('api_keys_file = "keys.json"\n', ""))
    done = run_jobledger("run", "--http", "127.0.0.1:0", cwd=home)
    assert done.returncode == 3
    assert done.stderr.startswith("error: run --http needs a way to authenticate callers")


# ---- SIGHUP: the key files again -----------------------------------------------------------


def keep_keys(home: Path, *keys: str, added: dict[str, object] | None = None) -> None:
    """Rewrite the keys file with only ``keys`` of the test's (and ``added``): the others
    are revoked."""
    write_keys_file(home / "keys.json")
    entries = json.loads((home / "keys.json").read_text())["keys"]
    kept = [entry for entry in entries if entry["sha256"] in {key_sha256(k) for k in keys}]
    (home / "keys.json").write_text(json.dumps({"keys": kept + ([added] if added else [])}))


def console_session(url: str, credential: str) -> httpx.Client:
    client = httpx.Client(base_url=url, timeout=30)
    form = client.get("/console/sign-in").text
    found = re.search(r'name="csrf" value="([^"]+)"', form)
    assert found is not None
    data = {"credential": credential, "csrf": found.group(1)}
    assert client.post("/console/sign-in", data=data).status_code == 303
    assert client.get("/console/approvals").status_code == 200
    return client


def reloaded(process: subprocess.Popen[str]) -> str:
    return announced(process, r"(SIGHUP: API keys reloaded.*)", "no reload of the keys file")


def warned(process: subprocess.Popen[str], pattern: str) -> str:
    """The first stderr line of ``process`` (its log) that has ``pattern``."""
    assert process.stderr is not None
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        line = process.stderr.readline()
        if not line:
            break
        if re.search(pattern, line):
            return line
    raise AssertionError(f"the log never said {pattern!r}")


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def test_sighup_to_serve_reloads_the_keys_file_a_revoked_key_stops_working_and_its_sessions_end(
    home: Path,
) -> None:
    operator, approver = api_key("acme", Role.OPERATOR), api_key("acme", Role.APPROVER)
    auditor, new = api_key("acme", Role.AUDITOR), "jlk-acme-issued-after-the-start"
    with started(home, "serve", "--port", "0") as (process, url):
        api = httpx.Client(base_url=url, timeout=30)
        assert api.get("/v1/jobs/acme", headers=bearer(operator)).status_code == 200
        assert api.get("/v1/jobs/acme", headers=bearer(new)).status_code == 401
        revoked = console_session(url, approver)
        kept = console_session(url, auditor)

        issued = {"sha256": key_sha256(new), "subject": "new", "tenants": ["acme"]}
        keep_keys(home, auditor, added={**issued, "roles": ["operator"]})
        process.send_signal(signal.SIGHUP)
        assert "2 key(s)" in reloaded(process)

        assert api.get("/v1/jobs/acme", headers=bearer(operator)).status_code == 401
        assert api.get("/v1/jobs/acme", headers=bearer(new)).status_code == 200
        ended = revoked.get("/console/approvals")
        assert ended.status_code == 303 and ended.headers["location"] == "/console/sign-in"
        assert kept.get("/console/approvals").status_code == 200

        # A file that does not parse is refused whole: the keys in use are kept.
        (home / "keys.json").write_text("{not json")
        process.send_signal(signal.SIGHUP)
        assert "is not JSON" in warned(process, "SIGHUP: API keys NOT reloaded, keeping those")
        assert api.get("/v1/jobs/acme", headers=bearer(new)).status_code == 200
        assert kept.get("/console/approvals").status_code == 200
        process.send_signal(signal.SIGTERM)
        _, err = process.communicate(timeout=30)
    assert process.returncode == 0, err
    assert "Traceback" not in err


def test_sighup_to_run_http_reloads_the_keys_file_and_the_definitions(home: Path) -> None:
    operator = api_key("acme", Role.OPERATOR)
    with started(home, "run", "--http", "127.0.0.1:0") as (process, url):
        api = httpx.Client(base_url=url, headers=bearer(operator), timeout=30)
        assert api.get("/v1/jobs/acme").status_code == 200
        keep_keys(home, api_key("acme", Role.AUDITOR))
        process.send_signal(signal.SIGHUP)
        definitions = r"(SIGHUP: definitions reloaded.*)"
        assert "chores v1" in announced(process, definitions, "no reload of the definitions")
        reloaded(process)
        assert api.get("/v1/jobs/acme").status_code == 401
        process.send_signal(signal.SIGTERM)
        _, err = process.communicate(timeout=60)
    assert process.returncode == 0, err
