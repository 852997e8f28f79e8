"""Erasing a data subject's personal data: ``jobledger erase TENANT --subject S``."""

from __future__ import annotations

from typing import Annotated

import typer

from jobledger.cli import output
from jobledger.cli.params import Tenant
from jobledger.cli.session import ConfigOption, JsonFlag, StoreOption, open_engine


def erase(
    tenant: Tenant,
    subject: Annotated[
        str,
        typer.Option(
            "--subject",
            metavar="S",
            help="The data subject, as the jobs were submitted with (submit --subject).",
        ),
    ],
    reason: Annotated[str, typer.Option("--reason", metavar="TEXT", help="Why (recorded).")],
    by: Annotated[str, typer.Option("--by", metavar="USER", help="Who erases (recorded).")],
    store: StoreOption = None,
    config: ConfigOption = None,
    json: JsonFlag = False,
) -> None:
    """Erase a data subject: each of its jobs records Erased (who, why), then the
    subject's key is destroyed; its personal values read as [erased] from then on, in the
    store, exports and the events topic, and every chain still verifies.

    Interrupted, it is run again to finish; a subject already erased is refused (exit 1).
    """
    with open_engine(store, config, purpose="erase") as engine:
        report = engine.erase(tenant, subject, by=by, reason=reason)
    if json:
        output.print_json(
            {
                "tenant": report.tenant_id,
                "keys": list(report.key_ids),
                "erased": list(report.erased),
                "already_erased": list(report.already),
                "erased_at": report.erased_at,
            }
        )
        return
    out = output.console()
    jobs = len(report.erased) + len(report.already)
    out.print(
        f"erased: {jobs} job(s) of tenant {report.tenant_id}, "
        f"{len(report.key_ids)} key(s) destroyed at {output.when(report.erased_at)}"
    )
    for job_id in report.erased:
        out.print(f"  {job_id}: Erased recorded")
    for job_id in report.already:
        out.print(f"  {job_id}: Erased already recorded (an earlier, interrupted erase)")
