"""Row-addressable copies of the identity table's files: a record-level index.

A probe of the external IDs table by a few thousand IDs spread over a big store names about
half of its row groups (7,700 IDs in 10M rows of 1,024-row groups: 56%), so it decoded the
files whole: 570 ms of a 10,000-object batch's 1,050 ms at 10M users. Hudi keeps a
record-level index for such lookups. Here each indexed file of a table in `TABLES` keeps,
beside its footer index (`store/footers.py`):

- `<file>.<hash>.records.arrow`: the file's rows as uncompressed Arrow IPC, in the file's
  order, memory-mapped by readers: a row is taken without decoding anything around it;
- `<file>.<hash>.records.npy`: the 64-bit hashes of its sort column (`membership.hashes`,
  the Bloom filters' hash), ascending, over the rows' positions, shape (2, rows).

A probe hashes its values, finds their positions by binary search, takes those rows and keeps
those whose key is one of the values (a collision only takes a row more). The copies are
caches: built from a data file, never the source of its rows, named by the hash that built
them, and pruned with the footer indexes when their file goes (`footers.prune_indexes`).
They hold the rows' identifiers, so erasure treats them as the data files they copy.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import BinaryIO

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from engagelake.store import membership

TABLES = frozenset({"external_ids"})
SUFFIX = ".records.arrow"
KEYS_SUFFIX = ".records.npy"
FENCE_SUFFIX = ".records.fence.npy"
BATCH_ROWS = 1 << 16  # rows a record batch of the copy holds (a take maps a position to its batch)
# Every FENCE_EVERY-th sorted hash is kept in memory (312 KB at 10M rows): a probe of at most
# PREAD_KEYS keys reads each key's window of the keys file (about 4 KB) with `pread` instead of
# searching the mapped file, whose every touched page brings its neighbours into the process
# (one take of 50 keys at 10M mapped 80 MiB of the keys file)
FENCE_EVERY = 256
PREAD_KEYS = 1024


@dataclass(frozen=True)
class Records:
    """One file's row-addressable copy, memory-mapped."""

    schema: pa.Schema
    batches: list[pa.RecordBatch]
    starts: np.ndarray  # the first row of each batch
    keys: np.ndarray  # (2, rows): hashes ascending, then the position of each
    fence: np.ndarray | None = None  # every FENCE_EVERY-th hash (None: a copy written before fences)
    # the keys file, open: a run merge removes the copies of the files it replaced while a
    # reader may still hold them (as the maps do, the open file keeps what was removed readable)
    keys_file: BinaryIO | None = None

    def take(self, hashed: np.ndarray) -> pa.Table:
        """The rows whose key hashes to one of `hashed` (64-bit, as `membership.hashes`
        makes them): a superset of the rows whose key is one of the values hashed."""
        rows = self._read_positions(hashed) if self._preads(hashed) else self._mapped_positions(hashed)
        if rows.size == 0:
            return self.schema.empty_table()
        rows = np.sort(rows)
        batch = np.searchsorted(self.starts, rows, side="right") - 1
        bounds = [0, *(np.flatnonzero(np.diff(batch)) + 1).tolist(), len(rows)]  # a run of rows per batch
        parts = []
        for start, end in zip(bounds[:-1], bounds[1:], strict=False):
            k = int(batch[start])
            parts.append(self.batches[k].take(pa.array(rows[start:end] - self.starts[k])))
        return pa.Table.from_batches(parts, schema=self.schema)

    def _preads(self, hashed: np.ndarray) -> bool:
        keys = self.keys
        return (self.fence is not None and self.keys_file is not None and hashed.size <= PREAD_KEYS
                and isinstance(keys, np.memmap) and keys.flags["C_CONTIGUOUS"])

    def _mapped_positions(self, hashed: np.ndarray) -> np.ndarray:
        """The copy's positions of the keys hashing to `hashed`, by a search of the mapped keys."""
        hashes = self.keys[0]
        first = np.searchsorted(hashes, hashed, side="left")
        counts = np.searchsorted(hashes, hashed, side="right") - first
        at = np.repeat(first - np.cumsum(counts) + counts, counts) + np.arange(int(counts.sum()))
        return np.asarray(self.keys[1][at])

    def _read_positions(self, hashed: np.ndarray) -> np.ndarray:
        """As `_mapped_positions`, each hash's window between two fences read with `pread`:
        a window holds every position of its hash (the fences before and after it are smaller
        and greater), so two reads a key find them. A loop over a small probe's keys (at most
        `PREAD_KEYS`), a few system calls each."""
        assert self.fence is not None and self.keys_file is not None and isinstance(self.keys, np.memmap)
        n, base, fd = self.keys.shape[1], self.keys.offset, self.keys_file.fileno()
        hashed = np.unique(hashed)
        low = np.maximum(np.searchsorted(self.fence, hashed, side="left") - 1, 0) * FENCE_EVERY
        high = np.minimum(np.searchsorted(self.fence, hashed, side="right") * FENCE_EVERY, n)
        found = []
        for h, a, b in zip(hashed.tolist(), low.tolist(), high.tolist(), strict=True):
            window = np.frombuffer(os.pread(fd, 8 * (b - a), base + 8 * a), dtype=np.uint64)
            hits = np.flatnonzero(window == np.uint64(h))
            if hits.size:  # equal hashes lie side by side: their positions too
                first, last = a + int(hits[0]), a + int(hits[-1]) + 1
                found.append(np.frombuffer(os.pread(fd, 8 * (last - first), base + 8 * (n + first)), dtype=np.uint64))
        return np.concatenate(found) if found else np.array([], dtype=np.uint64)


