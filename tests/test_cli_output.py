"""What the CLI prints, unit by unit."""

from __future__ import annotations

from decimal import Decimal

import pytest

from jobledger.cli.output import money


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
