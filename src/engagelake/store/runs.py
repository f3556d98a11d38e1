"""Sorted runs: how a probe reads only the row groups that can hold its keys.

Every data file the store writes for a keyed table or a history log is sorted by the table's
probe column (`SORT_BY`) and cut into row groups of `ROW_GROUP_ROWS` rows. The minimum of that
column in each row group, kept in the Parquet footer, is a fence pointer: the rows of a value
lie in the row groups from the last one starting before it to the last one starting at or
before it. A probe binary-searches its sorted values against those fences and reads only the
matching row groups; footers are cached per file (files never change), so a warm probe opens no
footer at all. This is the lookup of an LSM tree's sorted runs (Apache Paimon, RocksDB): each
batch adds one run per table, compaction merges them into one.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

# Row groups small enough that a point lookup decodes little, large enough that footers stay
# small (a footer holds one entry per row group and column).
ROW_GROUP_ROWS = 1024
# Parquet writers may truncate long min/max statistics; a fence that long is not trusted.
TRUSTED_STAT_CHARS = 512
# When more than 1/WHOLE_FILE_SHARE of a file's row groups match, scan the file instead.
WHOLE_FILE_SHARE = 3

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
}


@dataclass(frozen=True)
class Fences:
    """The row-group starts of one file's sort column (None: the file cannot be pruned)."""

    metadata: pq.FileMetaData
    starts: np.ndarray | None


class FooterCache:
    """Parquet footers and fences of data files, read once per file."""

    def __init__(self, limit: int = 4096):
        self._fences: dict[tuple[str, str], Fences] = {}
        self._limit = limit
        self.footers_read = 0  # for tests and benchmarks

    def fences(self, path: str, column: str) -> Fences:
        key = (path, column)
        if key not in self._fences:
            if len(self._fences) >= self._limit:
                self._fences.clear()
            metadata = pq.read_metadata(path)
            self.footers_read += 1
            self._fences[key] = Fences(metadata, _starts(metadata, column))
        return self._fences[key]


def _starts(metadata: pq.FileMetaData, column: str) -> np.ndarray | None:
    names = metadata.schema.to_arrow_schema().names
    if column not in names or metadata.num_row_groups == 0:
        return None
    index = names.index(column)
    starts, ends = [], []
    for g in range(metadata.num_row_groups):
        stats = metadata.row_group(g).column(index).statistics
        if (stats is None or not stats.has_min_max
                or max(len(str(stats.min)), len(str(stats.max))) >= TRUSTED_STAT_CHARS):
            return None
        starts.append(stats.min)
        ends.append(stats.max)
    if any("\x00" in v for v in (*starts, *ends)):  # numpy's fixed-width strings drop NULs
        return None
    # fixed-width unicode arrays compare in C, in code point order (= UTF-8 byte order, the
    # order of Parquet statistics)
    fences, last = np.array(starts, dtype=str), np.array(ends, dtype=str)
    # a writer may interleave sorted input over row groups: fences hold only when every group
    # ends at or before the next one starts
    if np.any(last[:-1] > fences[1:]):
        return None
    return fences


def matching_groups(starts: np.ndarray, values: np.ndarray) -> list[int]:
    """Row groups that can hold any of the sorted `values`, given each group's first value."""
    first = np.maximum(np.searchsorted(starts, values, side="left") - 1, 0)
    last = np.searchsorted(starts, values, side="right") - 1
    keep = last >= 0
    first, last = first[keep], last[keep]
    if first.size == 0:
        return []
    spans = last - first + 1
    groups = np.repeat(first, spans) + (np.arange(spans.sum()) - np.repeat(np.cumsum(spans) - spans, spans))
    return np.unique(groups).tolist()


def read_where(paths: list[str], column: str, values: pl.Series, footers: FooterCache,
               schema: dict[str, pl.DataType]) -> pl.DataFrame:
    """Rows of the files whose `column` is one of `values`, reading only the row groups whose
    fences admit them (whole files when a file has no fences)."""
    keys = values.unique().sort().to_list()
    wanted = np.array(keys, dtype=str)
    exact = pa.array(keys, pa.large_string())
    fenced = not any("\x00" in k for k in keys)  # numpy's strings drop NULs
    picked: list[pa.Table] = []
    whole: list[str] = []  # files where most row groups match: Polars' reader is faster there
    for path in paths:
        fence = footers.fences(path, column)
        if fence.starts is None or not fenced:
            whole.append(path)
            continue
        groups = matching_groups(fence.starts, wanted)
        if len(groups) * WHOLE_FILE_SHARE > len(fence.starts):
            whole.append(path)
        elif groups:  # filter in Arrow first: only the matching rows are converted to Polars
            rows = pq.ParquetFile(path, metadata=fence.metadata).read_row_groups(groups)
            picked.append(rows.filter(pc.is_in(rows.column(column), exact)))
    frames = [pl.scan_parquet(whole, schema=schema).filter(pl.col(column).is_in(values.implode())).collect()
              ] if whole else []
    if picked:
        frame = pl.from_arrow(pa.concat_tables(picked, promote_options="permissive"))
        assert isinstance(frame, pl.DataFrame)
        frames.append(frame.select([pl.col(c).cast(t) for c, t in schema.items()]))
    return pl.concat(frames) if frames else pl.DataFrame(schema=schema)


def sort_for_write(name: str, rows: pl.DataFrame, key: tuple[str, ...] | None) -> pl.DataFrame:
    """A batch's rows of `name` in the order its files keep: by the probe column, then the key."""
    column = SORT_BY.get(name)
    if column is None:
        return rows
    by = [column, *[k for k in (key or ()) if k != column]]
    return rows.sort(by, maintain_order=True, nulls_last=True)
