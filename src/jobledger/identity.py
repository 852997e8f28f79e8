"""Deterministic identities: a job's aggregate id and the ids of its at-most-once keys."""

from __future__ import annotations

from uuid import UUID, uuid5

# Fixed namespaces: changing one would orphan every stored job and key.
JOB_NAMESPACE = UUID("6f1c3f0e-8a53-4f55-9a5e-4f3c0c7e2b11")
KEY_NAMESPACE = UUID("0d7e3b7a-52e4-4b8e-9d8f-2f3d6c1a9e42")


def job_uuid(tenant_id: str, job_id: str) -> UUID:
    """The tenant is part of the identity: no lookup by job id alone can cross tenants."""
    return uuid5(JOB_NAMESPACE, f"{len(tenant_id)}:{tenant_id}/{job_id}")


def step_key(job_id: str, step_number: int) -> str:
    """Stable across every re-delivery: never the claim version, never the tick reason."""
    return f"{job_id}:step:{step_number}"


def key_uuid(tenant_id: str, kind: str, key: str) -> UUID:
    """The identity of the event that consumes ``key``; a second use collides in the store."""
    return uuid5(KEY_NAMESPACE, f"{kind}\x00{len(tenant_id)}:{tenant_id}\x00{key}")
