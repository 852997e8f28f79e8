"""What the running commands log, and how: ``--log-level`` and ``--log-format text|json``.

One line per tick outcome at info (job, step, outcome, status, ms), executor failures at
warning (a ``StepError``) or error (anything else, with its traceback); the ops events
(JSON, several per step) only with ``--log-level debug``. Logs go to stderr; stdout
stays for what a command prints. A JSON line logged while a job is worked on names it:
``tenant``, ``job``, ``step``, and ``trace_id`` and ``span_id`` when it is traced, so the
line joins its trace.
"""

from __future__ import annotations

import json
import logging
import sys
from datetime import UTC, datetime
from enum import StrEnum
from typing import Annotated

import typer

from jobledger.orchestration import tracing


class LogFormat(StrEnum):
    TEXT = "text"
    JSON = "json"


class LogLevel(StrEnum):
    DEBUG = "debug"
    INFO = "info"
    WARNING = "warning"
    ERROR = "error"


LogLevelOption = Annotated[
    LogLevel, typer.Option("--log-level", help="The least severe log lines shown.")
]
LogFormatOption = Annotated[
    LogFormat,
    typer.Option("--log-format", help="text for people, json (a line each) for collectors."),
]

# The one-shot commands (submit, tick, signal, ...) take the same two options. Unset, they
# leave logging as it was (warnings and errors as bare lines on stderr), so what those
# commands printed before stays as it was; either one set configures it as the running
# commands do, at warning unless --log-level says otherwise.
OneShotLogLevelOption = Annotated[
    LogLevel | None,
    typer.Option(
        "--log-level",
        help="The least severe log lines shown (default: warning).",
        show_default=False,
    ),
]
OneShotLogFormatOption = Annotated[
    LogFormat | None,
    typer.Option(
        "--log-format",
        help="text for people, json (a line each) for collectors (default: text).",
        show_default=False,
    ),
]


JOB_FIELDS = ("tenant", "job", "step", "trace_id", "span_id")


class JobContext(logging.Filter):
    """Copies the log context (``orchestration.tracing.log_fields``: the job this thread is
    working on, its trace) onto each record as it is logged, in the thread that logs it."""

    def filter(self, record: logging.LogRecord) -> bool:
        for name, value in tracing.log_fields().items():
            if not hasattr(record, name):
                setattr(record, name, value)
        return True


class JsonLines(logging.Formatter):
    """A JSON object per line: time (UTC, ISO 8601), level, logger, message, the job
    fields known (:data:`JOB_FIELDS`), and the traceback when there is one."""

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, object] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        for name in JOB_FIELDS:
            value = getattr(record, name, None)
            if value is not None:
                line[name] = value
        if record.exc_info:
            line["traceback"] = self.formatException(record.exc_info)
        return json.dumps(line, ensure_ascii=False)


def configure(level: LogLevel, fmt: LogFormat) -> None:
    handler = logging.StreamHandler(sys.stderr)
    if fmt is LogFormat.JSON:
        handler.setFormatter(JsonLines())
        handler.addFilter(JobContext())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    # The Kafka client's own chatter is for its debugging, not the operator's day; so
    # are the ops events (several per step), which the tick lines sum up.
    logging.getLogger("kafka").setLevel(max(logging.WARNING, root.level))
    ops = logging.getLogger("jobledger.ops")
    ops.setLevel(logging.INFO if level is LogLevel.DEBUG else logging.WARNING)


def configure_one_shot(level: LogLevel | None, fmt: LogFormat | None) -> None:
    """A one-shot command's logs: left alone unless ``--log-level`` or ``--log-format``
    was given (see :data:`OneShotLogLevelOption`)."""
    if level is not None or fmt is not None:
        configure(level or LogLevel.WARNING, fmt or LogFormat.TEXT)
