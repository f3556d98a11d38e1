"""The one contract: `Workspace.open(uri)`, then `call` one request or `apply` many.

`call` is `apply` of one request, so the fast path and the one-by-one path are the same code.
`apply` splits a batch into runs of track requests (one vectorized pass each) separated by
reads (exports see every earlier request of the batch), then commits the batch atomically.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import duckdb
import orjson
import polars as pl
import pyarrow as pa

from engagelake.errors import StaleStoreError, StoreError
from engagelake.rules import messages as M
from engagelake.rules.export import export_frame, export_ids
from engagelake.rules.parse import parse_track
from engagelake.rules.state import Changes, State, apply_changes
from engagelake.rules.track import apply_track
from engagelake.rules.validate import validate_track
from engagelake.store.delta import DeltaStore
from engagelake.store.schema import TABLES

Clock = Callable[[], datetime]
# Long runs of track requests are applied in passes of at most this many requests (up to ~170k
# objects): the same result as one pass (sequential application is the invariant), bounded memory.
TRACK_RUN_MAX = 2000
ROUTES: dict[str, dict[str, str]] = {
    "/users/track": {"POST": "track"},
    "/users/export/ids": {"POST": "export"},
}


@dataclass(frozen=True)
class Response:
    status: int
    body: dict[str, Any] | None


def _now() -> datetime:
    return datetime.now(UTC)


class _Bad(Exception):
    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.response = Response(status, {"message": message})


def _route(request: Any) -> tuple[str, Any]:
    """(endpoint name, decoded body) of one request, or raise _Bad with its answer."""
    if not isinstance(request, dict) or not isinstance(request.get("path"), str):
        raise _Bad(400, "a request must be an object with string method and path")
    method = str(request.get("method", "")).upper()
    path = "/" + request["path"].strip("/")
    methods = ROUTES.get(path)
    if methods is None:
        raise _Bad(404, M.NOT_FOUND.format(method=method, path=path))
    if method not in methods:
        raise _Bad(405, M.METHOD_NOT_ALLOWED.format(method=method, path=path, allowed=", ".join(methods)))
    body = request.get("body")
    try:
        if isinstance(body, str | bytes | bytearray | memoryview):
            body = orjson.loads(body)
        text = orjson.dumps(body).decode()  # proves the body is plain JSON data
    except (orjson.JSONDecodeError, TypeError):
        raise _Bad(400, M.BAD_JSON) from None
    return methods[method], (body, text)


class Workspace:
    """A customer-engagement store and the API over it."""

    def __init__(self, store: DeltaStore, clock: Clock, *, fields_required: bool):
        self.store = store
        self.clock = clock
        self.fields_required = fields_required
        self._state: State | None = store.load()

    @classmethod
    def open(cls, uri: str | Path, *, clock: Clock | None = None, seed: str | None = None,
             fields_required: bool = True) -> Workspace:
        """Open (or create) the store at `uri`. `clock()` gives aware datetimes; `seed` fixes
        the service_id sequence of a new store; `fields_required` is the export setting."""
        return cls(DeltaStore(uri, seed=seed), clock or _now, fields_required=fields_required)

    @property
    def state(self) -> State:
        if self.store.refresh() or self._state is None:
            self._state = self.store.load()
        return self._state

    # --- requests ------------------------------------------------------------------------------
    def call(self, method: str, path: str, body: Any = None, query: dict[str, Any] | None = None) -> Response:
        """One request: exactly `apply([request])[0]`."""
        return self.apply([{"method": method, "path": path, "body": body, "query": query}])[0]

    def apply(self, requests: Iterable[dict[str, Any]], *, idempotency_key: str | None = None) -> list[Response]:
        """Apply many requests in order, as one atomic batch; same result as one by one."""
        requests = list(requests)
        for _ in range(3):  # another writer may commit between our read and our commit
            if idempotency_key is not None:
                stored = self.store.find_batch(idempotency_key)
                if stored is not None:
                    return [Response(s, b) for s, b in stored]
            try:
                return self._apply_once(requests, idempotency_key)
            except StaleStoreError:
                continue
        raise StoreError(f"the store at {self.store.uri} kept changing under this batch; retry later")

    def _apply_once(self, requests: list[dict[str, Any]], idempotency_key: str | None) -> list[Response]:
        state = self.state
        # Let the pre-batch view go as soon as the first pass has replaced it: a long batch then
        # holds two versions of the state at a time, not three. After a failure the next read
        # reloads it from the store.
        self._state = None
        return self._apply_passes(state, requests, idempotency_key)

    def _apply_passes(self, state: State, requests: list[dict[str, Any]], idempotency_key: str | None
                      ) -> list[Response]:
        clock = self.clock()
        responses: list[Response | None] = [None] * len(requests)
        all_changes = Changes()
        pending: list[tuple[int, Any]] = []

        def flush() -> None:
            nonlocal state
            if not pending:
                return
            state = self._track(state, pending, responses, all_changes, clock)
            pending.clear()

        for i, request in enumerate(requests):
            try:
                endpoint, (body, text) = _route(request)
            except _Bad as bad:
                responses[i] = bad.response
                continue
            if endpoint == "track":
                pending.append((i, text))
                if len(pending) >= TRACK_RUN_MAX:
                    flush()
            else:
                flush()
                status, out = export_ids(state, body, clock, fields_required=self.fields_required)
                responses[i] = Response(status, out)
        flush()
        final = [r for r in responses if r is not None]
        assert len(final) == len(requests)
        if all_changes or idempotency_key is not None:
            self.store.commit(
                all_changes, key=idempotency_key, responses=[[r.status, r.body] for r in final],
                next_profile_n=state.next_profile_n, next_update_seq=state.next_update_seq,
            )
        self._state = state
        return final

    def _track(self, state: State, pending: list[tuple[int, Any]], responses: list[Response | None],
               all_changes: Changes, clock: datetime) -> State:
        bodies = pa.table({
            "req": pa.array(range(len(pending)), pa.int64()),
            "body": [text for _, text in pending],
        })
        parsed = parse_track(bodies)
        valid = validate_track(parsed)
        outcome = apply_track(state, parsed, valid, clock=clock, seed=self.store.head.seed)
        for req, (status, body) in outcome.responses.items():
            responses[pending[req][0]] = Response(status, body)
        all_changes.extend(outcome.changes)
        return apply_changes(state, outcome.changes, next_profile_n=outcome.next_profile_n,
                             next_update_seq=outcome.next_update_seq)

    # --- reading -------------------------------------------------------------------------------
    def table_names(self) -> list[str]:
        return list(TABLES)

    def table(self, name: str) -> pl.DataFrame:
        """The current rows of one store table."""
        if name not in TABLES:
            raise KeyError(f"no table {name!r}; tables: {', '.join(TABLES)}")
        return self.state[name]

    def sql(self, query: str) -> pl.DataFrame:
        """Run DuckDB SQL over the current tables (named as in `table_names()`)."""
        con = duckdb.connect()
        try:
            for name in TABLES:
                con.register(name, self.state[name].to_arrow())
            out = pl.from_arrow(con.sql(query).to_arrow_table())
        finally:
            con.close()
        assert isinstance(out, pl.DataFrame)
        return out

    def export_users(self, fields_to_export: list[str] | None = None) -> list[dict[str, Any]]:
        """Every user, shaped as `/users/export/ids` shapes them, in creation order."""
        users = self.state["profiles"].sort("created_seq").select("service_id")
        return export_frame(self.state, users, fields_to_export, self.clock())
