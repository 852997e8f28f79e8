"""Loading definitions from YAML/JSON files and directories, checking each whole graph.

Every problem found is collected (not just the first) and raised together as one
DefinitionError, each naming the file, the step and the field it concerns.
"""

from __future__ import annotations

import json
import re
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import date
from pathlib import Path
from typing import Any, Final, Protocol

import yaml
from pydantic import ValidationError
from pydantic_core import ErrorDetails

from jobledger.domain.errors import InvalidPayloadError
from jobledger.domain.payloads import MAX_DEPTH, MAX_INT_DIGITS, parse_json
from jobledger.workflows.definition import (
    GATED_KINDS,
    STEP_KINDS,
    DefinitionError,
    WorkflowDefinition,
    problem,
)

SUFFIXES: Final = (".yaml", ".yml", ".json")
MAX_FILE_BYTES: Final = 1024 * 1024
"""A definition is a few kilobytes; a bigger file is a mistake or an attack."""
MAX_NODES: Final = 100_000
"""How many values a YAML document may hold once its aliases are expanded: a few hundred
bytes of aliases of aliases can otherwise stand for billions (the "billion laughs")."""
_CYCLE_HINT: Final = "set max_visits on one of its steps, or gate it with await_approval/wait_event"


def load_definitions(path: str | Path) -> list[WorkflowDefinition]:
    """The definitions in a file, or in every *.yaml, *.yml and *.json file of a directory
    (not its subdirectories), in file-name order. Raise DefinitionError listing every
    problem, including a (type, version) defined by two files."""
    path = Path(path)
    if not path.exists():
        raise DefinitionError([problem(str(path), "no such file or directory")])
    files = _definition_files(path) if path.is_dir() else [path]
    problems: list[str] = []
    loaded: list[tuple[str, WorkflowDefinition]] = []
    for file in files:
        try:
            loaded.append((file.name, parse_definition(_read(file), file.name)))
        except DefinitionError as error:
            problems.extend(error.problems)
    problems.extend(duplicate_problems(loaded))
    if problems:
        raise DefinitionError(problems)
    return [definition for _, definition in loaded]


def parse_definition(text: str, source: str) -> WorkflowDefinition:
    """Parse one document (JSON if ``source`` ends in .json, else YAML), validate its
    fields, then its graph. ``source`` names it in error messages."""
    if len(text) > MAX_FILE_BYTES:
        raise DefinitionError([problem(source, _too_big(len(text.encode())))])
    data = _parse_json(text, source) if source.endswith(".json") else _parse_yaml(text, source)
    if not isinstance(data, dict):
        found = "nothing" if data is None else type(data).__name__
        raise DefinitionError([problem(source, f"a definition must be a mapping, got {found}")])
    try:
        definition = WorkflowDefinition.model_validate(data)
    except ValidationError as error:
        # The graph is checked too, as far as the document names it, so one pass reports
        # every problem (a bad field does not hide an unknown step or an endless loop).
        raw = RawGraph.of(data)
        graph = graph_problems(raw, source) if raw is not None else []
        raise DefinitionError(validation_problems(error, source) + graph) from None
    check_definition(definition, source)
    return definition


def check_definition(definition: WorkflowDefinition, source: str) -> None:
    """Raise DefinitionError if the definition's graph is unsound."""
    problems = graph_problems(definition, source)
    if problems:
        raise DefinitionError(problems)


def duplicate_problems(loaded: Iterable[tuple[str, WorkflowDefinition]]) -> list[str]:
    first: dict[tuple[str, int], str] = {}
    problems = []
    for source, definition in loaded:
        if definition.key in first:
            also = first[definition.key]
            problems.append(problem(source, f"{definition.label} is also defined in {also}"))
        else:
            first[definition.key] = source
    return problems


# ---- reading files -----------------------------------------------------------------------


def _definition_files(directory: Path) -> list[Path]:
    return sorted(
        file for file in directory.iterdir() if file.is_file() and file.suffix in SUFFIXES
    )


def _read(file: Path) -> str:
    try:
        size = file.stat().st_size
        if size > MAX_FILE_BYTES:  # never read it whole
            raise DefinitionError([problem(file.name, _too_big(size))])
        return file.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as error:
        raise DefinitionError([problem(file.name, f"cannot read: {error}")]) from None


