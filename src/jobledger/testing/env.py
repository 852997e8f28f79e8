"""An engine to test workflows on: a temporary SQLite store, a clock that only moves when
the test says so, a notifier that hands tokens and approval requests to the test, and
fakes for step functions.

Time is skipped, never slept: :meth:`WorkflowTestEnv.run_until` runs what is due, then
moves the clock to the next moment any job of the store is due at (a timer, a wait's
timeout, an approval's expiry, a retry, a deadline), one moment at a time, and stops as
soon as the condition holds. So nothing expires that the test did not skip to.
"""

from __future__ import annotations

import itertools
import tempfile
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Final

from pydantic import BaseModel, TypeAdapter
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource

from jobledger.adapters.clock import FakeClock
from jobledger.config import EngineConfig
from jobledger.domain.status import JobStatus
from jobledger.engine import bootstrap
from jobledger.engine.bootstrap import Parts
from jobledger.engine.engine import Engine
from jobledger.orchestration.ports import StepExecutor, Tick, WorkflowRegistry
from jobledger.projections import JobViews, StatusRow
from jobledger.testing.fakes import UNSET, FakingExecutor, StepCall, StepFake
from jobledger.testing.handle import JobHandle, WorkflowTestError
from jobledger.testing.notices import RecordingNotifier
from jobledger.workflows.code import CodeWorkflow
from jobledger.workflows.definition import WorkflowDefinition
from jobledger.workflows.tasks import Task

DEFAULT_START: Final = datetime(2026, 1, 1, tzinfo=UTC)
"""Where a test environment's clock starts, unless told otherwise."""
DEFAULT_TENANT: Final = "test"
TOKEN_SECRET: Final = "jobledger-testing-token-secret-not-for-production"
MAX_JUMPS: Final = 10_000
"""How many due moments one ``run_until`` may skip to before it gives up."""

_TIMED = (
    JobStatus.WAITING_TIME,
    JobStatus.WAITING_EVENT,
    JobStatus.AWAITING_APPROVAL,
    JobStatus.BUDGET_EXCEEDED,
    JobStatus.WAITING_CHILDREN,
)
"""The statuses whose job is due at a moment of its own: its ``resume_at`` (a timer, a
retry, a wait's timeout, an approval's expiry, a join's timeout) or its deadline. A queued
job is due now (the ticks just run took it), a running one only if its worker died."""

Workflow = CodeWorkflow | WorkflowDefinition
_JSON: TypeAdapter[Any] = TypeAdapter(Any)
"""Dumps a job's input as JSON, the pydantic models in it included."""


class _TestConfig(EngineConfig):
    """The settings a test gives, and nothing from the ``JOBLEDGER_*`` variables of the
    shell it runs in: a developer's ``JOBLEDGER_TRANSPORT=kafka`` or notifier webhook
    must not reach a test's engine."""

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        return (init_settings,)


