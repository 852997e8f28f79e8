"""The actions a batch can take, by name: each checks its parameters before anything is
written (they are stored in the batch as JSON) and acts on one job through the job
commands or the repair commands. A new action is one entry here.

``reset`` names its step by number, the same for every job of the batch: the job runs
again from after its step N (0: from the start), as ``jobledger reset`` does; a job with
fewer steps recorded is refused by the reset and so skipped, with why."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal, InvalidOperation
from typing import Any

from jobledger.domain.errors import InvalidPayloadError
from jobledger.engine.job_commands import JobCommands
from jobledger.engine.repair_commands import RepairCommands

Params = dict[str, Any]


@dataclass(frozen=True)
class Commands:
    """What an action acts through: the commands on jobs, and the repairs (retry, reset)."""

    jobs: JobCommands
    repairs: RepairCommands


@dataclass(frozen=True)
class Who:
    """Who asked for the batch, why, and which batch it is: each action records them."""

    batch_id: str
    by: str
    reason: str


@dataclass(frozen=True)
class BulkAction:
    name: str
    check: Callable[[Params], Params]
    """The parameters as stored (JSON), or InvalidPayloadError saying what is wrong."""
    act: Callable[[Commands, str, str, Params, Who], None]
    """Act on one job (tenant, job id): raises what the job command raises."""


def _fields(params: Params, allowed: set[str], action: str) -> None:
    unknown = sorted(set(params) - allowed)
    if unknown:
        expected = ", ".join(sorted(allowed)) or "none"
        raise InvalidPayloadError(
            f"{action} takes no parameter {', '.join(unknown)} (it takes: {expected})"
        )


def _no_params(action: str) -> Callable[[Params], Params]:
    def check(params: Params) -> Params:
        _fields(params, set(), action)
        return {}

    return check


def _signal_params(params: Params) -> Params:
    _fields(params, {"event_name", "payload"}, "signal")
    name, payload = params.get("event_name"), params.get("payload") or {}
    if not isinstance(name, str) or not name:
        raise InvalidPayloadError("signal needs the event name (event_name)")
    if not isinstance(payload, dict):
        raise InvalidPayloadError("a signal's payload must be a JSON object")
    return {"event_name": name, "payload": payload}


def _budget_params(params: Params) -> Params:
    _fields(params, {"max_steps", "max_cost_usd", "deadline_at"}, "raise-budget")
    checked: Params = {}
    steps = params.get("max_steps")
    if steps is not None:
        if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
            raise InvalidPayloadError(f"max_steps must be a whole number >= 1, got {steps!r}")
        checked["max_steps"] = steps
    cost = params.get("max_cost_usd")
    if cost is not None:
        try:
            amount = Decimal(str(cost))
        except InvalidOperation:
            raise InvalidPayloadError(f"max_cost_usd must be a number, got {cost!r}") from None
        if not amount.is_finite() or amount < 0:
            raise InvalidPayloadError(f"max_cost_usd must be >= 0, got {cost!r}")
        checked["max_cost_usd"] = str(amount)
    deadline = params.get("deadline_at")
    if deadline is not None:
        checked["deadline_at"] = _moment(deadline).isoformat()
    if not checked:
        raise InvalidPayloadError("raise-budget needs max_steps, max_cost_usd or deadline_at")
    return checked


def _moment(value: object) -> datetime:
    try:
        moment = value if isinstance(value, datetime) else datetime.fromisoformat(str(value))
    except ValueError:
        raise InvalidPayloadError(f"deadline_at must be an ISO 8601 time, got {value!r}") from None
    if moment.tzinfo is None:
        raise InvalidPayloadError(f"deadline_at must say its time zone, got {value!r}")
    return moment


def _version(params: Params, action: str, *, required: bool) -> int | None:
    version = params.get("to_version")
    if version is None and not required:
        return None
    if isinstance(version, bool) or not isinstance(version, int) or version < 1:
        need = "needs to_version," if required else "takes to_version as"
        raise InvalidPayloadError(f"{action} {need} a version >= 1, got {version!r}")
    return version


def _migrate_params(params: Params) -> Params:
    _fields(params, {"to_version", "force"}, "migrate")
    force = params.get("force", False)
    version = _version(params, "migrate", required=True)
    if not isinstance(force, bool):
        raise InvalidPayloadError(f"force must be true or false, got {force!r}")
    return {"to_version": version, "force": force}


def _retry_params(params: Params) -> Params:
    _fields(params, {"to_version"}, "retry")
    return {"to_version": _version(params, "retry", required=False)}


def _reset_params(params: Params) -> Params:
    _fields(params, {"step", "to_version"}, "reset")
    step = params.get("step")
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise InvalidPayloadError(
            f"reset needs step, the step number to run again after (0: from the start), "
            f"got {step!r}"
        )
    return {"step": step, "to_version": _version(params, "reset", required=False)}


def _cancel(c: Commands, tenant_id: str, job_id: str, p: Params, who: Who) -> None:
    c.jobs.cancel(tenant_id, job_id, who.reason, who.by)


def _signal(c: Commands, tenant_id: str, job_id: str, p: Params, who: Who) -> None:
    # The batch's own signal id: a job takes the batch's signal once, as any signal.
    signal_id = f"batch:{who.batch_id}"
    c.jobs.signal(tenant_id, job_id, p["event_name"], p["payload"], signal_id=signal_id)


def _raise_budget(c: Commands, tenant_id: str, job_id: str, p: Params, who: Who) -> None:
    deadline = p.get("deadline_at")
    c.jobs.raise_budget(
        tenant_id,
        job_id,
        raised_by=who.by,
        reason=who.reason,
        max_steps=p.get("max_steps"),
        max_cost_usd=p.get("max_cost_usd"),
        deadline_at=None if deadline is None else datetime.fromisoformat(deadline),
    )


def _migrate(c: Commands, tenant_id: str, job_id: str, p: Params, who: Who) -> None:
    c.jobs.migrate(
        tenant_id, job_id, p["to_version"], by=who.by, reason=who.reason, force=p["force"]
    )


def _retry(c: Commands, tenant_id: str, job_id: str, p: Params, who: Who) -> None:
    c.repairs.retry(tenant_id, job_id, by=who.by, reason=who.reason, to_version=p["to_version"])


def _reset(c: Commands, tenant_id: str, job_id: str, p: Params, who: Who) -> None:
    c.repairs.reset(
        tenant_id, job_id, p["step"], by=who.by, reason=who.reason, to_version=p["to_version"]
    )


ACTIONS: dict[str, BulkAction] = {
    action.name: action
    for action in (
        BulkAction("cancel", _no_params("cancel"), _cancel),
        BulkAction("signal", _signal_params, _signal),
        BulkAction("raise-budget", _budget_params, _raise_budget),
        BulkAction("migrate", _migrate_params, _migrate),
        BulkAction("retry", _retry_params, _retry),
        BulkAction("reset", _reset_params, _reset),
    )
}


def action_named(name: str) -> BulkAction:
    action = ACTIONS.get(name)
    if action is None:
        known = ", ".join(sorted(ACTIONS))
        raise InvalidPayloadError(f"unknown bulk action {name!r}; known: {known}")
    return action
