"""The console's security rules over plain HTTP (a real uvicorn server): the session
cookie's flags and signature, CSRF on every form, the Content-Security-Policy, escaping,
and decisions only by an approver the engine accepts. The browser tests
(test_console_browser.py) drive the same pages in chromium."""

from __future__ import annotations

import re
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from html import escape, unescape
from pathlib import Path
from urllib.parse import unquote

import httpx
import pytest

from jobledger import Engine
from jobledger.api.auth import Principal, Role
from jobledger.api.console import routes
from jobledger.api.console.session import COOKIE, LIFETIME, SessionCodec, Sessions
from jobledger.domain.identity import job_uuid
from jobledger.workflows import DefinitionRegistry, parse_definition
from tests.support.audit import RawEvents
from tests.support.engines import EngineFactory
from tests.support.http import ApiServer, api_key, api_registry, start_api, token
from tests.test_console_browser import HOSTILE, PAYOUT

APPROVAL = "pay-1:step:2:approval"


@pytest.fixture
def engine(make_engine: EngineFactory) -> Engine:
    engine = make_engine(registry=DefinitionRegistry([parse_definition(PAYOUT, "payout.yaml")]))
    engine.submit("acme", "pay-1", "payout", input={"note": HOSTILE})
    engine.run_until_idle()
    return engine


@pytest.fixture
def server(engine: Engine, tmp_path: Path) -> Iterator[ApiServer]:
    with start_api(engine, tmp_path) as running:
        yield running


def browser(server: ApiServer) -> httpx.Client:
    return httpx.Client(base_url=server.url, follow_redirects=False, timeout=30)


def csrf(page: httpx.Response) -> str:
    found = re.search(r'name="csrf" value="([^"]+)"', page.text)
    assert found is not None, "no CSRF token on the page"
    return found.group(1)


def decide_form(page: httpx.Response) -> dict[str, str]:
    """The hidden fields of the page's first decision form, as a browser sends them."""
    form = re.search(
        r'<form method="post" action="/console/approval" class="decide">(.*?)</form>',
        page.text,
        re.S,
    )
    assert form is not None, "no decision form on the page"
    hidden = re.findall(r'<input type="hidden" name="([^"]+)" value="([^"]*)">', form.group(1))
    return {name: unescape(value) for name, value in hidden}


def approval_page(client: httpx.Client) -> httpx.Response:
    params = {"tenant": "acme", "job": "pay-1", "approval": APPROVAL}
    page = client.get("/console/approval", params=params)
    assert page.status_code == 200, page.text
    return page


def signed_in(server: ApiServer, credential: str) -> httpx.Client:
    client = browser(server)
    form = client.get("/console/sign-in")
    answer = client.post("/console/sign-in", data={"credential": credential, "csrf": csrf(form)})
    assert answer.status_code == 303, answer.text
    return client


def decisions(engine: Engine) -> list[str]:
    return [
        str(e.data["decided_by"])
        for e in engine.history("acme", "pay-1")
        if e.event_type == "ApprovalDecided"
    ]


def test_sign_in_sets_a_signed_http_only_same_site_strict_session_cookie(
    server: ApiServer,
) -> None:
    client = browser(server)
    form = client.get("/console/sign-in")
    answer = client.post(
        "/console/sign-in",
        data={"credential": token(sub="ann", roles="approver"), "csrf": csrf(form)},
    )
    assert answer.status_code == 303
    assert answer.headers["location"] == "/console/approvals"
    cookie = next(c for c in answer.headers.get_list("set-cookie") if c.startswith(COOKIE + "="))
    flags = {flag.strip().lower() for flag in cookie.split(";")[1:]}
    assert {"httponly", "samesite=strict", "path=/console"} <= flags
    assert "secure" not in flags  # plain http on loopback: a Secure cookie would be dropped
    assert client.get("/console/approvals").status_code == 200


def test_the_cookie_is_secure_when_configured_for_tls(engine: Engine, tmp_path: Path) -> None:
    with start_api(engine, tmp_path, cookie_secure=True) as server:
        client = browser(server)
        form = client.get("/console/sign-in")
        answer = client.post(
            "/console/sign-in", data={"credential": api_key("acme", "approver"), "csrf": csrf(form)}
        )
        cookie = next(c for c in answer.headers.get_list("set-cookie") if c.startswith(COOKIE))
        assert "secure" in {flag.strip().lower() for flag in cookie.split(";")}


