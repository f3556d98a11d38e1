"""Sorted runs: how a probe reads only the row groups that can hold its keys.

Every data file the store writes for a keyed table or a history log is sorted by the table's
probe column (`SORT_BY`) and cut into row groups of `ROW_GROUP_ROWS` rows. The minimum and
maximum of that column in each row group, kept in the Parquet footer, are fence pointers: a
probe binary-searches its sorted values against them and reads only the row groups whose range
can hold a value. A writer may put the sorted row groups of a file in another order (delta-rs
writes streamed input in parallel, and may cut a row group across two distant stretches of
keys), so fences are sorted first, and the few row groups whose ranges overlap others are
tested one by one. Footers are cached per file (files never change), so
a warm probe opens no footer at all. This is the lookup of an LSM tree's sorted runs (Apache
Paimon, RocksDB); `store/merging.py` keeps their number small.
"""

from __future__ import annotations

import bisect
import dataclasses
import functools
import os
import re
import threading
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from engagelake.cpus import pinned
from engagelake.store import membership, objects, records
from engagelake.store.footers import (
    Footer,
    bloom_path,
    index_path,
    load_bloom,
    load_index,
    read_footer,
    save_bloom,
    save_index,
)
from engagelake.tables.schema import INDEXES

# Row groups small enough that a point lookup decodes little, large enough that footers stay
# small (a footer holds one entry per row group and column). 256 rows made a warm export of 50
# users at 1M 22-25% faster (34-39 ms against 45-48 ms), but a 10M build's peak RSS passed its
# 4 GiB budget: whole footers are still parsed where no index exists (docs/decisions.md).
ROW_GROUP_ROWS = 1024
# Parquet writers may truncate long min/max statistics; a fence that long is not trusted.
TRUSTED_STAT_BYTES = 512
# When more than 1/WHOLE_FILE_SHARE of a file's row groups match, scan the file instead.
WHOLE_FILE_SHARE = 3
# A probe with this many values per row group of a file reads the file whole without searching
# its fences, unless its values lie within a few of the file's row groups (a range of users):
# spread values then hit nearly every row group.
WHOLE_FILE_KEYS_PER_GROUP = 4
# Row groups whose range overlaps others are tested one by one; beyond this many (or 1% of
# the file's row groups) the file is read whole.
MAX_WIDE_GROUPS = 16
# A probe of at most this many values first drops the files whose Delta statistics (the
# minimum and maximum of the sort column, kept in the log) exclude every value, so it opens
# no footer of them; a bigger probe touches most files anyway.
FILE_STATS_MAX_VALUES = 64
# A probe sieves a file's candidate row groups by their sort column first when they are
# more than this many times the values it expects to find there (its share of the rows):
# a small run spans the key space, so each value names a row group that mostly lacks it.
SIEVE_GROUPS_PER_HIT = 2
# A sieved file keeps a key index of its sort column (`KeyIndex`: 8 bytes a row), so that
# sieving it again reads no column: a file this small builds it at its first sieve, a bigger
# one up to SIEVE_INDEX_ROWS at its second (a one-off probe, a fresh process's export, reads
# only its candidate groups' column). The merge policy keeps few small runs per table.
SIEVE_CACHE_ROWS = 65_536
SIEVE_INDEX_ROWS = 2_097_152
# What the footers kept may take, unless the store's memory budget says otherwise (half of it).
FOOTER_CACHE_BYTES = 1 << 30
# Footers parsed at once by a cold probe. Each parsing thread's allocator arena keeps the peak of
# the footers it parsed: a cold export of 50 users at 10M peaked at 409-425 MiB with 2 threads,
# 473-499 with 3 and 527-547 with 4, in the same time (on 2 cores).
FOOTER_THREADS = 2
# Files a probe reads row groups of at once: no more than the cores, since a read of files in
# the page cache is CPU work (pyarrow decoding), and each read is one thread's (no pyarrow
# threads of its own): more threads only hand work back and forth. A warm export of 50 users
# at 10M took 67.5-69.0 ms with 2 read and 2 prefetch threads on 2 cores, against 72.3-73.1
# with 4 and 6 and pyarrow's threads.
READ_THREADS = min(4, os.cpu_count() or 1)
# A thread pinned to one CPU (a small batch: `cpus.py`) reads the files itself unless they hold
# this many row groups to read in all: handing a few reads to the pool cost more than it saved
# (an export of 10 users at 10M: 30.4 against 33.5 ms p50; of 50 users, 51 groups a table,
# the pool still pays: 57-60 against 63.7 ms).
POOLED_READ_GROUPS = 32
SPLIT_READ_GROUPS = 128  # groups a read holds, at least, before a file's groups are read in parts
# A file with a row-addressable copy (`store/records.py`) is probed there when it has at least
# this many rows per value probed; a bigger probe reads the file as before. At 10M users the
# copies took 7,700 IDs in 37 against 529 ms, 165,000 in 439 against 866 ms (one value per 60
# rows), but 500,000 in 1,453 against 1,276 ms (one per 20).
RECORDS_SHARE = 32
# delta-rs truncates statistics at 64 bytes (a prefix for the minimum, a raised prefix for the
# maximum: still bounds), and may drop them; only shorter ones are used.
TRUSTED_FILE_STAT_BYTES = 64

