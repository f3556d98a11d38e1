"""Every copy of some values left anywhere in a store: `engagelake forget-check`.

`/users/delete` followed by `compact` is a hard delete; `find_copies` is how to verify one. It
walks every file under the store root (a local folder, or every object under the store's
prefix on object storage), whatever wrote it, and searches each in the form it has on disk:

- Parquet files (table data, files of older Delta versions still on disk, checkpoints, the
  published `current/` tables, anything else named `.parquet`) are decoded: every column as
  text (nested lists, structs and maps as JSON text, binary as bytes), one vectorized
  `str.contains(literal=True)` per column and value over the whole file; then the min/max
  statistics of every row group and column in the footer; then, for values not found so far,
  the file's raw bytes, which hold the page index (per-page min/max) uncompressed. A
  checkpoint's `add.stats` are also read as the min/max they hold per column.
- Delta log entries (`_delta_log/*.json`) are parsed: each action's text, and the per-column
  min/max of its `stats`.
- Footer caches (`_footers/**.npz`, `store/footers.py`) are loaded: each array's bytes (the
  fences of a sorted table hold its sort column's values: keys, emails).
- Any other file (`_last_checkpoint`, lock files, markers, leftovers) as raw bytes: a
  compressed file other than Parquet is not decoded.

A value is searched as it is and as JSON text writes it (quotes and backslashes escaped,
non-ASCII as is or as `\\u` escapes), case-sensitively. Statistics keep the first 64 bytes of a
longer string (the max with its last character raised): a statistic cut there that ends with
the first `CUT_MIN_CHARS` characters or more of a value is reported as a cut copy.

Files of a table (a folder holding `_delta_log`) that the table's newest version does not
reference are older versions' data, kept until a vacuum removes them; log entries that add
such files (their `add` actions hold the files' statistics) are old log entries; footer caches
of such files are old too. Each table that keeps any is reported (`Retained`): compaction
vacuums with a retention of 0 and drops old log entries, so a compacted store retains none.
Nothing is written.
"""

from __future__ import annotations

import functools
import io
import json
import mmap
import os
import zipfile
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import numpy as np
import orjson
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
from deltalake.exceptions import DeltaError

from engagelake.errors import ConfigError, NotAStore
from engagelake.store import objects

DATA = "table data"
OLD_DATA = "old version data"
DELTA_LOG = "delta log"
CHECKPOINT = "checkpoint"
FOOTER_CACHE = "footer cache"
STATISTICS = "statistics"
OTHER = "other"
PLACES = (DATA, OLD_DATA, DELTA_LOG, CHECKPOINT, FOOTER_CACHE, STATISTICS, OTHER)

LOG = "_delta_log"
FOOTERS = "_footers"  # `footers.INDEX_FOLDER`: a store's footer caches
FOOTER_SUFFIX = ".footer.npz"
CUT_MIN_CHARS = 6  # the shortest start of a value reported as a cut copy in a statistic
TRUNCATED_BYTES = 64  # the length arrow-rs (delta-rs's Parquet writer) cuts string statistics to
_ENTRY = objects.LOG_ENTRY
_TEXT = {"column": pl.String, "detail": pl.String, "text": pl.String}
# a file that cannot be decoded as what its name says is searched as raw bytes, and reported
_UNREADABLE = (OSError, ValueError, KeyError, zipfile.BadZipFile, pl.exceptions.PolarsError, pa.ArrowException)
RAW_CHUNK_BYTES = 64 << 20  # an object's raw bytes are searched a chunk at a time (a folder's are mapped)


@dataclass(frozen=True)
class Occurrence:
    """One place a value was found."""

    path: str  # the file, relative to the store root
    place: str  # one of PLACES
    table: str | None  # the table folder (relative: "profiles", "current/profiles"), if any
    column: str | None  # the column (or footer cache array), when known
    value: str  # the value searched for
    detail: str = ""  # how many rows; which statistic; a cut copy


