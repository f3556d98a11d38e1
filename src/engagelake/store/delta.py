"""The store: Delta Lake tables under one URI, and the batch commit protocol.

Every table is an append-only Delta log: keyed tables get one row per changed key per batch
(`_batch`, `_deleted` tombstones); the current view is the newest row per key. A batch never
rewrites existing files, so it costs what it writes, whatever the size of the store.

Atomicity across tables: the `_ledger` table is the commit point. A batch appends to each table
(one Delta commit each), then appends one ledger row naming every table's version. Readers load
each table at the version the last ledger row names, so they never see half a batch and never
change anything. Writers commit one at a time under a lock file; a writer holding the lock that
finds a table ahead of the ledger (left by a writer that died between the two steps) restores it
to the ledger's version before appending, so the dead batch's rows are never published; the
batch then simply runs again.

Opening never creates a store where one is (`store_state`): a missing path or an empty folder
gets a new store (unless `create=False`); a folder holding any table, Delta log or other file
but no ledger is refused. Damage (a log entry or data file missing or unreadable) raises
`StoreDamaged` naming the file; `store/check.py` is the `engagelake check` and `repair` behind it.
"""

from __future__ import annotations

import errno
import fcntl
import logging
import os
import random
import shutil
import signal
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import FIRST_EXCEPTION, Future, ThreadPoolExecutor
from concurrent.futures import wait as wait_for
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from functools import cache, partial
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote

import orjson
import polars as pl
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from deltalake import ColumnProperties, CommitProperties, DeltaTable, WriterProperties
from deltalake.transaction import AddAction

from engagelake.errors import (
    NotAStore,
    StaleStoreError,
    StoreDamaged,
    StoreError,
    StoreReadOnly,
    TurnEndedError,
)
from engagelake.store import appends, checkpoints, compaction, merging, objects, records
from engagelake.store.compaction import Part, Plan, Written
from engagelake.store.footers import index_path, prune_indexes
from engagelake.store.lease import Lease
from engagelake.store.runs import (
    FILE_STATS_MAX_VALUES,
    ROW_GROUP_ROWS,
    SORT_BY,
    FooterCache,
    files_holding,
    footer_budget,
    range_bounds,
    read_range,
    read_where,
    sort_for_write,
    sort_order,
)
from engagelake.tables.changes import Changes
from engagelake.tables.partial import PARTIAL, SET, newest
from engagelake.tables.schema import (
    HISTORY,
    INDEX_OF,
    INDEXES,
    KEYS,
    SCHEMAS,
    STORED,
    TABLES,
    UTC_TS,
    empty,
    read_back,
)

if TYPE_CHECKING:
    import duckdb  # imported where used: a process that only reads never loads it

    from engagelake.store.staging import Stages

# jitter of waits for the writer lock, from a generator of our own: the global one is the
# caller's (Hypothesis warns when it moves while it draws an example)
_JITTER = random.Random()
LEDGER = "_ledger"
LEDGER_SCHEMA = {
    "batch_no": pl.Int64(),
    "batch_key": pl.String(),
    "committed_at": UTC_TS,
    "versions": pl.String(),  # JSON {table: version}
    "next_profile_n": pl.Int64(),
    "next_update_seq": pl.Int64(),
    "seed": pl.String(),
    "responses": pl.String(),  # JSON [[status, body], ...]
    "kind": pl.String(),  # "batch" (null in stores older than the column), "merge" or "compaction"
    # SHA-256 of a keyed batch's requests (null without a key, and in stores older than the
    # column): a column of its own, kept when the responses go after their retention window
    "digest": pl.String(),
    # a keyed batch's users (service_ids it read or wrote): its responses concern them, and go
    # at the next compaction once one of them is deleted; null when no responses are stored
    "subjects": pl.List(pl.String()),
    # why a keyed batch's responses are gone: "expired" (the retention window) or "erased"
    "responses_dropped": pl.String(),
}
# The ledger's text meant only for replay (response bodies) and its users carry no statistics,
# in the Delta log or in the Parquet footers: statistics would copy values out of the rows.
LEDGER_GROUP_ROWS = 8192
LEDGER_STATS_COLUMNS = ("batch_no", "batch_key", "committed_at", "kind")
LEDGER_PROPERTIES = {"delta.dataSkippingStatsColumns": ",".join(LEDGER_STATS_COLUMNS)}
LEDGER_WRITER = WriterProperties(  # statistics off by default: a nested column takes no other setting
    # a compacted ledger is one file of every batch: opening reads its newest row group only
    max_row_group_size=LEDGER_GROUP_ROWS,
    compression="SNAPPY", default_column_properties=ColumnProperties(statistics_enabled="NONE"),
    column_properties={column: ColumnProperties(statistics_enabled="CHUNK") for column in LEDGER_STATS_COLUMNS})
LEDGER_FILES = appends.FileOptions(statistics=LEDGER_STATS_COLUMNS)
LEDGER_ARROW = pl.DataFrame(schema=LEDGER_SCHEMA).to_arrow().schema
# the ledger's columns as DuckDB types (a column older files lack reads as a null of its type)
_DUCK_TYPES = {"batch_no": "BIGINT", "batch_key": "VARCHAR", "committed_at": "TIMESTAMPTZ", "versions": "VARCHAR",
               "next_profile_n": "BIGINT", "next_update_seq": "BIGINT", "seed": "VARCHAR", "responses": "VARCHAR",
               "kind": "VARCHAR", "digest": "VARCHAR", "subjects": "VARCHAR[]", "responses_dropped": "VARCHAR"}
ECHO_ROWS = 64  # ledger rows whose responses are searched at once (one can hold a big batch's)
RESPONSE_RETENTION = timedelta(days=7)  # a keyed batch's responses are kept this long (default)
# ledger rows that move rows between files and change no content: a batch that read the store
# before one of them still holds (it is not stale)
LAYOUT_KINDS = ("merge", "compaction")
_CHANGED_CONTENT = ~pl.col("kind").is_in(LAYOUT_KINDS).fill_null(False)  # a ledger row of a batch
CRASH_ENV = "ENGAGELAKE_CRASH_AT"
# without `compression`, WriterProperties writes uncompressed Parquet
WRITER = WriterProperties(max_row_group_size=ROW_GROUP_ROWS, compression="SNAPPY")
# Columns whose every value is its own (keys, emails, sequence numbers) in the tables where
# they are: a dictionary there only costs the writer and the reader. 1M profile rows were
# written in 0.53-0.70 s against 0.89-0.91 s, 9% smaller, and a pyarrow rewrite of a profiles
# file read 50 row groups in 11.1 ms against 13.0-13.8 ms.
PLAIN_COLUMNS: dict[str, tuple[str, ...]] = {
    "profiles": ("service_id", "external_id", "email", "phone", "created_seq", "update_seq"),
    "external_ids": ("external_id", "service_id"),
    **{index: tuple(SCHEMAS[index]) for index in INDEXES},
}
COMPACTING = "_compacting"  # marker file: a compaction is under way
MERGING = "_merging"  # a merge pass's files before they are published (`merge_runs`)
# bytes per file of a merged or compacted run: a point read pays per file it opens, so a run's
# rows stay in one file up to this size (a 10M-user store's tables: one file each, 237-615 MB).
# A warm export of 50 users at 10M, compacted: 42.9-48.9 ms p50 in one file a table against
# 50.2-52.3 in delta-rs' 100 MiB files (5-6 a table); 2M-row files (9-13) were 9% slower still.
# The cap bounds a file's footer (1,024-row groups: about 16,000 at most) and a writer's buffer.
MERGED_FILE_BYTES = 1 << 30
CREATING = "_creating"  # marker file: a store is being created (its ledger is written last)
WRITER_LOCK = "_writer.lock"
MERGE_ENV = "ENGAGELAKE_MERGE_TRIGGER"  # runs a table may hold before a batch merges (tuning, tests)
# A batch's run of at least this many rows gets its footer index and Bloom filter before the
# batch commits, as merged runs do after their merge: a probe of a key the run lacks then skips
# it instead of reading the row group its fences name. Below it, a probe reads a few row groups
# at most, and indexing would cost every small commit (a 1,024-row file: 2.8 ms).
INDEXED_RUN_ROWS = 8 * ROW_GROUP_ROWS


def writer(name: str) -> WriterProperties:
    """How `name`'s files are written: WRITER, with no dictionary for its unique columns."""
    columns = PLAIN_COLUMNS.get(name)
    if not columns:
        return WRITER
    return WriterProperties(max_row_group_size=ROW_GROUP_ROWS, compression="SNAPPY",
                            column_properties={c: ColumnProperties(dictionary_enabled=False) for c in columns})


def file_options(name: str) -> appends.FileOptions:
    """`writer(name)` for the files `store/appends.py` writes."""
    return appends.FileOptions(row_group_rows=ROW_GROUP_ROWS, plain=PLAIN_COLUMNS.get(name, ()))


def _has_log(table: Path) -> bool:
    """Whether a local folder holds a Delta log with at least one entry or checkpoint."""
    log = table / "_delta_log"
    return log.is_dir() and any(p.suffix in (".json", ".parquet") for p in log.iterdir())


def store_state(uri: str | Path) -> str:
    """What is at `uri`: "store" (a ledger is there) or "new" (nothing, an empty folder, or a
    creation that died before its ledger: a store may be created there). Raises NotAStore for a
    file or a folder of other things, StoreDamaged for tables without a ledger: no store is
    ever created over them."""
    uri = str(uri)
    if "://" in uri:
        if objects.is_delta_table(f"{uri.rstrip('/')}/{LEDGER}"):
            return "store"
        if (found := [n for n in STORED if objects.is_delta_table(f"{uri.rstrip('/')}/{n}")]) and \
                not objects.exists(_at(uri, CREATING)):  # a creation under way, or that died
            raise StoreDamaged(_no_ledger(uri, found))
        return "new"
    root = Path(uri)
    if not root.exists():
        return "new"
    if not root.is_dir():
        raise NotAStore(f"{uri} is a file, not a store folder: pass the folder of a store, or a new path to "
                        "create one there")
    try:
        entries = {p.name for p in root.iterdir()} - {WRITER_LOCK}
    except PermissionError as error:
        raise StoreError(f"cannot list the store folder {uri}: {error.strerror}") from error
    if _has_log(root / LEDGER):
        return "store"
    if not entries or CREATING in entries:
        return "new"
    tables = [n for n in STORED if n in entries] + sorted(
        n for n in entries if n not in STORED and (n == LEDGER or _has_log(root / n)))
    if tables:
        raise StoreDamaged(_no_ledger(uri, tables))
    shown = ", ".join(sorted(entries)[:5]) + (", ..." if len(entries) > 5 else "")
    raise NotAStore(f"{uri} holds files ({shown}) but no engagelake store, and no store is created there: "
                    "pass the folder of a store, or an empty or new folder to create one")


def _no_ledger(uri: str, tables: list[str]) -> str:
    shown = ", ".join(tables[:5]) + (", ..." if len(tables) > 5 else "")
    return (f"the store at {uri} has tables ({shown}) but no ledger ({LEDGER}/_delta_log): nothing says which "
            f"of their versions are committed, so it is not opened and no new store is created over it. Restore "
            f"{LEDGER} from a backup; `engagelake check --store {uri}` lists what is there")


@contextmanager
def writer_lock(root: Path, timeout: float | None = None) -> Iterator[None]:
    """One writer at a time: an advisory lock file in a local store. A store the process may
    not write raises StoreReadOnly. With a `timeout` (seconds) the lock is polled, with
    jitter, and a writer that holds it longer raises StoreError."""
    try:
        handle = open(root / WRITER_LOCK, "w")  # noqa: SIM115 - closed below, after the lock is released
    except OSError as error:
        if error.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
            raise StoreReadOnly(f"the store at {root} is read-only ({error.strerror}): it can be read, not "
                                "written") from error
        raise
    with handle:
        if timeout is None:
            fcntl.flock(handle, fcntl.LOCK_EX)
        else:
            deadline = time.monotonic() + timeout
            while True:
                try:
                    fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() >= deadline:
                        raise StoreError(
                            f"other writers held the store at {root} for more than {timeout:.0f} s; "
                            "retry later, or open the workspace with a longer retry_for") from None
                    time.sleep(_JITTER.uniform(0.005, 0.02))
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


# a crash point's prefix under which a commit still writes its tables side by side (`_TableWrites`)
SIDE_BY_SIDE = "side_by_side:"


def _failpoint(name: str) -> None:
    """Kill this process at a named point of the commit protocol (crash tests only)."""
    point = os.environ.get(CRASH_ENV)
    if point is not None and point.removeprefix(SIDE_BY_SIDE) == name:
        os.kill(os.getpid(), signal.SIGKILL)


def _stored_schema(name: str) -> dict[str, pl.DataType]:
    """A table's columns as stored: its schema, the batch, the tombstone flag, and for `PARTIAL`
    tables the mask of the fields a partial row sets (files written before it lack it: null)."""
    schema = {**SCHEMAS[name], "_batch": pl.Int64(), "_deleted": pl.Boolean()}
    if name in PARTIAL:
        schema[SET] = pl.Int64()
    return schema


