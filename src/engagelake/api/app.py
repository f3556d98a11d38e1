"""The REST server: the specification's API over HTTP, with API keys, SCIM tokens and rate
limits, in front of the one dispatch (`Workspace.apply`, through the group-commit writer).

The server adds HTTP, authentication and limits, never rules: a request's status and body are
exactly what `Workspace.call` answers. `create_app(workspace)` builds the app; `engagelake
serve` runs it under uvicorn (`docs/server.md`).
"""

from __future__ import annotations

import asyncio
import re
import threading
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import orjson
from fastapi import FastAPI, Request
from fastapi.openapi.utils import get_openapi
from fastapi.responses import HTMLResponse
from fastapi.responses import Response as HttpResponse
from pydantic.json_schema import models_json_schema

from engagelake.api import access_log, pages
from engagelake.api.limits import (
    DEFAULT_LIMITS,
    KEY_LIMIT_NAMES,
    LIMITED,
    PER_ADDRESS,
    PER_LINK,
    Limit,
    RateLimiter,
)
from engagelake.api.writer import MAX_BATCH, MAX_QUEUED, GroupCommitWriter, WriterBusy
from engagelake.permissions import ENDPOINT_PERMISSIONS, SCIM, SIGNED_LINK
from engagelake.requests.bodies import REQUEST_BODIES
from engagelake.requests.models import ExportResponse, TrackResponse
from engagelake.resources.credentials import ApiKey, KeyRing
from engagelake.resources.preference_centers import PREVIEW, link_key, refuse_link
from engagelake.resources.scim import ERROR_SCHEMA
from engagelake.routes import ROUTE_TABLE, ROUTER, route_of
from engagelake.routing import Response, query_dict, split_path
from engagelake.workspace import Workspace

MAX_BODY_BYTES = 10 * 1024 * 1024
# the hosted API's payload limit of its user data endpoints (answered 413 there too): a bulk
# pass costs up to about 130 times its body in memory (a track body of many keys, issue 56)
USER_BODY_BYTES = 4 * 1024 * 1024
# a request refused before its body is read is read no further than this, only to tell a key
# sent in the body (its own message) from no key at all
PEEK_BYTES = 64 * 1024
CREDENTIALS_TTL_S = 1.0  # a key created or revoked by another process counts within this
BEARER = re.compile(r"^\s*Bearer\s+(\S+)\s*$", re.IGNORECASE)
RESPONSE_MODELS: dict[tuple[str, str], Any] = {
    ("POST", "/users/track"): TrackResponse, ("POST", "/users/export/ids"): ExportResponse}
# the routes that answer a page (text/html): a preference center's, for staff and recipients
HTML_ROUTES = frozenset({
    ("GET", "/preference_center/v1/{preferenceCenterExternalID}/page"),
    ("POST", "/preference_center/v1/{preferenceCenterExternalID}/submit"),
    ("GET", "/preferences/{preferenceCenterExternalID}"), ("POST", "/preferences/{preferenceCenterExternalID}")})
# the staff page renders a signed 7-day submit URL: only for a key that may make links (issue
# 56); for a key with `preference_center.get` alone, a preview whose form posts nowhere
STAFF_PAGE = ("GET", "/preference_center/v1/{preferenceCenterExternalID}/page")
LINK_PERMISSION = "preference_center.link"
SUCCESS_STATUS: dict[tuple[str, str], int] = {  # for the document (docs/semantics.md: success statuses)
    ("POST", "/users/track"): 201, ("POST", "/users/merge"): 202, ("POST", "/catalogs"): 201,
    ("PUT", "/catalogs/{catalog_name}/items"): 202, ("DELETE", "/catalogs/{catalog_name}/items"): 202,
    ("POST", "/scim/v2/Users"): 201, ("DELETE", "/scim/v2/Users/{id}"): 204,
    ("POST", "/subscription/status/set"): 201, ("POST", "/v2/subscription/status/set"): 201,
    **{("POST", path): 201 for path in ("/email/status", "/email/blocklist", "/email/bounce/remove", "/email/spam/remove")}}