@dataclass(frozen=True)
class Retained:
    """A table's older versions still on disk: data files its newest version does not
    reference (and their footer caches), and log entries that add such files."""

    table: str
    version: int  # the table's newest version
    old_files: tuple[str, ...]  # relative to the store root
    old_log_entries: tuple[str, ...]


@dataclass
class ForgetReport:
    """What `find_copies` found under `root`."""

    root: str
    values: tuple[str, ...]  # what was searched for
    occurrences: list[Occurrence] = field(default_factory=list)
    retained: list[Retained] = field(default_factory=list)
    unreadable: list[str] = field(default_factory=list)  # "path: why": searched as raw bytes only
    notes: list[str] = field(default_factory=list)  # tables whose old versions could not be told apart
    files: int = 0  # files searched
    profiles: int = 0  # profiles the identifiers named (`Workspace.forget_check`): their values were searched

    @property
    def found(self) -> bool:
        """Whether a value occurs anywhere, or a file could not be searched whole (then the
        check proves nothing about it)."""
        return bool(self.occurrences or self.unreadable)


def find_copies(root: str | Path, values: Sequence[str]) -> ForgetReport:
    """Every occurrence of any of `values` in every file under `root` (a local folder, or a
    store's URI on object storage), and each table's retained old versions (see the module's
    docstring). Writes nothing."""
    root = str(root) if objects.is_remote(str(root)) else str(Path(str(root).removeprefix("file://")))
    if not objects.is_folder(root):  # nothing found in no folder would prove nothing
        raise NotAStore(f"no store folder at {root}: pass the folder of a store, or its s3:// URI")
    wanted = tuple(dict.fromkeys(v for v in values if v))
    if not wanted:
        raise ConfigError("nothing to look for: give at least one non-empty value")
    report = ForgetReport(root, wanted)
    files = sorted(objects.files_under(root))
    tables = {name: _Table.load(root, name) for name in _table_folders(files)}
    for rel in files:
        report.files += 1
        table = _table_of(rel, tables)
        place, kind = _classify(rel, table)
        name = table.name if table is not None else None
        try:
            found = _search_file(root, rel, place, kind, table, wanted)
        except _UNREADABLE as error:
            report.unreadable.append(f"{rel}: {str(error).splitlines()[0] if str(error) else type(error).__name__}")
            try:
                found = list(_raw(root, rel, place, name, wanted, "raw bytes (the file does not decode)"))
            except OSError:  # not even readable
                found = []
        report.occurrences.extend(found)
    for name, table in sorted(tables.items()):
        if table.error is not None:  # its files were searched all the same, as current data
            report.notes.append(f"{name}: its Delta log does not load ({table.error}); old versions not told apart")
        elif (retained := table.retained(files)) is not None:
            report.retained.append(retained)
    return report


# --- the walk ------------------------------------------------------------------------------------


def _table_folders(files: list[str]) -> set[str]:
    """The Delta tables: folders holding a `_delta_log` folder."""
    return {rel.split(f"/{LOG}/")[0] for rel in files if f"/{LOG}/" in rel}