def test_a_refused_credential_or_a_missing_form_token_signs_nobody_in(server: ApiServer) -> None:
    client = browser(server)
    form = client.get("/console/sign-in")
    wrong = client.post("/console/sign-in", data={"credential": "jlk-nope", "csrf": csrf(form)})
    assert wrong.status_code == 401 and "Not signed in: unknown credential" in wrong.text
    good = api_key("acme", "approver")
    forged = client.post("/console/sign-in", data={"credential": good, "csrf": "guessed"})
    assert forged.status_code == 400
    for answer in (wrong, forged):
        assert not any(c.startswith(COOKIE + "=") for c in answer.headers.get_list("set-cookie"))
    assert client.get("/console/approvals").headers["location"] == "/console/sign-in"


def test_a_changed_or_foreign_session_cookie_is_no_session(server: ApiServer) -> None:
    client = signed_in(server, token(sub="ann", roles="approver"))
    value = client.cookies[COOKIE]
    payload, mac = value.split(".")
    # Claim admin of every tenant: the signature no longer matches.
    forged = payload[:-2] + ("AA" if payload[-2:] != "AA" else "BB")
    for cookie in (f"{forged}.{mac}", f"{payload}.{mac[:-1]}x", "not-a-cookie"):
        stranger = browser(server)
        stranger.cookies.set(COOKIE, cookie, path="/console")
        assert stranger.get("/console/approvals").headers["location"] == "/console/sign-in"


def test_every_page_sends_a_content_security_policy_and_escapes_job_data(
    server: ApiServer,
) -> None:
    client = signed_in(server, token(sub="ann", roles="approver"))
    pages = [
        client.get("/console/sign-in"),
        client.get("/console/approvals"),
        client.get(
            "/console/approval", params={"tenant": "acme", "job": "pay-1", "approval": APPROVAL}
        ),
        client.get("/console/jobs"),
        client.get("/console/job", params={"tenant": "acme", "job": "pay-1"}),
        client.get("/console/job", params={"tenant": "acme", "job": "pay-1", "version": 2}),
        client.get("/console/spend"),
        client.get("/console/schedules"),
        client.get("/console/job", params={"tenant": "globex", "job": "pay-1"}),
    ]
    for page in pages:
        policy = page.headers["content-security-policy"]
        assert "default-src 'none'" in policy and "script-src 'self'" in policy
        assert "unsafe-inline" not in policy
        assert page.headers["x-frame-options"] == "DENY"
        assert "<script>window.pwned" not in page.text
        assert "onerror='window" not in page.text
    assert "&lt;script&gt;window.pwned" in pages[1].text
    assert pages[-1].status_code == 404


def test_every_form_carries_the_sessions_csrf_token(server: ApiServer) -> None:
    client = signed_in(server, token(sub="ann", roles="approver"))
    token_now = csrf(client.get("/console/approvals"))
    for path, params in (
        ("/console/approvals", {}),
        ("/console/approval", {"tenant": "acme", "job": "pay-1", "approval": APPROVAL}),
        ("/console/job", {"tenant": "acme", "job": "pay-1"}),
    ):
        html = client.get(path, params=params).text
        forms = re.findall(r'<form[^>]*method="post".*?</form>', html, flags=re.S)
        assert forms, path
        for form in forms:
            assert f'name="csrf" value="{token_now}"' in form, (path, form)


def test_a_decision_without_the_sessions_csrf_token_decides_nothing(
    server: ApiServer, engine: Engine
) -> None:
    client = signed_in(server, token(sub="ann", roles="approver"))
    page = client.get("/console/approvals")
    form = {**decide_form(page), "decision": "approve"}
    del form["csrf"]
    for forged in ({}, {"csrf": "guessed"}):
        answer = client.post("/console/approval", data={**form, **forged})
        assert answer.status_code == 400
    assert decisions(engine) == []
    assert client.post("/console/approval", data={**form, "csrf": csrf(page)}).status_code == 303
    assert decisions(engine) == ["ann"]


