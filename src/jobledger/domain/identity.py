"""Deterministic identities: a job's aggregate id and the ids of its at-most-once keys."""

from __future__ import annotations

from uuid import UUID, uuid5

# Fixed namespaces: changing one would orphan every stored job and key.
JOB_NAMESPACE = UUID("6f1c3f0e-8a53-4f55-9a5e-4f3c0c7e2b11")
KEY_NAMESPACE = UUID("0d7e3b7a-52e4-4b8e-9d8f-2f3d6c1a9e42")

# How a job's step keys are shaped, pinned in its Submitted event so a job keeps the
# keys it started with: an executor de-duplicates a re-run step by the key it saw first.
LEGACY_KEY_SCHEME = 1
"""``{job_id}:step:{n}``: jobs submitted before step keys named their tenant."""
KEY_SCHEME = 2
"""``{tenant_id}/{job_id}:step:{n}``, the tenant with '%' and '/' escaped: every new job."""


def job_uuid(tenant_id: str, job_id: str) -> UUID:
    """The tenant is part of the identity: no lookup by job id alone can cross tenants."""
    return uuid5(JOB_NAMESPACE, f"{len(tenant_id)}:{tenant_id}/{job_id}")


def step_key(
    tenant_id: str, job_id: str, step_number: int, scheme: int = KEY_SCHEME, epoch: int = 0
) -> str:
    """Stable across every re-delivery: never the claim version, never the tick reason.

    Unique across tenants: the tenant comes first and its own '/' is escaped, so the first
    '/' ends it and ("x/y", "z") and ("x", "y/z") get different keys.

    ``epoch``: how many times the job was reset (``Job.Reset``). A reset re-runs its later
    steps as new calls, so they get new keys (``...:step:4@e1``); epoch 0, every job never
    reset, keeps the keys it always had, byte for byte."""
    key = (
        f"{job_id}:step:{step_number}"
        if scheme == LEGACY_KEY_SCHEME
        else f"{tenant_id.replace('%', '%25').replace('/', '%2F')}/{job_id}:step:{step_number}"
    )
    return key if epoch == 0 else f"{key}@e{epoch}"


def approval_id(job_id: str, step_number: int, epoch: int = 0) -> str:
    """The id of the approval request a step opens: consumed once per job when decided,
    so a reset's epoch makes the request it opens again a new one (epoch 0: as always)."""
    step = f"{step_number}" if epoch == 0 else f"{step_number}@e{epoch}"
    return f"{job_id}:step:{step}:approval"


def key_uuid(tenant_id: str, kind: str, key: str) -> UUID:
    """The identity of the event that consumes ``key`` once per tenant (a submit key; a
    step key, which names its job itself); a second use collides in the store."""
    return uuid5(KEY_NAMESPACE, f"{kind}\x00{len(tenant_id)}:{tenant_id}\x00{key}")


def job_key_uuid(tenant_id: str, job_id: str, kind: str, key: str) -> UUID:
    """The identity of the event that consumes ``key`` once per job (a signal id, a token
    nonce, an approval id): the same id sent to two jobs is two keys."""
    scope = f"{len(tenant_id)}:{tenant_id}/{len(job_id)}:{job_id}"
    return uuid5(KEY_NAMESPACE, f"{kind}\x00{scope}\x00{key}")


SCHEDULE_NAMESPACE = UUID("3b0f6c52-9d1e-4c8a-8f7e-5a2d9e4b1c67")


def schedule_uuid(tenant_id: str, name: str) -> UUID:
    """A schedule's aggregate id: its tenant and its name, as a job's is."""
    return uuid5(SCHEDULE_NAMESPACE, f"{len(tenant_id)}:{tenant_id}/{name}")
