"""Parquet footers kept as bytes and parsed a few row groups at a time.

pyarrow parses a whole footer into about 920 bytes per column chunk (8x its size on disk), and
a point read of a big file needs only the few row groups it reads: a 10M-user store's
footers took 650 MiB parsed in a cold export of 50 users, 82 MiB as bytes. A `Footer` keeps
the bytes and where each row group's entry lies in them. A read of some row groups parses a
footer spliced from the file's header fields, those row groups' entries and its trailing
fields: it points at the same file offsets, so pyarrow reads the same bytes (1.7 ms for 50
row groups of a profiles file against 47 ms for its whole footer).

Thrift's compact protocol writes a FileMetaData's `num_rows` (field 3) and then its
`row_groups` list (field 4); each RowGroup ends with `total_byte_size` (2), `num_rows` (3) and
a few integer fields, then a stop byte. Those values are known from the parsed footer, so each
entry's end is found by searching the bytes for them, and the entries are checked to tile the
list exactly. A footer whose entries cannot be told apart (another writer's layout) is kept
parsed, as before.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

MAGIC = b"PAR1"
# compact-protocol field headers: (field id delta << 4) | type
_I64_NEXT = 0x16  # the next field, an i64
_LIST_NEXT = 0x19  # the next field, a list
_STRUCT_ELEMENTS = 0xC


@dataclass(frozen=True)
class Footer:
    """One data file's footer: its bytes and row-group entries, or the parsed footer when its
    entries could not be found."""

    path: str
    num_rows: int
    group_rows: np.ndarray  # rows of each row group
    raw: bytes | None = None
    entries: np.ndarray | None = None  # (start, end) of each row group's entry in `raw`
    head_end: int = 0  # `raw[:head_end]` is every field before the row-group list's header
    tail_start: int = 0  # `raw[tail_start:]` is every field after the list
    parsed: pq.FileMetaData | None = None

    @property
    def num_row_groups(self) -> int:
        return len(self.group_rows)

    @property
    def nbytes(self) -> int:
        """What keeping it costs in memory."""
        if self.parsed is not None:
            return self.parsed.serialized_size * 8  # pyarrow's thrift structures
        assert self.raw is not None and self.entries is not None
        return len(self.raw) + self.entries.nbytes + self.group_rows.nbytes

    def open(self, groups: list[int] | None = None) -> tuple[pq.ParquetFile, list[int]]:
        """The file, with a footer that holds at least `groups` (all: None), and the numbers
        of those row groups in it."""
        if groups is None:
            groups = list(range(self.num_row_groups))
        if self.parsed is not None:
            return _file(self.path, self.parsed), groups
        return _file(self.path, self.metadata(groups)), list(range(len(groups)))

    def metadata(self, groups: list[int]) -> pq.FileMetaData:
        """A footer of the file's `groups` only (in that order)."""
        assert self.raw is not None and self.entries is not None
        spans = self.entries[groups]
        body = b"".join((self.raw[:self.head_end], _list_header(len(groups)),
                         *(self.raw[start:end] for start, end in spans.tolist()), self.raw[self.tail_start:]))
        return _parse(body)


def read_footer(path: str) -> tuple[Footer, pq.FileMetaData]:
    """The footer of a data file, and its whole parsed form (for what a reader derives once,
    such as fences; not kept)."""
    with open(path, "rb") as f:
        f.seek(-8, 2)
        length, magic = struct.unpack("<I4s", f.read(8))
        if magic != MAGIC:
            raise ValueError(f"{path} is not a Parquet file (no {MAGIC!r} at its end)")
        f.seek(-8 - length, 2)
        raw = f.read(length)
    metadata = _parse(raw)
    rows = np.array([metadata.row_group(g).num_rows for g in range(metadata.num_row_groups)], dtype=np.int64)
    footer = _entries(path, raw, metadata, rows)
    if footer is None:
        footer = Footer(path, metadata.num_rows, rows, parsed=metadata)
    return footer, metadata


def _entries(path: str, raw: bytes, metadata: pq.FileMetaData, rows: np.ndarray) -> Footer | None:
    """The footer with the span of each row-group entry in `raw`, or None when they cannot be
    told apart."""
    n = metadata.num_row_groups
    if n == 0:
        return None
    header = bytes([_I64_NEXT]) + _varint(_zigzag(metadata.num_rows)) + bytes([_LIST_NEXT]) + _list_header(n)
    at = raw.find(header)
    if at < 0 or raw.find(header, at + 1) >= 0:
        return None
    head_end = at + len(header) - len(_list_header(n))
    first_field = bytes([_LIST_NEXT]) + _list_header(metadata.num_columns)  # each entry's column list
    entries = np.empty((n, 2), dtype=np.int64)
    pos = at + len(header)
    for g in range(n):
        group = metadata.row_group(g)
        if raw[pos:pos + len(first_field)] != first_field:
            return None
        known = (bytes([_I64_NEXT]) + _varint(_zigzag(group.total_byte_size))
                 + bytes([_I64_NEXT]) + _varint(_zigzag(group.num_rows)))
        found = raw.find(known, pos)
        if found < 0:
            return None
        end = _skip_integers(raw, found + len(known))
        if end is None:
            return None
        entries[g] = (pos, end)
        pos = end
    footer = Footer(path, metadata.num_rows, rows, raw, entries, head_end, pos)
    check = footer.metadata([n - 1])  # the splice parses, and names the last row group
    if check.num_row_groups != 1 or check.row_group(0).num_rows != metadata.row_group(n - 1).num_rows:
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


def _parse(body: bytes) -> pq.FileMetaData:
    return pq.read_metadata(pa.BufferReader(MAGIC + body + struct.pack("<I", len(body)) + MAGIC))


def _file(path: str, metadata: pq.FileMetaData) -> pq.ParquetFile:
    """Without pre-buffering: coalescing a local file's column chunks through the I/O pool cost
    20-30% of a point read (object storage would want it back)."""
    return pq.ParquetFile(path, metadata=metadata, pre_buffer=False)


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