def test_only_an_approver_the_request_names_decides(server: ApiServer, engine: Engine) -> None:
    # The form as Ann's page has it, posted by others (their pages show no buttons).
    page_form = {**decide_form(approval_page(signed_in(server, approver()))), "decision": "approve"}
    for credential, why in (
        (api_key("acme", "operator"), "not an approver of this tenant"),
        (token(sub="carol", roles="approver"), "carol&#39; may not decide"),
        (token(sub="ann", tenants="globex", roles="approver"), None),
    ):
        client = signed_in(server, credential)
        token_now = csrf(client.get("/console/approvals"))
        answer = client.post("/console/approval", data={**page_form, "csrf": token_now})
        if why is None:
            assert answer.status_code == 404  # another tenant's approval does not exist
        else:
            assert answer.status_code == 409 and why in answer.text, answer.text
    assert decisions(engine) == []


def test_a_changed_action_hash_is_refused_as_stale(server: ApiServer, engine: Engine) -> None:
    client = signed_in(server, token(sub="ann", roles="approver"))
    form = decide_form(client.get("/console/approvals"))
    answer = client.post(
        "/console/approval", data={**form, "action_sha256": "0" * 64, "decision": "approve"}
    )
    assert answer.status_code == 409
    assert "the action to approve changed since it was shown" in answer.text
    assert decisions(engine) == []


def approver(sub: str = "ann") -> str:
    return token(sub=sub, roles="approver")


def outcome(page: httpx.Response, decision: str) -> str:
    """The text of what the page says ``decision`` does."""
    found = re.search(
        rf'<section class="outcome" data-decision="{decision}">(.*?)</section>', page.text, re.S
    )
    assert found is not None, f"the page does not say what {decision} does"
    return unescape(re.sub(r"<[^>]+>", " ", found.group(1)))


def test_the_approval_page_says_what_approving_and_rejecting_do(server: ApiServer) -> None:
    page = approval_page(signed_in(server, approver()))
    assert "A person checks the payout before the money goes." in page.text
    on_approve, on_reject = outcome(page, "approve"), outcome(page, "reject")
    assert "step pay (run_interaction_task) runs next" in on_approve
    assert "Send the vendor the amount." in on_approve
    assert '"amount": 100' in on_approve and '"task": "pay"' in on_approve
    assert "step refused: the job fails: the payout was refused" in on_reject


def test_a_decision_made_on_a_page_that_no_longer_says_what_it_does_is_refused(
    server: ApiServer, engine: Engine
) -> None:
    client = signed_in(server, approver())
    shown = decide_form(approval_page(client))
    # The definitions are read again (SIGHUP) while the page is open: approving now pays more.
    changed = PAYOUT.replace("amount: 100}", "amount: 100000}")
    engine.use_registry(DefinitionRegistry([parse_definition(changed, "payout.yaml")]))
    stale = client.post("/console/approval", data={**shown, "decision": "approve"})
    assert stale.status_code == 409
    assert "what this approval does changed since the page was shown" in stale.text
    assert '"amount": 100000' in outcome(stale, "approve")  # the page shows it as it is now
    assert decisions(engine) == []
    fresh = client.post("/console/approval", data={**decide_form(stale), "decision": "approve"})
    assert fresh.status_code == 303, fresh.text
    assert decisions(engine) == ["ann"]


def test_an_auditor_sees_no_decision_buttons_and_a_decision_posted_anyway_is_refused(
    server: ApiServer, engine: Engine
) -> None:
    form = decide_form(approval_page(signed_in(server, approver())))
    for credential in (api_key("acme", "auditor"), approver("carol")):
        client = signed_in(server, credential)
        page = approval_page(client)
        assert "Send the vendor the amount." in outcome(page, "approve")  # it reads all of it
        assert 'name="decision"' not in page.text and 'class="decide"' not in page.text
        assert "You may read this approval but not decide it" in page.text
        assert 'name="decision"' not in client.get("/console/approvals").text
        job = client.get("/console/job", params={"tenant": "acme", "job": "pay-1"}).text
        assert ">decide</a>" not in job and ">the approval</a>" in job
    auditor = signed_in(server, api_key("acme", "auditor"))
    token_now = csrf(auditor.get("/console/jobs"))
    answer = auditor.post(
        "/console/approval", data={**form, "csrf": token_now, "decision": "approve"}
    )
    assert answer.status_code == 409 and "not an approver of this tenant" in answer.text
    assert 'name="decision"' not in answer.text
    assert decisions(engine) == []


