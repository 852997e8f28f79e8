"""What the CLI prints, unit by unit."""

from __future__ import annotations

import io
import os
import subprocess
import sys
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path

import pytest
from rich.console import Console

from jobledger.domain.views import HistoryEntry
from jobledger.presentation.figures import money
from jobledger.presentation.history import history_table


@pytest.mark.parametrize(
    ("amount", "shown"),
    [
        ("0.4", "$0.40"),
        (0, "$0.00"),
        (Decimal("12.5"), "$12.50"),
        ("3.100", "$3.10"),
        ("1E+1", "$10.00"),
        ("0.0125", "$0.0125"),  # a sub-cent step is not rounded to nothing
    ],
)
def test_money_has_two_decimals_and_keeps_sub_cent_digits(amount: object, shown: str) -> None:
    assert money(amount) == shown  # type: ignore[arg-type]


def render(renderable: object, width: int) -> str:
    console = Console(width=width, record=True, file=io.StringIO(), color_system=None)
    console.print(renderable)
    return console.export_text()


def entries() -> list[HistoryEntry]:
    moment = datetime(2026, 12, 1, 9, 0, tzinfo=UTC)
    return [
        HistoryEntry(
            version=1,
            event_type="Submitted",
            timestamp=moment,
            data={
                "workflow_type": "a-rather-long-workflow-name",
                "workflow_version": 3,
                "submit_key": "request-with-a-long-idempotency-key-0001",
            },
            chain_hash="ab" * 32,
        )
    ]


def test_a_history_is_a_table_where_it_fits_and_blocks_where_it_does_not() -> None:
    wide = render(history_table(entries(), title="history of t/j"), 140)
    assert "┃" in wide and "time (UTC)" in wide  # a table, with its header
    narrow = render(history_table(entries(), title="history of t/j"), 80)
    lines = narrow.splitlines()
    assert lines[0] == "history of t/j"
    assert lines[1].startswith("v1  2026-12-01 09:00:00.000  Submitted  submit (key ")
    assert "a-rather-long-workflow-name v3 -> queued" in narrow
    assert "…" not in narrow and "┃" not in narrow


def test_the_demo_fits_80_columns_without_cutting_anything(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("JOBLEDGER_")}
    env["COLUMNS"] = "80"
    result = subprocess.run(
        [str(Path(sys.executable).parent / "jobledger"), "demo", "--keep"],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert "…" not in result.stdout
    assert len(result.stdout.splitlines()) < 200
    hint = result.stdout.splitlines()[-1]
    assert hint.startswith("jobledger history demo-tenant mission-1 --store sqlite:///")
    assert hint.endswith("/demo.db")  # the whole command on one line, to paste