@cache  # a commit asks for it once per table written
def _arrow_schema(name: str) -> pa.Schema:
    """The stored schema as Arrow writes it (what DuckDB's batches are cast to)."""
    return pl.DataFrame(schema=_stored_schema(name)).to_arrow().schema


def _batch_rows(name: str, ups: pl.DataFrame | None, dels: pl.DataFrame | None, batch_no: int) -> pl.DataFrame:
    """A batch's rows of one table as stored: upserts, then tombstones of deleted keys."""
    parts = []
    if ups is not None:
        parts.append(ups.with_columns(_batch=pl.lit(batch_no, pl.Int64), _deleted=pl.lit(False)))
    if dels is not None:
        parts.append(dels.with_columns(_batch=pl.lit(batch_no, pl.Int64), _deleted=pl.lit(True)))
    return pl.concat(parts, how="diagonal_relaxed").select(
        [pl.col(c).cast(t) if c in parts[0].columns or c in parts[-1].columns else pl.lit(None).cast(t).alias(c)
         for c, t in _stored_schema(name).items()])


def _columns(rows: pl.DataFrame | None, columns: list[str]) -> pl.DataFrame | None:
    return None if rows is None else rows.select(columns)


WRITE_THREADS = min(2, os.cpu_count() or 1)  # tables a commit writes at once


@cache
def _write_pool() -> ThreadPoolExecutor:
    return ThreadPoolExecutor(max_workers=WRITE_THREADS, thread_name_prefix="engagelake-writes")


class _TableWrites:
    """A commit's table appends, run side by side: each encodes its Parquet in one thread
    (pyarrow, without the GIL), and P1's commit wrote five big tables one after another (2.3 s
    of its 3.6 s). The appends are independent Delta commits; the ledger row after them makes
    them visible together, so their order does not matter to a reader, nor to a crash (a table
    ahead of the ledger is rolled back, whichever). Under a crash failpoint they run one by one
    in the fixed order, so that a failpoint names a point between two tables (unless it says
    `SIDE_BY_SIDE`: then the process dies with the other write running)."""

    def __init__(self, store: DeltaStore, versions: dict[str, int]):
        self.store = store
        self.versions = versions  # each write sets its own table's entry
        point = os.environ.get(CRASH_ENV)
        self.serial = WRITE_THREADS < 2 or (point is not None and not point.startswith(SIDE_BY_SIDE))
        self.running: list[Future[None]] = []

    def write(self, name: str, rows: Callable[[], pl.DataFrame | pa.RecordBatchReader]) -> None:
        if self.serial:
            self.store._write_rows(name, rows(), self.versions)
        else:
            self.running.append(_write_pool().submit(lambda: self.store._write_rows(name, rows(), self.versions)))

    def wait(self) -> None:
        """Wait for every write, then raise the first one's error. Once one failed, the writes
        not started are cancelled."""
        errors = [error for future in self._ended()
                  if not future.cancelled() and (error := future.exception()) is not None]
        if errors:
            raise errors[0]

    def abandon(self) -> None:
        """Cancel the writes not started and wait for the others (the batch failed already:
        their errors go unseen)."""
        for future in self.running:
            future.cancel()
        self._ended()

    def _ended(self) -> list[Future[None]]:
        """The writes, once every one has ended; those not started are cancelled once one failed.
        An interrupt (Ctrl-C) does not cut the wait short, but cancels what has not started and
        is raised after: the writer lock must not be let go while a table is being appended."""
        running, self.running = self.running, []
        pending: set[Future[None]] = set(running)
        interrupt: BaseException | None = None
        while pending:
            try:
                done, pending = wait_for(pending, return_when=FIRST_EXCEPTION)
            except BaseException as error:  # noqa: BLE001 - raised below, once the writes ended
                interrupt, done = interrupt or error, set()
            failed = any(not f.cancelled() and f.exception() is not None for f in done)
            if interrupt is not None or failed:
                for future in pending:
                    future.cancel()
        if interrupt is not None:
            raise interrupt
        return running


@dataclass(frozen=True)
class StoredBatch:
    """A committed batch found by its idempotency key."""

    responses: list[Any] | None  # [[status, body], ...]; None once dropped (see `dropped`)
    digest: str | None  # of its requests; None when the ledger row predates digests
    committed_at: datetime
    dropped: str | None = None  # "expired" or "erased": why its responses are gone


@dataclass(frozen=True)
class Head:
    """The last committed batch: what readers see."""

    batch_no: int
    versions: dict[str, int]
    next_profile_n: int
    next_update_seq: int
    seed: str
    content_batch: int = 0  # the last batch that changed content (not a merge or compaction)


