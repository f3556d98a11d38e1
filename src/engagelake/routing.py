"""Routes of the one dispatch: path patterns with parameters, the contract of a handler, and
the router that matches each request of a batch against a route table.

Track and export are vectorized passes run by the batch itself (`batch.py`); identity endpoints run in
vectorized runs (`rules/identity/endpoints.py`); every other resource (SCIM, preference centers, catalogs,
translations) is a handler `handler(ctx, request) -> Response` that reads `ctx.state` and
writes through `ctx.write(changes)`, so its effects join the batch and commit atomically with it.
The route table itself is built in `routes.py`, above `resources/` (which import this module).
"""

from __future__ import annotations

import dataclasses
import enum
import json
import math
import re
import uuid
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import date, datetime, time
from decimal import Decimal
from typing import TYPE_CHECKING, Any, Protocol
from urllib.parse import parse_qsl

import orjson
import polars as pl

from engagelake.rules import messages as M
from engagelake.rules.counts import TOO_MANY
from engagelake.rules.state import Changes, State

if TYPE_CHECKING:
    from engagelake.link_keys import LinkKeys


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
    def seed(self) -> str: ...  # the store's seed (service_ids, IDs); in every ledger row: no secret

    @property
    def link_keys(self) -> LinkKeys: ...  # the keys that sign recipients' links (`link_keys.py`)

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
    return "/" + path.strip("/"), query_dict(parse_qsl(query, keep_blank_values=True))


def query_dict(pairs: Iterable[tuple[str, str]]) -> dict[str, Any]:
    """Query parameters as a handler reads them: a name written as a list (`external_id[]=1&
    external_id[]=2`, as the hosted API's GETs take several users) gives every value, in order;
    any other name its last value, as before."""
    query: dict[str, Any] = {}
    for name, value in pairs:
        if name.endswith("[]"):
            query.setdefault(name, []).append(value)
        else:
            query[name] = value
    return query


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

    def body_refusal(self, method: str, path: str, body: Any) -> Response | None:
        """The 400 that `routed` answers for this body (it cannot be parsed, or holds what JSON
        cannot carry), or None; `method` and `path` name a route (`route_of`). The server asks
        before it queues a request, so that no such body joins a batch."""
        method = method.upper()
        path, _ = split_path(path)
        endpoint = next(methods[method] for regex, methods in self.routes if regex.match(path))
        try:
            self._json_body(body, method, endpoint)
        except _Bad as bad:
            return bad.response
        except RecursionError:  # nothing of the parse should recurse; should it, the request's own 400
            return _too_deep(endpoint).response
        return None

    def routed(self, request: Any) -> Routed:
        """One request as a batch keeps it (`Routed`): a bulk request as its text only, one
        that routes nowhere, or whose body or query cannot be read, as its 400, 404 or 405
        response. Nothing one request holds makes the batch fail."""
        try:
            endpoint, routed, text = self._route(request)
        except _Bad as bad:
            return None, None, bad.response
        except RecursionError:  # as in `body_refusal`
            return None, None, _too_deep(None).response
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
        if extra:  # as an HTTP client would send it: datetimes as text; what JSON cannot hold refused
            try:
                extra = _plain(extra, "query", escape=True)
            except _Unheld as unheld:
                raise _Bad(400, unheld.message) from None
        # URL text reaches handlers that echo it: lone surrogates (no HTTP client can send one) escaped
        query = {printable(k): printable(v) if isinstance(v, str) else v for k, v in {**query, **(extra or {})}.items()}
        params = {k: printable(v) for k, v in match.groupdict().items()}
        return endpoint, Request(method, path, body, params, query), text

    def _json_body(self, body: Any, method: str, endpoint: str | Handler) -> tuple[Any, str]:
        """The body as data and as JSON text, or raise _Bad: not JSON, nested deeper than
        MAX_BODY_DEPTH, holding a Python value JSON cannot (a set, a lone surrogate: named with
        its place), or a number JSON text cannot carry (beyond a double's range, or NaN), which
        orjson would write as null. A body given in Python is read as an HTTP client would send
        it: datetimes and dates as ISO 8601 text, decimals as numbers (`_plain`)."""
        given = not isinstance(body, str | bytes | bytearray | memoryview)  # data, not JSON text
        try:
            if not given:
                body = _loads(body) if method != "GET" or body else None
            # proves the body is JSON data (a bulk pass reads only this text)
            data = orjson.dumps(body, default=_json_default, option=_PASSED_THROUGH)
        except RecursionError:  # `json.loads` reading the nesting after a number beyond a double
            raise _too_deep(endpoint) from None
        except orjson.JSONDecodeError as error:  # orjson reads no deeper than 1,024 levels
            raise (_too_deep(endpoint) if "depth limit" in str(error) else _Bad(400, M.BAD_JSON)) from None
        except ValueError:
            raise _Bad(400, M.BAD_JSON) from None
        except TypeError:  # orjson refused a value, or the nesting: find which, and where
            try:
                _plain(body, "body")
            except _Unheld as unheld:
                raise _refusal(unheld.message, endpoint) from None
            raise _Bad(400, M.BAD_JSON) from None
        reads_data = given and not (isinstance(endpoint, str) and endpoint != "export")  # a handler, an export
        # only a body whose text holds null can have lost a number (a byte search, then a C encoder)
        if b"null" in data and (endpoint not in self.checks_numbers or reads_data) \
                and (where := _non_finite(body)) is not None:
            if endpoint not in self.checks_numbers:
                raise _refusal(M.NON_FINITE_NUMBER.format(where=printable(where)), endpoint)
            try:  # the handler checks its numbers: they stay as they are
                body = _plain(body, "body")
            except _Unheld as unheld:  # not reached: orjson wrote the body
                raise _refusal(unheld.message, endpoint) from None
        elif reads_data:
            body = orjson.loads(data)  # what an HTTP client would have sent: datetimes as text, tuples as arrays
        # a bulk pass's count limits, before DuckDB expands every element (`rules/counts.py`)
        if isinstance(endpoint, str) and (count := TOO_MANY.get(endpoint)) is not None \
                and (message := count(body)) is not None:
            raise _refusal(message, endpoint)
        return body, data.decode()


