"""Measure storage layouts for keyed Delta tables: does probing a batch's keys cost what the
batch touches, or what the store holds?

    cd /work/main && uv run python benchmarks/studies/layout_probe.py [--rows N] [--batches N]
                                                                      [--dir DIR] [--quick] [--keep]

A profiles-like keyed table (key ``service_id``: 24-char random lowercase hex; 13 columns) is
generated with numpy/polars, spread over ``--batches`` append batches (batch 0 all new keys,
later batches ~70% new keys and ~30% updates of earlier keys, 2% of updates are tombstones),
and written with ``deltalake.write_deltalake`` in these layouts:

- ``A``       append log, one file per batch, rows unsorted (today's layout).
- ``B8k``     append log, each batch file sorted by key, ``max_row_group_size=8192``.
- ``B64k``    the same with 65,536-row row groups.
- ``C64``     hash-bucketed: Delta partition column ``bucket = fnv1a64(key) % 64``, each
              file sorted by key (8k row groups); one file per (batch, bucket).
- ``C256``    the same with 256 buckets.
- ``D8k``     one compacted sorted run (current rows only: newest per key, tombstones dropped;
              a single Delta version) with 8k row groups -- what a major compaction yields.
- ``D64k``    the same with 64k row groups.
- ``D8k+tail`` ``D8k`` after two sorted appends (the 10k and the 1M batch of the write-cost
              step): a compacted base plus a small tail.

Every probe returns the current rows (newest ``_batch`` per key, tombstones dropped) of a set
of random existing keys (50, 10,000 and 600,000 keys).  Each measurement runs in a fresh
subprocess (``python layout_probe.py --probe ...`` printing JSON): the first probe there is
*cold* (open the table + probe; the OS page cache is warm unless stated), the second probe in
the same process, with other keys and the already-open handle/cached metadata, is *warm*.
Each cell is repeated 3 times (fewer when one run takes very long) and the median is shown.
Extra runs per cell: one with ``POLARS_VERBOSE=1`` / DuckDB JSON profiling to count the files,
row groups and bytes actually read, and (50 keys) one after evicting the table's files from the
OS page cache (``posix_fadvise(DONTNEED)``) -- a cold-disk fresh-process open + probe.

Read paths:

- ``pl_delta``        ``pl.scan_delta(DeltaTable).filter(pl.col(key).is_in(V))``.
- ``pl_delta_bkt``    the same plus ``pl.col("bucket").is_in(buckets(V))`` (bucketed layouts).
- ``pl_parquet``      ``pl.scan_parquet(dt.file_uris()).filter(...)`` (no Delta-log stats).
- ``own_files``       files pruned by us from ``dt.get_add_actions(flatten=True)`` per-file
                      min/max (and bucket), then ``pl.scan_parquet(survivors).filter(...)``.
- ``own_rg``          the same file pruning, then row-group pruning from cached Parquet footers
                      (pyarrow), key column of candidate row groups read first, full rows read
                      only for row groups with a hit (pyarrow ``ParquetFile.read_row_groups``).
- ``delta_pred``      ``dt.file_uris(file_pruning_predicate=[(key, "in", V), ...])`` (deltalake's
                      own stats pruning) then ``pl.scan_parquet(...)``.
- ``duckdb``          DuckDB ``read_parquet(dt.file_uris())`` SEMI JOIN the registered keys,
                      newest per key with ``QUALIFY row_number()``.
- ``duckdb_bkt``      the same over the files of the keys' buckets only.

Which paths run on which layout is in ``PATHS`` (``--paths`` overrides it for all layouts).
Sorted layouts are written with ``WriterProperties(max_row_group_size=R, write_batch_size=R,
compression="SNAPPY")`` from record batches of exactly R rows, so each row group is one
contiguous key range (the layout table reports overlapping row-group pairs as a check).  Also
timed: a major compaction (``scan_delta`` of A -> newest per key -> sort -> write), and one
append of 10,000 and of 1,000,000 rows into each 10M-row layout, written the layout's way.

Prints markdown tables; the full results go to ``--out`` (JSON).  Generated data under
``--dir`` is deleted at the end unless ``--keep``.  The numbers are wall-clock on whatever
else the machine is doing: read them as medians of few runs, not as a profile.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

KEY = "service_id"
BASE_COLUMNS = [
    "service_id",
    "external_id",
    "email",
    "first_name",
    "last_name",
    "country",
    "created_at",
    "updated_at",
    "update_seq",
    "created_seq",
    "random_bucket",
    "_batch",
    "_deleted",
]
PROBE_SIZES = (50, 10_000, 600_000)
QUICK_PROBE_SIZES = (50, 10_000, 60_000)


def rss_mb() -> float:
    """Peak RSS of this process image in MB.

    VmHWM from /proc/self/status: ``getrusage(RUSAGE_SELF).ru_maxrss`` survives ``execve`` on
    Linux, so in a subprocess forked from a big parent it reports the parent's RSS at fork time.
    """
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024.0
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # Linux: KiB


# --------------------------------------------------------------------------------------------
# shared helpers (parent and probe process)
# --------------------------------------------------------------------------------------------

FNV_OFFSET = 0xCBF29CE484222325
FNV_PRIME = 0x100000001B3


def fnv1a64_u8(u8: Any) -> Any:
    """Stable 64-bit FNV-1a of each row of a (n, width) uint8 array (the key's ASCII bytes)."""
    import numpy as np

    h = np.full(u8.shape[0], FNV_OFFSET, dtype=np.uint64)
    prime = np.uint64(FNV_PRIME)
    for j in range(u8.shape[1]):
        h ^= u8[:, j].astype(np.uint64)
        h *= prime
    return h


def buckets_of_keys(keys: Any, n_buckets: int) -> Any:
    """Bucket ids (int32) of a polars String Series of 24-char keys."""
    import numpy as np

    s24 = keys.to_numpy().astype("S24")
    u8 = s24.view(np.uint8).reshape(-1, 24)
    return (fnv1a64_u8(u8) % np.uint64(n_buckets)).astype(np.int32)


IS_IN_PRUNE_MAX = 100


def key_predicate(keys: Any) -> Any:
    """``pl.col(KEY).is_in(...)`` in the form that polars 2.1 prunes best.

    Measured: polars checks a literal Python list of <= 100 values against each file's and row
    group's min/max value by value; above 100 values it only uses the list's overall min/max
    (useless for random keys) and, worse, re-evaluates the long literal list per file (60k keys
    over 2,560 files: 17 s).  ``keys.implode()`` is never pruned per value but costs nothing per
    file.  A same-dtype Series argument is deprecated (and behaves like the list).
    """
    import polars as pl

    if len(keys) <= IS_IN_PRUNE_MAX:
        return pl.col(KEY).is_in(keys.to_list())
    return pl.col(KEY).is_in(keys.implode())


def current_rows(lf: Any) -> Any:
    """Newest row per key (by _batch), tombstones dropped."""
    import polars as pl

    return (
        lf.filter(pl.col("_batch") == pl.col("_batch").max().over(KEY))
        .filter(~pl.col("_deleted"))
        .select(BASE_COLUMNS)
    )


# --------------------------------------------------------------------------------------------
# probe process
# --------------------------------------------------------------------------------------------


class Prober:
    """One read path over one table; keeps handle and metadata between probes (warm)."""

    def __init__(self, table: str, kind: str, n_buckets: int, diag: bool) -> None:
        self.table = table
        self.kind = kind
        self.n_buckets = n_buckets
        self.diag = diag
        self.dt: Any = None
        self.actions: Any = None  # polars DataFrame of add actions (own_* paths)
        self.footers: dict[str, Any] = {}  # path -> (metadata, rg_min, rg_max, rg_rows, sizes)
        self.con: Any = None
        self.stats: dict[str, Any] = {}

    # -- open --------------------------------------------------------------------------------
    def open(self) -> None:
        from deltalake import DeltaTable

        self.dt = DeltaTable(self.table)

    def refresh(self) -> None:
        self.dt.update_incremental()

    # -- helpers -----------------------------------------------------------------------------
    def _buckets(self, keys: Any) -> list[int]:
        import numpy as np

        return sorted(int(b) for b in np.unique(buckets_of_keys(keys, self.n_buckets)))

    def _own_prune_files(self, keys_sorted_np: Any, keys: Any) -> list[str]:
        """Files whose Delta-log [min, max] of the key (and bucket) can hold one of the keys."""
        import numpy as np
        import polars as pl

        if self.actions is None:
            acts = pl.DataFrame(self.dt.get_add_actions(flatten=True))
            cols = ["path", f"min.{KEY}", f"max.{KEY}", "size_bytes", "num_records"]
            if "partition.bucket" in acts.columns:
                cols.append("partition.bucket")
            acts = acts.select(cols)
            self.actions = acts
            self.root = self.dt.table_uri.removeprefix("file://").rstrip("/") + "/"
        acts = self.actions
        if self.n_buckets and "partition.bucket" in acts.columns:
            acts = acts.filter(pl.col("partition.bucket").cast(pl.Int64).is_in(self._buckets(keys)))
        mins = acts[f"min.{KEY}"].to_numpy().astype("S24")
        maxs = acts[f"max.{KEY}"].to_numpy().astype("S24")
        lo = np.searchsorted(keys_sorted_np, mins, side="left")
        hi = np.searchsorted(keys_sorted_np, maxs, side="right")
        keep = hi > lo
        paths = acts["path"].to_numpy()[keep]
        self.stats["files_total"] = int(self.actions.height)
        self.stats["files_read"] = int(keep.sum())
        self.stats["file_bytes_candidates"] = int(acts["size_bytes"].to_numpy()[keep].sum())
        return [self.root + p for p in paths]

    def _footer(self, path: str) -> Any:
        import numpy as np
        import pyarrow.parquet as pq

        f = self.footers.get(path)
        if f is None:
            md = pq.ParquetFile(path).metadata
            ci = md.schema.names.index(KEY)
            n = md.num_row_groups
            mins = np.empty(n, dtype="S24")
            maxs = np.empty(n, dtype="S24")
            rows = np.empty(n, dtype=np.int64)
            key_bytes = np.empty(n, dtype=np.int64)
            all_bytes = np.empty(n, dtype=np.int64)
            for i in range(n):
                rg = md.row_group(i)
                st = rg.column(ci).statistics
                mins[i] = st.min
                maxs[i] = st.max
                rows[i] = rg.num_rows
                key_bytes[i] = rg.column(ci).total_compressed_size
                all_bytes[i] = rg.total_byte_size
            f = (md, mins, maxs, rows, key_bytes, all_bytes)
            self.footers[path] = f
        return f

    # -- probe -------------------------------------------------------------------------------
    def probe(self, keys: Any) -> Any:
        import numpy as np
        import polars as pl

        kind = self.kind
        self.stats = {}
        key_in = key_predicate(keys)
        if kind in ("pl_delta", "pl_delta_bkt"):
            lf = pl.scan_delta(self.dt)
            pred = key_in
            if kind == "pl_delta_bkt":
                pred = pred & pl.col("bucket").is_in(self._buckets(keys))
            return current_rows(lf.filter(pred)).collect()
        if kind == "pl_parquet":
            files = self.dt.file_uris()
            self.stats["files_read"] = len(files)
            return current_rows(pl.scan_parquet(files).filter(key_in)).collect()
        if kind == "delta_pred":
            pred_t: list[tuple[str, str, Any]] = [(KEY, "in", keys.to_list())]
            if self.n_buckets:
                pred_t.insert(0, ("bucket", "in", self._buckets(keys)))
            files = self.dt.file_uris(file_pruning_predicate=pred_t)
            self.stats["files_read"] = len(files)
            if not files:
                return pl.DataFrame()
            return current_rows(pl.scan_parquet(files).filter(key_in)).collect()
        if kind in ("own_files", "own_rg"):
            ks = np.sort(keys.to_numpy().astype("S24"))
            files = self._own_prune_files(ks, keys)
            if kind == "own_files":
                if not files:
                    return pl.DataFrame()
                return current_rows(pl.scan_parquet(files).filter(key_in)).collect()
            return self._own_rg(files, ks, keys)
        if kind in ("duckdb", "duckdb_bkt"):
            return self._duckdb(keys)
        raise SystemExit(f"unknown read path {kind}")

    def _own_rg(self, files: list[str], ks: Any, keys: Any) -> Any:
        import numpy as np
        import polars as pl
        import pyarrow.parquet as pq

        parts = []
        rg_total = rg_cand = rg_full = 0
        bytes_read = 0
        for path in files:
            md, mins, maxs, rows, key_bytes, all_bytes = self._footer(path)
            rg_total += len(rows)
            lo = np.searchsorted(ks, mins, side="left")
            hi = np.searchsorted(ks, maxs, side="right")
            cand = np.nonzero(hi > lo)[0]
            if len(cand) == 0:
                continue
            rg_cand += len(cand)
            pf = pq.ParquetFile(path, metadata=md)
            if len(cand) == 1 and len(rows) == 1:
                hit_rgs = cand  # nothing to gain from a key-only pass
            else:
                kt = pf.read_row_groups(cand.tolist(), columns=[KEY])
                bytes_read += int(key_bytes[cand].sum())
                hits = pl.Series(kt.column(0)).is_in(keys.implode()).to_numpy()
                idx = np.nonzero(hits)[0]
                if len(idx) == 0:
                    continue
                bounds = np.cumsum(rows[cand])
                hit_rgs = np.unique(cand[np.searchsorted(bounds, idx, side="right")])
            rg_full += len(hit_rgs)
            bytes_read += int(all_bytes[hit_rgs].sum())
            t = pf.read_row_groups(hit_rgs.tolist(), columns=BASE_COLUMNS)
            parts.append(pl.DataFrame(t).filter(pl.col(KEY).is_in(keys.implode())))
        self.stats.update(
            rg_total_in_files=rg_total,
            rg_key_pass=rg_cand,
            rg_read=rg_full,
            bytes_read_est=bytes_read,
        )
        if not parts:
            return pl.DataFrame()
        return current_rows(pl.concat(parts, how="vertical_relaxed").lazy()).collect()

    def _duckdb(self, keys: Any) -> Any:
        import duckdb
        import polars as pl

        if self.con is None:
            self.con = duckdb.connect()
            if self.diag:
                self.prof = f"/tmp/layout_probe_duckprof_{os.getpid()}.json"
                self.con.execute("SET enable_profiling='json'")
                self.con.execute(f"SET profiling_output='{self.prof}'")
        if self.kind == "duckdb_bkt":
            files = self.dt.file_uris(
                file_pruning_predicate=[("bucket", "in", self._buckets(keys))]
            )
        else:
            files = self.dt.file_uris()
        self.stats["files_listed"] = len(files)
        wanted = pl.DataFrame({"k": keys}).to_arrow()
        self.con.register("wanted", wanted)
        cols = ", ".join(f"p.{c}" for c in BASE_COLUMNS)
        q = (
            f"SELECT {cols} FROM read_parquet($files) p SEMI JOIN wanted w ON p.{KEY} = w.k "
            f"QUALIFY row_number() OVER (PARTITION BY p.{KEY} ORDER BY p._batch DESC) = 1 "
        )
        q = f"SELECT * FROM ({q}) WHERE NOT _deleted"
        out = pl.from_arrow(self.con.sql(q, params={"files": files}).to_arrow_table())
        self.con.unregister("wanted")
        if self.diag:
            try:
                prof = json.loads(Path(self.prof).read_text())
                qd = prof.get("query", {})
                self.stats.update(
                    rg_read=qd.get("total_row_groups_scanned"),
                    rg_total=qd.get("total_row_groups_to_scan"),
                    rows_scanned=qd.get("total_rows_scanned"),
                    bytes_read=prof.get("io", {}).get("total_bytes_read"),
                )
                found = re.findall(r'"Total Files Read": "(\d+)"', Path(self.prof).read_text())
                if found:
                    self.stats["files_read"] = sum(int(x) for x in found)
            except Exception as e:  # profiling is best-effort
                self.stats["prof_error"] = repr(e)
        return out


def checksum(df: Any) -> list[int]:
    if df.height == 0:
        return [0, 0]
    return [int(df.height), int(df["update_seq"].sum())]


def probe_main(args: argparse.Namespace) -> None:
    t_proc = time.perf_counter()
    # import the modules a path needs before timing (a server has them imported already)
    import deltalake  # noqa: F401
    import polars as pl

    if args.kind.startswith("duckdb"):
        import duckdb  # noqa: F401
    import pyarrow  # noqa: F401  (polars' delta/arrow interop imports it lazily)
    import pyarrow.parquet  # noqa: F401

    keys_cold = pl.read_parquet(args.keys_cold)["k"]
    keys_warm = pl.read_parquet(args.keys_warm)["k"] if args.keys_warm else None
    out: dict[str, Any] = {"import_s": time.perf_counter() - t_proc, "rss_base_mb": rss_mb()}
    pr = Prober(args.table, args.kind, args.n_buckets, args.diag)
    t0 = time.perf_counter()
    pr.open()
    t1 = time.perf_counter()
    df = pr.probe(keys_cold)
    t2 = time.perf_counter()
    out.update(
        open_ms=(t1 - t0) * 1e3,
        cold_ms=(t2 - t0) * 1e3,
        cold_probe_ms=(t2 - t1) * 1e3,
        cold_sum=checksum(df),
        cold_stats=pr.stats,
        rss_after_cold_mb=rss_mb(),
    )
    del df
    if keys_warm is not None:
        t3 = time.perf_counter()
        pr.refresh()
        t4 = time.perf_counter()
        df = pr.probe(keys_warm)
        t5 = time.perf_counter()
        out.update(
            refresh_ms=(t4 - t3) * 1e3,
            warm_ms=(t5 - t4) * 1e3,
            warm_sum=checksum(df),
            warm_stats=pr.stats,
        )
    out["rss_peak_mb"] = rss_mb()
    print("@@RESULT@@" + json.dumps(out))


# --------------------------------------------------------------------------------------------
# parent: data generation and layouts
# --------------------------------------------------------------------------------------------


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def random_hex_keys(rng: Any, n: int) -> Any:
    """n distinct-with-overwhelming-probability 24-char lowercase hex keys as numpy 'S24'."""
    import numpy as np

    lut = np.array([f"{i:02x}".encode() for i in range(256)], dtype="S2")
    b = rng.integers(0, 256, size=(n, 12), dtype=np.uint8)
    return np.ascontiguousarray(lut[b]).view("S24").ravel()


def s24_to_series(name: str, arr: Any) -> Any:
    import polars as pl
    import pyarrow as pa

    return pl.Series(name, pa.array(arr, type=pa.binary()).cast(pa.large_string()))


def make_rows(rng: Any, key_ids: Any, batch: Any, deleted: Any, seq0: int, key_s24: Any) -> Any:
    """A profiles-like frame for the given key ids (vectorized)."""
    import numpy as np
    import polars as pl

    n = len(key_ids)
    first = np.array([f"First{i:03d}" for i in range(300)])
    last = np.array([f"Last{i:04d}" for i in range(2000)])
    countries = np.array(
        "US GB DE FR ES IT NL BE SE NO DK FI PL PT IE AT CH CZ GR HU RO BG HR SI SK "
        "LT LV EE CA MX BR AR CL CO PE AU NZ JP KR IN".split()
    )
    fi = rng.integers(0, len(first), n)
    li = rng.integers(0, len(last), n)
    base_us = 1_600_000_000 * 1_000_000
    df = pl.DataFrame(
        {
            KEY: s24_to_series(KEY, key_s24[key_ids]),
            "_kid": key_ids.astype(np.int64),
            "first_name": first[fi],
            "last_name": last[li],
            "country": countries[rng.integers(0, len(countries), n)],
            "created_at": base_us + key_ids.astype(np.int64) * 7_000_000,
            "updated_at": base_us
            + batch.astype(np.int64) * 3_600_000_000
            + rng.integers(0, 3_600_000_000, n),
            "update_seq": np.arange(seq0, seq0 + n, dtype=np.int64),
            "random_bucket": rng.integers(0, 10_000, n).astype(np.int32),
            "_batch": batch.astype(np.int64),
            "_deleted": deleted,
        }
    )
    return df.select(
        pl.col(KEY),
        pl.format("ext-{}", pl.col("_kid")).alias("external_id"),
        pl.concat_str(
            pl.col("first_name").str.to_lowercase(),
            pl.lit("."),
            pl.col("last_name").str.to_lowercase(),
            pl.col("_kid").cast(pl.String),
            pl.lit("@example.com"),
        ).alias("email"),
        "first_name",
        "last_name",
        "country",
        pl.col("created_at").cast(pl.Datetime("us", "UTC")),
        pl.col("updated_at").cast(pl.Datetime("us", "UTC")),
        "update_seq",
        pl.col("_kid").alias("created_seq"),
        "random_bucket",
        "_batch",
        "_deleted",
    )


def generate(rng: Any, rows: int, batches: int) -> tuple[Any, Any, int]:
    """All batches as one frame (with _batch), the key universe ('S24') and its size."""
    import numpy as np

    per = rows // batches
    ids_parts, batch_parts, del_parts = [], [], []
    next_id = 0
    for b in range(batches):
        n_new = per if b == 0 else int(per * 0.7)
        new_ids = np.arange(next_id, next_id + n_new, dtype=np.int64)
        next_id += n_new
        if b:
            upd = np.unique(rng.integers(0, next_id - n_new, per - n_new))
            dele = rng.random(len(upd)) < 0.02
            ids = np.concatenate([new_ids, upd])
            de = np.concatenate([np.zeros(n_new, bool), dele])
            perm = rng.permutation(len(ids))  # unsorted within the batch
            ids, de = ids[perm], de[perm]
        else:
            ids, de = new_ids, np.zeros(n_new, bool)
        ids_parts.append(ids)
        batch_parts.append(np.full(len(ids), b, np.int64))
        del_parts.append(de)
    key_s24 = random_hex_keys(rng, next_id)
    ids = np.concatenate(ids_parts)
    df = make_rows(rng, ids, np.concatenate(batch_parts), np.concatenate(del_parts), 0, key_s24)
    assert not df.select(KEY, "_batch").is_duplicated().any(), "a key twice in one batch"
    return df, key_s24, next_id


def add_bucket(df: Any, n_buckets: int) -> Any:
    import numpy as np
    import polars as pl

    u8 = df[KEY].to_numpy().astype("S24").view(np.uint8).reshape(-1, 24)
    b = (fnv1a64_u8(u8) % np.uint64(n_buckets)).astype(np.int32)
    return df.with_columns(pl.Series("bucket", b))


LAYOUTS = {
    # name: (kind, row_group_rows, n_buckets)
    "A": ("append", None, 0),
    "B8k": ("append_sorted", 8192, 0),
    "B64k": ("append_sorted", 65536, 0),
    "C64": ("bucketed", 8192, 64),
    "C256": ("bucketed", 8192, 256),
    "D8k": ("compacted", 8192, 0),
    "D64k": ("compacted", 65536, 0),
}


def to_arrow(df: Any, rg: int | None = None) -> Any:
    """Arrow table; with ``rg``, made of record batches of exactly ``rg`` rows.

    delta-rs spreads the input's record batches over parallel writer streams, and a Parquet row
    group is cut every ``max_row_group_size`` buffered rows, so a row group can mix the end of
    one input batch with the start of another: on sorted input that gives row groups (and files)
    with wide, overlapping key ranges.  Batches of exactly the row-group size keep every row
    group one contiguous key range.
    """
    import pyarrow as pa

    t = df.to_arrow()
    if rg is None:
        return t
    return pa.Table.from_batches(df.rechunk().to_arrow().to_batches(max_chunksize=rg), t.schema)


def writer_props(rg: int | None) -> Any:
    """WriterProperties for a row-group size; None = deltalake's defaults (SNAPPY, 1Mi rows).

    Passing ``WriterProperties(...)`` without ``compression`` writes UNCOMPRESSED Parquet in
    deltalake 1.6.6 (``self.compression = None``), so compression is always given here.
    ``write_batch_size=rg``: the writer rolls files over (target_file_size) at write-batch
    boundaries (default 1024 rows); unless that equals the row-group size, a file can start
    with a partial row group and every later row group then straddles two input batches, which
    on a sorted run gives overlapping row-group key ranges (measured: 109 candidate row groups
    instead of 50 for 50 keys).  See also ``to_arrow``.
    """
    from deltalake import WriterProperties

    if not rg:
        return None
    return WriterProperties(max_row_group_size=rg, write_batch_size=rg, compression="SNAPPY")


def write_batch(path: str, layout: str, df: Any) -> None:
    """Append one batch in the given layout's way (sort / bucket / row-group size)."""
    from deltalake import write_deltalake

    kind, rg, nb = LAYOUTS[layout]
    wp = writer_props(rg)
    if kind == "append":
        write_deltalake(path, to_arrow(df), mode="append", writer_properties=wp)
    elif kind in ("append_sorted", "compacted"):
        write_deltalake(path, to_arrow(df.sort(KEY), rg), mode="append", writer_properties=wp)
    elif kind == "bucketed":
        d = add_bucket(df, nb).sort("bucket", KEY)
        write_deltalake(
            path, to_arrow(d, rg), mode="append", partition_by=["bucket"], writer_properties=wp
        )
    else:
        raise ValueError(kind)


def build_layout(path: str, layout: str, full: Any, batches: int) -> float:
    import polars as pl
    from deltalake import write_deltalake

    kind, rg, _ = LAYOUTS[layout]
    t0 = time.perf_counter()
    if kind == "compacted":
        cur = (
            full.lazy()
            .filter(pl.col("_batch") == pl.col("_batch").max().over(KEY))
            .filter(~pl.col("_deleted"))
            .sort(KEY)
            .collect()
        )
        write_deltalake(path, to_arrow(cur, rg), writer_properties=writer_props(rg))
    else:
        for _key, part in full.partition_by("_batch", as_dict=True, maintain_order=True).items():
            write_batch(path, layout, part)
    return time.perf_counter() - t0


def layout_facts(path: str) -> dict[str, Any]:
    import pyarrow.parquet as pq
    from deltalake import DeltaTable

    dt = DeltaTable(path)
    files = dt.file_uris()
    disk = sum(f.stat().st_size for f in Path(path).rglob("*") if f.is_file())
    log_bytes = sum(f.stat().st_size for f in (Path(path) / "_delta_log").rglob("*") if f.is_file())
    rgs = overlaps = 0
    for f in files:
        md = pq.ParquetFile(f).metadata
        rgs += md.num_row_groups
        if md.num_row_groups > 1:
            # row groups of one file whose key ranges overlap (0 for a well-written sorted file)
            ci = md.schema.names.index(KEY)
            st = sorted(
                (
                    md.row_group(i).column(ci).statistics.min,
                    md.row_group(i).column(ci).statistics.max,
                )
                for i in range(md.num_row_groups)
            )
            overlaps += sum(1 for a, b in zip(st, st[1:], strict=False) if b[0] <= a[1])
    return {
        "files": len(files),
        "row_groups": rgs,
        "rg_overlaps": overlaps,
        "disk_mb": disk / 2**20,
        "log_mb": log_bytes / 2**20,
        "version": dt.version(),
    }


def evict(path: str) -> None:
    for f in Path(path).rglob("*"):
        if f.is_file():
            fd = os.open(f, os.O_RDONLY)
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


# --------------------------------------------------------------------------------------------
# parent: running probes
# --------------------------------------------------------------------------------------------


def run_probe_proc(
    table: str,
    kind: str,
    n_buckets: int,
    keys_cold: str,
    keys_warm: str | None,
    *,
    diag: bool = False,
    timeout: float = 600,
) -> dict[str, Any]:
    cmd = [
        sys.executable,
        os.path.abspath(__file__),
        "--probe",
        "--table",
        table,
        "--kind",
        kind,
        "--n-buckets",
        str(n_buckets),
        "--keys-cold",
        keys_cold,
    ]
    if keys_warm:
        cmd += ["--keys-warm", keys_warm]
    if diag:
        cmd.append("--diag")
    env = dict(os.environ)
    env.pop("POLARS_VERBOSE", None)
    if diag:
        env["POLARS_VERBOSE"] = "1"
    t0 = time.perf_counter()
    cp = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout)
    wall = time.perf_counter() - t0
    line = next((ln for ln in cp.stdout.splitlines() if ln.startswith("@@RESULT@@")), None)
    if cp.returncode != 0 or line is None:
        return {"error": (cp.stderr or cp.stdout)[-2000:], "proc_wall_ms": wall * 1e3}
    res = json.loads(line[len("@@RESULT@@") :])
    res["proc_wall_ms"] = wall * 1e3
    if diag:
        res["polars_verbose"] = parse_polars_verbose(cp.stderr)
    return res


