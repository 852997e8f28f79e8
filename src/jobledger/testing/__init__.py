"""A kit to test workflows: ``from jobledger.testing import WorkflowTestEnv``.

An engine on a temporary SQLite store whose clock moves only when the test says so
(:class:`WorkflowTestEnv`), handles on its jobs with their steps, history and result
(:class:`JobHandle`), recording fakes for step functions (:class:`StepFake`), and the
tokens and approval requests the jobs handed out (:class:`RecordingNotifier`). Usable
without pytest; with pytest, the ``jobledger_env`` fixture (``jobledger.testing.plugin``,
registered by entry point) builds environments and closes them after the test;
:func:`workflow_envs` does the same without pytest.
"""

from jobledger.testing.env import DEFAULT_START, DEFAULT_TENANT, WorkflowTestEnv, workflow_envs
from jobledger.testing.fakes import StepCall, StepFake
from jobledger.testing.handle import JobHandle, StepRecord, WorkflowTestError, assert_steps
from jobledger.testing.notices import ApprovalNotice, RecordingNotifier, TokenNotice

__all__ = [
    "DEFAULT_START",
    "DEFAULT_TENANT",
    "ApprovalNotice",
    "JobHandle",
    "RecordingNotifier",
    "StepCall",
    "StepFake",
    "StepRecord",
    "TokenNotice",
    "WorkflowTestEnv",
    "WorkflowTestError",
    "assert_steps",
    "workflow_envs",
]
