"""Declarative workflow definitions: loading and validation, the condition language, and
pure resolution. No store is involved."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path
from textwrap import dedent
from typing import Any, get_args

import pytest

from jobledger.domain.errors import JobLedgerError, UnknownWorkflowError
from jobledger.domain.status import JobStatus
from jobledger.domain.steps import ApprovalSpec, ResolveRequest, RetryPolicy
from jobledger.orchestration.ports import WorkflowRegistry
from jobledger.workflows import (
    DefinitionError,
    DefinitionRegistry,
    WorkflowDefinition,
    load_definitions,
)
from jobledger.workflows.conditions import ConditionError, parse_condition
from jobledger.workflows.definition import STEP_KINDS, AnyStep, Duration

EXAMPLES = Path(__file__).resolve().parent.parent / "examples" / "definitions"
NOW = datetime(2030, 1, 1, 12, 0, tzinfo=UTC)
KINDS = "run_interaction_task, wait_time, wait_event, await_approval, branch, map, complete, fail"
CYCLE_HINT = "set max_visits on one of its steps, or gate it with await_approval/wait_event"


def document(steps: str, *, start: str = "a", header: str = "") -> str:
    """A definition of type 't' v1 with the given steps (YAML, indented by two)."""
    head = f"type: t\nversion: 1\nstart: {start}\n{dedent(header)}"
    return head + "steps:\n" + "".join(f"  {line}\n" for line in dedent(steps).splitlines())


def write(directory: Path, name: str, text: str) -> Path:
    path = directory / name
    path.write_text(text, encoding="utf-8")
    return path


def problems(directory: Path, text: str, name: str = "wf.yaml") -> list[str]:
    with pytest.raises(DefinitionError) as raised:
        load_definitions(write(directory, name, text))
    return raised.value.problems


def load_one(directory: Path, text: str, name: str = "wf.yaml") -> WorkflowDefinition:
    (definition,) = load_definitions(write(directory, name, text))
    return definition


def request(
    *,
    cursor: str | None = None,
    state: Mapping[str, Any] | None = None,
    visits: Mapping[str, int] | None = None,
    workflow_type: str = "t",
    version: int = 1,
) -> ResolveRequest:
    return ResolveRequest(
        workflow_type=workflow_type,
        workflow_version=version,
        budget={},
        state=state or {},
        current_step=0,
        status=JobStatus.QUEUED,
        reason="queue",
        now=NOW,
        cursor=cursor,
        visits=visits or {},
    )


def registry_of(directory: Path, text: str) -> DefinitionRegistry:
    return DefinitionRegistry([load_one(directory, text)])


# ---- invalid definitions -----------------------------------------------------------------

INVALID: list[tuple[str, str, list[str]]] = [
    (
        "unknown next step",
        document("a: {kind: run_interaction_task, next: nowhere}"),
        ["wf.yaml: step 'a': field 'next': unknown step 'nowhere'"],
    ),
    (
        "unknown step named by a decision",
        document(
            """
            a: {kind: await_approval, on_approve: z, on_reject: redo}
            z: {kind: complete}
            """
        ),
        ["wf.yaml: step 'a': field 'on_reject': unknown step 'redo'"],
    ),
    (
        "unknown step named by a branch case",
        document(
            """
            a:
              kind: branch
              cases: [{when: {path: x, op: exists}, next: gone}]
              default: z
            z: {kind: complete}
            """
        ),
        ["wf.yaml: step 'a': field 'cases.0.next': unknown step 'gone'"],
    ),
    (
        "unknown start",
        document("a: {kind: complete}", start="begin"),
        ["wf.yaml: field 'start': unknown step 'begin'"],
    ),
    (
        "unreachable step",
        document("a: {kind: complete}\norphan: {kind: fail, reason: never}"),
        ["wf.yaml: step 'orphan': unreachable from start step 'a'"],
    ),
    (
        "unbounded cycle",
        document(
            """
            a: {kind: run_interaction_task, next: b}
            b:
              kind: branch
              cases: [{when: {path: done, op: "==", value: true}, next: z}]
              default: a
            z: {kind: complete}
            """
        ),
        [f"wf.yaml: step 'a': field 'next': unbounded cycle a -> b -> a: {CYCLE_HINT}"],
    ),
    (
        "unbounded self-loop",
        document(
            """
            a: {kind: run_interaction_task, next: b}
            b: {kind: wait_time, delay: 60, next: b}
            """
        ),
        [f"wf.yaml: step 'b': field 'next': unbounded cycle b -> b: {CYCLE_HINT}"],
    ),
    (
        "a cycle that avoids the bounded step of its group",
        document(
            """
            a: {kind: run_interaction_task, next: b}
            b:
              kind: branch
              cases: [{when: {path: x, op: exists}, next: c}]
              default: a
            c: {kind: run_interaction_task, max_visits: 2, next: a}
            """
        ),
        [f"wf.yaml: step 'a': field 'next': unbounded cycle a -> b -> a: {CYCLE_HINT}"],
    ),
    (
        "wrong field type",
        document("a: {kind: complete, max_visits: three}"),
        ["wf.yaml: step 'a': field 'max_visits': input should be a valid integer, got 'three'"],
    ),
    (
        "a number in quotes is not a number",
        document("a: {kind: complete}").replace("version: 1", "version: '1'"),
        ["wf.yaml: field 'version': input should be a valid integer, got '1'"],
    ),
    (
        "version below 1",
        document("a: {kind: complete}").replace("version: 1", "version: 0"),
        ["wf.yaml: field 'version': input should be greater than or equal to 1, got 0"],
    ),
    (
        "unknown field on a step",
        document("a: {kind: complete, colour: red}"),
        ["wf.yaml: step 'a': field 'colour': unknown field"],
    ),
    (
        "unknown field at the top",
        document("a: {kind: complete}", header="owner: me\n"),
        ["wf.yaml: field 'owner': unknown field"],
    ),
    (
        "unknown kind",
        document("a: {kind: launch_rocket}"),
        [f"wf.yaml: step 'a': field 'kind': unknown kind 'launch_rocket'; expected one of {KINDS}"],
    ),
    (
        "missing kind",
        document("a: {next: b}"),
        [f"wf.yaml: step 'a': field 'kind': required; one of {KINDS}"],
    ),
    (
        "a step that is not a mapping",
        document("a: complete"),
        ["wf.yaml: step 'a': must be a mapping, got 'complete'"],
    ),
    (
        "branch without default",
        document(
            """
            a:
              kind: branch
              cases: [{when: {path: x, op: exists}, next: z}]
            z: {kind: complete}
            """
        ),
        ["wf.yaml: step 'a': field 'default': required"],
    ),
    (
        "bad condition op",
        document(
            """
            a:
              kind: branch
              cases: [{when: {path: x, op: "=~", value: 1}, next: z}]
              default: z
            z: {kind: complete}
            """
        ),
        [
            "wf.yaml: step 'a': field 'cases.0.when.op': unknown op '=~'; expected one of "
            "==, !=, <, <=, >, >=, in, not_in, exists (quote operators in YAML)"
        ],
    ),
    (
        "bad nested condition",
        document(
            """
            a:
              kind: branch
              cases:
                - when: {all: [{path: x, op: exists}, {not: {path: y, op: in, value: x}}]}
                  next: z
              default: z
            z: {kind: complete}
            """
        ),
        [
            "wf.yaml: step 'a': field 'cases.0.when.all.1.not.value': "
            "op 'in' needs a list value, got 'x'"
        ],
    ),
    (
        "ordering against a boolean",
        document(
            """
            a:
              kind: branch
              cases: [{when: {path: x, op: "<", value: true}, next: z}]
              default: z
            z: {kind: complete}
            """
        ),
        [
            "wf.yaml: step 'a': field 'cases.0.when.value': "
            "op '<' needs a number or a string, got True"
        ],
    ),
    (
        "wait_time with both delay and until",
        document(
            """
            a: {kind: wait_time, delay: {hours: 1}, until: "2030-01-02T00:00:00Z", next: z}
            z: {kind: complete}
            """
        ),
        ["wf.yaml: step 'a': field 'until': give either delay or until, not both"],
    ),
    (
        "wait_time with neither delay nor until",
        document("a: {kind: wait_time, next: z}\nz: {kind: complete}"),
        ["wf.yaml: step 'a': field 'delay': give a delay or an until time"],
    ),
    (
        "wait_time until without a timezone",
        document("a: {kind: wait_time, until: 2030-01-02T00:00:00, next: z}\nz: {kind: complete}"),
        [
            "wf.yaml: step 'a': field 'until': "
            "input should have timezone info, got 2030-01-02T00:00:00"
        ],
    ),
    (
        "a zero duration",
        document("a: {kind: wait_time, delay: {minutes: 0}, next: z}\nz: {kind: complete}"),
        ["wf.yaml: step 'a': field 'delay': a duration must be longer than zero"],
    ),
    (
        "on_timeout without a timeout",
        document("a: {kind: wait_event, event: e, next: z, on_timeout: z}\nz: {kind: complete}"),
        ["wf.yaml: step 'a': field 'on_timeout': on_timeout needs a timeout"],
    ),
    (
        "on_expire without an expiry",
        document("a: {kind: await_approval, on_approve: z, on_expire: z}\nz: {kind: complete}"),
        ["wf.yaml: step 'a': field 'on_expire': on_expire needs an expires duration"],
    ),
    (
        "complete with next",
        document("a: {kind: complete, next: a}"),
        ["wf.yaml: step 'a': field 'next': a terminal step (complete or fail) takes no next step"],
    ),
    (
        "fail without a reason",
        document("a: {kind: fail}"),
        ["wf.yaml: step 'a': field 'reason': required"],
    ),
    (
        "a deadline that is not whole seconds",
        document("a: {kind: complete}", header="budget: {deadline: {ms: 1500}}\n"),
        ["wf.yaml: field 'budget.deadline': must be a whole number of seconds"],
    ),
    (
        "retry backoff ceiling below its start",
        document(
            """
            a:
              kind: run_interaction_task
              retry: {initial_backoff_ms: 5000, max_backoff_ms: 100}
              next: z
            z: {kind: complete}
            """
        ),
        ["wf.yaml: step 'a': field 'retry.max_backoff_ms': must be at least initial_backoff_ms"],
    ),
    (
        "params that are not JSON",
        document(
            """
            a: {kind: run_interaction_task, params: {day: 2030-01-01}, next: z}
            z: {kind: complete}
            """
        ),
        ["wf.yaml: step 'a': field 'params': must be JSON data (quote dates and times in YAML)"],
    ),
    (
        "every problem is listed",
        document(
            """
            a: {kind: run_interaction_task, next: b}
            b: {kind: await_approval, on_approve: x, on_reject: y}
            c: {kind: complete}
            """
        ),
        [
            "wf.yaml: step 'b': field 'on_approve': unknown step 'x'",
            "wf.yaml: step 'b': field 'on_reject': unknown step 'y'",
            "wf.yaml: step 'c': unreachable from start step 'a'",
        ],
    ),
    (
        "malformed YAML",
        "type: t\nversion: 1\nstart: a\nsteps:\n  a: {kind: complete\n",
        [
            "wf.yaml: malformed YAML at line 6, column 1: "
            "expected ',' or '}', but got '<stream end>'"
        ],
    ),
    (
        "an unquoted operator is YAML syntax",
        document(
            """
            a:
              kind: branch
              cases: [{when: {path: x, op: >=, value: 1}, next: z}]
              default: z
            z: {kind: complete}
            """
        ),
        [
            "wf.yaml: malformed YAML at line 8, column 34: "
            "found character '>' that cannot start any token"
        ],
    ),
    (
        "a step given twice",
        document("a: {kind: complete}\na: {kind: fail, reason: r}"),
        ["wf.yaml: malformed YAML at line 6, column 3: duplicate key 'a'"],
    ),
    ("not a mapping", "- a\n- b\n", ["wf.yaml: a definition must be a mapping, got list"]),
    ("empty", "", ["wf.yaml: a definition must be a mapping, got nothing"]),
]


@pytest.mark.parametrize(
    ("text", "expected"), [case[1:] for case in INVALID], ids=[case[0] for case in INVALID]
)
def test_invalid_definition_names_file_step_and_field(
    tmp_path: Path, text: str, expected: list[str]
) -> None:
    assert problems(tmp_path, text) == expected


INVALID_JSON = [
    (
        "malformed JSON",
        '{"type": "t", "version": 1,}',
        "wf.json: malformed JSON at line 1, column 28: "
        "Expecting property name enclosed in double quotes",
    ),
    (
        "duplicate JSON key",
        '{"type": "t", "type": "u"}',
        "wf.json: malformed JSON: duplicate key 'type'",
    ),
    (
        "JSON field type",
        '{"type": "t", "version": 1, "start": "a", "steps": {"a": {"kind": "complete"}},'
        ' "budget": {"max_steps": 2.5}}',
        "wf.json: field 'budget.max_steps': input should be a valid integer, got 2.5",
    ),
]


@pytest.mark.parametrize(
    ("text", "expected"), [case[1:] for case in INVALID_JSON], ids=[c[0] for c in INVALID_JSON]
)
def test_invalid_json_definition(tmp_path: Path, text: str, expected: str) -> None:
    assert problems(tmp_path, text, "wf.json") == [expected]


def test_definition_error_is_a_jobledger_error_listing_every_problem(tmp_path: Path) -> None:
    text = document("a: {kind: run_interaction_task, next: x}\nb: {kind: complete}")
    with pytest.raises(JobLedgerError) as raised:
        load_definitions(write(tmp_path, "wf.yaml", text))
    assert str(raised.value) == (
        "2 problems in workflow definitions:\n"
        "  - wf.yaml: step 'a': field 'next': unknown step 'x'\n"
        "  - wf.yaml: step 'b': unreachable from start step 'a'"
    )


def test_field_and_graph_problems_are_reported_in_one_pass(tmp_path: Path) -> None:
    text = document(
        "a: {kind: run_interaction_task, next: b, retry: {max_attempts: -1}}\n"
        "b: {kind: branch, cases: [{when: {path: x, op: exists}, next: ghost}], default: a}\n"
        "c: {kind: complete}"
    )
    with pytest.raises(DefinitionError) as raised:
        load_definitions(write(tmp_path, "wf.yaml", text))
    problems = "\n".join(raised.value.problems)
    assert "step 'a': field 'retry.max_attempts'" in problems  # a field problem ...
    assert "step 'b': field 'cases.0.next': unknown step 'ghost'" in problems  # ... and the graph's
    assert "step 'c': unreachable from start step 'a'" in problems
    assert "unbounded cycle a -> b -> a" in problems


def test_duplicate_type_and_version_across_files_names_both(tmp_path: Path) -> None:
    write(tmp_path, "first.yaml", document("a: {kind: complete}"))
    write(
        tmp_path,
        "second.json",
        '{"type": "t", "version": 1, "start": "a", "steps": {"a": {"kind": "complete"}}}',
    )
    with pytest.raises(DefinitionError) as raised:
        load_definitions(tmp_path)
    assert raised.value.problems == ["second.json: workflow 't' v1 is also defined in first.yaml"]


def test_a_directory_reports_the_problems_of_every_file(tmp_path: Path) -> None:
    write(tmp_path, "a.yaml", document("a: {kind: complete, next: a}"))
    write(tmp_path, "b.yml", "type: [")
    write(tmp_path, "notes.txt", "not a definition")
    with pytest.raises(DefinitionError) as raised:
        load_definitions(tmp_path)
    assert [p.split(":")[0] for p in raised.value.problems] == ["a.yaml", "b.yml"]


def test_missing_path(tmp_path: Path) -> None:
    with pytest.raises(DefinitionError, match="no such file or directory"):
        load_definitions(tmp_path / "absent")


def test_step_kinds_lists_every_step_model() -> None:
    kinds = tuple(get_args(model.model_fields["kind"].annotation)[0] for model in get_args(AnyStep))
    assert kinds == STEP_KINDS


@pytest.mark.parametrize(
    ("duration", "ms", "text"),
    [
        ({"days": 1, "hours": 12}, 129_600_000, "1d12h"),
        ({"seconds": 90}, 90_000, "1m30s"),
        ({"minutes": 1, "ms": 1500}, 61_500, "1m1500ms"),
        ({"ms": 250}, 250, "250ms"),
    ],
)
def test_duration(duration: dict[str, int], ms: int, text: str) -> None:
    parsed = Duration.model_validate(duration)
    assert (parsed.total_ms(), parsed.describe()) == (ms, text)


# ---- valid graphs ------------------------------------------------------------------------

BOUNDED_CYCLES = {
    "max_visits": """
        a: {kind: run_interaction_task, max_visits: 3, next: b}
        b:
          kind: branch
          cases: [{when: {path: done, op: "==", value: true}, next: z}]
          default: a
        z: {kind: complete}
        """,
    "await_approval": """
        a: {kind: run_interaction_task, next: b}
        b: {kind: await_approval, on_approve: z, on_reject: a}
        z: {kind: complete}
        """,
    "wait_event": """
        a: {kind: run_interaction_task, next: b}
        b: {kind: wait_event, event: more, next: a, timeout: {days: 1}, on_timeout: z}
        z: {kind: complete}
        """,
}


@pytest.mark.parametrize("steps", BOUNDED_CYCLES.values(), ids=BOUNDED_CYCLES.keys())
def test_bounded_cycle_is_accepted(tmp_path: Path, steps: str) -> None:
    assert load_one(tmp_path, document(steps)).type == "t"


def test_yaml_reads_only_true_and_false_as_booleans(tmp_path: Path) -> None:
    text = document(
        """
        a: {kind: await_approval, on_approve: yes, on_reject: no}
        yes:
          kind: branch
          cases: [{when: {path: answer, op: "==", value: on}, next: no}]
          default: no
        no: {kind: fail, reason: declined}
        """
    )
    registry = registry_of(tmp_path, text)
    approval = registry.resolve(request()).approval
    assert approval is not None
    assert (approval.on_approve, approval.on_reject) == ("yes", "no")
    chosen = registry.resolve(request(cursor="yes", state={"answer": "on"}))
    assert chosen.transition_reason == "branch 'yes': case 1 (answer == \"on\") -> 'no'"


def test_json_definition_loads(tmp_path: Path) -> None:
    text = '{"type": "t", "version": 3, "start": "a", "steps": {"a": {"kind": "complete"}}}'
    assert load_one(tmp_path, text, "t.v3.json").version == 3


def test_examples_directory_loads() -> None:
    registry = DefinitionRegistry.from_directory(EXAMPLES)
    assert registry.versions("research_mission") == [1, 2]
    assert registry.latest_version("research_mission") == 2
    assert registry.budget_defaults("research_mission", 1) == {
        "max_steps": 40,
        "max_cost_usd": 25,
        "deadline_seconds": 336 * 3600,
    }


@pytest.mark.parametrize(
    ("budget", "expected"),
    [
        ("", {}),
        ("budget: {max_steps: 5}\n", {"max_steps": 5}),
        (
            "budget: {max_cost_usd: 1.5, deadline: 90}\n",
            {"max_cost_usd": 1.5, "deadline_seconds": 90},
        ),
        ("budget: {deadline: {days: 1, minutes: 1}}\n", {"deadline_seconds": 86_460}),
    ],
)
def test_budget_defaults(tmp_path: Path, budget: str, expected: dict[str, Any]) -> None:
    definition = load_one(tmp_path, document("a: {kind: complete}", header=budget))
    assert definition.budget_defaults() == expected


# ---- resolution of each step kind --------------------------------------------------------


def test_run_interaction_task(tmp_path: Path) -> None:
    registry = registry_of(
        tmp_path,
        document(
            """
            a:
              kind: run_interaction_task
              params: {task: summarise, limits: {words: 200}}
              retry: {max_attempts: 4, initial_backoff_ms: 10, multiplier: 3, retry_on: [timeout]}
              next: z
            z: {kind: complete}
            """
        ),
    )
    resolution = registry.resolve(request())
    assert resolution.step_type == "run_interaction_task"
    assert resolution.next_status is JobStatus.QUEUED
    assert (resolution.step_name, resolution.next_step) == ("a", "z")
    assert resolution.triggered_by == "workflow"
    assert resolution.transition_reason == "step 'a': run interaction task -> 'z'"
    assert resolution.params == {"task": "summarise", "limits": {"words": 200}}
    assert resolution.retry_policy == RetryPolicy(
        max_attempts=4, initial_backoff_ms=10, multiplier=3.0, retry_on=frozenset({"timeout"})
    )
    assert resolution.has_side_effect


def test_resolution_is_pure_and_params_are_a_copy(tmp_path: Path) -> None:
    text = document(
        "a: {kind: run_interaction_task, params: {n: [1]}, next: z}\nz: {kind: complete}"
    )
    registry = registry_of(tmp_path, text)
    first = registry.resolve(request())
    first.params["n"].append(2)
    assert registry.resolve(request()) == registry.resolve(request())
    assert registry.resolve(request()).params == {"n": [1]}
    assert registry.resolve(request()).retry_policy is None


def test_wait_time_delay(tmp_path: Path) -> None:
    text = document(
        "a: {kind: wait_time, delay: {hours: 1, minutes: 30}, next: z}\nz: {kind: complete}"
    )
    resolution = registry_of(tmp_path, text).resolve(request())
    assert resolution.next_status is JobStatus.WAITING_TIME
    assert resolution.resume_delay_ms == 90 * 60_000
    assert resolution.resume_at is None
    assert resolution.next_step == "z"
    assert resolution.transition_reason == "step 'a': wait 1h30m -> 'z'"


def test_wait_time_until_is_absolute(tmp_path: Path) -> None:
    text = document(
        'a: {kind: wait_time, until: "2030-06-01T09:00:00+02:00", next: z}\nz: {kind: complete}'
    )
    resolution = registry_of(tmp_path, text).resolve(request())
    assert resolution.next_status is JobStatus.WAITING_TIME
    assert resolution.resume_at == datetime(2030, 6, 1, 7, 0, tzinfo=UTC)
    assert resolution.resume_at.tzinfo is UTC
    assert resolution.resume_delay_ms is None
    assert resolution.transition_reason == "step 'a': wait until 2030-06-01T07:00:00+00:00 -> 'z'"


def test_wait_event(tmp_path: Path) -> None:
    text = document(
        """
        a: {kind: wait_event, event: reply, timeout: {days: 2}, on_timeout: late, next: z}
        z: {kind: complete}
        late: {kind: fail, reason: no reply}
        """
    )
    resolution = registry_of(tmp_path, text).resolve(request())
    assert resolution.step_type == "wait_event"
    assert resolution.next_status is JobStatus.WAITING_EVENT
    assert resolution.wait_event_name == "reply"
    assert resolution.wait_timeout_ms == 2 * 86_400_000
    assert (resolution.on_timeout, resolution.next_step) == ("late", "z")
    assert resolution.transition_reason == (
        "step 'a': wait for event 'reply' -> 'z' (timeout 2d -> 'late')"
    )


def test_wait_event_without_timeout(tmp_path: Path) -> None:
    text = document("a: {kind: wait_event, event: reply, next: z}\nz: {kind: complete}")
    resolution = registry_of(tmp_path, text).resolve(request())
    assert (resolution.wait_timeout_ms, resolution.on_timeout) == (None, None)


def test_await_approval(tmp_path: Path) -> None:
    text = document(
        """
        a:
          kind: await_approval
          approvers: [lead, editor]
          expires: {hours: 72}
          on_approve: z
          on_reject: refused
          on_expire: refused
        z: {kind: complete}
        refused: {kind: fail, reason: rejected}
        """
    )
    resolution = registry_of(tmp_path, text).resolve(request())
    assert resolution.step_type == "await_approval"
    assert resolution.next_status is JobStatus.AWAITING_APPROVAL
    assert resolution.approval == ApprovalSpec(
        approvers=("lead", "editor"),
        expires_ms=72 * 3_600_000,
        on_approve="z",
        on_reject="refused",
        on_expire="refused",
    )
    assert resolution.next_step == "z"
    assert (
        resolution.transition_reason == "step 'a': await approval by lead, editor (expires in 3d)"
    )


BRANCH = document(
    """
    check:
      kind: branch
      cases:
        - when: {path: score, op: ">=", value: 0.8}
          next: finish
        - when: {any: [{path: tags, op: exists}, {not: {path: urgent, op: "==", value: false}}]}
          next: escalate
      default: retry
    finish: {kind: complete}
    escalate: {kind: fail, reason: escalated}
    retry: {kind: await_approval, on_approve: check}
    """,
    start="check",
)


@pytest.mark.parametrize(
    ("state", "chosen", "reason"),
    [
        ({"score": 0.9}, "finish", "branch 'check': case 1 (score >= 0.8) -> 'finish'"),
        (
            {"score": 0.5, "tags": []},
            "escalate",
            "branch 'check': case 2 (tags exists or not (urgent == false)) -> 'escalate'",
        ),
        (
            {"score": 0.5, "urgent": False},
            "retry",
            "branch 'check': no case matched -> default 'retry'",
        ),
        (
            {"score": "high", "urgent": False},
            "retry",
            "branch 'check': no case matched -> default 'retry'",
        ),
    ],
)
def test_branch(tmp_path: Path, state: dict[str, Any], chosen: str, reason: str) -> None:
    resolution = registry_of(tmp_path, BRANCH).resolve(request(state=state))
    assert resolution.step_type == "branch"
    assert resolution.next_status is JobStatus.QUEUED
    assert (resolution.step_name, resolution.next_step) == ("check", chosen)
    assert resolution.transition_reason == reason


def test_complete_and_fail(tmp_path: Path) -> None:
    done = registry_of(tmp_path, document("a: {kind: complete}")).resolve(request())
    assert (done.step_type, done.next_status, done.next_step) == (
        "complete",
        JobStatus.COMPLETED,
        None,
    )
    assert done.transition_reason == "step 'a': workflow complete"
    failing = registry_of(tmp_path, document("a: {kind: fail, reason: out of ideas}"))
    failed = failing.resolve(request())
    assert (failed.step_type, failed.next_status, failed.next_step) == (
        "fail",
        JobStatus.FAILED,
        None,
    )
    assert failed.transition_reason == "out of ideas"


def test_add_checks_the_graph_of_a_definition_built_in_python() -> None:
    definition = WorkflowDefinition.model_validate(
        {
            "type": "t",
            "version": 1,
            "start": "a",
            "steps": {"a": {"kind": "complete"}, "b": {"kind": "fail", "reason": "never"}},
        }
    )
    with pytest.raises(DefinitionError) as raised:
        DefinitionRegistry().add(definition)
    assert raised.value.problems == ["workflow 't' v1: step 'b': unreachable from start step 'a'"]


# ---- cursor, visits, versions ------------------------------------------------------------

LOOP = document(
    """
    a: {kind: run_interaction_task, next: b}
    b: {kind: run_interaction_task, max_visits: 2, next: c}
    c:
      kind: branch
      cases: [{when: {path: done, op: "==", value: true}, next: z}]
      default: b
    z: {kind: complete}
    """
)


def test_cursor_selects_the_step_and_none_means_start(tmp_path: Path) -> None:
    registry = registry_of(tmp_path, LOOP)
    assert registry.resolve(request()).step_name == "a"
    assert registry.resolve(request(cursor="b")).next_step == "c"


def test_max_visits_exhaustion_fails_the_job(tmp_path: Path) -> None:
    registry = registry_of(tmp_path, LOOP)
    assert (
        registry.resolve(request(cursor="b", visits={"b": 1})).step_type == "run_interaction_task"
    )
    exhausted = registry.resolve(request(cursor="b", visits={"b": 2, "a": 1}))
    assert exhausted.step_type == "fail"
    assert exhausted.next_status is JobStatus.FAILED
    assert exhausted.step_name == "b"
    assert exhausted.next_step is None
    assert exhausted.transition_reason == "step 'b' reached its bound of max_visits=2"
    assert registry.resolve(request(cursor="a", visits={"a": 50})).step_name == "a"


def test_unknown_cursor_is_a_definition_error(tmp_path: Path) -> None:
    with pytest.raises(DefinitionError, match="unknown step 'gone'"):
        registry_of(tmp_path, LOOP).resolve(request(cursor="gone"))


def test_a_job_is_pinned_to_its_version() -> None:
    registry = DefinitionRegistry(load_definitions(EXAMPLES))
    v1 = registry.resolve(request(workflow_type="research_mission", version=1, cursor="plan"))
    v2 = registry.resolve(request(workflow_type="research_mission", version=2, cursor="plan"))
    assert (v1.next_step, v2.next_step) == ("research", "sources")
    review = request(workflow_type="research_mission", version=1, cursor="review")
    approval = registry.resolve(review).approval
    assert approval is not None
    assert approval.on_approve == "done"
    assert registry.has("research_mission", 1)
    assert not registry.has("research_mission", 3)
    with pytest.raises(UnknownWorkflowError, match=r"'research_mission' v3 \(known: v1, v2\)"):
        registry.resolve(request(workflow_type="research_mission", version=3))


def test_unknown_workflow_type() -> None:
    registry: WorkflowRegistry = DefinitionRegistry()
    with pytest.raises(UnknownWorkflowError, match="unknown workflow type 'nope'"):
        registry.latest_version("nope")
    with pytest.raises(UnknownWorkflowError, match=r"unknown workflow 'nope' v1 \(known: none\)"):
        registry.budget_defaults("nope", 1)
    assert not registry.has("nope", 1)


def test_a_version_is_registered_once(tmp_path: Path) -> None:
    definition = load_one(tmp_path, document("a: {kind: complete}"))
    registry = DefinitionRegistry([definition])
    with pytest.raises(DefinitionError, match=r"workflow 't' v1 is already registered"):
        registry.add(definition)


def test_example_v2_walks_its_graph() -> None:
    registry = DefinitionRegistry.from_directory(EXAMPLES)

    def step(cursor: str, **state: Any) -> str | None:
        req = request(workflow_type="research_mission", version=2, cursor=cursor, state=state)
        return registry.resolve(req).next_step

    assert step("sources") == "research"
    assert step("check", review={"score": 0.9}) == "review"
    assert step("check", review={"score": 0.9, "blockers": ["x"]}) == "revise"
    assert step("check", request={"priority": "urgent"}) == "review"
    assert step("check") == "revise"
    assert step("cool_off") == "publish"


# ---- the condition language --------------------------------------------------------------

STATE: dict[str, Any] = {
    "score": 0.75,
    "count": 3,
    "name": "draft",
    "flag": True,
    "nothing": None,
    "items": [{"name": "first"}, {"name": "second"}],
    "nested": {"a": {"b": [10, 20]}},
    "map": {"0": "zero"},
}

CONDITIONS: list[tuple[dict[str, Any], bool]] = [
    ({"path": "score", "op": ">=", "value": 0.5}, True),
    ({"path": "score", "op": "<", "value": 0.5}, False),
    ({"path": "count", "op": "==", "value": 3.0}, True),
    ({"path": "count", "op": "!=", "value": 4}, True),
    ({"path": "name", "op": ">", "value": "a"}, True),
    ({"path": "name", "op": "in", "value": ["draft", "final"]}, True),
    ({"path": "name", "op": "not_in", "value": ["draft"]}, False),
    ({"path": "items.1.name", "op": "==", "value": "second"}, True),
    ({"path": "nested.a.b.0", "op": "<=", "value": 10}, True),
    ({"path": "map.0", "op": "==", "value": "zero"}, True),
    ({"path": "nothing", "op": "==", "value": None}, True),
    ({"path": "nothing", "op": "exists"}, True),
    # absent paths: exists is false, every comparison is false
    ({"path": "missing", "op": "exists"}, False),
    ({"path": "missing", "op": "==", "value": None}, False),
    ({"path": "missing", "op": "!=", "value": 1}, False),
    ({"path": "missing", "op": "not_in", "value": [1]}, False),
    ({"path": "missing.deeper", "op": "<", "value": 1}, False),
    ({"path": "items.5.name", "op": "exists"}, False),
    ({"path": "items.first", "op": "exists"}, False),
    ({"path": "score.value", "op": "exists"}, False),
    # incomparable types are false, not an error; booleans are not numbers
    ({"path": "name", "op": "<", "value": 5}, False),
    ({"path": "count", "op": ">=", "value": "2"}, False),
    ({"path": "items", "op": ">", "value": 1}, False),
    ({"path": "flag", "op": "==", "value": 1}, False),
    ({"path": "count", "op": "in", "value": [True, 3]}, True),
    ({"path": "flag", "op": "in", "value": [1]}, False),
    # combinators
    ({"all": [{"path": "count", "op": ">", "value": 1}, {"path": "flag", "op": "exists"}]}, True),
    ({"all": [{"path": "count", "op": ">", "value": 1}, {"path": "x", "op": "exists"}]}, False),
    (
        {"any": [{"path": "x", "op": "exists"}, {"path": "name", "op": "==", "value": "draft"}]},
        True,
    ),
    ({"not": {"path": "missing", "op": "==", "value": 1}}, True),
    ({"not": {"any": [{"path": "flag", "op": "==", "value": True}]}}, False),
]


@pytest.mark.parametrize(("raw", "expected"), CONDITIONS)
def test_condition_evaluation(raw: dict[str, Any], expected: bool) -> None:
    assert parse_condition(raw).evaluate(STATE) is expected


@pytest.mark.parametrize(
    ("raw", "field", "message"),
    [
        (
            "score > 1",
            "",
            "a condition must be a mapping ({path, op, value}, all, any or not), got str",
        ),
        ({"all": []}, "all", "'all' takes a non-empty list of conditions"),
        ({"any": {"path": "x"}}, "any", "'any' takes a non-empty list of conditions"),
        (
            {"not": {"path": "x", "op": "exists"}, "path": "y"},
            "",
            "a combinator takes exactly one key, got not, path",
        ),
        (
            {"path": "x", "op": "exists", "valu": 1},
            "",
            "unknown key(s) valu: a condition is {path, op, value}, all, any or not",
        ),
        (
            {"path": "a..b", "op": "exists"},
            "path",
            "path must be a dotted string like 'a.b.0.c', got 'a..b'",
        ),
        ({"op": "exists"}, "path", "path must be a dotted string like 'a.b.0.c', got None"),
        ({"path": "x", "op": "=="}, "", "op '==' needs a value"),
        ({"path": "x", "op": "exists", "value": True}, "value", "op 'exists' takes no value"),
        (
            {"path": "x", "op": "==", "value": {1: 2}},
            "value",
            "value must be JSON data (quote dates in YAML), got dict",
        ),
        (
            {"any": [{"path": "x", "op": "exists"}, {"path": "y", "op": None}]},
            "any.1.op",
            "unknown op None; expected one of ==, !=, <, <=, >, >=, in, not_in, exists "
            "(quote operators in YAML)",
        ),
    ],
)
def test_condition_shape_errors(raw: object, field: str, message: str) -> None:
    with pytest.raises(ConditionError) as raised:
        parse_condition(raw)
    assert (raised.value.field, str(raised.value)) == (field, message)


def test_condition_round_trips_through_model_dump(tmp_path: Path) -> None:
    definition = load_one(tmp_path, BRANCH)
    again = WorkflowDefinition.model_validate(definition.model_dump())
    assert again == definition