def test_sign_out_ends_the_session_on_the_server_so_a_copied_cookie_stops_working(
    server: ApiServer,
) -> None:
    client = signed_in(server, api_key("acme", "auditor"))
    copy = browser(server)
    copy.cookies.set(COOKIE, client.cookies[COOKIE], path="/console")
    assert copy.get("/console/jobs").status_code == 200
    page = client.get("/console/jobs")
    assert client.post("/console/sign-out", data={"csrf": "guessed"}).status_code == 400
    answer = client.post("/console/sign-out", data={"csrf": csrf(page)})
    assert answer.headers["location"] == "/console/sign-in"
    assert client.get("/console/jobs").headers["location"] == "/console/sign-in"
    # The cookie as it was before signing out (copied, or kept by a browser that ignored
    # the deletion) is no session either: the server ended it.
    assert copy.get("/console/jobs").headers["location"] == "/console/sign-in"


def test_a_session_ends_when_it_expires() -> None:
    sessions = Sessions()
    codec = SessionCodec(b"s" * 32)
    now = datetime(2026, 1, 1, tzinfo=UTC)
    principal = Principal("ann", frozenset({"acme"}), frozenset({Role.APPROVER}))
    session = sessions.start(principal, now)
    cookie = codec.encode(session)
    found = codec.session_id(cookie, now + LIFETIME - timedelta(seconds=1))
    assert found == session.id
    assert sessions.get(found, now + LIFETIME - timedelta(seconds=1)) == session
    assert sessions.get(session.id, now + LIFETIME) is None
    assert codec.session_id(cookie, now + LIFETIME) is None
    assert SessionCodec(b"t" * 32).session_id(cookie, now) is None  # another server's secret


def test_sign_in_is_rate_limited_by_the_apis_own_limiter(engine: Engine, tmp_path: Path) -> None:
    """Each attempt spends from the address's bucket (guesses are each a new credential)
    and from the credential's, the API's buckets: the console and the API share them."""
    with start_api(engine, tmp_path, rate_limit_per_minute=1, rate_limit_burst=3) as server:
        client = browser(server)
        guesses = []
        for number in range(3):
            form = client.get("/console/sign-in")
            data = {"credential": f"jlk-guess-{number}", "csrf": csrf(form)}
            guesses.append(client.post("/console/sign-in", data=data))
        assert [answer.status_code for answer in guesses] == [401, 401, 401]
        form = client.get("/console/sign-in")
        good = {"credential": api_key("acme", "approver"), "csrf": csrf(form)}
        limited = client.post("/console/sign-in", data=good)
        assert limited.status_code == 429, limited.text
        assert "rate limit of 1 requests a minute reached" in limited.text
        assert int(limited.headers["retry-after"]) >= 1
        assert not any(c.startswith(COOKIE + "=") for c in limited.headers.get_list("set-cookie"))
        # The API's own requests without a credential, from the same address: the same bucket.
        assert server.client().get("/v1/jobs/acme").status_code == 429


def test_the_job_page_says_where_an_edited_history_breaks_its_chain(
    server: ApiServer, engine: Engine, store_url: str
) -> None:
    client = signed_in(server, api_key("acme", "auditor"))
    job_page = {"tenant": "acme", "job": "pay-1"}
    assert 'id="chain">chain intact<' in client.get("/console/job", params=job_page).text
    RawEvents(store_url).replace_in_state(job_uuid("acme", "pay-1"), 3, '"s1":true', '"s1":false')
    page = client.get("/console/job", params=job_page).text
    assert (
        'id="chain">chain broken at v3 (Job.StepRecorded: chain hash does not match the event)<'
        in page
    )


def test_the_jobs_page_filters_counts_and_pages(engine: Engine, server: ApiServer) -> None:
    for n in range(3):
        engine.submit("acme", f"more-{n}", "payout", input={})
    client = signed_in(server, api_key("acme", "auditor"))
    page = client.get("/console/jobs").text
    counts = dict(re.findall(r'class="status s-(\w+)">\w+</a> <b>(\d+)</b>', page))
    assert counts == {"queued": "3", "awaiting_approval": "1"}
    waiting = client.get("/console/jobs", params={"status": "awaiting_approval"}).text
    assert "pay-1" in waiting and "more-0" not in waiting
    nothing = client.get("/console/jobs", params={"workflow": "other"}).text
    assert "No jobs." in nothing
    bad = client.get("/console/jobs", params={"after": "not-a-cursor"})
    assert bad.status_code == 400 and "not a listing cursor" in bad.text


