"""Replay and audit: time travel, replay against a definition with a decision diff,
migration, tamper evidence (chains and anchors), export and import.

- :mod:`~jobledger.audit.time_travel`: a job exactly as it was at a version or moment;
- :mod:`~jobledger.audit.replay`: ``replay_job(events, definition) -> ReplayReport``;
- :mod:`~jobledger.audit.migrate`: moving a job to another definition version;
- :mod:`~jobledger.audit.tamper` and :mod:`~jobledger.audit.anchors`: ``verify``;
- :mod:`~jobledger.audit.export`: export and import as canonical JSON lines;
- :mod:`~jobledger.audit.log`: reading the raw log (every job, every stored row).
"""
