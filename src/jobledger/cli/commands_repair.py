"""Repairing a job from the command line: retry, reset, fork (``engine.repair_commands``)."""

from __future__ import annotations

from typing import Annotated

import typer

from jobledger.cli.params import LARGEST, JobId, JsonObject, Tenant, parse_json_object
from jobledger.cli.session import OneShot, WorkflowsOption, one_shot
from jobledger.engine.engine import Engine
from jobledger.engine.repair_commands import Repaired
from jobledger.presentation.job_view import job_document
from jobledger.presentation.json_output import print_json
from jobledger.presentation.terminal import console

ByOption = Annotated[str, typer.Option("--by", metavar="USER", help="Who repairs (recorded).")]
ReasonOption = Annotated[str, typer.Option("--reason", metavar="TEXT", help="Why (recorded).")]
ToVersionOption = Annotated[
    int | None,
    typer.Option(
        "--to-version",
        metavar="N",
        min=1,
        max=LARGEST,
        help="Run on this definition version: refused with the diff unless the steps "
        "kept replay the same on it.",
    ),
]
StepOption = Annotated[
    int, typer.Option("--step", metavar="N", min=0, max=LARGEST, help="The step to go on after.")
]


@one_shot
def retry(
    cmd: OneShot,
    tenant: Tenant,
    job: JobId,
    by: ByOption,
    reason: ReasonOption,
    to_version: ToVersionOption = None,
    workflows: WorkflowsOption = None,
) -> None:
    """Retry a failed job at the step that failed (a new attempt, the same step key).

    Only a failure before the step recorded anything (a step error, a resolution error)
    is retried; the steps recorded before it never run again.
    """
    with cmd.engine(purpose="retry", definitions=True, workflows=workflows) as engine:
        repaired = engine.retry(tenant, job, by=by, reason=reason, to_version=to_version)
        _done(f"retried by {by}", engine, repaired, cmd.json)


@one_shot
def reset(
    cmd: OneShot,
    tenant: Tenant,
    job: JobId,
    step: StepOption,
    by: ByOption,
    reason: ReasonOption,
    to_version: ToVersionOption = None,
    workflows: WorkflowsOption = None,
) -> None:
    """Run a job again from after step N (0: from the start), a finished one too.

    The later steps re-run under a new epoch (new step keys); their waits and approvals
    open again; the state is the one the job had after step N.
    """
    with cmd.engine(purpose="reset", definitions=True, workflows=workflows) as engine:
        repaired = engine.reset(tenant, job, step, by=by, reason=reason, to_version=to_version)
        _done(f"reset to step {step} by {by}", engine, repaired, cmd.json)


@one_shot
def fork(
    cmd: OneShot,
    tenant: Tenant,
    job: JobId,
    step: StepOption,
    new_job_id: Annotated[
        str, typer.Option("--new-job-id", metavar="ID", help="The fork's job id.")
    ],
    by: ByOption,
    reason: ReasonOption,
    input_patch: Annotated[
        JsonObject | None,
        typer.Option(
            "--input-patch",
            parser=parse_json_object,
            metavar="JSON|@FILE",
            help="Merged over the state the fork starts with.",
        ),
    ] = None,
    to_version: ToVersionOption = None,
    workflows: WorkflowsOption = None,
) -> None:
    """Start a new job from a job after its step N: its state then, its own keys.

    Each history names the other; the steps up to N are not run again. Asking the same
    fork again (the same --new-job-id) returns it.
    """
    with cmd.engine(purpose="fork", definitions=True, workflows=workflows) as engine:
        repaired = engine.fork(
            tenant,
            job,
            step,
            new_job_id=new_job_id,
            by=by,
            reason=reason,
            input_patch=input_patch,
            to_version=to_version,
        )
        _done(f"forked {tenant}/{job} by {by}", engine, repaired, cmd.json)


def _done(what: str, engine: Engine, repaired: Repaired, as_json: bool) -> None:
    """One line for people; for machines ``{"job": ..., "replay_verdict": ...}`` where
    the job is what ``show --json`` prints (for a fork, the fork)."""
    view = repaired.job
    if as_json:
        document = job_document(view, engine.history(view.tenant_id, view.job_id))
        print_json({"job": document, "replay_verdict": repaired.replay_verdict})
        return
    out = console()
    out.print(
        f"{what}: {view.tenant_id}/{view.job_id} is now {view.status} after step "
        f"{view.current_step}, on v{view.workflow_version} ({repaired.replay_verdict})"
    )
    out.print("the job runs on when a worker (or `jobledger tick`) picks it up")
