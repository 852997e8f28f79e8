"""The domain: the aggregates (jobs, schedules, keys), their events and value objects,
and the pure rules over them."""
