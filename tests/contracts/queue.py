"""The Queue port's promises (jobledger.orchestration.ports.Queue)."""

from __future__ import annotations

from collections import Counter
from typing import ClassVar

from jobledger.orchestration.ports import Queue, Tick


class QueueContract:
    """Subclasses provide a ``queue`` fixture and :meth:`delivered`.

    ``dedupes`` says what the adapter does with a dedupe key: True, a pending tick with
    the same job and key makes a second enqueue a no-op (the in-process queue); False,
    the key travels with the tick and the second is a harmless re-delivery (Kafka keeps
    no set of pending ticks: claims and step keys make every tick idempotent)."""

    dedupes: ClassVar[bool]

    def delivered(self, queue: Queue, *, at_least: int) -> list[Tick]:
        """Every tick a consumer has received since the test began, in delivery order
        per job (waiting, within reason, until there are ``at_least``)."""
        raise NotImplementedError

    def test_a_tick_is_delivered_with_its_job_and_reason(self, queue: Queue) -> None:
        queue.enqueue(Tick("t", "j", "signal"))
        assert self.delivered(queue, at_least=1) == [Tick("t", "j", "signal")]

    def test_the_ticks_of_one_job_arrive_in_the_order_they_were_enqueued(
        self, queue: Queue
    ) -> None:
        for reason in ("first", "second", "third"):
            queue.enqueue(Tick("t", "j", reason))
        got = self.delivered(queue, at_least=3)
        assert [tick.reason for tick in got] == ["first", "second", "third"]

    def test_a_delayed_tick_is_not_delivered_before_it_is_due(self, queue: Queue) -> None:
        queue.enqueue(Tick("t", "later", "timer"), delay_ms=60_000)
        queue.enqueue(Tick("t", "now", "queue"))
        assert self.delivered(queue, at_least=1) == [Tick("t", "now", "queue")]

    def test_a_dedupe_key_suppresses_a_pending_duplicate_or_it_is_a_redelivery(
        self, queue: Queue
    ) -> None:
        queue.enqueue(Tick("t", "j", "queue"), dedupe_key="d")
        queue.enqueue(Tick("t", "j", "queue"), dedupe_key="d")
        queue.enqueue(Tick("t", "k", "queue"), dedupe_key="d")  # the key is per job
        ticks = self.delivered(queue, at_least=2 if self.dedupes else 3)
        got = Counter(tick.job_id for tick in ticks)
        assert got == ({"j": 1, "k": 1} if self.dedupes else {"j": 2, "k": 1})

    def test_a_delivered_tick_no_longer_holds_its_dedupe_key(self, queue: Queue) -> None:
        queue.enqueue(Tick("t", "j", "queue"), dedupe_key="d")
        assert len(self.delivered(queue, at_least=1)) == 1
        queue.enqueue(Tick("t", "j", "queue"), dedupe_key="d")
        assert len(self.delivered(queue, at_least=2)) == 2
