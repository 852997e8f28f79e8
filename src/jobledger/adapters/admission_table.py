"""The AdmissionGate port: ``jobledger_admission`` in the store's own database.

Each pass is one writing transaction that other passes wait for (an advisory lock on
PostgreSQL, BEGIN IMMEDIATE on SQLite), so what it counts is what it admits against:
two workers can never both take a tenant's last place. The choice itself is the core's
(:meth:`jobledger.domain.admission.Policy.choose`).
"""

from __future__ import annotations

from collections import Counter
from datetime import datetime
from typing import Any

from jobledger.adapters.backends import ADMISSION_TABLE, Cursor, StoreBackend
from jobledger.adapters.store_errors import store_errors
from jobledger.domain.admission import Group, Occupancy, Policy, Queued

WAITING, IN_FLIGHT, PARKED, LENT = 0, 1, 2, 3
_COLUMNS = "job_uuid, tenant_id, job_id, workflow_type, priority, rank"


class AdmissionTable:
    def __init__(self, backend: StoreBackend, policy: Policy) -> None:
        self.backend = backend
        self.policy = policy
        self.table = backend.table(ADMISSION_TABLE)

    # ---- the AdmissionGate port ---------------------------------------------------------

    def enter(self, job: Queued, now: datetime) -> list[Queued]:
        with store_errors("queueing a job for admission"), self.backend.transaction() as curs:
            self._serialise(curs)
            self._execute(
                curs,
                f"INSERT INTO {self.table} ({_COLUMNS}, state) VALUES (:job_uuid, :tenant_id, "
                ":job_id, :workflow_type, :priority, :rank, 0) ON CONFLICT (job_uuid) DO NOTHING",
                vars(job),
            )
            return self._pass(curs, now)

    def leave(self, job_uuid: str, now: datetime) -> list[Queued]:
        with store_errors("freeing an admitted job's place"), self.backend.transaction() as curs:
            self._serialise(curs)
            self._execute(
                curs, f"DELETE FROM {self.table} WHERE job_uuid = :job_uuid", {"job_uuid": job_uuid}
            )
            return self._pass(curs, now)

    def park(self, job_uuid: str, now: datetime) -> list[Queued]:
        return self._move("parking an admitted job", job_uuid, now, PARKED, f"= {IN_FLIGHT}")

    def lend(self, job_uuid: str, now: datetime) -> list[Queued]:
        return self._move(
            "lending an admitted job's place", job_uuid, now, LENT, f"IN ({IN_FLIGHT}, {PARKED})"
        )

    def requeue(self, job_uuid: str, now: datetime) -> list[Queued]:
        return self._move("queueing a job for its place again", job_uuid, now, WAITING, f"= {LENT}")

    def lent(self, job_uuid: str) -> bool:
        return self._state(job_uuid) == LENT

    def admit(self, now: datetime) -> list[Queued]:
        with store_errors("admitting queued jobs"), self.backend.transaction() as curs:
            self._serialise(curs)
            return self._pass(curs, now)

    def admitted(self, job_uuid: str) -> bool | None:
        state = self._state(job_uuid)
        return None if state is None else state != WAITING

    def admitted_before(self, moment: datetime, limit: int) -> list[str]:
        with store_errors("reading the admission table"):
            rows = self.backend.fetch(
                f"SELECT job_uuid FROM {self.table} WHERE state <> {WAITING} "
                "AND admitted_at < :moment ORDER BY admitted_at LIMIT :limit",
                {"moment": self.backend.ts(moment), "limit": limit},
            )
        return [row["job_uuid"] for row in rows]

    def seen(self, job_uuids: list[str], now: datetime) -> None:
        if not job_uuids:
            return
        names = {f"j{n}": uuid for n, uuid in enumerate(job_uuids)}
        with store_errors("noting admitted jobs alive"), self.backend.transaction() as curs:
            self._execute(
                curs,
                f"UPDATE {self.table} SET admitted_at = :now WHERE state <> {WAITING} "
                f"AND job_uuid IN ({', '.join(':' + name for name in names)})",
                {"now": self.backend.ts(now), **names},
            )

    def why_waiting(self, job_uuid: str) -> str | None:
        with store_errors("reading the admission table"), self.backend.reader() as curs:
            found = self._query(
                curs,
                f"SELECT {_COLUMNS} FROM {self.table} WHERE job_uuid = :job_uuid "
                f"AND state = {WAITING}",
                {"job_uuid": job_uuid},
            )
            if not found:
                return None
            job = Queued(**found[0])
            ahead = self._query(
                curs,
                f"SELECT COUNT(*) AS n FROM {self.table} WHERE state = {WAITING} "
                "AND tenant_id = :tenant_id AND rank < :rank",
                {"tenant_id": job.tenant_id, "rank": job.rank},
            )[0]["n"]
            return self.policy.why_waiting(job, self._occupancy(curs), int(ahead))

    def _move(
        self, doing: str, job_uuid: str, now: datetime, to: int, from_states: str
    ) -> list[Queued]:
        """One job from ``from_states`` (an SQL condition on its state) to ``to``, then a
        pass if it was there to move: a place it gave up may admit another job."""
        with store_errors(doing), self.backend.transaction() as curs:
            self._serialise(curs)
            moved = self._query(
                curs,
                f"UPDATE {self.table} SET state = {to} WHERE job_uuid = :job_uuid "
                f"AND state {from_states} RETURNING job_uuid",
                {"job_uuid": job_uuid},
            )
            return self._pass(curs, now) if moved else []

    def _state(self, job_uuid: str) -> int | None:
        with store_errors("reading the admission table"):
            rows = self.backend.fetch(
                f"SELECT state FROM {self.table} WHERE job_uuid = :job_uuid",
                {"job_uuid": job_uuid},
            )
        return int(rows[0]["state"]) if rows else None

    # ---- a pass ---------------------------------------------------------------------------

    def _pass(self, curs: Cursor, now: datetime) -> list[Queued]:
        # What is admitted first (bounded by the window and the limits): when the window is
        # full, as under a deep backlog, the waiting rows are not read at all.
        occupancy = self._occupancy(curs)
        free = self.policy.free(occupancy.in_flight)
        if free <= 0:
            return []
        groups = self._waiting_groups(curs)
        candidates: list[Queued] = []
        # Each group's best few: never more than the window could take, however deep.
        for group in groups:
            candidates += self._best(curs, group, free)
        chosen = self.policy.choose(candidates, occupancy)
        if chosen:
            names = {f"j{n}": job.job_uuid for n, job in enumerate(chosen)}
            self._execute(
                curs,
                f"UPDATE {self.table} SET state = {IN_FLIGHT}, admitted_at = :now "
                f"WHERE job_uuid IN ({', '.join(':' + name for name in names)})",
                {"now": self.backend.ts(now), **names},
            )
        return chosen

    def _occupancy(self, curs: Cursor) -> Occupancy:
        rows = self._query(
            curs,
            f"SELECT tenant_id, workflow_type, state, COUNT(*) AS n FROM {self.table} "
            f"WHERE state IN ({IN_FLIGHT}, {PARKED}) GROUP BY tenant_id, workflow_type, state",
            {},
        )
        running: Counter[Group] = Counter()
        in_flight = 0
        for row in rows:
            running[(row["tenant_id"], row["workflow_type"])] += int(row["n"])
            in_flight += int(row["n"]) if row["state"] == IN_FLIGHT else 0
        return Occupancy(running=running, in_flight=in_flight)

    def _waiting_groups(self, curs: Cursor) -> list[Group]:
        rows = self._query(
            curs,
            f"SELECT DISTINCT tenant_id, workflow_type FROM {self.table} WHERE state = {WAITING}",
            {},
        )
        return [(row["tenant_id"], row["workflow_type"]) for row in rows]

    def _best(self, curs: Cursor, group: Group, limit: int) -> list[Queued]:
        rows = self._query(
            curs,
            f"SELECT {_COLUMNS} FROM {self.table} WHERE state = {WAITING} "
            "AND tenant_id = :tenant_id AND workflow_type = :workflow_type "
            "ORDER BY rank LIMIT :limit",
            {"tenant_id": group[0], "workflow_type": group[1], "limit": limit},
        )
        return [Queued(**row) for row in rows]

    def _serialise(self, curs: Cursor) -> None:
        self.backend.serialise(curs, ADMISSION_TABLE)

    def _execute(self, curs: Cursor, statement: str, params: dict[str, Any]) -> None:
        curs.execute(self.backend.sql(statement), params)

    def _query(self, curs: Cursor, statement: str, params: dict[str, Any]) -> list[dict[str, Any]]:
        curs.execute(self.backend.sql(statement), params)
        return [self.backend.row(row) for row in curs.fetchall()]