class _Credentials:
    """The store's active keys and tokens, read again when older than `ttl` seconds, through a
    workspace of their own (the writer's is the writer thread's alone)."""

    def __init__(self, uri: str, ttl: float):
        self.uri, self.ttl = uri, ttl
        self._reader: Workspace | None = None
        self._kept: tuple[KeyRing, float] | None = None  # the ring and when it was read: one attribute, set at once
        self._lock = threading.Lock()

    def fresh(self) -> KeyRing | None:
        """The ring when it is younger than `ttl`, else None (read it again with `ring`): a
        request then checks its key on the event loop, with no hop to a thread."""
        kept = self._kept
        return kept[0] if kept is not None and time.monotonic() - kept[1] <= self.ttl else None

    def ring(self) -> KeyRing:
        with self._lock:
            if (ring := self.fresh()) is not None:
                return ring
            self._reader = self._reader or Workspace.open(self.uri, create=False)
            ring = self._reader.credentials.key_ring()
            self._kept = (ring, time.monotonic())
            return ring


def _json(status: int, body: Any, headers: dict[str, str] | None = None) -> HttpResponse:
    return HttpResponse(orjson.dumps(body), status_code=status, media_type="application/json", headers=headers)


def _answer(response: Response, headers: dict[str, str]) -> HttpResponse:
    if response.body is None:
        return HttpResponse(status_code=response.status, headers=headers)
    if isinstance(response.body, str):  # a preference center page
        return HTMLResponse(response.body, status_code=response.status, headers=headers)
    return _json(response.status, response.body, headers)


def _refused(message: str, headers: dict[str, str] | None = None) -> HttpResponse:
    return _json(401, {"message": f"Invalid API key: {message}"}, headers)


def _key_in_body_refused(headers: dict[str, str] | None = None) -> HttpResponse:
    return _refused("send the API key in the Authorization: Bearer header, not in the request body", headers)


def _busy(queued: int, headers: dict[str, str]) -> HttpResponse:
    return _json(503, {"message": f"the server is busy ({queued:,} requests are waiting to be applied); nothing "
                                  "of this request was stored, retry after Retry-After seconds"},
                 {**headers, "Retry-After": "1"})


def _scim_refused(detail: str, headers: dict[str, str] | None = None) -> HttpResponse:
    return _json(401, {"schemas": [ERROR_SCHEMA], "detail": detail, "status": 401}, headers)


def _link_center(path: str) -> str:
    """The center a signed link's path names: `/preferences/{id}` or `.../{id}/submit`, the
    path read as the router reads it (`split_path`: `//preferences/{id}/` names the same)."""
    path, _ = split_path(path)
    parts = path.split("/")
    return parts[-2] if path.endswith("/submit") else parts[-1]