@dataclass
class _Table:
    """A Delta table at its newest version: its data files, and the log files that add others."""

    name: str  # its folder, relative to the root
    version: int = -1
    files: frozenset[str] = frozenset()  # data files of the newest version, relative to the table
    error: str | None = None  # its log does not load: its files are searched, not classified
    old_entries: set[str] = field(default_factory=set)

    @classmethod
    def load(cls, root: str, name: str) -> _Table:
        try:
            table = objects.delta_table(objects.join(root, name))
            paths = pa.table(table.get_add_actions(flatten=True)).column("path").to_pylist()
            return cls(name, table.version(), frozenset(unquote(p) for p in paths))
        except (DeltaError, OSError, ValueError, pa.ArrowException) as error:
            return cls(name, error=str(error).splitlines()[0] if str(error) else type(error).__name__)

    def inside(self, rel: str) -> str:
        return rel[len(self.name) + 1:]

    def note_adds(self, rel: str, paths: Iterable[str]) -> None:
        """The log file `rel` adds `paths`: an old log entry when one is not a current file."""
        if self.error is None and any(unquote(p) not in self.files for p in paths):
            self.old_entries.add(rel)

    def retained(self, files: list[str]) -> Retained | None:
        old = [rel for rel in files if rel.startswith(f"{self.name}/") and _is_data(self.inside(rel))
               and self.inside(rel) not in self.files]
        caches = f"{FOOTERS}/{self.name}/"
        old += [rel for rel in files if rel.startswith(caches) and rel.endswith(FOOTER_SUFFIX)
                and rel[len(caches):-len(FOOTER_SUFFIX)] not in self.files]
        if not old and not self.old_entries:
            return None
        return Retained(self.name, self.version, tuple(sorted(old)), tuple(sorted(self.old_entries)))


def _is_data(inside: str) -> bool:
    return not inside.startswith(f"{LOG}/") and inside.endswith(".parquet")


def _table_of(rel: str, tables: dict[str, _Table]) -> _Table | None:
    """The table whose folder holds `rel` (the innermost), or None."""
    parts = rel.split("/")
    for n in range(len(parts) - 1, 0, -1):
        if (table := tables.get("/".join(parts[:n]))) is not None:
            return table
    return None


def _classify(rel: str, table: _Table | None) -> tuple[str, str]:
    """(place, how it is searched) of a file: entry, checkpoint, parquet, cache or raw."""
    inside = table.inside(rel) if table is not None else rel
    base = inside.rsplit("/", 1)[-1]
    if table is not None and inside.startswith(f"{LOG}/"):
        if _ENTRY.match(base):
            return DELTA_LOG, "entry"
        if base.endswith(".parquet"):  # checkpoints (one file or parts) and their sidecars
            return CHECKPOINT, "checkpoint"
        return DELTA_LOG, "raw"  # _last_checkpoint, temporary commits
    if table is not None and _is_data(inside):
        return (DATA if table.error is not None or inside in table.files else OLD_DATA), "parquet"
    if rel.startswith(f"{FOOTERS}/") and rel.endswith(FOOTER_SUFFIX):
        return FOOTER_CACHE, "cache"
    return OTHER, "parquet" if rel.endswith(".parquet") else "raw"


def _search_file(root: str, rel: str, place: str, kind: str, table: _Table | None,
                 values: tuple[str, ...]) -> list[Occurrence]:
    name = table.name if table is not None else None
    if kind == "entry":
        assert table is not None
        return list(_search_entry(root, rel, table, values))
    if kind in ("parquet", "checkpoint"):
        return list(_search_parquet(root, rel, place, name, values, checkpoint=table if kind == "checkpoint" else None))
    if kind == "cache":
        cached = rel.split("/")[1] if rel.count("/") >= 2 else None
        return list(_search_footer_cache(root, rel, cached, values))
    return list(_raw(root, rel, place, name, values, "raw bytes"))


# --- searching text ------------------------------------------------------------------------------


def _forms(value: str) -> list[str]:
    """The value, and its forms inside JSON text (quotes and backslashes escaped, non-ASCII
    as is or escaped)."""
    return list(dict.fromkeys([value, json.dumps(value, ensure_ascii=False)[1:-1], json.dumps(value)[1:-1]]))


def _holds(text: pl.Expr, value: str) -> pl.Expr:
    """Whether `text` holds `value` in any of its forms: one vectorized test per form."""
    return pl.any_horizontal([text.str.contains(form, literal=True) for form in _forms(value)])


