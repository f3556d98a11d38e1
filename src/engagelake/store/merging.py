"""Merging sorted runs, so that a probe opens few files however many batches wrote the store.

Every batch adds a run (a sorted file) to each table it changes. A probe pays per run, so runs
are merged as they accumulate, the way Apache Paimon's universal compaction and RocksDB's
size-tiered compaction do: once a table holds more than `MERGE_TRIGGER` runs besides its newest,
the newest run is merged with the next ones, taking each next older run while it holds at most
`SIZE_RATIO` times the rows gathered so far. Runs then grow geometrically: a table of N rows
written in batches of B rows keeps about log2(N/B) runs beyond the trigger, and each row is
rewritten about that many times. A small batch into a big store merges only with other small
runs; the big run at the bottom is rewritten only when as many rows have piled up above it.

Merging follows the batch's commit, off its latency (in a thread, as Paimon compacts
asynchronously): the merged run replaces, in one Delta commit per table, exactly the rows whose
`_batch` is at or after the first merged batch (a predicate overwrite), and a ledger row of kind
"merge" publishes them. The merge streams through DuckDB within the store's memory budget: a
merge into the bottom run is as big as the table, and it must not hold the table in memory.
"""

from __future__ import annotations

import shutil
import weakref
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson
import polars as pl
import pyarrow as pa

from engagelake.connections import kept
from engagelake.store import scratch
from engagelake.tables.partial import PARTIAL, SET, field_bits

if TYPE_CHECKING:
    import duckdb  # imported where used: a process that only reads never loads it

MERGE_TRIGGER = 4  # runs a table may hold besides its newest before a merge
SIZE_RATIO = 2  # a merge takes the next older run while it holds <= this times the rows so far
STREAM_ROWS = 65_536  # rows per Arrow batch between DuckDB and the Delta writer
DEFAULT_MEMORY = "1GB"  # DuckDB's budget for a merge or compaction when the store sets none


@dataclass(frozen=True)
class Run:
    """Data files written together: their rows come from batches first..last."""

    first: int
    last: int
    rows: int
    files: tuple[str, ...]
    partial: bool = True  # whether a file may hold partial rows (`tables/partial.py`)


def partial_files(actions: pl.DataFrame) -> pl.Series:
    """Per add action: whether its file may hold partial rows, by the statistics of the mask
    column (a file written before it, or of another table, has none; a file without
    statistics may)."""
    if "min._set" not in actions.columns:
        return actions["num_records"].is_null() if "num_records" in actions.columns else pl.Series(
            [True] * actions.height)
    return actions.select(pl.col("min._set").is_not_null() | pl.col("num_records").is_null()).to_series()


def runs_of(actions: pl.DataFrame, root: str) -> list[Run]:
    """The runs of one table version, newest first, from its Delta add actions (one row per
    file: `path`, `num_records`, `min._batch`, `max._batch`). Files whose batch ranges overlap
    belong to one run; a file without statistics makes its table unmergeable (no runs)."""
    if actions.height == 0 or "min._batch" not in actions.columns or actions["min._batch"].null_count():
        return []
    files = actions.sort("min._batch", descending=True)
    runs: list[Run] = []
    columns = files.select("path", "num_records", "min._batch", "max._batch").with_columns(
        partial=partial_files(files))
    for path, rows, first, last, partial in columns.iter_rows():  # one row per data file (few), not per row
        uri = f"{root.rstrip('/')}/{path}"
        if runs and last >= runs[-1].first:
            prev = runs[-1]
            runs[-1] = Run(min(first, prev.first), max(last, prev.last), prev.rows + rows, (*prev.files, uri),
                           prev.partial or partial)
        else:
            runs.append(Run(first, last, rows, (uri,), partial))
    return runs


def run_of_add(add: dict[str, Any], root: str) -> Run | None:
    """The run of one file an append just wrote, from its add action (`runs_of` of that one
    file, without building a frame of its statistics: 1 ms a table in a small batch's commit);
    None for a file without batch statistics."""
    stats = orjson.loads(add["stats"]) if add.get("stats") else {}
    low, high = stats.get("minValues", {}).get("_batch"), stats.get("maxValues", {}).get("_batch")
    if low is None or high is None or stats.get("numRecords") is None:
        return None
    return Run(low, high, stats["numRecords"], (f"{root.rstrip('/')}/{add['path']}",),
               stats["minValues"].get(SET) is not None)


def plan(runs: list[Run], batch_rows: int, *, trigger: int = MERGE_TRIGGER,
         ratio: float = SIZE_RATIO) -> list[Run]:
    """The runs (newest first) a run of `batch_rows` rows merges with: none while `runs` are at
    most `trigger`; else each next older run while it is at most `ratio` times the rows
    gathered so far."""
    if len(runs) <= trigger:
        return []
    gathered, taken = batch_rows, 0
    for run in runs:
        if run.rows > ratio * gathered:
            break
        gathered += run.rows
        taken += 1
    return runs[:taken]