def _refusal(message: str, endpoint: str | Handler | None) -> _Bad:
    """A body's 400: a track request's in the fatal shape, with `errors`."""
    return _Bad(400, message, {"message": message, "errors": [message]} if endpoint == "track" else None)


def _too_deep(endpoint: str | Handler | None) -> _Bad:
    return _refusal(M.BODY_TOO_DEEP.format(most=M.MAX_BODY_DEPTH), endpoint)


class _Unheld(Exception):
    """A value JSON cannot hold, with the message that names its place."""

    def __init__(self, message: str):
        super().__init__(message)
        self.message = message


# orjson hands these to `_json_default` rather than writing them itself, so that a bulk pass's
# text says what `_plain` gives a handler: isoformat() text, and no dataclass written as an object
_PASSED_THROUGH = orjson.OPT_PASSTHROUGH_DATETIME | orjson.OPT_PASSTHROUGH_DATACLASS
INT64_MIN, UINT64_MAX = -(2**63), 2**64 - 1  # the integers orjson writes


def _json_default(value: Any) -> Any:
    """What orjson writes for a datetime, date, time or Decimal; TypeError for anything else."""
    if isinstance(value, datetime | date | time):
        return value.isoformat()
    if isinstance(value, Decimal):
        return _decimal_number(value)
    if isinstance(value, float):  # a subclass orjson does not write (numpy's float64)
        return float(value)
    raise TypeError(type(value).__name__)


def _decimal_number(value: Decimal) -> int | float:
    """The number an HTTP client's JSON text for `value` (`str(value)`, as simplejson writes
    it) reads as: `Decimal("7")` 7, `Decimal("12.50")` 12.5; NaN and numbers beyond a double
    as a float that is not finite, for the caller to refuse with where it is."""
    if value.is_nan():
        return math.nan
    if value.is_infinite():
        return math.inf if value > 0 else -math.inf
    try:
        number = orjson.loads(str(value))
    except orjson.JSONDecodeError:  # beyond a double: orjson refuses `1E+999`
        return math.inf if value > 0 else -math.inf
    assert isinstance(number, int | float)
    return number


def _where(holder: str, key: str) -> str:
    return f"{holder}.{printable(key)}"


def _shown(where: str) -> str:
    return where.removeprefix("body.")


