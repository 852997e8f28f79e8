"""The demo's agent: real, deterministic work on the bundled field notes, with a price per
call, and side effects an outside system keeps once per idempotency key."""

from __future__ import annotations

import json
import os
import re
from collections import Counter
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any
from urllib.parse import quote

from jobledger.domain.steps import StepRequest, StepResult

_WORD = re.compile(r"[a-z]+(?:'[a-z]+)?")
_COMMON = (
    "a an and are as at back be because by each every first for from had has in is it its "
    "last least most next of on or so that the then there they thin to was we were what with"
)
_STOPWORDS = frozenset(_COMMON.split())


class SimulatedCrash(BaseException):
    """The worker process dying mid-step. A BaseException, as SystemExit is: the engine
    catches step failures (Exception), never this, so nothing about the step is recorded."""


def words(text: str) -> list[str]:
    return _WORD.findall(text.lower())


class EffectsLedger:
    """The outside world the agent writes to. Every execution is logged (so re-runs can be
    counted), and each result lands in an outbox keyed by the step's idempotency key, so
    a re-delivered step overwrites its own entry instead of adding a second one."""

    def __init__(self, directory: Path) -> None:
        self.log = directory / "side_effects.log"
        self.outbox = directory / "outbox"
        self.outbox.mkdir(parents=True, exist_ok=True)

    def apply(self, key: str, task: str, result: Mapping[str, Any]) -> None:
        with self.log.open("a", encoding="utf-8") as log:
            log.write(f"{key}\t{task}\n")
            log.flush()
            os.fsync(log.fileno())
        # A key holds '/' (after the tenant) and ':': quoted, it is one portable file name.
        entry = self.outbox / f"{quote(key, safe='')}.json"
        entry.write_text(json.dumps({"key": key, "task": task, "result": result}, indent=2))

    def executions(self) -> Counter[tuple[str, str]]:
        """(idempotency key, task) -> how many times the side effect ran."""
        if not self.log.exists():
            return Counter()
        lines = self.log.read_text(encoding="utf-8").splitlines()
        return Counter(tuple(line.split("\t", 1)) for line in lines)  # type: ignore[misc]

    def outbox_entries(self) -> list[str]:
        return sorted(json.loads(p.read_text())["key"] for p in self.outbox.glob("*.json"))


Task = Callable[[Mapping[str, Any], str], tuple[dict[str, Any], dict[str, Any]]]
"""(job state, text) -> (step output, state patch)."""


def count_words(state: Mapping[str, Any], text: str) -> tuple[dict[str, Any], dict[str, Any]]:
    found = words(text)
    survey = {
        "words": len(found),
        "distinct_words": len(set(found)),
        "sentences": len(re.findall(r"[.!?](?:\s|$)", text)),
    }
    return survey, {"survey": survey}


def summarise(state: Mapping[str, Any], text: str) -> tuple[dict[str, Any], dict[str, Any]]:
    found = words(text)
    counts = Counter(word for word in found if word not in _STOPWORDS)
    top = [[word, n] for word, n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[:5]]
    summary = {"top_words": top, "longest_word": max(found, key=lambda w: (len(w), w))}
    return summary, {"summary": summary}


def draft_brief(state: Mapping[str, Any], text: str) -> tuple[dict[str, Any], dict[str, Any]]:
    survey, summary = state["survey"], state["summary"]
    check = state.get("fact_check")
    top = ", ".join(word for word, _ in summary["top_words"][:3])
    checked = "To be fact-checked before it is published."  # a person checks it next
    if check is not None:
        verdict = "confirmed" if check.get("confirmed") else "not confirmed"
        checked = f"Fact-checked by {check.get('checked_by', 'nobody')}: {verdict}."
    brief = (
        f"Field notes: {survey['words']} words in {survey['sentences']} sentences, "
        f"{survey['distinct_words']} distinct. Most frequent: {top}. {checked}"
    )
    return {"chars": len(brief)}, {"brief": brief}


def paragraphs(text: str) -> list[str]:
    return [part for part in text.split("\n\n") if part.strip()]


def count_paragraph(state: Mapping[str, Any], text: str) -> tuple[dict[str, Any], dict[str, Any]]:
    index = int(state["paragraph"])
    counted = {"paragraph": index, "words": len(words(paragraphs(text)[index]))}
    return counted, {"words": counted["words"]}


def publish(state: Mapping[str, Any], text: str) -> tuple[dict[str, Any], dict[str, Any]]:
    return {"published_chars": len(state["brief"])}, {"published": True}


TASKS: dict[str, Task] = {
    "count_words": count_words,
    "summarise": summarise,
    "draft_brief": draft_brief,
    "publish": publish,
    "count_paragraph": count_paragraph,
}


class DemoAgent:
    """A StepExecutor. ``crash_after`` names a task whose first execution does its work
    and its side effect, then dies (SimulatedCrash) before the engine can record it."""

    def __init__(self, text: str, ledger: EffectsLedger, *, crash_after: str | None = None):
        self.text = text
        self.ledger = ledger
        self.crash_after = crash_after

    def execute(self, request: StepRequest) -> StepResult:
        params = request.resolution.params
        task = str(params["task"])
        output, patch = self.perform(request.idempotency_key, task, request.job.state)
        return StepResult(output=output, state_patch=patch, cost_usd=str(params["price_usd"]))

    def perform(
        self, key: str, task: str, state: Mapping[str, Any]
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        """Do ``task``'s work and its side effect under ``key`` (the declarative mission's
        executor and the code mission's step functions alike): (output, state patch)."""
        output, patch = TASKS[task](state, self.text)
        self.ledger.apply(key, task, output)
        if task == self.crash_after:
            self.crash_after = None
            raise SimulatedCrash(f"worker died inside {key} after its work")
        return output, patch
