"""The standalone verifier (jobledger.audit.verifier) and a second implementation written from
docs/evidence-format.md alone (tests/independent_verifier.py) agree on a corpus of good
and tampered exports: the same exit code, the same failing job and version, the same
kinds of problem; and each case comes out as the tampering it is says it should.

The corpus is real: jobs run by the engine on SQLite and on PostgreSQL, anchored twice
with ``jobledger anchor`` and exported with ``jobledger export``, then tampered by
tests/support/evidence.py as someone holding the file but no signing key would."""

from __future__ import annotations

import ast
import base64
import hashlib
import json
import random
import re
import shutil
import subprocess
import sys
import tomllib
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from jobledger import Engine
from jobledger.adapters.clock import FakeClock
from jobledger.audit import verifier
from jobledger.domain.identity import job_uuid
from jobledger.workflows import DefinitionRegistry
from jobledger.workflows.loader import parse_definition
from tests import independent_verifier
from tests.support import ROOT, pythonpath
from tests.support.cli import run_jobledger
from tests.support.engines import EngineFactory
from tests.support.evidence import (
    Lines,
    SigningKey,
    TimeStampAuthority,
    delete_line,
    edit_anchor_head,
    edit_data,
    edit_manifest,
    events_of,
    fix_manifest,
    leaked_keys,
    new_key,
    redate,
    rewrite_tail,
    roll_back,
    swap_lines,
    with_token,
)

VERIFIER = ROOT / "src" / "jobledger" / "audit" / "verifier.py"
INDEPENDENT = ROOT / "tests" / "independent_verifier.py"
DOC = ROOT / "docs" / "evidence-format.md"
A, B, C = job_uuid("acme", "a"), job_uuid("acme", "b"), job_uuid("beta", "c")
OLD = job_uuid("acme", "old")


@dataclass
class Case:
    name: str
    export: Lines
    exit: int = 0
    failing: dict[str, int] = field(default_factory=dict)
    problems: set[str] = field(default_factory=set)
    keyring: bool = True
    anchors: Lines | None = None
    """The anchor file's lines (None: the corpus's own; []: no --anchors)."""
    accept_old: bool = True
    """--unsigned-before the time the store began signing (its first job predates it)."""


@dataclass(frozen=True)
class Outcome:
    exit: int
    failing: dict[str, int]
    problems: frozenset[str]


@dataclass
class Corpus:
    tmp: Path
    export: Lines
    tenant_export: Lines
    anchors: Lines
    keys: list[SigningKey]
    """The writers' private keys, as someone who stole the key files holds them."""
    keyring: Path
    signing_from: str
    events: dict[str, int]
    """Events per job uuid."""

    def write(self, name: str, lines: Lines) -> Path:
        path = self.tmp / name
        path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
        return path


# ---- building the corpus ------------------------------------------------------------------------


def run_jobs(engine: Engine, jobs: list[tuple[str, str]]) -> None:
    for tenant, job in jobs:
        engine.submit(
            tenant,
            job,
            "agent3",
            input={"amount": 0.1, "tiny": 1e-07, "name": 'Zoë "q"\n\u2028'},
        )
    engine.run_until_idle()


SIGNUP = """
type: signup
version: 1
personal_data: [customer.email]
start: done
steps:
  done: {kind: complete}
"""


def cli_lines(*args: str) -> Lines:
    result = run_jobledger(*args)
    assert result.returncode == 0, result.stderr
    # Split at "\n" only: U+2028 in a string is a line break to str.splitlines.
    return result.stdout.rstrip("\n").split("\n")