def paths(index_file: str) -> tuple[str, str, str]:
    """The copy, key and fence files of a data file whose footer index lies at `index_file`."""
    stem = f"{index_file.rsplit('.footer.npz', 1)[0]}.{membership.HASH_VERSION}"
    return stem + SUFFIX, stem + KEYS_SUFFIX, stem + FENCE_SUFFIX


def write(data_path: str, column: str, index_file: str) -> None:
    """Write the copy of a data file, its keys and their fence, a batch at a time (memory: a
    batch, and 16 bytes a row for the keys), each whole or not at all: the keys last, so that
    keys found mean a whole copy and fence."""
    copy_path, keys_path, fence_path = paths(index_file)
    os.makedirs(os.path.dirname(copy_path), exist_ok=True)
    suffix = f".{os.getpid()}.{threading.get_ident()}.tmp"
    file = pq.ParquetFile(data_path)
    hashes = []
    with pa.OSFile(copy_path + suffix, "wb") as sink, pa.ipc.new_file(sink, file.schema_arrow) as writer:
        for rows in row_group_slices(file):
            batch = rows.combine_chunks().to_batches()[0] if rows.num_rows else None
            if batch is not None:
                writer.write_batch(batch)
                hashes.append(membership.hashes(pl.Series(batch.column(column))))
    os.replace(copy_path + suffix, copy_path)
    hashed = np.concatenate(hashes) if hashes else np.array([], dtype=np.uint64)
    order = np.argsort(hashed, kind="stable")
    with open(fence_path + suffix, "wb") as f:
        np.save(f, hashed[order][::FENCE_EVERY])
    os.replace(fence_path + suffix, fence_path)
    with open(keys_path + suffix, "wb") as f:
        np.save(f, np.stack([hashed[order], order.astype(np.uint64)]))
    os.replace(keys_path + suffix, keys_path)


def row_group_slices(file: pq.ParquetFile, columns: list[str] | None = None) -> Iterator[pa.Table]:
    """A whole file's rows, `BATCH_ROWS` or so at a time, read by row groups: `iter_batches`
    and a whole `read` took 5.6 and 7.1 s for the key column of a 30,000-group file, its row
    groups 64 at a time 0.9 s."""
    groups = file.metadata.num_row_groups
    step = max(1, BATCH_ROWS // max(1, file.metadata.row_group(0).num_rows)) if groups else 1
    for first in range(0, groups, step):
        yield file.read_row_groups(list(range(first, min(first + step, groups))), columns=columns, use_threads=False)


def remove(index_file: str) -> None:
    """Delete a data file's copy once no current version holds the file (a reader that mapped
    it keeps its mapping; the others read the file's row groups): copies are the biggest
    caches, and a merged-away file's would stay until compaction prunes it. The keys go
    first, so that a copy is never found without them."""
    copy_path, keys_path, fence_path = paths(index_file)
    for path in (keys_path, fence_path, copy_path):
        with contextlib.suppress(FileNotFoundError):
            os.remove(path)


def load(index_file: str) -> Records | None:
    """A data file's copy, memory-mapped (None: none, or one that cannot be read)."""
    copy_path, keys_path, fence_path = paths(index_file)
    try:
        fence: np.ndarray | None = np.load(fence_path, allow_pickle=False)
    except (OSError, ValueError):
        fence = None  # none (a copy written before fences) or unreadable: searched through the map
    try:
        keys = np.load(keys_path, mmap_mode="r", allow_pickle=False)
        keys_file = open(keys_path, "rb") if fence is not None else None  # noqa: SIM115 - kept open with the copy
        reader = pa.ipc.open_file(pa.memory_map(copy_path))
        batches = [reader.get_batch(i) for i in range(reader.num_record_batches)]
    except (OSError, ValueError, pa.ArrowException):
        return None
    sizes = np.array([b.num_rows for b in batches], dtype=np.int64)
    if keys.ndim != 2 or keys.shape[1] != int(sizes.sum()):
        return None
    if fence is not None and (fence.ndim != 1 or fence.size != -(-keys.shape[1] // FENCE_EVERY)):
        fence = None
    return Records(reader.schema, batches, np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.uint64), keys,
                   fence, keys_file)


def matching(table: pa.Table, column: str, exact: pa.Array) -> pa.Table:
    """The rows a take found whose key is one of the values (not a hash collision's)."""
    return table.filter(pc.is_in(table.column(column), exact)) if table.num_rows else table
