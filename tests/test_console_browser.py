"""The web console in a real browser: headless chromium driven by Selenium against a
real uvicorn server (tests/support/http.py), on SQLite and PostgreSQL.

Each test saves a screenshot of every page it looks at under artifacts/console/.
A missing browser is a skip locally and a failure in CI (tests/support/browser.py)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from datetime import timedelta
from importlib.resources import files
from pathlib import Path

import httpx
import pytest
from selenium.webdriver.remote.webdriver import WebDriver

from jobledger import Engine
from jobledger.adapters.clock import FakeClock
from jobledger.workflows import DefinitionRegistry, parse_definition
from tests.support import ROOT, browser, pythonpath
from tests.support.browser import Page, chromium
from tests.support.cli import JOBLEDGER, run_jobledger
from tests.support.engines import EngineFactory
from tests.support.http import start_api, token

PAYOUT = """
type: payout
version: 1
start: prepare
steps:
  prepare: {kind: run_interaction_task, params: {task: prepare}, next: review}
  review:
    kind: await_approval
    description: A person checks the payout before the money goes.
    approvers: [ann, bob]
    expires: {days: 1}
    on_approve: pay
    on_reject: refused
  pay:
    kind: run_interaction_task
    description: Send the vendor the amount.
    params: {task: pay, amount: 100}
    next: done
  done: {kind: complete}
  refused: {kind: fail, reason: the payout was refused}