@pytest.fixture
def corpus(make_engine: EngineFactory, store_url: str, clock: FakeClock, tmp_path: Path) -> Corpus:
    """acme/old written before the store signed; then, signed by two keys in rotation
    (k-1 retires a day in, k-2 takes over), acme/a and beta/c, acme/ada whose email is
    personal data, an anchor, ada erased, acme/b two days later, another anchor; then
    every job exported, and acme's."""
    start = clock.now()
    run_jobs(make_engine(), [("acme", "old")])
    clock.advance(timedelta(hours=1))
    keys = tmp_path / "keys"
    for key_id, window in (
        (
            "k-1",
            ["--not-before", start - timedelta(days=30), "--not-after", start + timedelta(days=1)],
        ),
        ("k-2", ["--not-before", start + timedelta(days=1)]),
    ):
        moments = [w.isoformat() if isinstance(w, datetime) else w for w in window]
        cli_lines("keys", "generate", key_id, "--dir", str(keys), *moments)
    signing = {"signing_keys": keys / "signing-keys.json"}
    signed = make_engine(config=signing)
    anchors = tmp_path / "anchors.jsonl"
    run_jobs(signed, [("acme", "a"), ("beta", "c")])
    signups = make_engine(
        registry=DefinitionRegistry([parse_definition(SIGNUP, "signup.yaml")]),
        config=signing,
    )
    customer = {"customer": {"email": "ada@example.com", "plan": "gold"}}
    signups.submit("acme", "ada", "signup", input=customer, data_subject="ada")
    signups.run_until_idle()
    cli_lines("anchor", "--store", store_url, "--file", str(anchors))
    signups.erase("acme", "ada", by="dpo", reason="erasure request")
    clock.advance(timedelta(days=2))
    run_jobs(signed, [("acme", "b")])
    cli_lines("anchor", "--store", store_url, "--file", str(anchors))
    export = cli_lines("export", "--all", "--store", store_url)
    text = "\n".join(export)
    assert '"$sealed":"aes-256-gcm/1"' in text and '"type":"Erased"' in text
    assert "ada@example.com" not in text
    events: dict[str, int] = {}
    for line in export[:-1]:
        uuid = json.loads(line)["job_uuid"]
        events[uuid] = events.get(uuid, 0) + 1
    return Corpus(
        tmp=tmp_path,
        export=export,
        tenant_export=cli_lines("export", "--tenant", "acme", "--store", store_url),
        anchors=anchors.read_text(encoding="utf-8").rstrip("\n").split("\n"),
        keys=leaked_keys(keys / "signing-keys.json"),
        keyring=keys / "keyring.json",
        signing_from=(start + timedelta(minutes=30)).isoformat(),
        events=events,
    )


def cases(corpus: Corpus) -> list[Case]:
    good, keys = corpus.export, corpus.keys
    a_last = corpus.events[str(A)]
    mallory = new_key("k-evil", keys[0].not_before, None)
    impostor = SigningKey("k-1", mallory.private, keys[0].not_before, None)
    late = keys[1].not_before + timedelta(hours=1)
    noncanonical = list(good)
    a_v2 = events_of(good, str(A))[1]
    noncanonical[a_v2] = noncanonical[a_v2].replace('"record":', ' "record":', 1)
    return [
        Case("good: signed, keyring, anchors", good),
        Case("good: no keyring, no anchors", good, keyring=False, anchors=[]),
        Case("good: one tenant's export, every tenant's anchors", corpus.tenant_export),
        Case(
            "events from before signing, no --unsigned-before",
            good,
            1,
            {str(OLD): 1},
            accept_old=False,
        ),
        Case("a data field edited", edit_data(good, str(A), 3), 1, {str(A): 3}),
        Case("a line not canonical", noncanonical, 1, {str(A): 2}),
        Case("a line deleted", delete_line(good, str(A), 3), 1, {str(A): 3}, {"manifest"}),
        Case("two lines swapped", swap_lines(good, str(A), 3), 1, {str(A): 3}),
        Case(
            "tail re-hashed, unsigned",
            rewrite_tail(good, str(A), 3, None),
            1,
            {str(A): 3},
            anchors=[],
        ),
        Case(
            "tail re-hashed, old signatures",
            rewrite_tail(good, str(A), 3, None, True),
            1,
            {str(A): 3},
            anchors=[],
        ),
        Case(
            "tail re-hashed, no keyring: the chain alone cannot tell",
            rewrite_tail(good, str(A), 3, None),
            keyring=False,
            anchors=[],
        ),
        Case(
            "tail signed by a key not in the keyring",
            rewrite_tail(good, str(A), 3, mallory),
            1,
            {str(A): 3},
            anchors=[],
        ),
        Case(
            "tail signed by another key under a known id",
            rewrite_tail(good, str(A), 3, impostor),
            1,
            {str(A): 3},
            anchors=[],
        ),
        Case(
            "an event dated outside its key's window",
            redate(good, str(A), 3, late, keys[0]),
            1,
            {str(A): 3},
            anchors=[],
        ),
        Case(
            "manifest counts off",
            edit_manifest(good, lambda m: m.update(events=m["events"] + 1)),
            1,
            problems={"manifest"},
        ),
        Case(
            "a manifest head changed",
            edit_manifest(good, lambda m: m["heads"][str(B)].update(chain_hash="0" * 64)),
            1,
            problems={"manifest"},
        ),
        Case("the manifest missing", good[:-1], 1, problems={"manifest"}),
        Case(
            "rolled back, no anchors: only an anchor can tell",
            roll_back(good, str(A), a_last - 2),
            anchors=[],
        ),
        Case(  # at the first version it lacks, as a deleted line would
            "an anchored head rolled back",
            roll_back(good, str(A), a_last - 2),
            1,
            {str(A): a_last - 1},
        ),
        Case(
            "an anchored job deleted whole",
            fix_manifest([line for line in good if str(C) not in line or "manifest" in line]),
            1,
            {str(C): 1},
        ),
        Case(
            "an anchor line edited",
            good,
            1,
            {str(A): a_last},
            {"anchors"},
            anchors=edit_anchor_head(corpus.anchors, 1, str(A)),
        ),
    ]


