"""Opening the archive an :class:`~jobledger.domain.retention.ArchiveTarget` names: the
directory ``archive --to DIR`` writes, or the topic ``archive --to-topic TOPIC`` sends to
(at the configured brokers)."""

from __future__ import annotations

from jobledger.audit.archive import ArchiveSink, DirectoryArchive
from jobledger.config import EngineConfig
from jobledger.domain.retention import ArchiveTarget


def open_archive(target: ArchiveTarget, config: EngineConfig) -> ArchiveSink:
    """The sink (raises RetentionError when it cannot be made: a directory that cannot
    be created, a broker away); a Kafka one is closed by :func:`close_archive`."""
    if target.directory is not None:
        return DirectoryArchive(target.directory)
    assert target.topic is not None
    # Imported here: kafka-python costs start-up time to a directory's users.
    from jobledger.adapters.kafka.settings import KafkaSettings
    from jobledger.audit.kafka_archive import KafkaArchive

    return KafkaArchive(KafkaSettings.of(config), target.topic)


def close_archive(sink: ArchiveSink) -> None:
    close = getattr(sink, "close", None)
    if close is not None:
        close()