class DeltaStore:
    """Thin layer over `deltalake`: table paths, reads at pinned versions, the commit protocol."""

    def __init__(self, uri: str | Path, *, seed: str | None = None, memory_limit: str | None = None,
                 create: bool = True):
        """Open the store at `uri`; where `store_state` finds none (a new path or an empty
        folder) create one, or with `create=False` raise NotAStore."""
        self.uri = str(uri)
        self.local = "://" not in self.uri  # a folder: file locks, markers and footer indexes work
        # on object storage, writers take turns through a lease (`store/lease.py`)
        self._lease = None if self.local else Lease(self.uri)
        self.footers = FooterCache(root=self.uri if self.local else None)
        self.memory_limit = memory_limit
        self.merge_trigger = int(os.environ.get(MERGE_ENV) or merging.MERGE_TRIGGER)
        if store_state(self.uri) == "new":
            if not create:
                raise NotAStore(f"no store at {self.uri}: pass the folder of a store (`Workspace.create` or "
                                "`engagelake demo`/`apply` make one)")
            if self._lease is None:
                self._create(seed or uuid.uuid4().hex)
            else:  # writers that open one new store at once: the first creates it, under the lease
                with self._lease.held(None):
                    if store_state(self.uri) == "new":
                        self._create(seed or uuid.uuid4().hex)
        elif objects.exists(_at(self.uri, CREATING)):
            self._end_creation()  # the ledger landed: the store is whole
        self._ledger_table: DeltaTable | None = None
        self._ledger_version = -1
        self._ledger_columns: frozenset[str] = frozenset()  # on object storage, once the ledger was loaded
        self._logs: dict[str, checkpoints.Files] = {}  # on object storage, per table: the files of the version read last
        self._ledger_properties_set = False
        self.response_retention = RESPONSE_RETENTION  # a workspace setting (`Workspace.open`)
        try:
            self.head = self._read_head()
        except StoreError:
            raise
        except Exception as error:  # noqa: BLE001 - deltalake's own errors: translated or re-raised
            raise self.damaged(error) from error
        # the caches below are filled by probes that may run side by side (`State.prefetch`)
        self._cache_lock = threading.RLock()
        self._files: dict[tuple[str, int], list[str]] = {}  # data files per table version
        self._tables: dict[tuple[str, int], DeltaTable] = {}  # their loaded logs (a folder's)
        self._cursors: dict[str, DeltaTable] = {}  # one loaded log per table (object storage)
        self._actions: dict[tuple[str, int], pa.Table] = {}  # their add actions, with file statistics
        self._runs: dict[tuple[str, int], list[merging.Run]] = {}  # their runs, from the actions (`runs`)
        self._written: dict[str, DeltaTable] = {}  # each table at its newest version, for writes (`_latest`)
        self._heads: dict[str, tuple[int, frozenset[str]]] = {}  # each table's newest version and columns (`_newest`)
        # per table version and column: each data file's (min, max) from the Delta log's statistics
        self._ranges: dict[tuple[str, int, str], dict[str, tuple[str | None, str | None]]] = {}
        self.column_scans: list[tuple[str, str]] = []  # probes that read a whole column (tests)
        self.merges: list[tuple[str, int, float]] = []  # run merges: (table, runs merged, seconds)
        # merge runs after each commit in a thread of their own (off the batch's latency); False
        # merges before `commit` returns (deterministic layouts for tests and scripts)
        self.background_merges = True
        self._merger: threading.Thread | None = None
        self._exclusive_owner: int | None = None  # the thread inside `exclusive`
        self._merge_due: set[str] = set()  # tables the last commit left with runs to merge
        # the tables the commit under way leaves so: due only once its ledger row is written (a
        # merge pass that took them earlier would read a head without the batch's runs, find
        # nothing to merge, and leave them unmerged until the next commit)
        self._due_pending: set[str] = set()
        self._runs_to_index: list[tuple[str, str]] = []  # (table, file) of the batch being written
        self._due_lock = threading.Lock()  # `_merge_due` and `_merging`, between a batch and the merge thread
        self._merging = False  # a merge pass is running (`_start_merges`)
        self.merge_errors: list[BaseException] = []  # a failed merge pass loses nothing (see merge_runs)
        # failures after a batch's ledger row landed: the batch is committed all the same
        self.commit_errors: list[BaseException] = []

    @property
    def memory_limit(self) -> str | None:
        """The store's memory budget ("2GB"): DuckDB's for merges and compaction (it spills
        beyond), and half of it for the parsed footers probes keep."""
        return self._memory_limit

    @memory_limit.setter
    def memory_limit(self, limit: str | None) -> None:
        self._memory_limit = limit
        self.footers.budget = footer_budget(limit)

    def _path(self, name: str) -> str:
        return f"{self.uri.rstrip('/')}/{name}"

    def _create(self, seed: str) -> None:
        """Every table empty, then the ledger; a marker file says a creation is under way, so
        that a creation that died before its ledger is done again, not taken for damage."""
        if self.local:
            try:
                Path(self.uri).mkdir(parents=True, exist_ok=True)
                (Path(self.uri) / CREATING).touch()
            except OSError as error:
                raise StoreError(f"cannot create a store at {self.uri}: {error.strerror}") from error
        else:  # (created under the lease: `__init__`)
            objects.touch(_at(self.uri, CREATING))
        versions = {name: self._create_table(name) for name in STORED}
        _failpoint("create:before_ledger")
        self._append_ledger(0, None, versions, 0, 0, seed, [], kind="batch", create=True)
        self._end_creation()

    def _end_creation(self) -> None:
        with suppress(OSError):  # read-only: the next writer removes it
            objects.remove(_at(self.uri, CREATING))

    def damaged(self, error: BaseException) -> BaseException:
        """The error to raise for `error`, raised by a read or write below: StoreReadOnly for a
        write the file system refused, StoreDamaged naming the first problems `engagelake check`
        finds, else `error` itself."""
        if isinstance(error, OSError) and error.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
            where = error.filename or self.uri
            return StoreReadOnly(f"the store at {self.uri} cannot be written ({error.strerror}: {where}): it can be "
                                 "read, not written")
        if not self.local:
            return error
        from engagelake.store import check  # only on this error path

        report = check.check_store(self.uri)
        if report.healthy:
            return error
        hint = (f"run `engagelake repair --store {self.uri}`" if not report.unrepairable()
                else "restore the files named from a backup")
        return StoreDamaged(f"the store at {self.uri} is damaged ({len(report.problems)} problem(s)); {hint}; "
                            f"`engagelake check --store {self.uri}` lists every problem:\n{check.describe(report)}")

    def _latest(self, name: str) -> DeltaTable:
        """A table at its newest version, for a write under the writer lock: kept from the last
        write and loaded again when a version came since. A local store tells by its log: the
        kept version's entry is there and the next one is not (a compaction deletes the entries
        before its own). Loading a table's log cost a small batch's commit about 7 ms a table."""
        table = self._written.get(name)
        if table is None and not self.local:
            table = self._written[name] = objects.delta_table(self._path(name))
            if name != LEDGER and any(table.metadata().configuration.get(k) != v
                                      for k, v in objects.LOG_PROPERTIES.items()):
                table.alter.set_table_properties(objects.LOG_PROPERTIES)  # a table made before them
                # (the ledger gets them with its own properties, after the fence: `_append_ledger`)
        elif table is not None and not self.local:
            # object storage: the versions since, read from the log (a list and a get each),
            # not the whole log again (a get per entry since the last checkpoint, for each
            # table a batch writes: 988 requests in the 40th call of a new store)
            table.update_incremental()
        elif (table is None or not self.local or not self._log_entry(name, table.version()).exists()
                or self._log_entry(name, table.version() + 1).exists()):
            table = self._written[name] = objects.delta_table(self._path(name))
        return table

    def _at_named(self, name: str, named: int | None) -> DeltaTable:
        """`_latest(name)` on object storage, rolled back first to `named` (the version the
        ledger names) when it holds versions beyond it. No ledger row names them: a writer
        whose turn ended mid-commit wrote them (`_fenced_ledger` then refused its row), possibly after
        the next holder gave the lease back clean, so that `_recover` was skipped. A write
        built on them would publish their rows."""
        table = self._latest(name)
        if named is not None and table.version() > named:
            table.restore(named)
            table.update_incremental()  # the restore's own version, which the write follows
        return table

    def _create_table(self, name: str) -> int:
        """An empty table at its first version (also for tables added after the store was made)."""
        objects.write_delta(self._path(name), pl.DataFrame(schema=_stored_schema(name)).to_arrow(), mode="overwrite",
                            configuration=None if self.local else objects.LOG_PROPERTIES)
        return objects.delta_table(self._path(name)).version()

    def _append_ledger(self, batch_no: int, key: str | None, versions: dict[str, int], next_n: int,
                       next_seq: int, seed: str, responses: list[Any], *, kind: str, create: bool = False,
                       digest: str | None = None, subjects: pl.Series | None = None,
                       after: int | None = None) -> int | None:
        """Append one ledger row; returns the ledger version it made (None when creating).
        Responses are stored for a keyed batch only (nothing else can ask for them again),
        with the users they concern (`subjects`). `after`: on object storage, the ledger version
        the writer read its head at, under its lease; the row is written only as the version
        right after it (`_fenced_ledger`)."""
        if self._lease is not None and not create:
            self._lease.check()  # a writer whose turn ended must not publish
        keyed = key is not None
        row = pl.DataFrame(
            {
                "batch_no": [batch_no], "batch_key": [key], "committed_at": [datetime.now(UTC)],
                "versions": [orjson.dumps(versions).decode()], "next_profile_n": [next_n],
                "next_update_seq": [next_seq], "seed": [seed],
                "responses": [orjson.dumps(responses).decode() if keyed else None], "kind": [kind],
                "digest": [digest],
                "subjects": [(subjects if subjects is not None else pl.Series([], dtype=pl.String)) if keyed else None],
                "responses_dropped": [None],
            },
            schema=LEDGER_SCHEMA,
        )
        # a ledger written before a column gains it here (older rows: null)
        if create:
            objects.write_delta(self._path(LEDGER), row.to_arrow(), mode="append", schema_mode="merge",
                                writer_properties=LEDGER_WRITER,
                                configuration=LEDGER_PROPERTIES if self.local else {**LEDGER_PROPERTIES, **objects.LOG_PROPERTIES})
            return None
        if (not self.local and after is not None and self._ledger_properties_set
                and set(LEDGER_ARROW.names) <= self._ledger_columns):
            return self._append_ledger_remote(row.to_arrow(), after)
        # object storage: the ledger brought up to date once, fenced, then written on that very
        # version (a folder's appends go through `store/appends.py`)
        ledger = None if self.local else self._fenced_ledger(after)
        if ledger is not None:
            self._ledger_columns = frozenset(field.name for field in ledger.schema().fields)
        if not self._ledger_properties_set:  # a ledger made before them gets them (once per process)
            table = ledger or self._latest(LEDGER)
            wanted = LEDGER_PROPERTIES if self.local else {**LEDGER_PROPERTIES, **objects.LOG_PROPERTIES}
            if any(table.metadata().configuration.get(k) != v for k, v in wanted.items()):
                table.alter.set_table_properties(wanted)  # a version of our own: the row follows it
                table.update_incremental()
            self._ledger_properties_set = True
        return self._append(LEDGER, row.to_arrow(), LEDGER_ARROW, LEDGER_FILES, LEDGER_WRITER, table=ledger)

    def _append_ledger_remote(self, data: pa.Table, after: int) -> int:
        """A ledger row on object storage, as a table's append: its file, then its log entry put
        as version `after + 1` only where none is, which is the fence itself: a commit another
        writer made since `after` (the version this writer read its head at) makes the put
        fail. delta-rs' fenced write brought the ledger up to date first and read its new
        entry back after: about 10 requests against 2."""
        added = appends.write_file(self._path(LEDGER), data, LEDGER_ARROW, LEDGER_FILES)
        assert added is not None, "a ledger row"
        try:
            return appends.commit(self._path(LEDGER), after + 1, [added[0]], added[1])
        except StoreError:
            with suppress(Exception):  # the fence's error is the one to tell
                objects.remove(objects.join(self._path(LEDGER), added[0]["path"]))
            raise TurnEndedError(
                f"another writer committed to the store at {self.uri} after ledger version {after}, which this "
                "batch read: this writer's turn had ended; the batch was not committed") from None

    def _fenced_ledger(self, after: int | None) -> DeltaTable:
        """The ledger at its newest version, for a row written on it with no retry. With `after`
        (the version this writer read its head at, under its lease) it must still be that
        version. The lease alone leaves a gap: a holder paused past its lease (or whose
        renewals failed unseen) passes `Lease.check` just before another writer takes over and
        commits; its row would then land after theirs, naming table versions built on what
        they rolled back. As the row's commit allows no retry, a commit that comes between this
        check and the write fails it too."""
        table = self._latest(LEDGER)
        if after is not None and table.version() != after:
            raise TurnEndedError(f"another writer committed to the store at {self.uri} (ledger version "
                                 f"{table.version()}, this batch read {after}): this writer's turn had ended; "
                                 "the batch was not committed")
        return table

    def _append(self, name: str, data: pa.Table | pa.RecordBatchReader, schema: pa.Schema,
                options: appends.FileOptions, properties: WriterProperties, *, table: DeltaTable | None = None) -> int:
        """Append `data` to table `name` under the writer lock; returns the new version and
        notes its files and statistics for the next batch's reads. A local table that has the
        columns of `schema` takes a file and a log entry of our own (`store/appends.py`); a table
        gaining columns (written before them) and object storage go through delta-rs."""
        if self.local:
            version, columns = self._newest(name)
            if set(schema.names) <= columns:
                added = appends.write_file(self._path(name), data, schema, options)
                if added is not None and name in SORT_BY and added[1] >= INDEXED_RUN_ROWS:
                    # appended by the table's own write (`_TableWrites`): a list append is atomic
                    self._runs_to_index.append((name, os.path.join(self._path(name), added[0]["path"])))
                mine = appends.commit(self._path(name), version + 1, [added[0]] if added else [],
                                      added[1] if added else 0)
                self._heads[name] = (mine, columns)
                with self._cache_lock:  # the next batch's reads take files and statistics without loading the log
                    self._note_append(name, mine, None if added is None else added[0])
                return mine
        elif table is None and name != LEDGER and (appended := self._append_remote(name, data, schema, options)) is not None:
            return appended
        # the write moves it to its new version; the ledger comes positioned (`_fenced_ledger`)
        table = table or self._at_named(name, self.head.versions.get(name))
        objects.write_delta(table, data, mode="append", writer_properties=properties,
                            schema_mode="merge" if name in PARTIAL or name == LEDGER else None,
                            commit_properties=CommitProperties(max_commit_retries=0) if name == LEDGER else None)
        self._heads.pop(name, None)
        if name != LEDGER:
            with self._cache_lock:
                self._note_files(name, table.version(), table)
                if name in SORT_BY:  # the tables probed by file statistics and merged by runs
                    self._note_actions(name, table.version(), table)
        return table.version()

    def _append_remote(self, name: str, data: pa.Table | pa.RecordBatchReader, schema: pa.Schema,
                       options: appends.FileOptions) -> int | None:
        """On object storage, as on a folder: the file, then the log entry of our own, put only
        where none is (S3's conditional put): 2 requests where delta-rs' write made 8 (its log
        listed before, to check and after the commit, the new entry read back twice). The
        version is the one after the version the ledger names: this process's last write when
        that is it, else the table loaded and its stray versions rolled back (`_at_named`);
        when another version came since (another writer's), the entry is refused, the file
        removed, and None says to write through delta-rs. None also for a table gaining
        columns."""
        version, columns = self._remote_base(name, self.head.versions.get(name))
        if not set(schema.names) <= columns:
            return None
        added = appends.write_file(self._path(name), data, schema, options)
        try:
            mine = appends.commit(self._path(name), version + 1, [added[0]] if added else [],
                                  added[1] if added else 0)
        except StoreError:
            self._heads.pop(name, None)
            if added is not None:
                objects.remove(objects.join(self._path(name), added[0]["path"]))
            return None
        self._heads[name] = (mine, columns)
        with self._cache_lock:
            self._note_append(name, mine, None if added is None else added[0])
        return mine

    def _remote_base(self, name: str, named: int | None) -> tuple[int, frozenset[str]]:
        """On object storage, the version a write of our own follows, and its columns: the
        version the ledger names (`named`). Only that one: this process's last write may be one
        no ledger row named (its batch failed, or its lease ended), and a compaction since may
        have deleted the entries after it, so that a put there would be taken."""
        kept = self._heads.get(name)
        if kept is None and named is not None:  # a fresh process: the log read as a checkpoint
            # is, and one listing to tell no version came after the named one
            with self._cache_lock:
                read = self._remote_files(name, named)
            if read is not None and read.columns is not None and not objects.entries_after(self._path(name), named):
                kept = self._heads[name] = (named, read.columns)
        if kept is None or kept[0] != named:
            table = self._at_named(name, named)
            kept = (table.version(), frozenset(field.name for field in table.schema().fields))
        return kept

    def _newest(self, name: str) -> tuple[int, frozenset[str]]:
        """A table's newest version and its columns, for an append under the writer lock: kept
        from this process's last write while the log holds no entry after it (`_latest`)."""
        kept = self._heads.get(name)
        if kept is None and self.head.versions.get(name) == 0 and (columns := self._as_created(name)) is not None:
            kept = (0, columns)  # a table no batch wrote yet
        if (kept is None or not self._log_entry(name, kept[0]).exists()
                or self._log_entry(name, kept[0] + 1).exists()):
            table = self._latest(name)
            kept = self._heads[name] = (table.version(), frozenset(f.name for f in table.schema().fields))
        return kept

    def _note_append(self, name: str, version: int, add: dict[str, Any] | None) -> None:
        """Note the files and add actions of a version this process appended `add` to (the
        cache lock is held), from those of the version before, when they are known."""
        files = self._files.get((name, version - 1))
        if files is not None:
            new = [] if add is None else [os.path.abspath(os.path.join(self._path(name), add["path"])) if self.local
                                          else objects.join(self._path(name), add["path"])]
            self._keep_files(name, version, [*files, *new])
        actions = self._actions.get((name, version - 1))
        if name in SORT_BY and actions is not None:
            self._keep_actions(name, version, actions if add is None else appends.with_action(actions, add))
        runs = self._runs.get((name, version - 1))
        if name in SORT_BY and add is not None and runs is not None:
            # the new file is a run of its own, newer than every other: the runs need not be
            # drawn from every file's statistics again (3 ms a table in a small batch's commit)
            run = merging.run_of_add(add, self._path(name))
            if run is not None and (not runs or run.first > runs[0].last):
                self._keep_runs(name, version, [run, *runs])

    def _ledger(self, columns: list[str]) -> pl.DataFrame:
        table = objects.delta_table(self._path(LEDGER))
        present = {field.name for field in table.schema().fields}
        frame = pl.from_arrow(table.to_pyarrow_table(columns=[c for c in columns if c in present]))
        assert isinstance(frame, pl.DataFrame)
        return frame.with_columns(pl.lit(None, LEDGER_SCHEMA[c]).alias(c) for c in columns if c not in present)

    def _read_head(self, table: DeltaTable | None = None, *, note: bool = True) -> Head:
        """The ledger's newest row, and its newest row that changed content. Reads the ledger's
        newest files only (one per batch, found by their `batch_no` statistics): a store of
        many batches opens as fast as a new one. `table`: the ledger, already loaded.

        `note`: remember the ledger version read, for `refresh`. Only a caller that makes the
        head it reads `self.head` may note it: a noted version whose head is not `self.head`
        makes `refresh` miss other writers' batches (a run merge that read the head and found
        nothing to merge let the next batch commit over a batch it never read: a lost update)."""
        table = table or objects.delta_table(self._path(LEDGER))
        if note:
            self._ledger_table, self._ledger_version = table, table.version()
        columns = ["batch_no", "versions", "next_profile_n", "next_update_seq", "seed", "kind"]
        rows = self._head_rows(table, columns)
        if rows.height == 0:
            raise StoreError(f"store at {self.uri} has an empty ledger; it was not created by engagelake")
        r = rows.row(-1, named=True)
        content = rows.filter(_CHANGED_CONTENT)["batch_no"]
        return Head(r["batch_no"], orjson.loads(r["versions"]), r["next_profile_n"], r["next_update_seq"], r["seed"],
                    content_batch=content.max() if content.len() else 0)  # type: ignore[arg-type]

    def _head_rows(self, table: DeltaTable, columns: list[str]) -> pl.DataFrame:
        """Ledger rows by `batch_no`: those of the newest files (local stores whose files have
        statistics), enough to hold the newest row and the newest content row; else all."""
        actions = pa.table(table.get_add_actions(flatten=True))
        if "max.batch_no" not in actions.column_names or actions.column("max.batch_no").null_count:
            return self._ledger(columns).sort("batch_no")
        uris = _paths_by_name(table)
        newest = pl.DataFrame(actions.select(["path", "max.batch_no"])).sort("max.batch_no", descending=True)
        parts: list[pl.DataFrame] = []
        content: int | None = None  # the newest content row's batch found so far
        for path, file_max in newest.iter_rows():  # a few files, a few row groups: the newest content row is near
            if content is not None and file_max <= content:
                break
            file = pq.ParquetFile(objects.open_input(uris[_file_name(path)]))
            names = file.schema_arrow.names
            for group, group_max in _groups_newest_first(file, "batch_no"):
                if content is not None and group_max is not None and group_max <= content:
                    break
                frame = pl.DataFrame(pl.from_arrow(file.read_row_group(group, columns=[c for c in columns if c in names])))
                parts.append(frame.with_columns(pl.lit(None, LEDGER_SCHEMA[c]).alias(c) for c in columns if c not in names))
                found = parts[-1].filter(_CHANGED_CONTENT).select(pl.col("batch_no").max()).item()
                if found is not None and (content is None or found > content):
                    content = int(found)
        return pl.concat(parts, how="vertical_relaxed").sort("batch_no")

    def _recover(self, head: Head | None = None, tables: list[str] | None = None) -> None:
        """Roll back tables (of `tables`, default all) that hold writes of a batch (or a merge)
        that never reached the ledger (a dead writer's); only called under the writer lock, so
        no live writer is mid-commit. A dead compaction is rolled forward instead (it changed
        no content; its old files are gone)."""
        head = head or self.head
        if self._lease is not None and self._lease.clean_before:
            return  # the writer before this lease finished cleanly: nothing to roll back
        if self._compacting():
            # an index the head does not name yet may be half built: it stays unpublished (and
            # probes scan its column) until the next compaction builds it whole
            unbuilt = {index for index in INDEXES if index not in self.head.versions}
            self._finish_compaction(self.head.batch_no + 1, [n for n in STORED if n not in unbuilt])
            objects.remove(self._compaction_marker())
            return
        for name in STORED if tables is None else tables:
            # a table the ledger does not name yet was created (and maybe written) by a dead writer
            version = head.versions.get(name, 0)
            if self.local and name in head.versions and not self._log_entry(name, version + 1).exists():
                continue  # no commit after the ledger's version: nothing to roll back (loading
                # each of the 34 tables cost a small batch's commit 140 ms)
            if not objects.is_delta_table(self._path(name)):
                continue
            table = objects.delta_table(self._path(name))
            if table.version() > version:
                self._refuse_lost_batch(head)
                table.restore(version)
                # the version this process wrote last is no longer the table's newest: an
                # append or a merge on it would put the entry the restore took
                self._heads.pop(name, None)
                self._written.pop(name, None)

    def _refuse_lost_batch(self, head: Head) -> None:
        """Before a rollback: raise StoreDamaged when a ledger row file of a later batch is in no
        ledger log entry (the entry was lost: rolling back would drop a committed batch). The
        writer lock is held, so no live writer is between its row file and its log entry."""
        if not self.local:
            return
        from engagelake.store import check  # only when a table is ahead of the ledger

        if lost := check.lost_ledger_rows(Path(self.uri), objects.delta_table(self._path(LEDGER)), head.batch_no):
            path, batch = lost[0]
            raise StoreDamaged(
                f"the store at {self.uri} holds the ledger row of batch {batch} ({path}) but no ledger log entry "
                f"for it: the ledger's newest log entry was deleted or lost, and rolling the tables back would drop "
                f"the batch. Restore the entry from a backup, or see `engagelake check --store {self.uri}` and "
                f"`engagelake repair --store {self.uri}` (which discards batch {batch})")

    @contextmanager
    def _writer_lock(self) -> Iterator[None]:
        """One writer at a time: an advisory lock file in a local folder, a lease on object
        storage (`store/lease.py`). A thread inside `exclusive` holds it already."""
        if self._exclusive_owner == threading.get_ident():
            yield
            return
        if self._lease is not None:
            with self._lease.held(None):  # a dead holder's lease ends on its own
                yield
            return
        with writer_lock(Path(self.uri)):
            yield

    @contextmanager
    def exclusive(self, timeout: float) -> Iterator[None]:
        """Hold the writer lock for a whole batch, its reads and its commit, so that no other
        writer commits in between: a batch that another writer overtook runs again inside,
        and cannot be overtaken twice. Waits up to `timeout` seconds for the lock (polling,
        with jitter), then raises `StoreError`. On object storage the lock is the store's lease."""
        # a run merge takes the lock too: joining one while holding the lock would never end
        self.wait_for_merges()
        with self._lease.held(timeout) if self._lease is not None else writer_lock(Path(self.uri), timeout):
            self._exclusive_owner = threading.get_ident()
            try:
                yield
            finally:
                self._exclusive_owner = None

    def refresh(self) -> bool:
        """True when another writer committed since we last looked (then the head is re-read).
        A cheap check: only the ledger's new log entries are read."""
        if self._ledger_table is None:
            self._ledger_table = objects.delta_table(self._path(LEDGER))
        elif self.local and not self._ledger_entry(self._ledger_version + 1).exists():
            return False  # a Delta commit creates its log entry atomically: none, nothing new
        elif not self.local and not objects.entries_after(self._path(LEDGER), self._ledger_version):
            return False  # one listing: the loaded ledger is not brought up to date for nothing
        else:
            self._ledger_table.update_incremental()
        if self._ledger_table.version() == self._ledger_version:
            return False
        head = self._read_head(self._ledger_table)
        changed = head.batch_no != self.head.batch_no
        self.head = head
        return changed

    def _ledger_entry(self, version: int) -> Path:
        return self._log_entry(LEDGER, version)

    def _log_entry(self, name: str, version: int) -> Path:
        """The log entry of one version of a local table (a Delta commit creates it atomically)."""
        return Path(self._path(name)) / "_delta_log" / f"{version:020d}.json"

    def files(self, name: str, version: int | None) -> list[str]:
        """The data files of one table version (cached: a version never changes)."""
        if version is None:
            return []
        with self._cache_lock:
            files = self._files.get((name, version))
            if files is None and version == 0 and self._as_created(name) is not None:
                files = self._files[(name, version)]
            if files is None and (read := self._remote_files(name, version)) is not None:
                files = self._keep_files(name, version, [objects.join(self._path(name), p) for p in read.adds])
            if files is None:
                files = self._note_files(name, version, self._table_at(name, version))
            return files

    def _as_created(self, name: str) -> frozenset[str] | None:
        """The columns of a local table whose first version added no file (as a store creates
        every table), noting that version's files and add actions (none), so that neither
        that version nor those this process appends after it load the log; None otherwise."""
        columns = appends.created_empty(self._path(name)) if self.local else None
        if columns is not None:
            with self._cache_lock:
                self._keep_files(name, 0, [])
                if name in SORT_BY:
                    self._keep_actions(name, 0, appends.NO_ACTIONS)
        return columns

    def _note_files(self, name: str, version: int, table: DeltaTable) -> list[str]:
        """Cache the data files of `table`, loaded at `version` (the cache lock is held)."""
        files = table.file_uris()
        if self.local:  # delta-rs gives file URIs percent-encoded; readers want the path
            files = [unquote(uri) for uri in files]
        return self._keep_files(name, version, files)

    def _keep_files(self, name: str, version: int, files: list[str]) -> list[str]:
        _bounded(self._files, self.head)
        self._files[(name, version)] = files
        return files

    def _table_at(self, name: str, version: int) -> DeltaTable:
        """The table's log loaded at `version` (cached; the cache lock is held). On object
        storage one loaded log per table moves forward to the versions asked (reading only the
        entries since), and the callers keep what they take from it."""
        if not self.local:
            cursor = self._cursors.get(name)
            if cursor is None or cursor.version() > version:
                cursor = self._cursors[name] = objects.delta_table(self._path(name), version)
            elif cursor.version() < version:
                cursor.load_as_version(version)
            return cursor
        table = self._tables.get((name, version))
        if table is None:
            if len(self._tables) > 4 * len(STORED):
                self._tables.clear()
            table = self._tables[(name, version)] = objects.delta_table(self._path(name), version)
        return table

    def _actions_at(self, name: str, version: int) -> pa.Table:
        """The add actions (one per file, with statistics) of a table version (cached; the
        cache lock is held)."""
        actions = self._actions.get((name, version))
        if actions is None and (read := self._remote_files(name, version)) is not None:
            actions = self._keep_actions(name, version, appends.actions_of(list(read.adds.values())))
        if actions is None:
            actions = self._note_actions(name, version, self._table_at(name, version))
        return actions

    def _remote_files(self, name: str, version: int) -> checkpoints.Files | None:
        """On object storage, the files of a table version as engagelake reads its log
        (`checkpoints.files_at`: a fresh process's read of a table is 2 requests and one an
        entry since the last checkpoint, where delta-rs made 13 and two an entry), moving
        forward from the version read last; None on a folder, or where it cannot tell (the
        cache lock is held)."""
        if self.local:
            return None
        known = self._logs.get(name)
        try:
            read = checkpoints.files_at(self._path(name), version, known)
            if read is None and known is not None and known.version <= version:
                # the entries after the version read last may be gone (a compaction cleans the
                # log up before its checkpoint): from the last checkpoint, then
                read = checkpoints.files_at(self._path(name), version)
        except Exception:  # noqa: BLE001 - a log this cannot read: delta-rs reads it, or says why not
            read = None
        if read is not None and (known is None or read.version >= known.version):
            self._logs[name] = read
        return read

    def _note_actions(self, name: str, version: int, table: DeltaTable) -> pa.Table:
        return self._keep_actions(name, version, pa.table(table.get_add_actions(flatten=True)))

    def _keep_actions(self, name: str, version: int, actions: pa.Table) -> pa.Table:
        _bounded(self._actions, self.head)
        self._actions[(name, version)] = actions
        return actions

    def file_ranges(self, name: str, version: int, column: str) -> dict[str, tuple[str | None, str | None]]:
        """Each data file's (as `files` names it) minimum and maximum of `column` at one table
        version, from the statistics of its add action (cached: a version never changes)."""
        with self._cache_lock:
            return self._file_ranges(name, version, column)

    def _file_ranges(self, name: str, version: int, column: str) -> dict[str, tuple[str | None, str | None]]:
        ranges = self._ranges.get((name, version, column))
        if ranges is None:
            if len(self._ranges) > 4 * len(STORED):
                self._ranges.clear()
            uris = self.files(name, version)
            actions = self._actions_at(name, version)
            low, high = f"min.{column}", f"max.{column}"
            by_name = {}
            if low in actions.column_names and high in actions.column_names:
                by_name = {_file_name(path): (lo, hi) for path, lo, hi in zip(  # one per file
                    actions.column("path").to_pylist(), actions.column(low).to_pylist(),
                    actions.column(high).to_pylist(), strict=True)}
            # file URIs are absolute and percent-encoded, add-action paths relative: match by name
            ranges = {uri: by_name.get(_file_name(uri), (None, None)) for uri in uris}
            self._ranges[(name, version, column)] = ranges
        return ranges

    def stored_rows(self, name: str, version: int) -> int:
        """The rows of a table version's files, every version of a key counted, from their add
        actions' statistics (a file without them counts none): no file is opened."""
        with self._cache_lock:
            actions = self._actions_at(name, version)
        if "num_records" not in actions.column_names:
            return 0
        return int(pc.sum(actions.column("num_records")).as_py() or 0)

    def holds_partial_rows(self, name: str, version: int | None) -> bool:
        """Whether a file of `name` at `version` may hold partial rows (by its statistics)."""
        if name not in PARTIAL or version is None or not self.files(name, version):
            return False
        with self._cache_lock:
            actions = self._actions_at(name, version)
        return bool(merging.partial_files(pl.DataFrame(actions)).any())

    def runs(self, name: str, version: int | None) -> list[merging.Run]:
        """The sorted runs of one table version, newest first (only a writer needs them: read
        from the add actions' statistics here, not on every snapshot read)."""
        if version is None:
            return []
        with self._cache_lock:
            runs = self._runs.get((name, version))
            if runs is None:  # a commit asks for each table it wrote (3.6 ms a time under cProfile)
                runs = self._keep_runs(name, version, merging.runs_of(
                    pl.DataFrame(self._actions_at(name, version)), self._path(name)))
            return runs

    def _keep_runs(self, name: str, version: int, runs: list[merging.Run]) -> list[merging.Run]:
        _bounded(self._runs, self.head)
        self._runs[(name, version)] = runs
        return runs

    def snapshot(self) -> Snapshot:
        """The committed tables at the current head, read on demand (nothing is read here)."""
        self._settle_compaction()
        return Snapshot(self, self.head)

    def snapshot_at(self, batch_no: int) -> Snapshot:
        """The committed tables as batch `batch_no` left them (a ledger row: a batch, a merge or
        a compaction), for readers in several processes that must see one cut. Their files
        stay until a compaction after it deletes them; a read then fails."""
        self.refresh()
        if batch_no == self.head.batch_no:
            return self.snapshot()
        r = self._ledger_row(("batch_no", batch_no), ["versions", "next_profile_n", "next_update_seq", "seed"])
        if r is None:
            raise StoreError(f"the store at {self.uri} holds no batch {batch_no} (its newest is "
                             f"{self.head.batch_no})")
        self._settle_compaction()
        return Snapshot(self, Head(batch_no, orjson.loads(r["versions"]), r["next_profile_n"], r["next_update_seq"],
                                   r["seed"], content_batch=batch_no))

    def _ledger_row(self, where: tuple[str, Any], columns: list[str]) -> dict[str, Any] | None:
        """The `columns` (those the ledger has) of its row whose column `where[0]` equals
        `where[1]`, reading only that row's data (the ledger's files hold statistics of both
        columns asked by); None when there is none. Object storage reads the ledger's log as
        `refresh` keeps it; a folder loads it (its own appends do not move the kept one)."""
        if self.local:
            table = objects.delta_table(self._path(LEDGER))
        else:
            self.refresh()
            assert self._ledger_table is not None
            table = self._ledger_table
        present = {field.name for field in table.schema().fields}
        rows = table.to_pyarrow_table(columns=[c for c in columns if c in present], filters=[(where[0], "=", where[1])])
        return {name: rows.column(name)[0].as_py() for name in rows.column_names} if rows.num_rows else None

    def find_batch(self, key: str) -> StoredBatch | None:
        """The committed batch with this idempotency key, if any: its responses, the digest of
        its requests (None in a ledger written before digests) and its commit time."""
        row = self._ledger_row(("batch_key", key), ["responses", "digest", "committed_at", "responses_dropped"])
        if row is None:
            return None
        text = row.get("responses")
        return StoredBatch(None if text is None else orjson.loads(text), row.get("digest"), row["committed_at"],
                           dropped=row.get("responses_dropped") or (None if text is not None else "expired"))

    def commit(self, changes: Changes, *, key: str | None, responses: list[Any], next_profile_n: int,
               next_update_seq: int, index_entries_stored: dict[str, pl.DataFrame] | None = None,
               staged: Stages | None = None, digest: str | None = None,
               subjects: pl.Series | None = None, read_at: int | None = None) -> None:
        """Write one batch: every table's rows, then the ledger row that makes them visible.
        Raises StaleStoreError when another writer committed a batch since this one read the
        store (merges and compactions since then change no content: the batch still holds).
        Tables that now hold too many runs are merged afterwards (`merge_runs`).
        `index_entries_stored` names index entries the store holds already (those of stored
        rows the batch read): they are not written again. `staged` holds the batch's staged
        changes besides `changes`: its sorted tables stream from the stage files into their
        runs, the others come through `changes` (`Stages.changes`). `digest`: of the batch's
        requests, stored beside its key; `subjects`: the users the batch read or wrote, stored
        with a keyed batch's responses; `read_at`: the content batch of the head the batch read
        (default: the current head's), so that nothing that moves the head meanwhile can hide a
        batch it never read. A run merge may be under way meanwhile: it takes the writer lock
        only to publish its merged runs (`merge_runs`)."""
        base = self.head.content_batch if read_at is None else read_at
        self._due_pending = set()
        with self._writer_lock():
            self.refresh()  # the ledger is read again only if an entry came since we looked
            if self.head.content_batch != base:  # (before anything is written: `lease.held` relies on it)
                raise StaleStoreError(f"the store at {self.uri} changed since this batch read it")
            self._recover()
            self._write_batch(changes, key=key, responses=responses, next_profile_n=next_profile_n,
                              next_update_seq=next_update_seq, index_entries_stored=index_entries_stored or {},
                              staged=staged, digest=digest, subjects=subjects)
        with self._due_lock:
            self._merge_due |= self._due_pending
        if self._merge_due:
            try:
                self._start_merges()
            except Exception as error:  # noqa: BLE001 - the batch is committed: raising would say it was not
                self.merge_errors.append(error)

    # --- run merges, after the commit ------------------------------------------------------------
    def _start_merges(self) -> None:
        """Merge the tables due, in a thread (one merge pass at a time: while one runs, it takes
        the tables a commit made due meanwhile when its pass ends)."""
        with self._due_lock:
            if self._merging:
                return
            due, self._merge_due = [n for n in SORT_BY if n in self._merge_due], set()
            self._merging = bool(due)
        if not due:
            return
        if not self.background_merges:
            self._merge_passes(due)
            return
        self._merger = threading.Thread(target=self._merge_passes, args=(due,), name="engagelake-merge-runs")
        self._merger.start()  # not a daemon: a process that exits waits for its merge to finish

    def _merge_passes(self, due: list[str]) -> None:
        """Merge passes until no table is due. The batch is committed: a failed merge must not
        look like a failed batch (the store is intact; the next writer rolls it back)."""
        while True:
            try:
                self.merge_runs(due)
            except Exception as error:  # noqa: BLE001 - see above
                self.merge_errors.append(error)
            with self._due_lock:
                due, self._merge_due = [n for n in SORT_BY if n in self._merge_due], set()
                if not due:
                    self._merging = False
                    return

    def _merge_plan(self, runs: list[merging.Run]) -> list[merging.Run]:
        """The newest runs to merge into one (none, or at least two)."""
        older = merging.plan(runs[1:], runs[0].rows, trigger=self.merge_trigger) if runs else []
        return runs[: 1 + len(older)] if older else []

    def wait_for_merges(self) -> None:
        """Wait for this store's merge pass, if one is running (the next commit, compaction,
        `Workspace.close` and the process's exit do)."""
        merger, self._merger = self._merger, None
        if merger is not None:
            merger.join()

    def merge_runs(self, tables: list[str] | None = None) -> list[str]:
        """One merge pass: each sorted table (of `tables`, default all) holding more runs than
        the trigger merges its newest runs (`merging.plan`) into one, and one ledger row of
        kind "merge" publishes them all. Returns the tables merged.

        On a local store the merged files are written without the writer lock (batches commit
        meanwhile: a merge no longer stands in their way). Then, under the lock, each table
        whose merged runs are all still there takes one log entry that removes their files and
        adds the merged ones; a table whose runs went meanwhile (another writer's merge, a
        compaction) drops its merged files. Runs that batches appended since are newer and stay
        as they are, so the merged run replaces exactly what it read.

        A merge changes no content, so a crash midway loses nothing: the tables are ahead of
        the ledger, and the next writer rolls them back to the versions it names; merged files
        never published are left in `_merging/`, which the next compaction removes."""
        if not self.local:
            return self._merge_runs_locked(tables)
        if self._compacting():  # a dead compaction: the next batch or reader rolls it forward
            return []
        head = self._read_head(note=False)
        planned: dict[str, tuple[list[merging.Run], list[tuple[dict[str, Any], int]]]] = {}
        folder = Path(self.uri) / MERGING / uuid.uuid4().hex
        try:
            for name in SORT_BY if tables is None else tables:
                runs = self.runs(name, head.versions.get(name))
                if chosen := self._merge_plan(runs):
                    folder.mkdir(parents=True, exist_ok=True)
                    planned[name] = (chosen, self._merged_files(name, chosen, bottom=len(chosen) == len(runs),
                                                                into=str(folder)))
            merged, before, versions = self._publish_merges(planned, str(folder)) if planned else ([], {}, {})
        finally:
            shutil.rmtree(folder, ignore_errors=True)  # the merged files of tables not published
        for name in merged:
            old = set(self.files(name, before.get(name)))
            new = set(self.files(name, versions[name]))
            self.index_footers(name, [f for f in new if f not in old])
            if name in records.TABLES:  # readers of an older head read the replaced files as Parquet
                for gone in old - new:
                    records.remove(index_path(self.uri, gone))
        return merged

    def _publish_merges(self, planned: dict[str, tuple[list[merging.Run], list[tuple[dict[str, Any], int]]]],
                        folder: str) -> tuple[list[str], dict[str, int], dict[str, int]]:
        """Under the writer lock, swap in each planned table's merged files where its runs are
        all still there, then write the ledger row; returns the tables merged and the table
        versions before and after."""
        with self._writer_lock():
            if self._compacting():
                return [], {}, {}
            head = self._read_head(note=False)
            # the tables it merges must hold no dead writer's rows; the others keep the ledger's
            # versions here, and the next writer rolls them back
            self._recover(head, list(planned))
            versions = dict(head.versions)
            merged = []
            for name, (runs, written) in planned.items():
                version = versions.get(name)
                with self._cache_lock:
                    actions = self._actions_at(name, version) if version is not None else None
                present = {} if actions is None else dict(zip(
                    actions.column("path").to_pylist(), actions.column("size_bytes").to_pylist(), strict=True))
                root = self._path(name).rstrip("/") + "/"
                gone = [f.removeprefix(root) for run in runs for f in run.files]
                if version is None or actions is None or not all(path in present for path in gone):
                    continue  # merged meanwhile by another writer, or compacted
                adds = [add for add, _ in written]
                appends.move_in(self._path(name), folder, adds)
                # after the newest version: a rollback (`_recover`) adds versions after the ledger's
                newest, columns = self._newest(name)
                versions[name] = appends.commit(self._path(name), newest + 1, adds, sum(n for _, n in written),
                                                [(path, present[path]) for path in gone])
                self._heads[name] = (versions[name], columns)
                self._note_merge(name, version, versions[name], actions, gone, adds)
                merged.append(name)
                _failpoint(f"merge:{name}")
            self._merge_ledger_row(head, versions, merged)
        return merged, dict(head.versions), versions

    def _note_merge(self, name: str, before: int, version: int, actions: pa.Table, gone: list[str],
                    adds: list[dict[str, Any]]) -> None:
        """Note the files and statistics of `version`, which replaced the files `gone` (paths in
        the table) of version `before` (whose add actions are `actions`) by `adds`: the next
        reads need not load the log."""
        with self._cache_lock:
            removed = set(gone)
            self._keep_files(name, version, [
                *(f for f in self.files(name, before) if _file_name(f) not in removed),
                *(os.path.abspath(os.path.join(self._path(name), add["path"])) if self.local
                  else objects.join(self._path(name), add["path"]) for add in adds)])
            kept = actions.filter(pc.invert(pc.is_in(actions.column("path"), pa.array(gone))))
            for add in adds:
                kept = appends.with_action(kept, add)
            self._keep_actions(name, version, kept)

    def _merge_ledger_row(self, head: Head, versions: dict[str, int], merged: list[str], *,
                          after: int | None = None) -> None:
        """The ledger row of kind "merge" that publishes the tables `merged` (none: no row)."""
        if merged:
            _failpoint("before_merge_ledger")
            self._append_ledger(head.batch_no + 1, None, versions, head.next_profile_n, head.next_update_seq,
                                head.seed, [], kind="merge", after=after)

    def _merged_files(self, name: str, runs: list[merging.Run], *, bottom: bool, into: str | None = None,
                      sizes: list[int] | None = None) -> list[tuple[dict[str, Any], int]]:
        """The newest `runs` of `name` merged into one run, written as files in `into` (None:
        in the table's folder); returns their add actions and row counts. `sizes`: of the runs'
        files, in order, when known."""
        started = time.perf_counter()
        files = [f for run in runs for f in run.files]
        order = sort_order(name, KEYS[name])
        assert order is not None
        with merging.connection(self.memory_limit) as con:
            source = _files_source(con, name, files, _arrow_schema(name), partial=name in PARTIAL, local=self.local,
                                   sizes=sizes)
            sql = merging.merge_sql(name, list(_stored_schema(name)), KEYS[name], order, source, since=runs[-1].first,
                                    bottom=bottom, fold=any(run.partial for run in runs))
            written = appends.write_files(self._path(name), merging.stream(con, sql, _arrow_schema(name)),
                                          _arrow_schema(name), file_options(name), file_bytes=MERGED_FILE_BYTES,
                                          into=into)
        self.merges.append((name, len(runs), time.perf_counter() - started))
        return written

    def _merge_runs_locked(self, tables: list[str] | None) -> list[str]:
        """`merge_runs` on object storage: the whole pass under the writer lock, each table
        rewritten by delta-rs."""
        with self._writer_lock():
            if self._compacting():
                return []
            ledger = self._latest(LEDGER)
            head = self._read_head(ledger, note=False)
            self._recover(head, list(SORT_BY) if tables is None else tables)
            versions = dict(head.versions)
            merged = []
            for name in SORT_BY if tables is None else tables:
                runs = self.runs(name, versions.get(name))
                if chosen := self._merge_plan(runs):
                    versions[name] = self._merge(name, chosen, bottom=len(chosen) == len(runs), named=versions.get(name))
                    merged.append(name)
                    _failpoint(f"merge:{name}")
            self._merge_ledger_row(head, versions, merged, after=ledger.version())
        return merged

    def index_footers(self, name: str, files: list[str] | None = None) -> int:
        """Write the footer indexes of `files` of a sorted table (default: its current files)
        that have none (`store/footers.py`): a fresh process then probes them without parsing
        their footers. Returns how many it wrote."""
        if not self.local or name not in SORT_BY:
            return 0
        if files is None:
            files = self.files(name, self._read_head(note=False).versions.get(name))
        try:
            return self.footers.index(files, SORT_BY[name])
        except OSError:  # a file a compaction removed meanwhile, or a read-only store
            return 0

    def _write_batch(self, changes: Changes, *, key: str | None, responses: list[Any], next_profile_n: int,
                     next_update_seq: int, index_entries_stored: dict[str, pl.DataFrame],
                     staged: Stages | None, digest: str | None, subjects: pl.Series | None = None) -> None:
        batch_no = self.head.batch_no + 1
        versions = dict(self.head.versions)
        streamed = staged.streamed() if staged is not None else set()
        self._runs_to_index = []  # none left from a write that failed
        _failpoint("before_tables")
        entries: dict[str, pl.DataFrame] = {}  # per index: the new (value, key) pairs
        writes = _TableWrites(self, versions)
        try:
            for name in TABLES:  # a fixed table order: the commit's failpoints depend on it
                upserted: Callable[[list[str]], pl.DataFrame | None]
                if name in streamed:  # streamed from the stages: never whole in memory
                    assert staged is not None
                    writes.write(name, partial(staged.stream, name, batch_no, _arrow_schema(name)))
                    upserted = partial(staged.upserted, name)
                elif (merged := changes.merged_table(name)) is not None:
                    ups, dels = merged
                    writes.write(name, partial(_batch_rows, name, ups, dels, batch_no))
                    upserted = partial(_columns, ups)
                else:
                    continue
                for index, (table, column) in INDEXES.items():
                    # an index exists from the store's creation (or a compaction) on: older stores
                    # scan the column until compaction builds it
                    if table == name and index in versions and (rows := upserted(list(SCHEMAS[index]))) is not None:
                        new = rows.filter(pl.col(column).is_not_null()).unique()
                        held = index_entries_stored.get(index)
                        if held is not None and held.height:  # a row rewritten with the same value
                            new = new.join(held, on=list(SCHEMAS[index]), how="anti")
                        entries[index] = new
        except BaseException:
            writes.abandon()  # no table is still being appended when the batch's error goes up
            raise
        writes.wait()
        for index in INDEXES:  # written after every table, in a fixed order
            if index in entries and entries[index].height:
                self._write_rows(index, entries[index].with_columns(
                    _batch=pl.lit(batch_no, pl.Int64), _deleted=pl.lit(False)), versions)
        self._index_runs()
        _failpoint("before_ledger")
        try:
            mine = self._append_ledger(batch_no, key, versions, next_profile_n, next_update_seq, self.head.seed,
                                       responses, kind="batch", digest=digest, subjects=subjects,
                                       after=self._ledger_version)
        except TurnEndedError:
            raise  # nothing written: a row of this number is another writer's
        except Exception as error:
            # delta-rs may raise after its commit (a checkpoint it writes after the log entry):
            # a batch whose ledger row landed is committed, and saying otherwise would get it
            # applied twice by a caller that retries (the lease is still this writer's: the row
            # of this number is its own)
            if not self._landed(batch_no):
                raise
            self.commit_errors.append(error)
        else:  # the ledger's version is our own: the next `refresh` looks for the one after it
            assert mine is not None
            self._ledger_version = mine
        _failpoint("after_ledger")
        self.head = Head(batch_no, versions, next_profile_n, next_update_seq, self.head.seed, content_batch=batch_no)

    def _index_runs(self) -> None:
        """Write the footer indexes and Bloom filters of the batch's big runs, before the
        ledger row makes them visible: no reader meets them unindexed. A crash before the
        ledger row leaves indexes of files no version holds (`prune_indexes` removes them)."""
        written, self._runs_to_index = self._runs_to_index, []
        by_column: dict[str, list[str]] = {}
        for name, path in written:
            by_column.setdefault(SORT_BY[name], []).append(path)
        for column, paths in by_column.items():
            self.footers.index(paths, column)

    def _landed(self, batch_no: int) -> bool:
        """Whether the ledger now holds batch `batch_no` (the writer lock is held: no other
        writer can have written it). Unknown counts as no: the caller then raises."""
        try:
            return self._read_head(note=False).batch_no >= batch_no
        except Exception:  # noqa: BLE001 - an unreadable ledger: the write's own error is the one to raise
            return False

    def _write_rows(self, name: str, rows: pl.DataFrame | pa.RecordBatchReader, versions: dict[str, int]) -> None:
        """Append a batch's rows of one table as a sorted run (a reader's rows come sorted);
        note the table's new version."""
        if name not in versions and not objects.is_delta_table(self._path(name)):
            self._create_table(name)
        data = sort_for_write(name, rows, KEYS[name]).to_arrow() if isinstance(rows, pl.DataFrame) else rows
        # a store written before partial rows gains their mask column with its first batch
        versions[name] = self._append(name, data, _arrow_schema(name), file_options(name), writer(name))
        if name in SORT_BY and self._merge_plan(self.runs(name, versions[name])):
            self._due_pending.add(name)
        _failpoint(f"after_table:{name}")

    def _merge(self, name: str, runs: list[merging.Run], *, bottom: bool, named: int | None) -> int:
        """Write the newest `runs` of `name` as one run that replaces them in a single Delta
        commit (see `store/merging.py`); returns the table's new version."""
        if (version := self._merge_remote(name, runs, bottom=bottom, named=named)) is not None:
            return version
        started = time.perf_counter()
        since = runs[-1].first
        files = [f for run in runs for f in run.files]
        order = sort_order(name, KEYS[name])
        assert order is not None
        schema = _arrow_schema(name)
        with merging.connection(self.memory_limit) as con:
            # DuckDB's own S3 reader would download its extension (`_files_source`)
            source = _files_source(con, name, files, schema, partial=name in PARTIAL, local=self.local)
            sql = merging.merge_sql(name, list(_stored_schema(name)), KEYS[name], order, source, since=since,
                                    bottom=bottom, fold=any(run.partial for run in runs))
            table = self._at_named(name, named)
            objects.write_delta(table, merging.stream(con, sql, schema), mode="overwrite",
                                predicate=f"_batch >= {since}", writer_properties=writer(name))
        self._written[name] = table  # the next append need not load the log again (`_latest`)
        self._heads.pop(name, None)
        with self._cache_lock:  # nor need the appends and reads after it (`_note_append`)
            self._note_files(name, table.version(), table)
            self._note_actions(name, table.version(), table)
        self.merges.append((name, len(runs), time.perf_counter() - started))
        return table.version()

    def _merge_remote(self, name: str, runs: list[merging.Run], *, bottom: bool, named: int | None) -> int | None:
        """A merge on object storage as on a folder: the merged files written in the table,
        then a log entry of our own that removes the runs' files and adds them, put only where
        none is. delta-rs' predicate overwrite made about 55 requests a table for a small one
        (the log loaded, every file of the runs read again to find the predicate's rows); this
        makes the merge's reads, a PUT a file and one for the entry. None for a table gaining
        columns (delta-rs then), or on a folder."""
        if self.local or named is None:
            return None
        version, columns = self._remote_base(name, named)
        if not set(_arrow_schema(name).names) <= columns:
            return None
        with self._cache_lock:
            actions = self._actions_at(name, version)
        present = dict(zip(actions.column("path").to_pylist(), actions.column("size_bytes").to_pylist(), strict=True))
        root = self._path(name).rstrip("/") + "/"
        gone = [f.removeprefix(root) for run in runs for f in run.files]
        assert all(path in present for path in gone), "the runs are files of the version the ledger names"
        written = self._merged_files(name, runs, bottom=bottom, sizes=[present[path] for path in gone])
        adds = [add for add, _ in written]
        try:
            mine = appends.commit(self._path(name), version + 1, adds, sum(n for _, n in written),
                                  [(path, present[path]) for path in gone])
        except BaseException:
            self._heads.pop(name, None)
            for add in adds:
                with suppress(Exception):  # the commit's error is the one to tell
                    objects.remove(objects.join(self._path(name), add["path"]))
            raise
        self._heads[name] = (mine, columns)
        self._note_merge(name, version, mine, actions, gone, adds)
        return mine

    def compact(self, *, on_table: Callable[[str, int, int], None] | None = None) -> dict[str, int]:
        """Rewrite every table as its current rows (newest row per key, no tombstones, history
        moved to surviving profiles, lineage of deleted profiles redacted), delete every file
        and log entry the new versions do not need, then commit the new versions. Readers
        opened before must reopen. Returns the rows kept per table. `on_table(name, done,
        total)` is called before each table is rewritten (for progress displays).

        The sorted tables stream through DuckDB within the memory budget, so compaction holds
        no table in memory; the small unsorted ones (resources, lineage) keep their order.
        Compaction changes no logical content, so a crash midway rolls forward: the marker file
        tells the next writer to publish the tables' current versions instead of restoring."""
        with self.compaction() as job:
            return job.finish([], on_table=on_table)

    @contextmanager
    def compaction(self, parts: int = 1, min_part_rows: int = compaction.MIN_PART_ROWS) -> Iterator[Compaction]:
        """A compaction whose big sorted tables are cut into about `parts` key ranges each, of
        `min_part_rows` stored rows at least (`store/compaction.py`): the parts of `job.plan`
        are written by `compact_part`, in this process or any other, then `job.finish(written)`
        commits them and compacts the rest as `compact` does. The writer lock is held
        throughout. Leaving the block before `finish` commits anything changes nothing (the
        parts' files are left for the next compaction's vacuum); leaving it after `finish`
        failed midway raises, and the next writer rolls the compaction forward."""
        self.wait_for_merges()
        with self._writer_lock():
            self.head = self._read_head()
            self._recover()
            marker = self._compaction_marker()
            objects.touch(marker)
            job: Compaction | None = None
            try:
                job = Compaction(self, Snapshot(self, self.head), parts, min_part_rows)
                yield job
            finally:
                if job is None or not job.committed:  # nothing changed yet: no compaction to roll forward
                    objects.remove(marker)
            if job.committed and job.kept is None:  # `finish` failed, and the block went on: the
                # lease must not be given back as clean, or no writer would roll it forward
                raise StoreError(f"the compaction of {self.uri} stopped midway (its `finish` failed); the next "
                                 "writer rolls it forward")
        if job.kept is not None:
            if self.local:
                prune_indexes(self.uri)
            for name in SORT_BY:  # the files of the versions just published (no head read again per table)
                self.index_footers(name, self.files(name, self.head.versions.get(name)))

    def compact_part(self, plan: Plan, part: Part) -> Written:
        """Write `part` of the compaction `plan` as files of its table, not committed (in any
        process: the planning compaction holds the writer lock and commits them)."""
        name = part.table
        snap = Snapshot(self, plan.head)  # the planner commits nothing before its parts are in
        schema = _arrow_schema(name)
        with merging.connection(self.memory_limit) as con:
            base = INDEXES[name][0] if name in INDEXES else name  # an index is drawn from its table
            snap.duckdb(con, ("redirects", base) if base in HISTORY else (base,))
            rows = merging.stream(con, compaction.rows_sql(name, plan.batch_no, part), schema)
            written = appends.write_files(self._path(name), rows, schema, file_options(name),
                                          file_bytes=MERGED_FILE_BYTES)
        return Written(part, plan.batch_no, [add for add, _ in written], sum(n for _, n in written))

    def _commit_written(self, name: str, table: DeltaTable, written: list[Written]) -> None:
        """One version of `name` made of the parts' files, in their order, replacing every
        file it had."""
        adds = [add for part in written for add in part.adds]
        rows = sum(part.rows for part in written)
        if self.local:
            current = pa.table(table.get_add_actions(flatten=True)).select(["path", "size_bytes"])
            appends.commit(self._path(name), table.version() + 1, adds, rows,
                           list(zip(current.column("path").to_pylist(), current.column("size_bytes").to_pylist(),
                                    strict=True)))
            return
        table.create_write_transaction(
            [AddAction(add["path"], add["size"], {}, add["modificationTime"], True, add["stats"]) for add in adds],
            mode="overwrite", schema=_arrow_schema(name), post_commithook_properties=objects.COMMIT_HOOKS,
            commit_properties=CommitProperties(max_commit_retries=0))  # no other writer may come between

    def _compact_ledger(self, gone: pl.Series, identifiers: pl.DataFrame) -> None:
        """Rewrite the ledger without the responses nobody may read again: those of batches
        that concerned a deleted profile (`gone`), or that name, as a JSON string, an
        identifier one held (`identifiers`: an export of an ID that named no one yet echoes
        it), whatever their age; those older than the retention window; those of unkeyed
        batches (older stores stored them). Each keyed batch keeps its key, digest and commit
        time, so a replay is refused, never applied twice. The old files (and log entries,
        with their statistics) go with the tables'.

        The ledger holds a row per batch ever committed (a server commits a few a second), so
        it is streamed through DuckDB within the memory limit, never held whole; only the
        numbers of the batches whose responses go are."""
        table = objects.delta_table(self._path(LEDGER))
        files, in_order = _ledger_files(table)
        cutoff = datetime.now(UTC) - self.response_retention
        with merging.connection(self.memory_limit) as con:
            # by name: older files lack later columns
            source = _files_source(con, LEDGER, files, LEDGER_ARROW, partial=True, local=self.local)
            present = set(con.sql(f"DESCRIBE SELECT * FROM {source}").pl()["column_name"].to_list())
            # a column no file has yet (a store older than it) reads as a null, as it does everywhere
            con.sql(f"""CREATE TEMP VIEW ledger AS SELECT {", ".join(
                f'"{c}"' if c in present else f'NULL::{_DUCK_TYPES[c]} AS "{c}"' for c in LEDGER_SCHEMA)}
                FROM {source}""")
            con.register("gone", pl.DataFrame({"service_id": gone}).to_arrow())
            concerned = con.sql("""SELECT DISTINCT batch_no FROM (
                SELECT batch_no, unnest(subjects) AS subject FROM ledger
                WHERE responses IS NOT NULL AND subjects IS NOT NULL) JOIN gone ON subject = service_id""").pl()
            names = identifiers["value"].str.split("\x1f").list.last().unique().to_list()  # an alias by its name
            if names:  # as JSON strings: quoted, escaped as the responses hold them
                quoted = [orjson.dumps(name).decode() for name in names]
                held = con.sql("SELECT batch_no, responses FROM ledger WHERE responses IS NOT NULL")
                for batch in held.to_arrow_reader(ECHO_ROWS):  # a batch's responses can be big
                    rows = pl.DataFrame(pl.from_arrow(batch))
                    concerned = pl.concat([concerned, rows.filter(pl.col("responses").str.contains_any(quoted))
                                           .select("batch_no")])
            con.register("concerned", concerned.unique().to_arrow())
            sql = f"""
                WITH marked AS (
                  SELECT *, CASE WHEN held AND batch_key IS NULL THEN NULL
                                 WHEN held AND batch_no IN (SELECT batch_no FROM concerned) THEN 'erased'
                                 WHEN held AND committed_at < '{cutoff.isoformat()}'::TIMESTAMPTZ THEN 'expired'
                                 ELSE responses_dropped END AS dropped
                  FROM (SELECT *, responses IS NOT NULL AS held FROM ledger))
                SELECT {", ".join(
                    f'CASE WHEN held AND (batch_key IS NULL OR dropped IS NOT NULL) THEN NULL ELSE "{c}" END AS "{c}"'
                    if c in ("responses", "subjects") else "dropped AS responses_dropped" if c == "responses_dropped"
                    else f'"{c}"' for c in LEDGER_SCHEMA)}
                FROM marked{"" if in_order else " ORDER BY batch_no"}"""  # sorting spilled, and took 300 MB more
            table.alter.set_table_properties({**LEDGER_PROPERTIES, "delta.logRetentionDuration": "interval 0 days"})
            objects.write_delta(table, merging.stream(con, sql, LEDGER_ARROW), mode="overwrite",
                                schema_mode="overwrite", writer_properties=LEDGER_WRITER)

    def _overwrite_with_files(self, name: str, table: DeltaTable, rows: pa.RecordBatchReader | pa.Table) -> bool:
        """Replace every file of `name` by `rows`, written by pyarrow as they stream in, a file
        per `MERGED_FILE_BYTES`, and one log entry; False (nothing written) when the table lacks
        a column of its schema: delta-rs then writes it and evolves the schema. delta-rs holds a
        file in memory until it is whole: at 1 GiB files a 10M-user compaction peaked at 4.56
        GB against 3.32 at its 100 MiB files; this writer holds a chunk of row groups."""
        schema = _arrow_schema(name)
        if not self.local or not set(schema.names) <= {f.name for f in table.schema().fields}:
            return False  # (engagelake writes the files and the log entry itself on a folder only)
        current = pa.table(table.get_add_actions(flatten=True)).select(["path", "size_bytes"])
        written = appends.write_files(self._path(name), rows, schema, file_options(name), file_bytes=MERGED_FILE_BYTES)
        appends.commit(self._path(name), table.version() + 1, [add for add, _ in written], sum(n for _, n in written),
                       list(zip(current.column("path").to_pylist(), current.column("size_bytes").to_pylist(), strict=True)))
        return True

    def _compacted(self, con: duckdb.DuckDBPyConnection, snap: Snapshot, name: str, batch_no: int,
                   gone: pl.Series, held: pl.DataFrame) -> pa.RecordBatchReader | pa.Table:
        """The rows a compaction writes for `name`, stamped with the compaction's batch."""
        stamp = {"_batch": pl.lit(batch_no, pl.Int64), "_deleted": pl.lit(False)}
        if name in PARTIAL:
            stamp[SET] = pl.lit(None, pl.Int64)
        order = sort_order(name, KEYS[name])
        if order is None:  # small or order-keeping tables: read in commit order, in memory
            rows = snap.scan(name).collect()
            if name == "preference_center_submits":  # a deleted user's submits go with the user
                rows = rows.filter(~pl.col("service_id").is_in(gone.implode()))
            if name == "merges":
                rows = _redacted_lineage(rows, gone, held)
            return rows.with_columns(**stamp).select(list(_stored_schema(name))).to_arrow()
        return merging.stream(con, compaction.rows_sql(name, batch_no), _arrow_schema(name))

    def _never_written(self) -> set[str]:
        """The tables still as the store's creation made them (empty, at their first version;
        an index only while its table is so too): a compaction has nothing to rewrite or erase
        there. A small store leaves most of its tables so (resources, lineage, indexes)."""
        empty = {name for name in STORED if self.head.versions.get(name) == 0 and not self.files(name, 0)}
        return {name for name in empty if name not in INDEXES or INDEXES[name][0] in empty}

    def _finish_compaction(self, batch_no: int, tables: list[str], same: dict[str, int] | None = None) -> dict[str, int]:
        """Drop the files and log entries the compacted versions no longer need, then publish
        `tables`, and the versions of tables left `same`; returns the rows of each."""
        kept, versions = dict.fromkeys(same or {}, 0), dict(same or {})
        if self.local:  # merged runs a killed merge never published (object storage merges in memory)
            shutil.rmtree(Path(self.uri) / MERGING, ignore_errors=True)
        self._vacuum(LEDGER)  # its old files held the responses it dropped
        for name in tables:
            if not objects.is_delta_table(self._path(name)):
                continue
            table = self._vacuum(name)
            kept[name] = sum(pa.table(table.get_add_actions(flatten=True)).column("num_records").to_pylist())
            versions[name] = table.version()
            with self._cache_lock:  # the reads and footer indexes that follow need not load it again
                self._note_files(name, versions[name], table)
        self._publish_current(batch_no, versions)
        if self._lease is not None:  # no commit cleans up a log (`objects.COMMIT_HOOKS`): the lease's here
            try:
                self._lease.tidy()
            except Exception as error:  # noqa: BLE001 - housekeeping: the compaction is done, the next one tidies
                logging.getLogger("engagelake").warning("the writers' lease log was not tidied: %s", error)
        return kept

    def _vacuum(self, name: str) -> DeltaTable:
        """Delete the files and log entries that `name`'s current version does not need."""
        table = objects.delta_table(self._path(name))
        # `full`: every file no version names goes too, not only those a version removed: the
        # files of a compaction's parts never committed, of a writer that died before its commit
        # (under the writer lock no other writer has files in flight here)
        table.vacuum(retention_hours=0, enforce_retention_duration=False, dry_run=False, full=True)
        table.update_incremental()  # the vacuum's own log entries (loading the log again cost 3 ms a table)
        table.create_checkpoint()
        table.cleanup_metadata()
        # a writer killed between writing a log entry and linking it in left its temporary file
        # (`store/appends.py`; delta-rs names its own so too): it holds statistics of values
        for left in (Path(self._path(name)) / "_delta_log").glob("_commit_*.json.tmp") if self.local else ():
            left.unlink(missing_ok=True)
        return table

    def _compaction_marker(self) -> str:
        return _at(self.uri, COMPACTING)

    def _compacting(self) -> bool:
        """A compaction is under way, or died."""
        return objects.exists(self._compaction_marker())

    def _settle_compaction(self) -> None:
        """Old table versions go during a compaction: wait for a live one (it holds the writer
        lock), or roll a dead one forward, before reading."""
        if self._compacting():
            with self._writer_lock():
                self.head = self._read_head()
                self._recover()

    def _publish_current(self, batch_no: int, versions: dict[str, int]) -> None:
        """A ledger row naming the current `versions` of tables (the end of a compaction)."""
        self._append_ledger(batch_no, None, versions, self.head.next_profile_n, self.head.next_update_seq,
                            self.head.seed, [], kind="compaction")
        self.head = Head(batch_no, versions, self.head.next_profile_n, self.head.next_update_seq, self.head.seed,
                         content_batch=self.head.content_batch)


