"""The store's schema: numbered migrations recorded in ``jobledger_schema``, applied when a
writer opens the store, only checked when a reader does, and a store made by an earlier
release (no versions recorded, the views' positions in the library's tracking table)
opened and migrated without folding the views again."""

from __future__ import annotations

import sys
import uuid
from collections.abc import Callable
from typing import Any

import psycopg
import pytest
from eventsourcing.persistence import Tracking, TrackingRecorder
from eventsourcing.postgres import PostgresTrackingRecorder
from eventsourcing.sqlite import SQLiteTrackingRecorder

from jobledger import Engine
from jobledger.adapters.backends import StoreBackend
from jobledger.adapters.backends.base import SCHEMA_TABLE, TRACKING_TABLE
from jobledger.adapters.backends.migrations import COMPONENT, STORE_MIGRATIONS
from jobledger.adapters.event_store import EventSourcedJobStore
from jobledger.adapters.store_url import parse_store_url
from jobledger.adapters.subject_keys import COMPONENT as ERASURE
from jobledger.adapters.subject_keys import MIGRATIONS as ERASURE_MIGRATIONS
from jobledger.audit.log import job_uuids
from jobledger.cli import main
from jobledger.domain.errors import StoreMissingError, StoreSchemaError
from jobledger.projections import JobViews
from jobledger.projections.job_views import SCHEMA as VIEWS
from jobledger.projections.outbox import Outbox
from tests.support.services import postgres_schema_url

EngineFactory = Callable[..., Engine]


def store_of(engine: Engine) -> EventSourcedJobStore:
    assert isinstance(engine.store, EventSourcedJobStore)
    return engine.store


def versions(backend: StoreBackend) -> dict[str, list[int]]:
    rows = backend.fetch(
        f"SELECT component, version FROM {backend.table(SCHEMA_TABLE)} ORDER BY version"
    )
    found: dict[str, list[int]] = {}
    for row in rows:
        found.setdefault(row["component"], []).append(int(row["version"]))
    return found


def library_tracking(backend: StoreBackend) -> TrackingRecorder:
    """The tracking recorder the views and the outbox wrote through before this release."""
    if backend.kind == "sqlite":
        return SQLiteTrackingRecorder(backend.datastore)  # type: ignore[attr-defined]
    return PostgresTrackingRecorder(
        backend.datastore,  # type: ignore[attr-defined]
        tracking_table_name="jobledger_view_tracking",
    )


def as_the_previous_release_left_it(store: EventSourcedJobStore) -> dict[str, int]:
    """Turn the store into what the release before schema versions made: the same
    partitions, leases and views tables, no schema table, and every reader's position in
    the library's tracking table. Returns those positions."""
    b = store.backend
    positions = {
        row["name"]: int(row["position"])
        for row in b.fetch(f"SELECT name, position FROM {b.table(TRACKING_TABLE)}")
    }
    with b.transaction() as curs:
        curs.execute(b.sql(f"DROP TABLE {b.table(SCHEMA_TABLE)}"))
        curs.execute(b.sql(f"DROP TABLE {b.table(TRACKING_TABLE)}"))
    old = library_tracking(b)
    old.create_table()  # type: ignore[attr-defined]
    for name, position in positions.items():
        old.insert_tracking(Tracking(name, position))
    return positions


class NoPublisher:
    def publish(self, messages: Any) -> None:
        pass


def test_a_new_store_records_every_migration(make_engine: EngineFactory) -> None:
    store = store_of(make_engine())
    JobViews(store)

    assert versions(store.backend) == {
        COMPONENT: [m.version for m in STORE_MIGRATIONS],
        VIEWS: [m.version for m in JobViews(store).migrations()],
        ERASURE: [m.version for m in ERASURE_MIGRATIONS],
    }


