"""Notifiers: how the tokens and approval requests jobs hand out reach people and systems.

- ``MemoryNotifier`` keeps them for a caller in the same process (the demo, the README).
- ``JsonLinesNotifier`` writes each one as a JSON line to a file or to stdout.
- ``WebhookNotifier`` POSTs each one as JSON to a URL, signed with HMAC-SHA256 when a
  secret is set.

``notifier_from_spec`` turns the ``notifier`` setting into one of them, or into any
``package.module:Class`` of the user's.

A notifier runs after the step that opened the wait is durable, so it must not raise: a
lost notice is recoverable (``token reissue`` hands out a new token; ``approvals`` lists
what is pending), a tick that fails after its append is not worth that.
"""

from __future__ import annotations

import hashlib
import hmac
import importlib
import logging
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from jobledger.domain.chain import canonical_json
from jobledger.domain.errors import ConfigError
from jobledger.domain.steps import IssuedToken
from jobledger.domain.views import JobView
from jobledger.orchestration.ports import ApprovalRequest, Notifier

log = logging.getLogger(__name__)

SIGNATURE_HEADER = "X-Jobledger-Signature"


@dataclass
class MemoryNotifier:
    tokens: list[tuple[str, IssuedToken]] = field(default_factory=list)
    approvals: list[ApprovalRequest] = field(default_factory=list)

    def waiting_for_event(self, job: JobView, event_name: str, token: IssuedToken) -> None:
        self.tokens.append((event_name, token))

    def approval_requested(self, job: JobView, request: ApprovalRequest) -> None:
        self.approvals.append(request)


def token_notice(job: JobView, event_name: str, token: IssuedToken) -> dict[str, Any]:
    return {
        "type": "waiting_for_event",
        "tenant_id": job.tenant_id,
        "job_id": job.job_id,
        "step_number": job.current_step,
        "event_name": event_name,
        "token": token.token,
        "expires_at": token.expires_at,
    }


def approval_notice(job: JobView, request: ApprovalRequest) -> dict[str, Any]:
    return {
        "type": "approval_requested",
        "tenant_id": job.tenant_id,
        "job_id": job.job_id,
        "approval_id": request.approval_id,
        "step_number": request.step_number,
        "attempt": request.attempt,
        "action_sha256": request.action_sha256,
        "approvers": list(request.approvers),
        "expires_at": request.expires_at,
    }


class _NoticeNotifier:
    """Both notices go to one ``send`` that must not raise."""

    def send(self, notice: dict[str, Any]) -> None:
        raise NotImplementedError

    def waiting_for_event(self, job: JobView, event_name: str, token: IssuedToken) -> None:
        self.send(token_notice(job, event_name, token))

    def approval_requested(self, job: JobView, request: ApprovalRequest) -> None:
        self.send(approval_notice(job, request))


class JsonLinesNotifier(_NoticeNotifier):
    """One JSON object a line, flushed as it is written, to a file (appended) or a stream."""

    def __init__(self, target: Path | TextIO) -> None:
        self.target = target
        self._lock = threading.Lock()

    def send(self, notice: dict[str, Any]) -> None:
        line = canonical_json(notice) + "\n"
        try:
            with self._lock:
                if isinstance(self.target, Path):
                    with self.target.open("a", encoding="utf-8") as out:
                        out.write(line)
                else:
                    self.target.write(line)
                    self.target.flush()
        except OSError as error:
            log.error(
                "could not write the %s notice for %s: %s", notice["type"], _job(notice), error
            )


