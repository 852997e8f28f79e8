"""An archive run to SIGKILL, for tests/test_retention_crash.py:
``python -m tests.support.archive_crash --store URL --to DIR --marker FILE --hang-at POINT``.

It archives every finished job (ended more than 0 days ago, by the system clock) to DIR,
and at the chosen point of the second job (``archived``: its archive file is written,
its transaction not begun; ``buried``: its transaction has committed) touches the
marker and waits for SIGKILL.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from uuid import UUID

from jobledger import EngineConfig
from jobledger.audit.archive import DirectoryArchive
from jobledger.domain.retention import RetentionPolicy, Tombstone
from jobledger.projections.job_views import JobViews
from jobledger.projections.retention import Archiver, Scope
from tests.support.engines import default_registry, open_engine, store_of


def hang(marker: Path) -> None:
    marker.touch()
    while True:
        time.sleep(60)


class HangingArchive(DirectoryArchive):
    def __init__(self, root: Path, marker: Path, at: int) -> None:
        super().__init__(root)
        self.marker, self.at, self.written = marker, at, 0

    def write(self, job_uuid: UUID, key: str, data: bytes) -> str:
        ref = super().write(job_uuid, key, data)
        self.written += 1
        if self.written == self.at:
            hang(self.marker)
        return ref


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--store", required=True)
    parser.add_argument("--to", type=Path, required=True)
    parser.add_argument("--marker", type=Path, required=True)
    parser.add_argument("--hang-at", choices=["archived", "buried"], required=True)
    args = parser.parse_args()
    config = EngineConfig(store_url=args.store, worker_id="archiver")
    engine = open_engine(config=config, registry=default_registry())
    store = store_of(engine)
    archive = HangingArchive(args.to, args.marker, 2 if args.hang_at == "archived" else 0)
    if args.hang_at == "buried":
        buried = store.remove_archived

        def bury_then_hang(tombstone: Tombstone, also: object = None) -> None:
            buried(tombstone, also)  # type: ignore[arg-type]
            if len(store.tombstones_of()) == 2:
                hang(args.marker)

        store.remove_archived = bury_then_hang  # type: ignore[method-assign]
    archiver = Archiver(store, JobViews(store))
    scope = Scope(RetentionPolicy(), older_than_days=0)
    now = engine.clock.now()
    archiver.run(archive, archiver.due(scope, now), now)
    engine.close()


if __name__ == "__main__":
    main()
