"""The Leases port's promises (orchestration.ports.Leases): one row per running job, and of a
heartbeat and a take-over racing for it exactly one wins. Moved here from
tests/test_leases.py, which keeps what the engine does with them."""

from __future__ import annotations

import threading
from datetime import timedelta
from uuid import UUID, uuid4

import pytest

from jobledger.adapters.clock import FakeClock
from jobledger.orchestration.ports import Lease, Leases


def lease(job: UUID, claim: str, epoch: int, until_s: float, clock: FakeClock) -> Lease:
    return Lease(job, claim, f"worker-{claim}", epoch, clock.now() + timedelta(seconds=until_s))


def race(table: Leases, clock: FakeClock, job: UUID) -> dict[str, bool]:
    """The old claim's heartbeat and a take-over of it, started together on separate
    connections: which of them wrote."""
    barrier = threading.Barrier(2)
    results: dict[str, bool] = {}

    def beat() -> None:
        barrier.wait()
        results["old"] = table.renew(lease(job, "old", 2, 15, clock))

    def take() -> None:
        barrier.wait()
        wanted = lease(job, "new", 3, 15, clock)
        results["new"] = table.take_over(wanted, from_claim="old", now=clock.now()) is None

    threads = [threading.Thread(target=beat), threading.Thread(target=take)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return results


class LeasesContract:
    """Subclasses provide ``table``: the lease table of an empty store of their kind."""

    def test_a_heartbeat_that_landed_first_refuses_the_take_over(
        self, table: Leases, clock: FakeClock
    ) -> None:
        job = uuid4()
        assert table.renew(lease(job, "old", 2, 15, clock))
        in_the_way = table.take_over(
            lease(job, "new", 3, 15, clock), from_claim="old", now=clock.now()
        )
        assert in_the_way is not None and (in_the_way.claim_id, in_the_way.epoch) == ("old", 2)
        assert table.renew(lease(job, "old", 2, 15, clock))  # the owner keeps beating

    def test_a_take_over_that_landed_first_makes_the_old_heartbeat_lose(
        self, table: Leases, clock: FakeClock
    ) -> None:
        job = uuid4()
        assert table.renew(lease(job, "old", 2, 15, clock))
        clock.advance(timedelta(seconds=16))  # the old worker stopped beating: its row lapsed
        assert (
            table.take_over(lease(job, "new", 3, 15, clock), from_claim="old", now=clock.now())
            is None
        )
        assert not table.renew(lease(job, "old", 2, 15, clock))  # it lost, and for good
        assert table.get(job) == lease(job, "new", 3, 15, clock)
        assert table.renew(lease(job, "new", 3, 15, clock))

    def test_a_take_over_under_way_refuses_a_second_taker_until_it_lapses(
        self, table: Leases, clock: FakeClock
    ) -> None:
        job = uuid4()
        assert (
            table.take_over(lease(job, "a", 3, 15, clock), from_claim="old", now=clock.now())
            is None
        )
        blocked = table.take_over(lease(job, "b", 3, 15, clock), from_claim="old", now=clock.now())
        assert blocked is not None and blocked.claim_id == "a"
        clock.advance(timedelta(seconds=16))  # "a" died before appending its Claimed
        assert (
            table.take_over(lease(job, "b", 3, 15, clock), from_claim="old", now=clock.now())
            is None
        )

    def test_a_stale_row_of_an_older_claim_never_blocks_a_newer_one(
        self, table: Leases, clock: FakeClock
    ) -> None:
        """A finished step's row (claim "x", epoch 2) is still live when the job's next claim
        (epoch 5) beats or is taken over; an older claim can never overwrite a newer one."""
        job = uuid4()
        assert table.renew(lease(job, "x", 2, 15, clock))
        assert table.renew(lease(job, "y", 5, 15, clock))
        assert not table.renew(lease(job, "x", 2, 15, clock))  # a zombie of the older claim
        other = uuid4()
        assert table.renew(lease(other, "x", 2, 15, clock))
        taken = table.take_over(lease(other, "z", 6, 15, clock), from_claim="y", now=clock.now())
        assert taken is None

    @pytest.mark.parametrize("row_before", ["absent", "lapsed"])
    def test_a_heartbeat_racing_a_take_over_leaves_exactly_one_owner(
        self, row_before: str, table: Leases, clock: FakeClock
    ) -> None:
        """Many times over: one of them wins, never both and never neither, and the row names
        the winner."""
        for _ in range(40):
            job = uuid4()
            if row_before == "lapsed":
                assert table.renew(lease(job, "old", 2, -1, clock))
            results = race(table, clock, job)
            (winner,) = [claim for claim, won in results.items() if won]
            row = table.get(job)
            assert row is not None and row.claim_id == winner