"""
HOSTILE = "<script>window.pwned = 1</script><img src=x onerror='window.pwned = 2'>"
APPROVAL = "pay-1:step:2:approval"


@pytest.fixture
def driver() -> Iterator[WebDriver]:
    yield from chromium()


@pytest.fixture
def engine(make_engine: EngineFactory) -> Engine:
    registry = DefinitionRegistry([parse_definition(PAYOUT, "payout.yaml")])
    return make_engine(registry=registry)


@pytest.fixture
def page(
    driver: WebDriver, engine: Engine, tmp_path: Path, request: pytest.FixtureRequest
) -> Iterator[Page]:
    with start_api(engine, tmp_path) as server:
        yield Page(driver, server.url, request.node.name)


def awaiting(engine: Engine, job: str = "pay-1", tenant: str = "acme") -> str:
    """A payout job at its approval; returns the action hash the request is bound to."""
    engine.submit(tenant, job, "payout", input={"note": HOSTILE})
    engine.run_until_idle()
    assert engine.job(tenant, job).status == "awaiting_approval"
    requested = [e for e in engine.history(tenant, job) if e.event_type == "ApprovalRequested"]
    return str(requested[-1].data["action_sha256"])


def approver(sub: str = "ann", tenant: str = "acme") -> str:
    return token(sub=sub, tenants=tenant, roles="approver")


def test_an_approver_approves_from_the_inbox_and_watches_the_job_finish_live(
    engine: Engine, page: Page
) -> None:
    action = awaiting(engine)
    page.sign_in(approver())
    assert page.driver.current_url.endswith("/console/approvals")
    page.shot("inbox")
    card = page.find("section.approval")
    assert page.find(".action-hash").text == action
    assert "matches the step, params and state shown" in card.text
    assert "others who may decide: bob" in card.text
    assert "review" in card.text and "attempt 1" in card.text
    # The job's data is shown as text, never run as markup.
    assert HOSTILE in page.find("pre.state").text
    assert page.driver.execute_script("return window.pwned === undefined")

    page.find("input[name=comment]").send_keys("checked the amount <b>ok</b>")
    page.find("button.approve").click()
    page.wait(lambda: page.all("#timeline"), "the job page")
    page.shot("job-approved")
    assert page.text("#status") == "queued"
    types = [li.get_attribute("data-type") for li in page.all("#timeline li")]
    assert types[-1] == "ApprovalDecided"
    decided = engine.history("acme", "pay-1")[-1]
    assert decided.data["decided_by"] == "ann"  # the signed-in subject, no form field
    assert decided.data["comment"] == "checked the amount <b>ok</b>"

    # The job moves on elsewhere (a worker); the open page follows it without a reload.
    page.driver.execute_script("window.stillTheSamePage = true")
    engine.run_until_idle()
    assert engine.job("acme", "pay-1").status == "completed"
    history = engine.history("acme", "pay-1")
    page.wait(
        lambda: (
            page.text("#status") == "completed"
            and [li.text.split()[-1] for li in page.all("#timeline li")]
            == [entry.chain_hash for entry in history]
        ),
        "the live update: completed, every event with its chain hash",
    )
    assert page.driver.execute_script("return window.stillTheSamePage === true")
    assert page.text("#chain") == "chain intact"
    page.shot("job-finished-live")

    # Time travel: back to the version that asked for the approval.
    requested = next(
        e for e in engine.history("acme", "pay-1") if e.event_type == "ApprovalRequested"
    )
    page.find(f"#timeline li:nth-child({requested.version}) a.v").click()
    page.wait(lambda: page.all("#travel"), "the job as it was")
    assert page.text("#status") == "awaiting_approval"
    assert f"version {requested.version} of" in page.text("#travel")
    page.shot("time-travel")

    page.open("/console/jobs")
    assert "completed 1" in page.text("#counts")
    assert "pay-1" in page.text("#jobs")
    page.shot("jobs")
    page.open("/console/spend")
    assert "$0.20" in page.text("#spend")  # two steps at $0.10, today (UTC)
    page.shot("spend")
    page.open("/console/approvals")
    assert page.all("#empty")
    page.shot("inbox-empty")
    assert page.severe_console_errors() == []


def test_another_tenants_user_gets_nothing_of_the_first(engine: Engine, page: Page) -> None:
    awaiting(engine)
    engine.submit("globex", "own-1", "payout", input={"note": "globex's own"})
    engine.run_until_idle()
    # Same subject name, approver and auditor, but of globex only.
    page.sign_in(token(sub="ann", tenants="globex", roles=["approver", "auditor"]))
    page.shot("inbox-globex")
    assert "pay-1" not in page.text()
    assert "own-1" in page.text()  # globex's own approval is there
    page.open("/console/jobs")
    assert "pay-1" not in page.text() and "own-1" in page.text("#jobs")
    page.shot("jobs-globex")
    for path in (
        "/console/job?tenant=acme&job=pay-1",
        f"/console/approval?tenant=acme&job=pay-1&approval={APPROVAL}",
        "/console/job?tenant=acme&job=no-such-job",
        "/console/jobs?tenant=acme",
        "/console/spend?tenant=acme",
    ):
        page.open(path)
        assert page.text("h1") == "Not found", path
        assert "awaiting_approval" not in page.text()
    page.shot("foreign-job-not-found")
    status = page.driver.execute_async_script(
        "const done = arguments[0];"
        "fetch('/console/job/events?tenant=acme&job=pay-1').then(r => done(r.status));"
    )
    assert status == 404
    assert engine.job("acme", "pay-1").status == "awaiting_approval"


def test_a_stale_approval_page_refuses_the_decision(engine: Engine, page: Page) -> None:
    awaiting(engine)
    page.sign_in(approver())
    page.find("section.approval h2 a").click()
    page.wait(lambda: page.all("button.approve"), "the approval page")
    page.shot("approval-page")
    # Bob decides in another place while Ann's page is open.
    engine.decide("acme", "pay-1", APPROVAL, "reject", "bob", "no")
    page.find("button.approve").click()
    page.wait(lambda: page.all("#refusal"), "the refusal")
    page.shot("stale-refused")
    assert "was already decided" in page.text("#refusal")
    assert "no longer open: rejected by bob" in page.text("#closed")
    assert not page.all("button.approve")
    decisions = [e for e in engine.history("acme", "pay-1") if e.event_type == "ApprovalDecided"]
    assert [d.data["decided_by"] for d in decisions] == ["bob"]


def test_the_approval_page_says_what_each_decision_does_and_a_stale_one_is_refused(
    engine: Engine, page: Page
) -> None:
    awaiting(engine)
    page.sign_in(approver())
    page.find("section.approval h2 a").click()
    page.wait(lambda: page.all("button.approve"), "the approval page")
    page.shot("what-each-decision-does")
    assert "A person checks the payout before the money goes." in page.text("section.approval")
    on_approve = page.find("section.outcome[data-decision=approve]").text
    assert "step pay (run_interaction_task) runs next" in on_approve
    assert "Send the vendor the amount." in on_approve and '"amount": 100' in on_approve
    on_reject = page.find("section.outcome[data-decision=reject]").text
    assert "the job fails: the payout was refused" in on_reject
    # The definitions are read again while the page is open: approving now pays more.
    changed = PAYOUT.replace("amount: 100}", "amount: 100000}")
    engine.use_registry(DefinitionRegistry([parse_definition(changed, "payout.yaml")]))
    page.find("button.approve").click()
    page.wait(lambda: page.all("#refusal"), "the refusal")
    page.shot("changed-since-shown")
    assert "changed since the page was shown" in page.text("#refusal")
    assert '"amount": 100000' in page.find("section.outcome[data-decision=approve]").text
    assert not any(e.event_type == "ApprovalDecided" for e in engine.history("acme", "pay-1"))
    page.find("button.approve").click()  # on what the page shows now
    page.wait(lambda: page.all("#timeline"), "the job page")
    assert engine.history("acme", "pay-1")[-1].event_type == "ApprovalDecided"


def test_an_auditor_reads_the_approval_without_decision_buttons(engine: Engine, page: Page) -> None:
    awaiting(engine)
    page.sign_in(token(sub="ida", tenants="acme", roles="auditor"))
    page.open(f"/console/approval?tenant=acme&job=pay-1&approval={APPROVAL}")
    page.shot("auditor-approval")
    assert "Send the vendor the amount." in page.text("section.outcome[data-decision=approve]")
    assert "may read this approval but not decide it" in page.text("#read-only")
    assert not page.all("button.approve") and not page.all("button.reject")
    assert page.severe_console_errors() == []


def test_an_expired_approval_says_so_and_refuses(
    engine: Engine, page: Page, clock: FakeClock
) -> None:
    awaiting(engine)
    page.sign_in(approver())
    page.find("section.approval h2 a").click()
    page.wait(lambda: page.all("button.approve"), "the approval page")
    clock.advance(timedelta(days=2))
    page.find("button.approve").click()
    page.wait(lambda: page.all("#refusal"), "the refusal")
    page.shot("expired-refused")
    assert "expired at" in page.text("#refusal")
    assert not any(e.event_type == "ApprovalDecided" for e in engine.history("acme", "pay-1"))


DEMO_KEY = "demo-reviewer-key-not-for-production"
"""The demo reviewer's API key in examples/console/api-keys.json (stored there hashed)."""


