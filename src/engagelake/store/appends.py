"""Appends to a Delta table: one Parquet file written by pyarrow, one log entry written here.

A batch appends to several tables and the ledger. delta-rs' `write_deltalake` took 6-10 ms an
append however small (it plans a DataFusion write, loads the table's state, runs its commit
hooks): about 45 ms of a one-request batch's 190 ms. A local append needs much less: write the
file, then create the next log entry (`_delta_log/<version>.json`) atomically and only if no
writer created it first, as delta-rs does (a temporary file, then a hard link, which fails
when the entry exists). The entry is plain Delta (protocol 1/2: commit info and add actions
with statistics), so every reader (delta-rs, Polars, DuckDB, Spark) reads it as before.

Statistics are written where a reader prunes by them: row counts, null counts of flat columns,
and minimum and maximum of integer and string columns (strings cut at 64 characters as
delta-rs cuts them at 64 bytes: a prefix for the minimum, a raised prefix for the maximum). Other columns
carry none, which only means a reader skips no file by them. A checkpoint is written every
`delta.checkpointInterval` versions (100 unless the table says otherwise), with the expired
log cleanup delta-rs does then.

On a folder every file a commit writes reaches the disk before the commit is said to be made:
each data file is synced (`fdatasync`) once written, the table's folder once its files are in
it, the log entry before it is linked into the log, and the log's folder after (`SYNC_ENV`
turns it off, for stores that are copies). A store's commit point, the ledger's entry, is
written after every table's entry is synced, so a power cut leaves either the whole batch on
disk or tables ahead of the ledger, which the next writer rolls back.

On object storage the entry is one conditional put (`objects.put_new`: refused where the entry
exists, as delta-rs' own commit is), and a checkpoint is written every 10 versions; an
append there made 8 requests through delta-rs (the log listed before, to check and after the
commit, the new entry read back twice) and makes 2 here. Schema changes keep using delta-rs
(`store/delta.py` decides).
"""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Iterable, Iterator, Sequence
from contextlib import suppress
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import unquote

import orjson
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from deltalake import DeltaTable, Schema

from engagelake.errors import StoreError
from engagelake.store import checkpoints, objects
from engagelake.version import __version__

# a string statistic longer than this (UTF-8 bytes) is cut, as delta-rs cuts it
# (`runs.TRUSTED_FILE_STAT_BYTES`)
STAT_BYTES = 64
CHECKPOINT_INTERVAL = 100  # delta-rs' default for `delta.checkpointInterval`
# on object storage: `objects.LOG_PROPERTIES` (a fresh reader gets each entry since a checkpoint
# with a request of its own)
REMOTE_CHECKPOINT_INTERVAL = int(objects.LOG_PROPERTIES["delta.checkpointInterval"])
# "0" (or "off"): a folder's commits are not synced to its disk (a scratch copy, a benchmark of
# the write path without it); anything else, or unset: every file a commit writes is synced
SYNC_ENV = "ENGAGELAKE_SYNC"
# rows gathered from a stream before they are written as row groups (a stream's batches may be
# small; the file's row groups must be whole)
STREAM_CHUNK_GROUPS = 64


@dataclass(frozen=True)
class FileOptions:
    """How a table's Parquet files are written (what delta-rs' WriterProperties said)."""

    row_group_rows: int | None = None  # None: one row group per written chunk
    plain: tuple[str, ...] = ()  # columns written without a dictionary
    statistics: tuple[str, ...] | None = None  # columns with statistics (None: every column)


