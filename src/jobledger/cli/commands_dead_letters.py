"""``jobledger dead-letters ...``: the Kafka dead-letter topics, listed, shown and redriven
(``adapters/kafka/dead_letters.py``). Only the Kafka settings are read: no store is opened."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn
from rich.table import Table

from jobledger.adapters.kafka.dead_letters import (
    DeadLetter,
    DeadLetters,
    LetterFilter,
    RedriveReport,
    Selection,
)
from jobledger.adapters.kafka.settings import KafkaSettings
from jobledger.cli.config_file import load_settings
from jobledger.cli.params import parse_moment
from jobledger.cli.session import OneShot, one_shot_with
from jobledger.presentation.figures import when
from jobledger.presentation.json_output import print_json
from jobledger.presentation.terminal import console

app = typer.Typer(
    help="The Kafka dead-letter topics (ticks, signals, subscriptions): list, show, redrive.",
    no_args_is_help=True,
)

SAMPLE = 10
"""Letters a dry run names in its table."""

ReasonOption = Annotated[
    str | None,
    typer.Option("--reason", metavar="REASON", help="Only this reason (unknown_job, ...)."),
]
SinceOption = Annotated[
    datetime | None,
    typer.Option(
        "--since", metavar="TIME", parser=parse_moment, help="Dead-lettered at or after (ISO 8601)."
    ),
]
UntilOption = Annotated[
    datetime | None,
    typer.Option(
        "--until", metavar="TIME", parser=parse_moment, help="Dead-lettered before (ISO 8601)."
    ),
]
KeyOption = Annotated[
    str | None,
    typer.Option(
        "--key", metavar="KEY", help="Only this message key (tenant/job); acme/* a prefix."
    ),
]
TopicOption = Annotated[
    str | None,
    typer.Option(
        "--topic",
        metavar="TOPIC",
        help="Only letters of ticks or signals, or of that topic (a source or dead-letter one).",
    ),
]
SubscriptionOption = Annotated[
    str | None,
    typer.Option("--subscription", metavar="NAME", help="Only letters of that subscription."),
]
LetterIdArgument = Annotated[
    str,
    typer.Argument(
        metavar="ID",
        help="ticks:PARTITION:OFFSET, signals:PARTITION:OFFSET or sub:NAME:PARTITION:OFFSET.",
    ),
]


@app.command("list")
@one_shot_with("store", "config", "json")
def list_letters(
    cmd: OneShot,
    reason: ReasonOption = None,
    since: SinceOption = None,
    until: UntilOption = None,
    key: KeyOption = None,
    topic: TopicOption = None,
    subscription: SubscriptionOption = None,
) -> None:
    """The dead letters, ticks, signals, then each subscription's: id, reason, key, when,
    redrives, error."""
    found = _letters(cmd).read(LetterFilter(reason, since, until, key, topic, subscription))
    if cmd.json:
        print_json([letter.document() for letter in found])
        return
    console().print(_table(found))


@app.command("show")
@one_shot_with("store", "config", "json")
def show(cmd: OneShot, letter_id: LetterIdArgument) -> None:
    """One dead letter: why, where it came from, its value and headers, its redrives."""
    document = _letters(cmd).get(letter_id).document()
    if cmd.json:
        print_json(document)
        return
    table = Table(show_header=False)
    table.add_column("field")
    table.add_column("value", overflow="fold")
    for name, value in document.items():
        table.add_row(name, _text(value))
    console().print(table)


@app.command("redrive")
@one_shot_with("store", "config", "json")
def redrive(
    cmd: OneShot,
    letter_ids: Annotated[
        list[str] | None,
        typer.Argument(
            metavar="[ID]...", help="Letters to redrive (else the filter's).", show_default=False
        ),
    ] = None,
    reason: ReasonOption = None,
    since: SinceOption = None,
    until: UntilOption = None,
    key: KeyOption = None,
    topic: TopicOption = None,
    subscription: SubscriptionOption = None,
    every: Annotated[
        bool, typer.Option("--all", help="Every letter (needed when no id or filter is given).")
    ] = False,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Say what would be sent; send nothing.")
    ] = False,
    force: Annotated[
        bool, typer.Option("--force", help="Send letters redriven before again too.")
    ] = False,
    by: Annotated[
        str, typer.Option("--by", metavar="USER", help="Who redrives (in each marker).")
    ] = "cli",
) -> None:
    """Send letters back to their source topic (headers jobledger.redrive.of, .count and
    .origin), each once: a marker on the dead-letter topic makes the next redrive skip it
    unless --force. Needs ids, a filter or --all."""
    letter_filter = LetterFilter(reason, since, until, key, topic, subscription)
    selection = Selection(tuple(letter_ids or ()), letter_filter, every)
    with _progress(not cmd.json) as progress:
        task = progress.add_task("redriving", total=None)
        report = _letters(cmd).redrive(
            selection,
            by=by,
            dry_run=dry_run,
            force=force,
            progress=lambda done, total: progress.update(task, completed=done, total=total),
        )
    if cmd.json:
        print_json(report.document())
        return
    _print_report(report)


# ---- printing ----------------------------------------------------------------------------


def _letters(cmd: OneShot) -> DeadLetters:
    return DeadLetters(KafkaSettings.of(load_settings(cmd.config, cmd.store).engine))


def _table(letters: list[DeadLetter]) -> Table:
    table = Table()
    for column in ("id", "reason", "key", "dead-lettered"):
        table.add_column(column, overflow="fold")  # ids are never cut
    table.add_column("redriven")
    table.add_column("error", overflow="fold")
    for letter in letters:
        table.add_row(
            str(letter.id),
            letter.reason,
            letter.key_text or "-",
            when(letter.dead_lettered_at),
            str(len(letter.redrives)) if letter.redriven else "-",
            letter.error[:120],
        )
    return table


def _print_report(report: RedriveReport) -> None:
    verb = "would send" if report.dry_run else "sent"
    line = f"{verb} {len(report.sent)} of {report.matched} matching"
    if report.skipped:
        line += f"; skipped {len(report.skipped)} already redriven (--force sends them again)"
    console().print(line)
    if report.dry_run and report.sent:
        shown = report.sent[:SAMPLE]
        more = f" and {len(report.sent) - len(shown)} more" if len(report.sent) > len(shown) else ""
        console().print(f"sample: {', '.join(shown)}{more}")


def _text(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, dict):
        return ", ".join(f"{k}={v}" for k, v in value.items()) or "-"
    if isinstance(value, list):
        return "; ".join(_text(v) for v in value) or "-"
    return str(value)


@contextmanager
def _progress(visible: bool) -> Iterator[Progress]:
    """A progress bar on stderr (on a terminal only: logs get no control codes)."""
    stderr = Console(stderr=True, file=sys.stderr)
    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        console=stderr,
        disable=not (visible and stderr.is_terminal),
        transient=True,
    ) as progress:
        yield progress
