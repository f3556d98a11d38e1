"""Checkpoints of a table on object storage, written from its last checkpoint and the entries since.

A table on object storage takes a checkpoint every 10 versions (`objects.LOG_PROPERTIES`), so
that a fresh reader reads few entries. delta-rs' `create_checkpoint` loads the table, then loads
it again to write: about 65 requests for one of our tables (its last checkpoint read in 11
ranged requests, twice; each entry since read four times). In 100 one-request calls on moto,
the 12 that wrote checkpoints made more than half of all the requests (`docs/performance.md`).

Here a checkpoint is the last one read whole (one request), each entry since read once, the
files they add and remove folded in, and two writes: the checkpoint (of the last one's Arrow
schema, which delta-rs wrote; a table's first one takes the schema of a checkpoint delta-rs
writes once per process, of a local scratch table) and `_last_checkpoint`. Entries that add
and remove files, set the table's metadata (its schema, as a table gains columns) or its
protocol are folded; one with another action (a transaction or domain metadata), or a last
checkpoint in parts, is left to delta-rs. Tombstones (removed files) are kept for
`TOMBSTONE_RETENTION_MS`, as delta-rs keeps them by default.
"""

from __future__ import annotations

import functools
import os
import shutil
import tempfile
import time
from contextlib import suppress
from dataclasses import dataclass
from typing import Any

import orjson
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from deltalake import DeltaTable, write_deltalake

from engagelake.store import objects

TOMBSTONE_RETENTION_MS = 7 * 24 * 3600 * 1000  # delta-rs' default `delta.deletedFileRetentionDuration`
# a reader that knows an older version reads the entries since it while they are fewer than
# this; else it looks for a newer checkpoint first (one is written every 10 versions on S3)
CHECKPOINT_EVERY = 10


def write_or_leave(folder: str, version: int) -> None:
    """The checkpoint of version `version` of the table at `folder`, by `write` or else by
    delta-rs; a failure of either is left at that (the version is committed: a checkpoint only
    shortens the next loads, and the next one comes 10 versions on)."""
    try:
        written = write(folder, version)
    except Exception:  # noqa: BLE001 - delta-rs is then to write it
        written = False
    if not written:
        with suppress(Exception):
            objects.delta_table(folder).create_checkpoint()


def write(folder: str, version: int) -> bool:
    """Write the checkpoint of version `version` of the table at `folder` (the writer's newest);
    False when this cannot (delta-rs is then to write it)."""
    log = objects.join(folder, "_delta_log")
    base = last_version(folder)
    if base is None or base >= version:
        return base == version
    if base < 0:
        before = _template().empty_table()
    elif (read := _checkpoint(log, base)) is None:
        return False
    else:
        before = read
    since = _actions_since(log, base, version)
    if since is None or not set(_KINDS) <= set(before.column_names) or _parsed_statistics(before):
        return False
    files, table_wide = since
    now = int(time.time() * 1000)
    touched = pa.array(list(files), pa.string())
    removal = before.column("remove")
    # rows to leave out: files the entries since add or remove again, expired tombstones,
    # and the metadata and protocol those entries set anew
    gone = [pc.is_in(pc.struct_field(before.column("add"), "path"), touched),
            pc.is_in(pc.struct_field(removal, "path"), touched),
            pc.less(pc.struct_field(removal, "deletionTimestamp"), now - TOMBSTONE_RETENTION_MS),
            *(pc.is_valid(before.column(kind)) for kind in table_wide)]
    kept = before.filter(pc.invert(functools.reduce(pc.or_, (pc.fill_null(g, False) for g in gone))))
    added = [action for kind, action in files.values() if kind == "add"]
    removed = [action for kind, action in files.values()
               if kind == "remove" and (action.get("deletionTimestamp") or now) >= now - TOMBSTONE_RETENTION_MS]
    table = pa.concat_tables([
        *(_rows(before.schema, kind, [action]) for kind, action in table_wide.items()),
        kept, _rows(before.schema, "add", added), _rows(before.schema, "remove", removed)])
    # Arrow's writer refuses a required field under a null struct (an add's `path` in a
    # remove's row), which delta-rs' writer and every reader take: the fields are written
    # as optional, which readers take too
    table = table.cast(_optional(table.schema))
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink, compression="snappy")
    written = sink.getvalue()
    with objects.open_output(objects.join(log, f"{version:020d}.checkpoint.parquet")) as out:
        out.write(written)
    count = pc.sum(pc.is_valid(table.column("add"))).as_py() or 0
    pointer = orjson.dumps({"version": version, "size": table.num_rows, "sizeInBytes": written.size,
                            "numOfAddFiles": count}) + b"\n"
    with objects.open_output(objects.join(log, "_last_checkpoint")) as out:
        out.write(pointer)
    return True


@dataclass(frozen=True)
class Files:
    """A table version's files, as a reader of its log finds them."""

    version: int
    adds: dict[str, dict[str, Any]]  # by path, each file's add action (statistics as JSON text)
    columns: frozenset[str] | None  # the table's columns, as its newest metadata says (None: unknown)


