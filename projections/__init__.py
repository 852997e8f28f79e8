"""Read models that follow the job event log: job status, tenant spend per UTC day and
pending approvals, each rebuildable from zero and resumable after a crash."""

from jobledger.projections.job_views import JobViews, Lag
from jobledger.projections.runner import ProjectionRunner
from jobledger.projections.status import StatusRow

__all__ = ["JobViews", "Lag", "ProjectionRunner", "StatusRow"]