def test_a_store_of_the_previous_release_opens_and_migrates_without_folding_again(
    make_engine: EngineFactory, store_url: str
) -> None:
    engine = make_engine()
    engine.submit("t", "j", "agent3")
    engine.run_until_idle()
    store = store_of(engine)
    views = JobViews(store)
    views.catch_up()
    Outbox(store, NoPublisher()).publish_pending()
    positions = as_the_previous_release_left_it(store)
    assert set(positions) == {"jobledger_p0", "jobledger_p0.outbox"}
    assert not store.backend.has_tables(SCHEMA_TABLE, TRACKING_TABLE)
    engine.close()

    reopened = store_of(make_engine())
    upgraded = JobViews(reopened)

    assert versions(reopened.backend)[COMPONENT] == [m.version for m in STORE_MIGRATIONS]
    assert versions(reopened.backend)[VIEWS] == [m.version for m in upgraded.migrations()]
    # The positions were carried over: nothing is behind, nothing was folded again.
    assert upgraded.lag_total() == 0
    assert Outbox(reopened, NoPublisher()).lag()[0].behind == 0
    assert reopened.backend.position("jobledger_p0") == positions["jobledger_p0"]
    assert [row.job_id for row in upgraded.jobs()] == ["j"]
    assert upgraded.jobs()[0].status == "completed"


def test_a_reader_checks_the_schema_and_applies_nothing(
    make_engine: EngineFactory,
) -> None:
    engine = make_engine()
    engine.submit("t", "j", "agent3")
    engine.run_until_idle()
    as_the_previous_release_left_it(store_of(engine))
    engine.close()

    reader = store_of(make_engine(store_mode="read"))

    assert reader.backend.schema_version(COMPONENT) == 0
    assert not reader.backend.has_tables(SCHEMA_TABLE)
    (job,) = job_uuids(reader)
    assert reader.load(job) is not None


@pytest.mark.parametrize("mode", ["create", "existing", "read"])
def test_a_store_migrated_by_a_newer_release_is_refused(
    make_engine: EngineFactory, mode: str
) -> None:
    store = store_of(make_engine())
    with store.backend.transaction() as curs:
        curs.execute(
            store.backend.sql(
                f"INSERT INTO {store.backend.table(SCHEMA_TABLE)} "
                "(component, version, does, applied_at) VALUES ('store', 99, 'later', 'now')"
            )
        )

    with pytest.raises(StoreSchemaError, match="store schema version 99, newer than this"):
        make_engine(store_mode=mode)


def test_views_of_a_newer_release_are_refused(make_engine: EngineFactory) -> None:
    store = store_of(make_engine())
    JobViews(store)
    with store.backend.transaction() as curs:
        curs.execute(
            store.backend.sql(
                f"INSERT INTO {store.backend.table(SCHEMA_TABLE)} "
                "(component, version, does, applied_at) VALUES ('views', 99, 'later', 'now')"
            )
        )

    with pytest.raises(StoreSchemaError, match="views schema version 99"):
        JobViews(store)


def test_the_cli_refuses_a_newer_store_with_exit_3(
    make_engine: EngineFactory, store_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    store = store_of(make_engine())
    with store.backend.transaction() as curs:
        curs.execute(
            store.backend.sql(
                f"INSERT INTO {store.backend.table(SCHEMA_TABLE)} "
                "(component, version, does, applied_at) VALUES ('store', 99, 'later', 'now')"
            )
        )

    for command in (
        ["list"],
        ["verify", "--all"],
        ["cancel", "t", "j", "--reason", "r", "--by", "u"],
    ):
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(sys, "argv", ["jobledger", *command, "--store", store_url])
            with pytest.raises(SystemExit) as done:
                main()
        err = capsys.readouterr().err
        assert done.value.code == 3, (command, err)
        assert "store schema version 99, newer than this jobledger knows" in err, command


def test_a_writer_creates_a_postgresql_schema_that_does_not_exist_and_a_reader_says_so() -> None:
    base = next(postgres_schema_url())  # skips without PostgreSQL; a schema of its own
    server = base.split("?")[0]
    schema = f"new_{uuid.uuid4().hex[:10]}"
    url = f"{server}?schema={schema}"
    try:
        with pytest.raises(StoreMissingError, match=f"no store in schema '{schema}'"):
            EventSourcedJobStore(parse_store_url(url), mode="read")
        store = EventSourcedJobStore(parse_store_url(url), mode="create")
        store.close()
        reopened = EventSourcedJobStore(parse_store_url(url), mode="read")
        reopened.close()
    finally:
        with psycopg.connect(server, autocommit=True) as conn:
            conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