@dataclass
class _Stats:
    """Running statistics of the rows written, column by column."""

    rows: int = 0
    nulls: dict[str, int] = field(default_factory=dict)
    low: dict[str, object] = field(default_factory=dict)
    high: dict[str, object] = field(default_factory=dict)

    def add(self, rows: pa.Table, columns: Iterable[str]) -> None:
        self.rows += rows.num_rows
        for name in columns:
            column = rows.column(name)
            if _flat(column.type):
                self.nulls[name] = self.nulls.get(name, 0) + column.null_count
            if not _bounded(column.type) or column.null_count == len(column):
                continue
            bounds = pc.min_max(column)
            low, high = bounds["min"].as_py(), bounds["max"].as_py()
            if name not in self.low or low < self.low[name]:  # type: ignore[operator]
                self.low[name] = low
            if name not in self.high or high > self.high[name]:  # type: ignore[operator]
                self.high[name] = high

    def json(self) -> str:
        low, high = {}, {}
        for name, value in self.low.items():
            top = self.high[name]
            if isinstance(value, str):
                value, top = _prefix(value), _raised_prefix(top)  # type: ignore[arg-type]
                if top is None:
                    continue
            low[name], high[name] = value, top
        return orjson.dumps({"numRecords": self.rows, "minValues": low, "maxValues": high,
                             "nullCount": self.nulls}).decode()


def _flat(kind: pa.DataType) -> bool:
    return not pa.types.is_nested(kind)


def _bounded(kind: pa.DataType) -> bool:
    """Columns whose minimum and maximum are written: integers and strings."""
    return pa.types.is_integer(kind) or pa.types.is_string(kind) or pa.types.is_large_string(kind)


def _prefix(value: str) -> str:
    """The longest prefix of `value` at most STAT_BYTES long in UTF-8: a lower bound of it."""
    cut = value.encode()[:STAT_BYTES].decode(errors="ignore")  # a character cut in two goes
    return value if len(cut) == len(value) else cut


def _raised_prefix(value: str) -> str | None:
    """An upper bound of `value` at most STAT_BYTES long in UTF-8: `value` itself, or its
    prefix with the last character raised by one (None: none that short)."""
    prefix = _prefix(value)
    if prefix == value:
        return value
    while prefix and ord(prefix[-1]) >= 0x10FFFF:
        prefix = prefix[:-1]
    if not prefix:
        return None
    last = ord(prefix[-1]) + 1
    if 0xD800 <= last <= 0xDFFF:  # surrogates are no characters
        last = 0xE000
    return prefix[:-1] + chr(last)


def _chunks(data: pa.Table | pa.RecordBatchReader, rows: int | None) -> Iterator[pa.Table]:
    """The data as tables of whole row groups (the last one may be short)."""
    if isinstance(data, pa.Table):
        yield data
        return
    if rows is None:
        for batch in data:
            yield pa.Table.from_batches([batch])
        return
    step = rows * STREAM_CHUNK_GROUPS
    held: list[pa.RecordBatch] = []
    count = 0
    for batch in data:
        held.append(batch)
        count += batch.num_rows
        if count >= step:
            table = pa.Table.from_batches(held, schema=data.schema)
            whole = count - count % rows
            yield table.slice(0, whole)
            rest = table.slice(whole)
            held, count = rest.to_batches(), rest.num_rows
    if count:
        yield pa.Table.from_batches(held, schema=data.schema)


def syncing() -> bool:
    """Whether a folder's commits sync what they write (`SYNC_ENV`)."""
    return os.environ.get(SYNC_ENV, "1").strip().lower() not in ("0", "off", "false", "no")


def sync_file(path: str) -> None:
    """Sync a local file's data to its disk (`fdatasync`: its size too, not its times)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fdatasync(fd)
    finally:
        os.close(fd)


def sync_folder(path: str) -> None:
    """Sync a local folder's entries to its disk: the names of files created, linked or
    renamed in it are durable only then."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def sync_version(folder: str, version: int) -> None:
    """Sync one version of a local table that delta-rs wrote (a table created, a table gaining
    columns, a compaction's rewrite through delta-rs): the data files its log entry adds, the
    table's folder, the entry and the log's folder. Nothing on object storage (a put is
    durable once it is answered) or where syncing is off."""
    if objects.is_remote(folder) or not syncing():
        return
    folder = folder.removeprefix("file://")
    log = os.path.join(folder, "_delta_log")
    entry = os.path.join(log, f"{version:020d}.json")
    with open(entry, "rb") as f:
        adds = [action["add"]["path"] for line in f.read().splitlines() if line.strip()
                and "add" in (action := orjson.loads(line))]
    for path in adds:
        sync_file(unquote(path) if os.path.isabs(unquote(path)) else os.path.join(folder, unquote(path)))
    if adds:
        sync_folder(folder)
    sync_file(entry)
    sync_folder(log)


