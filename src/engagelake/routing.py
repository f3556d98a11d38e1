"""Routes of the one dispatch: path patterns with parameters, the contract of a handler, and
the router that matches each request of a batch against a route table.

Track and export are vectorized passes run by the batch itself (`batch.py`); identity endpoints run in
vectorized runs (`rules/identity/endpoints.py`); every other resource (SCIM, preference centers, catalogs,
translations) is a handler `handler(ctx, request) -> Response` that reads `ctx.state` and
writes through `ctx.write(changes)`, so its effects join the batch and commit atomically with it.
The route table itself is built in `routes.py`, above `resources/` (which import this module).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Protocol
from urllib.parse import parse_qsl

import orjson
import polars as pl

from engagelake.rules import messages as M
from engagelake.rules.state import Changes, State


@dataclass(frozen=True)
class Response:
    """Status and JSON body (a `str` for HTML pages, None for no body), as the REST API answers."""

    status: int
    body: Any


@dataclass(frozen=True)
class Request:
    """One routed request: path parameters extracted, query string merged into `query`."""

    method: str
    path: str
    body: Any
    params: dict[str, str] = field(default_factory=dict)
    query: dict[str, Any] = field(default_factory=dict)


class Context(Protocol):
    """What a handler sees of the batch it runs in."""

    @property
    def state(self) -> State: ...  # every earlier request of the batch included

    @property
    def clock(self) -> datetime: ...  # the batch's clock reading

    @property
    def seed(self) -> str: ...  # the store's secret seed (service_ids, signed tokens)

    def write(self, changes: Changes) -> None: ...  # apply now, commit with the batch

    def track(self, body: dict[str, Any]) -> Response: ...  # run a /users/track request now


Handler = Callable[[Context, Request], Response]


class Client(Protocol):
    """What the friendly resource methods (`ws.catalogs`, `ws.scim`, ...) use of the
    workspace: they call it as any client would, so `resources/` never imports `workspace`."""

    @property
    def state(self) -> State: ...  # the committed store as rules see it

    def call(self, method: str, path: str, body: Any = None, query: dict[str, Any] | None = None) -> Response: ...

    def write(self, build: Callable[[Context], None]) -> None: ...  # a batch of its own

    def table(self, name: str) -> pl.LazyFrame: ...  # a table's current rows


def compile_pattern(pattern: str) -> re.Pattern[str]:
    """`/catalogs/{catalog_name}/items` -> a regex with one named group per parameter."""
    parts = re.split(r"\{(\w+)\}", pattern)
    regex = "".join(re.escape(p) if i % 2 == 0 else f"(?P<{p}>[^/]+)" for i, p in enumerate(parts))
    return re.compile(f"^{regex}$")


def split_path(path: str) -> tuple[str, dict[str, Any]]:
    """Normalized path and the query parameters written into it (`/x?a=1` -> `/x`, {a: "1"}).
    A path is a path, never a URL: `//[` or `//users/track` name no host (a URL parser would
    raise on the first and read `users` as a host in the second)."""
    path, _, query = path.partition("#")[0].partition("?")
    return "/" + path.strip("/"), dict(parse_qsl(query, keep_blank_values=True))


def printable(text: str) -> str:
    """`text` as it can be echoed in a response: a lone surrogate (not encodable as UTF-8, so
    not as JSON text) is written as its escape, `\\ud800`."""
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


# One request as a batch keeps it: (endpoint, routed request, body as JSON text), or the
# error response of a request that routes nowhere. The bulk endpoints keep only the text.
Routed = tuple[str | Handler | None, Request | None, str | Response]


class _Bad(Exception):
    def __init__(self, status: int, message: str, body: dict[str, Any] | None = None):
        super().__init__(message)
        self.response = Response(status, body or {"message": message})


class Router:
    """A route table (`{pattern: {METHOD: endpoint}}`, an endpoint being the name of a pass the
    batch runs itself or a handler), compiled. `checks_numbers`: the handlers that check the
    numbers of their bodies themselves (the router refuses other bodies' non-finite numbers)."""

    def __init__(self, table: Mapping[str, Mapping[str, str | Handler]], *,
                 checks_numbers: Collection[str | Handler] = ()):
        self.table = table
        self.routes = [(compile_pattern(p), methods) for p, methods in table.items()]
        self.checks_numbers = checks_numbers

    def route_of(self, method: str, path: str) -> tuple[str | None, Response | None]:
        """The route pattern a request names (`/catalogs/{catalog_name}/items`), or the 404/405
        response `call` gives it: the server checks permissions by pattern before the dispatch."""
        method = method.upper()
        path, _ = split_path(path)
        for (pattern, methods), (regex, _) in zip(self.table.items(), self.routes, strict=True):
            if regex.match(path):
                if method not in methods:
                    return None, Response(405, {"message": M.METHOD_NOT_ALLOWED.format(
                        method=printable(method), path=printable(path), allowed=", ".join(methods))})
                return pattern, None
        return None, Response(404, {"message": M.NOT_FOUND.format(method=printable(method), path=printable(path))})

    def routed(self, request: Any) -> Routed:
        """One request as a batch keeps it (`Routed`): a bulk request as its text only, one
        that routes nowhere as its 400, 404 or 405 response."""
        try:
            endpoint, routed, text = self._route(request)
        except _Bad as bad:
            return None, None, bad.response
        if isinstance(endpoint, str) and endpoint != "export":
            return endpoint, None, text  # its dicts go: a pass reads the text
        return endpoint, routed, text

    def _route(self, request: Any) -> tuple[str | Handler, Request, str]:
        """(endpoint, routed request, body as JSON text) of one request, or raise _Bad."""
        if not isinstance(request, dict) or not isinstance(request.get("path"), str):
            raise _Bad(400, M.BAD_REQUEST)
        method = str(request.get("method", "")).upper()
        path, query = split_path(request["path"])
        extra = request.get("query")
        if extra is not None and not (isinstance(extra, dict) and all(isinstance(k, str) for k in extra)):
            raise _Bad(400, M.BAD_QUERY.format(kind=type(extra).__name__))
        found = next(((m, methods) for pattern, methods in self.routes if (m := pattern.match(path))), None)
        if found is None:
            raise _Bad(404, M.NOT_FOUND.format(method=printable(method), path=printable(path)))
        match, methods = found
        if method not in methods:
            raise _Bad(405, M.METHOD_NOT_ALLOWED.format(method=printable(method), path=printable(path),
                                                        allowed=", ".join(methods)))
        endpoint = methods[method]
        body, text = self._json_body(request.get("body"), method, endpoint)
        # URL text reaches handlers that echo it: lone surrogates (no HTTP client can send one) escaped
        query = {printable(k): printable(v) if isinstance(v, str) else v for k, v in {**query, **(extra or {})}.items()}
        params = {k: printable(v) for k, v in match.groupdict().items()}
        return endpoint, Request(method, path, body, params, query), text

    def _json_body(self, body: Any, method: str, endpoint: str | Handler) -> tuple[Any, str]:
        """The body as data and as JSON text, or raise _Bad: not JSON, or holding a number JSON
        text cannot carry (beyond a double's range, or NaN), which orjson would write as null."""
        try:
            if isinstance(body, str | bytes | bytearray | memoryview):
                body = _loads(body) if method != "GET" or body else None
            data = orjson.dumps(body)  # proves the body is plain JSON data
        except (orjson.JSONDecodeError, TypeError, ValueError):
            raise _Bad(400, M.BAD_JSON) from None
        # only a body whose text holds null can have lost a number (a byte search, then a C encoder)
        if b"null" in data and endpoint not in self.checks_numbers and (where := _non_finite(body)) is not None:
            message = M.NON_FINITE_NUMBER.format(where=printable(where))
            raise _Bad(400, message, {"message": message, "errors": [message]} if endpoint == "track" else None)
        return body, data.decode()


def digest_line(request: Any, item: Routed) -> bytes:
    """One request's line in the digest of a keyed batch: method, path, query (sorted) and the
    body's JSON text (its key order kept: attribute order is meaningful); a request that routes
    nowhere is digested as given."""
    endpoint, routed, text = item
    if isinstance(text, str):
        method, path, query = str(request.get("method", "")).upper(), request["path"], request.get("query")
        try:
            head = orjson.dumps([method, path, query], option=orjson.OPT_SORT_KEYS | orjson.OPT_NON_STR_KEYS,
                                default=repr)
        except TypeError:  # a lone surrogate in the path or the query
            head = repr([method, path, query]).encode("utf-8", "backslashreplace")
        return head + b"\t" + text.encode() + b"\n"
    return b"!" + repr(request).encode("utf-8", "backslashreplace") + b"\n"


def _loads(text: str | bytes | bytearray | memoryview) -> Any:
    """JSON text as data. A number beyond a double's range (`1e999`), which orjson refuses, is
    read as an infinity, for the caller to refuse with where it is; NaN and Infinity literals
    are not JSON."""
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError as error:
        if "infinity" not in str(error):
            raise

        def no_constants(name: str) -> Any:
            raise ValueError(name)

        return json.loads(bytes(text) if isinstance(text, memoryview) else text, parse_constant=no_constants)


def _non_finite(body: Any) -> str | None:
    """Where the first number that is not finite sits in `body` (`attributes[0].score`), or None."""
    try:
        json.dumps(body, allow_nan=False)
    except ValueError:
        pass
    else:
        return None
    stack: list[tuple[Any, str]] = [(body, "body")]
    while stack:  # depth first, in document order; iterative: bodies may nest deep
        node, where = stack.pop()
        if isinstance(node, float) and not math.isfinite(node):
            return where.removeprefix("body.")
        if isinstance(node, dict):
            stack.extend((value, f"{where}.{key}") for key, value in reversed(node.items()))
        elif isinstance(node, list):
            stack.extend((value, f"{where}[{i}]") for i, value in reversed(list(enumerate(node))))
    return None


def as_json(responses: list[Response]) -> list[Response]:
    """The responses exactly as their JSON text reads back, which is also what the ledger keeps
    and a replay of the batch answers: never NaN, Infinity, datetimes or Python-only values.
    Text that JSON cannot carry (a lone surrogate, a non-string key, an integer beyond 64 bits)
    is escaped or written as text instead of failing the batch's commit."""
    bodies = [r.body for r in responses]
    try:
        text = orjson.dumps(bodies)
    except TypeError:
        text = orjson.dumps([_encodable(body) for body in bodies])
    return [Response(r.status, body) for r, body in zip(responses, orjson.loads(text), strict=True)]


def _encodable(value: Any) -> Any:
    """`value` with what JSON text cannot hold escaped (only for a body orjson refused)."""
    try:
        orjson.dumps(value)
    except TypeError:
        pass
    else:
        return value
    if isinstance(value, str):
        return printable(value)
    if isinstance(value, dict):
        return {printable(str(key)): _encodable(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_encodable(item) for item in value]
    return printable(str(value))  # an integer beyond 64 bits, or an object JSON has no form for
