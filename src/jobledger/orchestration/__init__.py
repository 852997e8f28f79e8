"""The tick and the ports: what advances a job, against Protocols only (no adapter)."""
