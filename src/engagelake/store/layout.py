"""The store's names and its smallest parts: where each table, marker and lock lives, the
stored schemas and writer settings, the ledger's head, crash points, and the writer lock.

Everything in `store/` that needs one of these imports it from here, so that no collaborator
of `DeltaStore` (`store/delta.py`) imports another's module for a name.
"""

from __future__ import annotations

import errno
import fcntl
import os
import random
import signal
import time
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, suppress
from dataclasses import dataclass
from datetime import datetime
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol
from urllib.parse import unquote

import polars as pl
import pyarrow as pa
from deltalake import ColumnProperties, DeltaTable, WriterProperties

from engagelake.errors import ConfigError, NotAStore, StoreDamaged, StoreError, StoreReadOnly
from engagelake.store import appends, merging, objects
from engagelake.store.lease import Lease
from engagelake.store.runs import ROW_GROUP_ROWS
from engagelake.tables.partial import PARTIAL, SET
from engagelake.tables.schema import INDEXES, SCHEMAS, STORED

if TYPE_CHECKING:
    import duckdb  # imported where used: a process that only reads never loads it

# jitter of waits for the writer lock, from a generator of our own: the global one is the
# caller's (Hypothesis warns when it moves while it draws an example)
_JITTER = random.Random()
LEDGER = "_ledger"
COMPACTING = "_compacting"  # marker file: a compaction is under way
MERGING = "_merging"  # a merge pass's files before they are published (`RunMerger.merge_runs`)
CREATING = "_creating"  # marker file: a store is being created (its ledger is written last)
WRITER_LOCK = "_writer.lock"
WANTED = "_writer.wanted"  # touched by writers waiting for the lock (`writer_lock`)
WANTED_FOR_S = 1.0  # a mark older than this is a waiter's that gave up or died
CRASH_ENV = "ENGAGELAKE_CRASH_AT"
MERGE_ENV = "ENGAGELAKE_MERGE_TRIGGER"  # runs a table may hold before a batch merges (tuning, tests)
# the mode of a new local store's folder (`store_mode`): owner-only unless this says otherwise
STORE_MODE_ENV = "ENGAGELAKE_STORE_MODE"
STORE_MODE = 0o700
# a crash point's prefix under which a commit still writes its tables side by side (`TableWrites`)
SIDE_BY_SIDE = "side_by_side:"
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
# bytes per file of a merged or compacted run: a point read pays per file it opens, so a run's
# rows stay in one file up to this size (a 10M-user store's tables: one file each, 237-615 MB).
# A warm export of 50 users at 10M, compacted: 42.9-48.9 ms p50 in one file a table against
# 50.2-52.3 in delta-rs' 100 MiB files (5-6 a table); 2M-row files (9-13) were 9% slower still.
# The cap bounds a file's footer (1,024-row groups: about 16,000 at most) and a writer's buffer.
MERGED_FILE_BYTES = 1 << 30


@dataclass(frozen=True)
class Place:
    """Where a store is: its URI, whether it is a local folder (file locks, markers and footer
    indexes work there), and on object storage the writers' lease (`store/lease.py`)."""

    uri: str
    local: bool
    lease: Lease | None

    @classmethod
    def of(cls, uri: str) -> Place:
        local = "://" not in uri
        return cls(uri, local, None if local else Lease(uri))

    def path(self, name: str) -> str:
        """The path of `name` (a table, a marker) in the store."""
        return at(self.uri, name)

    def compacting(self) -> bool:
        """A compaction is under way, or died (its marker file is there)."""
        return objects.exists(self.path(COMPACTING))

    def log_entry(self, name: str, version: int) -> Path:
        """The log entry of one version of a local table (a Delta commit creates it atomically)."""
        return Path(self.path(name)) / "_delta_log" / f"{version:020d}.json"


class OnPlace:
    """A collaborator of the store at `place`: the store's URI, kind and paths by name."""

    place: Place

    @property
    def local(self) -> bool:
        return self.place.local

    @property
    def uri(self) -> str:
        return self.place.uri

    def _path(self, name: str) -> str:
        return self.place.path(name)


@dataclass(frozen=True)
class StoredBatch:
    """A committed batch found by its idempotency key."""

    responses: list[Any] | None  # [[status, body], ...]; None once dropped (see `dropped`)
    digest: str | None  # of its requests; None when the ledger row predates digests
    committed_at: datetime
    dropped: str | None = None  # "expired" or "erased": why its responses are gone


@dataclass(frozen=True)
class BatchRow:
    """What the ledger keeps of one batch besides the table versions (`Ledger.append_rows`)."""

    key: str | None
    responses: list[Any]  # [[status, body], ...]: stored for a keyed batch only
    digest: str | None = None
    subjects: list[str] | None = None  # the users a keyed batch read or wrote
    committed_at: datetime | None = None  # None: when the row is written


@dataclass(frozen=True)
class Head:
    """The last committed batch: what readers see."""

    batch_no: int
    versions: dict[str, int]
    next_profile_n: int
    next_update_seq: int
    seed: str
    content_batch: int = 0  # the last batch that changed content (not a merge or compaction)