def parse_polars_verbose(err: str) -> dict[str, Any]:
    rg_read = rg_total = 0
    n_pp = 0
    for m in re.finditer(r"Predicate pushdown: reading (\d+) / (\d+) row groups", err):
        rg_read += int(m.group(1))
        rg_total += int(m.group(2))
        n_pp += 1
    files_init = re.findall(r"Readers init: (\d+) / \((\d+) total\).*?filtered out: (\d+)\)", err)
    skip = re.findall(r"skip files mask: (\S+)", err)
    num_files = re.findall(r"num_files: (\d+)", err)
    out: dict[str, Any] = {
        "rg_read": rg_read,
        "rg_total": rg_total,
        "files_with_rg_pruning_line": n_pp,
    }
    if files_init:
        out["readers_init_first"] = files_init[0]
    if num_files:
        out["delta_num_files"] = int(num_files[0])
    if skip:
        out["skip_files_mask"] = skip[0][:60]
    sk = re.findall(r"Predicate pushdown allows skipping (\d+) / (\d+) files", err)
    if sk:
        out["files_skipped"] = int(sk[-1][0])
        out["files_in_scan"] = int(sk[-1][1])
    # number of files actually opened by the multiscan
    out["files_opened"] = len(re.findall(r"\[MultiScan\]: Initialize source", err))
    return out


