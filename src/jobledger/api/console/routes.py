"""The web console's routes: thin handlers over the engine's facade and the views.

Every page needs a signed-in session (see :mod:`.session`); every form carries the
session's CSRF token; every response carries a Content-Security-Policy that allows only
the console's own script and stylesheet. Ids travel in query strings, not in paths: a
tenant or job id may hold a ``/``.
"""

from __future__ import annotations

import json
import secrets
import threading
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from decimal import Decimal
from importlib import resources
from typing import Annotated, Any
from urllib.parse import urlencode

from fastapi import APIRouter, Depends, Form, Request
from fastapi.responses import (
    HTMLResponse,
    JSONResponse,
    RedirectResponse,
    Response,
    StreamingResponse,
)
from jinja2 import Environment, PackageLoader, select_autoescape

from jobledger.api import approvals as approval_requests
from jobledger.api.auth import AuthenticationError, Authenticator, Principal, Role
from jobledger.api.console.session import (
    COOKIE,
    PRE_SIGN_IN_COOKIE,
    Session,
    SessionCodec,
    Sessions,
)
from jobledger.api.deps import spend_rate
from jobledger.api.live import LogBell, job_events, resume_after
from jobledger.api.problems import Problem
from jobledger.api.schedule_models import ScheduleSummary
from jobledger.api.settings import ApiSettings
from jobledger.domain.batch import BatchView
from jobledger.domain.errors import (
    ApprovalError,
    InvalidPayloadError,
    JobFinishedError,
    JobLedgerError,
    UnknownBatchError,
    UnknownJobError,
)
from jobledger.domain.identity import job_uuid
from jobledger.domain.job import Job
from jobledger.domain.payloads import parse_json
from jobledger.domain.status import JobStatus, UnknownStatusError, parse_statuses
from jobledger.engine.bulk_query import BulkQuery
from jobledger.engine.engine import Engine
from jobledger.presentation.audit_lines import audit_line, personal_paths
from jobledger.presentation.figures import money, when
from jobledger.presentation.job_view import job_document
from jobledger.presentation.json_output import jsonable
from jobledger.projections import JobViews
from jobledger.projections.job_views import JobQuery, cursor

PREFIX = "/console"
CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
)
SECURITY_HEADERS = {
    "Content-Security-Policy": CSP,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "X-Frame-Options": "DENY",
    "Cache-Control": "no-store",
}
PAGE_SIZE = 50
EVENT_TYPES = ",".join(
    sorted(
        name
        for name, kind in vars(Job).items()
        if isinstance(kind, type) and issubclass(kind, Job.Event) and kind is not Job.Event
    )
)
"""The live stream names each message by its event type; EventSource has no wildcard,
so the job page's script listens for each of these."""
STATIC = {"console.css": "text/css", "console.js": "text/javascript"}


class _NotFound(Exception):
    """A job (or tenant) this principal may not see, or that does not exist: the same 404."""