# The probe column each table's files are sorted by (then by the rest of the key). Tables not
# named here are small (resources) or read whole in order (lineage) and are not sorted.
SORT_BY: dict[str, str] = {
    "profiles": "service_id",
    "external_ids": "external_id",
    "aliases": "alias_name",
    "attributes": "service_id",
    "subscriptions": "service_id",
    "push_tokens": "token",
    "events": "service_id",
    "purchases": "service_id",
    "redirects": "service_id",
    **{index: column for index, (_, column) in INDEXES.items()},
}


@dataclass(frozen=True)
class Fences:
    """The row-group ranges of one file's sort column (starts None: the file is read whole).

    Row groups are split into a chain of ranges that do not overlap, sorted, searched by
    bisection, and a few wide ones (a writer that reorders its input may cut a row group
    across two distant stretches of keys) that are tested one by one."""

    footer: Footer
    starts: np.ndarray | None  # the chain's minimums, ascending
    ends: np.ndarray | None = None  # its maximums (ascending too)
    order: np.ndarray | None = None  # the row group at each chain position
    wide: tuple[tuple[bytes, bytes, int], ...] = ()  # (min, max, row group) of the others
    # the file's keys' Bloom filter (`store/membership.py`), if indexed: memory-mapped, so it
    # costs the pages a probe touches, not a budget
    bloom: np.ndarray | None = None
    # its row-addressable copy (`store/records.py`), if its table keeps them: memory-mapped too
    records: records.Records | None = None

    def spanned(self, low: bytes, high: bytes | None) -> list[int]:
        """The row groups whose range meets [low, high) (no end when `high` is None)."""
        assert self.starts is not None and self.ends is not None and self.order is not None
        first = int(np.searchsorted(self.ends, low, side="left"))
        last = len(self.starts) if high is None else int(np.searchsorted(self.starts, high, side="left"))
        found = self.order[first:last].tolist() if last > first else []
        found += [group for start, end, group in self.wide if end >= low and (high is None or start < high)]
        return sorted(found)

    def groups(self, values: np.ndarray) -> list[int]:
        """The row groups that can hold any of the sorted `values`."""
        assert self.starts is not None and self.order is not None
        found = self.order[matching_groups(self.starts, values, self.ends)].tolist()
        for low, high, group in self.wide:
            if np.any((values >= low) & (values <= high)):
                found.append(group)
        return sorted(found)

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in (self.starts, self.ends, self.order) if a is not None)


