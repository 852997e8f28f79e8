"""Selecting jobs in the console and cancelling or retrying them as one batch: in a real browser
(headless chromium, tests/support/browser.py) and over plain HTTP for the refusals, on
SQLite and PostgreSQL."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from selenium.webdriver.remote.webdriver import WebDriver

from jobledger import Engine, JobStatus, StepError, StepRequest
from jobledger.workflows import DefinitionRegistry, parse_definition
from tests.support.browser import Page, chromium
from tests.support.engines import CountingExecutor, EngineFactory, writes
from tests.support.http import ApiServer, start_api, token
from tests.test_console_browser import PAYOUT

T = "acme"


@pytest.fixture
def engine(make_engine: EngineFactory) -> Engine:
    return make_engine(registry=DefinitionRegistry([parse_definition(PAYOUT, "payout.yaml")]))


@pytest.fixture
def server(engine: Engine, tmp_path: Path) -> Iterator[ApiServer]:
    with start_api(engine, tmp_path) as running:
        yield running


@pytest.fixture
def page(driver: WebDriver, server: ApiServer, request: pytest.FixtureRequest) -> Page:
    return Page(driver, server.url, request.node.name)


@pytest.fixture
def driver() -> Iterator[WebDriver]:
    yield from chromium()


def awaiting(engine: Engine, *jobs: str) -> None:
    for job in jobs:
        engine.submit(T, job, "payout")
    engine.run_until_idle()
    assert {engine.job(T, j).status for j in jobs} == {JobStatus.AWAITING_APPROVAL}


def test_an_operator_selects_jobs_and_cancels_them_from_the_console(
    engine: Engine, page: Page
) -> None:
    awaiting(engine, "pay-1", "pay-2", "pay-3")
    page.sign_in(token(sub="olga", tenants=T, roles="operator"))
    page.open(f"/console/jobs?tenant={T}")
    page.wait(lambda: page.all("#jobs input[type=checkbox]"), "the selectable rows")
    page.find("input[value='pay-1']").click()
    page.find("input[value='pay-3']").click()
    page.find("#bulk-reason").send_keys("vendor withdrew")
    page.shot("selected")
    page.find("#cancel-selected").click()
    page.wait(lambda: page.all("#batch"), "the batch's outcome")
    page.shot("cancelled")
    assert "2 applied, 0 skipped, 0 failed" in page.text("#batch")
    assert page.severe_console_errors() == []
    assert engine.job(T, "pay-1").status is JobStatus.CANCELLED
    assert engine.job(T, "pay-3").status is JobStatus.CANCELLED
    assert engine.job(T, "pay-2").status is JobStatus.AWAITING_APPROVAL
    cancelled = next(e for e in engine.history(T, "pay-1") if e.event_type == "Cancelled")
    assert (cancelled.data["cancelled_by"], cancelled.data["reason"]) == ("olga", "vendor withdrew")
    auditor_sees_no_selection(page)


def test_an_operator_selects_failed_jobs_and_retries_them_from_the_console(
    engine: Engine, executor: CountingExecutor, page: Page
) -> None:
    def fail(request: StepRequest) -> Exception | None:
        return StepError("bug", retryable=False) if request.step_number == 1 else None

    executor.fail_with = fail
    for job in ("pay-1", "pay-2"):
        engine.submit(T, job, "payout")
    engine.run_until_idle()
    executor.fail_with = None
    awaiting(engine, "pay-3")
    page.sign_in(token(sub="olga", tenants=T, roles="operator"))
    page.open(f"/console/jobs?tenant={T}")
    page.wait(lambda: page.all("#jobs input[type=checkbox]"), "the selectable rows")
    for job in ("pay-1", "pay-2", "pay-3"):
        page.find(f"input[value='{job}']").click()
    page.find("#bulk-reason").send_keys("prepare fixed")
    page.find("#retry-selected").click()
    page.wait(lambda: page.all("#batch"), "the batch's outcome")
    page.shot("retried")
    assert "2 applied, 1 skipped, 0 failed" in page.text("#batch")
    assert "pay-3: job 'pay-3' is awaiting_approval: only a failed job" in page.text("#batch")
    assert page.severe_console_errors() == []
    retried = next(e for e in engine.history(T, "pay-1") if e.event_type == "Retried")
    assert (retried.data["retried_by"], retried.data["reason"]) == ("olga", "prepare fixed")

    engine.run_until_idle()  # the reopened jobs run their failed step again
    page.open(f"/console/jobs?tenant={T}&status=awaiting_approval")
    page.wait(lambda: len(page.all("#jobs input[type=checkbox]")) == 3, "the reopened jobs")
    assert {engine.job(T, j).status for j in ("pay-1", "pay-2")} == {JobStatus.AWAITING_APPROVAL}
    auditor_sees_no_selection(page)


def auditor_sees_no_selection(page: Page) -> None:
    page.sign_out()
    page.sign_in(token(sub="ada", tenants=T, roles="auditor"))
    page.open(f"/console/jobs?tenant={T}")
    page.wait(lambda: page.all("#jobs tbody tr"), "the jobs")
    page.shot("auditor")
    assert page.all("#jobs input[type=checkbox]") == []
    assert page.all("#cancel-selected") == []
    assert page.all("#retry-selected") == []


def signed_in(server: ApiServer, credential: str) -> tuple[httpx.Client, str]:
    client = httpx.Client(base_url=server.url, follow_redirects=False, timeout=30)
    form = client.get("/console/sign-in").text
    csrf = re.search(r'name="csrf" value="([^"]+)"', form)
    assert csrf is not None
    answer = client.post("/console/sign-in", data={"credential": credential, "csrf": csrf.group(1)})
    assert answer.status_code == 303, answer.text
    jobs = client.get(f"/console/jobs?tenant={T}").text
    session_csrf = re.search(r'name="csrf" value="([^"]+)"', jobs)
    assert session_csrf is not None
    return client, session_csrf.group(1)


def test_a_reader_a_forged_form_or_no_selection_cancels_nothing(
    engine: Engine, server: ApiServer
) -> None:
    awaiting(engine, "pay-1")
    before = writes(engine)
    auditor, csrf = signed_in(server, token(sub="ada", tenants=T, roles="auditor"))
    form = {"tenant": T, "job": "pay-1", "reason": "x", "csrf": csrf}
    refused = auditor.post("/console/jobs/cancel", data=form)
    assert refused.status_code == 403 and "operator role" in refused.text
    operator, csrf = signed_in(server, token(sub="olga", tenants=T, roles="operator"))
    assert operator.post("/console/jobs/cancel", data={**form, "csrf": "forged"}).status_code == 400
    none = operator.post("/console/jobs/cancel", data={"tenant": T, "csrf": csrf})
    assert none.status_code == 400 and "No job was selected" in none.text
    other = operator.post("/console/jobs/cancel", data={**form, "tenant": "other", "csrf": csrf})
    assert other.status_code == 404
    retry = auditor.post("/console/jobs/retry", data=form)
    assert retry.status_code == 403 and "Retrying jobs takes the operator role" in retry.text
    assert operator.post("/console/jobs/retry", data={**form, "csrf": "forged"}).status_code == 400
    assert writes(engine) == before
    assert engine.job(T, "pay-1").status is JobStatus.AWAITING_APPROVAL