class Console:
    """What the console's handlers share; one per app, made from what ``create_app``
    put in ``app.state`` (the engine, the views and their lock, the authenticator, the
    settings and the log bell of the live streams)."""

    def __init__(self, state: Any) -> None:
        self.engine: Engine = state.engine
        self.views: JobViews = state.views
        self.views_lock: threading.Lock = state.views_lock
        self.authenticator: Authenticator = state.authenticator
        settings: ApiSettings = state.settings
        secret = settings.session_secret
        self.codec = SessionCodec(
            secret.get_secret_value().encode() if secret is not None else secrets.token_bytes(32)
        )
        self.sessions = Sessions()
        self.cookie_secure = settings.cookie_secure
        self.heartbeat_seconds = settings.sse_heartbeat_seconds
        self.bell: LogBell = state.live
        """The app's one follower of the log for live streams (the API's own)."""
        self.templates = Environment(
            loader=PackageLoader("jobledger.api.console", "templates"),
            autoescape=select_autoescape(default=True, default_for_string=True),
        )
        self.templates.filters.update(when=when, money=money, pretty=_pretty)

    # ---- plumbing ----------------------------------------------------------------------

    def now(self) -> datetime:
        # Sessions live in the browser's time, not the engine's (possibly fake) clock.
        return datetime.now(UTC)

    def catch_up(self) -> None:
        with self.views_lock:
            self.views.catch_up()

    def session(self, request: Request) -> Session | None:
        """The request's live session. One signed in with an API key has ended once the
        keys file no longer lists the key (revoked), and acts with the roles it lists now."""
        now = self.now()
        session = self.sessions.get(self.codec.session_id(request.cookies.get(COOKIE), now), now)
        if session is None or session.api_key is None:
            return session
        holder = self.authenticator.key_holder(session.api_key)
        if holder is None:
            self.sessions.end(session.id)
            return None
        return replace(session, principal=holder)

    def render(
        self, name: str, request: Request, session: Session | None, status: int = 200, **ctx: Any
    ) -> HTMLResponse:
        body = self.templates.get_template(name).render(
            session=session, prefix=PREFIX, path=request.url.path, **ctx
        )
        return HTMLResponse(body, status_code=status, headers=SECURITY_HEADERS)

    def secure(self, request: Request) -> bool:
        """A Secure cookie over TLS, or always when configured (TLS ended by a proxy)."""
        return self.cookie_secure or request.url.scheme == "https"

    def redirect(self, to: str) -> RedirectResponse:
        return RedirectResponse(to, status_code=303, headers=SECURITY_HEADERS)

    def not_found(self, request: Request, session: Session | None) -> HTMLResponse:
        return self.render("not_found.html", request, session, status=404)

    def reads(self, session: Session, tenant: str) -> None:
        if not session.principal.may_read(tenant):
            raise _NotFound

    def tenant_page(self, request: Request, tenant: str) -> Response | TenantPage:
        """A page of one tenant's: the session, the tenants it reads and the one shown
        (``tenant``, else the first); or the answer instead (sign in, or not found)."""
        session = self.session(request)
        if session is None:
            return self.redirect(f"{PREFIX}/sign-in")
        tenants = _tenants(session.principal)
        chosen = tenant or (tenants[0] if tenants else "")
        if chosen and not session.principal.may_read(chosen):
            return self.not_found(request, session)
        return TenantPage(session, tenants, chosen)

    def tenant_listing(
        self,
        request: Request,
        tenant: str,
        template: str,
        listing: Callable[[str], dict[str, Any]],
        empty: dict[str, Any],
    ) -> Response:
        """A tenant's page drawn from the views: ``listing(tenant)`` once they caught up
        with the log, ``empty`` when the session reads no tenant."""
        page = self.tenant_page(request, tenant)
        if isinstance(page, Response):
            return page
        context = empty
        if page.chosen:
            self.catch_up()
            context = listing(page.chosen)
        return self.render(
            template, request, page.session, tenants=page.tenants, tenant=page.chosen, **context
        )


@dataclass(frozen=True)
class TenantPage:
    session: Session
    tenants: list[str]
    chosen: str
    """The tenant shown; empty when the session reads none."""


_made = threading.Lock()


def console_of(request: Request) -> Console:
    """The app's Console, made on first use."""
    state = request.app.state
    with _made:
        console: Console | None = getattr(state, "console", None)
        if console is None:
            console = state.console = Console(state)
    return console


def router() -> APIRouter:
    """The console's routes under ``/console``. Without a configured session secret one
    is drawn per process: sessions then end when it stops."""
    api = APIRouter(prefix=PREFIX, include_in_schema=False)
    _add_sign_in(api)
    _add_approvals(api)
    _add_jobs(api)
    _add_schedules(api)
    _add_static(api)
    return api


# ---- sign-in ---------------------------------------------------------------------------------

Of = Annotated[Console, Depends(console_of)]


