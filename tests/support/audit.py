"""Shared by the audit tests: a mission definition that uses every step kind, an agent
for it, a registry that records every request the engine resolved, and raw SQL access to
the stored events (to tamper with them as an attacker with database access would)."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs, urlsplit, urlunsplit
from uuid import UUID

import psycopg
from eventsourcing.utils import get_topic

from jobledger import Resolution, ResolveRequest, StepError, StepRequest, StepResult
from jobledger.domain import chain
from jobledger.workflows import DefinitionRegistry, WorkflowDefinition, parse_definition

MISSION_V1 = """
type: mission
version: 1
start: plan
steps:
  plan: {kind: run_interaction_task, params: {task: plan}, next: check}
  check:
    kind: branch
    cases: [{when: {path: score, op: ">=", value: 0.8}, next: payment}]
    default: revise
  revise: {kind: run_interaction_task, max_visits: 3, params: {task: revise}, next: check}
  payment:
    kind: wait_event
    event: invoice.paid
    timeout: {days: 2}
    on_timeout: chase
    next: cool
  chase: {kind: run_interaction_task, params: {task: chase}, next: review}
  cool: {kind: wait_time, delay: {hours: 1}, next: review}
  review:
    kind: await_approval
    approvers: [lead]
    expires: {days: 3}
    on_approve: publish
    on_reject: revise
    on_expire: expired
  publish: {kind: run_interaction_task, params: {task: publish}, next: done}
  done: {kind: complete}
  expired: {kind: fail, reason: nobody reviewed it}
