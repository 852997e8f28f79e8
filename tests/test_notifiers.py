"""Tokens and approval requests reach people: as JSON lines (file or stdout) or as signed
webhook POSTs to a real HTTP server on a loopback port; a notifier never fails a tick."""

from __future__ import annotations

import hashlib
import hmac
import io
import json
import threading
from collections.abc import Iterator
from datetime import UTC, datetime
from decimal import Decimal
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from jobledger.adapters.notifier import (
    SIGNATURE_HEADER,
    JsonLinesNotifier,
    MemoryNotifier,
    Notifiers,
    WebhookNotifier,
    notifier_from_spec,
)
from jobledger.domain.errors import ConfigError
from jobledger.domain.status import JobStatus
from jobledger.domain.steps import IssuedToken
from jobledger.domain.views import JobView
from jobledger.orchestration.ports import ApprovalRequest

NOW = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
TOKEN = IssuedToken(token="eyJ.token", nonce="n1", token_sha256="ab" * 32, expires_at=NOW)
REQUEST = ApprovalRequest(
    approval_id="ap-1",
    step_number=4,
    attempt=1,
    action_sha256="cd" * 32,
    approvers=("alice", "bob"),
    expires_at=NOW,
)


def job_view() -> JobView:
    return JobView(
        tenant_id="t",
        job_id="j",
        workflow_type="w",
        workflow_version=1,
        status=JobStatus.WAITING_EVENT,
        current_step=3,
        state={},
        budget={},
        version=7,
        attempt=0,
        total_steps_executed=3,
        total_cost_usd=Decimal(0),
        resume_at=None,
        wait_event_name="paid",
        worker_id=None,
        lease_until=None,
        last_error=None,
        mission_id=None,
        employee_id=None,
        correlation_id=None,
        created_at=NOW,
        updated_at=NOW,
        completed_at=None,
        next_step=None,
        pending_approval_id=None,
        buffered_signals=0,
    )


class Receiver(BaseHTTPRequestHandler):
    statuses: list[int] = []
    received: list[tuple[dict[str, str], bytes]] = []

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        self.received.append((dict(self.headers), body))
        status = self.statuses.pop(0) if self.statuses else 200
        self.send_response(status)
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def receiver() -> Iterator[tuple[str, type[Receiver]]]:
    handler = type("Handler", (Receiver,), {"statuses": [], "received": []})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/hook", handler
    server.shutdown()
    server.server_close()


def test_json_lines_notifier_writes_one_line_per_notice_to_a_file(tmp_path: Path) -> None:
    out = tmp_path / "notices.jsonl"
    notifier = JsonLinesNotifier(out)
    notifier.waiting_for_event(job_view(), "paid", TOKEN)
    notifier.approval_requested(job_view(), REQUEST)
    first, second = (json.loads(line) for line in out.read_text().splitlines())
    assert first == {
        "type": "waiting_for_event",
        "tenant_id": "t",
        "job_id": "j",
        "step_number": 3,
        "event_name": "paid",
        "token": "eyJ.token",
        "expires_at": NOW.isoformat(),
    }
    assert second["type"] == "approval_requested"
    assert second["approval_id"] == "ap-1"
    assert second["approvers"] == ["alice", "bob"]
    assert second["action_sha256"] == "cd" * 32


def test_json_lines_notifier_on_a_stream() -> None:
    stream = io.StringIO()
    JsonLinesNotifier(stream).waiting_for_event(job_view(), "paid", TOKEN)
    assert json.loads(stream.getvalue())["token"] == "eyJ.token"


def test_a_json_lines_notifier_that_cannot_write_logs_and_does_not_raise(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    JsonLinesNotifier(tmp_path / "missing-dir" / "x.jsonl").approval_requested(job_view(), REQUEST)
    assert "could not write the approval_requested notice for t/j" in caplog.text


def test_webhook_posts_signed_json(receiver: tuple[str, type[Receiver]]) -> None:
    url, handler = receiver
    WebhookNotifier(url, secret="s3cret").waiting_for_event(job_view(), "paid", TOKEN)
    [(headers, body)] = handler.received
    assert json.loads(body)["token"] == "eyJ.token"
    assert headers["Content-Type"] == "application/json"
    expected = hmac.new(b"s3cret", body, hashlib.sha256).hexdigest()
    assert headers[SIGNATURE_HEADER] == f"sha256={expected}"


def test_webhook_retries_a_5xx_then_delivers(receiver: tuple[str, type[Receiver]]) -> None:
    url, handler = receiver
    handler.statuses.extend([503, 500])
    slept: list[float] = []
    WebhookNotifier(url, sleep=slept.append).approval_requested(job_view(), REQUEST)
    assert len(handler.received) == 3
    assert slept == [0.5, 1.0]
    assert SIGNATURE_HEADER not in handler.received[0][0]


def test_webhook_does_not_retry_a_4xx_and_does_not_raise(
    receiver: tuple[str, type[Receiver]], caplog: pytest.LogCaptureFixture
) -> None:
    url, handler = receiver
    handler.statuses.append(404)
    WebhookNotifier(url, sleep=lambda _: None).approval_requested(job_view(), REQUEST)
    assert len(handler.received) == 1
    assert "refused the approval_requested notice for t/j after 1 attempt(s): HTTP 404" in (
        caplog.text
    )


def test_an_unreachable_webhook_is_logged_after_its_attempts(
    caplog: pytest.LogCaptureFixture,
) -> None:
    WebhookNotifier("http://127.0.0.1:9/hook", sleep=lambda _: None, timeout=1).approval_requested(
        job_view(), REQUEST
    )
    assert "after 3 attempt(s)" in caplog.text


def test_specs_name_the_built_in_notifiers_and_user_classes(tmp_path: Path) -> None:
    assert isinstance(notifier_from_spec("stdout"), JsonLinesNotifier)
    file_notifier = notifier_from_spec("file:notices.jsonl", base=tmp_path)
    assert isinstance(file_notifier, JsonLinesNotifier)
    assert file_notifier.target == tmp_path / "notices.jsonl"
    hook = notifier_from_spec("webhook:https://example.test/x", secret="k")
    assert isinstance(hook, WebhookNotifier) and hook.secret == "k"
    user = notifier_from_spec("jobledger.adapters.notifier:MemoryNotifier")
    assert isinstance(user, MemoryNotifier)


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("nonsense", "expected stdout, file:PATH, webhook:URL or package.module:Class"),
        ("no.such.module:Thing", "cannot be loaded"),
        ("jobledger.domain.errors:ConfigError", "not a notifier"),
        ("webhook:ftp://x", "must be http(s)://"),
    ],
)
def test_a_bad_notifier_spec_says_what_is_wrong(spec: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        notifier_from_spec(spec)


class Exploding:
    def waiting_for_event(self, job: JobView, event_name: str, token: IssuedToken) -> None:
        raise RuntimeError("boom")

    def approval_requested(self, job: JobView, request: ApprovalRequest) -> None:
        raise RuntimeError("boom")


def test_notifiers_reach_every_one_and_one_that_raises_is_logged_not_fatal(
    caplog: pytest.LogCaptureFixture,
) -> None:
    kept = MemoryNotifier()
    both = Notifiers(Exploding(), kept)
    both.waiting_for_event(job_view(), "paid", TOKEN)
    both.approval_requested(job_view(), REQUEST)
    assert kept.tokens == [("paid", TOKEN)] and kept.approvals == [REQUEST]
    assert caplog.text.count("notifier Exploding failed for t/j") == 2
