"""Who may do what through the API, on a real uvicorn server (SQLite and PostgreSQL):
every endpoint x role x another tenant; forged, expired and misdirected credentials; and
the limits (body size, rate, time)."""

from __future__ import annotations

import json
import sqlite3
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import jwt
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa

from jobledger import JobStatus
from jobledger.api.auth import Authenticator, Role
from jobledger.api.settings import ApiSettings
from jobledger.domain.errors import ConfigError, StoreUnavailableError
from jobledger.engine.engine import Engine
from jobledger.orchestration.ports import JobStore
from tests.support.engines import EngineFactory
from tests.support.http import (
    APPROVER,
    AUDIENCE,
    ISSUER,
    JWT_SECRET,
    ApiServer,
    api_key,
    api_registry,
    start_api,
    token,
)
from tests.support.http import problem as problem_body


def problem(response: httpx.Response, status: int) -> dict[str, Any]:
    body = problem_body(response, status)
    assert body["type"].startswith("urn:jobledger:error:")
    return body


# ---- every endpoint x role x another tenant ----------------------------------------------


def gate_job(engine: Engine) -> tuple[str, str]:
    """A fresh acme job waiting for ann's approval: (job id, approval id)."""
    job = f"g-{uuid.uuid4().hex[:8]}"
    engine.submit("acme", job, "gate")
    engine.run_until_idle()
    view = engine.job("acme", job)
    assert view.status is JobStatus.AWAITING_APPROVAL and view.pending_approval_id
    return job, view.pending_approval_id


@dataclass(frozen=True)
class Endpoint:
    name: str
    method: str
    path: str
    """Formatted with tenant, job and approval."""
    role: Role | None
    """What the caller needs in the tenant (None: any role reads)."""
    body: Callable[[], dict[str, Any]] | None = None
    job_scoped: bool = True


ENDPOINTS = [
    Endpoint(
        "submit",
        "POST",
        "/v1/jobs/{tenant}",
        Role.OPERATOR,
        lambda: {"workflow_type": "agent3", "job_id": uuid.uuid4().hex},
        job_scoped=False,
    ),
    Endpoint("list", "GET", "/v1/jobs/{tenant}", None, job_scoped=False),
    Endpoint("get", "GET", "/v1/jobs/{tenant}/{job}", None),
    Endpoint("history", "GET", "/v1/jobs/{tenant}/{job}/history", None),
    Endpoint("at", "GET", "/v1/jobs/{tenant}/{job}/at?version=1", None),
    Endpoint(
        "signal",
        "POST",
        "/v1/jobs/{tenant}/{job}/signals",
        Role.OPERATOR,
        lambda: {"event": "invoice.paid", "signal_id": uuid.uuid4().hex},
    ),
    Endpoint(
        "decide",
        "POST",
        "/v1/jobs/{tenant}/{job}/approvals/{approval}",
        Role.APPROVER,
        lambda: {"decision": "approve"},
    ),
    Endpoint(
        "raise_budget",
        "POST",
        "/v1/jobs/{tenant}/{job}/budget",
        Role.OPERATOR,
        lambda: {"reason": "more", "max_steps": 500},
    ),
    Endpoint(
        "cancel", "POST", "/v1/jobs/{tenant}/{job}/cancel", Role.OPERATOR, lambda: {"reason": "x"}
    ),
    Endpoint("approval", "GET", "/v1/jobs/{tenant}/{job}/approvals/{approval}", None),
    Endpoint("verify", "GET", "/v1/jobs/{tenant}/{job}/verify", Role.AUDITOR),
    Endpoint("verify_tenant", "GET", "/v1/tenants/{tenant}/verify", Role.AUDITOR, job_scoped=False),
]


def call(http: httpx.Client, endpoint: Endpoint, job: str, approval: str) -> httpx.Response:
    path = endpoint.path.format(tenant="acme", job=job, approval=approval)
    body = endpoint.body() if endpoint.body is not None else None
    return http.request(endpoint.method, path, json=body)


def allowed(endpoint: Endpoint, role: Role) -> bool:
    return endpoint.role is None or role in (endpoint.role, Role.ADMIN)


def events(engine: Engine, job: str) -> int:
    return len(engine.history("acme", job))