class Turns(Protocol):
    """What the store's jobs after a commit (run merges, compaction) take from the store that
    runs them: its head, the writer's turn, and the roll-back of a dead writer's tables."""

    head: Head

    @property
    def memory_limit(self) -> str | None: ...

    def writer_lock(self) -> AbstractContextManager[None]: ...

    def recover(self, head: Head | None = None, tables: list[str] | None = None) -> None: ...


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
                not objects.exists(at(uri, CREATING)):  # a creation under way, or that died
            raise StoreDamaged(_no_ledger(uri, found))
        return "new"
    root = Path(uri)
    if not root.exists():
        return "new"
    if not root.is_dir():
        raise NotAStore(f"{uri} is a file, not a store folder: pass the folder of a store, or a new path to "
                        "create one there")
    try:
        entries = {p.name for p in root.iterdir()} - {WRITER_LOCK, WANTED}
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
def writer_lock(root: Path, timeout: float | None = None, *, mark: bool = True) -> Iterator[None]:
    """One writer at a time: an advisory lock file in a local store. A store the process may
    not write raises StoreReadOnly. With a `timeout` (seconds) the lock is polled, with
    jitter, and a writer that holds it longer raises StoreError. A writer that has to wait
    says so in `WANTED` (the owner of an in-memory layer then lets go after its flush and
    waits its turn: `wanted`); `mark=False` waits unseen."""
    try:
        handle = open(root / WRITER_LOCK, "w")  # noqa: SIM115 - closed below, after the lock is released
    except OSError as error:
        if error.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
            raise StoreReadOnly(f"the store at {root} is read-only ({error.strerror}): it can be read, not "
                                "written") from error
        raise
    with handle:
        waited = False
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            waited = mark
            if mark:
                _want(root)
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
                        if mark:
                            _want(root)
                        time.sleep(_JITTER.uniform(0.005, 0.02))
        if waited:
            with suppress(OSError):
                (root / WANTED).unlink()
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _want(root: Path) -> None:
    with suppress(OSError):
        (root / WANTED).touch()


def wanted(root: Path, within: float = WANTED_FOR_S) -> bool:
    """Whether another writer waited for the lock in the last `within` seconds."""
    try:
        return time.time() - (root / WANTED).stat().st_mtime < within
    except OSError:
        return False


def store_mode(mode: int | str | None = None) -> int:
    """The mode a new local store's folder is given: `mode` (an int, or octal text such as
    "0750"), else `$ENGAGELAKE_STORE_MODE`, else 0700: the owner only, so that nobody else
    reads the tables (and the seed in every ledger row). Its owner must keep every right."""
    given: int | str | None = mode if mode is not None else os.environ.get(STORE_MODE_ENV) or None
    if given is None:
        return STORE_MODE
    where = "mode" if mode is not None else STORE_MODE_ENV
    if isinstance(given, str):
        text = given.strip().lower().removeprefix("0o")
        try:
            given = int(text, 8)
        except ValueError:
            raise ConfigError(f"{where} must be an octal mode such as 0700 or 0750, not {given!r}") from None
    if isinstance(given, bool) or not isinstance(given, int) or not 0o700 <= given <= 0o777 \
            or given & 0o700 != 0o700:
        shown = oct(given) if isinstance(given, int) else repr(given)
        raise ConfigError(f"{where} must be an octal mode from 0700 to 0777 that keeps the owner's rights "
                          f"(0700, 0750, 0755), not {shown}")
    return given


def failpoint(name: str) -> None:
    """Kill this process at a named point of the commit protocol (crash tests only)."""
    point = os.environ.get(CRASH_ENV)
    if point is not None and point.removeprefix(SIDE_BY_SIDE) == name:
        os.kill(os.getpid(), signal.SIGKILL)


def stored_schema(name: str) -> dict[str, pl.DataType]:
    """A table's columns as stored: its schema, the batch, the tombstone flag, and for `PARTIAL`
    tables the mask of the fields a partial row sets (files written before it lack it: null)."""
    schema = {**SCHEMAS[name], "_batch": pl.Int64(), "_deleted": pl.Boolean()}
    if name in PARTIAL:
        schema[SET] = pl.Int64()
    return schema


@cache  # a commit asks for it once per table written
def arrow_schema(name: str) -> pa.Schema:
    """The stored schema as Arrow writes it (what DuckDB's batches are cast to)."""
    return pl.DataFrame(schema=stored_schema(name)).to_arrow().schema


def at(uri: str, name: str) -> str:
    """The path of `name` (a marker, a table) in the store at `uri`."""
    return f"{uri.rstrip('/')}/{name}"


def files_source(con: duckdb.DuckDBPyConnection, name: str, files: list[str], schema: pa.Schema, *,
                  partial: bool, local: bool, sizes: list[int] | None = None) -> str:
    """SQL that reads a table's `files` in `con`: DuckDB's Parquet reader on a folder; on object
    storage a pyarrow dataset registered in `con` (DuckDB's own S3 reader, the `httpfs`
    extension, is downloaded on first use), of `schema`: a column a file lacks reads as null
    (`sizes`: the files' sizes, when known)."""
    if local:
        return merging.read_files(files, partial=partial)
    con.register(f"_files_{name}", objects.dataset(files, schema, sizes))
    return f'"_files_{name}"'


def file_name(path: str) -> str:
    """A data file's name (unique in its table: delta-rs puts a UUID in it), decoded."""
    return unquote(path.rsplit("/", 1)[-1])


def paths_by_name(table: DeltaTable) -> dict[str, str]:
    """A local table's data files by their names (add actions name them relative and
    percent-encoded, `file_uris` absolute)."""
    return {file_name(uri): unquote(uri) for uri in table.file_uris()}