def write_file(folder: str, data: pa.Table | pa.RecordBatchReader, schema: pa.Schema,
               options: FileOptions) -> tuple[dict[str, Any], int] | None:
    """Write `data` (cast to `schema`) as one Parquet file in the table folder `folder`; returns
    its add action and row count (None: no rows, no file)."""
    files = write_files(folder, data, schema, options)
    return files[0] if files else None


def write_files(folder: str, data: pa.Table | pa.RecordBatchReader, schema: pa.Schema, options: FileOptions,
                *, file_bytes: int | None = None, into: str | None = None) -> list[tuple[dict[str, Any], int]]:
    """Write `data` (cast to `schema`) as Parquet files of the table in `folder` (a local
    folder or a URI), a new file once one holds `file_bytes` or so (at a row group's end; None:
    one file); returns each file's add action and row count. `into`: a folder to write them in
    instead (the add actions name them as files of `folder`: the caller moves them there,
    `move_in`). On an error no file of them is left."""
    done: list[tuple[dict[str, Any], int]] = []
    current: tuple[pq.ParquetWriter, pa.NativeFile, str, _Stats] | None = None
    columns = schema.names if options.statistics is None else list(options.statistics)
    target = into or folder
    sync = not objects.is_remote(target) and syncing()

    def close() -> None:
        writer, sink, name, stats = current  # type: ignore[misc]
        writer.close()
        size = sink.tell()
        sink.close()
        if sync:
            sync_file(objects.join(target, name).removeprefix("file://"))
        done.append(({"path": name, "partitionValues": {}, "size": size,
                      "modificationTime": int(time.time() * 1000), "dataChange": True, "stats": stats.json()},
                     stats.rows))

    try:
        for chunk in _chunks(data, options.row_group_rows):
            if chunk.num_rows == 0:
                continue
            chunk = chunk.cast(schema) if chunk.schema != schema else chunk
            if current is not None and file_bytes is not None and current[1].tell() >= file_bytes:
                close()  # the file holds every row group written so far: only its footer is to come
                current = None
            if current is None:
                name = f"part-00000-{uuid.uuid4()}-c000.snappy.parquet"
                sink = objects.open_output(objects.join(target, name))
                current = (pq.ParquetWriter(
                    sink, schema, compression="snappy",
                    use_dictionary=[c for c in schema.names if c not in options.plain],
                    write_statistics=True if options.statistics is None else list(options.statistics)),
                    sink, name, _Stats())
            current[0].write_table(chunk, row_group_size=options.row_group_rows or chunk.num_rows)
            current[3].add(chunk, columns)
        if current is not None:
            close()
            current = None
        if sync and done and into is None:  # files written elsewhere are synced where they are moved (`move_in`)
            sync_folder(target.removeprefix("file://"))
    except BaseException:
        if current is not None:
            with suppress(Exception):
                current[0].close()
            with suppress(Exception):
                current[1].close()
            done.append(({"path": current[2]}, 0))
        for add, _ in done:
            with suppress(Exception):  # the error that got here is the one to tell
                objects.remove(objects.join(target, add["path"]))
        raise
    return done


def move_in(folder: str, into: str, adds: list[dict[str, Any]]) -> None:
    """Move the files of `adds`, written in `into`, to the table folder `folder` (the same
    file system: a rename each)."""
    for add in adds:
        os.rename(os.path.join(into, add["path"]), os.path.join(folder, add["path"]))
    if adds and syncing():
        sync_folder(folder)


