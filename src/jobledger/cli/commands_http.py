"""``jobledger serve``: the HTTP API (and the web console) over the configured store.

FastAPI and uvicorn are the ``http`` extra: they are imported when the command runs,
never when ``jobledger.cli`` is, and their absence is one clear error."""

from __future__ import annotations

from typing import Annotated

import typer

from jobledger.api import require_http
from jobledger.api.settings import ApiSettings, load_api_settings
from jobledger.cli.config_file import load_settings
from jobledger.cli.logs import LogFormat, LogFormatOption, LogLevel, LogLevelOption
from jobledger.cli.logs import configure as configure_logs
from jobledger.cli.reloading import reload_on_sighup
from jobledger.cli.session import ConfigOption, StoreOption, open_engine
from jobledger.domain.errors import ConfigError
from jobledger.domain.redaction import redact
from jobledger.orchestration.ports import Queue, Tick
from jobledger.presentation.terminal import console


class LeftToTheRunner:
    """The queue of ``serve`` on the local transport. The in-process queue of another
    process cannot be reached from here, and one in this process has no worker to drain
    it (it would only grow): a submitted or resumed job is ``queued`` in the store, and
    the runner's reconciler enqueues a queued job whose tick was lost (``jobledger run``
    counts one lost after about two seconds). ``jobledger run --http`` serves the API
    inside the runner, on its own queue; the kafka transport publishes each tick at once."""

    def enqueue(self, tick: Tick, *, delay_ms: int = 0, dedupe_key: str | None = None) -> None:
        """Nothing to do: see the class."""


def serve(
    host: Annotated[
        str | None,
        typer.Option(
            "--host", help="Address to listen on (default 127.0.0.1).", show_default=False
        ),
    ] = None,
    port: Annotated[
        int | None,
        typer.Option(
            "--port",
            metavar="PORT",
            min=0,
            max=65535,
            help="Port to listen on (default 8080).",
            show_default=False,
        ),
    ] = None,
    store: StoreOption = None,
    config: ConfigOption = None,
    log_level: LogLevelOption = LogLevel.INFO,
    log_format: LogFormatOption = LogFormat.TEXT,
) -> None:
    """Serve the HTTP API (/v1, /openapi.json, /healthz, /readyz) until Ctrl-C.

    Settings: --host/--port, then JOBLEDGER_HTTP_* variables, then the config file's
    [http] table. Callers authenticate with a bearer JWT (jwt_secret or jwks_file, with
    jwt_issuer and jwt_audience) or an API key (api_keys_file). Needs the http extra:
    pip install 'jobledger[http]'.
    """
    configure_logs(log_level, log_format)
    require_http()
    settings = load_settings(config, store)
    api = load_api_settings(settings.http, settings.config_file, host=host, port=port)
    require_auth(api)
    kafka = settings.engine.transport == "kafka"
    queue: Queue | None = None if kafka else LeftToTheRunner()
    with open_engine(
        store, config, purpose="serve", definitions=True, mode="create", queue=queue, metrics=True
    ) as engine:
        from jobledger.api.server import serve_engine

        # Bound here (a port in use is a one-line error); Ctrl-C or SIGTERM ends the live
        # event streams, finishes the requests in hand and returns (exit 0); a second
        # Ctrl-C forces it.
        server = serve_engine(engine, api)
        console().print(f"jobledger serve: {server.url} (Ctrl-C to stop)", soft_wrap=True)
        console().print(
            f"  store: {redact(engine.config.store_url)}; transport: {engine.config.transport}; "
            f"auth: {', '.join(_auth_kinds(api))}",
            soft_wrap=True,
        )
        with reload_on_sighup(engine, None, server):
            server.run()
        console().print("stopped cleanly")


def require_auth(api: ApiSettings, command: str = "serve") -> None:
    """Refuse to serve with no way to authenticate callers (``serve``, ``run --http``)."""
    if not _auth_kinds(api):
        raise ConfigError(
            f"{command} needs a way to authenticate callers: set jwt_secret or jwks_file (with "
            "jwt_issuer and jwt_audience), or api_keys_file, in [http] of the config file "
            "or as JOBLEDGER_HTTP_* variables"
        )


def _auth_kinds(api: ApiSettings) -> list[str]:
    kinds = []
    if api.jwt_secret is not None:
        kinds.append("JWT HS256")
    if api.jwks_file is not None:
        kinds.append(f"JWT RS256/ES256 ({api.jwks_file})")
    if api.api_keys_file is not None:
        kinds.append(f"API keys ({api.api_keys_file})")
    return kinds