def _add_sign_in(api: APIRouter) -> None:
    @api.get("")
    @api.get("/")
    def home(request: Request, c: Of) -> Response:
        return c.redirect(f"{PREFIX}/approvals" if c.session(request) else f"{PREFIX}/sign-in")

    @api.get("/sign-in")
    def sign_in_page(request: Request, c: Of) -> Response:
        return _sign_in_form(c, request, None, 200)

    @api.post("/sign-in")
    def sign_in(
        request: Request, c: Of, credential: str = Form(""), csrf: str = Form("")
    ) -> Response:
        credential = credential.strip()
        try:
            # The address's bucket first: each guess is a credential of its own.
            spend_rate(request, None)
            spend_rate(request, credential)
        except Problem as limited:
            return _sign_in_form(c, request, f"Not signed in: {limited.detail}.", 429, limited)
        if not c.codec.pre_sign_in_matches(request.cookies.get(PRE_SIGN_IN_COOKIE), csrf, c.now()):
            return _sign_in_form(c, request, "The form expired; sign in again.", 400)
        try:
            principal, api_key = c.authenticator.identify(credential)
        except AuthenticationError as error:
            return _sign_in_form(c, request, f"Not signed in: {error}.", 401)
        session = c.sessions.start(principal, c.now(), api_key)
        response = c.redirect(f"{PREFIX}/approvals")
        response.set_cookie(
            COOKIE,
            c.codec.encode(session),
            expires=session.expires_at,
            path=PREFIX,
            httponly=True,
            samesite="strict",
            secure=c.secure(request),
        )
        response.delete_cookie(PRE_SIGN_IN_COOKIE, path=PREFIX)
        return response

    @api.post("/sign-out")
    def sign_out(request: Request, c: Of, csrf: str = Form("")) -> Response:
        session = c.session(request)
        if session is not None and not session.csrf_matches(csrf):
            return _bad_form(c, request, session, "Not signed out")
        if session is not None:
            c.sessions.end(session.id)
        response = c.redirect(f"{PREFIX}/sign-in")
        response.delete_cookie(COOKIE, path=PREFIX, httponly=True, samesite="strict")
        return response


def _sign_in_form(
    c: Console, request: Request, error: str | None, status: int, problem: Problem | None = None
) -> Response:
    token, cookie = c.codec.pre_sign_in(c.now())
    response = c.render("sign_in.html", request, None, status, csrf=token, error=error)
    if problem is not None:
        response.headers.update(problem.headers)
    response.set_cookie(
        PRE_SIGN_IN_COOKIE,
        cookie,
        max_age=3600,
        path=PREFIX,
        httponly=True,
        samesite="strict",
        secure=c.secure(request),
    )
    return response


def _bad_form(c: Console, request: Request, session: Session, title: str) -> Response:
    message = "The form's CSRF token did not match (reload the page); nothing was done."
    return c.render("message.html", request, session, 400, title=title, message=message)


# ---- approvals -------------------------------------------------------------------------------


def _add_approvals(api: APIRouter) -> None:
    @api.get("/approvals")
    def approvals(request: Request, c: Of) -> Response:
        session = c.session(request)
        if session is None:
            return c.redirect(f"{PREFIX}/sign-in")
        c.catch_up()
        cards = approval_requests.inbox(c.engine, c.views, session.principal)
        return c.render("inbox.html", request, session, cards=cards)

    @api.get("/approval")
    def approval_page(request: Request, c: Of, tenant: str, job: str, approval: str) -> Response:
        session = c.session(request)
        if session is None:
            return c.redirect(f"{PREFIX}/sign-in")
        card = _card(c, session, tenant, job, approval)
        if card is None:
            return c.not_found(request, session)
        return c.render("approval.html", request, session, card=card, refusal=None)

    @api.post("/approval")
    def decide(
        request: Request,
        c: Of,
        tenant: str = Form(),
        job: str = Form(),
        approval: str = Form(),
        action_sha256: str = Form(),
        shown_sha256: str = Form(""),
        decision: str = Form(),
        comment: str = Form(""),
        data: str = Form(""),
        edit: str = Form(""),
        csrf: str = Form(""),
    ) -> Response:
        session = c.session(request)
        if session is None:
            return c.redirect(f"{PREFIX}/sign-in")
        if not session.csrf_matches(csrf):
            return _bad_form(c, request, session, "Not decided")
        card = _card(c, session, tenant, job, approval)
        if card is None:
            return c.not_found(request, session)
        if not session.principal.may(Role.APPROVER, tenant):
            return _refused(c, request, session, card, "you are not an approver of this tenant")
        if shown_sha256 != card.shown_sha256:
            why = "what this approval does changed since the page was shown: read it again below"
            return _refused(c, request, session, card, why)
        try:
            c.engine.decide(
                tenant,
                job,
                approval,
                decision,
                session.principal.subject,
                comment.strip() or None,
                action_sha256=action_sha256,
                edit=_json_field(edit, "the edit"),
                data=_json_field(data, "the data"),
            )
        except UnknownJobError:
            return c.not_found(request, session)
        except (ApprovalError, JobFinishedError, InvalidPayloadError) as error:
            fresh = _card(c, session, tenant, job, approval) or card
            return _refused(c, request, session, fresh, str(error))
        return c.redirect(f"{PREFIX}/job?{urlencode({'tenant': tenant, 'job': job})}")


