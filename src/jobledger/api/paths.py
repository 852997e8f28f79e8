"""Ids in URL paths. Tenant, job and approval ids may hold ``/`` (and ``%``), which a
client writes ``%2F`` (``%25``) inside its path segment, as ``urllib.parse.quote(id,
safe="")`` does. Starlette routes on the percent-decoded path, where that slash would
split the segment: so the app routes on a path where only ``%2F`` and ``%25`` stay
encoded, and each id parameter (``{job:id}``) is decoded exactly once by its convertor."""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import quote, unquote, unquote_to_bytes

from starlette.convertors import Convertor, register_url_convertor

from jobledger.api.problems import Problem

_KEPT = re.compile(rb"(%2[fF]|%25)")
_STRAY_PERCENT = re.compile(rb"%(?![0-9A-Fa-f]{2})")


class PathError(ValueError):
    """A path that is not one (RFC 3986 2.1): refused with a 400 saying why."""


class IdConvertor(Convertor[str]):
    regex = "[^/]+"

    def convert(self, value: str) -> str:
        return unquote(value)

    def to_string(self, value: str) -> str:
        return quote(value, safe="")


register_url_convertor("id", IdConvertor())

JOBS = "/jobs/{tenant:id}"
JOB = JOBS + "/{job:id}"
TENANT = "/tenants/{tenant:id}"
SCHEDULES = TENANT + "/schedules"
SCHEDULE = SCHEDULES + "/{name:id}"
BATCHES = TENANT + "/batches"
BATCH = BATCHES + "/{batch:id}"
"""The route templates: importing them registers the ``id`` convertor they use."""


def route_path(raw_path: bytes) -> str:
    """``raw_path`` with every escape decoded but ``%2F`` and ``%25``: each ``%`` left in
    the result starts one of those two, so decoding a segment again is exact. A ``%``
    that starts no escape would break that (``%%32%46`` would decode to ``%2F``, then
    to ``/``), and bytes that are not UTF-8 name no id: both are a PathError."""
    if (stray := _STRAY_PERCENT.search(raw_path)) is not None:
        raise PathError(
            f"the path has a '%' that starts no %XX escape (at byte {stray.start()}); "
            "a '%' in an id is written %25"
        )
    pieces = _KEPT.split(raw_path)
    decoded = b"".join(
        piece.upper() if n % 2 else unquote_to_bytes(piece) for n, piece in enumerate(pieces)
    )
    try:
        return decoded.decode("utf-8")
    except UnicodeDecodeError:
        raise PathError("the path is not UTF-8 once its %XX escapes are decoded") from None


def id_path(*ids: str) -> str:
    """The path segments that name ``ids``, each encoded whole."""
    return "/".join(quote(value, safe="") for value in ids)


class EncodedSlashes:
    """ASGI middleware: route on :func:`route_path` of the bytes the client sent."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        raw = scope.get("raw_path")
        if scope["type"] == "http" and raw:
            try:
                scope = {**scope, "path": route_path(raw)}
            except PathError as error:
                refused = Problem(400, str(error), error="InvalidRequest").response()
                await refused(scope, receive, send)
                return
        await self.app(scope, receive, send)