@pytest.fixture
def demo_home(tmp_path: Path) -> Path:
    home = tmp_path / "console-demo"
    shutil.copytree(ROOT / "examples" / "console", home)
    return home


def jobledger_process(home: Path, *args: str) -> subprocess.Popen[str]:
    """``jobledger ARGS`` started in ``home`` as README.md says: no JOBLEDGER_* settings
    but the config file's."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("JOBLEDGER_")}
    env["PYTHONPATH"] = pythonpath()
    return subprocess.Popen(
        [str(JOBLEDGER), *args],
        cwd=home,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )


def stopped(process: subprocess.Popen[str]) -> str:
    """Stop it as Ctrl-C would; what it said on stderr."""
    process.send_signal(signal.SIGINT)
    try:
        _, errors = process.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        process.kill()
        _, errors = process.communicate()
    return errors


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def test_the_demos_fact_check_is_approved_in_the_console_and_the_job_finishes(
    driver: WebDriver, demo_home: Path, request: pytest.FixtureRequest
) -> None:
    """README.md's console walk-through, process for process: ``jobledger run``,
    ``jobledger serve`` and ``jobledger submit`` in examples/console; the reviewer
    approves the fact-check in the browser and watches the job finish."""
    port = free_port()
    runner = jobledger_process(demo_home, "run")
    server = jobledger_process(demo_home, "serve", "--port", str(port))
    url = f"http://127.0.0.1:{port}"
    try:
        wait_for(lambda: _answers(f"{url}/readyz"), "jobledger serve")
        submitted = run_jobledger("submit", "demo", "brief-1", "fact_checked_brief", cwd=demo_home)
        assert submitted.returncode == 0, submitted.stderr
        page = Page(driver, url, request.node.name)
        page.sign_in(DEMO_KEY)
        page.wait(lambda: _reloaded(page) and page.all("section.approval"), "the fact-check", 30)
        page.shot("inbox")
        card = page.find("section.approval")
        assert "fact_check" in card.text and "demo/brief-1" in card.text
        assert "To be fact-checked before it is published." in page.text("pre.state")
        assert "matches the step, params and state shown" in card.text
        page.find("input[name=comment]").send_keys("the counts match the field notes")
        page.find("button.approve").click()
        page.wait(lambda: page.all("#timeline"), "the job page")
        page.shot("approved")
        assert "ApprovalDecided" in [
            li.get_attribute("data-type") for li in page.all("#timeline li")
        ]
        # The runner (another process) finishes the job; the page follows it live.
        page.driver.execute_script("window.stillTheSamePage = true")
        page.wait(lambda: page.text("#status") == "completed", "the job to finish", 30)
        assert page.driver.execute_script("return window.stillTheSamePage === true")
        page.shot("finished")
    finally:
        served, ran = stopped(server), stopped(runner)
    assert "Traceback" not in served + ran, served + ran
    shown = run_jobledger("show", "demo", "brief-1", "--json", cwd=demo_home)
    job = json.loads(shown.stdout)
    assert job["status"] == "completed" and job["state"]["published"] is True
    history = json.loads(
        run_jobledger("history", "demo", "brief-1", "--json", cwd=demo_home).stdout
    )
    decided = [e for e in history["events"] if e["event_type"] == "ApprovalDecided"]
    assert [e["data"]["decided_by"] for e in decided] == ["demo-reviewer"]


def _answers(url: str) -> bool:
    try:
        return httpx.get(url, timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def _reloaded(page: Page) -> bool:
    """The inbox, read again (the runner takes a moment to reach the fact-check)."""
    if not page.all("section.approval"):
        page.open("/console/approvals")
    return True


def test_the_console_demos_definition_is_the_packaged_one() -> None:
    packaged = files("jobledger.demo").joinpath("fact_check.yaml").read_text(encoding="utf-8")
    example = ROOT / "examples" / "console" / "definitions" / "fact_checked_brief.v1.yaml"
    assert example.read_text(encoding="utf-8") == packaged


def wait_for(holds: Callable[[], bool], what: str, seconds: float = 30.0) -> None:
    deadline = time.monotonic() + seconds
    while not holds():
        if time.monotonic() > deadline:
            raise AssertionError(f"waited {seconds} s for {what}")
        time.sleep(0.1)


def test_a_missing_browser_is_a_skip_locally_and_a_failure_in_ci(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(browser, "CHROMIUM", tmp_path / "no-chromium")
    monkeypatch.setattr(browser, "REQUIRED", True)
    with pytest.raises(pytest.fail.Exception, match="no-chromium missing"):
        next(browser.chromium())
    monkeypatch.setattr(browser, "REQUIRED", False)
    with pytest.raises(pytest.skip.Exception, match="apt-get install chromium"):
        next(browser.chromium())
