"""The embedded default stays light: importing jobledger and opening an engine on a SQLite
file loads neither the PostgreSQL driver (psycopg) nor the Kafka client (kafka-python).
They are imported where a PostgreSQL store or the Kafka transport is chosen."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

PROGRAM = """
import json, sys
import jobledger
from jobledger import Engine, FunctionRegistry, JobStatus, Resolution, linear_workflow

registry = FunctionRegistry()
registry.register("done", 1, linear_workflow([Resolution("finish", JobStatus.COMPLETED)]))
with Engine.open(sys.argv[1], registry=registry) as engine:
    engine.submit("t", "j", "done")
    engine.run_until_idle()
    assert engine.job("t", "j").status is JobStatus.COMPLETED
print(json.dumps(sorted(m for m in sys.modules if m.startswith(("psycopg", "kafka")))))
"""


def test_import_and_a_sqlite_engine_load_no_postgres_or_kafka_client(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'jobs.db'}"
    done = subprocess.run(
        [sys.executable, "-c", PROGRAM, url],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    assert json.loads(done.stdout.splitlines()[-1]) == []