class WebhookNotifier(_NoticeNotifier):
    """POST each notice as JSON; retried with back-off on a connection error or a 5xx/429.
    With a secret, ``X-Jobledger-Signature: sha256=<hex HMAC of the body>`` lets the
    receiver check the notice came from this engine."""

    def __init__(
        self,
        url: str,
        *,
        secret: str | None = None,
        timeout: float = 5.0,
        attempts: int = 3,
        backoff: float = 0.5,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        if not url.startswith(("http://", "https://")):
            raise ConfigError(f"notifier webhook URL must be http(s)://, got {url!r}")
        self.url = url
        self.secret = secret
        self.timeout = timeout
        self.attempts = attempts
        self.backoff = backoff
        self.sleep = sleep

    def send(self, notice: dict[str, Any]) -> None:
        body = canonical_json(notice).encode()
        for attempt in range(1, self.attempts + 1):
            outcome = self._post(body)
            if outcome is None:
                return
            if attempt < self.attempts and outcome.retryable:
                self.sleep(self.backoff * 2 ** (attempt - 1))
                continue
            log.error(
                "webhook %s refused the %s notice for %s after %d attempt(s): %s",
                self.url,
                notice["type"],
                _job(notice),
                attempt,
                outcome.reason,
            )
            return

    def _post(self, body: bytes) -> _Failure | None:
        request = urllib.request.Request(self.url, data=body, method="POST")
        request.add_header("Content-Type", "application/json")
        if self.secret is not None:
            digest = hmac.new(self.secret.encode(), body, hashlib.sha256).hexdigest()
            request.add_header(SIGNATURE_HEADER, f"sha256={digest}")
        try:
            with urllib.request.urlopen(request, timeout=self.timeout):
                return None
        except urllib.error.HTTPError as error:
            return _Failure(f"HTTP {error.code}", retryable=error.code >= 500 or error.code == 429)
        except (urllib.error.URLError, OSError) as error:
            return _Failure(str(getattr(error, "reason", error)), retryable=True)


@dataclass(frozen=True)
class _Failure:
    reason: str
    retryable: bool


def _job(notice: dict[str, Any]) -> str:
    return f"{notice['tenant_id']}/{notice['job_id']}"


class Notifiers:
    """Several notifiers as one, each shielded from the others: a notice goes to every
    one of them, and one that raises is logged, not allowed to fail the tick or starve
    the rest (a user's notifier class may raise whatever it likes)."""

    def __init__(self, *notifiers: Notifier) -> None:
        self.notifiers = notifiers

    def waiting_for_event(self, job: JobView, event_name: str, token: IssuedToken) -> None:
        for notifier in self.notifiers:
            with _shielded(notifier, job):
                notifier.waiting_for_event(job, event_name, token)

    def approval_requested(self, job: JobView, request: ApprovalRequest) -> None:
        for notifier in self.notifiers:
            with _shielded(notifier, job):
                notifier.approval_requested(job, request)


@contextmanager
def _shielded(notifier: Notifier, job: JobView) -> Iterator[None]:
    try:
        yield
    except Exception:
        name = type(notifier).__name__
        log.exception("notifier %s failed for %s/%s", name, job.tenant_id, job.job_id)


def notifier_from_spec(
    spec: str, *, secret: str | None = None, base: Path | None = None
) -> Notifier:
    """``stdout``, ``file:PATH`` (relative to ``base``), ``webhook:URL``, or
    ``package.module:Class`` (constructed without arguments)."""
    if spec == "stdout":
        return JsonLinesNotifier(sys.stdout)
    if spec.startswith("file:"):
        path = Path(spec.removeprefix("file:"))
        if not path.is_absolute() and base is not None:
            path = base / path
        return JsonLinesNotifier(path)
    if spec.startswith("webhook:"):
        return WebhookNotifier(spec.removeprefix("webhook:"), secret=secret)
    return _user_notifier(spec)


def _user_notifier(spec: str) -> Notifier:
    module_name, _, class_name = spec.partition(":")
    if not module_name or not class_name:
        raise ConfigError(
            f"notifier {spec!r}: expected stdout, file:PATH, webhook:URL or package.module:Class"
        )
    try:
        factory = getattr(importlib.import_module(module_name), class_name)
    except (ImportError, AttributeError) as error:
        raise ConfigError(f"notifier {spec!r} cannot be loaded: {error}") from None
    notifier = factory()
    if not (hasattr(notifier, "waiting_for_event") and hasattr(notifier, "approval_requested")):
        raise ConfigError(
            f"notifier {spec!r} has no waiting_for_event/approval_requested: not a notifier"
        )
    return notifier  # type: ignore[no-any-return]
