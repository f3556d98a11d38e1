"""The one contract: `Workspace.open(uri)`, then `call` one request or `apply` many.

`call` is `apply` of one request, so the fast path and the one-by-one path are the same code.
`apply` routes each request (`routing.py`, by the table of `routes.py`), has the batch engine
(`batch.py`) split the batch into runs of track requests (one vectorized pass each) separated by
reads (exports see every earlier request of the batch), then commits the batch atomically.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import os
import random
import re
import shutil
import sys
import threading
import time
import uuid
import weakref
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, ParamSpec, TypeVar

import polars as pl
import polars.selectors as cs
import pyarrow as pa

from engagelake.batch import Ahead, Batch, Seen, dispatch
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
from engagelake.link_keys import LinkKeys
from engagelake.resources.campaigns import Campaigns
from engagelake.resources.catalogs import Catalogs
from engagelake.resources.credentials import Credentials
from engagelake.resources.email_lists import EmailLists
from engagelake.resources.preference_centers import PreferenceCenters
from engagelake.resources.scim import Scim
from engagelake.resources.subscription_writes import SubscriptionGroups
from engagelake.routes import ROUTER
from engagelake.routing import Context, Response, Routed, as_json, digest_line, printable
from engagelake.rules import messages as M
from engagelake.rules.export import export_frame
from engagelake.rules.identity.cleanup import cleanup_push_profiles
from engagelake.rules.identity.lineage import lineage_rows
from engagelake.rules.profile.reading import TrackReader
from engagelake.rules.state import State
from engagelake.store import objects, scratch
from engagelake.store.compaction import MIN_PART_ROWS, Part, Plan, Written
from engagelake.store.compactor import Compaction
from engagelake.store.delta import DeltaStore
from engagelake.store.layer import FLUSH_BYTES, FLUSH_ROWS, FLUSH_SECONDS, Layers
from engagelake.store.layout import Head, StoredBatch, store_state
from engagelake.store.ledger import RESPONSE_RETENTION
from engagelake.store.wal import Record
from engagelake.tables.credentials import UNPUBLISHED
from engagelake.tables.schema import TABLES
from engagelake.tables.source import RowSource

if TYPE_CHECKING:
    import duckdb  # imported where used: a process that only reads never loads it

    from engagelake.store.check import Report
    from engagelake.store.forget import ForgetReport

Clock = Callable[[], datetime]
MEMORY_ENV = "ENGAGELAKE_MEMORY_LIMIT"
LAYER_ENV = "ENGAGELAKE_LAYER"  # "1": workspaces keep an in-memory layer unless told otherwise
PUBLISHED_FOLDER = "current"  # where `publish` writes by default, inside the store
EXPORT_CHUNK_USERS = 50_000  # users per chunk of a streamed export of every user
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


def _check_key(key: Any) -> None:
    """Raise ConfigError for an idempotency key that is not text, is empty or only spaces (every
    caller passing `""` by mistake would share it), or holds a lone surrogate (the ledger, in
    UTF-8, cannot store it)."""
    if not isinstance(key, str) or not key.strip():
        raise ConfigError(f"an idempotency key must be non-empty text, not {key!r}: use a name for the batch "
                          "that a retry of the same batch sends again (a file name and its digest, a job's run)")
    try:
        key.encode("utf-8")
    except UnicodeEncodeError:
        raise ConfigError(f"an idempotency key must be text UTF-8 can carry; {printable(key)!r} holds a lone "
                          "surrogate") from None


# `Workspace.open_kept`'s stores, by location and thread: at most this many, the newest
KEPT_STORES = 8
_KEPT: dict[tuple[str, int], DeltaStore] = {}
_KEPT_LOCK = threading.Lock()


def _now() -> datetime:
    return datetime.now(UTC)


class _LayerFlushed(StaleStoreError):
    """A big batch found the in-memory layer holding batches: it was flushed, and the batch
    runs again over the tables that now hold them."""


P = ParamSpec("P")
T = TypeVar("T")


def _errors_below() -> tuple[type[BaseException], ...]:
    """What the libraries under the store raise when a file is missing or unreadable."""
    from deltalake.exceptions import DeltaError

    below: list[type[BaseException]] = [OSError, DeltaError, pl.exceptions.PolarsError, pa.ArrowException]
    if (duck := sys.modules.get("duckdb")) is not None:  # loaded by whoever read through DuckDB
        below += [duck.IOException, duck.InvalidInputException]
    return tuple(below)


def _below(error: Exception) -> bool:
    """Whether `error` may come of a file under the store: one of `_errors_below`, or DuckDB's
    plain `Error`, which a page it cannot decode raises (a mistake in a query raises one of its
    subclasses: a parser's, a binder's, a catalog's)."""
    duck = sys.modules.get("duckdb")
    return isinstance(error, _errors_below()) or (duck is not None and type(error) is duck.Error)


def _store_errors(method: Callable[P, T]) -> Callable[P, T]:
    """A Workspace method whose failures below the store become StoreError: StoreDamaged
    naming the file at fault, StoreReadOnly for a refused write (`DeltaStore.damaged`)."""

    @functools.wraps(method)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> T:
        try:
            return method(*args, **kwargs)
        except EngagelakeError:
            raise
        except Exception as error:
            if not _below(error):
                raise
            workspace = args[0]
            assert isinstance(workspace, Workspace)
            raise workspace.store.damaged(error) from error

    return wrapper


class Workspace:
    """A customer-engagement store and the API over it."""

    def __init__(self, store: DeltaStore, clock: Clock, *, fields_required: bool,
                 memory_limit: str | None = None, retry_for: float = RETRY_FOR_S,
                 monthly_active_user_plan: bool = False, response_retention: timedelta = RESPONSE_RETENTION,
                 layer: dict[str, Any] | None = None, link_keys: str | Path | None = None):
        self.store = store
        self._turn = threading.RLock()  # a batch or a change of layers at a time (flushes are threads)
        # batches answered once logged, kept until a flush writes them (`store/layer.py`);
        # `layer`: its settings
        self.layer = Layers(store, self._turn, **layer) if layer is not None and store.local else None
        store.response_retention = response_retention  # compaction drops stored responses older than this
        self.retry_for = retry_for  # how long a batch waits out other writers
        self.clock = clock
        # the keys that sign recipients' links, kept apart from the tables (`link_keys.py`)
        self.link_keys = LinkKeys.of_store(store.uri, link_keys, clock=clock)
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
             storage_options: Mapping[str, str] | None = None, layer: bool | None = None,
             flush_seconds: float = FLUSH_SECONDS, flush_rows: int = FLUSH_ROWS,
             flush_bytes: int = FLUSH_BYTES, link_keys: str | Path | None = None,
             mode: int | str | None = None) -> Workspace:
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
        used for the store's bucket from then on, in this process, over the environment's.
        `layer` (default `$ENGAGELAKE_LAYER`, else off; `engagelake serve` turns it on) keeps an
        in-memory layer over a local store: a batch is answered once its write-ahead log record
        is synced, and a flush writes the layer's batches to the tables as one commit once the
        oldest is `flush_seconds` old, the layer holds `flush_rows` rows or `flush_bytes` bytes,
        at `flush()` and at `close()` (`docs/operations.md`: what other processes see).
        `link_keys` (default `$ENGAGELAKE_LINK_KEYS`, else the store's own
        `_secrets/link-keys.json`; required on object storage to make or check a link) is the
        key file that signs recipients' links (`docs/security.md`). A new local store's folder
        is made with `mode` (default `$ENGAGELAKE_STORE_MODE`, else 0700: the owner only);
        an existing store's is left as it is."""
        if storage_options is not None:
            objects.configure(str(uri), storage_options)
        if link_keys is not None:  # a bad setting fails before a store is made
            LinkKeys.of_store(str(uri), link_keys)
        store = DeltaStore(uri, seed=seed, create=create, mode=mode)
        if layer is None:
            layer = os.environ.get(LAYER_ENV, "").strip().lower() in ("1", "on", "true", "yes")
        kept = {"seconds": flush_seconds, "rows": flush_rows, "size": flush_bytes} if layer else None
        return cls(store, clock or _now, fields_required=fields_required,
                   memory_limit=memory_limit, retry_for=retry_for, monthly_active_user_plan=monthly_active_user_plan,
                   response_retention=response_retention, layer=kept, link_keys=link_keys)

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
               storage_options: Mapping[str, str] | None = None, link_keys: str | Path | None = None,
               mode: int | str | None = None) -> Workspace:
        """Create a new store at `uri` (a path that does not exist, or an empty folder, in a
        folder that exists) and open it; raises StoreExists where a store is, NotAStore where
        other files are. Its folder gets `mode` (default `$ENGAGELAKE_STORE_MODE`, else 0700);
        `link_keys` as for `open`."""
        if storage_options is not None:
            objects.configure(str(uri), storage_options)
        if store_state(uri) == "store":
            raise StoreExists(f"a store exists at {uri} already: open it with Workspace.open")
        return cls.open(uri, clock=clock, seed=seed, fields_required=fields_required, memory_limit=memory_limit,
                        retry_for=retry_for, monthly_active_user_plan=monthly_active_user_plan,
                        response_retention=response_retention, storage_options=storage_options,
                        link_keys=link_keys, mode=mode)

    @staticmethod
    def check(uri: str | Path, *, deep: bool = False) -> Report:
        """Verify the store at `uri` (a local folder or a URI) against its ledger (`engagelake
        check`): every table version the ledger names, its log entries and every data file it
        references (`deep`: every page of it decoded). Opens nothing: a damaged store can be
        checked."""
        from engagelake.store.check import check

        return check(uri, deep=deep)

    @staticmethod
    def repair(uri: str | Path) -> Report:
        """Do what `check(uri).plan()` says (`engagelake repair`): roll tables back to the
        versions the ledger names, move aside torn log entries and lost ledger rows. Raises
        StoreDamaged, changing nothing, when a problem needs a backup."""
        from engagelake.store.repair import repair

        return repair(uri)

    @staticmethod
    def store_state(uri: str | Path) -> str:
        """What is at `uri`: "store" (a ledger is there) or "new" (a store may be created there:
        `engagelake demo` says which before any work). Raises NotAStore for a file or a folder
        of other things, StoreDamaged for tables without a ledger. Opens nothing."""
        return store_state(uri)

    @staticmethod
    def check_lines(report: Report) -> Iterator[str]:
        """A `check` or `repair` report as plain lines (`engagelake check`): its problems, its
        notes, then a summary."""
        from engagelake.store.check import iter_lines

        return iter_lines(report)

    @staticmethod
    def forget_places() -> tuple[str, ...]:
        """The places a `forget_check` report finds copies in (its occurrences' `place`), in the
        order `engagelake forget-check` lists them: table data first."""
        from engagelake.store.forget import PLACES

        return PLACES

    def close(self) -> None:
        """Flush the in-memory layer, if any, and wait for the run merges that follow the last
        commit (a process's exit waits for them too); the workspace stays usable."""
        if self.layer is not None:
            self._layer_errors(self.layer.close)
        self.store.wait_for_merges()

    def flush(self) -> int:
        """Write the in-memory layer's batches to the tables (`store/layer.py`), and let go of
        the writer lock; returns the batches written. Without a layer, nothing."""
        return 0 if self.layer is None else self._layer_errors(self.layer.flush)

    @_store_errors
    def _layer_errors(self, step: Callable[[], T]) -> T:
        return step()

    @property
    def flush_errors(self) -> list[BaseException]:
        """Flushes that failed after their batches were answered (the batches stay logged, and
        are written by the next flush, or the next writer)."""
        return [] if self.layer is None else self.layer.errors

    def __enter__(self) -> Workspace:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def state(self) -> State:
        """The store as rules see it, the in-memory layer's batches included: nothing is read
        until a rule asks for rows."""
        return self._read()[0]

    def _read(self) -> tuple[State, Head]:
        """The state, and the head under it (with a layer: the tables its batches read)."""
        with self._turn:
            source: RowSource
            counters: tuple[int, int] | None
            if self.layer is None:
                self.store.refresh()
                source, head, counters = self.store.snapshot(), self.store.head, None
            else:
                source, head, counters = self.layer.read()
            next_n, next_seq = counters or (head.next_profile_n, head.next_update_seq)
            return State.over(source, next_profile_n=next_n, next_update_seq=next_seq), head

    def _find_batch(self, key: str) -> StoredBatch | None:
        found = self.layer.find(key) if self.layer is not None else None
        return found if found is not None else self.store.find_batch(key)

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
        if idempotency_key is not None:
            _check_key(idempotency_key)
        source = iter(requests)
        seen = Seen()
        digest = hashlib.sha256()  # of the requests, for a keyed batch

        def routed() -> Iterator[Routed]:
            yield from seen.replay()  # a retry replays what the first attempt read
            for request in source:
                item = ROUTER.routed(request)
                if idempotency_key is not None:
                    digest.update(digest_line(request, item))
                yield seen.add(item)

        def attempt() -> list[Response]:
            if idempotency_key is not None:
                stored = self._find_batch(idempotency_key)
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
            def body(batch: Batch) -> None:
                if read_track is not None:
                    batch.read_track = read_track
                dispatch(batch, Ahead(routed(), seen), fields_required=self.fields_required)

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
        with self._turn:
            return self._retrying_turn(attempt)

    def _retrying_turn(self, attempt: Callable[[], list[Response]]) -> list[Response]:
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

    def _run_batch(self, body: Callable[[Batch], None], idempotency_key: str | None, *,
                   digest: Callable[[], str] | None = None, small_on_one_cpu: bool = False) -> list[Response]:
        """Run `body` as a batch and commit it. `small_on_one_cpu`: run on one CPU until a pass
        is big (`Batch.flush`): requests come in passes; a loader's or a cleanup's work does not."""
        if not small_on_one_cpu:
            return self._run_batch_on(body, idempotency_key, digest, lambda: None)
        with one_cpu() as pin:
            return self._run_batch_on(body, idempotency_key, digest, pin.release)

    def _run_batch_on(self, body: Callable[[Batch], None], idempotency_key: str | None,
                      digest: Callable[[], str] | None, release_cpu: Callable[[], None]) -> list[Response]:
        # a batch run again inside `exclusive` (after a flush made room for it: `_before_big`)
        # commits on its own
        layered = self.layer is not None and not self.store.exclusive_here()
        if self.layer is not None and layered:
            self.layer.hold(self.retry_for)
        state, head = self._read()
        read_at = head.content_batch  # what the batch reads: the commit checks it still holds
        if idempotency_key is not None:  # its responses are stored: note whom they concern
            state = dataclasses.replace(state, subjects=[])
        batch = Batch(state, clock=self.clock(), seed=head.seed, link_keys=self.link_keys,
                      batch_id=idempotency_key or uuid.uuid4().hex,
                      before_big=self._before_big if layered else self.store.wait_for_merges,
                      max_updates=MAU_UPDATES_PER_REQUEST if self.monthly_active_user_plan else None,
                      release_cpu=release_cpu)
        try:
            body(batch)
            batch.flush(last=True)
            final = as_json([r for r in batch.responses if r is not None])
            assert len(final) == len(batch.responses)
            settled = batch.settled()
            self.last_reads = settled.reads
            changes, index_entries_stored, staged = batch.to_commit()
            responses = [[r.status, r.body] for r in final]
            key_digest = digest() if digest is not None and idempotency_key is not None else None
            if staged is None and layered and (changes or idempotency_key is not None):
                assert self.layer is not None
                resolved = settled.resolve_changes(changes)
                subjects = settled.subject_ids()
                record = Record({name: pl.concat(frames, how="vertical_relaxed") for name, frames in resolved.parts.items()},
                                index_entries_stored, settled.next_profile_n, settled.next_update_seq, datetime.now(UTC),
                                idempotency_key, key_digest, responses, None if subjects is None else subjects.to_list())
                self.layer.add(record, head)  # synced when this returns: it may be answered
            elif changes or staged is not None or idempotency_key is not None:
                self.store.commit(
                    changes, key=idempotency_key, responses=responses,
                    next_profile_n=settled.next_profile_n, next_update_seq=settled.next_update_seq,
                    index_entries_stored=index_entries_stored, staged=staged, digest=key_digest,
                    subjects=settled.subject_ids(), read_at=read_at,
                )
                if layered:
                    self.store.release()
        finally:
            batch.close()
        return final

    def _before_big(self) -> None:
        """A batch of the layer grew big (a full pass, or rows to stage): it is written by a
        commit of its own, over a store that holds the layer's batches. A layer that holds
        some is flushed first, and the batch runs again over the tables (`_retrying`)."""
        if self.layer is not None and len(self.layer):
            self.flush()
            raise _LayerFlushed(f"the in-memory layer of {self.store.uri} was flushed before a big batch")
        self.store.wait_for_merges()

    @_store_errors
    def cleanup_push_profiles(self) -> int:
        """The monthly check of `push_token_import`'s temporary anonymous profiles: delete, as
        one batch, those that hold no push token any more (and gained no identifier), each
        with a lineage row as `/users/delete` writes. Returns how many were deleted."""
        deleted = 0

        def body(batch: Batch) -> None:
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

        self.flush()  # the layer's batches are compacted too
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
        self.flush()
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
        _check_key(idempotency_key)
        stored = self._find_batch(idempotency_key)
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

        self.flush()  # the layer's log and stages go with it
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
    def subscriptions(self) -> SubscriptionGroups:
        return SubscriptionGroups(self)

    @property
    def emails(self) -> EmailLists:
        return EmailLists(self)

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
        self.flush()  # the tables' readers see the layer's batches once they are written
        self.store.refresh()
        return self.store.snapshot().current(name)

    def duckdb(self, *, memory_limit: str | None = None) -> duckdb.DuckDBPyConnection:
        """A DuckDB connection with one view per table holding its current rows (as `table`),
        read straight from the Parquet files: it streams and spills within `memory_limit`
        (default: the workspace's)."""
        self.flush()
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
        self.flush()
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
            self.flush()
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