def _json_field(text: str, what: str) -> dict[str, Any] | None:
    """A form's JSON object field; blank: none given."""
    if not text.strip():
        return None
    try:
        value = parse_json(text)
    except json.JSONDecodeError as error:
        raise InvalidPayloadError(f"{what} is not JSON: {error.msg}") from None
    if not isinstance(value, dict):
        raise InvalidPayloadError(f"{what} must be a JSON object")
    return value


def _card(
    c: Console, session: Session, tenant: str, job: str, approval: str
) -> approval_requests.ApprovalCard | None:
    if not session.principal.may_read(tenant):
        return None
    try:
        return approval_requests.approval(c.engine, tenant, job, approval)
    except UnknownJobError:
        return None


def _refused(
    c: Console, request: Request, session: Session, card: approval_requests.ApprovalCard, why: str
) -> Response:
    return c.render("approval.html", request, session, 409, card=card, refusal=why)


# ---- jobs and spend --------------------------------------------------------------------------


def _add_jobs(api: APIRouter) -> None:
    @api.get("/jobs")
    def jobs(
        request: Request,
        c: Of,
        tenant: str = "",
        status: str = "",
        workflow: str = "",
        after: str = "",
        batch: str = "",
    ) -> Response:
        page = c.tenant_page(request, tenant)
        if isinstance(page, Response):
            return page
        session, tenants, chosen = page.session, page.tenants, page.chosen
        context: dict[str, Any] = {
            "tenants": tenants,
            "tenant": chosen,
            "statuses": [str(s) for s in JobStatus],
            "filters": {"status": status, "workflow": workflow},
            "rows": [],
            "counts": {},
            "more": None,
            "error": None,
            # Only an operator is offered the selection (and the POST checks again).
            "acts": bool(chosen) and session.principal.may(Role.OPERATOR, chosen),
            "batch": _batch(c, chosen, batch),
        }
        if chosen:
            context.update(_listing(c, chosen, status, workflow, after))
        refused = 400 if context["error"] is not None else 200
        return c.render("jobs.html", request, session, refused, **context)

    @api.post("/jobs/cancel")
    def cancel_selected(
        request: Request,
        c: Of,
        tenant: str = Form(),
        job: Annotated[list[str] | None, Form()] = None,
        reason: str = Form(""),
        csrf: str = Form(""),
    ) -> Response:
        """The selected jobs cancelled as one batch, by the signed-in operator."""
        return _act_on_selected(c, request, SELECTED["cancel"], tenant, job, reason, csrf)

    @api.post("/jobs/retry")
    def retry_selected(
        request: Request,
        c: Of,
        tenant: str = Form(),
        job: Annotated[list[str] | None, Form()] = None,
        reason: str = Form(""),
        csrf: str = Form(""),
    ) -> Response:
        """The selected jobs retried as one batch (those not failed are skipped, with why),
        by the signed-in operator."""
        return _act_on_selected(c, request, SELECTED["retry"], tenant, job, reason, csrf)

    @api.get("/job")
    def job_page(
        request: Request, c: Of, tenant: str, job: str, version: int | None = None
    ) -> Response:
        session = c.session(request)
        if session is None:
            return c.redirect(f"{PREFIX}/sign-in")
        try:
            c.reads(session, tenant)
            context = _job_context(c, tenant, job, version)
        except (_NotFound, UnknownJobError):
            return c.not_found(request, session)
        pending = context["doc"].get("pending_approval") or {}
        approvers = pending.get("approvers") or ()
        decides = approval_requests.offers_decision(session.principal, tenant, approvers)
        return c.render(
            "job.html", request, session, decides=decides, **context, **_repairs(session, tenant)
        )

    @api.post("/job/repair")
    def repair(
        request: Request,
        c: Of,
        tenant: str = Form(),
        job: str = Form(),
        action: str = Form(),
        reason: str = Form(""),
        step: str = Form(""),
        csrf: str = Form(""),
    ) -> Response:
        """Retry or reset the job (operator), recorded as the signed-in subject."""
        session = c.session(request)
        if session is None:
            return c.redirect(f"{PREFIX}/sign-in")
        if not session.csrf_matches(csrf):
            return _bad_form(c, request, session, "Not repaired")
        try:
            c.reads(session, tenant)
            refusal = _repair(c, session, tenant, job, action, reason.strip(), step)
            if refusal is None:
                return c.redirect(f"{PREFIX}/job?{urlencode({'tenant': tenant, 'job': job})}")
            context = _job_context(c, tenant, job, None)
        except (_NotFound, UnknownJobError):
            return c.not_found(request, session)
        page = {**context, **_repairs(session, tenant), "refusal": refusal}
        return c.render("job.html", request, session, 409, decides=False, **page)

    @api.get("/job/events")
    def job_live(request: Request, c: Of, tenant: str, job: str, after: int = 0) -> Response:
        """The job's events after version ``after`` (or the ``Last-Event-ID`` a
        reconnecting EventSource sends), live: the API's own stream, for the session."""
        session = c.session(request)
        try:
            if session is None:
                raise _NotFound
            c.reads(session, tenant)
            head = c.engine.job(tenant, job).version
        except (_NotFound, UnknownJobError):
            return JSONResponse({"error": "not found"}, 404, headers=SECURITY_HEADERS)
        try:
            start = resume_after(request.headers.get("last-event-id"), after, head)
        except InvalidPayloadError as error:
            return JSONResponse({"error": str(error)}, 400, headers=SECURITY_HEADERS)
        c.bell.start()  # here, on the thread pool: a store error is an error page, not a cut stream
        frames = job_events(
            c.bell, job_uuid(tenant, job), start, heartbeat_seconds=c.heartbeat_seconds
        )
        headers = {**SECURITY_HEADERS, "X-Accel-Buffering": "no"}
        return StreamingResponse(frames, media_type="text/event-stream", headers=headers)

    @api.get("/spend")
    def spend(request: Request, c: Of, tenant: str = "") -> Response:
        def days(chosen: str) -> dict[str, Any]:
            ceiling = c.engine.config.cost_ceiling_for(chosen)
            spent = c.views.spend_days(chosen)
            return {
                "ceiling": ceiling,
                "days": [(d, usd, _share(usd, ceiling)) for d, usd in spent],
            }

        return c.tenant_listing(
            request, tenant, "spend.html", days, {"ceiling": Decimal(0), "days": []}
        )


