"""The API served from a process's main thread, as ``jobledger serve`` does:
``python -m tests.support.serve_main STORE_URL KEYS_FILE``. Prints ``serving URL`` once
it accepts connections; SIGINT or SIGTERM (uvicorn's own handlers) stop it."""

from __future__ import annotations

import sys
import threading
from pathlib import Path

from jobledger import Engine, EngineConfig
from jobledger.api.server import serve_engine
from jobledger.api.settings import ApiSettings
from tests.support.http import api_registry


def main(store_url: str, keys_file: str) -> None:
    engine = Engine.open(
        store_url, registry=api_registry(), config=EngineConfig(store_url=store_url)
    )
    settings = ApiSettings(port=0, api_keys_file=Path(keys_file), sse_heartbeat_seconds=30)
    server = serve_engine(engine, settings)

    def announce() -> None:
        server.started.wait(30)
        print(f"serving {server.url}", flush=True)

    threading.Thread(target=announce, daemon=True).start()
    try:
        server.run()
    finally:
        engine.close()
    print("stopped", flush=True)


if __name__ == "__main__":
    main(*sys.argv[1:3])
