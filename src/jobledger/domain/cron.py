"""Cron expressions in a time zone: when a schedule fires.

Parsing and stepping are cronsim's (Debian cron's rules, its DST handling included); this
module only validates, fixes the zone and converts the answers to UTC. On a day the
clocks go forward, a time inside the skipped hour fires when the clocks resume (02:30
in Europe/Paris fires at 03:00 CEST); on a day they go back, a time in the repeated hour
fires once, at its first occurrence (CEST). Expressions that run more often (a ``*``
minute or hour field, e.g. hourly) are scheduled normally: once per real hour, so the
repeated hour's firings happen twice and the skipped hour's not at all.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from cronsim import CronSim, CronSimError

from jobledger.domain.errors import InvalidScheduleError

FIELDS = 5
"""Minute, hour, day of month, month, day of week: Debian cron's fields (cronsim's
optional seconds field would also bypass its DST rules)."""


@dataclass(frozen=True)
class CronTimes:
    expression: str
    timezone: str

    @classmethod
    def parse(cls, expression: str, timezone: str) -> CronTimes:
        """Validated: a clear error naming what is wrong, before anything is written."""
        times = cls(" ".join(str(expression).split()), str(timezone))
        if len(times.expression.split()) != FIELDS:
            raise InvalidScheduleError(
                f"cron expression {expression!r} must have {FIELDS} fields "
                "(minute hour day-of-month month day-of-week)"
            )
        zone = times.zone  # raises for an unknown zone
        try:
            CronSim(times.expression, datetime.now(zone))
        except CronSimError as error:
            raise InvalidScheduleError(f"invalid cron expression {expression!r}: {error}") from None
        return times

    @property
    def zone(self) -> ZoneInfo:
        try:
            return ZoneInfo(self.timezone)
        except (ZoneInfoNotFoundError, ValueError):
            raise InvalidScheduleError(
                f"unknown time zone {self.timezone!r} (an IANA name such as Europe/Paris)"
            ) from None

    def after(self, moment: datetime) -> datetime | None:
        """The first firing strictly after ``moment``, in UTC; None if the expression
        never matches again (cronsim looks 50 years ahead)."""
        try:
            found = next(CronSim(self.expression, moment.astimezone(self.zone)))
        except StopIteration:
            return None
        return found.astimezone(UTC)

    def local(self, moment: datetime) -> datetime:
        """``moment`` on the schedule's own clock."""
        return moment.astimezone(self.zone)