def _add_schedules(api: APIRouter) -> None:
    @api.get("/schedules")
    def schedules(request: Request, c: Of, tenant: str = "") -> Response:
        def rows(chosen: str) -> dict[str, Any]:
            return {"rows": [ScheduleSummary.of(row) for row in c.views.tenant_schedules(chosen)]}

        return c.tenant_listing(request, tenant, "schedules.html", rows, {"rows": []})


@dataclass(frozen=True)
class _Selected:
    """How the jobs page words one action on the selected jobs."""

    action: str
    refused: str
    doing: str
    default_reason: str


SELECTED = {
    "cancel": _Selected("cancel", "Not cancelled", "Cancelling", "cancelled from the console"),
    "retry": _Selected("retry", "Not retried", "Retrying", "retried from the console"),
}


def _act_on_selected(
    c: Console,
    request: Request,
    what: _Selected,
    tenant: str,
    job: list[str] | None,
    reason: str,
    csrf: str,
) -> Response:
    """The selected jobs acted on as one batch by the signed-in operator; back to the
    jobs page, which says what the batch did."""
    session = c.session(request)
    if session is None:
        return c.redirect(f"{PREFIX}/sign-in")
    if not session.csrf_matches(csrf):
        return _bad_form(c, request, session, what.refused)
    if not session.principal.may_read(tenant):
        return c.not_found(request, session)
    if not session.principal.may(Role.OPERATOR, tenant):
        message = f"{what.doing} jobs takes the operator role in this tenant; nothing was done."
        return c.render("message.html", request, session, 403, title=what.refused, message=message)
    if not job:
        message = "No job was selected; nothing was done."
        return c.render("message.html", request, session, 400, title=what.refused, message=message)
    done = c.engine.bulk.bulk(
        tenant,
        what.action,
        BulkQuery(job_ids=tuple(job)),
        by=session.principal.subject,
        reason=reason.strip() or what.default_reason,
    )
    query = urlencode({"tenant": tenant, "batch": done.batch_id})
    return c.redirect(f"{PREFIX}/jobs?{query}")


