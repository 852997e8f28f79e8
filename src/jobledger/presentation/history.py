"""A job's history as an audit reads it: a table (or blocks, on a narrow terminal) for
people, a list of documents for machines."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from rich.console import Console, ConsoleOptions, RenderableType, RenderResult
from rich.padding import Padding
from rich.table import Table
from rich.text import Text

from jobledger.domain.views import HistoryEntry
from jobledger.presentation.audit_lines import AuditLine, audit_line, personal_paths
from jobledger.presentation.json_output import jsonable


def history_document(entries: list[HistoryEntry]) -> list[dict[str, Any]]:
    rows = []
    personal = personal_paths(entries)
    for entry in entries:
        line = audit_line(entry, personal)
        rows.append(
            {
                "version": entry.version,
                "time": entry.timestamp,
                "event_type": entry.event_type,
                "by": line.by,
                "step": line.step,
                "transition": line.transition,
                "data": entry.data,
                "chain_hash": entry.chain_hash,
            }
        )
    return jsonable(rows)  # type: ignore[no-any-return]


WIDE_HISTORY = 110
"""Below this many columns a history table would wrap every cell into a tower of
fragments; each event is printed as a short block instead."""


@dataclass(frozen=True)
class History:
    """A job's history that fits the terminal: a table where it is wide enough, else one
    block per event (version, time, event and who on one line; step and transition below)."""

    entries: tuple[HistoryEntry, ...]
    title: str | None = None
    seconds: bool = False

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        if options.max_width >= WIDE_HISTORY:
            yield self.table()
        else:
            yield from self.blocks()

    def table(self) -> Table:
        table = Table(title=self.title)
        table.add_column("v", justify="right")
        table.add_column("time (UTC)", no_wrap=True)
        table.add_column("event", no_wrap=True)
        table.add_column("by", overflow="fold")
        table.add_column("step", overflow="fold")
        table.add_column("transition", overflow="fold")
        personal = personal_paths(self.entries)
        for entry in self.entries:
            line = audit_line(entry, personal)
            table.add_row(str(entry.version), self.time(entry), entry.event_type, *line_cells(line))
        return table

    def blocks(self) -> Iterator[RenderableType]:
        if self.title:
            yield Text(self.title, style="bold")
        personal = personal_paths(self.entries)
        for entry in self.entries:
            line = audit_line(entry, personal)
            head = Text(f"v{entry.version}  {self.time(entry)}  ")
            head.append(entry.event_type, style="bold")
            head.append(f"  {line.by}")
            yield head
            for detail in (line.step, line.transition):
                if detail:
                    yield Padding(Text(detail, overflow="fold"), (0, 0, 0, 4), expand=False)

    def time(self, entry: HistoryEntry) -> str:
        return entry.timestamp.strftime("%Y-%m-%d %H:%M:%S.%f")[: -7 if self.seconds else -3]


def line_cells(line: AuditLine) -> tuple[str, str, str]:
    return line.by, line.step, line.transition


def history_table(
    entries: Iterable[HistoryEntry], title: str | None = None, *, seconds: bool = False
) -> History:
    return History(tuple(entries), title, seconds)