def token_cases(corpus: Corpus) -> list[Case]:
    tsa = TimeStampAuthority(corpus.tmp / "tsa")
    first, last = (json.loads(line)["merkle_root"] for line in corpus.anchors)
    return [
        Case(
            "an anchor stamped by a TSA",
            corpus.export,
            anchors=with_token(corpus.anchors, tsa.stamp(last)),
        ),
        Case(
            "a TSA token over another root",
            corpus.export,
            1,
            problems={"anchors"},
            anchors=with_token(corpus.anchors, tsa.stamp(first)),
        ),
    ]


# ---- running both verifiers ------------------------------------------------------------------


def arguments(corpus: Corpus, case: Case, export: Path) -> list[str]:
    args = [str(export)]
    if case.keyring:
        args += ["--keyring", str(corpus.keyring)]
    anchors = corpus.anchors if case.anchors is None else case.anchors
    if anchors:
        args += ["--anchors", str(corpus.write("case-anchors.jsonl", anchors))]
    if case.keyring and case.accept_old:
        args += ["--unsigned-before", corpus.signing_from]
    return args


def run(*command: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, *command],
        capture_output=True,
        text=True,
        timeout=60,
        env={"PYTHONPATH": pythonpath(ROOT / "src")},
    )


def by_verifier(args: list[str]) -> Outcome:
    result = run(str(VERIFIER), *args, "--json")
    if result.returncode == 2:
        return Outcome(2, {}, frozenset())
    report = json.loads(result.stdout)
    failing = {job["job_uuid"]: job["version"] for job in report["jobs"] if not job["verified"]}
    problems = frozenset(problem["where"] for problem in report["problems"])
    return Outcome(result.returncode, failing, problems)


def by_independent(args: list[str]) -> Outcome:
    result = run(str(INDEPENDENT), *args)
    failing: dict[str, int] = {}
    problems: set[str] = set()
    for line in result.stdout.splitlines():
        kind, *rest = line.split()
        if kind == "JOB" and rest[1] != "OK":
            failing[rest[0]] = int(rest[1])
        elif kind == "PROBLEM":
            problems.add(rest[0])
    return Outcome(result.returncode, failing, frozenset(problems))


def check(corpus: Corpus, case: Case) -> list[str]:
    args = arguments(corpus, case, corpus.write("case.jsonl", case.export))
    ours, theirs = by_verifier(args), by_independent(args)
    expected = Outcome(case.exit, case.failing, frozenset(case.problems))
    wrong = []
    if ours != theirs:
        wrong.append(f"{case.name}: the verifiers disagree: {ours} against {theirs}")
    if ours != expected:
        wrong.append(f"{case.name}: expected {expected}, got {ours}")
    return wrong


def test_both_verifiers_agree_on_good_and_tampered_exports(corpus: Corpus) -> None:
    all_cases = cases(corpus)
    if shutil.which("openssl"):
        all_cases += token_cases(corpus)
    wrong = [problem for case in all_cases for problem in check(corpus, case)]
    wrong += random_disagreements(corpus, random.Random(16), 300)
    assert not wrong, "\n".join(wrong)
    report_wording(corpus)