# how lineage rows name an identifier (as requests do), as (JSON path, kind)
_LINEAGE_PATHS = (("$.external_id", "external_id"), ("$.email", "email"), ("$.phone", "phone"))
_ALIAS_PATHS = (("$.user_alias.alias_label", "$.user_alias.alias_name"), ("$.alias_label", "$.alias_name"))


def _identifiers_of(snap: Snapshot, gone: pl.Series) -> pl.DataFrame:
    """(kind, value) of every identifier a deleted profile (`gone`) ever held: external IDs
    (renamed ones too), aliases ("label\x1fname"), emails and phones, from every stored row,
    tombstoned ones included (a compaction reads each table whole anyway), and from the
    lineage's sides that resolved to one: a run merge into the bottom run keeps only a key's
    newest row, so an external ID merged away (its row a tombstone since) may be left in the
    lineage alone, as a skipped request names it."""
    lineage = snap._stored("merges")
    parts = [] if lineage is None else [_lineage_identifiers(lineage.filter(~pl.col("_deleted")), gone)]
    for table, kind, value in (("external_ids", "external_id", pl.col("external_id")),
                               ("aliases", "alias", pl.concat_str("alias_label", pl.lit("\x1f"), "alias_name")),
                               ("profiles", "email", pl.col("email")), ("profiles", "phone", pl.col("phone"))):
        stored = snap._stored(table)
        if stored is not None:
            parts.append(stored.filter(pl.col("service_id").is_in(gone.implode()))
                         .select(pl.lit(kind).alias("kind"), value.alias("value")))
    if not parts:
        return pl.DataFrame(schema={"kind": pl.String, "value": pl.String})
    return pl.concat(parts).drop_nulls().unique().collect()


