"""The Kafka dead-letter topics over HTTP: list, show, redrive (admin of every tenant).

A letter may be about any tenant's job, or about none (a value that is not JSON), so only
an admin whose tenants are ``*`` reads or redrives them. Who redrives is the caller."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated

from fastapi import APIRouter, Query

from jobledger.adapters.kafka.dead_letters import DeadLetters, LetterFilter, Selection
from jobledger.adapters.kafka.settings import KafkaSettings
from jobledger.api.auth import EVERY_TENANT, Principal, Role
from jobledger.api.dead_letter_models import (
    DeadLetterList,
    DeadLetterModel,
    RedriveRequest,
    RedriveResult,
)
from jobledger.api.deps import Caller, EngineDep
from jobledger.api.problems import EVERY_REQUEST, Problem, documented
from jobledger.engine.engine import Engine

router = APIRouter(tags=["dead letters"], responses=EVERY_REQUEST)


@router.get("/dead-letters", response_model=DeadLetterList, responses=documented(403))
def list_dead_letters(
    caller: Caller,
    engine: EngineDep,
    reason: Annotated[str | None, Query(description="Only this reason.")] = None,
    since: Annotated[datetime | None, Query(description="Dead-lettered at or after.")] = None,
    until: Annotated[datetime | None, Query(description="Dead-lettered before.")] = None,
    key: Annotated[str | None, Query(description="This key (tenant/job); a* a prefix.")] = None,
    topic: Annotated[str | None, Query(description="ticks, signals or the topic.")] = None,
    subscription: Annotated[str | None, Query(description="That subscription's.")] = None,
) -> DeadLetterList:
    """The dead letters, ticks, signals, then each subscription's, with the filters of
    ``dead-letters list``; 404 ``UnknownSubscriptionError`` for a subscription not
    configured."""
    _admin(caller)
    letter_filter = LetterFilter(reason, since, until, key, topic, subscription)
    found = _letters(engine).read(letter_filter)
    return DeadLetterList(letters=[DeadLetterModel.of(letter) for letter in found])


@router.get(
    "/dead-letters/{letter_id}", response_model=DeadLetterModel, responses=documented(403, 404)
)
def show_dead_letter(letter_id: str, caller: Caller, engine: EngineDep) -> DeadLetterModel:
    """One dead letter (``ticks:P:O``, ``signals:P:O`` or ``sub:NAME:P:O``); 404
    ``UnknownDeadLetterError`` (``UnknownSubscriptionError`` for a subscription not
    configured)."""
    _admin(caller)
    return DeadLetterModel.of(_letters(engine).get(letter_id))


@router.post("/dead-letters/redrive", response_model=RedriveResult, responses=documented(403, 404))
def redrive(body: RedriveRequest, caller: Caller, engine: EngineDep) -> RedriveResult:
    """Send letters back to their source topic, each once unless ``force`` (as
    ``dead-letters redrive``), recorded with the caller. 400: no id, filter or ``all``, a
    bad id or topic; 404: an id with no letter, a subscription not configured; nothing is
    sent either way."""
    _admin(caller)
    letter_filter = LetterFilter(
        body.reason, body.since, body.until, body.key, body.topic, body.subscription
    )
    report = _letters(engine).redrive(
        Selection(tuple(body.ids), letter_filter, body.all),
        by=caller.subject,
        dry_run=body.dry_run,
        force=body.force,
    )
    return RedriveResult.of(report)


def _admin(caller: Principal) -> None:
    if not caller.may(Role.ADMIN, EVERY_TENANT):
        raise Problem(
            403,
            f"{caller.subject!r} is not an admin of every tenant ({EVERY_TENANT}): "
            "dead letters span them all",
            error="Forbidden",
        )


def _letters(engine: Engine) -> DeadLetters:
    return DeadLetters(KafkaSettings.of(engine.deps.config))
