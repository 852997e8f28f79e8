"""Errors as RFC 9457 ``application/problem+json``.

The engine's errors map to statuses by the same classes as the CLI's exit codes
(:func:`jobledger.cli.session.exit_code`): *refused or invalid* (exit 1) is a 4xx that
says which (400 bad input, 403 not the approver, 404 no such job, data subject or
schedule, 410 a job archived (its ``tombstone`` in the body), 409 a conflict with the
job or schedule as it is, or an erasure refused, 422 an idempotency key reused for a
different request);
*store or configuration* (exit 3) and *temporary, try again* (exit 4) are 503, the
latter with ``Retry-After``. Every problem names the engine's error class in ``error``
(``type`` is a URN of it) so clients can branch on it."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from eventsourcing.persistence import PersistenceError
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel
from starlette.exceptions import HTTPException

from jobledger.adapters.store_errors import store_error_types
from jobledger.audit.errors import NoSuchVersionError
from jobledger.domain import errors
from jobledger.domain.redaction import redact

MEDIA_TYPE = "application/problem+json"
TYPE_PREFIX = "urn:jobledger:error:"
RETRY_AFTER_SECONDS = 1

TITLES = {
    400: "Bad Request",
    401: "Unauthorized",
    403: "Forbidden",
    404: "Not Found",
    405: "Method Not Allowed",
    409: "Conflict",
    410: "Gone",
    413: "Content Too Large",
    415: "Unsupported Media Type",
    422: "Unprocessable Content",
    429: "Too Many Requests",
    500: "Internal Server Error",
    503: "Service Unavailable",
}

# Refused or invalid (the CLI's exit 1), most specific first: the status that says which.
_REFUSED: tuple[tuple[type[Exception], int], ...] = (
    (errors.JobArchivedError, 410),
    (errors.UnknownJobError, 404),
    (errors.UnknownSubjectError, 404),
    (errors.UnknownScheduleError, 404),
    (errors.UnknownDeadLetterError, 404),
    (errors.UnknownSubscriptionError, 404),
    (errors.UnknownBatchError, 404),
    (NoSuchVersionError, 404),
    (errors.UnauthorisedDeciderError, 403),
    (errors.InvalidTokenError, 401),
    (errors.ExpiredTokenError, 401),
    (errors.DuplicateKeyError, 409),
    (errors.IdempotencyKeyReusedError, 422),
    (errors.JobConflictError, 409),
    (errors.JobNotWaitingError, 409),
    (errors.JobFinishedError, 409),
    (errors.ApprovalError, 409),
    (errors.TokenError, 409),
    (errors.ErasureError, 409),
    (errors.ScheduleExistsError, 409),
    (errors.ScheduleStateError, 409),
    (errors.BatchExistsError, 409),
    (errors.RepairStepError, 422),
    (errors.RepairError, 409),
)


class ProblemDetails(BaseModel):
    """RFC 9457 problem details, as every error is answered."""

    type: str
    """``urn:jobledger:error:<error>``."""
    title: str
    status: int
    detail: str
    """What was wrong, in words."""
    error: str
    """The engine's error class (``UnknownJobError``, ``StaleApprovalError``, ...) or the
    API's own (``AuthenticationError``, ``Forbidden``, ``RateLimited``, ...)."""
    instance: str | None = None


