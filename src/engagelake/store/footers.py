"""Parquet footers kept as where their row groups' entries lie, parsed a few row groups at a time.

pyarrow parses a whole footer into about 920 bytes per column chunk (8x its size on disk), and
a point read of a big file needs only the few row groups it reads: a 10M-user store's
footers took 650 MiB parsed in a cold export of 50 users. A `Footer` keeps the file's header
and trailing fields (the schema: a few KB) and where each row group's entry lies in the file.
A read of some row groups reads those entries and parses a footer spliced from them: it points
at the same file offsets, so pyarrow reads the same bytes (1.7 ms for 50 row groups of a
profiles file against 47 ms for its whole footer).

Thrift's compact protocol writes a FileMetaData's `num_rows` (field 3) and then its
`row_groups` list (field 4); each RowGroup starts with its column list's header and ends with
`total_byte_size` (2), `num_rows` (3) and a few integer fields, then a stop byte. The whole
footer is parsed once, to find those places and check them (`_entries`), then dropped. A
footer whose entries cannot be told apart (another writer's layout) is kept parsed, as before.
"""

from __future__ import annotations

import os
import re
import struct
import threading
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from pyarrow._parquet import ParquetReader

from engagelake.store import membership, objects, records

MAGIC = b"PAR1"
# compact-protocol field headers: (field id delta << 4) | type
_I64_NEXT = 0x16  # the next field, an i64
_LIST_NEXT = 0x19  # the next field, a list
_STRUCT_ELEMENTS = 0xC
NESTED = -1  # ends the leaf positions of a nested column (`Footer.leaves`)


@dataclass(frozen=True)
class Footer:
    """One data file's footer: its bytes and row-group entries, or the parsed footer when its
    entries could not be found."""

    path: str
    num_rows: int
    group_rows: np.ndarray  # rows of each row group
    entries: np.ndarray | None = None  # (start, end) of each row group's entry, offsets in the file
    head: bytes = b""  # every field before the row-group list's header (the schema, the row count)
    tail: bytes = b""  # every field after the list
    parsed: pq.FileMetaData | None = None
    # the file's columns as its reader takes them, drawn from the first footer read (`leaves`)
    _leaves: dict[str, tuple[int, ...]] = field(default_factory=dict, compare=False, repr=False)

    @property
    def num_row_groups(self) -> int:
        return len(self.group_rows)

    @property
    def nbytes(self) -> int:
        """What keeping it costs in memory."""
        if self.parsed is not None:
            return self.parsed.serialized_size * 8  # pyarrow's thrift structures
        assert self.entries is not None
        return len(self.head) + len(self.tail) + self.entries.nbytes + self.group_rows.nbytes

    def open(self, groups: list[int] | None = None) -> tuple[pq.ParquetFile, list[int]]:
        """The file, with a footer that holds at least `groups` (all: None), and the numbers
        of those row groups in it: a `ParquetFile`, for callers that want one (the footer
        tests); reads go through `read`."""
        if groups is None:
            groups = list(range(self.num_row_groups))
        if self.parsed is not None:
            return _file(self.path, self.parsed), groups
        return _file(self.path, self.metadata(groups)), list(range(len(groups)))

    def read(self, groups: list[int], columns: list[str] | None, key: str) -> pa.Table:
        """The file's `groups`, in `columns` (None: all) that hold a value there by their
        statistics, `key` always (`held_columns`). A point read: pyarrow's reader is opened
        directly, with the columns as leaf positions (`ParquetFile` resolves the path, the
        file system and every column's nested paths per file opened: about a tenth of a
        profiles point read)."""
        metadata = self.parsed if self.parsed is not None else self.metadata(groups)
        local = groups if self.parsed is not None else list(range(len(groups)))
        leaves = self.leaves(metadata)
        reader = ParquetReader()
        reader.open(_source(self.path), metadata=metadata, pre_buffer=False)
        wanted = list(leaves) if columns is None else columns
        held = held_columns(metadata, local, [c for c in wanted if c in leaves], key, leaves)
        return reader.read_row_groups(local, column_indices=[i for c in held for i in leaves[c] if i != NESTED],
                                      use_threads=False)

    def leaves(self, metadata: pq.FileMetaData) -> dict[str, tuple[int, ...]]:
        """Each top-level column's leaf positions, then `NESTED` when it nests (a list has
        one leaf, a struct several)."""
        if not self._leaves:
            found: dict[str, list[int]] = {}
            nested: set[str] = set()
            group = metadata.row_group(0) if metadata.num_row_groups else None
            for i in range(metadata.num_columns):
                path = group.column(i).path_in_schema if group is not None else metadata.schema.column(i).path
                name = path.split(".", 1)[0]
                found.setdefault(name, []).append(i)
                if name != path:
                    nested.add(name)
            self._leaves.update({name: (*at, NESTED) if name in nested else tuple(at) for name, at in found.items()})
        return self._leaves

    def metadata(self, groups: list[int]) -> pq.FileMetaData:
        """A footer of the file's `groups` only (in that order)."""
        assert self.entries is not None
        spans = self.entries[groups].tolist()  # entries are read when needed: they are most of the footer
        if objects.is_remote(self.path):
            with objects.open_input(self.path) as f:
                picked = [f.read_at(end - start, start) for start, end in spans]
        else:
            fd = os.open(self.path, os.O_RDONLY)
            try:
                picked = [os.pread(fd, end - start, start) for start, end in spans]
            finally:
                os.close(fd)
        return _parse(b"".join((self.head, _list_header(len(groups)), *picked, self.tail)))