@dataclass(frozen=True)
class KeyIndex:
    """The row group of every row of a file, by a 32-bit hash of its sort column, sorted by
    hash. A hash names the groups that may hold a value: a collision only adds a group to
    read, whose rows are then filtered exactly."""

    hashes: np.ndarray  # uint32, ascending
    groups: np.ndarray  # int32, the row group of each hash

    @staticmethod
    def of(keys: pa.ChunkedArray, footer: Footer) -> KeyIndex:
        hashes = _hashes(keys)
        groups = np.repeat(np.arange(footer.num_row_groups, dtype=np.int32), footer.group_rows)
        order = np.argsort(hashes, kind="stable")
        return KeyIndex(hashes[order], groups[order])

    @property
    def nbytes(self) -> int:
        return int(self.hashes.nbytes + self.groups.nbytes)

    def groups_of(self, values: pa.Array) -> list[int]:
        """The row groups that may hold one of `values`."""
        return self.groups_of_hashed(membership.hashes(pl.Series(values)))

    def groups_of_hashed(self, hashed: np.ndarray) -> list[int]:
        """The row groups that may hold one of the values of 64-bit `hashed` (as
        `membership.hashes` makes them: a probe hashes its values once for filters and indexes)."""
        wanted = _upper(hashed)
        first = np.searchsorted(self.hashes, wanted, side="left")
        counts = np.searchsorted(self.hashes, wanted, side="right") - first
        if not counts.any():
            return []
        # every position first[i] .. first[i] + counts[i] - 1, without a loop over values
        starts = np.repeat(first - np.cumsum(counts) + counts, counts)
        at = starts + np.arange(int(counts.sum()))
        return np.unique(self.groups[at]).tolist()


