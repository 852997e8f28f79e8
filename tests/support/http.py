"""The API as its callers meet it: a REAL uvicorn server on a free loopback port, in a
thread, over an engine on the test's store (SQLite and PostgreSQL), plus the credentials
of each role in each tenant (HS256 JWTs and API keys).

``api_server`` (a fixture in the API tests) is ``start_api(engine, tmp_path, **settings)``."""

from __future__ import annotations

import json
import ssl
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import jwt

from jobledger import FunctionRegistry
from jobledger.api.app import create_app
from jobledger.api.auth import Role, key_sha256
from jobledger.api.connections import Connections
from jobledger.api.server import ApiServer as Serving
from jobledger.api.settings import ApiSettings
from jobledger.domain.steps import ApprovalSpec
from jobledger.engine.engine import Engine
from jobledger.projections import JobViews
from tests.support.engines import agent_steps
from tests.support.workflows import DONE, SEND_100, STEP, linear_registry, review, wait_event

JWT_SECRET = "api-test-secret-api-test-secret-0123456789"
ISSUER = "https://issuer.test"
AUDIENCE = "jobledger-api"
TENANTS = ("acme", "globex")
_TLS = ssl.create_default_context()
APPROVER = "ann"
"""The subject the test approval lists (an approver JWT is issued to her)."""
PROBLEM = "application/problem+json"


def api_registry() -> FunctionRegistry:
    """agent3 (three steps), wait (waits for ``invoice.paid``), gate (an approval by ann)."""
    return linear_registry(
        {
            "agent3": agent_steps(3),
            "wait": [STEP, wait_event("invoice.paid"), DONE],
            "gate": [SEND_100, review(ApprovalSpec(approvers=(APPROVER,))), DONE],
        }
    )


def token(
    *,
    tenants: list[str] | str = "acme",
    roles: list[str] | str = "operator",
    sub: str = "someone",
    expires_in: float = 300,
    issuer: str = ISSUER,
    audience: str = AUDIENCE,
    secret: str = JWT_SECRET,
    **claims: Any,
) -> str:
    """An HS256 bearer JWT (any claim can be overridden or added)."""
    body = {
        "sub": sub,
        "tenants": [tenants] if isinstance(tenants, str) else tenants,
        "roles": [roles] if isinstance(roles, str) else roles,
        "iss": issuer,
        "aud": audience,
        "exp": int(time.time() + expires_in),
        **claims,
    }
    return jwt.encode({k: v for k, v in body.items() if v is not None}, secret, algorithm="HS256")


def api_key(tenant: str, role: Role | str) -> str:
    """The API key of ``role`` in ``tenant`` (every server's keys file lists them all)."""
    return f"jlk-{tenant}-{role}-0123456789abcdef"


def write_keys_file(path: Path) -> Path:
    entries = [
        {
            "sha256": key_sha256(api_key(tenant, role)),
            "subject": f"{role}@{tenant}",
            "tenants": [tenant],
            "roles": [str(role)],
        }
        for tenant in TENANTS
        for role in Role
    ]
    path.write_text(json.dumps({"keys": entries}), encoding="utf-8")
    return path


@dataclass
class ApiServer:
    url: str
    engine: Engine
    settings: ApiSettings

    def client(self, credential: str | None = None, **options: Any) -> httpx.Client:
        headers = {"Authorization": f"Bearer {credential}"} if credential else {}
        # One TLS context for every client: httpx would load the CA bundle again for
        # each (a quarter of a second), though the server speaks plain HTTP.
        return httpx.Client(base_url=self.url, headers=headers, timeout=30, verify=_TLS, **options)

    def as_role(self, role: Role | str, tenant: str = "acme", sub: str = "someone") -> httpx.Client:
        return self.client(token(tenants=tenant, roles=str(role), sub=sub))


@contextmanager
def start_api(
    engine: Engine, directory: Path, *, views: JobViews | None = None, **settings: Any
) -> Iterator[ApiServer]:
    """Serve ``engine`` over HTTP on 127.0.0.1:<free port> until the block ends
    (``views``: the app's listing views, default the store's own)."""
    config = ApiSettings(
        **{
            "jwt_secret": JWT_SECRET,
            "jwt_issuer": ISSUER,
            "jwt_audience": AUDIENCE,
            "api_keys_file": write_keys_file(directory / "api-keys.json"),
            **settings,
        }
    )
    app = create_app(engine, config, views=views)
    # The server the `run --http` supervisor runs: stopping it ends the live streams too.
    server = Serving(app, "127.0.0.1", 0, bell=app.state.live, connections=Connections.of(config))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    if not server.started.wait(15):
        server.stop()
        raise RuntimeError("the API server did not start")
    try:
        yield ApiServer(server.url, engine, config)
    finally:
        server.stop()
        thread.join(15)


def problem(response: httpx.Response, status: int) -> dict[str, Any]:
    """The problem document of an error ``response``, which must have ``status``."""
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == PROBLEM
    body: dict[str, Any] = response.json()
    assert body["status"] == status
    return body