def mutate(lines: Lines, rng: random.Random) -> Lines:
    """One blind edit: a character replaced, a line dropped, doubled or moved."""
    out = list(lines)
    index = rng.randrange(len(out))
    kind = rng.choice(["character", "drop", "double", "move"])
    if kind == "character":
        line = out[index]
        at = rng.randrange(len(line))
        out[index] = line[:at] + rng.choice('0123456789abcdef",:{}[] eE.-x\u00e9') + line[at + 1 :]
    elif kind == "drop":
        del out[index]
    elif kind == "double":
        out.insert(index, out[index])
    else:
        out.insert(rng.randrange(len(out)), out.pop(index))
    return out


def random_disagreements(corpus: Corpus, rng: random.Random, rounds: int) -> list[str]:
    """Blind edits of the export and of the anchor file, each checked by both verifiers
    in this process (as a subprocess each, 300 rounds would take minutes)."""
    keyring = verifier.read_keyring(corpus.keyring)
    before = verifier.parse_time(corpus.signing_from)
    wrong = []
    for round_ in range(rounds):
        export, anchors = corpus.export, corpus.anchors
        if round_ % 4 == 3:
            anchors = mutate(anchors, rng)
        else:
            export = mutate(export, rng)
        export_file = corpus.write("random.jsonl", export)
        anchor_file = corpus.write("random-anchors.jsonl", anchors)
        report = verifier.verify(export_file, keyring, [anchor_file], before)
        ours = Outcome(
            0 if report.verified else 1,
            {uuid: job.failure.version for uuid, job in report.jobs.items() if job.failure},
            frozenset(problem.where for problem in report.problems),
        )
        args = [str(export_file), "--keyring", str(corpus.keyring)]
        args += ["--anchors", str(anchor_file), "--unsigned-before", corpus.signing_from]
        failing, problems = independent_verifier.run(independent_verifier.arguments(args))
        theirs = Outcome(
            1 if problems or any(v is not None for v in failing.values()) else 0,
            {uuid: v for uuid, v in failing.items() if v is not None},
            frozenset(problems),
        )
        if ours != theirs:
            wrong.append(f"random edit {round_}: {ours} against {theirs}")
    return wrong


def test_unreadable_input_exits_2_in_both(tmp_path: Path) -> None:
    export, keyring = example_files(tmp_path)
    not_a_keyring = tmp_path / "not-a-keyring.json"
    not_a_keyring.write_text('{"format": "jobledger.keyring/1", "keys": [{"id": "k"}]}')
    latin1 = tmp_path / "latin1.jsonl"
    latin1.write_bytes(b'{"record":"manifest","x":"\xe9"}\n')
    for args in (
        [str(tmp_path / "missing.jsonl")],
        [str(latin1)],
        [str(export), "--keyring", str(not_a_keyring)],
        [str(export), "--keyring", str(keyring), "--unsigned-before", "yesterday"],
        [str(export), "--anchors", str(tmp_path / "missing-anchors.jsonl")],
    ):
        assert by_verifier(args).exit == 2, args
        assert by_independent(args).exit == 2, args


def report_wording(corpus: Corpus) -> None:
    """The text report (``python -m jobledger.audit.verifier``) names the job, the version and
    why, and says when signatures were not checked."""
    export = corpus.write("rewritten.jsonl", rewrite_tail(corpus.export, str(A), 3, None))
    result = run("-m", "jobledger.audit.verifier", str(export), "--keyring", str(corpus.keyring))
    assert result.returncode == 1
    assert f"FAIL  acme/a ({A}): v3: not signed" in result.stdout
    assert "NOT VERIFIED" in result.stdout
    bare = run("-m", "jobledger.audit.verifier", str(export))
    assert bare.returncode == 0 and "signatures: NOT checked (no --keyring)" in bare.stdout


# ---- the verifier stands alone ----------------------------------------------------------------


def imported_modules(path: Path) -> set[str]:
    modules: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            modules.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            modules.add(node.module.split(".")[0])
    return modules


@pytest.mark.parametrize("path", [VERIFIER, INDEPENDENT], ids=["verifier", "independent"])
def test_imports_only_the_standard_library_and_cryptography(path: Path) -> None:
    outside = imported_modules(path) - sys.stdlib_module_names - {"__future__", "cryptography"}
    assert outside == set()


