"""Repair in the web console, in a real browser (headless chromium, Selenium) against a
real server, on SQLite and PostgreSQL: an operator retries a failed job from its page and
watches it run to completion; a reset to a step out of range is refused on the page,
writing nothing; an auditor is offered no repair."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from selenium.webdriver.remote.webdriver import WebDriver

from jobledger import Engine, JobStatus
from tests.support.browser import Page, chromium
from tests.support.engines import CountingExecutor, EngineFactory
from tests.support.http import start_api, token
from tests.test_repair import failed_at_3, registry

JOB_PAGE = "/console/job?tenant=acme&job=j1"


@pytest.fixture
def driver() -> Iterator[WebDriver]:
    yield from chromium()


@pytest.fixture
def engine(make_engine: EngineFactory) -> Engine:
    return make_engine(registry=registry())


@pytest.fixture
def page(
    driver: WebDriver, engine: Engine, tmp_path: Path, request: pytest.FixtureRequest
) -> Iterator[Page]:
    with start_api(engine, tmp_path) as server:
        yield Page(driver, server.url, request.node.name)


def test_an_operator_retries_a_failed_job_in_the_console_and_watches_it_complete(
    engine: Engine, executor: CountingExecutor, page: Page
) -> None:
    failed_at_3(engine, executor)
    page.sign_in(token(sub="olga", tenants="acme", roles="operator"))
    page.open(JOB_PAGE)
    assert page.text("#status") == "failed"
    assert page.text("#retry") == "Retry step 3"
    page.shot("failed")

    # A reset past the last step recorded is refused on the page, and writes nothing.
    version = engine.job("acme", "j1").version
    page.driver.execute_script("document.querySelector('#reset-form [name=step]').max = 99")
    page.find("#reset-form [name=step]").clear()
    page.find("#reset-form [name=step]").send_keys("9")
    page.find("#reset-form [name=reason]").send_keys("too far")
    page.find("#reset").click()
    page.wait(lambda: page.all("#repair-refusal"), "the refusal")
    assert "cannot be reset to step 9" in page.text("#repair-refusal")
    assert engine.job("acme", "j1").version == version
    page.shot("reset-refused")

    page.find("#retry-form [name=reason]").send_keys("the executor is fixed")
    page.find("#retry").click()
    page.wait(lambda: page.text("#status") == "queued", "the retried job's page")
    retried = engine.history("acme", "j1")[-1]
    assert retried.event_type == "Retried"
    assert retried.data["retried_by"] == "olga"  # the signed-in subject, no form field
    page.shot("retried")

    # A worker runs it; the open page follows it to the end without a reload.
    engine.run_until_idle()
    assert engine.job("acme", "j1").status is JobStatus.COMPLETED
    page.wait(lambda: page.text("#status") == "completed", "the live update to completed")
    assert page.text("#chain") == "chain intact"
    assert executor.calls["acme/j1:step:3"] == 2 and executor.calls["acme/j1:step:1"] == 1
    page.shot("completed")

    # Reset to after step 1 from the page: steps 2 on run again, under the next epoch.
    page.open(JOB_PAGE)
    page.find("#reset-form [name=step]").clear()
    page.find("#reset-form [name=step]").send_keys("1")
    page.find("#reset-form [name=reason]").send_keys("redo from step 2")
    page.find("#reset").click()
    page.wait(lambda: page.text("#status") == "queued", "the reset job's page")
    assert engine.history("acme", "j1")[-1].data["reset_by"] == "olga"
    engine.run_until_idle()
    page.wait(lambda: page.text("#status") == "completed", "the reset job completed")
    assert executor.calls["acme/j1:step:2@e1"] == 1
    # No script or CSP error; the refused reset's page was a 409, as a refusal is.
    errors = page.severe_console_errors()
    assert [e for e in errors if "/console/job/repair" not in e or "409" not in e] == []


def test_an_auditor_is_offered_no_repair(
    engine: Engine, executor: CountingExecutor, page: Page
) -> None:
    failed_at_3(engine, executor)
    page.sign_in(token(sub="al", tenants="acme", roles="auditor"))
    page.open(JOB_PAGE)
    assert page.text("#status") == "failed"
    assert not page.all("#retry-form") and not page.all("#reset-form")
    page.shot("auditor")
