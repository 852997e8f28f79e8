"""The import graph keeps the layers: arrows point down only (docs/architecture.md).

core (job, transition, orchestrator, workflows, ports, ...) <- adapters <- audit <-
projections/ <- the process level (the composition root, the runners, the CLI, the demo).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PROCESS = (
    "jobledger.engine",
    "jobledger.engine_parts",
    "jobledger.commands",
    "jobledger.schedules",
    "jobledger.admitting",
    "jobledger.erasing",
    "jobledger.ticking",
    "jobledger.reading",
    "jobledger.runner",
    "jobledger.kafka_runner",
    "jobledger.cli",
    "jobledger.api",
)
PROCESS += ("jobledger.bootstrap", "jobledger.supervisor", "jobledger.demo", "jobledger.__init__")
LAYERS = {"core": 0, "adapters": 1, "audit": 2, "projections": 3, "process": 4}


def layer(module: str) -> str:
    if module == "projections" or module.startswith("projections."):
        return "projections"
    if module == "jobledger" or any(module == p or module.startswith(p + ".") for p in PROCESS):
        return "process"
    for name in ("adapters", "audit"):
        if module.startswith(f"jobledger.{name}"):
            return name
    return "core"


def modules() -> dict[str, Path]:
    found = {}
    for base, package in ((ROOT / "src", "jobledger"), (ROOT, "projections")):
        for path in sorted((base / package).rglob("*.py")):
            found[".".join(path.relative_to(base).with_suffix("").parts)] = path
    return found


def imports(path: Path, every: dict[str, Path]) -> set[str]:
    """Every project module this file imports, TYPE_CHECKING blocks and local imports
    included: a type-only back-edge is still a back-edge in the design. ``from pkg
    import name`` imports the submodule ``pkg.name`` when there is one, else ``pkg``."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            for alias in node.names:
                submodule = f"{node.module}.{alias.name}"
                found.add(submodule if is_module(submodule, every) else node.module)
    return {name for name in found if is_module(name, every)}


def is_module(name: str, every: dict[str, Path]) -> bool:
    return name in every or f"{name}.__init__" in every


def back_edges() -> list[str]:
    every = modules()
    found = []
    for module, path in every.items():
        own = layer(module.removesuffix(".__init__"))
        for target in sorted(imports(path, every)):
            if LAYERS[layer(target)] > LAYERS[own]:
                found.append(f"{module} ({own}) imports {target} ({layer(target)})")
    return found


def test_no_module_imports_a_layer_above_its_own() -> None:
    assert back_edges() == []


@pytest.mark.parametrize(
    ("module", "expected"),
    [
        ("jobledger.orchestrator", "core"),
        ("jobledger.workflows.resolver", "core"),
        ("jobledger.adapters.kafka.worker", "adapters"),
        ("jobledger.audit.replay", "audit"),
        ("projections.outbox", "projections"),
        ("jobledger.cli.commands_ops", "process"),
        ("jobledger.engine", "process"),
    ],
)
def test_each_module_has_the_layer_the_map_gives_it(module: str, expected: str) -> None:
    assert layer(module) == expected


def test_the_check_sees_a_back_edge(tmp_path: Path) -> None:
    """The scan finds an adapter importing the facade, even under TYPE_CHECKING."""
    source = tmp_path / "adapter.py"
    source.write_text(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n"
        "    from jobledger.engine import Engine\n"
        "from projections.outbox import Outbox\n"
    )
    found = imports(source, modules())
    assert found == {"jobledger.engine", "projections.outbox"}
    assert all(LAYERS[layer(target)] > LAYERS["adapters"] for target in found)


def test_the_package_facade_counts_as_the_process_level(tmp_path: Path) -> None:
    source = tmp_path / "core.py"
    source.write_text("from jobledger import Engine\nfrom jobledger import chain\n")
    assert imports(source, modules()) == {"jobledger", "jobledger.chain"}
    assert layer("jobledger") == "process" and layer("jobledger.chain") == "core"
