"""The import graph keeps the layers: arrows point down only (docs/architecture.md).

The folders are the layers: core (domain/, orchestration/, workflows/ and the options,
config.py) <- adapters/ <- audit/ <- projections/ <- engine/ (the composition root and the
facade) <- presentation/ <- api/ <- runtime/ (the supervisor and its runners) <- the
interfaces (cli/, demo/, the package itself).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
FOLDERS = {
    "domain": "core",
    "orchestration": "core",
    "workflows": "core",
    "config": "core",
    "adapters": "adapters",
    "audit": "audit",
    "projections": "projections",
    "engine": "engine",
    "presentation": "presentation",
    "api": "api",
    "runtime": "runtime",
    "cli": "interfaces",
    "demo": "interfaces",
    "testing": "interfaces",
}
ORDER = ("core", "adapters", "audit", "projections", "engine", "presentation", "api", "runtime")
LAYERS = {name: rank for rank, name in enumerate((*ORDER, "interfaces"))}


def layer(module: str) -> str:
    """The layer is the module's folder: ``jobledger.<folder>.<module>``."""
    parts = module.split(".")
    if parts[0] != "jobledger":
        raise ValueError(f"{module} is not a jobledger module")
    if len(parts) == 1 or parts[1] in ("__init__", "__main__"):
        return "interfaces"
    return FOLDERS[parts[1]]


def modules() -> dict[str, Path]:
    """Every module by its dotted name; projections/ (at the repository's top) installs
    as ``jobledger.projections``."""
    found = {}
    trees = (
        (ROOT / "src" / "jobledger", "jobledger"),
        (ROOT / "projections", "jobledger.projections"),
    )
    for base, package in trees:
        for path in sorted(base.rglob("*.py")):
            found[".".join((package, *path.relative_to(base).with_suffix("").parts))] = path
    return found


def test_every_folder_is_a_layer() -> None:
    """A new folder must be given its place in the map before its modules count."""
    folders = {
        p.name for p in (ROOT / "src" / "jobledger").iterdir() if (p / "__init__.py").exists()
    }
    assert folders == set(FOLDERS) - {"config"}
    top = {p.stem for p in (ROOT / "src" / "jobledger").glob("*.py")}
    assert top == {"__init__", "__main__", "config"}


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
        ("jobledger.orchestration.orchestrator", "core"),
        ("jobledger.workflows.resolver", "core"),
        ("jobledger.adapters.kafka.worker", "adapters"),
        ("jobledger.audit.replay", "audit"),
        ("jobledger.projections.outbox", "projections"),
        ("jobledger.engine.engine", "engine"),
        ("jobledger.api.app", "api"),
        ("jobledger.runtime.supervisor", "runtime"),
        ("jobledger.cli.commands_ops", "interfaces"),
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
        "    from jobledger.engine.engine import Engine\n"
        "from jobledger.projections.outbox import Outbox\n"
    )
    found = imports(source, modules())
    assert found == {"jobledger.engine.engine", "jobledger.projections.outbox"}
    assert all(LAYERS[layer(target)] > LAYERS["adapters"] for target in found)


def test_the_package_facade_counts_as_the_interfaces(tmp_path: Path) -> None:
    source = tmp_path / "core.py"
    source.write_text("from jobledger import Engine\nfrom jobledger.domain import chain\n")
    assert imports(source, modules()) == {"jobledger", "jobledger.domain.chain"}
    assert layer("jobledger") == "interfaces" and layer("jobledger.domain.chain") == "core"


def test_the_architecture_map_names_every_folder() -> None:
    """docs/architecture.md's map is the folder tree: each folder stands in it, in its layer."""
    text = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    block = text.split("## The map", 1)[1].split("```")[1]
    for folder in set(FOLDERS) - {"config"}:
        assert f"{folder}/" in block, f"the map does not show {folder}/"