def _cut_copy(text: pl.Expr, value: str) -> pl.Expr:
    """Whether a statistic `text`, cut to TRUNCATED_BYTES, ends with the first characters of
    `value`, at least CUT_MIN_CHARS of them (in a max, with the last one raised)."""
    starts = []
    for k in range(CUT_MIN_CHARS, len(value)):
        starts.append(value[:k])
        if ord(value[k - 1]) < 0x10FFFF:
            starts.append(value[: k - 1] + chr(ord(value[k - 1]) + 1))
    if not starts:
        return pl.lit(False)
    cut = text.str.len_bytes() >= TRUNCATED_BYTES - 3  # cut at a character's boundary: 61-64 bytes
    return cut & pl.any_horizontal([text.str.ends_with(s) for s in starts])


def _search_texts(texts: pl.DataFrame, rel: str, place: str, table: str | None,
                  values: tuple[str, ...]) -> Iterator[Occurrence]:
    """Occurrences in statistics and other texts (a frame of `column`, `detail`, `text`):
    whole values, and cut copies. Every value is tested in one pass over the texts."""
    if texts.height == 0 or not values:
        return
    marks = texts.select("column", "detail", "text", *_text_marks(values))
    found = (
        marks.with_row_index("row").unpivot(index=["row", "column", "detail", "text"], variable_name="mark")
        .filter(pl.col("value"))
        .with_columns(kind=pl.col("mark").str.split(":").list.first(),
                      v=pl.col("mark").str.split(":").list.last().cast(pl.Int64))
        # per value, as one value at a time would find them: whole copies, then cut ones
        .sort("v", pl.col("kind") == "cut", "row")
        .unique(["v", "kind", "column", "detail"], maintain_order=True)
    )
    rows = found.select("kind", "v", "column", "detail", "text")
    for kind, v, column, detail, copy in rows.iter_rows():  # not hot: one row per place found, after the vectorized match
        if kind == "whole":
            yield Occurrence(rel, place, table, column, values[v], detail)
        else:
            yield Occurrence(rel, place, table, column, values[v], f"{detail}, cut copy: ...{copy[-16:]!r}")


@functools.lru_cache(maxsize=4)
def _text_marks(values: tuple[str, ...]) -> tuple[pl.Expr, ...]:
    """Per value, whether a text holds it whole, and whether it holds a cut copy (not whole):
    built once per search, not per file (a cut copy's test has two terms per character)."""
    text = pl.col("text")
    whole = [_holds(text, value) for value in values]
    return (*(held.alias(f"whole:{v}") for v, held in enumerate(whole)),
            *((_cut_copy(text, value) & ~held).alias(f"cut:{v}")
              for v, (value, held) in enumerate(zip(values, whole, strict=True))))


def _raw(root: str, rel: str, place: str, table: str | None, values: tuple[str, ...],
         detail: str) -> Iterator[Occurrence]:
    """A file's raw bytes, searched for each value's forms: a local file mapped (not read into
    memory), an object read a chunk at a time."""
    forms = {v: [form.encode() for form in _forms(v)] for v in values}
    path = objects.join(root, rel)
    if objects.is_remote(path):
        hits = _raw_object(path, forms)
    else:
        with open(path, "rb") as f:
            if os.fstat(f.fileno()).st_size == 0:
                return
            with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
                hits = [v for v, encoded in forms.items() if any(mapped.find(form) >= 0 for form in encoded)]
    for value in hits:
        yield Occurrence(rel, place, table, None, value, detail)


def _raw_object(path: str, forms: dict[str, list[bytes]]) -> list[str]:
    """The values any of whose forms an object's bytes hold, read `RAW_CHUNK_BYTES` at a time;
    each chunk starts with the last bytes of the one before, so a form across two is found."""
    overlap = max((len(form) for encoded in forms.values() for form in encoded), default=1) - 1
    found: set[str] = set()
    tail = b""
    with objects.open_input(path) as source:
        while len(found) < len(forms) and (chunk := source.read(RAW_CHUNK_BYTES)):
            window = tail + chunk
            found.update(v for v, encoded in forms.items() if v not in found and any(f in window for f in encoded))
            tail = window[-overlap:] if overlap else b""
    return [v for v in forms if v in found]


