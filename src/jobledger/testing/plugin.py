"""The pytest plugin of :mod:`jobledger.testing`, registered by the ``pytest11`` entry point
(or ``-p jobledger.testing.plugin``): the ``jobledger_env`` fixture."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from jobledger.testing.env import WorkflowTestEnv

EnvFactory = Callable[..., WorkflowTestEnv]
"""``jobledger_env(workflows=[...], tasks=[...], ...)``: the arguments of WorkflowTestEnv."""


@pytest.fixture
def jobledger_env() -> Iterator[EnvFactory]:
    """Build :class:`~jobledger.testing.WorkflowTestEnv` environments for this test; each
    is closed (its store deleted) when the test ends, however it ends."""
    made: list[WorkflowTestEnv] = []

    def build(*args: Any, **kwargs: Any) -> WorkflowTestEnv:
        env = WorkflowTestEnv(*args, **kwargs)
        made.append(env)
        return env

    yield build
    for env in reversed(made):
        env.close()