def commit(folder: str, version: int, adds: list[dict[str, Any]], rows: int,
           removed: Sequence[tuple[str, int]] = ()) -> int:
    """Create log entry `version` of the table in `folder`: the files of `adds` (`rows` rows in
    all) added, those of `removed` ((path in the table, size)) removed; returns `version`. The
    caller holds the writer lock and knows the table's newest version is the one before; a log
    entry that exists already (another writer's) raises StoreError."""
    now = int(time.time() * 1000)
    info = {"commitInfo": {
        "timestamp": now, "operation": "WRITE",
        "operationParameters": {"mode": "Overwrite" if removed else "Append"},
        "engineInfo": f"engagelake:{__version__}", "clientVersion": f"engagelake-{__version__}",
        "operationMetrics": {"num_added_files": len(adds), "num_removed_files": len(removed), "num_partitions": 0,
                             "num_added_rows": rows}}}
    removes = ({"remove": {"path": path, "deletionTimestamp": now, "dataChange": True, "extendedFileMetadata": True,
                           "partitionValues": {}, "size": size}} for path, size in removed)
    text = b"\n".join(orjson.dumps(action) for action in (info, *removes, *({"add": add} for add in adds))) + b"\n"
    if objects.is_remote(folder):  # one conditional put: refused where the entry exists
        if not objects.put_new(objects.join(folder, f"_delta_log/{version:020d}.json"), text):
            raise StoreError(f"version {version} of the table at {folder} exists already: another writer "
                             "committed it")
        if version % REMOTE_CHECKPOINT_INTERVAL == 0:
            checkpoints.write_or_leave(folder, version)  # committed: a checkpoint only shortens the next loads
        return version
    _put_entry(folder, version, text)
    if version % CHECKPOINT_INTERVAL == 0:
        _checkpoint(folder)
    return version


def create(folder: str, schema: pa.Schema) -> int:
    """Create the local table in `folder` empty, with `schema`: version 0 of its log, as
    delta-rs' `write_deltalake` of no rows writes it (the same protocol, metadata and schema
    string, tests/test_store.py compares them), in about 0.3 ms instead of 6 ms: a store creates
    34 tables, and a test suite or a notebook creates many stores. A folder that holds a table
    already raises StoreError."""
    log = os.path.join(folder, "_delta_log")
    os.makedirs(log, exist_ok=True)
    now = int(time.time() * 1000)
    actions: tuple[dict[str, Any], ...] = (
        {"commitInfo": {"timestamp": now, "operation": "WRITE", "operationParameters": {"mode": "Overwrite"},
                        "engineInfo": f"engagelake:{__version__}", "clientVersion": f"engagelake-{__version__}",
                        "operationMetrics": {"num_added_files": 0, "num_removed_files": 0, "num_partitions": 0,
                                             "num_added_rows": 0}}},
        {"protocol": {"minReaderVersion": 1, "minWriterVersion": 2}},
        {"metaData": {"id": str(uuid.uuid4()), "name": None, "description": None,
                      "format": {"provider": "parquet", "options": {}},
                      "schemaString": Schema.from_arrow(schema).to_json(), "partitionColumns": [],
                      "createdTime": now, "configuration": {}}},
    )
    _put_entry(folder, 0, b"\n".join(orjson.dumps(action) for action in actions) + b"\n")
    if syncing():  # the table's folder names its log, the store's folder the table
        sync_folder(folder)
        sync_folder(os.path.dirname(os.path.abspath(folder)))
    return 0


