"""The services the tests find: PostgreSQL (a fresh schema per test). Kafka's broker is
in :mod:`tests.support.kafka_broker`."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from contextlib import contextmanager

import psycopg
import pytest

POSTGRES_URL = os.environ.get("JOBLEDGER_TEST_POSTGRES_URL")
REQUIRE_SERVICES = os.environ.get("JOBLEDGER_REQUIRE_SERVICES") == "1"


def postgres_schema_url() -> Iterator[str]:
    """A fresh schema per test, dropped afterwards, so tests never see each other's jobs."""
    if not POSTGRES_URL:
        if REQUIRE_SERVICES:
            pytest.fail("JOBLEDGER_TEST_POSTGRES_URL is not set but services are required")
        pytest.skip("PostgreSQL not configured (set JOBLEDGER_TEST_POSTGRES_URL)")
    with fresh_schema_url(POSTGRES_URL, "t_") as url:
        yield url


@contextmanager
def fresh_schema_url(postgres_url: str, prefix: str) -> Iterator[str]:
    """A new schema named ``prefix`` and a random suffix, dropped when the block ends."""
    schema = f"{prefix}{uuid.uuid4().hex[:12]}"
    with psycopg.connect(postgres_url, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {schema}")
    try:
        yield f"{postgres_url}?schema={schema}"
    finally:
        with psycopg.connect(postgres_url, autocommit=True) as conn:
            conn.execute(f"DROP SCHEMA {schema} CASCADE")