def _hashes(keys: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """32-bit hashes of string keys: the upper half of the Bloom filters' hash."""
    return _upper(membership.hashes(pl.Series(keys)))


def _upper(hashed: np.ndarray) -> np.ndarray:
    return (hashed >> np.uint64(32)).astype(np.uint32)


class FooterCache:
    """Footers (as bytes, `store/footers.py`) and fences of data files, read once per file and
    kept within a budget: a long-running reader of a big store would otherwise hold them all
    (82 MiB of footers at 10M users, several hundred at 100M). The least recently used go
    first (a probe that needs them again reads them again)."""

    def __init__(self, budget: int = FOOTER_CACHE_BYTES, root: str | None = None):
        self.root = root  # a local store's folder: its footer indexes (`store/footers.py`) are read
        self._fences: OrderedDict[tuple[str, str], Fences] = OrderedDict()
        self._costs: dict[tuple[str, str], int] = {}
        self._indexes: dict[tuple[str, str], KeyIndex] = {}  # sieved files' key indexes
        self._lock = threading.Lock()  # probes of several tables may run side by side
        self._sieved: set[tuple[str, str]] = set()  # files sieved once without an index
        self.budget = budget
        self.held = 0  # estimated bytes of the footers and key indexes kept
        self.footers_read = 0  # for tests and benchmarks
        self.footers_parsed = 0  # footers parsed (not read from an index), likewise
        self.groups_read = 0  # row groups read whole (every column), likewise
        self.indexes_built = 0  # key indexes built (`key_index`), likewise
        self.rows_taken = 0  # rows taken from row-addressable copies (`store/records.py`), likewise

    def fences(self, path: str, column: str) -> Fences:
        return self.fences_of([path], column)[0]

    def fences_of(self, paths: list[str], column: str) -> list[Fences]:
        """The fences of every one of `paths`; footers not yet read are parsed side by side
        (pyarrow parses them without the GIL: a cold probe of a big store spends most of its
        time there)."""
        found: dict[str, Fences] = {}
        with self._lock:
            for path in paths:
                kept = self._fences.get((path, column))
                if kept is not None:
                    self._fences.move_to_end((path, column))
                    found[path] = kept
        missing = list(dict.fromkeys(path for path in paths if path not in found))
        def parse(path: str) -> Fences:  # the whole parsed footer is dropped once fences are drawn
            index = None if self.root is None else index_path(self.root, path)
            if index is not None and (found := load_index(index, path, column)) is not None:
                assert self.root is not None
                return dataclasses.replace(_fences_of_arrays(*found), bloom=load_bloom(bloom_path(self.root, path)),
                                           records=records.load(index) if _table(path) in records.TABLES else None)
            footer, metadata = read_footer(path)
            with self._lock:
                self.footers_parsed += 1
            return _fences(footer, metadata, column)
        parsed = _footer_pool().map(parse, missing) if len(missing) > 1 else map(parse, missing)
        for path, fences in zip(missing, parsed, strict=True):
            found[path] = self._keep(path, column, fences)
        return [found[path] for path in paths]

    def index(self, paths: list[str], column: str) -> int:
        """Write the footer index of each of `paths` that has none (a writer, after writing
        them): a later reader's probe reads that small file instead of parsing the footer.
        Returns how many it wrote."""
        assert self.root is not None
        root = self.root
        # a file indexed before its table kept row-addressable copies (or their fences) gets one now
        missing = [path for path in paths if not os.path.exists(index_path(root, path)) or (
            _table(path) in records.TABLES and not all(map(os.path.exists, records.paths(index_path(root, path))[1:])))]

        def write(path: str) -> bool:
            footer, metadata = read_footer(path)
            if footer.parsed is not None:  # its entries could not be told apart
                return False
            # the key column read a slice of row groups at a time, with the footer parsed already
            slices = records.row_group_slices(pq.ParquetFile(path, metadata=metadata), [column])
            save_bloom(bloom_path(root, path), membership.build(pl.Series(rows.column(0)) for rows in slices))
            if _table(path) in records.TABLES:
                records.write(path, column, index_path(root, path))
            # last: a file whose index exists has its filter and copy (a writer killed before
            # leaves no index, and the next one writes them all again)
            save_index(index_path(root, path), footer, column, _fence_arrays(_fences(footer, metadata, column)))
            return True
        return sum(_footer_pool().map(write, missing))

    def _keep(self, path: str, column: str, fences: Fences) -> Fences:
        with self._lock:
            if (kept := self._fences.get((path, column))) is not None:  # another probe parsed it too
                return kept
            self.footers_read += 1
            self._fences[(path, column)] = fences
            self._charge((path, column), fences.footer.nbytes + fences.nbytes)
            return fences

    def count_groups(self, groups: int) -> None:
        with self._lock:
            self.groups_read += groups

    def count_taken(self, rows: int) -> None:
        with self._lock:
            self.rows_taken += rows

    def _charge(self, key: tuple[str, str], cost: int) -> None:
        self._costs[key] = self._costs.get(key, 0) + cost
        self.held += cost
        while self.held > self.budget and len(self._fences) > 1:
            oldest, _ = self._fences.popitem(last=False)
            self.held -= self._costs.pop(oldest, 0)
            self._indexes.pop(oldest, None)
            self._sieved.discard(oldest)

    def key_index(self, path: str, column: str, footer: Footer) -> KeyIndex | None:
        """The key index of a file being sieved: kept, or built now when the file is small or
        was sieved before (None: sieve by reading the candidate groups' column)."""
        key = (path, column)
        with self._lock:
            if (kept := self._indexes.get(key)) is not None:
                return kept
            if footer.num_rows > SIEVE_CACHE_ROWS and (footer.num_rows > SIEVE_INDEX_ROWS or key not in self._sieved):
                self._sieved.add(key)
                return None
        index = KeyIndex.of(footer.read(list(range(footer.num_row_groups)), [column], column).column(column), footer)
        with self._lock:
            self.indexes_built += 1
            if key in self._fences and key not in self._indexes:  # charged with its file's footer, dropped with it
                self._indexes[key] = index
                self._charge(key, index.nbytes)
        return index


def _table(path: str) -> str:
    """The table a data file belongs to (the folder it lies in)."""
    return os.path.basename(os.path.dirname(path))


def footer_budget(memory_limit: str | None) -> int:
    """The footer cache's share of a memory budget written as DuckDB takes it ("2GB", "512MiB"):
    half of it, or FOOTER_CACHE_BYTES when there is none (or it cannot be read)."""
    found = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMGT]?)(i?)B?\s*", memory_limit or "", re.IGNORECASE)
    if found is None:
        return FOOTER_CACHE_BYTES
    number, unit, binary = found.groups()
    scale = (1024 if binary else 1000) ** " KMGT".index(unit.upper() or " ")
    return int(float(number) * scale) // 2