# --- Parquet -------------------------------------------------------------------------------------


@functools.lru_cache(maxsize=1024)  # per column and value: the same in every file of a table
def _held(name: str, dtype: pl.DataType, value: str) -> pl.Expr | None:
    """Whether each row of a column holds `value` (None: a column of nulls only)."""
    if isinstance(dtype, pl.Null):
        return None
    if isinstance(dtype, pl.Binary):
        return pl.any_horizontal([pl.col(name).bin.contains(form.encode()) for form in _forms(value)])
    text = pl.struct(pl.col(name)).struct.json_encode() if dtype.is_nested() else pl.col(name).cast(pl.String)
    return _holds(text, value)


def _search_parquet(root: str, rel: str, place: str, table: str | None, values: tuple[str, ...], *,
                    checkpoint: _Table | None = None) -> Iterator[Occurrence]:
    path = objects.join(root, rel)
    rows = pl.scan_parquet(path, hive_partitioning=False, storage_options=objects.storage_options(path))
    names = list(rows.collect_schema().items())
    counts = [held.sum().alias(f"{c}:{v}") for c, (name, dtype) in enumerate(names)
              for v, value in enumerate(values) if (held := _held(name, dtype, value)) is not None]
    found: set[str] = set()
    if counts:  # one pass over the file: rows holding each value, per column
        for key, n in rows.select(counts).collect(engine="streaming").row(0, named=True).items():
            if n:
                c, v = map(int, key.split(":"))
                found.add(values[v])
                yield Occurrence(rel, place, table, names[c][0], values[v], f"{n} row{'s' * (n != 1)}")
    stats = _search_texts(_footer_statistics(path), rel, STATISTICS, table, values)
    if checkpoint is not None:
        stats = _chain(stats, _search_checkpoint_stats(path, rel, checkpoint, values))
    for occurrence in stats:
        found.add(occurrence.value)
        yield occurrence
    if missed := tuple(v for v in values if v not in found):  # outside the pages and the footer
        yield from _raw(root, rel, STATISTICS, table, missed, "raw bytes: the page index or other metadata")


def _chain(*parts: Iterable[Occurrence]) -> Iterator[Occurrence]:
    for part in parts:
        yield from part


def _footer_statistics(path: str) -> pl.DataFrame:
    """The min and max of every row group's column chunks, as text: `column`, `detail`, `text`."""
    with objects.open_input(path) as source:
        metadata = pq.read_metadata(source)
    rows: list[tuple[str, str, str]] = []
    for g in range(metadata.num_row_groups):
        group = metadata.row_group(g)
        for c in range(group.num_columns):
            chunk = group.column(c)
            stats = chunk.statistics
            if stats is None or not stats.has_min_max:
                continue
            for which, bound in (("min", stats.min), ("max", stats.max)):
                text = bound.decode("utf-8", "replace") if isinstance(bound, bytes) else str(bound)
                rows.append((chunk.path_in_schema, f"row group {g} {which}", text))
    return pl.DataFrame(rows, schema=_TEXT, orient="row")


def _search_checkpoint_stats(path: str, rel: str, table: _Table, values: tuple[str, ...]) -> Iterator[Occurrence]:
    """A checkpoint's `add` actions: the files it adds (one no longer current makes it an old
    log entry), and the min/max per column of their `stats`."""
    with objects.open_input(path) as source:
        if "add" not in pq.read_schema(source).names:
            return
        added = pl.from_arrow(pq.read_table(source, columns=["add"]))
    assert isinstance(added, pl.DataFrame)
    adds = added.select(
        pl.col("add").struct.field("path"), pl.col("add").struct.field("stats")).drop_nulls("path")
    table.note_adds(rel, adds["path"].to_list())
    yield from _search_texts(_stat_texts(adds["stats"].to_list()), rel, CHECKPOINT, table.name, values)