def read_footer(path: str) -> tuple[Footer, pq.FileMetaData]:
    """The footer of a data file, and its whole parsed form (for what a reader derives once,
    such as fences; not kept)."""
    with objects.open_input(path) as f:
        end = f.size()
        length, magic = struct.unpack("<I4s", f.read_at(8, end - 8)) if end >= 8 else (0, b"")
        if magic != MAGIC:
            raise pa.ArrowInvalid(f"{path} is not a Parquet file (no {MAGIC!r} at its end)")  # a ValueError
        offset = end - 8 - length
        raw = f.read_at(length, offset)
    metadata = _parse(raw)
    rows = np.array([metadata.row_group(g).num_rows for g in range(metadata.num_row_groups)], dtype=np.int64)
    footer = _entries(path, raw, offset, metadata, rows)
    if footer is None:
        footer = Footer(path, metadata.num_rows, rows, parsed=metadata)
    return footer, metadata


def _entries(path: str, raw: bytes, offset: int, metadata: pq.FileMetaData, rows: np.ndarray) -> Footer | None:
    """The footer with the span of each row-group entry in the file (`raw` is the footer, at
    `offset`), or None when they cannot be told apart.

    Each entry starts with its column list's header and its first column chunk's first field,
    right after the stop byte of the entry before: the first `n` places where those bytes occur
    after the list's header are the entries' starts, unless a column's statistics hold the
    same bytes. Such a place would shift every later entry by one, so the last entry (and one
    in the middle) is parsed and checked against the whole footer."""
    n = metadata.num_row_groups
    if n == 0:
        return None
    header = bytes([_I64_NEXT]) + _varint(_zigzag(metadata.num_rows)) + bytes([_LIST_NEXT]) + _list_header(n)
    at = raw.find(header)
    if at < 0 or raw.find(header, at + 1) >= 0:
        return None
    head_end = at + len(header) - len(_list_header(n))
    # the list's header, then the first column chunk's first field: its file_offset (or path)
    first_field = re.compile(re.escape(bytes([_LIST_NEXT]) + _list_header(metadata.num_columns)) + b"[\x26\x18]")
    starts = np.fromiter((m.start() for m in first_field.finditer(raw, at + len(header))), dtype=np.int64)
    if len(starts) == 0 or starts[0] != at + len(header):
        return None
    # after the first, an entry starts right after the stop byte of the one before (statistics
    # of integers and times hold these bytes by chance: a few times in a file of 4,000 groups)
    starts = starts[np.append(True, np.frombuffer(raw, dtype=np.uint8)[starts[1:] - 1] == 0)]
    if len(starts) < n:
        return None
    starts = starts[:n]
    last = metadata.row_group(n - 1)
    known = (bytes([_I64_NEXT]) + _varint(_zigzag(last.total_byte_size))
             + bytes([_I64_NEXT]) + _varint(_zigzag(last.num_rows)))
    found = raw.find(known, int(starts[-1]))
    end = None if found < 0 else _skip_integers(raw, found + len(known))
    if end is None:
        return None
    entries = np.column_stack([starts, np.append(starts[1:], end)]) + offset
    footer = Footer(path, metadata.num_rows, rows, entries, raw[:head_end], raw[end:])
    checked = sorted({n // 2, n - 1})
    try:
        spliced = footer.metadata(checked)
    except (OSError, ValueError):  # pyarrow could not read it: not entries after all
        return None
    for i, g in enumerate(checked):
        got, want = spliced.row_group(i), metadata.row_group(g)
        if (got.num_rows, got.total_byte_size, got.column(0).data_page_offset) != (
                want.num_rows, want.total_byte_size, want.column(0).data_page_offset):
            return None
    return footer


def _skip_integers(raw: bytes, pos: int) -> int | None:
    """The end of a struct whose remaining fields are integers (varints): past its stop byte."""
    while pos < len(raw) and raw[pos] != 0:
        if raw[pos] & 0x0F not in (4, 5, 6):  # i16, i32, i64
            return None
        pos += 1
        while pos < len(raw) and raw[pos] & 0x80:
            pos += 1
        pos += 1
    return pos + 1 if pos < len(raw) else None


def held_columns(metadata: pq.FileMetaData, groups: list[int], columns: list[str], key: str,
                 leaves: dict[str, tuple[int, ...]]) -> list[str]:
    """Of `columns`, those not null throughout `groups` by their statistics (a column left out
    reads as null: `runs._conformed`). A sparse profile field is null in most row groups, and a
    column chunk costs a point read about the same whatever it holds (15 of the 31 chunks of a
    profiles row group of the 10M benchmark store hold only nulls). Nested columns are always
    read: an empty list counts as a null in the statistics."""
    chosen = [metadata.row_group(g) for g in groups]
    kept = []
    for name in columns:
        at = leaves[name]
        if name == key or at[-1] == NESTED or not all(
                (stats := group.column(at[0]).statistics) is not None and stats.has_null_count
                and stats.null_count == group.num_rows for group in chosen):
            kept.append(name)
    return kept


def _parse(body: bytes) -> pq.FileMetaData:
    # pyarrow's reader itself: `pq.read_metadata` wraps it in a `ParquetFile`, which resolves
    # every column's nested paths (a third of the parse of a point read's footer)
    reader = ParquetReader()
    reader.open(pa.BufferReader(MAGIC + body + struct.pack("<I", len(body)) + MAGIC))
    return reader.metadata


def _file(path: str, metadata: pq.FileMetaData) -> pq.ParquetFile:
    """Without pre-buffering: coalescing a local file's column chunks through the I/O pool cost
    20-30% of a point read (object storage would want it back)."""
    return pq.ParquetFile(_source(path), metadata=metadata, pre_buffer=False)


def _source(path: str) -> str | pa.NativeFile:
    """What pyarrow's reader opens: a local path as it is, an object through its file system."""
    return objects.open_input(path) if objects.is_remote(path) else path


def _list_header(size: int) -> bytes:
    return bytes([(size << 4) | _STRUCT_ELEMENTS]) if size < 15 else bytes([0xF0 | _STRUCT_ELEMENTS]) + _varint(size)


def _zigzag(n: int) -> int:
    return (n << 1) ^ (n >> 63)


def _varint(n: int) -> bytes:
    out = bytearray()
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


# --- footer indexes: what a probe needs of a data file, kept beside the store's tables ---------

INDEX_FOLDER = "_footers"
INDEX_SUFFIX = ".footer.npz"
INDEX_VERSION = 1
BLOOM_SUFFIX = ".bloom.npy"  # a data file's Bloom filter (`store/membership.py`), beside its index

def index_path(root: str, data_path: str) -> str:
    """Where the index of a data file of `root`'s tables lies: `_footers/<table>/<file>`."""
    table, name = data_path.rstrip("/").split("/")[-2:]
    return f"{root.rstrip('/')}/{INDEX_FOLDER}/{table}/{name}{INDEX_SUFFIX}"


def bloom_path(root: str, data_path: str) -> str:
    """Where the Bloom filter of a data file lies: `_footers/<table>/<file>.<hash>.bloom.npy`,
    named by the hash that built it (a process of another Polars version finds none)."""
    return index_path(root, data_path).removesuffix(INDEX_SUFFIX) + f".{membership.HASH_VERSION}{BLOOM_SUFFIX}"


def save_bloom(path: str, packed: np.ndarray) -> None:
    """Write a Bloom filter, whole or not at all."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    temporary = f"{path}.{os.getpid()}.{threading.get_ident()}.tmp"
    with open(temporary, "wb") as f:
        np.save(f, packed)
    os.replace(temporary, path)


def load_bloom(path: str) -> np.ndarray | None:
    """A Bloom filter, memory-mapped (None: none, or one that cannot be read)."""
    try:
        return np.load(path, mmap_mode="r", allow_pickle=False)
    except (OSError, ValueError):
        return None


def save_index(path: str, footer: Footer, column: str, extra: dict[str, np.ndarray]) -> None:
    """Write a footer's entries with what a reader derived from it for `column` (`extra`: the
    fences), whole or not at all."""
    assert footer.entries is not None
    arrays = {
        **{f"x_{name}": values for name, values in extra.items()},
        "version": np.array([INDEX_VERSION, footer.num_rows, os.path.getsize(footer.path)], dtype=np.int64),
        "entries": footer.entries, "rows": footer.group_rows,
        "head": np.frombuffer(footer.head, dtype=np.uint8), "tail": np.frombuffer(footer.tail, dtype=np.uint8),
        "column": np.frombuffer(column.encode(), dtype=np.uint8),
    }
    os.makedirs(os.path.dirname(path), exist_ok=True)
    temporary = f"{path}.{os.getpid()}.{threading.get_ident()}.tmp"
    with open(temporary, "wb") as f:
        np.savez(f, **arrays)  # type: ignore[arg-type]
    os.replace(temporary, path)


def load_index(path: str, data_path: str, column: str) -> tuple[Footer, dict[str, np.ndarray]] | None:
    """A data file's footer and what was derived from it for `column`, from its index; None
    when it has none (or one for another column, another version of this format, or another
    file of that name)."""
    try:
        with np.load(path, allow_pickle=False) as found:
            version, num_rows, size = found["version"].tolist()
            if (version != INDEX_VERSION or found["column"].tobytes().decode() != column
                    or os.path.getsize(data_path) != size):
                return None
            footer = Footer(data_path, num_rows, found["rows"], found["entries"],
                            found["head"].tobytes(), found["tail"].tobytes())
            return footer, {name[2:]: found[name] for name in found.files if name.startswith("x_")}
    except (OSError, KeyError, ValueError):  # none yet, or one a crash cut short: parse the footer
        return None


def data_file_of(name: str) -> str:
    """The data file (its name in its table's folder) that a file of `_footers/<table>/` serves."""
    return name.removesuffix(INDEX_SUFFIX) if name.endswith(INDEX_SUFFIX) else name.split(".parquet.")[0] + ".parquet"


def prune_indexes(root: str) -> int:
    """Delete the indexes, Bloom filters and row-addressable copies (`store/records.py`) of data
    files that are gone (a vacuum removed them), those of another hash, and what a writer
    killed midway left; returns how many. Indexes hold the sort column's bounds, which are
    keys, and copies hold rows: an erased user's too."""
    removed = 0
    folder = os.path.join(root, INDEX_FOLDER)
    for table in os.listdir(folder) if os.path.isdir(folder) else []:
        for name in os.listdir(os.path.join(folder, table)):
            data = data_file_of(name)
            data_path = os.path.join(root, table, data)
            kept = (name.endswith(INDEX_SUFFIX) or name == os.path.basename(bloom_path(root, data_path))
                    or name in {os.path.basename(p) for p in records.paths(index_path(root, data_path))})
            if not kept or not os.path.exists(os.path.join(root, table, data)):
                os.remove(os.path.join(folder, table, name))
                removed += 1
    return removed