def files_at(folder: str, version: int, known: Files | None = None) -> Files | None:
    """The files of version `version` of the table at `folder`: those of `known` (an older
    version's) and the entries since, or those of the last checkpoint, read whole, and the
    entries since; each entry read once. None when neither can tell (the last checkpoint is
    after `version`, or in parts; an entry is gone or holds an action this does not know):
    delta-rs then loads the log. delta-rs read the checkpoint in 11 ranged requests and each
    entry twice."""
    log = objects.join(folder, "_delta_log")
    near = known is not None and known.version <= version < known.version + CHECKPOINT_EVERY
    if known is not None and near:
        base, adds, columns = known.version, dict(known.adds), known.columns
    else:
        # from the last checkpoint, unless the version known is after it (a writer's, kept up
        # to date): the entries since are then fewer
        last = last_version(folder)
        if last is None:
            return None
        base = last
        if known is not None and base <= known.version <= version:
            base, adds, columns = known.version, dict(known.adds), known.columns
        elif base > version:
            return None
        elif base < 0:
            adds, columns = {}, None
        else:
            if (checkpoint := _checkpoint(log, base, ["add", "metaData"])) is None:
                return None
            adds = {add["path"]: add for add in checkpoint.column("add").drop_null().to_pylist() if add.get("path")}
            columns = _columns(checkpoint.column("metaData").drop_null().to_pylist())
    since = _actions_since(log, base, version)
    if since is None:
        return None
    files, table_wide = since
    for path, (kind, action) in files.items():
        if kind == "add":
            adds[path] = action
        else:
            adds.pop(path, None)
    if "metaData" in table_wide:
        columns = _columns([table_wide["metaData"]])
    return Files(version, adds, columns)


def last_version(folder: str) -> int | None:
    """The version of the last checkpoint of the table at `folder`, as `_last_checkpoint` says
    (-1: none yet; None: one in parts, or a pointer this cannot read)."""
    pointer = objects.read_whole(objects.join(folder, "_delta_log/_last_checkpoint"))
    if pointer is None:
        return -1
    try:
        last = orjson.loads(pointer)
    except orjson.JSONDecodeError:
        return None
    version = last.get("version") if isinstance(last, dict) else None
    return version if isinstance(version, int) and not last.get("parts") else None


def _checkpoint(log: str, version: int, columns: list[str] | None = None) -> pa.Table | None:
    """The checkpoint of `version` in the log folder `log`, read whole (None: it is gone)."""
    data = objects.read_whole(objects.join(log, f"{version:020d}.checkpoint.parquet"))
    return None if data is None else pq.read_table(pa.BufferReader(data), columns=columns)


def _columns(metadata: list[dict[str, Any]]) -> frozenset[str] | None:
    """The top-level columns a metadata action's schema names (None: none, or unreadable)."""
    try:
        return frozenset(field["name"] for field in orjson.loads(metadata[-1]["schemaString"])["fields"])
    except (IndexError, KeyError, TypeError, orjson.JSONDecodeError):
        return None


_KINDS = ("add", "remove", "metaData", "protocol")


def _actions_since(log: str, base: int, version: int) -> tuple[
        dict[str, tuple[str, dict[str, Any]]], dict[str, dict[str, Any]]] | None:
    """What the entries after `base` up to `version` do: the newest add or remove of each file
    they name, by path, and the newest metadata and protocol they set; None when an entry is
    missing or holds another action."""
    files: dict[str, tuple[str, dict[str, Any]]] = {}
    table_wide: dict[str, dict[str, Any]] = {}
    for number in range(base + 1, version + 1):
        text = objects.read_whole(objects.join(log, f"{number:020d}.json"))
        if text is None:
            return None
        for line in text.splitlines():
            if not line.strip():
                continue
            action = orjson.loads(line)
            kind = next(iter(action), None)
            if kind == "commitInfo":
                continue
            if kind not in _KINDS or len(action) != 1:
                return None
            if kind in ("add", "remove"):
                files[action[kind]["path"]] = (kind, action[kind])
            else:
                table_wide[kind] = action[kind]
    return files, table_wide


@functools.cache
def _template() -> pa.Schema:
    """The Arrow schema of delta-rs' checkpoints, from one it writes of a scratch table."""
    folder = tempfile.mkdtemp(prefix="engagelake-checkpoint-")
    try:
        write_deltalake(folder, pa.table({"a": pa.array([], pa.int64())}))
        DeltaTable(folder).create_checkpoint()
        return pq.read_schema(os.path.join(folder, "_delta_log", f"{0:020d}.checkpoint.parquet"))
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _parsed_statistics(checkpoint: pa.Table) -> bool:
    """Whether the checkpoint's adds carry their statistics as structs too
    (`delta.checkpoint.writeStatsAsStruct`, which engagelake never sets): new adds would lack
    them, and delta-rs then reads those files as having none."""
    kind = checkpoint.schema.field("add").type
    return any(kind.field(i).name.endswith("_parsed") for i in range(kind.num_fields))


def _rows(schema: pa.Schema, column: str, actions: list[dict[str, Any]]) -> pa.Table:
    """Checkpoint rows of `schema` holding `actions` in `column`, every other column null."""
    return pa.table([pa.array(actions, field.type) if field.name == column else pa.nulls(len(actions), field.type)
                     for field in schema], schema=schema)


def _optional(schema: pa.Schema) -> pa.Schema:
    return pa.schema([_optional_field(field) for field in schema], metadata=schema.metadata)


def _optional_field(field: pa.Field) -> pa.Field:
    kind = field.type
    if pa.types.is_struct(kind):
        kind = pa.struct([_optional_field(child) for child in kind])
    elif pa.types.is_map(kind):
        kind = pa.map_(kind.key_type, _optional_field(kind.item_field).type)
    elif pa.types.is_list(kind):
        kind = pa.list_(_optional_field(kind.value_field))
    return field.with_type(kind).with_nullable(True)