@pytest.mark.parametrize("endpoint", ENDPOINTS, ids=[e.name for e in ENDPOINTS])
def test_each_role_may_do_what_it_may_and_nothing_else(
    api: ApiServer, engine: Engine, endpoint: Endpoint
) -> None:
    for role in Role:
        job, approval = gate_job(engine)
        before = events(engine, job)
        # The approver (and an admin deciding) is ann, whom the approval lists.
        with api.as_role(role, "acme", sub=APPROVER) as http:
            response = call(http, endpoint, job, approval)
        if allowed(endpoint, role):
            assert response.status_code in (200, 201), (role, response.text)
        else:
            body = problem(response, 403)
            assert body["error"] == "Forbidden" and f"the {endpoint.role} role" in body["detail"]
            assert events(engine, job) == before, "a refused call changed the job"


@pytest.mark.parametrize("endpoint", ENDPOINTS, ids=[e.name for e in ENDPOINTS])
def test_another_tenants_caller_gets_404_whatever_its_role(
    api: ApiServer, engine: Engine, endpoint: Endpoint
) -> None:
    job, approval = gate_job(engine)
    before = events(engine, job)
    with api.as_role(Role.ADMIN, "acme") as http:
        missing = call(http, endpoint, "no-such-job", approval)
    for role in Role:
        # An API key of globex's, and a JWT of globex's under ann's name.
        for credential in (
            api_key("globex", role),
            token(tenants="globex", roles=role, sub=APPROVER),
        ):
            with api.client(credential) as http:
                body = problem(call(http, endpoint, job, approval), 404)
            if endpoint.job_scoped:
                # Word for word what a job that does not exist gets: no id leaks.
                assert body["detail"] == problem(missing, 404)["detail"].replace("no-such-job", job)
                assert body["error"] == "UnknownJobError"
    assert events(engine, job) == before


@pytest.mark.parametrize("endpoint", ENDPOINTS, ids=[e.name for e in ENDPOINTS])
def test_without_credentials_every_endpoint_is_401(
    api: ApiServer, engine: Engine, endpoint: Endpoint
) -> None:
    job, approval = gate_job(engine)
    with api.client() as http:
        response = call(http, endpoint, job, approval)
    assert problem(response, 401)["error"] == "AuthenticationError"
    assert response.headers["www-authenticate"] == "Bearer"


def test_projections_status_is_for_auditors_and_admins(api: ApiServer) -> None:
    for role in Role:
        with api.as_role(role) as http:
            response = http.get("/v1/projections")
        if role in (Role.AUDITOR, Role.ADMIN):
            assert response.status_code == 200
            assert {"partition", "behind"} <= set(response.json()[0])
        else:
            problem(response, 403)
    with api.client() as http:
        problem(http.get("/v1/projections"), 401)


def test_an_every_tenant_credential_sees_every_tenant(api: ApiServer, engine: Engine) -> None:
    engine.submit("globex", "j", "agent3")
    with api.client(token(tenants="*", roles="auditor")) as http:
        assert http.get("/v1/jobs/globex/j").status_code == 200


# ---- approvals: the approver is the authenticated subject --------------------------------


def test_an_approver_the_approval_does_not_list_is_refused(api: ApiServer, engine: Engine) -> None:
    job, approval = gate_job(engine)
    before = events(engine, job)
    with api.as_role(Role.APPROVER, sub="mallory") as http:
        body = problem(
            http.post(f"/v1/jobs/acme/{job}/approvals/{approval}", json={"decision": "approve"}),
            403,
        )
    assert body["error"] == "UnauthorisedDeciderError"
    assert events(engine, job) == before
    assert engine.job("acme", job).status is JobStatus.AWAITING_APPROVAL


def test_the_decider_is_the_caller_never_a_body_field(api: ApiServer, engine: Engine) -> None:
    job, approval = gate_job(engine)
    path = f"/v1/jobs/acme/{job}/approvals/{approval}"
    with api.as_role(Role.APPROVER, sub="mallory") as http:
        spoofed = http.post(path, json={"decision": "approve", "decided_by": APPROVER})
    assert problem(spoofed, 400)["error"] == "InvalidRequest"
    with api.as_role(Role.APPROVER, sub=APPROVER) as http:
        decided = http.post(path, json={"decision": "approve", "comment": "fine"})
    assert decided.status_code == 200, decided.text
    entry = next(e for e in engine.history("acme", job) if e.event_type == "ApprovalDecided")
    assert entry.data["decided_by"] == APPROVER and entry.data["decision"] == "approved"


# ---- credentials: forged, expired, misdirected -------------------------------------------