# --- Delta log entries ---------------------------------------------------------------------------


def _search_entry(root: str, rel: str, table: _Table, values: tuple[str, ...]) -> Iterator[Occurrence]:
    """A log entry's actions parsed: their text (paths, schema, commit info) and the per-column
    min/max of their files' statistics. An entry that does not parse is searched as raw bytes."""
    text = objects.read_whole(objects.join(root, rel))
    if text is None:
        raise FileNotFoundError(f"{rel} is gone")
    try:
        actions = [orjson.loads(line) for line in text.splitlines() if line.strip()]
    except orjson.JSONDecodeError:
        yield from _raw(root, rel, DELTA_LOG, table.name, values, "raw bytes (the entry does not parse)")
        return
    texts: list[tuple[str | None, str, str]] = []
    stats: list[str | None] = []
    added: list[str] = []
    for action in actions:
        for kind, body in action.items():
            if kind in ("add", "remove") and isinstance(body, dict):
                stats.append(body.get("stats"))
                if kind == "add":
                    added.append(str(body.get("path")))
                body = {k: v for k, v in body.items() if k != "stats"}
            texts.extend((None, where, text) for where, text in _leaves(body, kind))
    table.note_adds(rel, added)
    frame = pl.concat([pl.DataFrame(texts, schema=_TEXT, orient="row"), _stat_texts(stats)])
    yield from _search_texts(frame, rel, DELTA_LOG, table.name, values)


def _leaves(node: Any, where: str) -> Iterator[tuple[str, str]]:
    """(path, text) of every key and every non-null leaf of a parsed JSON value."""
    if isinstance(node, dict):
        for key, value in node.items():
            yield where, str(key)
            yield from _leaves(value, f"{where}.{key}")
    elif isinstance(node, list):
        for item in node:
            yield from _leaves(item, f"{where}[]")
    elif node is not None:
        yield where, str(node)


def _stat_leaves(node: Any, column: str) -> Iterator[tuple[str, str]]:
    """(column, text) of each bound in a `minValues` or `maxValues` object (nested columns
    as dotted names)."""
    if isinstance(node, dict):
        for key, value in node.items():
            yield from _stat_leaves(value, f"{column}.{key}" if column else str(key))
    elif node is not None:
        yield column, str(node)


def _stat_texts(stats: Iterable[str | None]) -> pl.DataFrame:
    """The bounds per column in Delta file statistics (`stats` JSON): `column`, `detail`, `text`."""
    rows: list[tuple[str | None, str, str]] = []
    for text in stats:
        if not text:
            continue
        try:
            parsed = orjson.loads(text)
        except orjson.JSONDecodeError:
            rows.append((None, "stats (does not parse)", text))
            continue
        for which in ("minValues", "maxValues"):
            rows.extend((column, which, bound) for column, bound in _stat_leaves(parsed.get(which), ""))
    return pl.DataFrame(rows, schema=_TEXT, orient="row")


# --- footer caches -------------------------------------------------------------------------------


def _search_footer_cache(root: str, rel: str, table: str | None, values: tuple[str, ...]) -> Iterator[Occurrence]:
    """Each array of a footer cache (`np.savez`, `footers.save_index`): its bytes (byte-string
    arrays: raw Parquet statistics, the fences), unicode arrays as UTF-8."""
    data = objects.read_whole(objects.join(root, rel))
    if data is None:
        raise FileNotFoundError(f"{rel} is gone")
    with np.load(io.BytesIO(data), allow_pickle=False) as arrays:
        contents = {name: arrays[name] for name in arrays.files}
    for name, array in contents.items():
        data = "\n".join(map(str, array.ravel().tolist())).encode() if array.dtype.kind == "U" else array.tobytes()
        for value in values:
            if any(data.find(form.encode()) >= 0 for form in _forms(value)):
                yield Occurrence(rel, FOOTER_CACHE, table, name, value, f"array {name!r}")
