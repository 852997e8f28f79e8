"""The console's approval page for approvals people give, over plain HTTP on both stores:
a quorum's progress and votes, an answer with data, an approval with edits, and a bad
JSON field refused with nothing written."""

from __future__ import annotations

import re
from collections.abc import Iterator
from html import unescape
from pathlib import Path

import httpx
import pytest

from jobledger import Engine, JobStatus
from tests.support.approvals import Recorder, approvals_registry
from tests.support.engines import EngineFactory
from tests.support.http import ApiServer, start_api, token
from tests.test_console_http import decide_form, signed_in


@pytest.fixture
def recorder() -> Recorder:
    return Recorder()


@pytest.fixture
def engine(make_engine: EngineFactory, recorder: Recorder) -> Engine:
    engine = make_engine(registry=approvals_registry(), executor=recorder)
    engine.submit("acme", "pay-1", "payout")
    engine.submit("acme", "ref-1", "refund")
    engine.run_until_idle()
    return engine


@pytest.fixture
def server(engine: Engine, tmp_path: Path) -> Iterator[ApiServer]:
    with start_api(engine, tmp_path) as running:
        yield running


def page_of(client: httpx.Client, job: str) -> httpx.Response:
    params = {"tenant": "acme", "job": job, "approval": f"{job}:step:2:approval"}
    page = client.get("/console/approval", params=params)
    assert page.status_code == 200, page.text
    return page


def quorum(page: httpx.Response) -> str:
    found = re.search(r'<dd class="quorum">(.*?)</dd>', page.text, re.S)
    assert found is not None, "the page shows no quorum"
    return unescape(found.group(1))


def as_approver(server: ApiServer, sub: str) -> httpx.Client:
    return signed_in(server, token(sub=sub, roles="approver"))


def test_a_quorum_shows_its_progress_and_takes_votes_with_data(
    server: ApiServer, engine: Engine
) -> None:
    alice = as_approver(server, "alice")
    page = page_of(alice, "pay-1")
    assert quorum(page) == "0 of 2 approvals"
    assert 'name="edit"' not in page.text  # a request several decide takes no edits

    form = {**decide_form(page), "decision": "approve", "data": '{"po": "PO-3"}'}
    assert alice.post("/console/approval", data=form).status_code == 303

    bob = as_approver(server, "bob")
    assert quorum(page_of(bob, "pay-1")) == "1 of 2 approvals: alice approved"
    job_page = bob.get("/console/job", params={"tenant": "acme", "job": "pay-1"})
    assert '<span class="quorum">1 of 2 approvals</span>' in job_page.text
    form = {**decide_form(page_of(bob, "pay-1")), "decision": "approve"}
    assert bob.post("/console/approval", data=form).status_code == 303
    job = engine.job("acme", "pay-1")
    assert job.status is not JobStatus.AWAITING_APPROVAL and job.state["po"] == "PO-3"


def test_an_approval_with_edits_from_the_console_runs_the_step_with_them(
    server: ApiServer, engine: Engine, recorder: Recorder
) -> None:
    alice = as_approver(server, "alice")
    page = page_of(alice, "ref-1")
    assert 'name="edit"' in page.text and "step <code>pay</code>" in page.text
    before = len(engine.history("acme", "ref-1"))

    bad = alice.post(
        "/console/approval", data={**decide_form(page), "decision": "approve", "edit": "{amount"}
    )
    assert bad.status_code == 409 and "the edit is not JSON" in unescape(bad.text)
    assert len(engine.history("acme", "ref-1")) == before

    form = {**decide_form(page), "decision": "approve", "edit": '{"amount": 60}'}
    assert alice.post("/console/approval", data=form).status_code == 303
    engine.run_until_idle()
    assert recorder.params["pay"] == {"task": "pay", "amount": 60, "currency": "EUR"}