def merge_sql(name: str, columns: list[str], key: tuple[str, ...] | None, order: list[str], source: str, *,
              since: int, bottom: bool, fold: bool = True) -> str:
    """DuckDB SQL for the merged run: the rows of `source` (the runs' files, as `read_files` or
    a registered dataset reads them) from batch `since` on, the newest row
    per key with partial rows folded in (`fold`: the files may hold some), tombstones dropped
    when the merge reaches the bottom run (where nothing older can be shadowed), in `order`."""
    cols = ", ".join(f'"{c}"' for c in columns)
    rows = f"SELECT {cols} FROM {source} WHERE _batch >= {since}"
    by = ", ".join(f'"{c}"' for c in order)
    if key is None:
        return f"SELECT {cols} FROM ({rows}) ORDER BY {by}"
    newest = newest_sql(name, columns, key, rows, fold=fold)
    return f"SELECT {cols} FROM ({newest})" + (" WHERE NOT _deleted" if bottom else "") + f" ORDER BY {by}"


def read_files(files: list[str], *, partial: bool) -> str:
    """DuckDB's reader of `files`; those of a `PARTIAL` table may lack the mask column (files
    written before it), which then reads as null."""
    listed = ", ".join(sql_text(f) for f in files)
    return f"read_parquet([{listed}], union_by_name = true)" if partial else f"read_parquet([{listed}])"


def newest_sql(name: str, columns: list[str], key: tuple[str, ...], rows: str, *, fold: bool = True) -> str:
    """DuckDB SQL for the newest row per key of `rows` (each batch writes a key at most once, so
    `_batch` orders a key's rows). For a `PARTIAL` table whose rows may hold partial ones
    (`fold`) each field comes from the newest row that sets it (`tables/partial.py`): a whole
    row (mask null) sets every field. Without them the newest row is the current one, cheaper."""
    keys = ", ".join(f'"{k}"' for k in key)
    if name not in PARTIAL or not fold:
        return f"SELECT * FROM ({rows}) QUALIFY row_number() OVER (PARTITION BY {keys} ORDER BY _batch DESC) = 1"
    bits = field_bits(name)
    picks = []
    for c in columns:
        if c in key:
            continue
        if c in bits:
            picks.append(f'arg_max_null("{c}", _batch) FILTER (WHERE _set IS NULL OR (_set & {bits[c]}) <> 0) AS "{c}"')
        elif c == "_deleted":  # only whole rows delete
            picks.append('coalesce(arg_max_null(_deleted, _batch) FILTER (WHERE _set IS NULL), false) AS _deleted')
        elif c == SET:
            picks.append("CASE WHEN bool_or(_set IS NULL) THEN NULL ELSE bit_or(_set) END AS _set")
        else:
            picks.append(f'max("{c}") AS "{c}"')  # _batch
    return f"SELECT {keys}, {', '.join(picks)} FROM ({rows}) GROUP BY {keys}"


@contextmanager
def connection(memory_limit: str | None) -> Iterator[duckdb.DuckDBPyConnection]:
    """A DuckDB connection that spills beyond `memory_limit` (default `DEFAULT_MEMORY`) to a
    private temporary folder, removed with the connection."""
    with scratch.folder("duckdb") as spill:  # a killed process's folder is swept by the next one
        con = _connect(memory_limit, spill)
        try:
            yield con
        finally:
            con.close()


def kept_connection(memory_limit: str | None) -> AbstractContextManager[duckdb.DuckDBPyConnection]:
    """`connection`, kept by the calling thread between uses (`connections.kept`): a run merge
    after a small batch paid 24-27 ms to open a new database. Its spill folder (empty between
    queries) goes with the connection, at the latest when the process exits; the next process
    sweeps a killed one's."""
    def make() -> duckdb.DuckDBPyConnection:
        spill = scratch.make("duckdb")
        con = _connect(memory_limit, spill)
        weakref.finalize(con, shutil.rmtree, spill, True)  # (finalizers also run at exit)
        return con

    return kept(("merges", memory_limit or DEFAULT_MEMORY), make)


def _connect(memory_limit: str | None, spill: Path) -> duckdb.DuckDBPyConnection:
    import duckdb
    config: dict[str, str | bool | int | float | list[str]] = {
        "temp_directory": str(spill), "memory_limit": memory_limit or DEFAULT_MEMORY}
    con = duckdb.connect(config=config)
    con.execute("SET enable_progress_bar = false")  # a library does not draw DuckDB's bars into logs
    return con


def stream(con: duckdb.DuckDBPyConnection, sql: str, schema: pa.Schema) -> pa.RecordBatchReader:
    """The query's rows as Arrow batches cast to the table's stored schema (DuckDB gives its
    own string, list and time zone types)."""
    reader = con.sql(sql).to_arrow_reader(STREAM_ROWS)

    def batches() -> Iterator[pa.RecordBatch]:
        for batch in reader:
            yield batch.cast(schema)

    return pa.RecordBatchReader.from_batches(schema, batches())


def sql_text(value: str) -> str:
    """`value` as a SQL string literal."""
    return "'" + value.replace("'", "''") + "'"