def _lineage_identifiers(lineage: pl.LazyFrame, gone: pl.Series) -> pl.LazyFrame:
    """(kind, value) of the identifiers lineage rows name on a side that resolved to a
    profile of `gone`."""
    parts = []
    for side in ("source", "target"):
        mine = lineage.filter(pl.col(f"{side}_sid").is_in(gone.implode()))
        text = pl.col(side)
        parts += [mine.select(pl.lit(kind).alias("kind"), text.str.json_path_match(path).alias("value"))
                  for path, kind in _LINEAGE_PATHS]
        parts += [mine.select(pl.lit("alias").alias("kind"), pl.concat_str(
            text.str.json_path_match(label), pl.lit("\x1f"), text.str.json_path_match(alias)).alias("value"))
                  for label, alias in _ALIAS_PATHS]
    return pl.concat(parts)


def _redacted_lineage(rows: pl.DataFrame, gone: pl.Series, identifiers: pl.DataFrame) -> pl.DataFrame:
    """Lineage rows without a deleted profile's identifiers: both identifiers of a row that
    touched a deleted profile, and the identifier of a side that resolved to no profile (a
    skipped request, such as a delete retried) when a deleted profile held it."""
    touched = pl.col("source_sid").is_in(gone.implode()) | pl.col("target_sid").is_in(gone.implode())
    redact = {}
    for side in ("source", "target"):
        text = pl.col(side)
        named = [text.str.json_path_match(path).is_in(identifiers.filter(pl.col("kind") == kind)["value"].implode())
                 for path, kind in _LINEAGE_PATHS]
        aliases = identifiers.filter(pl.col("kind") == "alias")["value"].implode()
        named += [pl.concat_str(text.str.json_path_match(label), pl.lit("\x1f"), text.str.json_path_match(alias))
                  .is_in(aliases) for label, alias in _ALIAS_PATHS]
        unresolved = pl.col(f"{side}_sid").is_null() & pl.any_horizontal(named).fill_null(False)
        redact[side] = pl.when(touched | unresolved).then(None).otherwise(text)
    return rows.with_columns(**redact)


