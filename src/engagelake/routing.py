"""Routes of the one dispatch: path patterns with parameters, and the contract of a handler.

Track and export are vectorized passes run by the workspace itself; identity endpoints run in
vectorized runs (`rules/identity/endpoints.py`); every other resource (SCIM, preference centers, catalogs,
translations) is a handler `handler(ctx, request) -> Response` that reads `ctx.state` and
writes through `ctx.write(changes)`, so its effects join the batch and commit atomically with it.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Protocol
from urllib.parse import parse_qsl

import polars as pl

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
