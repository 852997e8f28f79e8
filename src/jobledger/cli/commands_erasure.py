"""Erasing personal data: ``jobledger erase TENANT (--subject S | --job J)``."""

from __future__ import annotations

import sys
from typing import Annotated

import typer

from jobledger.cli.params import Tenant
from jobledger.cli.session import Exit, OneShot, one_shot
from jobledger.engine.erasure_commands import ErasureReport
from jobledger.presentation.figures import when
from jobledger.presentation.json_output import print_json
from jobledger.presentation.terminal import console


@one_shot
def erase(
    cmd: OneShot,
    tenant: Tenant,
    reason: Annotated[str, typer.Option("--reason", metavar="TEXT", help="Why (recorded).")],
    by: Annotated[str, typer.Option("--by", metavar="USER", help="Who erases (recorded).")],
    subject: Annotated[
        str | None,
        typer.Option(
            "--subject",
            metavar="S",
            help="The data subject, as the jobs were submitted with (submit --subject).",
            show_default=False,
        ),
    ] = None,
    job: Annotated[
        str | None,
        typer.Option(
            "--job",
            metavar="J",
            help="One job submitted without --subject (sealed with a key of its own).",
            show_default=False,
        ),
    ] = None,
) -> None:
    """Erase a data subject (--subject) or one job without a subject (--job): each job
    records Erased (who, why), then the key is destroyed; the personal values read as
    [erased] from then on, in the store, exports and the events topic, and every chain
    still verifies.

    Interrupted, it is run again to finish; one already erased is refused (exit 1), and so
    is --job on a job sealed with its data subject's key (erase the subject). When another
    connection's read transaction keeps the key's bytes in the database's files past a
    bounded wait, it says the shred is pending and exits 4: run it again to finish.
    """
    if (subject is None) == (job is None):
        raise typer.BadParameter("give exactly one of --subject S and --job J")
    with cmd.engine(purpose="erase") as engine:
        if subject is not None:
            report = engine.erase(tenant, subject, by=by, reason=reason)
        else:
            assert job is not None
            report = engine.erase_job(tenant, job, by=by, reason=reason)
    if cmd.json:
        print_json(as_json(report))
    else:
        _print(report)
    if report.shred == "pending":
        sys.stderr.write(
            "error: the keys are deleted, but their bytes are still in the database's files "
            "(another connection holds a read transaction that keeps the old pages): run "
            "this erase again to finish\n"
        )
        raise typer.Exit(Exit.TEMPORARY)


def _print(report: ErasureReport) -> None:
    out = console()
    jobs = len(report.erased) + len(report.already)
    done = "destroyed" if report.shred == "done" else "deleted"
    out.print(
        f"erased: {jobs} job(s) of tenant {report.tenant_id}, "
        f"{len(report.key_ids)} key(s) {done} at {when(report.erased_at)}"
        + ("" if report.shred == "done" else "; shred pending")
    )
    for job_id in report.erased:
        out.print(f"  {job_id}: Erased recorded")
    for job_id in report.already:
        out.print(f"  {job_id}: Erased already recorded (an earlier, interrupted erase)")


def as_json(report: ErasureReport) -> dict[str, object]:
    """What ``erase --json`` prints."""
    return {
        "tenant": report.tenant_id,
        "keys": list(report.key_ids),
        "erased": list(report.erased),
        "already_erased": list(report.already),
        "erased_at": report.erased_at,
        "shred": report.shred,
    }