def _groups_newest_first(file: pq.ParquetFile, column: str) -> list[tuple[int, int | None]]:
    """A file's row groups with their greatest `column` (None: no statistics, read first),
    greatest first: a compacted ledger holds every batch in one file."""
    at = file.schema.names.index(column)  # a leaf column's place (`column` is a flat one)
    groups = []
    for group in range(file.metadata.num_row_groups):
        stats = file.metadata.row_group(group).column(at).statistics
        groups.append((group, stats.max if stats is not None and stats.has_min_max else None))
    return sorted(groups, key=lambda g: (g[1] is not None, -(g[1] or 0)))


def _ledger_files(table: DeltaTable) -> tuple[list[str], bool]:
    """The ledger's files, by their first batch; and whether their batches follow one another
    in that order (each file's after the last of the file before, by their statistics): then
    reading them in that order reads the rows in batch order."""
    actions = pl.DataFrame(pa.table(table.get_add_actions(flatten=True)))
    uris = _paths_by_name(table)
    if "min.batch_no" not in actions.columns or actions["min.batch_no"].null_count():
        return list(uris.values()), False
    ordered = actions.sort("min.batch_no")
    files = [uris[_file_name(path)] for path in ordered["path"].to_list()]
    following = (ordered["min.batch_no"].slice(1) > ordered["max.batch_no"].slice(0, ordered.height - 1)).all()
    return files, bool(following)


