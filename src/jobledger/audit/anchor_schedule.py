"""Anchoring on a schedule, inside a running process (``jobledger run --anchor-to DEST``),
so evidence accrues without an operator remembering to run ``jobledger anchor``.

An anchor is taken when either threshold is reached: ``every`` (time since the last
anchor) or ``events`` (events appended to the log since then), and once more at a clean
shutdown; never when nothing was appended since the last one. It runs on its own thread
(each anchor verifies every chain first, a read of the whole log, which must not hold up
ticks). A failed anchor (a broker or TSA away, a broken chain) is logged at error and
tried again after ``RETRY_SECONDS``; the process keeps running. One process anchors at a
time (a lock of the store), so the anchor chain at the destination stays one sequence.
"""

from __future__ import annotations

import logging
import os
import re
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import Field, ValidationError, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from jobledger.adapters.event_store import EventSourcedJobStore
from jobledger.audit.destinations import Destination, open_sink, read_log
from jobledger.audit.tamper import take_anchor
from jobledger.audit.timestamping import TimeStampAuthority, TsaTrust
from jobledger.config import EngineConfig
from jobledger.domain.errors import ConfigError
from jobledger.domain.setting_problems import setting_problem
from jobledger.orchestration.ports import Clock, Lock

log = logging.getLogger(__name__)

ENV_PREFIX = "JOBLEDGER_ANCHORS_"
TABLE = "anchors"
"""The config file's table of these settings."""
DEFAULT_EVERY_SECONDS = 300.0
"""With a destination and neither threshold given: every five minutes."""
RETRY_SECONDS = 10.0
POLL_SECONDS = 0.5
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h)?\s*$")
_UNIT_SECONDS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, None: 1.0}


def parse_duration(text: str) -> float:
    """``5m``, ``30s``, ``1h``, ``250ms`` or plain seconds."""
    match = _DURATION.match(text)
    if match is None or float(match.group(1)) <= 0:
        raise ValueError(f"{text!r} is not a positive duration like 30s, 5m or 1h")
    return float(match.group(1)) * _UNIT_SECONDS[match.group(2)]


class AnchorSettings(BaseSettings):
    """Scheduled anchoring: the ``[anchors]`` table, ``JOBLEDGER_ANCHORS_*`` variables,
    or ``run --anchor-to/--anchor-every/--anchor-events``."""

    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, extra="forbid", frozen=True)

    to: str | None = None
    """The destination: file:PATH (or a path) or kafka://HOST:PORT[/TOPIC]."""
    every: float | None = None
    """Seconds between anchors at most (``5m``, ``30s``, ``1h`` or a number of seconds)."""
    events: int | None = Field(default=None, ge=1)
    """Anchor after this many events were appended since the last anchor."""
    tsa: str | None = None
    """Stamp each anchor at this RFC 3161 TSA (http:// or https:// URL)."""
    tsa_ca: Path | None = None
    """The TSA's CA certificate(s) (PEM): each stamp is checked against it."""

    @field_validator("every", mode="before")
    @classmethod
    def _duration(cls, value: object) -> object:
        return parse_duration(value) if isinstance(value, str) else value

    @field_validator("to")
    @classmethod
    def _destination(cls, value: str | None) -> str | None:
        if value is not None:
            try:
                Destination.parse(value)
            except ConfigError as error:
                raise ValueError(str(error)) from None
        return value

    @model_validator(mode="after")
    def _thresholds_need_a_destination(self) -> AnchorSettings:
        if self.to is None and (self.every, self.events, self.tsa) != (None, None, None):
            raise ValueError("every, events and tsa need a destination (to)")
        if self.every is not None and self.every <= 0:
            raise ValueError("every must be a positive duration")
        return self

    def plan(self) -> AnchorPlan | None:
        """What the runner does (None: no scheduled anchoring)."""
        if self.to is None:
            return None
        destination = Destination.parse(self.to)
        every = self.every
        if every is None and self.events is None:
            every = DEFAULT_EVERY_SECONDS
        return AnchorPlan(destination, every, self.events, self.tsa, self.tsa_ca)