def _batch(c: Console, tenant: str, batch_id: str) -> BatchView | None:
    """The batch a selection just ran, to say what it did (none unknown to the tenant)."""
    if not tenant or not batch_id:
        return None
    try:
        return c.engine.bulk.batch(tenant, batch_id)
    except (UnknownBatchError, InvalidPayloadError):
        return None


def _listing(c: Console, tenant: str, status: str, workflow: str, after: str) -> dict[str, Any]:
    """The page's rows, or the error its filter or cursor is refused with (an unknown
    status would match no job: the page would say "No jobs." of a filter that is wrong)."""
    try:
        status_in = parse_statuses(status)
    except UnknownStatusError as error:
        return {"error": str(error)}
    c.catch_up()
    query = JobQuery(
        tenant_id=tenant,
        status_in=status_in,
        workflow_type=workflow or None,
        after=after or None,
        limit=PAGE_SIZE + 1,
    )
    try:
        rows = c.views.jobs(query)
    except InvalidPayloadError as error:
        return {"error": str(error)}
    return {
        "rows": rows[:PAGE_SIZE],
        "more": cursor(rows[PAGE_SIZE - 1]) if len(rows) > PAGE_SIZE else None,
        "counts": c.views.status_counts(tenant),
    }


def _job_context(c: Console, tenant: str, job: str, version: int | None) -> dict[str, Any]:
    now = c.engine.job(tenant, job)
    history = c.engine.history(tenant, job)
    shown, error = now, None
    if version is not None and version != now.version:
        try:
            shown = c.engine.job_at(tenant, job, version=version)
        except JobLedgerError as problem:
            error = str(problem)
    at_version = shown.version if shown is not now else None
    personal = personal_paths(history)
    return {
        "job": shown,
        "latest": now,
        "doc": job_document(shown, history[: shown.version]),
        "family": c.engine.family(tenant, job),
        "timeline": [(entry, audit_line(entry, personal)) for entry in history],
        "broken": c.engine.verify(tenant, job),
        "at_version": at_version,
        "error": error,
        "query": urlencode({"tenant": tenant, "job": job}),
        "event_types": EVENT_TYPES,
        "approval_query": urlencode(
            {"tenant": tenant, "job": job, "approval": now.pending_approval_id or ""}
        ),
    }


def _repairs(session: Session, tenant: str) -> dict[str, Any]:
    """What the job page's repair forms need: whether the caller may repair, no refusal."""
    return {"operates": session.principal.may(Role.OPERATOR, tenant), "refusal": None}


def _repair(
    c: Console, session: Session, tenant: str, job: str, action: str, reason: str, step: str
) -> str | None:
    """Run the repair a form asked for; the reason it was refused, or None when done."""
    who = session.principal
    if not who.may(Role.OPERATOR, tenant):
        return f"{who.subject!r} lacks the operator role in tenant {tenant!r}"
    if not reason:
        return "say why (the reason is recorded)"
    try:
        if action == "retry":
            c.engine.retry(tenant, job, by=who.subject, reason=reason)
        elif action == "reset" and step.strip().isdigit():
            c.engine.reset(tenant, job, int(step), by=who.subject, reason=reason)
        else:
            return "a reset names the step to go on after, a whole number"
    except UnknownJobError:
        raise
    except JobLedgerError as error:
        return str(error)
    return None


def _tenants(principal: Principal) -> list[str]:
    return sorted(t for t in principal.tenants if t != "*")


def _share(amount: Decimal, ceiling: Decimal) -> int | None:
    if ceiling <= 0:
        return None
    return min(100, int(amount * 100 / ceiling))


def _pretty(value: Any) -> str:
    return json.dumps(jsonable(value), indent=2, sort_keys=True, ensure_ascii=False)


# ---- the two static files --------------------------------------------------------------------


def _add_static(api: APIRouter) -> None:
    @api.get("/static/{name}")
    def static(name: str) -> Response:
        kind = STATIC.get(name)
        if kind is None:
            return Response("not found", 404, media_type="text/plain")
        body = resources.files("jobledger.api.console").joinpath("static", name).read_bytes()
        headers = {"Cache-Control": "max-age=300", "X-Content-Type-Options": "nosniff"}
        return Response(body, media_type=kind, headers=headers)
