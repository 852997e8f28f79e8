"""The pytest plugin of :mod:`jobledger.testing`, registered by the ``pytest11`` entry point
(or ``-p jobledger.testing.plugin``): the ``jobledger_env`` fixture."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from jobledger.testing.env import EnvFactory, workflow_envs


@pytest.fixture
def jobledger_env() -> Iterator[EnvFactory]:
    """``jobledger_env(workflows=[...], tasks=[...], ...)`` builds a
    :class:`~jobledger.testing.WorkflowTestEnv` (same arguments); each is closed (its
    store deleted) when the test ends, however it ends."""
    with workflow_envs() as build:
        yield build
