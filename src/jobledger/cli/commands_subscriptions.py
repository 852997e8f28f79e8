"""``jobledger subscriptions ...``: the configured subscriptions with their lag and dead
letters (``adapters/kafka/subscription_status.py``), paused and resumed by a switch the
workers obey (``adapters/kafka/pauses.py``). Only the Kafka settings are read: no store
is opened."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.table import Table

from jobledger.adapters.kafka.pauses import PauseState, set_pause
from jobledger.adapters.kafka.settings import KafkaSettings
from jobledger.adapters.kafka.subscription_status import SubscriptionStatus, statuses
from jobledger.cli.config_file import load_settings
from jobledger.cli.session import OneShot, one_shot_with
from jobledger.presentation.json_output import print_json
from jobledger.presentation.terminal import console

app = typer.Typer(
    help="Your topics' subscriptions: list them (lag, dead letters), pause, resume.",
    no_args_is_help=True,
)

NameArgument = Annotated[str, typer.Argument(metavar="NAME", help="The subscription's name.")]
ByOption = Annotated[
    str, typer.Option("--by", metavar="USER", help="Who sets the switch (recorded with it).")
]


@app.command("list")
@one_shot_with("store", "config", "json")
def list_subscriptions(cmd: OneShot) -> None:
    """Each configured subscription: topic, action, workflow, paused or running, the
    consumer group's lag on its topic (per partition in --json) and its dead letters not
    redriven yet."""
    found = statuses(_settings(cmd))
    if cmd.json:
        print_json([status.document() for status in found])
        return
    if not found:
        console().print("no subscriptions configured ([[subscriptions]], JOBLEDGER_SUBSCRIPTIONS)")
        return
    console().print(_table(found))


@app.command("pause")
@one_shot_with("store", "config", "json")
def pause(
    cmd: OneShot,
    name: NameArgument,
    reason: Annotated[
        str | None, typer.Option("--reason", metavar="TEXT", help="Why (recorded with it).")
    ] = None,
    by: ByOption = "cli",
) -> None:
    """Stop the workers making jobs of the subscription's messages (within about a
    second, without a restart, until resumed): its messages wait on its topic, none is
    skipped."""
    _switch(cmd, name, paused=True, by=by, reason=reason)


@app.command("resume")
@one_shot_with("store", "config", "json")
def resume(cmd: OneShot, name: NameArgument, by: ByOption = "cli") -> None:
    """Let the workers make jobs of the subscription's messages again, from the first one
    not made a job of."""
    _switch(cmd, name, paused=False, by=by, reason=None)


def _switch(cmd: OneShot, name: str, *, paused: bool, by: str, reason: str | None) -> None:
    before = set_pause(_settings(cmd), name, paused=paused, by=by, reason=reason)
    was_paused = before is not None and before.paused
    if cmd.json:
        print_json({"name": name, "paused": paused, "was_paused": was_paused, "by": by})
        return
    if paused and was_paused:
        console().print(f"{name}: paused already{_since(before)}; set again by {by}")
    elif paused:
        console().print(f"{name}: paused by {by}; the workers obey within about a second")
    elif was_paused:
        console().print(f"{name}: resumed by {by}; the workers go on within about a second")
    else:
        console().print(f"{name}: was not paused; set to running by {by}")


def _since(state: PauseState | None) -> str:
    return "" if state is None else f" (by {state.by} at {state.at})"


def _settings(cmd: OneShot) -> KafkaSettings:
    return KafkaSettings.of(load_settings(cmd.config, cmd.store).engine)


def _table(found: list[SubscriptionStatus]) -> Table:
    table = Table()
    for column in ("name", "topic", "action", "workflow", "state"):
        table.add_column(column, overflow="fold")  # names are never cut
    table.add_column("lag", justify="right")
    table.add_column("dead letters", justify="right")
    for status in found:
        subscription = status.subscription
        table.add_row(
            subscription.name,
            subscription.topic,
            subscription.action,
            subscription.workflow or "-",
            _state(status),
            str(status.lag) if status.partitions else "no topic",
            str(status.dead_letters),
        )
    return table


def _state(status: SubscriptionStatus) -> str:
    if not status.paused or status.pause is None:
        return "running"
    why = f": {status.pause.reason}" if status.pause.reason else ""
    return f"paused by {status.pause.by}{why}"
