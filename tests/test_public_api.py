"""The public API is what docs/api.md lists, exactly: ``jobledger.__all__``. What users read
(README, docs, examples) imports only from it, and no module reaches for another's
``_private`` names."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import jobledger
import jobledger.testing

ROOT = Path(__file__).resolve().parents[1]
API_DOC = ROOT / "docs" / "api.md"
PUBLIC_MODULES = {"jobledger", "jobledger.adapters.otel", "jobledger.testing"}
"""Where users import from: the package, the module that needs the otel extra, and the kit
to test workflows."""
TESTING = "## Testing (jobledger.testing)"
"""The section of docs/api.md that lists ``jobledger.testing.__all__`` instead."""


def documented_names(testing: bool = False) -> list[str]:
    """The names docs/api.md lists for ``jobledger`` (or, with ``testing``, for
    ``jobledger.testing``: its own section, up to the next one)."""
    text = API_DOC.read_text()
    before, _, kit = text.partition(TESTING)
    kit, heading, after = kit.partition("\n## ")
    section = kit if testing else before + heading + after
    return re.findall(r"^- `(\w+)`: ", section, re.MULTILINE)


def test_all_is_exactly_the_documented_list() -> None:
    names = documented_names()
    assert len(names) == len(set(names)), "a name is documented twice"
    assert sorted(jobledger.__all__) == sorted(names)
    assert len(jobledger.__all__) == len(set(jobledger.__all__))


def test_the_testing_kits_all_is_exactly_its_documented_list() -> None:
    names = documented_names(testing=True)
    assert len(names) == len(set(names)), "a name is documented twice"
    assert sorted(jobledger.testing.__all__) == sorted(names)
    namespace: dict[str, object] = {}
    exec("from jobledger.testing import *", namespace)
    for name in names:
        assert getattr(jobledger.testing, name) is namespace[name], name


def test_every_public_name_resolves() -> None:
    namespace: dict[str, object] = {}
    exec("from jobledger import *", namespace)
    for name in jobledger.__all__:
        assert getattr(jobledger, name) is namespace[name], name


def test_readme_docs_and_examples_import_only_public_modules() -> None:
    texts = [ROOT / "README.md", *(ROOT / "docs").glob("*.md"), *(ROOT / "examples").rglob("*.py")]
    imports = re.compile(r"^\s*(?:from (jobledger[\w.]*) import|import (jobledger[\w.]*))", re.M)
    found = {
        (path.relative_to(ROOT).as_posix(), module)
        for path in texts
        for match in imports.finditer(path.read_text())
        for module in match.groups()
        if module is not None and module not in PUBLIC_MODULES
    }
    assert found == set()


def private_imports(root: Path) -> set[tuple[str, str, str]]:
    """``from x import _y`` where x is another module of the project."""
    found = set()
    for path in root.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.ImportFrom):
                continue
            own = node.level > 0 or (node.module or "").split(".")[0] == "jobledger"
            for alias in node.names if own else ():
                if alias.name.startswith("_") and not alias.name.startswith("__"):
                    found.add((path.relative_to(ROOT).as_posix(), node.module or "", alias.name))
    return found


def test_no_module_imports_another_modules_private_name() -> None:
    assert private_imports(ROOT / "src" / "jobledger") == set()
    assert private_imports(ROOT / "projections") == set()


def test_python_dash_m_jobledger_runs_the_command_line() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "jobledger", "--help"], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stderr
    assert "Usage: jobledger" in result.stdout
