"""Write the API's OpenAPI document to docs/openapi.json (tests/test_api_cli.py checks
that the file is current).

    python scripts/openapi.py [--check]

``--check`` writes nothing and exits 1 when the file differs from the app's document.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

from jobledger import Engine, FunctionRegistry
from jobledger.api.app import create_app
from jobledger.api.settings import ApiSettings

TARGET = Path(__file__).resolve().parents[1] / "docs" / "openapi.json"


def document() -> str:
    """The app's document, as the file holds it. The app needs an engine to exist, not
    to describe itself: a throwaway SQLite store serves."""
    with tempfile.TemporaryDirectory() as directory:
        store = f"sqlite:///{directory}/openapi.db"
        with Engine.open(store, registry=FunctionRegistry()) as engine:
            app = create_app(engine, ApiSettings())
            return json.dumps(app.openapi(), indent=2, ensure_ascii=False) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="Only say whether it is current.")
    options = parser.parse_args()
    text = document()
    if options.check:
        current = TARGET.is_file() and TARGET.read_text(encoding="utf-8") == text
        print(f"{TARGET}: {'current' if current else 'out of date: run scripts/openapi.py'}")
        return 0 if current else 1
    TARGET.write_text(text, encoding="utf-8")
    print(f"wrote {TARGET}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