class WorkflowTestEnv:
    """An :class:`~jobledger.Engine` on a temporary SQLite store with a time-skipping
    clock. A context manager: the store is deleted on exit.

    ``workflows``, ``tasks``, ``executor`` (the one-executor way, for the steps no
    function serves) and ``registry`` as for ``Engine.open``; ``config``: settings by
    their flat keyword (``{"lease_ms": 5000}``) over the test defaults (a token secret is
    set), the ``JOBLEDGER_*`` variables left unread; ``start``: the clock's first moment
    (timezone-aware); ``tenant``: the jobs' tenant by default."""

    def __init__(
        self,
        workflows: Sequence[Workflow] = (),
        *,
        tasks: Sequence[Task] = (),
        executor: StepExecutor | None = None,
        registry: WorkflowRegistry | None = None,
        config: Mapping[str, Any] | None = None,
        start: datetime = DEFAULT_START,
        tenant: str = DEFAULT_TENANT,
    ) -> None:
        if start.tzinfo is None:
            raise ValueError(f"start must be timezone-aware, got {start!r}")
        self.tenant = tenant
        self.clock = FakeClock(start)
        self.notifier = RecordingNotifier()
        self._code = {(w.type, w.version): w for w in workflows if isinstance(w, CodeWorkflow)}
        self._ids = itertools.count(1)
        self._directory = tempfile.TemporaryDirectory(prefix="jobledger-test-")
        try:
            self.engine = self._open(workflows, tasks, executor, registry, config or {})
        except BaseException:
            self._directory.cleanup()
            raise
        self._views = JobViews(self.engine.deps.store)

    def _open(
        self,
        workflows: Sequence[Workflow],
        tasks: Sequence[Task],
        executor: StepExecutor | None,
        registry: WorkflowRegistry | None,
        config: Mapping[str, Any],
    ) -> Engine:
        store = Path(self._directory.name) / "jobs.db"
        settings = _TestConfig(
            **{"token_secret": TOKEN_SECRET, **config, "store_url": f"sqlite:///{store}"}
        )
        parts: Parts = {
            "workflows": list(workflows),
            "tasks": list(tasks),
            "clock": self.clock,
            "notifier": self.notifier,
        }
        if executor is not None:
            parts["executor"] = executor
        if registry is not None:
            parts["registry"] = registry
        deps = bootstrap.build(settings, **parts)
        # The fakes sit in front of the executor the engine was wired with: a faked task
        # name is served by its fake, every other step as the engine would serve it.
        self._steps = None if deps.executor is None else FakingExecutor(deps.executor)
        return Engine(replace(deps, executor=self._steps) if self._steps else deps)

    # ---- lifetime ---------------------------------------------------------------------

    def close(self) -> None:
        try:
            self.engine.close()
        finally:
            self._directory.cleanup()

    def __enter__(self) -> WorkflowTestEnv:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    # ---- jobs -------------------------------------------------------------------------

    def start(
        self,
        workflow: Workflow | str,
        input: BaseModel | Mapping[str, Any] | None = None,
        *,
        job_id: str | None = None,
        tenant: str | None = None,
        version: int | None = None,
        budget: Mapping[str, Any] | None = None,
    ) -> JobHandle:
        """Submit a job of ``workflow`` (a ``@workflow``, a definition, or a type name) and
        run it until it waits: nothing that is due later runs, the clock does not move.
        ``input``: the body's arguments by parameter name, as a dict (its values may be
        pydantic models: ``{"request": MissionInput(...)}``) or a model whose fields are
        those names; ``version``: the newest by default (a ``@workflow``'s own)."""
        if isinstance(workflow, str):
            kind = workflow
        else:
            kind = workflow.type
            version = workflow.version if version is None else version
        data = _JSON.dump_python(input, mode="json")
        job_id = job_id if job_id is not None else f"{kind}-{next(self._ids)}"
        tenant = tenant if tenant is not None else self.tenant
        self.engine.submit(
            tenant, job_id, kind, workflow_version=version, input=data, budget=budget
        )
        self.run()
        return self.handle(job_id, tenant=tenant)

    def handle(self, job_id: str, *, tenant: str | None = None) -> JobHandle:
        """The handle of a job already in the store (one submitted through ``engine``)."""
        tenant = tenant if tenant is not None else self.tenant
        return JobHandle(self.engine, self.notifier, tenant, job_id, self._decode)

    def _decode(self, workflow_type: str, version: int, value: Any) -> Any:
        code = self._code.get((workflow_type, version))
        return value if code is None else code.decode_child_result(value)

    # ---- time -------------------------------------------------------------------------

    def now(self) -> datetime:
        return self.clock.now()

    def run(self) -> int:
        """Run every tick that is due now, without moving the clock; how many ran."""
        return self.engine.run_until_idle()

    def advance(self, duration: timedelta | float) -> None:
        """Move the clock ``duration`` (a timedelta, or seconds) forward, running what
        comes due on the way, each at its own moment, in order."""
        delta = duration if isinstance(duration, timedelta) else timedelta(seconds=duration)
        if delta < timedelta(0):
            raise ValueError(f"advance() goes forward only, got {duration!r}")
        self.run_until(until=self.now() + delta)

    def run_until(
        self,
        handle: JobHandle | None = None,
        *,
        status: JobStatus | str | None = None,
        until: datetime | None = None,
        predicate: Callable[[], bool] | None = None,
        max_jumps: int = MAX_JUMPS,
    ) -> None:
        """Run ticks and, while nothing is runnable, skip the clock to the next moment a
        job is due at, until ``handle`` is in ``status`` or ``predicate()`` holds; with
        only ``until``, until the clock reaches it. With ``until`` beside a condition, the
        condition must hold by then. A :class:`WorkflowTestError` when it can never hold:
        the job finished otherwise, nothing is due any more, or ``until`` passed."""
        wanted = self._wanted(handle, status, until, predicate)

        def met() -> bool:
            if wanted is not None and (handle is None or handle.status is not wanted):
                return False
            if predicate is not None and not predicate():
                return False
            return wanted is not None or predicate is not None or self._reached(until)

        self.run()
        for _ in range(max_jumps):
            if met():
                return
            self._still_reachable(handle, wanted)
            due = self.next_due()
            if until is not None and (due is None or due > until):
                if self._reached(until):
                    raise WorkflowTestError(f"not met by {until.isoformat()}: {self._why(handle)}")
                self._skip_to(until)
            elif due is None:
                raise WorkflowTestError(f"nothing is due any more: {self._why(handle)}")
            elif not self._skip_to(due) and due <= self.now():
                # Overdue already, ticked, and still nothing moved: skipping on would loop.
                raise WorkflowTestError(
                    f"a job due at {due.isoformat()} does not move: {self._why(handle)}"
                )
        raise WorkflowTestError(f"not met after {max_jumps} due moments: {self._why(handle)}")

    def next_due(self) -> datetime | None:
        """The earliest moment any unfinished job of the store is due at (children
        included): a timer, a retry, a wait's timeout, an approval's expiry, a join's
        timeout or a deadline. None when every job waits on the test (an event, a
        decision) or has finished."""
        return min((due for _, due in self._timed_jobs()), default=None)

    def _timed_jobs(self) -> list[tuple[StatusRow, datetime]]:
        """The unfinished jobs that are due at a moment of their own, as the status view
        (the reconciler's source) has them once caught up with the log."""
        self._views.catch_up()
        rows = self._views.jobs(status_in=[str(s) for s in _TIMED], limit=2**31)
        found = []
        for row in rows:
            due = min((m for m in (row.resume_at, row.deadline_at) if m is not None), default=None)
            if due is not None:
                found.append((row, due))
        return found

    def _skip_to(self, moment: datetime) -> bool:
        """Move the clock to ``moment`` and run what is due then; whether any job moved.
        A job due by then is ticked as the reconciler would tick it, should its own tick
        be later (a timer set from a tick is at least a millisecond out) or not queued at
        all (``scan_only``)."""
        self.clock.set(moment)
        now = self.clock.now()
        for row, due in self._timed_jobs():
            if due <= now:
                self.engine.queue.enqueue(
                    Tick(row.tenant_id, row.job_id, "testing"),
                    dedupe_key=f"testing:{row.version}",
                )
        self.run()
        return self._views.catch_up() > 0

    def _reached(self, until: datetime | None) -> bool:
        return until is not None and self.clock.now() >= until

    @staticmethod
    def _wanted(
        handle: JobHandle | None,
        status: JobStatus | str | None,
        until: datetime | None,
        predicate: Callable[[], bool] | None,
    ) -> JobStatus | None:
        if status is not None and handle is None:
            raise TypeError("run_until(status=...) needs the job's handle")
        if status is None and until is None and predicate is None:
            raise TypeError("run_until() needs status=, until= or predicate=")
        if until is not None and until.tzinfo is None:
            raise ValueError(f"until must be timezone-aware, got {until!r}")
        return None if status is None else JobStatus(status)

    @staticmethod
    def _still_reachable(handle: JobHandle | None, wanted: JobStatus | None) -> None:
        if handle is None or wanted is None:
            return
        now = handle.status
        if now.is_terminal and now is not wanted:
            raise WorkflowTestError(f"it can never be {wanted}: {handle.describe()}")

    def _why(self, handle: JobHandle | None) -> str:
        if handle is not None:
            return handle.describe()
        return f"the clock is at {self.now().isoformat()}"

    # ---- answers to what the jobs asked for -------------------------------------------

    def resume(
        self,
        handle: JobHandle,
        payload: Mapping[str, Any] | None = None,
        *,
        event_name: str | None = None,
    ) -> None:
        """Resume the job's event wait with the newest token it was handed (for
        ``event_name``, if given), as the outside system would, and run what follows."""
        tokens = [t for t in handle.tokens() if event_name in (None, t.event_name)]
        if not tokens:
            raise WorkflowTestError(f"no resume token was handed out: {handle.describe()}")
        self.engine.resume(tokens[-1].token.token, payload, tenant_id=handle.tenant_id)
        self.run()

    def signal(
        self,
        handle: JobHandle,
        event_name: str,
        payload: Mapping[str, Any] | None = None,
        *,
        signal_id: str | None = None,
    ) -> None:
        """Deliver the event ``event_name`` to the job by name (kept until its wait opens,
        if it does not wait for it yet), and run what follows. ``signal_id``: a new one
        by default."""
        signal = signal_id if signal_id is not None else uuid.uuid4().hex
        self.engine.signal(handle.tenant_id, handle.job_id, event_name, payload, signal_id=signal)
        self.run()

    def approve(
        self,
        handle: JobHandle,
        *,
        by: str,
        comment: str | None = None,
        data: Mapping[str, Any] | None = None,
    ) -> None:
        """Approve the job's open approval request as ``by`` (on a quorum request: vote),
        answering with ``data``, and run what follows."""
        self._decide(handle, "approved", by, comment, data)

    def reject(
        self,
        handle: JobHandle,
        *,
        by: str,
        comment: str | None = None,
        data: Mapping[str, Any] | None = None,
    ) -> None:
        """Reject the job's open approval request as ``by`` (on a quorum request: vote),
        answering with ``data``, and run what follows."""
        self._decide(handle, "rejected", by, comment, data)

    def _decide(
        self,
        handle: JobHandle,
        decision: str,
        by: str,
        comment: str | None,
        data: Mapping[str, Any] | None,
    ) -> None:
        approval_id = handle.view.pending_approval_id
        if approval_id is None:
            raise WorkflowTestError(f"no approval is open: {handle.describe()}")
        job = (handle.tenant_id, handle.job_id)
        self.engine.decide(*job, approval_id, decision, by, comment, data=data)
        self.run()

    # ---- fakes ------------------------------------------------------------------------

    def fake(
        self,
        task: Task,
        *,
        returns: Any = UNSET,
        side_effect: Callable[[StepCall], Any] | None = None,
        raises: BaseException | None = None,
    ) -> StepFake:
        """From now on, steps of ``task`` run a fake instead of its function: it returns
        ``returns`` (None when nothing is said), or what ``side_effect(call)`` returns or
        raises, or raises ``raises``; its value is checked against the task's return type
        as the function's would be. The fake records every call (``fake.calls``)."""
        steps = self._steps
        if steps is None or not steps.serves(task):
            raise ValueError(f"no workflow or task of this environment runs step {task.name!r}")
        if returns is UNSET and side_effect is None and raises is None:
            returns = None
        fake = StepFake(task, returns=returns, side_effect=side_effect, raises=raises)
        steps.fakes[task.name] = fake
        return fake


EnvFactory = Callable[..., WorkflowTestEnv]
"""Builds a :class:`WorkflowTestEnv` from its arguments."""


@contextmanager
def workflow_envs() -> Iterator[EnvFactory]:
    """A factory of test environments, each closed (its store deleted) when the block
    ends, however it ends: the ``jobledger_env`` fixture, without pytest."""
    made: list[WorkflowTestEnv] = []

    def build(*args: Any, **kwargs: Any) -> WorkflowTestEnv:
        env = WorkflowTestEnv(*args, **kwargs)
        made.append(env)
        return env

    try:
        yield build
    finally:
        for env in reversed(made):
            env.close()
