"""Audit: verify a job's chain, or every chain of a tenant; how far the views are."""

from __future__ import annotations

from fastapi import APIRouter, Request

from jobledger.adapters.signing import Keyring
from jobledger.api.auth import Principal, Role
from jobledger.api.deps import Caller, EngineDep, tenant_scope
from jobledger.api.models import PartitionLag, TenantVerdict, Verdict
from jobledger.api.paths import JOB, TENANT
from jobledger.api.problems import EVERY_REQUEST, Problem, documented
from jobledger.audit.tamper import JobCheck, Signatures, verify_one, verify_store
from jobledger.domain.identity import job_uuid
from jobledger.engine.engine import Engine
from jobledger.projections import JobViews

router = APIRouter(tags=["audit"], responses=EVERY_REQUEST)

NOT_FOUND = documented(403, 404)


@router.get(f"{JOB}/verify", response_model=Verdict, responses=NOT_FOUND)
def verify_job(tenant: str, job: str, caller: Caller, engine: EngineDep) -> Verdict:
    """Recompute the job's hash chain from its stored rows (auditor): intact, or the
    first broken link (an edited, deleted or reordered event; with a configured keyring
    also an event not signed by a key valid at its time)."""
    tenant_scope(caller, tenant, Role.AUDITOR, job_id=job)
    signatures = _signatures(engine)
    check = verify_one(engine.deps.store, job_uuid(tenant, job), signatures=signatures).jobs[0]
    if check.events == 0:
        engine.job(tenant, job)  # raises: no such job
    return _verdict(check, tenant, job, signatures is not None)


@router.get(f"{TENANT}/verify", response_model=TenantVerdict, responses=NOT_FOUND)
def verify_tenant(tenant: str, caller: Caller, engine: EngineDep) -> TenantVerdict:
    """Recompute every chain of the tenant's jobs from the stored rows (auditor).

    A job whose history no longer says whose it is (its ``Submitted`` gone or undecodable)
    is reported only to callers who see every tenant: to anyone else it could be another
    tenant's."""
    tenant_scope(caller, tenant, Role.AUDITOR)
    report = verify_store(engine.deps.store, tenant_id=tenant, signatures=_signatures(engine))
    checks = [check for check in report.jobs if _shown(check, caller)]
    signed = report.signatures_checked
    broken = [
        _verdict(check, tenant, check.job_id or str(check.job_uuid), signed)
        for check in checks
        if check.broken is not None
    ]
    return TenantVerdict(
        tenant_id=tenant,
        jobs=len(checks),
        intact=not broken,
        broken=broken,
        signatures_checked=signed,
    )


def _signatures(engine: Engine) -> Signatures | None:
    """The configured keyring, read at each request: a key published since is known."""
    path = engine.deps.config.signing.keyring
    return Signatures(Keyring.from_file(path)) if path is not None else None


def _shown(check: JobCheck, caller: Principal) -> bool:
    return check.tenant_id is not None or caller.sees_every_tenant


def _verdict(check: JobCheck, tenant: str, job: str, signed: bool) -> Verdict:
    broken = check.broken
    return Verdict(
        tenant_id=tenant,
        job_id=job,
        intact=broken is None,
        signatures_checked=signed,
        broken_at=broken.version if broken else None,
        event_type=broken.event_type if broken else None,
        reason=f"{broken.kind}: {broken.reason}" if broken else None,
    )


@router.get("/projections", response_model=list[PartitionLag])
def projections_status(caller: Caller, request: Request, engine: EngineDep) -> list[PartitionLag]:
    """How far each partition's views (and, on the kafka transport, the outbox) are
    behind the log (an auditor or admin of any tenant)."""
    if not (Role.AUDITOR in caller.roles or Role.ADMIN in caller.roles):
        raise Problem(403, f"{caller.subject!r} lacks the auditor role", error="Forbidden")
    views: JobViews = request.app.state.views
    lag = views.lag()
    if engine.config.transport == "kafka":
        from jobledger.projections.outbox import outbox_lag

        lag += outbox_lag(views.store)
    return [
        PartitionLag(
            partition=entry.partition,
            last_event=entry.last_event,
            last_tracked=entry.last_tracked,
            behind=entry.behind,
        )
        for entry in lag
    ]