def _too_big(size: int) -> str:
    return f"the file is {size} bytes, over the limit of {MAX_FILE_BYTES}"


class _DefinitionLoader(yaml.SafeLoader):
    """A SafeLoader that refuses a key given twice in one mapping (YAML would keep the
    last), and reads only true/false as booleans, as YAML 1.2 does: a step named ``no``
    or a value ``on`` stays a string.

    It also bounds the work: nesting deeper than MAX_DEPTH (the composer recurses), more
    than MAX_NODES values once aliases are expanded (counted per node as it is composed,
    an alias adding the size of what it names: the bomb is refused before anything is
    expanded), and integers too long to convert."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._depth = 0
        self._measured: dict[int, tuple[int, int]] = {}
        """id(node) -> (values once expanded, height); an alias returns its anchor's node."""

    def compose_node(self, parent: yaml.Node | None, index: int) -> yaml.Node | None:
        self._depth += 1
        try:
            if self._depth > MAX_DEPTH:
                event: yaml.Event = self.peek_event()  # type: ignore[no-untyped-call]
                raise _too_much(f"nested deeper than {MAX_DEPTH} levels", event.start_mark)
            node = super().compose_node(parent, index)
        finally:
            self._depth -= 1
        if node is None:
            return None
        size, height = self._measure(node)
        if self._depth + height > MAX_DEPTH:  # an alias of a deep value, placed deep
            raise _too_much(f"nested deeper than {MAX_DEPTH} levels", node.start_mark)
        if size > MAX_NODES:
            problem = f"the document expands to more than {MAX_NODES} nodes"
            raise _too_much(f"{problem} (aliases repeated too often)", node.start_mark)
        return node

    def _measure(self, node: yaml.Node) -> tuple[int, int]:
        known = self._measured.get(id(node))
        if known is not None:
            return known
        children: list[yaml.Node] = []
        if isinstance(node, yaml.SequenceNode):
            children = list(node.value)
        elif isinstance(node, yaml.MappingNode):
            children = [part for pair in node.value for part in pair]
        # Every child went through compose_node first, so it is measured already.
        measured = [self._measured[id(child)] for child in children]
        size = 1 + sum(child_size for child_size, _ in measured)
        height = 1 + max((child_height for _, child_height in measured), default=0)
        self._measured[id(node)] = (size, height)
        return size, height

    def construct_yaml_int(self, node: yaml.ScalarNode) -> int:
        try:
            return super().construct_yaml_int(node)
        except ValueError:
            digits = len(str(self.construct_scalar(node)).lstrip("+-").replace("_", ""))
            message = f"an integer of {digits} digits is over the limit of {MAX_INT_DIGITS}"
            raise yaml.constructor.ConstructorError(None, None, message, node.start_mark) from None


def _too_much(problem: str, where: Any) -> yaml.composer.ComposerError:
    """``where``: the mark of the node or event refused."""
    return yaml.composer.ComposerError(None, None, problem, where)


def _unique_mapping(loader: yaml.SafeLoader, node: yaml.MappingNode) -> dict[Any, Any]:
    seen: set[object] = set()
    for key_node, _ in node.value:
        key = loader.construct_object(key_node)
        if not isinstance(key, str | int | float | bool):
            continue  # construct_mapping reports keys that cannot be keys
        if key in seen:
            raise yaml.constructor.ConstructorError(
                None, None, f"duplicate key {key!r}", key_node.start_mark
            )
        seen.add(key)
    return loader.construct_mapping(node)


