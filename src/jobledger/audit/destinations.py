"""Where anchors go and are read back from, named by one string everywhere a command or
the runner takes one:

- ``file:PATH`` or a bare path: an append-only file;
- ``kafka://HOST:PORT[,HOST:PORT...][/TOPIC]``: a topic (default ``jobledger.anchors``);

and, for any of them, an RFC 3161 time-stamping authority (``--tsa URL``) that stamps
each line before it goes there.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Literal

from jobledger.audit.anchors import (
    ANCHOR_TOPIC,
    AnchorLog,
    AnchorSink,
    FileAnchorSink,
    parse_anchors,
)
from jobledger.audit.timestamping import StampingSink, TimeStampAuthority, TsaTrust, check_stamps
from jobledger.config import EngineConfig
from jobledger.domain.errors import ConfigError

KAFKA_SCHEME = "kafka://"
FILE_SCHEME = "file:"


@dataclass(frozen=True)
class Destination:
    kind: Literal["file", "kafka"]
    path: Path = Path()
    bootstrap: str = ""
    topic: str = ANCHOR_TOPIC

    @classmethod
    def parse(cls, text: str) -> Destination:
        text = text.strip()
        if not text:
            raise ConfigError("an anchor destination must not be empty")
        if text.startswith(KAFKA_SCHEME):
            servers, _, topic = text.removeprefix(KAFKA_SCHEME).partition("/")
            hosts = [server.strip() for server in servers.split(",")]
            if not servers or not all(_host_port(host) for host in hosts):
                raise ConfigError(
                    f"anchor destination {text!r}: expected kafka://HOST:PORT[,HOST:PORT][/TOPIC]"
                )
            return cls("kafka", bootstrap=",".join(hosts), topic=topic or ANCHOR_TOPIC)
        if "://" in text:
            raise ConfigError(
                f"anchor destination {text!r}: expected file:PATH, a path, or kafka://HOST:PORT"
            )
        return cls("file", path=Path(text.removeprefix(FILE_SCHEME)))

    def relative_to(self, directory: Path) -> Destination:
        """A file destination named in a config file is relative to the file."""
        if self.kind != "file" or self.path.is_absolute():
            return self
        return replace(self, path=directory / self.path)

    def sink(self, config: EngineConfig | None = None) -> AnchorSink:
        """The sink (for Kafka: with ``config``'s client settings, at this bootstrap)."""
        if self.kind == "file":
            return FileAnchorSink(self.path)
        # Imported here: kafka-python costs start-up time to every other command.
        from jobledger.adapters.kafka.anchors import KafkaAnchorSink
        from jobledger.adapters.kafka.settings import KafkaSettings

        base = KafkaSettings.of(config) if config is not None else KafkaSettings()
        return KafkaAnchorSink(replace(base, bootstrap_servers=self.bootstrap), self.topic)

    def __str__(self) -> str:
        if self.kind == "file":
            return str(self.path)
        return f"{KAFKA_SCHEME}{self.bootstrap}/{self.topic}"


def open_sink(
    destination: Destination,
    config: EngineConfig | None = None,
    tsa: TimeStampAuthority | None = None,
) -> AnchorSink:
    """The sink to append anchors to (a Kafka topic is created if missing), stamping
    each line at ``tsa`` when given."""
    sink = destination.sink(config)
    ensure = getattr(sink, "ensure_topic", None)
    if ensure is not None:
        ensure()
    return StampingSink(sink, tsa) if tsa is not None else sink


def read_log(sink: AnchorSink, trust: TsaTrust | None = None) -> AnchorLog:
    """Every anchor at the destination, oldest first, each line's Merkle root, link and
    RFC 3161 token checked."""
    return check_stamps(parse_anchors(sink.lines(), sink.name), trust)


def _host_port(server: str) -> bool:
    host, _, port = server.rpartition(":")
    return bool(host) and port.isdigit()