def med(xs: list[float | None]) -> float | None:
    vals = [x for x in xs if x is not None]
    return statistics.median(vals) if vals else None


# read paths per layout; "path:N" = only key sets of <= N keys (to keep the runtime bounded:
# these are already seconds per probe at 10k keys, or pyarrow row-group reads that are
# 5-10x slower than polars' once every row group is touched).
PATHS = {
    "A": ["pl_delta", "duckdb"],
    "B8k": ["pl_delta", "duckdb"],
    "B64k": ["pl_delta"],
    "C64": ["pl_delta:50", "pl_delta_bkt", "own_files:10000", "duckdb_bkt:10000"],
    "C256": ["pl_delta_bkt:10000", "own_files:10000", "duckdb_bkt:10000"],
    "D8k": ["pl_delta", "pl_parquet", "own_files", "own_rg:50", "delta_pred", "duckdb"],
    "D64k": ["pl_delta", "duckdb"],
}
TAIL_PATHS = ["pl_delta", "own_files", "duckdb"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=10_000_000)
    ap.add_argument("--batches", type=int, default=40)
    ap.add_argument("--dir", default="/tmp/layout_probe")
    ap.add_argument("--quick", action="store_true", help="1M-row smoke run")
    ap.add_argument("--keep", action="store_true", help="keep the generated data")
    ap.add_argument("--out", default="/tmp/layout_probe_results.json")
    ap.add_argument("--reps", type=int, default=3, help="fresh processes per cell (median)")
    ap.add_argument(
        "--reps-large", type=int, default=1, help="fresh processes per cell for the largest key set"
    )
    ap.add_argument(
        "--slow-ms",
        type=float,
        default=2500,
        help="a cell whose first cold probe is slower gets 1 run and no page-cache-evicted run",
    )
    ap.add_argument(
        "--paths",
        default="",
        help="override read paths for every layout (comma-separated), e.g. pl_delta,duckdb",
    )
    ap.add_argument("--layouts", default=",".join(LAYOUTS), help="comma-separated subset")
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument(
        "--build-only", action="store_true", help="write the layouts, no probes (implies --keep)"
    )
    # probe-process arguments
    ap.add_argument("--probe", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--table", help=argparse.SUPPRESS)
    ap.add_argument("--kind", help=argparse.SUPPRESS)
    ap.add_argument("--n-buckets", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--keys-cold", help=argparse.SUPPRESS)
    ap.add_argument("--keys-warm", help=argparse.SUPPRESS)
    ap.add_argument("--diag", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.probe:
        probe_main(args)
        return
    run(args)


def run(args: argparse.Namespace) -> None:
    import numpy as np
    import polars as pl

    t_start = time.perf_counter()
    if args.quick:
        args.rows = 1_000_000
    sizes = QUICK_PROBE_SIZES if args.quick else PROBE_SIZES
    layouts = [x for x in args.layouts.split(",") if x]
    root = Path(args.dir)
    if root.exists():
        shutil.rmtree(root)
    (root / "keys").mkdir(parents=True)
    rng = np.random.default_rng(args.seed)
    results: dict[str, Any] = {
        "rows": args.rows,
        "batches": args.batches,
        "sizes": list(sizes),
        "cpus": os.cpu_count(),
        "layouts": {},
        "cells": [],
        "writes": [],
    }

    log(f"generating {args.rows:,} rows over {args.batches} batches")
    t0 = time.perf_counter()
    full, key_s24, n_keys = generate(rng, args.rows, args.batches)
    results.update(
        gen_s=time.perf_counter() - t0,
        distinct_keys=n_keys,
        current_rows=None,
        table_rows=full.height,
    )
    log(f"  {full.height:,} rows, {n_keys:,} distinct keys, {time.perf_counter() - t0:.1f}s")

    # key samples: per size, per rep: cold and warm sets (distinct existing keys)
    key_files: dict[tuple[int, int, str], str] = {}
    for size in sizes:
        for rep in range(max(args.reps, 1) + 1):  # one spare set for the diag/evict runs
            for phase in ("c", "w"):
                ids = rng.choice(n_keys, size=size, replace=False)
                f = root / "keys" / f"k{size}_{rep}{phase}.parquet"
                pl.DataFrame({"k": s24_to_series("k", key_s24[ids])}).write_parquet(f)
                key_files[(size, rep, phase)] = str(f)

    for name in layouts:
        p = str(root / name)
        log(f"writing layout {name}")
        secs = build_layout(p, name, full, args.batches)
        facts = layout_facts(p)
        facts["write_s"] = secs
        results["layouts"][name] = facts
        log(
            f"  {name}: {facts['files']} files, {facts['row_groups']} row groups, "
            f"{facts['disk_mb']:.0f} MB, {secs:.1f}s"
        )

    if "A" in layouts:
        # a major compaction from the append log: read A, keep current rows, sort, write D8k
        from deltalake import write_deltalake

        log("major compaction A -> sorted run (8k row groups)")
        t0 = time.perf_counter()
        cur = (
            pl.scan_delta(str(root / "A"))
            .filter(pl.col("_batch") == pl.col("_batch").max().over(KEY))
            .filter(~pl.col("_deleted"))
            .sort(KEY)
            .collect()
        )
        write_deltalake(
            str(root / "_compacted"), to_arrow(cur, 8192), writer_properties=writer_props(8192)
        )
        results["compaction_s"] = time.perf_counter() - t0
        results["current_rows"] = cur.height
        del cur
        shutil.rmtree(root / "_compacted", ignore_errors=True)
        log(f"  {results['compaction_s']:.1f}s for {results['current_rows']:,} current rows")

    # write-cost batches (generated once; 60% updates of existing keys, 40% new keys)
    write_batches: dict[int, Any] = {}
    for wn in (10_000, 1_000_000 if not args.quick else 100_000):
        n_upd = int(wn * 0.6)
        upd = rng.choice(n_keys, size=n_upd, replace=False)
        new = np.arange(n_keys, n_keys + wn - n_upd)
        ids = np.concatenate([upd, new])
        extra = random_hex_keys(rng, wn - n_upd)
        ks = np.concatenate([key_s24, extra])
        bno = args.batches + len(write_batches)
        write_batches[wn] = make_rows(
            rng, ids, np.full(wn, bno), np.zeros(wn, bool), 10**12 + bno * 10**7, ks
        )
    del full

    def run_cell(layout: str, table: str, kind: str, size: int, extra_runs: bool) -> None:
        nb = LAYOUTS[layout.split("+")[0]][2]
        runs = []
        for rep in range(args.reps if size != sizes[-1] else min(args.reps, args.reps_large)):
            r = run_probe_proc(
                table, kind, nb, key_files[(size, rep, "c")], key_files[(size, rep, "w")]
            )
            runs.append(r)
            if "error" in r:
                break
            if rep == 0 and r["cold_ms"] > args.slow_ms:
                break
        cell: dict[str, Any] = {"layout": layout, "path": kind, "keys": size, "n": len(runs)}
        errs = [r["error"] for r in runs if "error" in r]
        if errs:
            cell["error"] = errs[0]
            log(f"  {layout:9s} {kind:13s} {size:>7,}  ERROR {errs[0][-300:]}")
            results["cells"].append(cell)
            return
        for k in (
            "open_ms",
            "cold_ms",
            "warm_ms",
            "refresh_ms",
            "proc_wall_ms",
            "import_s",
            "rss_base_mb",
            "rss_peak_mb",
        ):
            cell[k] = med([r.get(k) for r in runs])
        cell["cold_sums"] = [r["cold_sum"] for r in runs]
        cell["warm_sums"] = [r.get("warm_sum") for r in runs]
        cell["cold_stats"] = runs[0].get("cold_stats")
        cell["warm_stats"] = runs[0].get("warm_stats")
        spare = args.reps
        if extra_runs and (size == sizes[0] or (size == sizes[1] and layout.startswith("D"))):
            d = run_probe_proc(table, kind, nb, key_files[(size, spare, "c")], None, diag=True)
            cell["diag"] = {k: d.get(k) for k in ("cold_stats", "polars_verbose", "error")}
        if extra_runs and size == sizes[0] and runs[0]["cold_ms"] <= args.slow_ms:
            evict(table)
            e = run_probe_proc(table, kind, nb, key_files[(size, spare, "w")], None)
            cell["evicted_cold_ms"] = e.get("cold_ms")
            cell["evicted_proc_wall_ms"] = e.get("proc_wall_ms")
        results["cells"].append(cell)
        log(
            f"  {layout:9s} {kind:13s} {size:>7,}  cold {cell['cold_ms']:9.1f} ms  warm "
            f"{cell['warm_ms']:9.1f} ms  peak {cell['rss_peak_mb']:6.0f} MB  n={cell['n']}"
            + (f"  evicted {cell['evicted_cold_ms']:.0f} ms" if cell.get("evicted_cold_ms") else "")
        )

    if args.build_only:
        log(f"built in {time.perf_counter() - t_start:.0f}s; data kept under {root}")
        return
    for name in layouts:
        table = str(root / name)
        log(f"probing {name}")
        for spec in args.paths.split(",") if args.paths else PATHS[name]:
            kind, _, cap = spec.partition(":")
            for size in sizes:
                if not cap or size <= int(cap):
                    run_cell(name, table, kind, size, extra_runs=True)
        # write cost: one append batch of each size, in the layout's own way
        for wn, wdf in write_batches.items():
            before = layout_facts(table)
            t0 = time.perf_counter()
            write_batch(table, name, wdf)
            secs = time.perf_counter() - t0
            after = layout_facts(table)
            results["writes"].append(
                {
                    "layout": name,
                    "rows": wn,
                    "s": secs,
                    "files_added": after["files"] - before["files"],
                    "mb_added": after["disk_mb"] - before["disk_mb"],
                }
            )
            log(
                f"  append {wn:,} rows into {name}: {secs:.2f}s, +{after['files'] - before['files']} files"
            )
        if name == "D8k":
            log("probing D8k+tail (compacted base + the two appends)")
            results["layouts"]["D8k+tail"] = layout_facts(table)
            for kind in TAIL_PATHS:
                for size in sizes[:2]:
                    run_cell("D8k+tail", table, kind, size, extra_runs=False)
        if not args.keep:
            shutil.rmtree(table, ignore_errors=True)

    results["total_s"] = time.perf_counter() - t_start
    check_consistency(results)
    Path(args.out).write_text(json.dumps(results, indent=1, default=str))
    print_report(results)
    if not args.keep:
        shutil.rmtree(root, ignore_errors=True)
    log(f"done in {results['total_s']:.0f}s; results in {args.out}")


def check_consistency(results: dict[str, Any]) -> None:
    """All paths/layouts must return the same rows for the same key set (rep 0 cold)."""
    by: dict[int, dict[tuple[int, ...], list[str]]] = {}
    for c in results["cells"]:
        if "error" in c or c["layout"] == "D8k+tail":
            continue
        s = tuple(c["cold_sums"][0])
        by.setdefault(c["keys"], {}).setdefault(s, []).append(f"{c['layout']}/{c['path']}")
    results["consistency"] = {
        str(k): ("ok" if len(v) == 1 else {str(s): names for s, names in v.items()})
        for k, v in by.items()
    }


def fmt(x: Any, nd: int = 0) -> str:
    if x is None:
        return "-"
    if isinstance(x, float):
        return f"{x:,.{nd}f}"
    return str(x)


def read_counts(c: dict[str, Any]) -> str:
    """'files r/t, rg r/t, MB' from the diag run, where known."""
    d = c.get("diag") or {}
    st = d.get("cold_stats") or c.get("cold_stats") or {}
    pv = d.get("polars_verbose") or {}
    parts = []
    if c["path"].startswith("duckdb"):
        if st.get("rg_read") is not None:
            parts.append(f"rg {st['rg_read']}/{st['rg_total']}")
        if st.get("files_read") is not None:
            parts.append(f"files {st['files_read']}/{st.get('files_listed')}")
        if st.get("bytes_read") is not None:
            parts.append(f"{st['bytes_read'] / 2**20:.1f} MB")
    elif c["path"] == "own_rg":
        parts.append(f"files {st.get('files_read')}/{st.get('files_total')}")
        parts.append(
            f"rg key-pass {st.get('rg_key_pass')} full {st.get('rg_read')}/{st.get('rg_total_in_files')}"
        )
        if st.get("bytes_read_est") is not None:
            parts.append(f"~{st['bytes_read_est'] / 2**20:.1f} MB")
    else:
        if st.get("files_read") is not None:
            parts.append(
                f"files {st['files_read']}"
                + (f"/{st['files_total']}" if "files_total" in st else "")
            )
        elif pv.get("files_in_scan") is not None:
            n = pv["files_in_scan"]
            parts.append(f"files {n - pv.get('files_skipped', 0)}/{n}")
        if pv.get("rg_total"):
            parts.append(f"rg {pv['rg_read']}/{pv['rg_total']}")
    return ", ".join(parts) if parts else ("-" if c["keys"] > 10_000 else "n/a")


def print_report(results: dict[str, Any]) -> None:
    print()
    print(
        f"## layout_probe: {results['table_rows']:,} rows, {results['distinct_keys']:,} keys, "
        f"{results['batches']} batches, {results['cpus']} CPUs, total {results['total_s']:.0f}s"
    )
    print()
    print("| layout | files | row groups | overlapping rg pairs | disk MB | build s |")
    print("|---|---:|---:|---:|---:|---:|")
    for n, f in results["layouts"].items():
        print(
            f"| {n} | {f['files']} | {f['row_groups']} | {f.get('rg_overlaps')} | {f['disk_mb']:.0f} "
            f"| {fmt(f.get('write_s'), 1)} |"
        )
    print()
    print(
        "cold = fresh process: DeltaTable() + probe (ms, median; OS cache warm); "
        "proc = whole subprocess wall incl. interpreter+imports; evict = cold with table files "
        "evicted from page cache (1 run); warm = 2nd probe in-process (other keys); "
        "peak = VmHWM of the probe process (MB; after imports alone it is the 'base' in the JSON, "
        "~150-250 MB)."
    )
    print()
    print(
        "| layout | path | keys | cold ms | proc ms | evict ms | warm ms | refresh ms | peak MB | n | read (diag run) |"
    )
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---|")
    for c in results["cells"]:
        if "error" in c:
            print(
                f"| {c['layout']} | {c['path']} | {c['keys']:,} | ERROR | | | | | | | {c['error'][-80:]!r} |"
            )
            continue
        print(
            f"| {c['layout']} | {c['path']} | {c['keys']:,} | {fmt(c['cold_ms'])} | {fmt(c['proc_wall_ms'])} "
            f"| {fmt(c.get('evicted_cold_ms'))} | {fmt(c['warm_ms'], 1)} | {fmt(c['refresh_ms'], 1)} "
            f"| {fmt(c['rss_peak_mb'])} | {c['n']} | {read_counts(c)} |"
        )
    if results.get("compaction_s") is not None:
        print(
            f"major compaction (scan_delta A -> newest per key -> sort -> write 8k-row-group run): "
            f"{results['compaction_s']:.1f}s for {results['current_rows']:,} current rows"
        )
    print()
    print("| layout | append rows | seconds | files added | MB added |")
    print("|---|---:|---:|---:|---:|")
    for w in results["writes"]:
        print(
            f"| {w['layout']} | {w['rows']:,} | {w['s']:.2f} | {w['files_added']} | {w['mb_added']:.1f} |"
        )
    print()
    print(
        "consistency (same rows for same keys across layouts/paths):",
        json.dumps(results["consistency"]),
    )


if __name__ == "__main__":
    main()
