"""Times and amounts as people read them."""

from __future__ import annotations

from datetime import UTC, datetime
from decimal import Decimal


def when(moment: datetime | None) -> str:
    """UTC, to the millisecond (whole seconds said without them)."""
    if moment is None:
        return "-"
    text = moment.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]
    return (text[:-4] if text.endswith(".000") else text) + " UTC"


def money(amount: Decimal | str | int | float) -> str:
    """Dollars with at least two decimals (``$0.40``), and every further digit the amount
    has (``$0.0125``): a sub-cent agent step must not read as free."""
    value = Decimal(str(amount))
    if value == value.quantize(Decimal("0.01")):
        value = value.quantize(Decimal("0.01"))
    return f"${value:f}"