def test_an_unknown_status_filter_on_the_jobs_page_is_400_naming_it(server: ApiServer) -> None:
    """Not "No jobs.": no job has a status that does not exist, and the page said so as
    if the filter had been a real one."""
    client = signed_in(server, api_key("acme", "auditor"))
    page = client.get("/console/jobs", params={"status": "awaiting_approval,bogus"})
    assert page.status_code == 400
    assert 'role="alert">unknown status bogus; known: ' in page.text
    assert "No jobs." not in page.text and "pay-1" not in page.text


@pytest.mark.parametrize(
    "last_event_id",
    ["²".encode(), b"1" * 30, b"-1", b"9"],
    ids=["superscript", "30-digits", "negative", "past-the-head"],
)
def test_a_last_event_id_that_is_not_one_of_the_jobs_versions_is_400_on_the_console_stream(
    server: ApiServer, last_event_id: bytes
) -> None:
    client = signed_in(server, api_key("acme", "auditor"))
    answer = client.get(
        "/console/job/events",
        params={"tenant": "acme", "job": "pay-1"},
        headers={"Last-Event-ID": last_event_id},
    )
    assert answer.status_code == 400, answer.text
    error = answer.json()["error"]
    assert error.startswith(("Last-Event-ID must be an event version", "the job has no event v"))


def test_the_jobs_page_pages_by_cursor(
    engine: Engine, server: ApiServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(routes, "PAGE_SIZE", 2)
    for n in range(3):
        engine.submit("acme", f"more-{n}", "payout", input={})
    client = signed_in(server, api_key("acme", "auditor"))
    seen: list[str] = []
    params: dict[str, str] = {}
    for _ in range(3):
        page = client.get("/console/jobs", params=params).text
        seen += re.findall(r"job=([\w-]+)\">", page)
        more = re.search(r'id="more" href="[^"]*after=([^"&]+)"', page)
        if more is None:
            break
        params = {"after": unquote(more.group(1))}
    assert sorted(seen) == ["more-0", "more-1", "more-2", "pay-1"]


def test_the_spend_page_shows_each_utc_day_against_the_ceiling(
    make_engine: EngineFactory, tmp_path: Path
) -> None:
    registry = DefinitionRegistry([parse_definition(PAYOUT, "payout.yaml")])
    ceiling = {"cost_ceiling_usd": "1", "tenant_cost_ceilings_usd": {"acme": "0.40"}}
    engine = make_engine(registry=registry, config=ceiling)
    engine.submit("acme", "pay-1", "payout", input={})
    engine.run_until_idle()
    with start_api(engine, tmp_path) as server:
        page = signed_in(server, api_key("acme", "auditor")).get("/console/spend").text
    day = engine.clock.now().date().isoformat()
    assert "Ceiling: $0.40 per UTC day" in page
    assert re.search(rf"<td>{day}</td><td>\$0.10</td>\s*<td><meter[^>]*value=\"25\"", page), page


def test_the_schedules_page_lists_the_tenants_schedules_with_their_next_firing(
    make_engine: EngineFactory, tmp_path: Path
) -> None:
    engine = make_engine(registry=api_registry())
    for tenant, name in (("acme", "<b>nightly</b>"), ("globex", "theirs")):
        engine.schedules.create(
            tenant, name, cron="0 7 * * *", timezone="Europe/Paris", workflow_type="agent3"
        )
    job_id = engine.schedules.trigger("acme", "<b>nightly</b>")
    with start_api(engine, tmp_path) as server:
        client = signed_in(server, api_key("acme", "auditor"))
        page = client.get("/console/schedules").text
        elsewhere = client.get("/console/schedules", params={"tenant": "globex"})
    row = re.search(r'<table id="schedules">.*?<tbody>\s*<tr>(.*?)</tr>', page, re.S)
    assert row is not None, page
    cells = re.findall(r"<td>(.*?)</td>", row[1], re.S)
    assert cells[:8] == [
        "&lt;b&gt;nightly&lt;/b&gt;",
        "<code>0 7 * * *</code>",
        "Europe/Paris",
        "agent3",
        "active",
        "2026-01-01T07:00:00+01:00",
        "2026-01-01 06:00:00 UTC",
        "1",
    ]
    assert f">{escape(job_id)}</a>" in cells[8]
    assert "theirs" not in page
    assert elsewhere.status_code == 404 and "theirs" not in elsewhere.text
