"""A process for tests/test_approvals_quorum.py's SIGKILL test:
``python -m tests.support.vote_worker --store URL --tenant T --job J --approval A --voter V
--hang before|after --marker FILE``.

It casts the voter's vote and hangs at its append, before it commits or right after,
having written the marker file, so the test can SIGKILL it at exactly that point.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from jobledger import EngineConfig
from jobledger.domain.job import Job
from jobledger.domain.keys import ConsumedKey
from jobledger.orchestration.ports import JobStore
from tests.support.approvals import approvals_registry
from tests.support.engines import StoreAround, open_engine


class HangAtVote(StoreAround):
    def __init__(self, inner: JobStore, voter: str, after_commit: bool, marker: Path) -> None:
        super().__init__(inner)
        self.voter, self.after_commit, self.marker = voter, after_commit, marker

    def append(self, job: Job, *keys: ConsumedKey) -> None:
        votes = [e for e in job.pending_events if isinstance(e, Job.ApprovalVoted)]
        hangs = any(vote.voted_by == self.voter for vote in votes)
        if hangs and not self.after_commit:
            self._hang()
        self.inner.append(job, *keys)
        if hangs:
            self._hang()

    def _hang(self) -> None:
        self.marker.write_text("hanging")
        time.sleep(600)  # until the test's SIGKILL


def main() -> None:
    parser = argparse.ArgumentParser()
    for name in ("--store", "--tenant", "--job", "--approval", "--voter", "--marker"):
        parser.add_argument(name, required=True)
    parser.add_argument("--hang", choices=("before", "after"), required=True)
    args = parser.parse_args()
    after, marker = args.hang == "after", Path(args.marker)
    engine = open_engine(
        config=EngineConfig(store_url=args.store, worker_id="voter"),
        registry=approvals_registry(),
        wrap_store=lambda store: HangAtVote(store, args.voter, after, marker),
    )
    engine.decide(args.tenant, args.job, args.approval, "approve", args.voter)


if __name__ == "__main__":
    main()