_BOOL_TAG: Final = "tag:yaml.org,2002:bool"
_DefinitionLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _unique_mapping)
_DefinitionLoader.add_constructor("tag:yaml.org,2002:int", _DefinitionLoader.construct_yaml_int)
_DefinitionLoader.yaml_implicit_resolvers = {
    first: [(tag, pattern) for tag, pattern in resolvers if tag != _BOOL_TAG]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
_DefinitionLoader.add_implicit_resolver(
    _BOOL_TAG, re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"), list("tTfF")
)


def _parse_yaml(text: str, source: str) -> object:
    try:
        return yaml.load(text, Loader=_DefinitionLoader)  # a SafeLoader
    except yaml.MarkedYAMLError as error:
        raise DefinitionError([problem(source, _yaml_message(error))]) from None
    except yaml.YAMLError as error:
        raise DefinitionError([problem(source, f"malformed YAML: {error}")]) from None


def _yaml_message(error: yaml.MarkedYAMLError) -> str:
    mark = error.problem_mark or error.context_mark
    where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
    what = error.problem or error.context or "unreadable"
    return f"malformed YAML{where}: {what}"


def _unique_object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    data: dict[str, Any] = {}
    for key, value in pairs:
        if key in data:
            raise ValueError(f"duplicate key {key!r}")
        data[key] = value
    return data


def _parse_json(text: str, source: str) -> object:
    try:
        return parse_json(text, object_pairs_hook=_unique_object)
    except json.JSONDecodeError as error:
        where = f"at line {error.lineno}, column {error.colno}"
        raise DefinitionError([problem(source, f"malformed JSON {where}: {error.msg}")]) from None
    except (InvalidPayloadError, ValueError) as error:
        raise DefinitionError([problem(source, f"malformed JSON: {error}")]) from None


# ---- field problems, from pydantic -------------------------------------------------------


def validation_problems(error: ValidationError, source: str) -> list[str]:
    return [_field_problem(detail, source) for detail in error.errors()]


def _field_problem(detail: ErrorDetails, source: str) -> str:
    step, field = _locate(detail["loc"])
    kind = detail["type"]
    if kind in ("union_tag_invalid", "union_tag_not_found"):
        field = "kind"
    inner = getattr(detail.get("ctx", {}).get("error"), "field", "")
    field = ".".join(part for part in (field, inner) if part)
    if step is not None and detail["loc"][2:] == ("[key]",):
        return problem(source, "a step name must be a string", step)
    return problem(source, _message(detail), step, field or None)


def _locate(loc: tuple[int | str, ...]) -> tuple[str | None, str]:
    """(step, field) from a pydantic location, dropping the union's kind tag."""
    if len(loc) < 2 or loc[0] != "steps":
        return None, ".".join(map(str, loc))
    rest = loc[2:]
    if rest and rest[0] in STEP_KINDS:
        rest = rest[1:]
    return str(loc[1]), ".".join(map(str, rest))


def _message(detail: ErrorDetails) -> str:
    kind, ctx = detail["type"], detail.get("ctx", {})
    if kind == "missing":
        return "required"
    if kind == "extra_forbidden":
        return "unknown field"
    if kind == "value_error":
        return str(ctx["error"])
    if kind == "union_tag_invalid":
        return f"unknown kind {ctx['tag']!r}; expected one of {', '.join(STEP_KINDS)}"
    if kind == "union_tag_not_found":
        return f"required; one of {', '.join(STEP_KINDS)}"
    if kind == "model_attributes_type":
        return f"must be a mapping, got {_shown(detail['input'])}"
    text = detail["msg"][:1].lower() + detail["msg"][1:]
    return f"{text}, got {_shown(detail['input'])}"


def _shown(value: object) -> str:
    if isinstance(value, Mapping | list):
        return type(value).__name__
    if isinstance(value, date):  # YAML reads unquoted dates and times itself
        return value.isoformat()
    return repr(value)


# ---- graph problems ----------------------------------------------------------------------


class GraphStep(Protocol):
    def targets(self) -> tuple[tuple[str, str], ...]: ...

    @property
    def bounded(self) -> bool: ...


class Graph(Protocol):
    """What the graph checks read: a validated definition, or a document that failed
    validation read as far as it names steps (``RawGraph``)."""

    @property
    def start(self) -> str: ...

    @property
    def steps(self) -> Mapping[str, GraphStep]: ...


_TARGET_FIELDS: Final = {
    "run_interaction_task": ("next",),
    "wait_time": ("next",),
    "wait_event": ("next", "on_timeout"),
    "await_approval": ("on_approve", "on_reject", "on_expire"),
    "branch": ("default",),
    "map": ("next", "on_timeout"),
}
"""The fields that name a next step, by kind (a field a kind does not take is a field
problem already, not an edge)."""


@dataclass(frozen=True)
class RawStep:
    fields: Mapping[str, Any]

    def targets(self) -> tuple[tuple[str, str], ...]:
        kind = self.fields.get("kind")
        names = _TARGET_FIELDS.get(kind, ()) if isinstance(kind, str) else ()
        named = [(f, self.fields[f]) for f in names if f in self.fields]
        cases = self.fields.get("cases") if kind == "branch" else None
        if isinstance(cases, list):
            named += [
                (f"cases.{i}.next", case.get("next"))
                for i, case in enumerate(cases)
                if isinstance(case, dict)
            ]
        return tuple((f, target) for f, target in named if isinstance(target, str))

    @property
    def bounded(self) -> bool:
        return "max_visits" in self.fields or self.fields.get("kind") in GATED_KINDS


@dataclass(frozen=True)
class RawGraph:
    start: str
    steps: Mapping[str, RawStep]

    @classmethod
    def of(cls, data: Mapping[str, Any]) -> RawGraph | None:
        steps, start = data.get("steps"), data.get("start")
        if not isinstance(steps, dict) or not isinstance(start, str):
            return None
        # A step that is not a mapping is a field problem; it still exists for the graph.
        known = {str(n): RawStep(s if isinstance(s, dict) else {}) for n, s in steps.items()}
        return cls(start, known)


def graph_problems(definition: Graph, source: str) -> list[str]:
    """Unknown steps named by start or by a step, steps unreachable from start, and cycles
    that nothing bounds."""
    steps = definition.steps
    problems = []
    if definition.start not in steps:
        problems.append(problem(source, f"unknown step {definition.start!r}", field="start"))
    for name, step in steps.items():
        for field, target in step.targets():
            if target not in steps:
                problems.append(problem(source, f"unknown step {target!r}", name, field))
    if definition.start in steps:
        problems.extend(_unreachable(definition, source))
    problems.extend(_unbounded_cycles(definition, source))
    return problems


def _edges(definition: Graph, among: Iterable[str]) -> dict[str, list[str]]:
    """Each step of ``among`` with the steps of ``among`` it leads to."""
    nodes = set(among)
    steps = definition.steps
    return {
        name: [target for _, target in steps[name].targets() if target in nodes]
        for name in steps
        if name in nodes
    }


def _reachable(edges: Mapping[str, list[str]], roots: Iterable[str]) -> set[str]:
    seen: set[str] = set()
    pending = deque(roots)
    while pending:
        name = pending.popleft()
        if name not in seen:
            seen.add(name)
            pending.extend(edges[name])
    return seen


def _unreachable(definition: Graph, source: str) -> list[str]:
    reached = _reachable(_edges(definition, definition.steps), [definition.start])
    return [
        problem(source, f"unreachable from start step {definition.start!r}", name)
        for name in definition.steps
        if name not in reached
    ]


def _unbounded_cycles(definition: Graph, source: str) -> list[str]:
    """A cycle is bounded if one of its steps has max_visits or waits for the outside
    world. So: drop the bounded steps; every cycle left is unbounded (one report per
    strongly connected group, naming its shortest cycle through its first step)."""
    free = _edges(definition, (n for n, step in definition.steps.items() if not step.bounded))
    reach = {name: _reachable(free, targets) for name, targets in free.items()}
    covered: set[str] = set()
    problems = []
    for name in free:
        if name in reach[name] and name not in covered:
            covered |= {other for other in reach[name] if name in reach[other]}
            cycle = _shortest_cycle(free, name)
            field = next(f for f, t in definition.steps[name].targets() if t == cycle[1])
            text = f"unbounded cycle {' -> '.join(cycle)}: {_CYCLE_HINT}"
            problems.append(problem(source, text, name, field))
    return problems


def _shortest_cycle(edges: Mapping[str, list[str]], start: str) -> list[str]:
    """The shortest path from ``start`` back to itself (one exists)."""
    parent: dict[str, str] = {}
    pending = deque([start])
    while pending:
        name = pending.popleft()
        for target in edges[name]:
            if target == start:
                chain = [name]
                while chain[-1] != start:
                    chain.append(parent[chain[-1]])
                return [*reversed(chain), start]
            if target not in parent:
                parent[target] = name
                pending.append(target)
    raise AssertionError(f"no cycle through {start!r}")