@pytest.mark.parametrize(
    ("credential", "says"),
    [
        (lambda: token(secret="another-secret-another-secret-0123456789"), "signature"),
        (lambda: token(expires_in=-60), "expired"),
        (lambda: token(audience="someone-else"), "audience"),
        (lambda: token(issuer="https://evil.test"), "issuer"),
        (lambda: token(exp=None), "'exp'"),
        (lambda: token(sub=None), "'sub'"),
        (lambda: token(roles=[]), "roles"),
        (lambda: token(roles="superuser"), "roles"),
        (lambda: _unsigned(), "'none'"),
        (lambda: token()[:-3] + "abc", "signature"),
        (lambda: "not-a-known-api-key", "unknown credential"),
    ],
    ids=[
        "forged",
        "expired",
        "wrong-audience",
        "wrong-issuer",
        "no-exp",
        "no-sub",
        "no-roles",
        "unknown-role",
        "alg-none",
        "tampered",
        "unknown-key",
    ],
)
def test_a_bad_credential_is_401_and_says_why(
    api: ApiServer, engine: Engine, credential: Callable[[], str], says: str
) -> None:
    engine.submit("acme", "j", "agent3")
    with api.client(credential()) as http:
        body = problem(http.get("/v1/jobs/acme/j"), 401)
    assert says in body["detail"]


@pytest.mark.parametrize(
    ("offsets", "passes"),
    [
        ({"exp": -10}, True),
        ({"nbf": 10}, True),
        ({"iat": 10}, True),
        ({"exp": -45}, False),
        ({"nbf": 45}, False),
    ],
    ids=["expired-10s-ago", "valid-in-10s", "issued-in-10s", "expired-45s-ago", "valid-in-45s"],
)
def test_a_jwt_is_judged_with_the_configured_clock_skew(
    api: ApiServer, engine: Engine, offsets: dict[str, int], passes: bool
) -> None:
    """An issuer's clock ahead by seconds does not refuse fresh tokens; the leeway is
    30 s by default (JOBLEDGER_HTTP_JWT_LEEWAY_SECONDS), no more."""
    engine.submit("acme", "j", "agent3")
    # Times are taken now, not at collection: a long run would otherwise age them.
    claims = {name: int(time.time()) + offset for name, offset in offsets.items()}
    with api.client(token(**claims)) as http:
        response = http.get("/v1/jobs/acme/j")
    assert response.status_code == (200 if passes else 401), response.text


def _unsigned() -> str:
    claims = {"sub": "x", "tenants": ["acme"], "roles": ["admin"], "iss": ISSUER, "aud": AUDIENCE}
    return jwt.encode({**claims, "exp": int(time.time()) + 60}, None, algorithm="none")


@pytest.mark.parametrize("kind", ["RS256", "ES256"])
def test_jwks_keys_verify_rs256_and_es256_and_refuse_algorithm_confusion(
    engine: Engine, tmp_path: Path, kind: str
) -> None:
    private: Any = (
        rsa.generate_private_key(public_exponent=65537, key_size=2048)
        if kind == "RS256"
        else ec.generate_private_key(ec.SECP256R1())
    )
    jwk = json.loads(jwt.algorithms.get_default_algorithms()[kind].to_jwk(private.public_key()))
    (tmp_path / "jwks.json").write_text(json.dumps({"keys": [{**jwk, "kid": "k1", "alg": kind}]}))
    claims = {"sub": "x", "tenants": ["acme"], "roles": ["auditor"], "iss": ISSUER}
    claims |= {"aud": AUDIENCE, "exp": int(time.time()) + 60}
    good = jwt.encode(claims, private, algorithm=kind, headers={"kid": "k1"})
    unknown_kid = jwt.encode(claims, private, algorithm=kind, headers={"kid": "k9"})
    pem = private.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    # The classic confusion: HS256 "signed" with the public key as the secret. With no
    # HS256 secret configured, HS256 is simply not accepted.
    confused = _hs256_with(claims, pem)
    engine.submit("acme", "j", "agent3")
    with start_api(engine, tmp_path, jwt_secret=None, jwks_file=tmp_path / "jwks.json") as api:
        with api.client(good) as http:
            assert http.get("/v1/jobs/acme/j").status_code == 200
        with api.client(unknown_kid) as http:
            assert "unknown key" in problem(http.get("/v1/jobs/acme/j"), 401)["detail"]
        with api.client(confused) as http:
            assert "'HS256'" in problem(http.get("/v1/jobs/acme/j"), 401)["detail"]


