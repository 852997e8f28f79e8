"""Micro-benchmark of the chain's canonical encoding: json.dumps (the definition) against
orjson (what ``chain.canonical_bytes`` uses) and, when installed, msgspec, on the documents
a step actually hashes (a continuing step's StepRecorded, which carries the continuation
claim, and the Claimed that opens a tick, built by a real engine run), plus a Submitted
with a 2 KB input.

For each encoder: microseconds per document, whether its bytes are identical to the
definition's for every document, and the microseconds per step saved against json.dumps
(a continuing step hashes one document: its StepRecorded). Also times ``chain.link``
(encode + sha256) as the engine calls it, and a StepRecorded's whole trip to and from its
row: as stored before issue 16 (``chain.link`` plus eventsourcing's transcoder, two
encodes) and by the sealing pipeline (one encode, the row built around it), unsigned and
with an Ed25519 signature. msgspec is optional (``pip install msgspec``):
it writes UTC times as ``Z`` and has no datetime pass-through, so it cannot produce the
definition's bytes as is.

Usage::

    python scripts/bench_encode.py [--rounds 20000] [--json]
"""

from __future__ import annotations

import argparse
import base64
import json
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import orjson
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from eventsourcing.persistence import (
    DatetimeAsISO,
    DecimalAsStr,
    JSONTranscoder,
    Mapper,
    StoredEvent,
    UUIDAsHex,
)
from eventsourcing.utils import get_topic

from jobledger import Engine, EngineConfig, FunctionRegistry, JobStatus, Resolution, StepResult
from jobledger.adapters import sealing
from jobledger.adapters.mapper import SealedMapper
from jobledger.domain import chain, event_decoding
from jobledger.domain.identity import job_uuid
from jobledger.domain.job import Job
from jobledger.domain.steps import StepRequest
from jobledger.orchestration.registry import linear_workflow

Encoder = Callable[[dict[str, Any]], bytes]


class Executor:
    def execute(self, request: StepRequest) -> StepResult:
        return StepResult(output={"answer": "naïve ☃", "score": 0.87}, state_patch={"n": 1})


def sample_documents() -> tuple[dict[str, dict[str, Any]], Job, Job.Event]:
    """The canonical documents of one real job's Submitted, Claimed and (first, continuing)
    StepRecorded; the job, and its StepRecorded."""
    registry = FunctionRegistry()
    work = Resolution("run_interaction_task", JobStatus.QUEUED)
    last = Resolution("run_interaction_task", JobStatus.COMPLETED)
    registry.register("enc", 1, linear_workflow([work, work, last]))
    with tempfile.TemporaryDirectory() as directory:
        url = f"sqlite:///{Path(directory) / 'enc.db'}"
        engine = Engine.open(url, registry=registry, executor=Executor(), config=EngineConfig())
        try:
            engine.submit("t", "j", "enc", input={"brief": "x" * 2000, "tags": ["a", "b"]})
            engine.run_until_idle()
            events = engine.deps.store.events(job_uuid("t", "j"))
            job = engine.deps.store.load(job_uuid("t", "j"))
            assert job is not None
        finally:
            engine.close()
    documents: dict[str, dict[str, Any]] = {}
    for event in events:
        name = type(event).__name__
        fields = chain.event_fields(event)
        body = {k: v for k, v in fields.items() if k != chain.CHAIN_FIELD}
        documents.setdefault(name, {"type": type(event).__qualname__, "fields": body})
    step = next(e for e in events if isinstance(e, Job.StepRecorded))
    return documents, job, step


class Signer:
    def __init__(self) -> None:
        self.key = Ed25519PrivateKey.generate()

    def sign(self, chain_hash: str, at: object) -> tuple[str, str]:
        signed = self.key.sign(b"jobledger.event/1\nk1\n" + chain_hash.encode())
        return "k1", base64.urlsafe_b64encode(signed).rstrip(b"=").decode()


