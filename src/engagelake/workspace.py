"""The one contract: `Workspace.open(uri)`, then `call` one request or `apply` many.

`call` is `apply` of one request, so the fast path and the one-by-one path are the same code.
`apply` splits a batch into runs of track requests (one vectorized pass each) separated by
reads (exports see every earlier request of the batch), then commits the batch atomically.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import hashlib
import json
import math
import os
import random
import re
import shutil
import sys
import tempfile
import threading
import time
import uuid
import weakref
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import wait as wait_for
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, ParamSpec, TypeVar

import orjson
import polars as pl
import polars.selectors as cs
import pyarrow as pa

from engagelake.cpus import one_cpu
from engagelake.errors import (
    ConfigError,
    EngagelakeError,
    IdempotencyKeyReused,
    IdempotentResponsesExpired,
    RequestError,
    StaleStoreError,
    StoreError,
    StoreExists,
)
from engagelake.resources import RESOURCE_ROUTES
from engagelake.resources.campaigns import Campaigns
from engagelake.resources.catalogs import CHECKS_NUMBERS, Catalogs
from engagelake.resources.credentials import Credentials
from engagelake.resources.preference_centers import PreferenceCenters
from engagelake.resources.scim import Scim
from engagelake.routing import (
    Context,
    Handler,
    Request,
    Response,
    compile_pattern,
    printable,
    split_path,
)
from engagelake.rules import messages as M
from engagelake.rules.export import export_frame, export_ids
from engagelake.rules.identity.cleanup import cleanup_push_profiles
from engagelake.rules.identity.endpoints import IDENTITY_PATHS, apply_identity
from engagelake.rules.identity.lineage import lineage_rows
from engagelake.rules.profile.parse import named_external_ids
from engagelake.rules.profile.reading import TrackReader, read_track
from engagelake.rules.profile.track import apply_track
from engagelake.rules.state import Changes, State, apply_changes
from engagelake.store import objects, scratch
from engagelake.store.ahead import ReadAhead
from engagelake.store.compaction import MIN_PART_ROWS, Part, Plan, Written
from engagelake.store.delta import RESPONSE_RETENTION, Compaction, DeltaStore, store_state
from engagelake.store.staging import StagedSource, Stages
from engagelake.tables.credentials import UNPUBLISHED
from engagelake.tables.schema import TABLES

if TYPE_CHECKING:
    import duckdb  # imported where used: a process that only reads never loads it

    from engagelake.store.check import Report
    from engagelake.store.forget import ForgetReport

Clock = Callable[[], datetime]
MEMORY_ENV = "ENGAGELAKE_MEMORY_LIMIT"
PUBLISHED_FOLDER = "current"  # where `publish` writes by default, inside the store
EXPORT_CHUNK_USERS = 50_000  # users per chunk of a streamed export of every user
# Long runs of track requests are applied in passes of at most this many requests (up to ~170k
# objects): the same result as one pass (sequential application is the invariant), bounded memory.
TRACK_RUN_MAX = 2000
# After a pass, a batch holding at least this many changed rows stages them to local files
# (`store/staging.py`) and reads them back as it needs them: memory follows the pass.
STAGE_ROWS = 100_000
# A pass of more request text than this leaves one CPU (`cpus.py`) for every CPU, for the rest of
# its batch: about 15,000 objects. A 10,000-object batch took 323-343 ms on one CPU against
# 365-371 ms on two; 30,000 objects 817-861 against 755-757 ms.
ONE_CPU_PASS_BYTES = 2 << 20
# how long a batch waits out other writers by default (`Workspace.open(retry_for=...)`)
RETRY_FOR_S = 60.0
# the specification's cap of /users/track requests on monthly-active-user plans: attributes,
# events and purchases of one request together (`Workspace.open(monthly_active_user_plan=True)`)
MAU_UPDATES_PER_REQUEST = 50
# `forget_check`: the shortest exported string searched for (shorter ones, such as country and
# language codes, are in every other user's rows too); identifiers and `values` are searched
# whatever their length
FORGET_MIN_CHARS = 3
# exported strings that are not the person's: the key the engine generates (kept on purpose
# after a delete, in `redirects` and the delete's lineage row) and names of categories every
# user shares (alias labels, app ids, platforms); times the engine wrote are skipped too
FORGET_SKIPPED = ("service_id", "alias_label", "app", "app_id", "platform")
_ENGINE_TIME = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d+)?Z$")
_JITTER = random.Random()  # retry jitter, not drawn from the caller's global generator
SEEN_SPOOL_BYTES = 16 << 20  # request text a batch keeps in memory for a retry (see `_Seen`)
# A batch whose track pass is full reads up to this much request text ahead, and the stored rows
# of the users it names once for all those passes (`_Ahead`, `store/ahead.py`); the text is
# searched a chunk at a time and waits in the spool, not in memory
READ_AHEAD_BYTES = 128 << 20
READ_AHEAD_CHUNK_BYTES = 16 << 20
# ... when the stored attributes hold at least this many rows. A 1M-object batch into 10M users
# (30M attribute rows): 20.8-21.4 s against 28.0-29.1 s, CPU 33-34 against 44-46 s, peak RSS
# 2.7 against 3.2 GiB; into 1M users (3M rows), where a pass decodes the whole table in 190 ms,
# 0.98x the time for 160 MiB more at the peak: not worth it there
READ_AHEAD_MIN_ROWS = 8_000_000
# ... and no more users than hold about this many attribute rows, as the store's rows a profile
# average (a profile of many attributes makes a window of fewer requests): the rows read ahead
# are held until the window's passes are done (1.75M rows for 583k users at 10M)
READ_AHEAD_MAX_ROWS = 4_000_000
# Endpoints the workspace runs itself: track passes, export reads, identity runs.
USER_ROUTES: dict[str, dict[str, str]] = {
    "/users/track": {"POST": "track"},
    "/users/export/ids": {"POST": "export"},
    **{path: {"POST": kind} for kind, path in IDENTITY_PATHS.items()},
}


def _routes() -> list[tuple[re.Pattern[str], dict[str, str | Handler]]]:
    return [(compile_pattern(p), methods) for p, methods in ROUTE_TABLE.items()]


ROUTE_TABLE: dict[str, dict[str, str | Handler]] = {
    **{p: dict(m) for p, m in USER_ROUTES.items()}, **{p: dict(m) for p, m in RESOURCE_ROUTES.items()}}
ROUTES = _routes()


def route_of(method: str, path: str) -> tuple[str | None, Response | None]:
    """The route pattern a request names (`/catalogs/{catalog_name}/items`), or the 404/405
    response `call` gives it: the server checks permissions by pattern before the dispatch."""
    method = method.upper()
    path, _ = split_path(path)
    for (pattern, methods), (regex, _) in zip(ROUTE_TABLE.items(), ROUTES, strict=True):
        if regex.match(path):
            if method not in methods:
                return None, Response(405, {"message": M.METHOD_NOT_ALLOWED.format(
                    method=printable(method), path=printable(path), allowed=", ".join(methods))})
            return pattern, None
    return None, Response(404, {"message": M.NOT_FOUND.format(method=printable(method), path=printable(path))})


def _strings(value: Any, key: str | None) -> Iterator[tuple[str | None, str]]:
    """(key, text) of every string leaf of an exported value, with the key of the object
    holding it (keys themselves are field and attribute names, not the person's)."""
    if isinstance(value, str):
        yield key, value
    elif isinstance(value, dict):
        for name, item in value.items():
            yield from _strings(item, name)
    elif isinstance(value, list):
        for item in value:
            yield from _strings(item, key)


# `Workspace.open_kept`'s stores, by location and thread: at most this many, the newest
KEPT_STORES = 8
_KEPT: dict[tuple[str, int], DeltaStore] = {}
_KEPT_LOCK = threading.Lock()


def _now() -> datetime:
    return datetime.now(UTC)


P = ParamSpec("P")
T = TypeVar("T")


def _errors_below() -> tuple[type[BaseException], ...]:
    """What the libraries under the store raise when a file is missing or unreadable."""
    from deltalake.exceptions import DeltaError

    below: list[type[BaseException]] = [OSError, DeltaError, pl.exceptions.PolarsError, pa.ArrowException]
    if (duck := sys.modules.get("duckdb")) is not None:  # loaded by whoever read through DuckDB
        below += [duck.IOException, duck.InvalidInputException]
    return tuple(below)


def _store_errors(method: Callable[P, T]) -> Callable[P, T]:
    """A Workspace method whose failures below the store become StoreError: StoreDamaged
    naming the file at fault, StoreReadOnly for a refused write (`DeltaStore.damaged`)."""

    @functools.wraps(method)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> T:
        try:
            return method(*args, **kwargs)
        except EngagelakeError:
            raise
        except _errors_below() as error:
            workspace = args[0]
            assert isinstance(workspace, Workspace)
            raise workspace.store.damaged(error) from error

    return wrapper


class _Bad(Exception):
    def __init__(self, status: int, message: str, body: dict[str, Any] | None = None):
        super().__init__(message)
        self.response = Response(status, body or {"message": message})


# One request as a batch keeps it: (endpoint, routed request, body as JSON text), or the
# error response of a request that routes nowhere. The bulk endpoints keep only the text.
Routed = tuple[str | Handler | None, Request | None, str | Response]


class _Seen:
    """The requests a batch has read, for a retry after another writer's commit. The text of
    bulk requests goes to a temporary file, held in memory up to `SEEN_SPOOL_BYTES`: a big
    batch's requests (about 127 MiB of text per 1M track objects) do not stay in memory."""

    def __init__(self) -> None:
        self.kept: list[Routed | tuple[str, int, int]] = []  # bulk: (endpoint, offset, length)
        self.file = tempfile.SpooledTemporaryFile(max_size=SEEN_SPOOL_BYTES)
        self.end = 0

    def add(self, request: Routed) -> Routed:
        endpoint, routed, text = request
        if isinstance(endpoint, str) and routed is None and isinstance(text, str):
            data = text.encode()
            self.file.seek(self.end)
            self.file.write(data)
            self.kept.append((endpoint, self.end, len(data)))
            self.end += len(data)
        else:
            self.kept.append(request)
        return request

    def text(self, n: int) -> str:
        """The text of the `n`-th request read, a bulk one."""
        _, offset, length = self.kept[n]
        assert isinstance(offset, int) and isinstance(length, int)
        self.file.seek(offset)
        return self.file.read(length).decode()

    def replay(self) -> Iterator[Routed]:
        for n, item in enumerate(list(self.kept)):
            endpoint, second, _ = item
            if isinstance(second, int):
                yield endpoint, None, self.text(n)
            else:
                yield item  # type: ignore[misc]

    def __enter__(self) -> _Seen:
        return self

    def __exit__(self, *exc: object) -> None:
        self.file.close()


class _Ahead:
    """A batch's requests (as `apply` routes them), read ahead when a track pass is full: the
    track requests that follow, up to `READ_AHEAD_BYTES` of text, are searched for the external
    IDs they name, so that the batch reads those users' stored rows once (`_Batch.read_ahead`),
    not once a pass. Requests read ahead keep their text in the batch's spool (`_Seen`): the
    `n`-th request routed is the spool's `n`-th."""

    def __init__(self, requests: Iterable[Routed], seen: _Seen):
        self.source = iter(requests)
        self.seen = seen
        self.waiting: collections.deque[int | Routed] = collections.deque()  # spooled track texts by number
        self.read = 0  # requests taken from `source`
        self.until = 0  # requests before this one were read ahead already

    def __iter__(self) -> Iterator[Routed]:
        while True:
            if self.waiting:
                waiting = self.waiting.popleft()
                yield ("track", None, self.seen.text(waiting)) if isinstance(waiting, int) else waiting
                continue
            item = next(self.source, None)
            if item is None:
                return
            self.read += 1
            yield item

    def covers(self, i: int) -> bool:
        """Whether request `i` was read ahead already."""
        return i < self.until

    def external_ids(self, texts: list[str], most: int) -> pl.Series | None:
        """The external IDs named by `texts` (the full pass's) and by the track requests that
        follow it, read ahead up to `READ_AHEAD_BYTES` of text, the next other request, or a
        chunk that brings the IDs found past `most` (None: no track request follows, and the
        pass reads its own rows)."""
        ids = pl.Series("external_id", [], pl.String)  # found in the chunks searched so far
        chunk, size, total = texts, sum(map(len, texts)), 0
        while total < READ_AHEAD_BYTES and ids.len() <= most:
            item = next(self.source, None)
            if item is None:
                break
            n, self.read = self.read, self.read + 1
            endpoint, _, text = item
            if endpoint != "track" or not isinstance(text, str):
                self.waiting.append(item)
                break
            self.waiting.append(n)
            chunk.append(text)
            size += len(text)
            total += len(text)
            if size >= READ_AHEAD_CHUNK_BYTES:
                ids = pl.concat([ids, named_external_ids(chunk)]).unique()
                chunk, size = [], 0
        self.until = self.read
        if total == 0:
            return None
        return pl.concat([ids, named_external_ids(chunk)]).unique() if chunk else ids


def _routed(request: Any) -> Routed:
    try:
        endpoint, routed, text = _route(request)
    except _Bad as bad:
        return None, None, bad.response
    if isinstance(endpoint, str) and endpoint != "export":
        return endpoint, None, text  # its dicts go: a pass reads the text
    return endpoint, routed, text


def _digest_line(request: Any, item: Routed) -> bytes:
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


def _route(request: Any) -> tuple[str | Handler, Request, str]:
    """(endpoint, routed request, body as JSON text) of one request, or raise _Bad."""
    if not isinstance(request, dict) or not isinstance(request.get("path"), str):
        raise _Bad(400, M.BAD_REQUEST)
    method = str(request.get("method", "")).upper()
    path, query = split_path(request["path"])
    extra = request.get("query")
    if extra is not None and not (isinstance(extra, dict) and all(isinstance(k, str) for k in extra)):
        raise _Bad(400, M.BAD_QUERY.format(kind=type(extra).__name__))
    found = next(((m, methods) for pattern, methods in ROUTES if (m := pattern.match(path))), None)
    if found is None:
        raise _Bad(404, M.NOT_FOUND.format(method=printable(method), path=printable(path)))
    match, methods = found
    if method not in methods:
        raise _Bad(405, M.METHOD_NOT_ALLOWED.format(method=printable(method), path=printable(path),
                                                    allowed=", ".join(methods)))
    endpoint = methods[method]
    body, text = _json_body(request.get("body"), method, endpoint)
    # URL text reaches handlers that echo it: lone surrogates (no HTTP client can send one) escaped
    query = {printable(k): printable(v) if isinstance(v, str) else v for k, v in {**query, **(extra or {})}.items()}
    params = {k: printable(v) for k, v in match.groupdict().items()}
    return endpoint, Request(method, path, body, params, query), text


def _json_body(body: Any, method: str, endpoint: str | Handler) -> tuple[Any, str]:
    """The body as data and as JSON text, or raise _Bad: not JSON, or holding a number JSON
    text cannot carry (beyond a double's range, or NaN), which orjson would write as null."""
    try:
        if isinstance(body, str | bytes | bytearray | memoryview):
            body = _loads(body) if method != "GET" or body else None
        data = orjson.dumps(body)  # proves the body is plain JSON data
    except (orjson.JSONDecodeError, TypeError, ValueError):
        raise _Bad(400, M.BAD_JSON) from None
    # only a body whose text holds null can have lost a number (a byte search, then a C encoder)
    if b"null" in data and endpoint not in CHECKS_NUMBERS and (where := _non_finite(body)) is not None:
        message = M.NON_FINITE_NUMBER.format(where=printable(where))
        raise _Bad(400, message, {"message": message, "errors": [message]} if endpoint == "track" else None)
    return body, data.decode()


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


def _as_json(responses: list[Response]) -> list[Response]:
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


class _Batch:
    """One `apply`: the evolving state, the changes to commit, the responses so far. Runs of
    consecutive track requests (and of same-kind identity requests) are applied as one pass."""

    def __init__(self, state: State, *, clock: datetime, seed: str, batch_id: str,
                 before_big: Callable[[], None] = lambda: None, max_updates: int | None = None,
                 release_cpu: Callable[[], None] = lambda: None):
        self._state = state
        # how track passes read their requests: in this process, or shared out (`apply`)
        self.read_track: TrackReader = read_track
        # the last pass's changes, until the state is next read: a pass that is staged next
        # never needs them folded into the rows in memory (`_stage`)
        self._unapplied: tuple[Changes, int, int] | None = None
        self.max_updates = max_updates  # track requests: attributes + events + purchases at most
        self.clock = clock
        self.seed = seed
        self.batch_id = batch_id  # names the batch in lineage rows
        self.changes = Changes()
        self.responses: list[Response | None] = []  # one per request, as they come
        self.pending: list[tuple[int, str]] = []
        self.pending_kind = "track"
        self.stages: Stages | None = None
        self.stored = state.source  # the store snapshot, under the stages
        # a big batch (a full pass, or enough changes to stage) first waits for the store's
        # run merge: the two would otherwise hold their memory at once
        self._before_big: Callable[[], None] | None = before_big
        # a batch runs on one CPU while its passes are small (`cpus.py`); a big one wants them all
        self._release_cpu = release_cpu
        self._ahead: Future[ReadAhead] | None = None  # rows being read ahead (`read_ahead`)

    @property
    def state(self) -> State:
        """The batch's state, every change written so far applied."""
        if self._unapplied is not None:
            changes, next_profile_n, next_update_seq = self._unapplied
            self._unapplied = None
            self._state = apply_changes(self._state, changes, next_profile_n=next_profile_n,
                                        next_update_seq=next_update_seq)
        return self._state

    def write(self, changes: Changes, *, next_profile_n: int | None = None,
              next_update_seq: int | None = None) -> None:
        state = self.state
        self.changes.extend(changes)
        self._unapplied = (changes, state.next_profile_n if next_profile_n is None else next_profile_n,
                           state.next_update_seq if next_update_seq is None else next_update_seq)

    def track(self, body: dict[str, Any]) -> Response:
        self.flush()
        out: list[Response | None] = [None]
        self._track_pass([(0, orjson.dumps(body).decode())], out)
        assert out[0] is not None
        return out[0]

    def add(self, i: int, kind: str, text: str) -> None:
        if self.pending and (kind != self.pending_kind or len(self.pending) >= TRACK_RUN_MAX):
            self.flush()
        self.pending_kind = kind
        self.pending.append((i, text))

    def flush(self, *, last: bool = False) -> None:
        """Apply the pending run as one pass (`last`: the batch's final pass, which
        `to_commit` stages or not)."""
        if not self.pending:
            return
        pending, self.pending = self.pending, []
        if len(pending) >= TRACK_RUN_MAX:
            self._big()
        if sum(len(text) for _, text in pending) > ONE_CPU_PASS_BYTES:  # a step a request, not an object
            self._release_cpu()
        if self.pending_kind == "track":
            self._track_pass(pending, self.responses)
        else:
            outcome = apply_identity(self.state, self.pending_kind, pending, clock=self.clock, seed=self.seed,
                                     batch=self.batch_id)
            for i, (status, body) in outcome.responses.items():
                self.responses[i] = Response(status, body)
            self.write(outcome.changes, next_profile_n=outcome.next_profile_n,
                       next_update_seq=outcome.next_update_seq)
        if not last:
            self._stage_when_big()

    def _big(self) -> None:
        self._release_cpu()
        if self._before_big is not None:
            hook, self._before_big = self._before_big, None
            hook()

    def _stage_when_big(self) -> None:
        """Stage the changes held so far when they are many, and start the state again over
        the store and the stages (the same answers: staged rows read back like stored ones)."""
        held = sum(frame.height for frames in self.changes.parts.values() for frame in frames)
        if held < STAGE_ROWS or self.stored is None:
            return
        self._stage()

    def _stage(self) -> None:
        if self.stages is None:
            self._big()
            self.stages = Stages()
        # `resolve_changes` folds the last pass's changes over the rows it holds, and the batch
        # starts a new state over the stages below: they need not be applied
        state = self.settled()
        # staged rows are whole: a later pass reads them back as the stored rows they shadow
        self.stages.add(state.resolve_changes(self.changes), state.index_entries_stored())
        self.changes = Changes()
        assert self.stored is not None
        self._state = State.over(StagedSource(self.stored, self.stages), next_profile_n=state.next_profile_n,
                                 next_update_seq=state.next_update_seq, reads=state.reads, subjects=state.subjects)

    def settled(self) -> State:
        """The state with the last pass's counters and users, its rows without that pass's
        changes: what staging and the commit read (they take the rows from `changes`). Only
        they call it, as the state's rows are read no more."""
        state, unapplied, self._unapplied = self._state, self._unapplied, None
        if unapplied is not None:
            changes, next_profile_n, next_update_seq = unapplied
            for frames in changes.parts.values():
                for frame in frames:
                    state.note_subjects(frame)
            state = dataclasses.replace(state, next_profile_n=next_profile_n, next_update_seq=next_update_seq)
        self._state = state
        return state

    def to_commit(self) -> tuple[Changes, dict[str, pl.DataFrame], Stages | None]:
        """Every change of the batch: those in memory, those staged (a batch that staged
        stages its last pass too, so that the commit streams its big tables from the files),
        and the index entries the store holds already (those of the stored rows read)."""
        if self.stages is None:
            return self.changes, self.state.index_entries_stored(), None
        if self.changes:
            self._stage()
        pairs = self.stages.index_entries_stored()
        return (self.stages.changes(), {index: pl.concat(frames) for index, frames in pairs.items()},
                self.stages)

    def close(self) -> None:
        if self._ahead is not None:  # a failed batch's rows still being read: let the reader end
            wait_for([self._ahead])
        if self.stages is not None:
            self.stages.remove()

    def reads_ahead(self) -> int:
        """How many users a full pass may read ahead the rows of (0: none): where each pass
        would read most of a big attributes table again (`READ_AHEAD_MIN_ROWS`), as many as
        hold about `READ_AHEAD_MAX_ROWS` of its rows."""
        if self.stored is None or (rows := self.stored.rows("attributes")) < READ_AHEAD_MIN_ROWS:
            return 0
        return READ_AHEAD_MAX_ROWS * max(self.stored.rows("profiles"), 1) // max(rows, 1)

    def read_ahead(self, external_ids: pl.Series) -> None:
        """Read the stored rows of the users `external_ids` name, for the passes to come: their
        external IDs and their attributes (`store/ahead.py`). They are read in a thread of
        their own while the full pass parses and checks its requests, and that pass's rules
        wait for them (`_take_ahead`): at 10M users, 20.8-21.4 s for a 1M-object batch against
        25.3-26.7 s read first, with the same peak. Rows read ahead for earlier passes go."""
        if self.stored is None:
            return
        base = self.stored.base if isinstance(self.stored, ReadAhead) else self.stored

        def load() -> ReadAhead:
            ahead = ReadAhead(base)
            found = ahead.load("external_ids", "external_id", external_ids)
            ahead.load("attributes", "service_id", found["service_id"])
            return ahead

        self._ahead = _ahead_pool().submit(load)

    def _take_ahead(self) -> None:
        """From now on, read stored rows through the rows read ahead, once they are read."""
        if self._ahead is None:
            return
        future, self._ahead = self._ahead, None
        ahead = future.result()
        self.stored = ahead
        source = ahead if self.stages is None else StagedSource(ahead, self.stages)
        self._state = dataclasses.replace(self._state, source=source)

    def _track_pass(self, pending: list[tuple[int, str]], responses: list[Response | None]) -> None:
        read = self.read_track([text for _, text in pending], self.max_updates)
        self._take_ahead()
        outcome = apply_track(self.state, read, clock=self.clock, seed=self.seed)
        for req, (status, body) in outcome.responses.items():
            responses[pending[req][0]] = Response(status, body)
        self.write(outcome.changes, next_profile_n=outcome.next_profile_n, next_update_seq=outcome.next_update_seq)


@functools.cache
def _ahead_pool() -> ThreadPoolExecutor:
    return ThreadPoolExecutor(max_workers=1, thread_name_prefix="engagelake-ahead")


class Workspace:
    """A customer-engagement store and the API over it."""

    def __init__(self, store: DeltaStore, clock: Clock, *, fields_required: bool,
                 memory_limit: str | None = None, retry_for: float = RETRY_FOR_S,
                 monthly_active_user_plan: bool = False, response_retention: timedelta = RESPONSE_RETENTION):
        self.store = store
        store.response_retention = response_retention  # compaction drops stored responses older than this
        self.retry_for = retry_for  # how long a batch waits out other writers
        self.clock = clock
        self.fields_required = fields_required
        self.monthly_active_user_plan = monthly_active_user_plan
        self.memory_limit = memory_limit or os.environ.get(MEMORY_ENV) or None
        store.memory_limit = self.memory_limit  # run merges and compaction spill beyond it too
        # what the last batch read from the store: (table, column or "*" for whole, rows)
        self.last_reads: list[tuple[str, str, int]] = []

    @classmethod
    def open(cls, uri: str | Path, *, clock: Clock | None = None, seed: str | None = None,
             fields_required: bool = True, memory_limit: str | None = None, create: bool = True,
             retry_for: float = RETRY_FOR_S, monthly_active_user_plan: bool = False,
             response_retention: timedelta = RESPONSE_RETENTION,
             storage_options: Mapping[str, str] | None = None) -> Workspace:
        """Open the store at `uri`. Where there is none yet, a path that does not exist or an
        empty folder, a new store is created there; `create=False` raises NotAStore instead.
        A folder that holds anything else is never made a store: a file or a folder of other
        things raises NotAStore, tables without a ledger (or another damage) StoreDamaged.
        `clock()` gives aware datetimes; `seed` fixes the service_id sequence of a new store;
        `fields_required` is the export setting; `memory_limit` (e.g. "2GB", default
        `$ENGAGELAKE_MEMORY_LIMIT`) bounds the DuckDB work of run merges, compaction,
        `duckdb()`, `sql()` and the CLI's `sql`, which spill beyond it. A batch that another
        writer overtakes runs again holding the store's writer lock; `retry_for` bounds how
        long it waits for other writers, in seconds. `monthly_active_user_plan` refuses, as a
        fatal error, a `/users/track` request with more than 50 attributes, events and purchases
        together (the specification's cap for those plans; off by default). A batch applied
        with an idempotency key keeps its responses for replay `response_retention` long (7
        days by default): a compaction drops older ones, and at once those that concern a
        deleted user (`docs/privacy.md`); a replay then raises IdempotentResponsesExpired.
        `storage_options` (a store on object storage: `AWS_ENDPOINT_URL`, `AWS_REGION`,
        `AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`, `AWS_SESSION_TOKEN`, `AWS_ALLOW_HTTP`) are
        used for the store's bucket from then on, in this process, over the environment's."""
        if storage_options is not None:
            objects.configure(str(uri), storage_options)
        return cls(DeltaStore(uri, seed=seed, create=create), clock or _now, fields_required=fields_required,
                   memory_limit=memory_limit, retry_for=retry_for, monthly_active_user_plan=monthly_active_user_plan,
                   response_retention=response_retention)

    @classmethod
    def open_kept(cls, uri: str | Path, *, clock: Clock | None = None, seed: str | None = None) -> Workspace:
        """`open(uri, create=False, clock=clock)` over the store this thread opened at `uri`
        before, kept for the process's life: for the tasks a long-lived worker runs over one
        store (a Dask worker's export or compaction parts). On object storage, opening a store
        costs about 33 requests and each table's first read loads its log; a kept store pays
        that once per worker thread (`benchmarks/parts_on_s3.py`, an export in 8 parts on 2
        workers over moto: 117 requests a part against 162). Its reads are as `open`'s: each brings the head
        up to date, or names the batch or versions it reads. `seed`: the store's seed as the
        caller read it (a plan's); a kept store of another seed, made before the store was
        made again at `uri`, is replaced by a fresh open."""
        key = (str(uri), threading.get_ident())
        with _KEPT_LOCK:
            store = _KEPT.get(key)
        if store is None or (seed is not None and store.head.seed != seed):
            store = DeltaStore(uri, create=False)
            with _KEPT_LOCK:
                _KEPT[key] = store
                while len(_KEPT) > KEPT_STORES:  # the oldest go (a dict keeps insertion order)
                    del _KEPT[next(iter(_KEPT))]
        return cls(store, clock or _now, fields_required=True)

    @classmethod
    def create(cls, uri: str | Path, *, clock: Clock | None = None, seed: str | None = None,
               fields_required: bool = True, memory_limit: str | None = None,
               retry_for: float = RETRY_FOR_S, monthly_active_user_plan: bool = False,
               response_retention: timedelta = RESPONSE_RETENTION,
               storage_options: Mapping[str, str] | None = None) -> Workspace:
        """Create a new store at `uri` (a path that does not exist, or an empty folder) and open
        it; raises StoreExists where a store is, NotAStore where other files are."""
        if storage_options is not None:
            objects.configure(str(uri), storage_options)
        if store_state(uri) == "store":
            raise StoreExists(f"a store exists at {uri} already: open it with Workspace.open")
        return cls.open(uri, clock=clock, seed=seed, fields_required=fields_required, memory_limit=memory_limit,
                        retry_for=retry_for, monthly_active_user_plan=monthly_active_user_plan,
                        response_retention=response_retention, storage_options=storage_options)

    @staticmethod
    def check(uri: str | Path) -> Report:
        """Verify the store at `uri` (a local folder or a URI) against its ledger (`engagelake
        check`): every table version the ledger names, its log entries and every data file it
        references. Opens nothing: a damaged store can be checked."""
        from engagelake.store.check import check

        return check(uri)

    @staticmethod
    def repair(uri: str | Path) -> Report:
        """Do what `check(uri).plan()` says (`engagelake repair`): roll tables back to the
        versions the ledger names, move aside torn log entries and lost ledger rows. Raises
        StoreDamaged, changing nothing, when a problem needs a backup."""
        from engagelake.store.check import repair

        return repair(uri)

    def close(self) -> None:
        """Wait for the run merges that follow the last commit (a process's exit waits for
        them too); the workspace stays usable."""
        self.store.wait_for_merges()

    def __enter__(self) -> Workspace:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def state(self) -> State:
        """The committed store as rules see it: nothing is read until a rule asks for rows."""
        self.store.refresh()
        head = self.store.head
        return State.over(self.store.snapshot(), next_profile_n=head.next_profile_n,
                          next_update_seq=head.next_update_seq)

    # --- requests ------------------------------------------------------------------------------
    def call(self, method: str, path: str, body: Any = None, query: dict[str, Any] | None = None) -> Response:
        """One request: exactly `apply([request])[0]`."""
        return self.apply([{"method": method, "path": path, "body": body, "query": query}])[0]

    @_store_errors
    def apply(self, requests: Iterable[dict[str, Any]], *, idempotency_key: str | None = None,
              read_track: TrackReader | None = None) -> list[Response]:
        """Apply many requests in order, as one atomic batch; same result as one by one.

        `requests` may be any iterable, a generator too: it is read once, as the batch runs,
        and the batch keeps each track or identity request as its JSON text only (a retry after
        another writer's commit replays those), so a big batch need not exist as dicts.

        `read_track` reads each track pass's request texts (parse and static checks) instead of
        this process: a flow shares them out to its task runner's workers (`flows/track_batch.py`).
        It must answer as `rules.profile.reading.read_track` does."""
        source = iter(requests)
        seen = _Seen()
        digest = hashlib.sha256()  # of the requests, for a keyed batch

        def routed() -> Iterator[Routed]:
            yield from seen.replay()  # a retry replays what the first attempt read
            for request in source:
                item = _routed(request)
                if idempotency_key is not None:
                    digest.update(_digest_line(request, item))
                yield seen.add(item)

        def attempt() -> list[Response]:
            if idempotency_key is not None:
                stored = self.store.find_batch(idempotency_key)
                if stored is not None:
                    if stored.digest is not None:  # null: a ledger row older than digests
                        for _ in routed():  # read (and route) the rest of the batch, apply nothing
                            pass
                        if digest.hexdigest() != stored.digest:
                            raise IdempotencyKeyReused(idempotency_key, stored.committed_at)
                    if stored.responses is None:  # applied once; its answers are gone
                        raise IdempotentResponsesExpired(idempotency_key, stored.committed_at,
                                                         stored.dropped or "expired")
                    return [Response(s, b) for s, b in stored.responses]
            def body(batch: _Batch) -> None:
                if read_track is not None:
                    batch.read_track = read_track
                self._dispatch(batch, _Ahead(routed(), seen))

            return self._run_batch(body, idempotency_key, digest=digest.hexdigest, small_on_one_cpu=True)

        with seen:
            return self._retrying(attempt)

    @_store_errors
    def write(self, build: Callable[[Context], None]) -> None:
        """Run `build(ctx)` as a batch of its own (library-level loaders: directories, catalog
        definitions, campaigns): it reads `ctx.state` and writes with `ctx.write(changes)`."""
        self._retrying(lambda: self._run_batch(build, None))

    def _retrying(self, attempt: Callable[[], list[Response]]) -> list[Response]:
        """Run `attempt` (a batch) optimistically; if another writer committed between its read
        and its commit, run it again holding the store's writer lock, so that it cannot be
        overtaken again (a store without a lock backs off and retries, with jitter). Gives up
        after `retry_for` seconds."""
        deadline = time.monotonic() + self.retry_for
        try:
            return attempt()
        except StaleStoreError:
            pass
        delay = 0.01
        while True:
            with self.store.exclusive(max(deadline - time.monotonic(), 0.0)):
                try:
                    return attempt()
                except StaleStoreError:
                    pass
            if time.monotonic() >= deadline:
                raise StoreError(f"the store at {self.store.uri} kept changing under this batch for "
                                 f"{self.retry_for:.0f} s; retry later")
            time.sleep(_JITTER.uniform(delay / 2, delay))
            delay = min(delay * 2, 1.0)

    def _run_batch(self, body: Callable[[_Batch], None], idempotency_key: str | None, *,
                   digest: Callable[[], str] | None = None, small_on_one_cpu: bool = False) -> list[Response]:
        """Run `body` as a batch and commit it. `small_on_one_cpu`: run on one CPU until a pass
        is big (`_Batch.flush`): requests come in passes; a loader's or a cleanup's work does not."""
        if not small_on_one_cpu:
            return self._run_batch_on(body, idempotency_key, digest, lambda: None)
        with one_cpu() as pin:
            return self._run_batch_on(body, idempotency_key, digest, pin.release)

    def _run_batch_on(self, body: Callable[[_Batch], None], idempotency_key: str | None,
                      digest: Callable[[], str] | None, release_cpu: Callable[[], None]) -> list[Response]:
        state = self.state
        read_at = self.store.head.content_batch  # what the batch reads: the commit checks it still holds
        if idempotency_key is not None:  # its responses are stored: note whom they concern
            state = dataclasses.replace(state, subjects=[])
        batch = _Batch(state, clock=self.clock(), seed=self.store.head.seed,
                       batch_id=idempotency_key or uuid.uuid4().hex, before_big=self.store.wait_for_merges,
                       max_updates=MAU_UPDATES_PER_REQUEST if self.monthly_active_user_plan else None,
                       release_cpu=release_cpu)
        try:
            body(batch)
            batch.flush(last=True)
            final = _as_json([r for r in batch.responses if r is not None])
            assert len(final) == len(batch.responses)
            settled = batch.settled()
            self.last_reads = settled.reads
            changes, index_entries_stored, staged = batch.to_commit()
            if changes or staged is not None or idempotency_key is not None:
                self.store.commit(
                    changes, key=idempotency_key, responses=[[r.status, r.body] for r in final],
                    next_profile_n=settled.next_profile_n, next_update_seq=settled.next_update_seq,
                    index_entries_stored=index_entries_stored, staged=staged,
                    digest=digest() if digest is not None and idempotency_key is not None else None,
                    subjects=settled.subject_ids(), read_at=read_at,
                )
        finally:
            batch.close()
        return final

    def _dispatch(self, batch: _Batch, requests: _Ahead) -> None:
        for i, (endpoint, routed, text) in enumerate(requests):
            batch.responses.append(None)
            if isinstance(text, Response):  # routed nowhere
                batch.responses[i] = text
                continue
            if isinstance(endpoint, str) and endpoint != "export":
                batch.add(i, endpoint, text)
                if endpoint == "track" and len(batch.pending) == TRACK_RUN_MAX and not requests.covers(i) \
                        and (users := batch.reads_ahead()):
                    named = requests.external_ids([t for _, t in batch.pending], users)
                    if named is not None:
                        batch.read_ahead(named)
                continue
            batch.flush()
            assert routed is not None
            if endpoint == "export":
                status, out = export_ids(batch.state, routed.body, batch.clock, fields_required=self.fields_required)
                batch.responses[i] = Response(status, out)
            else:
                assert callable(endpoint)
                batch.responses[i] = endpoint(batch, routed)

    @_store_errors
    def cleanup_push_profiles(self) -> int:
        """The monthly check of `push_token_import`'s temporary anonymous profiles: delete, as
        one batch, those that hold no push token any more (and gained no identifier), each
        with a lineage row as `/users/delete` writes. Returns how many were deleted."""
        deleted = 0

        def body(batch: _Batch) -> None:
            nonlocal deleted  # each attempt (a retry after another writer's commit) counts anew
            outcome = cleanup_push_profiles(batch.state, clock=batch.clock, batch=batch.batch_id)
            deleted = outcome.deleted.height
            batch.write(outcome.changes, next_update_seq=outcome.next_update_seq)

        self._retrying(lambda: self._run_batch(body, None))
        return deleted

    @_store_errors
    def compact(self, *, on_table: Callable[[str, int, int], None] | None = None) -> dict[str, int]:
        """Compact the store (see `DeltaStore.compact`): afterwards the files hold only current
        rows, so a deleted user's data is gone from disk. The store's published copy (`publish`
        to its default folder), if there is one, is published again: it would keep deleted
        users' rows. Returns the rows kept per table; `on_table(name, done, total)` is called
        before each table is rewritten."""
        with self.compaction() as job:
            return job.finish([], on_table=on_table)

    @contextmanager
    def compaction(self, parts: int = 1, *, min_part_rows: int = MIN_PART_ROWS) -> Iterator[Compaction]:
        """A compaction whose big sorted tables are cut into about `parts` key ranges each, of
        `min_part_rows` stored rows at least (`docs/scale-out.md`): write each part of
        `job.plan.parts` with `compact_part`, in this process or any other that opens the store,
        then `job.finish(written)` commits them all and compacts the rest, as `compact` does.
        The store's writer lock is held throughout: other writers, and readers that open a
        snapshot, wait. Leaving the block before `finish` commits anything changes nothing."""
        from engagelake.store.publish import published

        with self.store.compaction(parts, min_part_rows) as job:
            yield job
        marker = published(objects.join(self.store.uri, PUBLISHED_FOLDER)) if job.kept is not None else None
        if marker is not None and isinstance(tables := marker["tables"], dict):
            self._publish(list(tables), None, erase_old=True)

    @_store_errors
    def compact_part(self, plan: Plan, part: Part) -> Written:
        """Write `part` of a compaction's `plan` (`compaction`) as files of its table, left for
        the compaction to commit; a failed part leaves none, so it may run again."""
        return self.store.compact_part(plan, part)

    @_store_errors
    def publish(self, out: str | Path | None = None, *, tables: list[str] | None = None) -> dict[str, int]:
        """Write the current rows of every table (or of `tables`) as plain Delta tables under
        `out` (default: the store's `current` folder), for readers outside the library: Spark,
        DuckDB's `delta_scan`, `pl.read_delta`. Each run replaces the last; the marker
        `_published.json`, written last, names the batch shown. Returns the rows per table.
        The credentials (`api_keys`, `scim_tokens`) are published only when `tables` names them."""
        names = [n for n in TABLES if n not in UNPUBLISHED] if tables is None else tables
        return self._publish(names, out)

    def _publish(self, names: list[str], out: str | Path | None, *, erase_old: bool = False) -> dict[str, int]:
        from engagelake.store.publish import publish

        unknown = [name for name in names if name not in TABLES]
        if unknown:
            raise KeyError(f"no table {unknown[0]!r}; tables: {', '.join(TABLES)}")
        self.store.refresh()
        target = str(out) if out is not None else objects.join(self.store.uri, PUBLISHED_FOLDER)
        for name in UNPUBLISHED:  # a copy an earlier run published would go stale: it goes
            if name not in names:
                objects.remove_tree(objects.join(target, name))
        return publish(self.store.snapshot(), target, names, self.memory_limit, erase_old=erase_old)

    @_store_errors
    def lineage(self, identifier: str, *, kind: str = "external_id") -> pl.DataFrame:
        """Every lineage row of the profiles an identifier has named (now or in the past), and
        of the profiles merged with them, in order."""
        return lineage_rows(self.state, identifier, kind=kind)

    @_store_errors
    def batch_committed_at(self, idempotency_key: str) -> datetime | None:
        """When the batch with this idempotency key was committed, or None if none was: `apply`
        with a key already committed is a replay that answers the stored responses and writes
        nothing."""
        stored = self.store.find_batch(idempotency_key)
        return None if stored is None else stored.committed_at

    def forget_check(self, *, external_id: str | None = None, email: str | None = None, phone: str | None = None,
                     alias: tuple[str, str] | None = None, values: Iterable[str] = ()) -> ForgetReport:
        """Where any copy of a user's data remains in the store (`engagelake forget-check`):
        every file under its folder, or every object under its prefix on object storage, old
        versions, logs, statistics and caches included (`store/forget.py`). Searched for: the
        identifiers given (an alias, given as (alias_name, alias_label), by its name), `values`,
        and while the identifiers still name profiles, every string of their full export of at
        least FORGET_MIN_CHARS characters but those of FORGET_SKIPPED and the times the engine
        wrote. Writes nothing (the export commits no batch)."""
        from engagelake.store.forget import find_copies

        identifiers = [v for v in (external_id, email, phone, alias[0] if alias else None) if v is not None]
        users = self._users_named(external_id, email, phone, alias)
        held = [text for user in users for key, text in _strings(user, None)
                if key not in FORGET_SKIPPED and len(text) >= FORGET_MIN_CHARS and not _ENGINE_TIME.match(text)]
        wanted = list(dict.fromkeys([*identifiers, *values, *held]))
        if not wanted:
            raise ConfigError("forget_check needs something to look for: an external_id, email, phone, alias or "
                              "values")
        report = find_copies(self.store.uri, wanted)
        report.profiles = len(users)
        return report

    def _users_named(self, external_id: str | None, email: str | None, phone: str | None,
                     alias: tuple[str, str] | None) -> list[dict[str, Any]]:
        """The full export of every profile the identifiers name (one export per identifier:
        the endpoint takes one of email and phone at a time)."""
        bodies: list[dict[str, Any]] = [{"external_ids": [external_id]}] if external_id is not None else []
        bodies += [{"email_address": email}] if email is not None else []
        bodies += [{"phone": phone}] if phone is not None else []
        bodies += [{"user_aliases": [{"alias_name": alias[0], "alias_label": alias[1]}]}] if alias else []
        users: dict[str, dict[str, Any]] = {}
        for body in bodies:
            response = self.call("POST", "/users/export/ids", {**body, "fields_to_export": list(M.EXPORT_FIELDS)})
            if response.status != 200:
                message = response.body.get("message") if isinstance(response.body, dict) else response.body
                raise RequestError(f"/users/export/ids answered {response.status} for {body}: {message}",
                                   response.status, response.body)
            users.update((user["service_id"], user) for user in response.body["users"])
        return list(users.values())

    # --- resources: friendly methods over `call` ------------------------------------------------
    @property
    def scim(self) -> Scim:
        return Scim(self)

    @property
    def preference_centers(self) -> PreferenceCenters:
        return PreferenceCenters(self)

    @property
    def catalogs(self) -> Catalogs:
        return Catalogs(self)

    @property
    def campaigns(self) -> Campaigns:
        return Campaigns(self)

    @property
    def credentials(self) -> Credentials:
        """API keys and SCIM tokens of the REST server (`engagelake serve`)."""
        return Credentials(self)

    # --- reading -------------------------------------------------------------------------------
    def table_names(self) -> list[str]:
        return list(TABLES)

    def table(self, name: str) -> pl.LazyFrame:
        """The current rows of one store table, lazily: filters and column choices are pushed
        down into the Parquet reads. Event and purchase rows of merged profiles show under the
        surviving profile."""
        if name not in TABLES:
            raise KeyError(f"no table {name!r}; tables: {', '.join(TABLES)}")
        self.store.refresh()
        return self.store.snapshot().current(name)

    def duckdb(self, *, memory_limit: str | None = None) -> duckdb.DuckDBPyConnection:
        """A DuckDB connection with one view per table holding its current rows (as `table`),
        read straight from the Parquet files: it streams and spills within `memory_limit`
        (default: the workspace's)."""
        self.store.refresh()
        limit = memory_limit or self.memory_limit
        import duckdb
        # spill to a private folder (DuckDB's default is `.tmp` in the working directory: a
        # repository's or a notebook's), removed with the connection; a killed process's folder
        # is swept by the next one
        spill = scratch.make("duckdb")
        config: dict[str, Any] = {"temp_directory": str(spill)} | ({"memory_limit": limit} if limit else {})
        con = duckdb.connect(config=config)
        weakref.finalize(con, shutil.rmtree, spill, True)
        return self.store.snapshot().duckdb(con)

    @_store_errors
    def sql(self, query: str) -> pl.DataFrame:
        """Run DuckDB SQL over the current tables (named as in `table_names()`)."""
        con = self.duckdb()
        try:
            out = pl.from_arrow(con.sql(query).to_arrow_table())
        finally:
            con.close()
        assert isinstance(out, pl.DataFrame)
        # DuckDB labels aware timestamps with its session zone (Etc/UTC without ICU): say UTC
        return out.with_columns(cs.datetime(time_zone="*").dt.convert_time_zone("UTC"))

    @_store_errors
    def export_users(self, fields_to_export: list[str] | None = None) -> list[dict[str, Any]]:
        """Every user, shaped as `/users/export/ids` shapes them, in creation order, in one
        list: for stores that fit in memory (`iter_users` streams)."""
        state = self.state
        users = state["profiles"].sort("created_seq").select("service_id")
        return export_frame(state, users, fields_to_export, self.clock())

    @_store_errors
    def export_ranges(self, users_per_chunk: int = EXPORT_CHUNK_USERS) -> tuple[int, list[tuple[str, str | None]]]:
        """The plan of a bulk export in parts: the committed batch it reads and the ranges of
        `service_id` ([low, high), the last without an end) of about `users_per_chunk` users
        each, that together hold every user. `iter_users(at_batch=..., key_ranges=...)` of
        any split of the ranges, in any process, gives the chunks `iter_users()` gives."""
        self.store.refresh()
        snapshot = self.store.snapshot()
        return snapshot.head.batch_no, snapshot.key_ranges("profiles", users_per_chunk)

    def iter_users(self, fields_to_export: list[str] | None = None, *,
                   users_per_chunk: int = EXPORT_CHUNK_USERS, at_batch: int | None = None,
                   key_ranges: Sequence[tuple[str, str | None]] | None = None) -> Iterator[list[dict[str, Any]]]:
        """Every user, shaped as `/users/export/ids` shapes them, in chunks of about
        `users_per_chunk` users ordered by `service_id`, all as of one committed batch (the
        newest, or `at_batch`). Each chunk is a range of keys, read from the row groups that
        hold it: memory follows the chunk, not the store. `key_ranges` (from `export_ranges`)
        limits it to those ranges, one chunk each."""
        if at_batch is None:
            self.store.refresh()
            snapshot = self.store.snapshot()
        else:
            snapshot = self.store.snapshot_at(at_batch)
        clock = self.clock()
        head = snapshot.head
        ranges = snapshot.key_ranges("profiles", users_per_chunk) if key_ranges is None else key_ranges
        for low, high in ranges:
            users = snapshot.in_range("profiles", low, high).select("service_id").sort("service_id")
            if users.height:
                state = State.over(snapshot, next_profile_n=head.next_profile_n,
                                   next_update_seq=head.next_update_seq)
                yield export_frame(state, users, fields_to_export, clock, point_reads=True)