@functools.cache
def _footer_pool() -> ThreadPoolExecutor:
    return ThreadPoolExecutor(max_workers=FOOTER_THREADS, thread_name_prefix="engagelake-footers")


def _fences(footer: Footer, metadata: pq.FileMetaData, column: str) -> Fences:
    """The fences of a string sort column, from its raw statistics: bytes, which compare in
    UTF-8 byte order (the order of Parquet statistics and of the sorted files)."""
    if metadata.num_row_groups == 0:
        return Fences(footer, None)
    # not `metadata.schema`: it refers back to the footer, and that cycle would keep the whole
    # parsed footer alive until the garbage collector runs
    first_group = metadata.row_group(0)
    index = next((i for i in range(metadata.num_columns) if first_group.column(i).path_in_schema == column), None)
    if index is None or first_group.column(index).physical_type != "BYTE_ARRAY":
        return Fences(footer, None)
    starts, ends = [], []
    for g in range(metadata.num_row_groups):  # once per file: its footer is cached
        stats = metadata.row_group(g).column(index).statistics
        if stats is None or not stats.has_min_max:
            return Fences(footer, None)
        starts.append(stats.min_raw)
        ends.append(stats.max_raw)
    if (max(len(v) for v in (*starts, *ends)) >= TRUSTED_STAT_BYTES
            or any(b"\x00" in v for v in (*starts, *ends))):  # numpy's fixed-width bytes drop NULs
        return Fences(footer, None)
    first, last = np.array(starts, dtype=bytes), np.array(ends, dtype=bytes)
    # the most ranges that do not overlap, taken by earliest end (interval scheduling); ranges
    # may touch (a value split over two row groups)
    chain, wide, reach = [], [], None
    for g in np.lexsort((first, last)).tolist():
        if reach is None or first[g] >= reach:
            chain.append(g)
            reach = last[g]
        else:
            wide.append((bytes(first[g]), bytes(last[g]), g))
    if len(wide) > max(MAX_WIDE_GROUPS, len(chain) // 100):
        return Fences(footer, None)
    order = np.array(chain, dtype=np.int64)
    return Fences(footer, first[order], last[order], order, tuple(wide))


def _fence_arrays(fences: Fences) -> dict[str, np.ndarray]:
    """Fences as arrays, for a footer index (none: the file has no fences)."""
    if fences.starts is None:
        return {}
    assert fences.ends is not None and fences.order is not None
    return {"starts": fences.starts, "ends": fences.ends, "order": fences.order,
            "wide_min": np.array([w[0] for w in fences.wide], dtype=bytes),
            "wide_max": np.array([w[1] for w in fences.wide], dtype=bytes),
            "wide_group": np.array([w[2] for w in fences.wide], dtype=np.int64)}


def _fences_of_arrays(footer: Footer, arrays: dict[str, np.ndarray]) -> Fences:
    if "starts" not in arrays:
        return Fences(footer, None)
    wide = tuple(zip(arrays["wide_min"].tolist(), arrays["wide_max"].tolist(), arrays["wide_group"].tolist(), strict=True))
    return Fences(footer, arrays["starts"], arrays["ends"], arrays["order"], wide)


def fence_values(values: pl.Series) -> np.ndarray:
    """Sorted string `values` as fixed-width bytes, comparable with fences."""
    return values.sort().cast(pl.Binary).to_numpy().astype(bytes)


def matching_groups(starts: np.ndarray, values: np.ndarray, ends: np.ndarray | None = None) -> list[int]:
    """Positions of the fences whose range can hold any of the sorted `values`: from the first
    range ending at or after a value to the last one starting at or before it (without `ends`,
    a range ends where the next one starts)."""
    last = np.searchsorted(starts, values, side="right") - 1
    if ends is None:
        first = np.maximum(np.searchsorted(starts, values, side="left") - 1, 0)
    else:
        first = np.searchsorted(ends, values, side="left")
    keep = (last >= 0) & (first <= last)
    first, last = first[keep], last[keep]
    if first.size == 0:
        return []
    spans = last - first + 1
    groups = np.repeat(first, spans) + (np.arange(spans.sum()) - np.repeat(np.cumsum(spans) - spans, spans))
    return np.unique(groups).tolist()


def files_holding(paths: list[str], ranges: dict[str, tuple[str | None, str | None]],
                  values: pl.Series) -> list[str]:
    """The `paths` whose (minimum, maximum) in `ranges` can hold one of `values`; a file with
    no range, or a truncated one, is kept."""
    keys = values.unique().sort().to_list()  # code point order: the order of the statistics
    kept = []
    for path in paths:  # one step per file (a few per run), not per row
        low, high = ranges.get(path, (None, None))
        if low is None or high is None or max(len(low.encode()), len(high.encode())) >= TRUSTED_FILE_STAT_BYTES:
            kept.append(path)
            continue
        first = bisect.bisect_left(keys, low)
        if first < len(keys) and keys[first] <= high:
            kept.append(path)
    return kept


def read_where(paths: list[str], column: str, values: pl.Series, footers: FooterCache,
               schema: dict[str, pl.DataType], columns: list[str] | None = None) -> pl.DataFrame:
    """Rows of the files whose `column` is one of `values`, in `columns` (None: all of
    `schema`), reading only the row groups whose fences admit them (whole files when a file
    has no fences). A file with a Bloom filter is searched for the values it may hold only,
    and skipped when it holds none."""
    unique = values.unique()
    picked: list[pa.Table] = []
    point_reads: list[tuple[Footer, list[int]]] = []  # (file, row groups)
    whole: list[str] = []  # files where most row groups match: Polars' reader is faster there
    taken: list[pa.Table] = []  # rows taken from files' row-addressable copies
    fenced: bool | None = None  # whether the values can be fences' bytes
    every = _Keys(unique)
    fences = footers.fences_of(paths, column)
    total_rows = sum(fence.footer.num_rows for fence in fences)
    for path, fence in zip(paths, fences, strict=True):
        n_groups = fence.footer.num_row_groups
        # the values the file holds if they spread like its rows: few in a small run
        expected = unique.len() * fence.footer.num_rows / max(total_rows, 1)
        here = every
        if fence.bloom is not None:
            maybe = membership.may_hold(fence.bloom, every.hashed)
            if not maybe.any():
                continue  # the file holds none of the values
            here = _Keys(unique.filter(pl.Series(maybe)), every.hashed[maybe]) if not maybe.all() else every
            expected = here.values.len()  # those it may hold are there, but for a false positive or two
        if fence.records is not None and here.values.len() * RECORDS_SHARE <= fence.footer.num_rows:
            rows = fence.records.take(here.hashed)
            footers.count_taken(rows.num_rows)
            taken.append(records.matching(rows, column, every.exact))
            continue
        sieve = expected * WHOLE_FILE_SHARE < n_groups
        if fence.starts is None or (not sieve and here.values.len() >= WHOLE_FILE_KEYS_PER_GROUP * n_groups
                                    and not _clustered(fence, here.low, here.high)):
            # no fences, or so many values that nearly every row group matches anyway (a big
            # batch): no search at all
            whole.append(path)
            continue
        if fenced is None:
            # numpy's bytes drop NULs; asked of Arrow (Polars plans a query: 0.8 ms a probe)
            fenced = not pc.any(pc.match_substring(unique.to_arrow(), "\x00")).as_py()
        if not fenced:
            whole.append(path)
            continue
        groups = fence.groups(here.sorted_bytes)
        if sieve and len(groups) > SIEVE_GROUPS_PER_HIT * max(expected, 1.0):
            # ranges too wide to tell (a small run spans the key space): most candidate groups
            # hold none of the values, so sieve them by their sort column (one column chunk
            # each), then read whole only the groups that hold a value
            candidates = set(groups)
            groups = [g for g in _sieve(fence.footer, column, groups, here, footers) if g in candidates]
        if len(groups) * WHOLE_FILE_SHARE > n_groups:
            whole.append(path)
            continue
        footers.count_groups(len(groups))
        if groups:
            point_reads.append((fence.footer, groups))
    if point_reads:  # filter in Arrow first: only the matching rows are converted to Polars
        picked = _read_groups(point_reads, column, every.exact, columns)
    picked += taken
    footers.count_groups(sum(fence.footer.num_row_groups for path, fence in zip(paths, fences, strict=True)
                              if path in whole))
    shown = schema if columns is None else {c: schema[c] for c in columns}
    frames = [_scan(whole, schema).filter(pl.col(column).is_in(values.implode())).select(list(shown)).collect()
              ] if whole else []
    if picked:
        frames.append(_conformed(picked, shown))
    return pl.concat(frames) if frames else pl.DataFrame(schema=shown)


class _Keys:
    """A probe's distinct values (or those a file may hold), in the forms a search takes,
    each made once when first needed."""

    def __init__(self, values: pl.Series, hashed: np.ndarray | None = None):
        self.values = values
        if hashed is not None:
            self.hashed = hashed

    @functools.cached_property
    def hashed(self) -> np.ndarray:
        """As Bloom filters and key indexes take them (`membership.hashes`)."""
        return membership.hashes(self.values)

    @functools.cached_property
    def low(self) -> object:
        return self.values.min()

    @functools.cached_property
    def high(self) -> object:
        return self.values.max()

    @functools.cached_property
    def sorted_bytes(self) -> np.ndarray:
        """Sorted, as fences compare them."""
        return fence_values(self.values)

    @functools.cached_property
    def exact(self) -> pa.Array:
        """As Arrow filters take them."""
        return self.values.to_arrow().cast(pa.large_string())


def _read_groups(reads: list[tuple[Footer, list[int]]], column: str, exact: pa.Array,
                 columns: list[str] | None) -> list[pa.Table]:
    """The rows of each file's row groups whose `column` is one of `exact`; files are read side
    by side (pyarrow reads and filters without the GIL: an export's probe reads a few row
    groups of each of 5 to 10 files)."""
    def read(task: tuple[Footer, list[int]]) -> pa.Table:
        footer, groups = task
        wanted = None if columns is None else [*dict.fromkeys([column, *columns])]
        rows = footer.read(groups, wanted, column)
        return rows.filter(pc.is_in(rows.column(column), exact))
    total = sum(len(groups) for _, groups in reads)
    if total >= SPLIT_READ_GROUPS * READ_THREADS:
        # a file with many groups to read (a batch's users in a run of one file) is read in
        # parts side by side, as files are: P2 at 10M, 10,000 objects, had taken 617-631 ms
        # against 463-538 once the bottom runs held one file instead of 5-6 (one 0.2 s read)
        share = max(1, -(-total // READ_THREADS))
        reads = [(footer, groups[at:at + share]) for footer, groups in reads for at in range(0, len(groups), share)]
    pooled = len(reads) > 1 and (not pinned() or total >= POOLED_READ_GROUPS)
    return list(_read_pool().map(read, reads)) if pooled else [read(task) for task in reads]


@functools.cache
def _read_pool() -> ThreadPoolExecutor:
    return ThreadPoolExecutor(max_workers=READ_THREADS, thread_name_prefix="engagelake-reads")


def _scan(paths: list[str], schema: dict[str, pl.DataType]) -> pl.LazyFrame:
    """Polars' reader of whole files; a column older files lack (a partial row's mask) is null."""
    return objects.scan_parquet(paths, schema)


def _conformed(tables: list[pa.Table], schema: dict[str, pl.DataType]) -> pl.DataFrame:
    # one chunk: the rows found come a few per row group or copy batch, and Polars converts a
    # table of many small chunks column by column and chunk by chunk (1.5 ms for 50 rows of
    # 31 columns); a serial 50-user export at 10M took 66-68 against 69-70 ms of CPU
    frame = pl.from_arrow(pa.concat_tables(tables, promote_options="permissive").combine_chunks())
    assert isinstance(frame, pl.DataFrame)
    # a column no file held (or none held a value of: `footers.held_columns`) is null in every row,
    # added beside the key column read, so that it takes the frame's length
    missing = [pl.lit(None, t).alias(c) for c, t in schema.items() if c not in frame.columns]
    return frame.with_columns(missing).select([pl.col(c).cast(t) for c, t in schema.items()])


def _clustered(fence: Fences, low: object, high: object) -> bool:
    """Whether values from `low` to `high` (a range of keys) lie within few of the file's row
    groups: then the file is searched, however many values there are."""
    if not isinstance(low, str) or not isinstance(high, str):
        return False
    spanned = fence.spanned(low.encode(), high.encode() + b"\x00")  # [low, high]
    return len(spanned) * WHOLE_FILE_SHARE <= fence.footer.num_row_groups


def read_range(paths: list[str], column: str, low: str, high: str | None, footers: FooterCache,
               schema: dict[str, pl.DataType]) -> pl.DataFrame:
    """Rows of the files whose `column` lies in [low, high) (no end when `high` is None),
    reading only the row groups whose fences meet the range."""
    inside = pl.col(column) >= pl.lit(low)
    if high is not None:
        inside &= pl.col(column) < pl.lit(high)
    picked: list[pa.Table] = []
    whole: list[str] = []
    bounds = (low.encode(), None if high is None else high.encode())
    for path, fence in zip(paths, footers.fences_of(paths, column), strict=True):
        groups = None if fence.starts is None else fence.spanned(*bounds)
        if groups is None or len(groups) * WHOLE_FILE_SHARE > fence.footer.num_row_groups:
            whole.append(path)
            continue
        footers.count_groups(len(groups))
        if groups:
            picked.append(fence.footer.read(groups, None, column))
    frames = [_scan(whole, schema).filter(inside).collect()] if whole else []
    if picked:
        frames.append(_conformed(picked, schema).filter(inside))
    return pl.concat(frames) if frames else pl.DataFrame(schema=schema)


def range_bounds(paths: list[str], column: str, rows: int, footers: FooterCache) -> list[str]:
    """Values of `column` that cut the files' key space into ranges of about `rows` rows each:
    every so many row-group starts of all files together (the files of a run hold disjoint
    ranges; a file without fences adds none)."""
    fences = [fence for fence in footers.fences_of(paths, column) if fence.starts is not None]
    starts = np.sort(np.concatenate([fence.starts for fence in fences])) if fences else np.array([], dtype=bytes)
    if starts.size == 0:
        return []
    total = sum(fence.footer.num_rows for fence in fences)
    step = max(1, rows * starts.size // max(total, 1))
    # a bound cut inside a character (a truncated statistic) only moves the cut a little; no
    # cut within half a range of the end (it would leave a last range of a few rows: a part of
    # its own to write or export)
    cuts = {bytes(start).decode(errors="ignore") for start in starts[step:starts.size - step // 2:step]}
    return sorted(cuts - {""})


def _sieve(footer: Footer, column: str, groups: list[int], values: _Keys, footers: FooterCache) -> list[int]:
    """The row groups of `groups` whose `column` holds one of `values`, by reading that one
    column, or by the file's key index once it has one (`FooterCache.key_index`)."""
    if (index := footers.key_index(footer.path, column, footer)) is not None:
        return index.groups_of_hashed(values.hashed)
    keys = footer.read(groups, [column], column).column(column)
    hits = np.flatnonzero(pc.is_in(keys, values.exact).to_numpy(zero_copy_only=False))
    if hits.size == 0:
        return []
    ends = np.cumsum(footer.group_rows[groups])
    return [groups[i] for i in np.unique(np.searchsorted(ends, hits, side="right")).tolist()]


def sort_order(name: str, key: tuple[str, ...] | None) -> list[str] | None:
    """The order of `name`'s files: by the probe column, then the rest of the key; a history
    log by user, then by update sequence (each object of a batch has its own)."""
    column = SORT_BY.get(name)
    if column is None:
        return None
    if key is None:
        return [column, "update_seq"]
    return [column, *[k for k in key if k != column]]


def sort_for_write(name: str, rows: pl.DataFrame, key: tuple[str, ...] | None) -> pl.DataFrame:
    """A batch's rows of `name` in the order its files keep."""
    by = sort_order(name, key)
    return rows if by is None else rows.sort(by, maintain_order=True, nulls_last=True)