def row_trip_us(job: Job, stored: Job.Event, rounds: int) -> dict[str, float]:
    """Per StepRecorded: writing its row (hash included) and reading it back, before and
    after the sealing pipeline."""
    transcoder = JSONTranscoder()
    for transcoding in (UUIDAsHex(), DecimalAsStr(), DatetimeAsISO()):
        transcoder.register(transcoding)
    plain = {k: v for k, v in vars(stored).items() if k != chain.SEALED_ATTRIBUTE}
    event = event_decoding.make(type(stored), plain)
    event_type, previous = type(event).__qualname__, "0" * 64
    old_mapper, new_mapper = Mapper(transcoder), SealedMapper(transcoder)

    def write_before() -> bytes:
        chain.link(previous, event_type, chain.event_fields(event))
        return old_mapper.to_stored_event(event).state

    unsigned, signed = sealing.SealingPipeline(), sealing.SealingPipeline(signer=Signer())
    old_row = write_before()
    new_row = sealing.row_bytes(unsigned.seal(job, event, previous))

    def read(mapper: Mapper[Any], state: bytes) -> Callable[[], object]:
        topic = get_topic(Job.StepRecorded)
        row = StoredEvent(event.originator_id, event.originator_version, topic, state)
        return lambda: mapper.to_domain_event(row)

    return {
        "write before (link + transcoder)": per_call_us(write_before, rounds),
        "write sealed, unsigned": per_call_us(
            lambda: sealing.row_bytes(unsigned.seal(job, event, previous)), rounds
        ),
        "write sealed, signed": per_call_us(
            lambda: sealing.row_bytes(signed.seal(job, event, previous)), rounds
        ),
        "read before (transcoder)": per_call_us(read(old_mapper, old_row), rounds),
        "read sealed (typed decoder)": per_call_us(read(new_mapper, new_row), rounds),
    }


def encoders() -> dict[str, Encoder]:
    found: dict[str, Encoder] = {
        "json.dumps (definition)": lambda d: chain._stdlib_canonical(d).encode(),
        "orjson (chain.canonical_bytes)": lambda d: chain._fast_canonical(d) or b"",
        "orjson raw dumps": lambda d: orjson.dumps(
            d, default=chain._default, option=chain._ORJSON_OPTIONS
        ),
    }
    try:
        import msgspec
    except ImportError:
        return found
    encoder = msgspec.json.Encoder(enc_hook=chain._default, order="sorted")
    found["msgspec (Z times)"] = encoder.encode
    return found


def per_call_us(function: Callable[[], object], rounds: int) -> float:
    best = float("inf")
    for _ in range(3):  # best of three: the least disturbed by the rest of the machine
        started = time.perf_counter()
        for _ in range(rounds):
            function()
        best = min(best, time.perf_counter() - started)
    return 1e6 * best / rounds


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=20000)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    documents, job, stored = sample_documents()
    definition = {name: chain._stdlib_canonical(doc).encode() for name, doc in documents.items()}
    rows = []
    for label, encode in encoders().items():
        times = {
            name: per_call_us(lambda doc=doc, encode=encode: encode(doc), args.rounds)  # type: ignore[misc]
            for name, doc in documents.items()
        }
        identical = all(encode(doc) == definition[name] for name, doc in documents.items())
        step_us = times["StepRecorded"]
        rows.append({"encoder": label, "us": times, "identical": identical, "step_us": step_us})
    baseline = rows[0]["step_us"]
    for row in rows:
        row["saved_us_per_step"] = baseline - row["step_us"]
    step = documents["StepRecorded"]
    link_us = per_call_us(lambda: chain.link("0" * 64, step["type"], step["fields"]), args.rounds)
    trip = row_trip_us(job, stored, args.rounds)
    if args.json:
        document = {"encoders": rows, "chain_link_step_us": link_us, "row_us": trip}
        print(json.dumps(document, indent=2))
        return 0
    names = list(documents)
    print(f"{'encoder':<32}" + "".join(f"{n:>14}" for n in names) + "   identical  saved/step")
    for row in rows:
        cells = "".join(f"{row['us'][n]:>12.2f}us" for n in names)
        print(
            f"{row['encoder']:<32}{cells}   {'yes' if row['identical'] else 'NO':>9}"
            f"{row['saved_us_per_step']:>10.2f}us"
        )
    print(f"chain.link of a StepRecorded (encode + sha256): {link_us:.2f} us")
    for label, us in trip.items():
        print(f"StepRecorded row, {label}: {us:.2f} us")
    return 0


if __name__ == "__main__":
    sys.exit(main())
