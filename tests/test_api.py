"""The HTTP API against a real uvicorn server on a loopback port, on SQLite and PostgreSQL."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from jobledger import JobStatus
from jobledger.adapters.clock import FakeClock
from jobledger.adapters.signing import Ed25519Signer, Keyring, SigningKey, Window
from jobledger.api import problems
from jobledger.api.auth import Role
from jobledger.audit.errors import NoSuchVersionError
from jobledger.cli.session import Exit, exit_code
from jobledger.domain import errors
from jobledger.domain.errors import StoreUnavailableError
from jobledger.domain.identity import job_uuid
from jobledger.engine.engine import Engine
from jobledger.projections import JobViews
from tests.support.audit import RawEvents
from tests.support.engines import EngineFactory, store_of, writes
from tests.support.http import APPROVER, ApiServer, api_key, api_registry, problem, start_api, token

# ---- health ----------------------------------------------------------------------------


def test_health_and_readiness_answer_without_credentials(api: ApiServer) -> None:
    with api.client() as http:
        assert http.get("/healthz").json() == {"status": "ok"}
        assert http.get("/readyz").json() == {"status": "ok"}


# ---- reading a job ---------------------------------------------------------------------


def test_a_job_is_read_with_a_jwt_or_an_api_key(api: ApiServer, engine: Engine) -> None:
    engine.submit("acme", "j1", "agent3", input={"q": 1})

    with api.as_role(Role.AUDITOR) as http:
        body = http.get("/v1/jobs/acme/j1").json()
    with api.client(api_key("acme", Role.OPERATOR)) as http:
        again = http.get("/v1/jobs/acme/j1").json()

    assert body["job_id"] == "j1" and body["state"] == {"q": 1} and body["status"] == "queued"
    assert again == body


def test_another_tenants_job_is_not_found_exactly_as_a_missing_one(
    api: ApiServer, engine: Engine
) -> None:
    engine.submit("acme", "j1", "agent3")

    with api.client(token(tenants="globex", roles="admin")) as http:
        hidden = problem(http.get("/v1/jobs/acme/j1"), 404)
    with api.client(token(tenants="acme", roles="admin")) as http:
        missing = problem(http.get("/v1/jobs/acme/nope"), 404)

    assert hidden["error"] == missing["error"] == "UnknownJobError"
    assert hidden["detail"] == "no job 'j1' for tenant 'acme'"


def test_no_credentials_is_401_with_a_bearer_challenge(api: ApiServer) -> None:
    with api.client() as http:
        response = http.get("/v1/jobs/acme/j1")
    problem(response, 401)
    assert response.headers["www-authenticate"] == "Bearer"


def test_readiness_is_503_when_the_store_does_not_answer(engine: Engine, tmp_path: Path) -> None:
    class DeadViews(JobViews):
        def lag(self) -> Any:
            raise StoreUnavailableError("the store is gone")

    views = DeadViews(store_of(engine))
    with start_api(engine, tmp_path, views=views) as server, server.client() as http:
        ready = http.get("/readyz")
        alive = http.get("/healthz")
    assert problem(ready, 503)["detail"] == "the store does not answer: the store is gone"
    assert alive.status_code == 200


# ---- submit ----------------------------------------------------------------------------


def test_submit_is_201_then_200_with_the_same_job_for_the_same_key(
    api: ApiServer, engine: Engine
) -> None:
    request = {"workflow_type": "agent3", "input": {"n": 1}, "idempotency_key": "order-7"}
    with api.as_role(Role.OPERATOR) as http:
        first = http.post("/v1/jobs/acme", json=request)
        again = http.post("/v1/jobs/acme", json=request)
        by_header = http.post(
            "/v1/jobs/acme",
            json={"workflow_type": "agent3", "input": {"n": 1}},
            headers={"Idempotency-Key": "order-7"},
        )
        mismatch = http.post(
            "/v1/jobs/acme",
            json={"workflow_type": "agent3", "idempotency_key": "a"},
            headers={"Idempotency-Key": "b"},
        )
    assert first.status_code == 201, first.text
    job = first.json()["job_id"]
    assert first.headers["location"] == f"/v1/jobs/acme/{job}"
    assert again.status_code == 200 and again.json()["job_id"] == job
    assert by_header.status_code == 200 and by_header.json()["job_id"] == job
    assert "differ" in problem(mismatch, 400)["detail"]
    assert len(engine.history("acme", job)) == 1  # one Submitted, no second effect


def test_a_key_reused_for_a_different_request_is_422_naming_the_first_job_and_the_change(
    api: ApiServer, engine: Engine
) -> None:
    """As the IETF Idempotency-Key draft says: not the first job as if this request had
    made it (it made nothing), but a refusal saying which job holds the key and why."""
    request = {"workflow_type": "agent3", "input": {"n": 1}}
    with api.as_role(Role.OPERATOR) as http:
        first = http.post("/v1/jobs/acme", json=request, headers={"Idempotency-Key": "k-1"})
        other_input = http.post(
            "/v1/jobs/acme",
            json={**request, "input": {"n": 2}},
            headers={"Idempotency-Key": "k-1"},
        )
        other_job = http.post(
            "/v1/jobs/acme",
            json={**request, "job_id": "mine", "correlation_id": "c-9"},
            headers={"Idempotency-Key": "k-1"},
        )
        replay = http.post("/v1/jobs/acme", json=request, headers={"Idempotency-Key": "k-1"})
        jobs = http.get("/v1/jobs/acme").json()["jobs"]
    job = first.json()["job_id"]
    refused = problem(other_input, 422)
    assert refused["error"] == "IdempotencyKeyReusedError"
    assert refused["detail"] == (
        f"idempotency key 'k-1' of tenant 'acme' was used for job '{job}' by another "
        "request; this request differs in input"
    )
    assert problem(other_job, 422)["detail"].endswith(
        f"differs in job_id 'mine' (the first: '{job}'), correlation_id 'c-9' (the first: None)"
    )
    assert replay.status_code == 200 and replay.json()["job_id"] == job
    assert [row["job_id"] for row in jobs] == [job]
    assert len(engine.history("acme", job)) == 1


def test_submitting_a_job_again_differently_is_409(api: ApiServer) -> None:
    with api.as_role(Role.OPERATOR) as http:
        made = http.post("/v1/jobs/acme", json={"workflow_type": "agent3", "job_id": "j"})
        same = http.post("/v1/jobs/acme", json={"workflow_type": "agent3", "job_id": "j"})
        other = http.post(
            "/v1/jobs/acme", json={"workflow_type": "agent3", "job_id": "j", "input": {"x": 1}}
        )
    assert (made.status_code, same.status_code) == (201, 200)
    assert problem(other, 409)["error"] == "JobConflictError"


@pytest.mark.parametrize(
    ("body", "says"),
    [
        ({"workflow_type": "nope"}, "unknown workflow"),
        ({"workflow_type": "agent3", "job_id": "bad\u0007id"}, "control characters"),
        ({"workflow_type": "agent3", "surprise": 1}, "surprise"),
        ({"workflow_type": "agent3", "input": [1, 2]}, "input"),
    ],
)
def test_a_bad_submit_is_400_and_names_what_was_wrong(
    api: ApiServer, body: dict[str, Any], says: str
) -> None:
    with api.as_role(Role.OPERATOR) as http:
        assert says in problem(http.post("/v1/jobs/acme", json=body), 400)["detail"]


def test_a_body_that_is_not_json_is_400(api: ApiServer) -> None:
    with api.as_role(Role.OPERATOR) as http:
        response = http.post(
            "/v1/jobs/acme", content=b"{nope", headers={"content-type": "application/json"}
        )
    assert problem(response, 400)["error"] == "InvalidRequest"


# ---- bad input at the door: a 400 saying what was wrong, never a 500 --------------------


@pytest.mark.parametrize(
    ("body", "says"),
    [
        (rb'{"workflow_type": "agent3", "input": {"a": "\ud800"}}', "U+D800"),
        (rb'{"workflow_type": "agent3", "input": {"\udc00": 1}}', "U+DC00"),
        (rb'{"workflow_type": "agent3", "input": {"a": ["\ud83d"]}}', "U+D83D"),
    ],
    ids=["value", "key", "half-a-pair"],
)
def test_a_lone_surrogate_in_the_body_is_400_and_the_connection_goes_on(
    api: ApiServer, engine: Engine, body: bytes, says: str
) -> None:
    before = writes(engine)
    with api.as_role(Role.OPERATOR) as http:
        refused = http.post(
            "/v1/jobs/acme", content=body, headers={"content-type": "application/json"}
        )
        after = http.get("/healthz")  # the same connection: it was not dropped
    detail = problem(refused, 400)["detail"]
    assert (
        detail
        == f"job input holds a lone surrogate ({says}), not text: a string must be valid Unicode"
    )
    assert after.status_code == 200
    assert writes(engine) == before


@pytest.mark.parametrize("job_id", [".", ".."])
def test_a_dot_job_id_is_400_not_a_location_that_cannot_be_followed(
    api: ApiServer, job_id: str
) -> None:
    with api.as_role(Role.OPERATOR) as http:
        refused = http.post("/v1/jobs/acme", json={"workflow_type": "agent3", "job_id": job_id})
        listed = http.get("/v1/jobs/acme").json()["jobs"]
    assert problem(refused, 400)["detail"] == (
        f"job_id must not be '.' or '..': a URL path resolves it away, got {job_id!r}"
    )
    assert listed == []


@pytest.mark.parametrize(
    ("path", "says"),
    [
        (b"/v1/jobs/acme/%%32%46", "a '%' that starts no %XX escape"),
        (b"/v1/jobs/acme/100%", "a '%' that starts no %XX escape"),
        (b"/v1/jobs/acme/%zz", "a '%' that starts no %XX escape"),
        (b"/v1/jobs/acme/%FF", "not UTF-8 once its %XX escapes are decoded"),
    ],
    ids=["double", "trailing", "not-hex", "not-utf8"],
)
def test_a_path_whose_escapes_are_broken_is_400_not_decoded_twice(
    api: ApiServer, engine: Engine, path: bytes, says: str
) -> None:
    """%%32%46 decoded once is the id '%2F'; the router decoded it again, to '/'. A '%'
    that starts no escape is not a path (RFC 3986 2.1): refused, not guessed at."""
    engine.submit("acme", "/", "agent3")
    with api.as_role(Role.AUDITOR) as http:
        answer = http.get(path.decode("latin-1"))
        slash = http.get("/v1/jobs/acme/%2F")
        percent = http.get("/v1/jobs/acme/%252F")
    assert says in problem(answer, 400)["detail"]
    assert slash.json()["job_id"] == "/"
    assert problem(percent, 404)["detail"] == "no job '%2F' for tenant 'acme'"


@pytest.mark.parametrize(
    "last_event_id",
    ["²".encode(), "٣".encode(), b"1" * 30, b"1_0", b"+1", b"-1", b"0x1", b"\xff"],
    ids=[
        "superscript",
        "arabic-digit",
        "30-digits",
        "underscore",
        "plus",
        "negative",
        "hex",
        "byte",
    ],
)
def test_a_last_event_id_that_is_not_a_version_is_400_not_a_cut_stream(
    api: ApiServer, engine: Engine, last_event_id: bytes
) -> None:
    engine.submit("acme", "j1", "agent3")
    with api.as_role(Role.AUDITOR) as http:
        answer = http.get("/v1/jobs/acme/j1/events", headers={"Last-Event-ID": last_event_id})
    detail = problem(answer, 400)["detail"]
    assert detail.startswith("Last-Event-ID must be an event version") or detail.startswith(
        "the job has no event v"
    ), detail


# ---- reading ---------------------------------------------------------------------------


def test_list_pages_through_every_job_with_the_cursor_and_filters(
    api: ApiServer, engine: Engine, clock: FakeClock
) -> None:
    for n in range(5):
        engine.submit("acme", f"j{n}", "agent3")
        clock.advance(timedelta(seconds=1))
    engine.submit("globex", "theirs", "agent3")
    engine.tick("acme", "j0")  # j0 completes
    seen: list[str] = []
    after: str | None = None
    with api.as_role(Role.AUDITOR) as http:
        while True:
            params: dict[str, Any] = {"limit": 2, **({"after": after} if after else {})}
            page = http.get("/v1/jobs/acme", params=params).json()
            seen += [row["job_id"] for row in page["jobs"]]
            after = page["next_cursor"]
            if after is None:
                break
        done = http.get("/v1/jobs/acme", params={"status": "completed"}).json()
        bad = http.get("/v1/jobs/acme", params={"status": "finished"})
        bad_cursor = http.get("/v1/jobs/acme", params={"after": "zz"})
    assert sorted(seen) == [f"j{n}" for n in range(5)] and len(seen) == 5
    assert seen[0] == "j0"  # newest change first
    assert [row["job_id"] for row in done["jobs"]] == ["j0"] and done["next_cursor"] is None
    assert "unknown status 'finished'" in problem(bad, 400)["detail"]
    assert "not a listing cursor" in problem(bad_cursor, 400)["detail"]


def test_history_pages_carry_the_chain_hashes(api: ApiServer, engine: Engine) -> None:
    engine.submit("acme", "j", "agent3")
    engine.run_until_idle()
    recorded = engine.history("acme", "j")
    events: list[dict[str, Any]] = []
    after = 0
    with api.as_role(Role.AUDITOR) as http:
        while after is not None:
            page = http.get("/v1/jobs/acme/j/history", params={"after": after, "limit": 3}).json()
            events += page["events"]
            after = page["next_version"]
    assert [e["version"] for e in events] == [entry.version for entry in recorded]
    assert [e["chain_hash"] for e in events] == [entry.chain_hash for entry in recorded]
    assert events[0]["event_type"] == "Submitted"


def test_the_job_at_a_version_or_a_time(api: ApiServer, engine: Engine, clock: FakeClock) -> None:
    engine.submit("acme", "j", "agent3")
    submitted = clock.now()
    clock.advance(timedelta(minutes=1))
    engine.run_until_idle()
    with api.as_role(Role.AUDITOR) as http:
        first = http.get("/v1/jobs/acme/j/at", params={"version": 1}).json()
        then = http.get("/v1/jobs/acme/j/at", params={"at": submitted.isoformat()}).json()
        beyond = http.get("/v1/jobs/acme/j/at", params={"version": 999})
        both = http.get("/v1/jobs/acme/j/at", params={"version": 1, "at": submitted.isoformat()})
        now = http.get("/v1/jobs/acme/j").json()
    assert (first["version"], first["status"]) == (1, "queued")
    assert then == first
    assert now["status"] == "completed"
    assert "no v999" in problem(beyond, 404)["detail"]
    assert "exactly one" in problem(both, 400)["detail"]


# ---- inputs ----------------------------------------------------------------------------


def test_a_signal_resumes_a_waiting_job_once(api: ApiServer, engine: Engine) -> None:
    engine.submit("acme", "j", "wait")
    engine.run_until_idle()
    body = {"event": "invoice.paid", "signal_id": "pay-1", "payload": {"paid": 120}}
    with api.as_role(Role.OPERATOR) as http:
        first = http.post("/v1/jobs/acme/j/signals", json=body).json()
        again = http.post("/v1/jobs/acme/j/signals", json=body).json()
    assert first["outcome"] == "resumed" and first["job"]["state"]["paid"] == 120
    assert again["outcome"] == "duplicate"
    engine.run_until_idle()
    assert engine.job("acme", "j").status is JobStatus.COMPLETED


@pytest.mark.parametrize("job_id", ["reports/2026/q1", "100%/done", "a%2Fb", "café ok"])
def test_a_job_id_with_slashes_or_percents_is_reached_with_its_segment_encoded(
    api: ApiServer, engine: Engine, job_id: str
) -> None:
    """Ids may hold ``/`` and ``%``: a client encodes the id whole in its segment
    (``quote(id, safe="")``) and reaches exactly that job, never another."""
    segment = quote(job_id, safe="")
    body = {"event": "invoice.paid", "signal_id": "pay-1", "payload": {}}
    with api.as_role(Role.OPERATOR) as http:
        made = http.post("/v1/jobs/acme", json={"job_id": job_id, "workflow_type": "wait"})
        engine.run_until_idle()
        read = http.get(f"/v1/jobs/acme/{segment}")
        history = http.get(f"/v1/jobs/acme/{segment}/history")
        signalled = http.post(f"/v1/jobs/acme/{segment}/signals", json=body)
    assert made.status_code == 201, made.text
    assert made.headers["location"] == f"/v1/jobs/acme/{segment}"
    assert read.status_code == 200, read.text
    assert read.json()["job_id"] == job_id
    assert history.json()["events"][0]["version"] == 1
    assert signalled.json()["outcome"] == "resumed"
    assert engine.job("acme", job_id).status is not JobStatus.WAITING_EVENT


def test_a_stale_or_repeated_decision_is_409(api: ApiServer, engine: Engine) -> None:
    engine.submit("acme", "j", "gate")
    engine.run_until_idle()
    approval = engine.job("acme", "j").pending_approval_id
    path = f"/v1/jobs/acme/j/approvals/{approval}"
    with api.as_role(Role.APPROVER, sub=APPROVER) as http:
        shown = http.get("/v1/jobs/acme/j").json()["pending_approval"]
        stale = http.post(path, json={"decision": "approve", "action_sha256": "0" * 64})
        ok = http.post(path, json={"decision": "approve", "action_sha256": shown["action_sha256"]})
        repeated = http.post(path, json={"decision": "reject"})
    assert shown["approvers"] == [APPROVER] and len(shown["action_sha256"]) == 64
    assert problem(stale, 409)["error"] == "StaleApprovalError"
    assert ok.status_code == 200, ok.text
    assert problem(repeated, 409)["error"] == "ApprovalAlreadyDecidedError"


def test_an_approvers_inbox_lists_what_names_them_oldest_first_with_what_is_approved(
    api: ApiServer, engine: Engine
) -> None:
    for tenant, job in (("acme", "g1"), ("acme", "g2"), ("globex", "g3")):
        engine.submit(tenant, job, "gate")
        engine.run_until_idle()
    with (
        api.as_role(Role.APPROVER, sub=APPROVER) as ann,
        api.as_role(Role.APPROVER, sub="bob") as bob,
        api.as_role(Role.OPERATOR) as operator,
    ):
        inbox = ann.get("/v1/approvals").json()
        shown = ann.get("/v1/jobs/acme/g1").json()["pending_approval"]
        not_bobs = bob.get("/v1/approvals").json()
        refused = operator.get("/v1/approvals")
    # globex's request names ann too, but this credential is acme's only.
    assert [(a["tenant_id"], a["job_id"]) for a in inbox] == [("acme", "g1"), ("acme", "g2")]
    first = inbox[0]
    assert first["approval_id"] == shown["approval_id"]
    assert first["action_sha256"] == shown["action_sha256"]
    assert first["approvers"] == [APPROVER] and first["open"] is True
    assert first["step_name"] == "review" and first["outcome"] is None
    assert not_bobs == []
    assert problem(refused, 403)["error"] == "Forbidden"


def test_one_approval_request_reads_as_it_stands_and_says_how_it_ended(
    api: ApiServer, engine: Engine
) -> None:
    engine.submit("acme", "g", "gate")
    engine.run_until_idle()
    approval = engine.job("acme", "g").pending_approval_id
    path = f"/v1/jobs/acme/g/approvals/{approval}"
    with api.as_role(Role.APPROVER, sub=APPROVER) as ann, api.as_role(Role.AUDITOR) as auditor:
        before = auditor.get(path).json()
        decided = ann.post(
            path, json={"decision": "approve", "action_sha256": before["action_sha256"]}
        )
        after = auditor.get(path).json()
        unknown = auditor.get("/v1/jobs/acme/g/approvals/nothing-asked")
        inbox = ann.get("/v1/approvals").json()
    assert before["open"] is True and before["outcome"] is None
    assert decided.status_code == 200, decided.text
    assert after["open"] is False and f"approved by {APPROVER}" in after["outcome"]
    assert problem(unknown, 404)["error"] == "UnknownApproval"
    assert inbox == []


def test_cancel_then_raise_budget_is_409_and_records_who(api: ApiServer, engine: Engine) -> None:
    engine.submit("acme", "j", "wait")
    engine.run_until_idle()
    with api.as_role(Role.OPERATOR, sub="olga") as http:
        cancelled = http.post("/v1/jobs/acme/j/cancel", json={"reason": "not needed"})
        late = http.post("/v1/jobs/acme/j/budget", json={"reason": "more", "max_steps": 9})
    assert cancelled.json()["status"] == "cancelled"
    assert problem(late, 409)["error"] == "JobFinishedError"
    entry = engine.history("acme", "j")[-1]
    assert entry.event_type == "Cancelled" and entry.data["cancelled_by"] == "olga"


def test_a_budget_raise_records_the_caller_and_lifts_the_limit(
    api: ApiServer, engine: Engine
) -> None:
    engine.submit("acme", "j", "agent3", budget={"max_steps": 1})
    engine.run_until_idle()
    assert engine.job("acme", "j").status is JobStatus.BUDGET_EXCEEDED
    with api.as_role(Role.OPERATOR, sub="olga") as http:
        raised = http.post("/v1/jobs/acme/j/budget", json={"reason": "worth it", "max_steps": 10})
    assert raised.status_code == 200, raised.text
    entry = next(e for e in engine.history("acme", "j") if e.event_type == "BudgetRaised")
    assert entry.data["raised_by"] == "olga" and entry.data["reason"] == "worth it"
    engine.run_until_idle()
    assert engine.job("acme", "j").status is JobStatus.COMPLETED


# ---- audit -----------------------------------------------------------------------------


def test_verify_finds_an_edited_event_in_the_job_and_the_tenant(
    api: ApiServer, engine: Engine, store_url: str
) -> None:
    for job in ("j1", "j2"):
        engine.submit("acme", job, "agent3")
    engine.submit("globex", "theirs", "agent3")
    engine.run_until_idle()
    RawEvents(store_url).replace_in_state(job_uuid("acme", "j2"), 3, '"s1":true', '"s1":false')
    with api.as_role(Role.AUDITOR) as http:
        intact = http.get("/v1/jobs/acme/j1/verify").json()
        broken = http.get("/v1/jobs/acme/j2/verify").json()
        tenant = http.get("/v1/tenants/acme/verify").json()
    assert intact == {
        "tenant_id": "acme",
        "job_id": "j1",
        "intact": True,
        "signatures_checked": False,
        "broken_at": None,
        "event_type": None,
        "reason": None,
    }
    assert (broken["intact"], broken["broken_at"], broken["event_type"]) == (
        False,
        3,
        "Job.StepRecorded",
    )
    assert broken["reason"].startswith("edited: ")
    assert (tenant["jobs"], tenant["intact"]) == (2, False)  # globex's job is not counted
    assert [b["job_id"] for b in tenant["broken"]] == ["j2"]


def test_verify_holds_events_to_the_configured_keyring(
    make_engine: EngineFactory, tmp_path: Path
) -> None:
    since = Window(datetime(2025, 1, 1, tzinfo=UTC))
    key = Ed25519Signer([SigningKey("k1", Ed25519PrivateKey.generate(), since)])
    keyring = tmp_path / "keyring.json"
    keyring.write_text(json.dumps(Keyring(key.public_keys()).document()))
    engine = make_engine(registry=api_registry(), signer=key, config={"keyring": keyring})
    engine.submit("acme", "signed", "agent3")
    make_engine(registry=api_registry()).submit("acme", "unsigned", "agent3")
    with start_api(engine, tmp_path) as api, api.as_role(Role.AUDITOR) as http:
        signed = http.get("/v1/jobs/acme/signed/verify").json()
        unsigned = http.get("/v1/jobs/acme/unsigned/verify").json()
        tenant = http.get("/v1/tenants/acme/verify").json()
    assert (signed["intact"], signed["signatures_checked"]) == (True, True)
    assert (unsigned["intact"], unsigned["broken_at"]) == (False, 1)
    assert unsigned["reason"] == "unsigned: the event is not signed"
    assert tenant["signatures_checked"] is True
    assert [b["job_id"] for b in tenant["broken"]] == ["unsigned"]


# ---- errors map as the CLI's exit codes do -----------------------------------------------


@pytest.mark.parametrize(
    "error",
    [
        errors.UnknownJobError("t", "j"),
        errors.UnknownWorkflowError("w"),
        errors.JobConflictError("c"),
        errors.IdempotencyKeyReusedError("t", "k", "j", ("input",), "input"),
        errors.InvalidPayloadError("p"),
        errors.ConfigError("c"),
        errors.StoreMissingError("m"),
        errors.StoreUnavailableError("u"),
        errors.StoreUnreachableError("u"),
        errors.BrokenHistoryError("u", 3),
        errors.VersionConflict("v"),
        errors.ConcurrencyError("c"),
        errors.DuplicateKeyError("signal", "k"),
        errors.JobNotWaitingError("n"),
        errors.JobFinishedError("f"),
        errors.InvalidTokenError("t"),
        errors.ExpiredTokenError("t"),
        errors.TokenMismatchError("t"),
        errors.TokenReplayedError("t"),
        errors.StaleApprovalError("s"),
        errors.ApprovalAlreadyDecidedError("a"),
        errors.UnauthorisedDeciderError("u"),
        errors.UnknownSubjectError("s"),
        errors.SubjectErasedError("s"),
        errors.JobErasedError("j"),
        errors.NoPersonalDataError("n"),
        errors.SubjectKeyError("k"),
        NoSuchVersionError("v"),
    ],
    ids=lambda error: type(error).__name__,
)
def test_each_engine_error_maps_to_a_status_of_its_exit_code_class(
    error: errors.JobLedgerError,
) -> None:
    problem = problems.of_error(error)
    code = exit_code(error)
    if code is Exit.REFUSED:
        assert 400 <= problem.status < 500
        assert "Retry-After" not in problem.headers
    elif code is Exit.UNAVAILABLE:
        assert problem.status == 503 and "Retry-After" not in problem.headers
    else:
        assert code is Exit.TEMPORARY
        assert problem.status == 503 and problem.headers["Retry-After"] == "1"
    assert problem.error == type(error).__name__


# ---- the engine under the server's thread pool -------------------------------------------


def test_concurrent_requests_land_each_input_once(api: ApiServer, engine: Engine) -> None:
    """Many requests at once, on the server's thread pool: one submit key raced by
    several callers makes one job (one 201, the rest 200 with it); signals of distinct
    ids sent at once to one job are all recorded, each once, and its chain verifies."""
    engine.submit("acme", "j", "gate")  # queued: signals are buffered in its inbox
    submit = {"workflow_type": "agent3", "idempotency_key": "race"}
    with api.as_role(Role.OPERATOR) as http, ThreadPoolExecutor(max_workers=16) as pool:
        submits = list(pool.map(lambda _: http.post("/v1/jobs/acme", json=submit), range(16)))
        signals = list(
            pool.map(
                lambda n: http.post(
                    "/v1/jobs/acme/j/signals",
                    json={"event": f"e{n % 4}", "signal_id": f"s{n}"},
                ),
                range(40),  # with the 16 submits, within the default burst of 60
            )
        )
    codes = sorted(response.status_code for response in submits)
    assert codes == [200] * 15 + [201], [r.text for r in submits if r.status_code >= 300]
    assert len({response.json()["job_id"] for response in submits}) == 1
    assert all(r.status_code == 200 and r.json()["outcome"] == "buffered" for r in signals), [
        (r.status_code, r.text) for r in signals if r.status_code != 200
    ]
    history = engine.history("acme", "j")
    buffered = [e.data["signal_id"] for e in history if e.event_type == "SignalBuffered"]
    assert sorted(buffered) == sorted(f"s{n}" for n in range(40))
    assert engine.verify("acme", "j") is None