async def _read_body(request: Request, limit: int) -> bytes | None:
    """The body, or None when it is over `limit` bytes (read no further than that)."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        return None
    parts, size = [], 0
    async for part in request.stream():
        size += len(part)
        if size > limit:
            return None
        parts.append(part)
    return b"".join(parts)


def _key_in_body(body: bytes) -> bool:
    if b'"api_key"' not in body:
        return False
    try:
        parsed = orjson.loads(body)
    except orjson.JSONDecodeError:
        return False
    return isinstance(parsed, dict) and "api_key" in parsed


def create_app(workspace: Workspace, *, rate_limits: dict[str, Limit] | None = DEFAULT_LIMITS,
               key_limits: dict[str, Limit] | None = None,
               clock: Callable[[], float] = time.time, max_body_bytes: int = MAX_BODY_BYTES,
               max_batch: int = MAX_BATCH, credentials_ttl: float = CREDENTIALS_TTL_S,
               max_queued: int = MAX_QUEUED, openapi: bool = False) -> FastAPI:
    """The FastAPI app over `workspace`. `rate_limits` None turns limits off; `key_limits`
    (names of `KEY_LIMIT_NAMES`) holds each API key to its own limit as well, counted before
    the workspace's, so a key past its own spends none of the workspace's (off with
    `rate_limits` None); `clock` gives the unix seconds the limits count in; `openapi` serves
    `/openapi.json` and `/docs` (off by default: they answer without a key, and map every
    endpoint for whoever asks)."""
    unknown = set(key_limits or {}) - set(KEY_LIMIT_NAMES)
    if unknown:
        raise ValueError(f"key_limits: {', '.join(sorted(unknown))} not among {', '.join(KEY_LIMIT_NAMES)}")
    writer = GroupCommitWriter(workspace, max_batch=max_batch, max_queued=max_queued)
    limiter = RateLimiter(dict(rate_limits), clock) if rate_limits is not None else None
    per_key = RateLimiter(dict(key_limits), clock) if key_limits and rate_limits is not None else None
    credentials = _Credentials(str(workspace.store.uri), credentials_ttl)

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        access_log.install()  # after uvicorn configured its loggers: no link token in its lines
        await asyncio.to_thread(credentials.ring)  # the store opens before the first request
        writer.start()
        try:
            yield
        finally:  # uvicorn has finished the requests in flight: apply what queued, then stop
            await asyncio.to_thread(writer.stop)
            await asyncio.to_thread(workspace.close)

    shown: dict[str, Any] = {} if openapi else {"openapi_url": None, "docs_url": None, "redoc_url": None}
    app = FastAPI(title="engagelake", version="1", lifespan=lifespan, **shown,
                  description="The customer-engagement REST API over an engagelake store.")
    app.state.writer = writer

    def anonymous(request: Request) -> tuple[HttpResponse | None, dict[str, str]]:
        """Count a request refused for its credential against its client address's limit
        (`anonymous`): (the 429 past it, or None; the limit's headers, for the refusal)."""
        if limiter is None or PER_ADDRESS not in limiter.limits:
            return None, {}
        allowed, headers = limiter.hit(PER_ADDRESS, request.client.host if request.client else "")
        if allowed:
            return None, headers
        if pages.is_page(request.url.path):
            return pages.error(429, headers=headers), headers
        return _json(429, {"message": f"too many requests without a valid credential from this address "
                                      f"({headers['X-RateLimit-Limit']} per {limiter.limits[PER_ADDRESS].seconds} s); "
                                      f"retry after X-RateLimit-Reset"}, headers), headers

    async def authorize(request: Request, permission: str, endpoint: str) -> HttpResponse | None:
        """The refusal of a request whose headers do not carry what `permission` needs, or
        None. Reads no body: a caller with no right to the endpoint cannot make the server
        read megabytes. A refusal for a missing or bad credential counts against the client
        address's limit (`anonymous`), and past it is a 429."""
        if permission == SIGNED_LINK:  # a bad link is refused here, never queued
            refused = refuse_link(workspace.link_keys, _link_center(request.url.path),
                                  request.query_params.get("token"), workspace.clock())
            if refused is None:
                return None
            # no link keys to check it with (500) is the server's fault, not the caller's
            over, headers = anonymous(request) if refused[0] < 500 else (None, {})
            if over is not None:
                return over
            if pages.is_page(request.url.path):
                return pages.error(*refused, headers=headers)
            return _json(refused[0], {"message": refused[1]}, headers)  # as the submit route answers it
        if (ring := credentials.fresh()) is None:  # older than its TTL: read again, off the event loop
            ring = await asyncio.to_thread(credentials.ring)
        match = BEARER.match(request.headers.get("authorization", ""))
        if permission == SCIM:
            origin = ring.scim_token(match.group(1)) if match else None
            if origin is not None and request.headers.get("x-request-origin") == origin:
                return None
            over, headers = anonymous(request)
            if over is not None:
                return over
            if origin is None:
                return _scim_refused("a valid SCIM token is required in the Authorization: Bearer header", headers)
            return _scim_refused("the X-Request-Origin header does not match this SCIM token's origin", headers)
        key = ring.api_key(match.group(1)) if match is not None else None
        if key is None:
            over, headers = anonymous(request)  # before the peek: past the limit, nothing is read
            if over is not None:
                return over
            if match is not None:
                return _refused("the key is not known, or was revoked", headers)
            peek = await _read_body(request, PEEK_BYTES)
            if peek is not None and _key_in_body(peek):
                return _key_in_body_refused(headers)
            return _refused("no key sent; send it in the Authorization: Bearer header", headers)
        if not key.allows(permission):
            return _refused(f"key {key.name!r} lacks the permission {permission!r} that {endpoint} needs")
        return None

    async def dispatch(request: Request) -> HttpResponse:
        if pages.is_page(request.url.path):  # a recipient's browser: every answer a page
            answered = await dispatch_api(request)
            if answered.headers.get("content-type", "").startswith("text/html"):
                return answered
            try:
                message = orjson.loads(bytes(answered.body)).get("message")
            except (orjson.JSONDecodeError, AttributeError):
                message = None
            return pages.error(answered.status_code, message)
        return await dispatch_api(request)

    async def key_of(request: Request) -> ApiKey | None:
        """The API key of a request (authorized for its endpoint), or None (a SCIM token, a link)."""
        if (ring := credentials.fresh()) is None:
            ring = await asyncio.to_thread(credentials.ring)
        match = BEARER.match(request.headers.get("authorization", ""))
        return ring.api_key(match.group(1)) if match is not None else None

    async def holds(request: Request, permission: str) -> bool:
        """Whether the API key of a request (authorized for its endpoint) also has `permission`."""
        key = await key_of(request)
        return key is not None and key.allows(permission)

    def over_limit(method: str, path: str, pattern: str, headers: dict[str, str], seconds: int,
                   whose: str = "") -> HttpResponse:
        if pages.is_page(path):
            return pages.error(429, headers=headers)
        return _json(429, {"message": f"rate limit of {method} {pattern}{whose} exceeded "
                                      f"({headers['X-RateLimit-Limit']} requests per {seconds} s); "
                                      f"retry after X-RateLimit-Reset"}, headers)

    async def dispatch_api(request: Request) -> HttpResponse:
        method, path = request.method, request.url.path
        pattern, error = route_of(method, path)
        if error is not None:
            return _answer(error, {})
        assert pattern is not None
        permission = ENDPOINT_PERMISSIONS[(method, pattern)]
        refused = await authorize(request, permission, f"{method} {pattern}")
        if refused is not None:
            return refused
        most = min(max_body_bytes, USER_BODY_BYTES) if pattern.startswith("/users/") else max_body_bytes
        body = await _read_body(request, most)
        if body is None:
            return _json(413, {"message": f"request body over {most:,} bytes; split it into smaller requests"})
        if permission not in (SCIM, SIGNED_LINK) and _key_in_body(body):
            return _key_in_body_refused()
        if pages.is_page(path):
            body = pages.form_body(body, request.headers.get("content-type", ""))
        if writer.full():  # before the rate limit: a request turned away spends none of it
            return _busy(writer.max_queued, {})
        headers: dict[str, str] = {}
        limit, who = LIMITED.get((method, pattern)), ""
        if permission == SIGNED_LINK:  # counted per link, once it verifies (a bad one the route refuses)
            key = link_key(workspace.link_keys, _link_center(path), request.query_params.get("token"),
                           workspace.clock())
            limit, who = (PER_LINK, key) if key is not None else (None, "")
        if per_key is not None and limit in per_key.limits and (holder := await key_of(request)) is not None:
            allowed, headers = per_key.hit(limit, holder.key_id)  # the key's own, first
            if not allowed:
                return over_limit(method, path, pattern, headers, per_key.limits[limit].seconds,
                                  f" for key {holder.name!r}")
        if limiter is not None and limit is not None:
            allowed, shared = limiter.hit(limit, who)
            if not allowed:
                return over_limit(method, path, pattern, shared, limiter.limits[limit].seconds)
            if not headers or int(shared["X-RateLimit-Remaining"]) < int(headers["X-RateLimit-Remaining"]):
                headers = shared  # the headers of the limit nearer its end
        query = query_dict(request.query_params.multi_items())
        if (method, pattern) == STAFF_PAGE and not await holds(request, LINK_PERMISSION):
            query[PREVIEW] = "true"  # its form would be a link: a preview, posting nowhere
        queued = {"method": method, "path": path, "body": body or None,  # no body: as `call` without one
                  "query": query}
        # a body that cannot be parsed never joins a batch: its 400, as `call` answers it. The
        # writer still takes the bytes and parses them again (about 30 us a track request): the
        # parsed data of the requests waiting made the writer's garbage collections longer, 7%
        # of its time with 64 clients (docs/decisions.md, issue 56)
        if (refusal := ROUTER.body_refusal(method, path, queued["body"])) is not None:
            return pages.answer(refusal, headers) if pages.is_page(path) else _answer(refusal, headers)
        try:
            submitted = writer.submit(queued)
        except WriterBusy:
            return _busy(writer.max_queued, headers)
        response = await asyncio.wrap_future(submitted)
        if pages.is_page(path):
            return pages.answer(response, headers)
        return _answer(response, headers)

    @app.get("/healthz", include_in_schema=False)
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    for pattern, methods in ROUTE_TABLE.items():
        for method in methods:
            permission = ENDPOINT_PERMISSIONS[(method, pattern)]
            needs = {SCIM: "a SCIM token (Authorization: Bearer) and its X-Request-Origin",
                     SIGNED_LINK: "the signed token of the page's submit URL"}.get(
                         permission, f"an API key with the permission `{permission}`")
            parameters = [{"name": name, "in": "path", "required": True, "schema": {"type": "string"}}
                          for name in re.findall(r"\{(\w+)\}", pattern)]
            description = f"Needs {needs}."
            if pages.is_page(pattern):
                parameters.append({"name": "token", "in": "query", "required": True, "schema": {"type": "string"}})
                description += (" A recipient's page: every answer is HTML, errors included; the POST takes the"
                                " page's form (application/x-www-form-urlencoded) or a JSON object.")
            html: dict[str, Any] = {"response_class": HTMLResponse} if (method, pattern) in HTML_ROUTES else {}
            app.add_api_route(pattern, dispatch, methods=[method], summary=f"{method} {pattern}",
                              description=description, name=f"{method} {pattern}",
                              operation_id=method.lower() + re.sub(r"\W+", "_", pattern).rstrip("_"),
                              status_code=SUCCESS_STATUS.get((method, pattern), 200),
                              response_model=RESPONSE_MODELS.get((method, pattern)),
                              openapi_extra={"parameters": parameters} if parameters else None, **html)
    # anything else: the dispatch's 404 or 405, as JSON
    app.add_api_route("/{rest:path}", dispatch, include_in_schema=False,
                      methods=["GET", "POST", "PUT", "DELETE", "PATCH", "HEAD", "OPTIONS", "TRACE", "CONNECT"])

    def document() -> dict[str, Any]:  # the request bodies' models, for documentation only
        if app.openapi_schema is None:
            schema = get_openapi(title=app.title, version=app.version, description=app.description, routes=app.routes)
            models = sorted(set(REQUEST_BODIES.values()), key=lambda m: m.__name__)
            _, defs = models_json_schema([(m, "validation") for m in models], ref_template="#/components/schemas/{model}")
            schema.setdefault("components", {}).setdefault("schemas", {}).update(defs["$defs"])
            for (method, pattern), model in REQUEST_BODIES.items():
                schema["paths"][pattern][method.lower()]["requestBody"] = {"required": True, "content": {
                    "application/json": {"schema": {"$ref": f"#/components/schemas/{model.__name__}"}}}}
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = document  # type: ignore[method-assign]

    @app.exception_handler(Exception)
    async def failed(request: Request, error: Exception) -> HttpResponse:  # never a framework's page
        if pages.is_page(request.url.path):
            return pages.error(500)
        return _json(500, {"message": "internal error; the server log has the details"})

    return app
