"""Read models that follow the job event log (status, spend, approvals, outbox)."""
