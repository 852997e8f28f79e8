"""``jobledger serve``: its settings (flag > env > file > default), a real server process,
the OpenAPI document in docs/, and a clear error without the http extra."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from jobledger.api.app import create_app
from jobledger.api.auth import Role
from jobledger.api.settings import ApiSettings, load_api_settings
from jobledger.domain.errors import ConfigError
from jobledger.engine.engine import Engine
from tests.support import ROOT, pythonpath
from tests.support.cli import JOBLEDGER, make_cli
from tests.support.engines import EngineFactory
from tests.support.http import write_keys_file

OPENAPI = ROOT / "docs" / "openapi.json"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


# ---- settings ----------------------------------------------------------------------------


def test_api_settings_come_from_flag_then_env_then_file_then_default(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = tmp_path / "conf" / "jobledger.toml"
    table = {"host": "0.0.0.0", "port": 9001, "api_keys_file": "keys.json"}
    monkeypatch.setenv("JOBLEDGER_HTTP_PORT", "9002")

    from_env = load_api_settings(table, config)
    from_flag = load_api_settings(table, config, port=9003, host=None)
    monkeypatch.delenv("JOBLEDGER_HTTP_PORT")
    default = load_api_settings({})

    assert (from_env.host, from_env.port) == ("0.0.0.0", 9002)
    assert from_flag.port == 9003
    assert from_env.api_keys_file == tmp_path / "conf" / "keys.json"  # beside the file
    assert (default.host, default.port, default.max_body_bytes) == ("127.0.0.1", 8080, 1 << 20)


@pytest.mark.parametrize(
    ("table", "says"),
    [
        ({"prot": 1}, "unknown setting 'prot'"),
        ({"port": 70000}, "port"),
        ({"jwt_secret": "short"}, "jwt_secret"),
        ({"jwt_secret": "s" * 40}, "jwt_issuer and jwt_audience"),
    ],
)
def test_a_bad_api_setting_is_one_clear_error(table: dict[str, object], says: str) -> None:
    with pytest.raises(ConfigError, match="invalid HTTP") as raised:
        load_api_settings(table, Path("jobledger.toml"))
    assert says in str(raised.value) and "\n" not in str(raised.value)


# ---- the command -------------------------------------------------------------------------


def test_serve_answers_on_the_flags_port_with_the_files_keys_and_stops_on_sigterm(
    tmp_path: Path, store_url: str
) -> None:
    cli = make_cli(tmp_path, store_url)
    assert cli.config is not None
    write_keys_file(tmp_path / "keys.json")
    file_port, env_port, flag_port = free_port(), free_port(), free_port()
    with cli.config.open("a") as config:
        config.write(f'\n[http]\nport = {file_port}\napi_keys_file = "keys.json"\n')
    env = {**cli.env, "JOBLEDGER_HTTP_PORT": str(env_port)}
    command = [str(JOBLEDGER), "serve", "--port", str(flag_port), "--config", str(cli.config)]
    server = subprocess.Popen(
        command, env=env, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        base = f"http://127.0.0.1:{flag_port}"
        _wait_until_up(server, base)
        key = {"Authorization": "Bearer jlk-acme-operator-0123456789abcdef"}
        made = httpx.post(f"{base}/v1/jobs/acme", json={"workflow_type": "ticket"}, headers=key)
        assert made.status_code == 201, made.text
        assert httpx.get(f"{base}/readyz").json() == {"status": "ok"}
    finally:
        server.send_signal(signal.SIGTERM)
        out, err = server.communicate(timeout=30)
    assert server.returncode == 0, err
    assert f"jobledger serve: http://127.0.0.1:{flag_port}" in out
    assert "API keys" in out and "Traceback" not in err
    shown = cli.json("show", "acme", made.json()["job_id"])
    assert shown["status"] == "queued"  # in the store, for the runner to take


def _wait_until_up(server: subprocess.Popen[str], base: str) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if server.poll() is not None:
            pytest.fail(f"serve exited: {server.communicate()}")
        try:
            if httpx.get(f"{base}/healthz", timeout=1).status_code == 200:
                return
        except httpx.TransportError:
            time.sleep(0.1)
    pytest.fail("serve did not answer within 30 s")


def test_serve_without_a_way_to_authenticate_refuses_to_start(tmp_path: Path) -> None:
    cli = make_cli(tmp_path, f"sqlite:///{tmp_path}/jobs.db")
    message = cli.fails(3, "serve")
    assert "serve needs a way to authenticate callers" in message


def test_without_the_http_extra_serve_names_what_to_install(tmp_path: Path) -> None:
    # None in sys.modules: the import system reports the package as missing.
    script = (
        "import sys\n"
        "for name in ('fastapi', 'uvicorn'): sys.modules[name] = None\n"
        "sys.argv = ['jobledger', 'serve']\n"
        "from jobledger.cli import main\n"
        "main()\n"
    )
    result = _python(script, tmp_path)
    assert result.returncode == 3
    assert result.stderr == (
        "error: the HTTP API needs fastapi, uvicorn: pip install 'jobledger[http]'\n"
    )


def test_importing_the_cli_imports_no_web_framework(tmp_path: Path) -> None:
    script = (
        "import sys, jobledger.cli\n"
        "web = ('fastapi', 'uvicorn', 'starlette', 'jinja2')\n"
        "print(sorted(m for m in web if m in sys.modules))"
    )
    result = _python(script, tmp_path)
    assert result.stdout.strip() == "[]", result.stderr


def _python(script: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("JOBLEDGER_")}
    env["PYTHONPATH"] = pythonpath()
    return subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, env=env, cwd=cwd, timeout=60
    )


# ---- the OpenAPI document ------------------------------------------------------------------


def test_docs_openapi_json_is_the_apps_document(make_engine: EngineFactory) -> None:
    """Regenerate with ``python scripts/openapi.py`` after changing the API."""
    engine: Engine = make_engine()
    document = create_app(engine, ApiSettings()).openapi()
    assert OPENAPI.is_file(), "docs/openapi.json is missing: run python scripts/openapi.py"
    assert json.loads(OPENAPI.read_text()) == document, "run python scripts/openapi.py"
    assert {"/v1/jobs/{tenant}", "/healthz", "/readyz"} <= set(document["paths"])
    assert str(Role.OPERATOR) in OPENAPI.read_text()  # the docstrings name the roles


def test_config_show_lists_the_api_settings_and_where_each_came_from(tmp_path: Path) -> None:
    secret = "an-http-secret-an-http-secret-0123456789"
    (tmp_path / "jobledger.toml").write_text(
        f'[http]\njwt_secret = "{secret}"\njwt_issuer = "i"\njwt_audience = "a"\nport = 9000\n'
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("JOBLEDGER_")}
    env |= {"PYTHONPATH": pythonpath(), "JOBLEDGER_HTTP_PORT": "9100"}
    result = subprocess.run(
        [str(JOBLEDGER), "config", "show", "--json"],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    rows = {row["setting"]: row for row in json.loads(result.stdout)["settings"]}
    assert rows["http.port"] == {
        "setting": "http.port",
        "value": 9100,
        "source": "env JOBLEDGER_HTTP_PORT",
    }
    assert rows["http.jwt_secret"] == {
        "setting": "http.jwt_secret",
        "value": "********",
        "source": "file jobledger.toml",
    }
    assert rows["http.host"] == {"setting": "http.host", "value": "127.0.0.1", "source": "default"}
    assert secret not in result.stdout