def documented(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """OpenAPI ``responses`` for these statuses: problem+json bodies."""
    return {
        status: {
            "model": ProblemDetails,
            "description": TITLES[status],
            "content": {MEDIA_TYPE: {}},
        }
        for status in statuses
    }


def text_body(media_type: str, description: str, *statuses: int) -> dict[int | str, dict[str, Any]]:
    """OpenAPI ``responses`` of a route whose 200 body is text of ``media_type`` (a stream,
    an export, a scrape), and the problems of ``statuses``."""
    ok = {"content": {media_type: {"schema": {"type": "string"}}}, "description": description}
    return {200: ok, **documented(*statuses)}


EVERY_REQUEST = documented(400, 401, 413, 429, 503)
"""What any /v1 request can be answered besides its own outcomes."""


class Problem(Exception):
    """An HTTP problem: raise it anywhere in a request; the handler renders it."""

    def __init__(
        self,
        status: int,
        detail: str,
        *,
        error: str | None = None,
        headers: Mapping[str, str] | None = None,
        **extensions: Any,
    ) -> None:
        super().__init__(detail)
        self.status = status
        self.detail = detail
        self.error = error or TITLES.get(status, "Error").replace(" ", "")
        self.headers = dict(headers or {})
        self.extensions = extensions

    def response(self, instance: str | None = None) -> JSONResponse:
        body: dict[str, Any] = {
            "type": TYPE_PREFIX + self.error,
            "title": TITLES.get(self.status, "Error"),
            "status": self.status,
            "detail": self.detail,
            "error": self.error,
            **self.extensions,
        }
        if instance is not None:
            body["instance"] = instance
        return JSONResponse(body, self.status, headers=self.headers, media_type=MEDIA_TYPE)


def status_of(error: errors.JobLedgerError | PersistenceError) -> int:
    """The HTTP status of an engine error, by the CLI's exit-code classes."""
    if isinstance(
        error, errors.ConfigError | errors.StoreUnreachableError | errors.StoreCorruptError
    ):
        return 503
    if isinstance(error, errors.BrokenHistoryError):
        return 503
    if isinstance(error, errors.DuplicateKeyError):
        return 409  # a used key is an answer, not a race to run again
    if isinstance(error, errors.StoreUnavailableError | errors.ConcurrencyError):
        return 503
    if isinstance(error, PersistenceError):
        return 503
    for kind, status in _REFUSED:
        if isinstance(error, kind):
            return status
    return 400


def of_error(error: errors.JobLedgerError | PersistenceError) -> Problem:
    status = status_of(error)
    detail = redact(" ".join(str(error).split()))  # a driver's message may quote the URL
    if isinstance(error, PersistenceError):
        detail = f"store error: {detail}"
    temporary = isinstance(
        error, errors.StoreUnavailableError | errors.ConcurrencyError | PersistenceError
    ) and not isinstance(
        error,
        errors.DuplicateKeyError | errors.StoreUnreachableError | errors.StoreCorruptError,
    )
    headers = {"Retry-After": str(RETRY_AFTER_SECONDS)} if temporary else None
    extensions: dict[str, Any] = {}
    if isinstance(error, errors.JobArchivedError):
        extensions["tombstone"] = error.tombstone
    return Problem(status, detail, error=type(error).__name__, headers=headers, **extensions)


def install(app: FastAPI) -> None:
    """Render every error a request can raise as problem+json."""

    @app.exception_handler(Problem)
    async def _problem(request: Request, problem: Problem) -> JSONResponse:
        return problem.response(request.url.path)

    @app.exception_handler(errors.JobLedgerError)
    async def _engine(request: Request, error: errors.JobLedgerError) -> JSONResponse:
        return of_error(error).response(request.url.path)

    @app.exception_handler(PersistenceError)
    async def _store(request: Request, error: PersistenceError) -> JSONResponse:
        return of_error(error).response(request.url.path)

    async def _driver(request: Request, error: Exception) -> JSONResponse:
        # A driver's own error the library did not translate: the store failing.
        detail = f"store error: {str(error) or type(error).__name__}"
        return of_error(errors.StoreUnavailableError(detail)).response(request.url.path)

    for kind in store_error_types():
        if not issubclass(kind, PersistenceError):
            app.add_exception_handler(kind, _driver)

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, error: Exception) -> JSONResponse:
        """A bug: 500, its message kept out of the answer (it may quote data); the
        server logs it with its traceback."""
        problem = Problem(
            500, "an unexpected error; the server's log has it", error="InternalError"
        )
        return problem.response(request.url.path)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, error: RequestValidationError) -> JSONResponse:
        detail = "; ".join(_validation_problem(each) for each in error.errors())
        return Problem(400, detail, error="InvalidRequest").response(request.url.path)

    @app.exception_handler(HTTPException)
    async def _http(request: Request, error: HTTPException) -> JSONResponse:
        problem = Problem(error.status_code, str(error.detail), headers=error.headers)
        return problem.response(request.url.path)


def _validation_problem(detail: Any) -> str:
    where = ".".join(str(part) for part in detail.get("loc", ()) if part != "body")
    return f"{where}: {detail.get('msg', 'invalid')}" if where else str(detail.get("msg"))
