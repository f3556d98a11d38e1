"""`engagelake serve`: the REST API over HTTP (FastAPI under uvicorn) on a store."""

from __future__ import annotations

from typing import Annotated

import typer

from engagelake.cli.common import DEFAULT_STORE, Store, fail, input_errors


def serve(
    store: Store = DEFAULT_STORE,
    host: Annotated[str, typer.Option(help="Interface to listen on (0.0.0.0: every interface).")] = "127.0.0.1",
    port: Annotated[int, typer.Option(min=0, max=65535, help="TCP port.")] = 8000,
    rate_limits: Annotated[
        str, typer.Option("--rate-limits", help="on: the specification's limits; off: none (benchmarks, trusted callers).")
    ] = "on",
    rate_limit: Annotated[
        list[str] | None,
        typer.Option("--rate-limit", metavar="NAME=REQUESTS/SECONDS",
                     help="Override one limit, e.g. --rate-limit export=500/60 (repeatable; names in docs/server.md)."),
    ] = None,
    key_limit: Annotated[
        list[str] | None,
        typer.Option("--key-limit", metavar="NAME=REQUESTS/SECONDS",
                     help="Hold every API key to a limit of its own as well, e.g. --key-limit export=50/60: one "
                          "key then cannot spend the workspace's whole limit (repeatable; docs/server.md)."),
    ] = None,
    max_body_bytes: Annotated[int, typer.Option(min=1, help="Largest request body accepted (413 beyond).")] = 10 * 1024 * 1024,
    max_queued: Annotated[int, typer.Option(min=1, help="Requests waiting to be applied before new ones get 503 "
                                                         "with Retry-After.")] = 2000,
    public_url: Annotated[
        str | None, typer.Option(help="The URL recipients reach this server at (behind a proxy: the proxy's), "
                                      "recorded in the store as the base of preference center links.")
    ] = None,
    access_log: Annotated[
        bool, typer.Option(help="Log one line per request (off: a busy server's event loop does less; the "
                                "proxy in front usually logs them).")
    ] = True,
    layer: Annotated[
        bool, typer.Option(help="Answer a batch once its write-ahead log record is synced, and write batches to "
                                "the tables together, every --flush-seconds (--no-layer: a Delta commit per "
                                "batch; docs/operations.md).")
    ] = True,
    flush_seconds: Annotated[
        float, typer.Option(min=0.01, help="With the layer: how old its oldest batch gets before a flush writes "
                                           "it to the tables, where other processes see it.")
    ] = 1.0,
    openapi: Annotated[
        bool, typer.Option("--openapi/--no-openapi", help="Serve the API's document at /openapi.json and its "
                                                          "pages at /docs (they answer without a key).")
    ] = False,
    link_keys: Annotated[
        str | None, typer.Option(envvar="ENGAGELAKE_LINK_KEYS", show_default=False,
                                 help="The key file that signs and checks preference links (default: the store's "
                                      "_secrets/link-keys.json; required for a store on object storage).")
    ] = None,
) -> None:
    """Serve the API over HTTP: every endpoint, with keys, SCIM tokens, rate limits.

    Create a key first (engagelake keys create --name NAME --permissions all); GET /healthz answers once the server is ready. SIGTERM or Ctrl-C finishes and commits the requests in flight, writes the layer to the tables, then stops.

    Examples:
      engagelake serve --store data/store --port 8000
      engagelake serve --rate-limits off --host 0.0.0.0
      engagelake serve --key-limit export=50/60 --key-limit track=300/3
      engagelake serve --public-url https://prefs.example.com
    """
    from engagelake.api.limits import DEFAULT_LIMITS, KEY_LIMIT_NAMES, parse_limit

    if rate_limits not in ("on", "off"):
        fail(f"--rate-limits takes on or off, not {rate_limits!r}")
    limits = dict(DEFAULT_LIMITS)
    for text in rate_limit or []:
        try:
            name, limit = parse_limit(text)
        except ValueError as error:
            fail(f"--rate-limit: {error}")
        limits[name] = limit
    key_limits = {}
    for text in key_limit or []:
        try:
            name, limit = parse_limit(text, KEY_LIMIT_NAMES)
        except ValueError as error:
            fail(f"--key-limit: {error}")
        key_limits[name] = limit
    with input_errors():
        import uvicorn

        from engagelake import Workspace
        from engagelake.api import create_app

        _log_to_stderr("engagelake")  # the writer's reports (INFO), beside uvicorn's own lines
        workspace = Workspace.open(store, layer=layer, flush_seconds=flush_seconds, link_keys=link_keys)
        if workspace.link_keys.path is None:
            import logging

            logging.getLogger("engagelake").warning(
                "no link keys for this store on object storage: preference links can be neither made nor "
                "checked (each answers 500); pass --link-keys PATH or set ENGAGELAKE_LINK_KEYS")
        if public_url is not None:
            workspace.preference_centers.set_public_url(public_url)
        app = create_app(workspace, rate_limits=limits if rate_limits == "on" else None, key_limits=key_limits,
                         max_body_bytes=max_body_bytes, max_queued=max_queued, openapi=openapi)
        uvicorn.run(app, host=host, port=port, log_level="info", access_log=access_log)


def _log_to_stderr(name: str) -> None:
    """INFO and above of logger `name` on stderr, in uvicorn's style (uvicorn configures only its
    own loggers, so these would otherwise be dropped)."""
    import logging

    logger = logging.getLogger(name)
    if not logger.handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(levelname)s:     %(name)s: %(message)s"))
        logger.addHandler(handler)
    logger.setLevel(logging.INFO)
