"""The ResumeTokens port's promises (jobledger.orchestration.ports.ResumeTokens)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from jobledger.domain.errors import ExpiredTokenError, InvalidTokenError
from jobledger.domain.views import JobView
from jobledger.orchestration.ports import ResumeTokens
from tests.contracts.job_store import submitted

NOW = datetime(2026, 1, 1, tzinfo=UTC)


def job_view() -> JobView:
    return JobView.of(submitted("j", "t"))


class ResumeTokensContract:
    """Subclasses provide ``tokens`` (issuing with a time to live of ``ttl``) and
    ``stranger``: tokens of another deployment (another secret)."""

    ttl = timedelta(hours=1)

    def test_a_token_verifies_to_what_it_was_issued_for(self, tokens: ResumeTokens) -> None:
        issued = tokens.issue(job_view(), step_number=2, event_name="invoice.paid", now=NOW)
        claims = tokens.verify(issued.token, now=NOW + timedelta(minutes=1))
        assert (claims.tenant_id, claims.job_id, claims.step_number, claims.event_name) == (
            "t",
            "j",
            2,
            "invoice.paid",
        )
        assert (claims.workflow_version, claims.nonce) == (1, issued.nonce)
        assert claims.expires_at == issued.expires_at == NOW + self.ttl

    def test_every_token_has_its_own_nonce(self, tokens: ResumeTokens) -> None:
        nonces = {
            tokens.issue(job_view(), step_number=2, event_name="e", now=NOW).nonce for _ in range(5)
        }
        assert len(nonces) == 5

    def test_a_token_expires_after_its_time_to_live(self, tokens: ResumeTokens) -> None:
        issued = tokens.issue(job_view(), step_number=2, event_name="e", now=NOW)
        with pytest.raises(ExpiredTokenError):
            tokens.verify(issued.token, now=NOW + self.ttl)

    def test_a_token_never_expires_before_the_wait_it_belongs_to(
        self, tokens: ResumeTokens
    ) -> None:
        wait_ends = NOW + 7 * self.ttl
        issued = tokens.issue(
            job_view(), step_number=2, event_name="e", now=NOW, lasts_until=wait_ends
        )
        assert issued.expires_at == wait_ends
        assert tokens.verify(issued.token, now=wait_ends - timedelta(seconds=1)).step_number == 2
        with pytest.raises(ExpiredTokenError):
            tokens.verify(issued.token, now=wait_ends)

    def test_a_forged_or_foreign_token_is_refused_as_invalid(
        self, tokens: ResumeTokens, stranger: ResumeTokens
    ) -> None:
        issued = tokens.issue(job_view(), step_number=2, event_name="e", now=NOW)
        foreign = stranger.issue(job_view(), step_number=2, event_name="e", now=NOW)
        head, body, signature = issued.token.split(".")
        tampered = f"{head}.{body}.{signature[::-1]}"
        for bad in (foreign.token, tampered, "not-a-token", ""):
            with pytest.raises(InvalidTokenError):
                tokens.verify(bad, now=NOW)