class Compaction:
    """A compaction under way (`DeltaStore.compaction`): its plan of parts, then `finish`."""

    def __init__(self, store: DeltaStore, snap: Snapshot, parts: int, min_part_rows: int):
        self.store, self.snap = store, snap
        self.batch_no = snap.head.batch_no + 1
        self.untouched = store._never_written()
        self.committed = False  # a table written: from then on a crash rolls the compaction forward
        self.kept: dict[str, int] | None = None
        self.ledger_version = store._ledger_version  # as read under the writer lock
        self.plan = Plan(store.uri, snap.head, self.batch_no, tuple(self._parts(parts, min_part_rows)))

    def _parts(self, parts: int, min_part_rows: int) -> Iterator[Part]:
        """Each big sorted table's key ranges of about 1/`parts` of its stored rows (and at
        least `min_part_rows`: a smaller table is one part); each index, whole."""
        if parts <= 1:
            return
        for name in STORED:
            if name in self.untouched or name not in SORT_BY or not self.snap.holds(name):
                continue
            table = objects.delta_table(self.store._path(name))
            if not set(_arrow_schema(name).names) <= {f.name for f in table.schema().fields}:
                continue  # delta-rs writes it whole, evolving its schema
            if not compaction.splits(name):
                yield Part(name, None, None)
                continue
            per_part = max(min_part_rows, -(-self.snap.rows(name) // parts))
            # a loop over a table's few ranges (about `parts`), not its rows: planning, run once
            for low, high in self.snap.key_ranges(name, per_part):
                yield Part(name, low or None, high)

    def finish(self, written: list[Written], *,
               on_table: Callable[[str, int, int], None] | None = None) -> dict[str, int]:
        """Commit the parts' files (`written`: one for each part of the plan), compact every
        other table, the ledger, and publish the new versions; returns the rows kept per table."""
        store, snap = self.store, self.snap
        if self.kept is not None:
            raise StoreError("this compaction is finished already")
        by_table = self._by_table(written)
        self._check_turn()  # the parts may have taken long: a lease that lapsed meanwhile ends here
        with merging.connection(store.memory_limit) as con:
            snap.duckdb(con)  # current rows, over the old files: they stay until every table is written
            gone = con.sql('SELECT service_id FROM redirects WHERE "into" IS NULL').pl()["service_id"]
            held = _identifiers_of(snap, gone)  # every identifier a deleted profile held
            for done, name in enumerate(STORED):
                if on_table is not None:
                    on_table(name, done, len(STORED))
                if name in self.untouched:
                    continue
                self.committed = True
                if not objects.is_delta_table(store._path(name)):
                    store._create_table(name)
                # old log entries hold column statistics of old files: let cleanup drop them
                table = objects.delta_table(store._path(name))  # one load of its log for both
                table.alter.set_table_properties({"delta.logRetentionDuration": "interval 0 days"})
                if name in by_table:
                    store._commit_written(name, table, by_table[name])
                else:
                    rows = store._compacted(con, snap, name, self.batch_no, gone, held)
                    if not store._overwrite_with_files(name, table, rows):
                        objects.write_delta(table, rows, mode="overwrite", writer_properties=writer(name),
                                            schema_mode="overwrite" if name in PARTIAL else None)
                _failpoint(f"compact:{name}")
        self._check_turn()  # before the ledger is rewritten and old files deleted
        store._compact_ledger(gone, held)
        _failpoint("compact:_ledger")
        kept = store._finish_compaction(self.batch_no, [name for name in STORED if name not in self.untouched],
                                        {name: snap.head.versions[name] for name in self.untouched})
        objects.remove(store._compaction_marker())
        self.kept = {name: kept[name] for name in TABLES}
        return self.kept

    def _check_turn(self) -> None:
        """On object storage: raise TurnEndedError when this writer's lease has ended, or
        another writer committed since the plan (a folder's lock file cannot lapse)."""
        if self.store._lease is not None:
            self.store._lease.check()
            self.store._fenced_ledger(self.ledger_version)

    def _by_table(self, written: list[Written]) -> dict[str, list[Written]]:
        """The parts' files by table, each table's in the order of its ranges."""
        order = {part: n for n, part in enumerate(self.plan.parts)}
        if any(w.batch_no != self.batch_no for w in written):
            raise StoreError(f"a part written for another compaction (batch {written[0].batch_no}) was given to "
                             f"compaction {self.batch_no}")
        if len(written) != len(order) or {w.part for w in written} != set(order):
            missing = [p for p in self.plan.parts if p not in {w.part for w in written}]
            raise StoreError(f"a compaction needs each of its {len(order)} parts written once; got {len(written)}"
                             + (f", missing {missing[0]}" if missing else ""))
        tables: dict[str, list[Written]] = {}
        for w in sorted(written, key=lambda w: order[w.part]):
            tables.setdefault(w.part.table, []).append(w)
        return tables


class Snapshot:
    """The stored tables at one committed head, read on demand: a probe by a table's sort
    column reads only the row groups that can hold its values (`store/runs.py`); other probes
    scan one column with predicate pushdown; scans are lazy. Implements `RowSource`."""

    def __init__(self, store: DeltaStore, head: Head):
        self.store = store
        self.head = head

    def files(self, name: str) -> list[str]:
        """The data files of `name` at this head (each table version's log is read once)."""
        return self.store.files(name, self.head.versions.get(name))

    def holds(self, name: str) -> bool:
        return bool(self.files(name))

    def rows(self, name: str) -> int:
        version = self.head.versions.get(name)
        return 0 if version is None or not self.files(name) else self.store.stored_rows(name, version)

    def _stored(self, name: str) -> pl.LazyFrame | None:
        files = self.files(name)
        return objects.scan_parquet(files, _stored_schema(name)) if files else None

    def scan(self, name: str) -> pl.LazyFrame:
        rows = self._stored(name)
        if rows is None:
            return empty(name).lazy()
        key = KEYS[name]
        rows = rows.sort("_batch", maintain_order=True)
        if key is not None:
            rows = newest(name, rows).filter(~pl.col("_deleted"))
        return rows.select(list(SCHEMAS[name]))

    def _read_where(self, name: str, column: str, values: pl.Series,
                    columns: list[str] | None = None) -> pl.DataFrame:
        """Stored rows (all versions) of `name` whose `column` is one of `values`, in
        `columns` (None: all): by fence pointers on the sort column, else a scan of that
        column with predicate pushdown."""
        if column == SORT_BY.get(name):
            files = self.files(name)
            if len(files) > 1 and values.len() <= FILE_STATS_MAX_VALUES:
                files = files_holding(files, self.store.file_ranges(name, self.head.versions[name], column), values)
            return read_where(files, column, values, self.store.footers, _stored_schema(name), columns)
        self.store.column_scans.append((name, column))
        rows = self._stored(name)
        assert rows is not None
        rows = rows.filter(pl.col(column).is_in(values.implode()))
        return (rows if columns is None else rows.select(columns)).collect()

    def probe(self, name: str, column: str, values: pl.Series, held: pl.DataFrame | None = None) -> pl.DataFrame:
        if not self.files(name) or values.len() == 0:
            return empty(name).select(read_back(name))
        key = KEYS[name]
        if key is None:
            hits = self._read_where(name, column, values, [*read_back(name), "_batch"])
            return hits.sort("_batch", maintain_order=True).select(read_back(name))
        if column in key:  # every row of a matching key matches: one pass
            hits = self._read_where(name, column, values)
        else:  # a secondary column: the keys that ever had the value, then their newest rows
            index = INDEX_OF.get((name, column))
            if index is not None and index in self.head.versions:
                keys = self.probe(index, column, values).select(key).unique()
            else:  # no index (a store older than it, until compaction): scan the column
                keys = self._read_where(name, column, values).select(key).unique()
            if held is not None and held.height:  # the caller has their rows: not read again
                keys = keys.join(held, on=list(key), how="anti")
            lead = SORT_BY.get(name, key[0])
            hits = self._read_where(name, lead, keys[lead]).join(keys, on=list(key), how="semi")
        current = newest(name, hits.sort("_batch", maintain_order=True)).filter(~pl.col("_deleted"))
        if column not in key:
            current = current.filter(pl.col(column).is_in(values.implode()))
        return current.select(list(SCHEMAS[name]))

    def key_ranges(self, name: str, rows: int) -> list[tuple[str, str | None]]:
        """Ranges [low, high) of `name`'s sort column, about `rows` stored rows each (the last
        up to half as many more), that together cover every value (the last has no end)."""
        column = SORT_BY[name]
        cuts = range_bounds(self.files(name), column, rows, self.store.footers)
        lows = ["", *cuts]
        return list(zip(lows, [*cuts, None], strict=True))

    def in_range(self, name: str, low: str, high: str | None) -> pl.DataFrame:
        """Current rows of `name` whose sort column lies in [low, high)."""
        key = KEYS[name]
        assert key is not None and SORT_BY[name] in key, "ranges are of keyed, sorted tables"
        if not self.files(name):
            return empty(name)
        hits = read_range(self.files(name), SORT_BY[name], low, high, self.store.footers, _stored_schema(name))
        return (
            newest(name, hits.sort("_batch", maintain_order=True))
            .filter(~pl.col("_deleted"))
            .select(list(SCHEMAS[name]))
        )

    def current(self, name: str) -> pl.LazyFrame:
        """What readers see of `name`: current rows, and for the event and purchase logs the
        history of merged profiles moved to the survivor (deleted profiles' history dropped)."""
        rows = self.scan(name)
        if name not in HISTORY:
            return rows
        redirects = self.scan("redirects").select("service_id", "into", _redirected=pl.lit(True))
        return (
            rows.join(redirects, on="service_id", how="left", maintain_order="left")
            .filter(pl.col("_redirected").is_null() | pl.col("into").is_not_null())
            .with_columns(service_id=pl.coalesce("into", "service_id"))
            .drop("into", "_redirected")
        )

    def duckdb(self, con: duckdb.DuckDBPyConnection, tables: tuple[str, ...] = TABLES) -> duckdb.DuckDBPyConnection:
        """Views of every table's current rows (or those of `tables`; a history log's needs
        `redirects`) in `con`, read by DuckDB's own Parquet reader (it streams, prunes and
        spills within the connection's memory_limit)."""
        for name in sorted(tables, key=lambda n: n in HISTORY):  # history views read redirects
            files = self.files(name)
            if not files:
                con.register(f"_empty_{name}", empty(name).to_arrow())
                con.execute(f'CREATE OR REPLACE VIEW "{name}" AS SELECT * FROM "_empty_{name}"')
                continue
            columns = ", ".join(f'"{c}"' for c in SCHEMAS[name])
            raw = _files_source(con, name, files, _arrow_schema(name), partial=name in PARTIAL, local=self.store.local)
            key = KEYS[name]
            if key is None:
                body = f"SELECT {columns} FROM {raw} ORDER BY _batch"
            else:
                fold = self.store.holds_partial_rows(name, self.head.versions.get(name))
                newest_rows = merging.newest_sql(name, list(_stored_schema(name)), key, f"SELECT * FROM {raw}",
                                                 fold=fold)
                body = f"SELECT {columns} FROM ({newest_rows}) WHERE NOT _deleted"
            if name in HISTORY:
                con.execute(f'CREATE OR REPLACE VIEW "_stored_{name}" AS {body}')
                body = (f'SELECT h.* REPLACE (coalesce(r."into", h.service_id) AS service_id) '
                        f'FROM "_stored_{name}" h LEFT JOIN redirects r USING (service_id) '
                        f'WHERE r.service_id IS NULL OR r."into" IS NOT NULL')
            con.execute(f'CREATE OR REPLACE VIEW "{name}" AS {body}')
        return con


def _at(uri: str, name: str) -> str:
    """The path of `name` (a marker, a table) in the store at `uri`."""
    return f"{uri.rstrip('/')}/{name}"


def _files_source(con: duckdb.DuckDBPyConnection, name: str, files: list[str], schema: pa.Schema, *,
                  partial: bool, local: bool, sizes: list[int] | None = None) -> str:
    """SQL that reads a table's `files` in `con`: DuckDB's Parquet reader on a folder; on object
    storage a pyarrow dataset registered in `con` (DuckDB's own S3 reader, the `httpfs`
    extension, is downloaded on first use), of `schema`: a column a file lacks reads as null
    (`sizes`: the files' sizes, when known)."""
    if local:
        return merging.read_files(files, partial=partial)
    con.register(f"_files_{name}", objects.dataset(files, schema, sizes))
    return f'"_files_{name}"'


KEPT_VERSIONS = 2  # versions a table's files, actions and runs are cached for (the newest)


def _bounded(cache: dict[tuple[str, int], Any], head: Head) -> None:
    """Before a cache of table versions takes one more: past 4 versions a table on average,
    keep only each table's newest `KEPT_VERSIONS` and the version `head` names. A cache
    cleared whole made the next reads load every table's log again: on object storage about
    40 requests a table, a call in 20."""
    if len(cache) <= 4 * len(STORED):
        return
    newest: dict[str, list[int]] = {}
    for name, version in cache:
        newest.setdefault(name, []).append(version)
    keep = {(name, v) for name, versions in newest.items() for v in sorted(versions)[-KEPT_VERSIONS:]}
    keep |= set(head.versions.items())
    for key in [key for key in cache if key not in keep]:
        del cache[key]


def _file_name(path: str) -> str:
    """A data file's name (unique in its table: delta-rs puts a UUID in it), decoded."""
    return unquote(path.rsplit("/", 1)[-1])


def _paths_by_name(table: DeltaTable) -> dict[str, str]:
    """A local table's data files by their names (add actions name them relative and
    percent-encoded, `file_uris` absolute)."""
    return {_file_name(uri): unquote(uri) for uri in table.file_uris()}