def test_the_verifier_runs_as_one_copied_file(tmp_path: Path) -> None:
    """Copied alone into an empty directory, with any import of jobledger refused."""
    shutil.copy(VERIFIER, tmp_path / "verifier.py")
    export = tmp_path / "export.jsonl"
    clock = FakeClock(datetime(2026, 1, 1, tzinfo=UTC))
    manifest = {
        "record": "manifest",
        "format": "jobledger.export/2",
        "exported_at": clock.now().isoformat(),
        "selection": {"all": True},
        "jobs": 0,
        "events": 0,
        "heads": {},
        "broken": [],
    }
    export.write_text(json.dumps(manifest, sort_keys=True, separators=(",", ":")) + "\n")
    refuse = (
        "import sys, runpy; sys.modules['jobledger'] = None; sys.argv = ['verifier.py', "
        f"{str(export)!r}]; runpy.run_path('verifier.py', run_name='__main__')"
    )
    result = subprocess.run(
        [sys.executable, "-I", "-c", refuse],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert "VERIFIED" in result.stdout


def test_the_console_script_is_declared() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert project["project"]["scripts"]["jobledger-verify"] == "jobledger.audit.verifier:main"


# ---- the document's worked example ----------------------------------------------------------


def sha256(data: bytes) -> bytes:
    return hashlib.sha256(data).digest()


def worked_example() -> tuple[str, list[str]]:
    """Section 8 of the document, and its code blocks: the keyring entry, the event line,
    the manifest line, the canonical bytes."""
    example = DOC.read_text(encoding="utf-8").split("## 8. Worked example")[1]
    return example, re.findall(r"```(?:json)?\n(.*?)\n```", example, re.DOTALL)


def example_files(tmp_path: Path) -> tuple[Path, Path]:
    """The example's export and keyring, as files."""
    _, (key_entry, line, manifest, _) = worked_example()
    keyring = tmp_path / "example-keyring.json"
    document = {"format": "jobledger.keyring/1", "keys": [json.loads(key_entry)]}
    keyring.write_text(json.dumps(document), encoding="utf-8")
    export = tmp_path / "example.jsonl"
    export.write_text(f"{line}\n{manifest}\n", encoding="utf-8")
    return export, keyring


def test_the_documents_worked_example_is_true(tmp_path: Path) -> None:
    """Every value of docs/evidence-format.md's example, recomputed from the page's text,
    and its export verifying in both verifiers against its keyring."""
    example, (key_entry, line, _, body) = worked_example()
    event = json.loads(line)
    fields = {
        "originator_id": event["job_uuid"],
        "originator_version": event["version"],
        "timestamp": event["timestamp"],
        **event["data"],
    }
    canonical = json.dumps(
        {"fields": fields, "type": "Job." + event["type"]},
        sort_keys=True,
        separators=(",", ":"),
        ensure_ascii=False,
    )
    assert canonical == body
    assert sha256(body.encode()).hex() == event["chain_hash"]

    private = Ed25519PrivateKey.from_private_bytes(bytes(range(32)))
    raw = private.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
    assert (
        base64.urlsafe_b64encode(raw).rstrip(b"=").decode() == json.loads(key_entry)["public_key"]
    )
    message = (
        b"jobledger.event/1\n" + event["signer"].encode() + b"\n" + event["chain_hash"].encode()
    )
    signature = base64.urlsafe_b64encode(private.sign(message)).rstrip(b"=").decode()
    assert signature == event["signature"] and f"the {len(message)} bytes" in example

    export, keyring = example_files(tmp_path)
    args = [str(export), "--keyring", str(keyring)]
    assert by_verifier(args) == by_independent(args) == Outcome(0, {}, frozenset())

    hashes = {"j1": event["chain_hash"], "j2": "ab" * 32, "j3": "cd" * 32}
    rows = re.findall(r"\| acme/(j\d) \| `([\w-]+):(\d+):[^`]+` \| `([0-9a-f]{64})` \|", example)
    leaves = []
    for job, uuid, version, leaf in rows:
        assert uuid == str(job_uuid("acme", job))
        leaves.append(sha256(b"\x00" + f"{uuid}:{version}:{hashes[job]}".encode()))
        assert leaves[-1].hex() == leaf
    assert [row[1] for row in rows] == sorted(row[1] for row in rows)
    node = sha256(b"\x01" + leaves[0] + leaves[1])
    root = sha256(b"\x01" + node + leaves[2])
    for value in (node.hex(), root.hex(), sha256(root).hex()):
        assert value in example