def load_anchor_settings(
    table: Mapping[str, Any], config_file: Path | None = None, **flags: Any
) -> AnchorSettings:
    """Highest first: ``flags`` (not None), ``JOBLEDGER_ANCHORS_*``, the config file's
    ``[anchors]`` table, the defaults. Every problem is named in one ConfigError."""
    in_env = {name for name in AnchorSettings.model_fields if os.environ.get(env_name(name))}
    values = {name: value for name, value in table.items() if name not in in_env}
    if config_file is not None:
        # Paths a config file names are relative to the file.
        if isinstance(values.get("tsa_ca"), str):
            values["tsa_ca"] = config_file.parent / values["tsa_ca"]
        if isinstance(values.get("to"), str):
            file_relative = _relative(values["to"], config_file.parent)
            values["to"] = file_relative if file_relative is not None else values["to"]
    values |= {name: value for name, value in flags.items() if value is not None}
    try:
        return AnchorSettings(**values)
    except ValidationError as error:
        where = f"[{TABLE}] of {str(config_file)!r}" if config_file is not None else "settings"
        known = AnchorSettings.model_fields
        problems = "; ".join(setting_problem(detail, known) for detail in error.errors())
        raise ConfigError(
            f"invalid anchor {where} (or {ENV_PREFIX}* variable): {problems}"
        ) from None


def _relative(to: str, directory: Path) -> str | None:
    try:
        return str(Destination.parse(to).relative_to(directory))
    except ConfigError:
        return None  # the model names the problem


def env_name(setting: str) -> str:
    return f"{ENV_PREFIX}{setting.upper()}"


@dataclass(frozen=True)
class AnchorPlan:
    destination: Destination
    every_seconds: float | None
    events: int | None
    tsa: str | None = None
    tsa_ca: Path | None = None

    def describe(self) -> str:
        when = []
        if self.every_seconds is not None:
            when.append(f"every {self.every_seconds:g}s")
        if self.events is not None:
            when.append(f"every {self.events} events")
        stamped = f", stamped by {self.tsa}" if self.tsa else ""
        return f"anchors: to {self.destination} {' or '.join(when)}{stamped}"


class ScheduledAnchoring:
    """The runner's anchoring service: ``run`` until ``stop``; ``final`` once the
    writers have stopped (a clean shutdown's last anchor)."""

    def __init__(
        self,
        store: EventSourcedJobStore,
        clock: Clock,
        plan: AnchorPlan,
        config: EngineConfig,
        lock: Lock,
        poll_seconds: float = POLL_SECONDS,
    ) -> None:
        self.store = store
        self.clock = clock
        self.plan = plan
        self.config = config
        self.lock = lock
        self.poll_seconds = poll_seconds
        self.stopping = threading.Event()
        self.trust = TsaTrust.load(plan.tsa_ca) if plan.tsa_ca is not None else None
        self.tsa = TimeStampAuthority(plan.tsa, self.trust) if plan.tsa is not None else None
        self.anchored = 0
        """Anchors taken by this process."""
        self._anchored_position: int | None = None
        self._last_attempt = time.monotonic()
        self._failed = False

    def run(self) -> None:
        while not self.stopping.wait(self.poll_seconds):
            if self.due():
                self.anchor()

    def stop(self) -> None:
        self.stopping.set()

    def final(self) -> None:
        """The last anchor at a clean shutdown, if anything was appended since."""
        if self._position() != self._anchored_position:
            self.anchor()

    def due(self) -> bool:
        position = self._position()
        if position == self._anchored_position:
            return False
        waited = time.monotonic() - self._last_attempt
        if self._failed:
            return waited >= RETRY_SECONDS
        every, events = self.plan.every_seconds, self.plan.events
        if every is not None and waited >= every:
            return True
        return events is not None and position - (self._anchored_position or 0) >= events

    def anchor(self) -> bool:
        """One anchor now; False (logged at error) if it failed or another process holds
        the anchoring lock."""
        position = self._position()
        self._last_attempt = time.monotonic()
        if not self.lock.try_acquire():
            log.info("another process is anchoring this store; not anchoring here")
            return False
        try:
            sink = open_sink(self.plan.destination, self.config, self.tsa)
            anchor, _ = take_anchor(self.store, sink, self.clock.now(), read_log(sink, self.trust))
        except Exception as error:
            self._failed = True
            log.error(
                "anchor to %s failed (retrying in %gs): %s",
                self.plan.destination,
                RETRY_SECONDS,
                error,
            )
            return False
        finally:
            self.lock.release()
        self._failed = False
        self._anchored_position = position
        self.anchored += 1
        log.info(
            "anchored %d job heads to %s, merkle root %s",
            len(anchor.heads),
            self.plan.destination,
            anchor.merkle_root,
        )
        return True

    def _position(self) -> int:
        """Events in the log: the sum of every partition's last notification id."""
        return sum(p.recorder.max_notification_id() or 0 for p in self.store.partitions)
