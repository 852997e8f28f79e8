"""``jobledger demo``: the example mission, every capability at once, on a fresh file."""

from __future__ import annotations

from typing import Annotated

import typer

from jobledger.cli.config_file import load_settings
from jobledger.cli.logs import OneShotLogFormatOption, OneShotLogLevelOption, configure_one_shot
from jobledger.cli.session import ConfigOption, Exit, StoreOption
from jobledger.presentation.terminal import console


def demo(
    store: StoreOption = None,
    config: ConfigOption = None,
    keep: Annotated[
        bool, typer.Option("--keep", help="Keep the temporary directory and print its path.")
    ] = False,
    code: Annotated[
        bool,
        typer.Option(
            "--code", help="Run the mission written as Python code (@workflow, @step) instead."
        ),
    ] = False,
    log_level: OneShotLogLevelOption = None,
    log_format: OneShotLogFormatOption = None,
) -> None:
    """Run the example mission: every capability at once, on a fresh SQLite file.

    An agent step, a worker crash and takeover, a 3-day timer, a wait resumed with a
    signed token, a human approval and the tenant's cost ceiling, on a fake clock so it
    takes a second. --store runs it on another store (under a job id of its own).
    --code runs the same mission written as code (jobledger/demo/mission_code.py) through
    the same checks. Exits 1 if any of its checks fails.
    """
    configure_one_shot(log_level, log_format)
    from jobledger.demo.run import run_demo  # only this command needs it

    base = load_settings(config, None).engine  # the demo picks its own store unless --store
    if not run_demo(base=base, store_url=store, keep=keep, out=console(), code=code):
        raise typer.Exit(Exit.REFUSED)