def _hs256_with(claims: dict[str, Any], key: bytes) -> str:
    """HS256 over ``key`` by hand (pyjwt itself refuses a PEM as an HMAC secret)."""
    import base64
    import hashlib
    import hmac

    def b64(data: bytes) -> str:
        return base64.urlsafe_b64encode(data).rstrip(b"=").decode()

    head = b64(json.dumps({"alg": "HS256", "typ": "JWT", "kid": "k1"}).encode())
    body = b64(json.dumps(claims).encode())
    signature = hmac.new(key, f"{head}.{body}".encode(), hashlib.sha256).digest()
    return f"{head}.{body}.{b64(signature)}"


# ---- limits --------------------------------------------------------------------------


def test_an_oversized_body_is_413_and_nothing_is_written(engine: Engine, tmp_path: Path) -> None:
    big = {"workflow_type": "agent3", "job_id": "big", "input": {"blob": "x" * 5000}}
    with (
        start_api(engine, tmp_path, max_body_bytes=4096) as api,
        api.as_role(Role.OPERATOR) as http,
    ):
        declared = http.post("/v1/jobs/acme", json=big)
        # Chunked: no Content-Length up front, the body grows past the limit.
        chunks = (part.encode() for part in [json.dumps(big)[:3000], json.dumps(big)[3000:]])
        streamed = http.post(
            "/v1/jobs/acme", content=chunks, headers={"content-type": "application/json"}
        )
        small = http.post("/v1/jobs/acme", json={"workflow_type": "agent3", "job_id": "ok"})
    for response in (declared, streamed):
        assert "larger than 4096 bytes" in problem(response, 413)["detail"]
    assert small.status_code == 201
    with pytest.raises(Exception, match="no job 'big'"):
        engine.job("acme", "big")


def test_a_credential_over_its_rate_gets_429_with_retry_after(
    engine: Engine, tmp_path: Path
) -> None:
    engine.submit("acme", "j", "agent3")
    with start_api(engine, tmp_path, rate_limit_per_minute=6, rate_limit_burst=3) as api:
        greedy = api.as_role(Role.AUDITOR, sub="greedy")
        codes = [greedy.get("/v1/jobs/acme/j").status_code for _ in range(3)]
        refused = greedy.get("/v1/jobs/acme/j")
        with api.as_role(Role.AUDITOR, sub="other") as http:
            other = http.get("/v1/jobs/acme/j")
        greedy.close()
    assert codes == [200, 200, 200]
    assert problem(refused, 429)["error"] == "RateLimited"
    assert 1 <= int(refused.headers["retry-after"]) <= 10
    assert other.status_code == 200, "another credential has its own allowance"


class SlowStore:
    """A store whose reads take a while (a slow database)."""

    def __init__(self, inner: JobStore, seconds: float) -> None:
        self.inner = inner
        self.seconds = seconds

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def events(self, *args: Any, **kwargs: Any) -> Any:
        time.sleep(self.seconds)
        return self.inner.events(*args, **kwargs)


def test_a_request_over_its_time_is_503_with_retry_after(
    make_engine: EngineFactory, tmp_path: Path
) -> None:
    # The timeout is the server's for every request, /healthz included: 1 s leaves the
    # health check room on a loaded machine, the 3 s read is well past it.
    engine = make_engine(registry=api_registry(), wrap_store=lambda s: SlowStore(s, 3.0))
    engine.submit("acme", "j", "agent3")
    with (
        start_api(engine, tmp_path, request_timeout_seconds=1.0) as api,
        api.as_role(Role.AUDITOR) as http,
    ):
        # The history reads the log (the job itself is answered from the loaded aggregate).
        response = http.get("/v1/jobs/acme/j/history")
        health = http.get("/healthz")
    body = problem(response, 503)
    assert body["error"] == "RequestTimeout" and response.headers["retry-after"] == "1"
    assert health.status_code == 200


class DownStore(SlowStore):
    def events(self, *args: Any, **kwargs: Any) -> Any:
        raise StoreUnavailableError("lost postgresql://app:hunter2@db:5432/jobs")