def _text(value: str, where: str, escape: bool) -> str:
    """`value`, or its escape (`escape`), or raise _Unheld when it holds a lone surrogate."""
    if value.isascii():
        return value
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        if escape:
            return printable(value)
        raise _Unheld(M.LONE_SURROGATE.format(where=_shown(where))) from None
    return value


def _plain(value: Any, where: str, *, escape: bool = False) -> Any:
    """`value` (a body, or a query, given in Python) as the JSON data an HTTP client would send
    for it: a datetime, date or time as its ISO 8601 text (`isoformat()`), a Decimal as a
    number, a tuple as an array, a UUID as text, an enum member as its value. Raises _Unheld,
    naming the first place in document order, for anything else JSON cannot hold (a set, a
    range, bytes, an object), a key that is not text, an integer beyond 64 bits, nesting
    deeper than MAX_BODY_DEPTH, and a lone surrogate (`escape`: written as its escape instead).
    Iterative: a body may nest deep."""
    root: list[Any] = [None]
    # (holder, slot: an index, or a key still to check, where, depth, value)
    stack: list[tuple[Any, Any, str, int, Any]] = [(root, 0, where, 0, value)]
    while stack:
        holder, slot, at, depth, node = stack.pop()
        if isinstance(holder, dict):
            if not isinstance(slot, str):
                raise _Unheld(M.KEY_NOT_TEXT.format(where=_shown(at), key=printable(repr(slot))[:80],
                                                    kind=type(slot).__name__))
            slot = _text(slot, _where(at, slot), escape)
            at = _where(at, slot)
        if isinstance(node, enum.Enum):
            node = node.value
        if isinstance(node, str):
            node = _text(node, at, escape)
        elif node is None or isinstance(node, bool):
            pass
        elif isinstance(node, float):
            node = float(node)  # a subclass (numpy's float64) as the float it is
        elif isinstance(node, int):
            if not INT64_MIN <= node <= UINT64_MAX:
                raise _Unheld(M.INTEGER_BEYOND_64_BITS.format(where=_shown(at)))
        elif isinstance(node, dict | list | tuple):
            if depth >= M.MAX_BODY_DEPTH:
                raise _Unheld(M.BODY_TOO_DEEP.format(most=M.MAX_BODY_DEPTH))
            if isinstance(node, dict):  # its keys are checked, and set in order, as they are reached
                out: Any = {}
                stack.extend((out, key, at, depth + 1, item) for key, item in reversed(node.items()))
            else:
                out = [None] * len(node)
                stack.extend((out, i, f"{at}[{i}]", depth + 1, item) for i, item in reversed(list(enumerate(node))))
            node = out
        elif isinstance(node, datetime | date | time):
            node = node.isoformat()
        elif isinstance(node, Decimal):
            node = _decimal_number(node)
        elif isinstance(node, uuid.UUID):
            node = str(node)
        else:
            kind = "dataclass" if dataclasses.is_dataclass(node) else type(node).__name__
            raise _Unheld(M.VALUE_NOT_JSON.format(where=_shown(at), kind=kind))
        holder[slot] = node
    return root[0]


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
            head = _repr([method, path, query])
        return head + b"\t" + text.encode() + b"\n"
    return b"!" + _repr(request) + b"\n"


def _repr(value: Any) -> bytes:
    """`repr(value)` as UTF-8; a value nested too deep for `repr` (whose request answers 400
    all the same) as its type's name."""
    try:
        shown = repr(value)
    except RecursionError:
        shown = f"<{type(value).__name__} nested too deep>"
    return shown.encode("utf-8", "backslashreplace")


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
    """Where the first number that is not finite sits in `body` (`attributes[0].score`, a
    Decimal's number included), or None."""
    try:
        json.dumps(body, allow_nan=False, default=_json_default)
    except (ValueError, TypeError):  # TypeError: what `_json_default` refuses, held for the walk
        pass
    else:
        return None
    stack: list[tuple[Any, str]] = [(body, "body")]
    while stack:  # depth first, in document order; iterative: bodies may nest deep
        node, where = stack.pop()
        if isinstance(node, Decimal):
            node = _decimal_number(node)
        if isinstance(node, float) and not math.isfinite(node):
            return where.removeprefix("body.")
        if isinstance(node, dict):
            stack.extend((value, f"{where}.{key}") for key, value in reversed(node.items()))
        elif isinstance(node, list | tuple):
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