"""


def mission(version: int, *changes: tuple[str, str]) -> str:
    """MISSION_V1 as another version, with some text replaced."""
    text = MISSION_V1.replace("version: 1", f"version: {version}")
    for old, new in changes:
        assert old in text, old
        text = text.replace(old, new)
    return text


def definition(text: str) -> WorkflowDefinition:
    return parse_definition(text, "mission.yaml")


class ScoringAgent:
    """plan scores 0.5, each revise adds 0.2; ``fail_once`` makes a task's first run
    raise a retryable error."""

    def __init__(self, fail_once: set[str] | None = None) -> None:
        self.calls: list[str] = []
        self.fail_once = set(fail_once or ())

    def execute(self, request: StepRequest) -> StepResult:
        self.calls.append(request.idempotency_key)
        task = request.resolution.params["task"]
        if task in self.fail_once:
            self.fail_once.discard(task)
            raise StepError("rate limited", retryable=True, kind="rate_limited")
        patch: dict[str, Any] = {f"did_{task}": True}
        if task == "plan":
            patch["score"] = 0.5
        elif task == "revise":
            patch["score"] = round(float(request.job.state.get("score", 0)) + 0.2, 2)
        return StepResult(output={"task": task}, state_patch=patch, cost_usd="0.25")


@dataclass
class RecordingRegistry:
    """A DefinitionRegistry that remembers every request the engine resolved."""

    inner: DefinitionRegistry
    requests: list[ResolveRequest] = field(default_factory=list)

    def latest_version(self, workflow_type: str) -> int:
        return self.inner.latest_version(workflow_type)

    def has(self, workflow_type: str, workflow_version: int) -> bool:
        return self.inner.has(workflow_type, workflow_version)

    def known(self) -> list[tuple[str, int]]:
        return self.inner.known()

    def budget_defaults(self, workflow_type: str, workflow_version: int) -> dict[str, Any]:
        return self.inner.budget_defaults(workflow_type, workflow_version)

    def personal_data(self, workflow_type: str, workflow_version: int) -> tuple[str, ...]:
        return self.inner.personal_data(workflow_type, workflow_version)

    def resolve(self, request: ResolveRequest) -> Resolution:
        self.requests.append(request)
        return self.inner.resolve(request)


# ---- the stored rows, by SQL ---------------------------------------------------------------


@dataclass(frozen=True)
class Row:
    version: int
    topic: str
    state: bytes


class RawEvents:
    """SQL straight on ``jobledger_p0_events`` (the state column is the JSON event)."""

    def __init__(self, store_url: str) -> None:
        self.url = store_url
        parts = urlsplit(store_url)
        self.sqlite = parts.scheme == "sqlite"
        if self.sqlite:
            self.path = parts.path[1:]
            self.table = "jobledger_p0_events"
        else:
            schema = parse_qs(parts.query)["schema"][-1]
            self.dsn = urlunsplit(parts._replace(query=""))
            self.table = f'"{schema}".jobledger_p0_events'

    @contextmanager
    def cursor(self) -> Iterator[Any]:
        if self.sqlite:
            lite = sqlite3.connect(self.path)
            try:
                with lite:
                    yield lite.cursor()
            finally:
                lite.close()
        else:
            with psycopg.connect(self.dsn) as pg, pg.cursor() as curs:
                yield curs

    def _id(self, job_uuid: UUID) -> Any:
        return job_uuid.hex if self.sqlite else job_uuid

    def _sql(self, statement: str) -> str:
        return statement.format(t=self.table).replace("?", "?" if self.sqlite else "%s")

    def rows(self, job_uuid: UUID) -> list[Row]:
        with self.cursor() as curs:
            curs.execute(
                self._sql(
                    "SELECT originator_version, topic, state FROM {t} "
                    "WHERE originator_id = ? ORDER BY originator_version"
                ),
                [self._id(job_uuid)],
            )
            return [Row(int(v), str(topic), bytes(state)) for v, topic, state in curs.fetchall()]

    def replace_in_state(self, job_uuid: UUID, version: int, old: str, new: str) -> None:
        """UPDATE one stored event, replacing text inside its JSON."""
        if self.sqlite:
            statement = (
                "UPDATE {t} SET state = CAST(replace(CAST(state AS TEXT), ?, ?) AS BLOB) "
                "WHERE originator_id = ? AND originator_version = ?"
            )
        else:
            statement = (
                "UPDATE {t} SET state = convert_to(replace(convert_from(state, 'UTF8'), ?, ?), "
                "'UTF8') WHERE originator_id = ? AND originator_version = ?"
            )
        before = self.rows(job_uuid)[version - 1].state
        with self.cursor() as curs:
            curs.execute(self._sql(statement), [old, new, self._id(job_uuid), version])
            assert curs.rowcount == 1
        assert self.rows(job_uuid)[version - 1].state != before, f"{old!r} not in v{version}"

    def set_state(self, job_uuid: UUID, version: int, topic: str, state: bytes) -> None:
        with self.cursor() as curs:
            curs.execute(
                self._sql(
                    "UPDATE {t} SET topic = ?, state = ? "
                    "WHERE originator_id = ? AND originator_version = ?"
                ),
                [topic, state, self._id(job_uuid), version],
            )
            assert curs.rowcount == 1

    def swap(self, job_uuid: UUID, first: int, second: int) -> None:
        """Two UPDATEs in one transaction: each row takes the other's topic and state."""
        rows = {row.version: row for row in self.rows(job_uuid)}
        with self.cursor() as curs:
            for mine, theirs in ((first, second), (second, first)):
                curs.execute(
                    self._sql(
                        "UPDATE {t} SET topic = ?, state = ? "
                        "WHERE originator_id = ? AND originator_version = ?"
                    ),
                    [rows[theirs].topic, rows[theirs].state, self._id(job_uuid), mine],
                )

    def swap_jobs(self, first: UUID, second: UUID, version: int | None = None) -> None:
        """Each job's rows (or only its row at ``version``) take the other job's
        originator_id, by UPDATEs in one transaction: the rows' bodies stay as written."""
        only = "" if version is None else " AND originator_version = ?"
        at = [] if version is None else [version]
        parked = UUID(int=0)
        with self.cursor() as curs:
            for source, target in ((first, parked), (second, first), (parked, second)):
                curs.execute(
                    self._sql("UPDATE {t} SET originator_id = ? WHERE originator_id = ?" + only),
                    [self._id(target), self._id(source), *at],
                )
                assert curs.rowcount >= 1

    def delete(self, job_uuid: UUID, version: int, *, and_after: bool = False) -> int:
        comparison = ">=" if and_after else "="
        with self.cursor() as curs:
            curs.execute(
                self._sql(
                    f"DELETE FROM {{t}} WHERE originator_id = ? "
                    f"AND originator_version {comparison} ?"
                ),
                [self._id(job_uuid), version],
            )
            return int(curs.rowcount)

    def rehash_tail(
        self, events: list[Any], start: int, edit: Callable[[Any, dict[str, Any]], None]
    ) -> None:
        """What someone with write access to the store but no signing key can do: edit
        the events from ``events[start]`` on, recompute every chain hash from there with
        ``chain.link`` and write the rows back in the stored format, unsigned."""
        previous = events[start - 1].chain_hash
        for event in events[start:]:
            fields = chain.event_fields(event)
            edit(event, fields)
            event_type = type(event).__qualname__
            chain_hash = chain.link(previous, event_type, fields)
            body = chain.canonical_bytes(event_type, fields)
            state = b'{"chain_hash":"' + chain_hash.encode() + b'","event":' + body + b"}"
            self.set_state(
                event.originator_id, event.originator_version, get_topic(type(event)), state
            )
            previous = chain_hash