def test_a_store_failure_is_503_try_again(make_engine: EngineFactory, tmp_path: Path) -> None:
    engine = make_engine(registry=api_registry(), wrap_store=lambda s: DownStore(s, 0))
    engine.submit("acme", "j", "agent3")
    with start_api(engine, tmp_path) as api, api.as_role(Role.AUDITOR) as http:
        response = http.get("/v1/jobs/acme/j/history")
    body = problem(response, 503)
    assert body["error"] == "StoreUnavailableError" and response.headers["retry-after"] == "1"
    assert "hunter2" not in response.text


# ---- the credential files and claim shapes (no server needed) -----------------------------


def test_claims_may_name_one_tenant_and_space_separated_roles() -> None:
    authenticator = Authenticator(secret=JWT_SECRET, issuer=ISSUER, audience=AUDIENCE)
    claims = {"sub": "ann", "tenant": "acme", "roles": "approver auditor", "iss": ISSUER}
    claims |= {"aud": AUDIENCE, "exp": int(time.time()) + 60}
    who = authenticator.authenticate(jwt.encode(claims, JWT_SECRET, algorithm="HS256"))
    assert who.tenants == {"acme"} and who.roles == {Role.APPROVER, Role.AUDITOR}
    assert who.may(Role.APPROVER, "acme") and not who.may(Role.OPERATOR, "acme")
    assert not who.sees("globex")


@pytest.mark.parametrize(
    ("name", "content", "says"),
    [
        ("keys.json", "{nope", "is not JSON"),
        ("keys.json", '{"keys": [{"sha256": "abc", "subject": "x"}]}', "keys.0.sha256"),
        ("keys.json", '{"keys": [], "extra": 1}', "extra"),
        ("jwks.json", "{}", "not usable"),
        ("missing.json", None, "cannot read"),
    ],
)
def test_an_unusable_keys_or_jwks_file_is_one_clear_config_error(
    tmp_path: Path, name: str, content: str | None, says: str
) -> None:
    path = tmp_path / name
    if content is not None:
        path.write_text(content)
    field = "jwks_file" if name == "jwks.json" else "api_keys_file"
    settings = ApiSettings(
        **{field: path},
        **({"jwt_issuer": ISSUER, "jwt_audience": AUDIENCE} if field == "jwks_file" else {}),
    )
    with pytest.raises(ConfigError, match=says) as raised:
        Authenticator.from_settings(settings)
    assert str(path) in str(raised.value)


def test_a_jwks_key_of_another_algorithm_is_refused_at_start(tmp_path: Path) -> None:
    key = jwt.algorithms.get_default_algorithms()["HS256"].to_jwk(b"k" * 32)
    (tmp_path / "jwks.json").write_text(json.dumps({"keys": [{**json.loads(key), "kid": "h"}]}))
    settings = ApiSettings(
        jwks_file=tmp_path / "jwks.json", jwt_issuer=ISSUER, jwt_audience=AUDIENCE
    )
    with pytest.raises(ConfigError, match="not RS256 or ES256"):
        Authenticator.from_settings(settings)


def test_an_unknown_route_is_a_problem_too(api: ApiServer) -> None:
    with api.as_role(Role.ADMIN) as http:
        assert problem(http.get("/v1/nothing/here/at/all/really"), 404)["error"] == "NotFound"
        assert problem(http.delete("/v1/jobs/acme/j"), 405)["error"] == "MethodNotAllowed"


class DriverErrorStore(SlowStore):
    """A driver's own error surfacing where the library does not translate it."""

    def events(self, *args: Any, **kwargs: Any) -> Any:
        raise sqlite3.OperationalError("database is locked")


class BuggyStore(SlowStore):
    def events(self, *args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("a bug with a secret inside")


def test_a_driver_error_is_503_and_a_bug_is_a_500_problem_without_its_message(
    make_engine: EngineFactory, tmp_path: Path
) -> None:
    make_engine(registry=api_registry()).submit("acme", "j", "agent3")
    responses = []
    for wrapper in (DriverErrorStore, BuggyStore):
        engine = make_engine(registry=api_registry(), wrap_store=lambda s, w=wrapper: w(s, 0))
        with start_api(engine, tmp_path) as api, api.as_role(Role.AUDITOR) as http:
            responses.append(http.get("/v1/jobs/acme/j/history"))
    driver, bug = responses
    assert problem(driver, 503)["error"] == "StoreUnavailableError"
    assert driver.headers["retry-after"] == "1" and "database is locked" in driver.text
    assert problem(bug, 500)["error"] == "InternalError"
    assert "secret" not in bug.text
