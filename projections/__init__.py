"""Read models that follow the job event log: job status, tenant spend per UTC day and
pending approvals, each rebuildable from zero and resumable after a crash."""

from projections.job_views import JobViews, Lag
from projections.runner import ProjectionRunner
from projections.status import StatusRow

__all__ = ["JobViews", "Lag", "ProjectionRunner", "StatusRow"]