def _put_entry(folder: str, version: int, text: bytes) -> None:
    """Write log entry `version` of the local table in `folder` whole or not at all (a
    temporary file linked to its name: the link fails where another writer made it), synced."""
    log = os.path.join(folder, "_delta_log")
    temporary = os.path.join(log, f"_commit_{uuid.uuid4()}.json.tmp")
    sync = syncing()
    with open(temporary, "wb") as f:
        f.write(text)
        if sync:  # the entry's bytes are on disk before any reader can find it
            f.flush()
            os.fdatasync(f.fileno())
    try:
        os.link(temporary, os.path.join(log, f"{version:020d}.json"))  # fails if another writer made it
    except FileExistsError as error:
        raise StoreError(f"version {version} of the table at {folder} exists already: another writer "
                         "committed it") from error
    finally:
        os.remove(temporary)
    if sync:  # the entry's name is on disk: the version is made
        sync_folder(log)


def created_empty(folder: str) -> frozenset[str] | None:
    """The columns of the local table in `folder` when its first version added no file (as
    every table a store creates starts), read from that version's log entry; None when it added
    files, or the entry is gone or not plain. Loading the table's log through delta-rs costs
    about 2.4 ms (a test's new store has 34 tables, and its first batches ask after most), this
    about 0.1 ms."""
    try:
        with open(os.path.join(folder, "_delta_log", f"{0:020d}.json"), "rb") as f:
            actions = [orjson.loads(line) for line in f.read().splitlines() if line.strip()]
    except (OSError, orjson.JSONDecodeError):
        return None
    if any("add" in action for action in actions):
        return None
    schemas = [action["metaData"].get("schemaString") for action in actions if "metaData" in action]
    if len(schemas) != 1 or not isinstance(schemas[0], str):
        return None
    try:
        return frozenset(field["name"] for field in orjson.loads(schemas[0])["fields"])
    except (orjson.JSONDecodeError, KeyError, TypeError):
        return None


def _checkpoint(folder: str) -> None:
    """A checkpoint, then the expired log cleanup, as delta-rs' commit hooks do every
    `delta.checkpointInterval` versions (100: engagelake never sets another)."""
    table = DeltaTable(folder)
    table.create_checkpoint()
    if (table.metadata().configuration.get("delta.enableExpiredLogCleanup") or "true").lower() == "true":
        table.cleanup_metadata()


# the add actions of a version without files (`with_action` adds the statistics' columns)
NO_ACTIONS = pa.table({"path": pa.array([], pa.string()), "size_bytes": pa.array([], pa.int64()),
                       "modification_time": pa.array([], pa.int64()), "num_records": pa.array([], pa.int64())})


def with_action(actions: pa.Table, add: dict[str, Any]) -> pa.Table:
    """`actions` (a table version's add actions as delta-rs flattens them: `path`, `size_bytes`,
    `modification_time`, `num_records`, `null_count.<column>`, `min.<column>`, `max.<column>`)
    with one more row for `add`, as delta-rs would read it from the log."""
    return pa.concat_tables([actions, actions_of([add])], promote_options="permissive")


def actions_of(adds: list[dict[str, Any]]) -> pa.Table:
    """The add actions `adds` (as the log holds them: statistics as JSON text) as delta-rs
    flattens them (`with_action`); a column of statistics some files lack is null for them."""
    rows = [_flat_action(add) for add in adds]
    if not rows:
        return NO_ACTIONS
    names = list(dict.fromkeys(name for row in rows for name in row))
    return pa.concat_tables([NO_ACTIONS, pa.table({name: [row.get(name) for row in rows] for name in names})],
                            promote_options="permissive")


def _flat_action(add: dict[str, Any]) -> dict[str, Any]:
    stats = orjson.loads(add["stats"]) if add.get("stats") else {}
    row: dict[str, Any] = {"path": add["path"], "size_bytes": add["size"],
                           "modification_time": add["modificationTime"], "num_records": stats.get("numRecords")}
    for prefix, key in (("null_count", "nullCount"), ("min", "minValues"), ("max", "maxValues")):
        row.update({f"{prefix}.{name}": value for name, value in (stats.get(key) or {}).items()})
    return row
