"""A read-only view of the stored tables at one committed head (`DeltaStore.snapshot`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import polars as pl

from engagelake.store import merging, objects
from engagelake.store.layout import Head, arrow_schema, files_source, stored_schema
from engagelake.store.runs import (
    FILE_STATS_MAX_VALUES,
    SORT_BY,
    files_holding,
    range_bounds,
    read_range,
    read_where,
)
from engagelake.store.versions import TableVersions
from engagelake.tables.partial import PARTIAL, newest
from engagelake.tables.schema import HISTORY, INDEX_OF, KEYS, SCHEMAS, TABLES, empty, read_back

if TYPE_CHECKING:
    import duckdb  # imported where used: a process that only reads never loads it


class Snapshot:
    """The stored tables at one committed head, read on demand: a probe by a table's sort
    column reads only the row groups that can hold its values (`store/runs.py`); other probes
    scan one column with predicate pushdown; scans are lazy. Implements `RowSource`."""

    def __init__(self, store: TableVersions, head: Head):
        self.store = store
        self.head = head

    def files(self, name: str) -> list[str]:
        """The data files of `name` at this head (each table version's log is read once)."""
        return self.store.files(name, self.head.versions.get(name))

    def holds(self, name: str) -> bool:
        return bool(self.files(name))

    def rows(self, name: str) -> int:
        version = self.head.versions.get(name)
        return 0 if version is None or not self.files(name) else self.store.stored_rows(name, version)

    def stored(self, name: str) -> pl.LazyFrame | None:
        files = self.files(name)
        return objects.scan_parquet(files, stored_schema(name)) if files else None

    def scan(self, name: str) -> pl.LazyFrame:
        rows = self.stored(name)
        if rows is None:
            return empty(name).lazy()
        key = KEYS[name]
        rows = rows.sort("_batch", maintain_order=True)
        if key is not None:
            rows = newest(name, rows).filter(~pl.col("_deleted"))
        return rows.select(list(SCHEMAS[name]))

    def _read_where(self, name: str, column: str, values: pl.Series,
                    columns: list[str] | None = None) -> pl.DataFrame:
        """Stored rows (all versions) of `name` whose `column` is one of `values`, in
        `columns` (None: all): by fence pointers on the sort column, else a scan of that
        column with predicate pushdown."""
        if column == SORT_BY.get(name):
            files = self.files(name)
            if len(files) > 1 and values.len() <= FILE_STATS_MAX_VALUES:
                files = files_holding(files, self.store.file_ranges(name, self.head.versions[name], column), values)
            return read_where(files, column, values, self.store.footers, stored_schema(name), columns)
        self.store.column_scans.append((name, column))
        rows = self.stored(name)
        assert rows is not None
        rows = rows.filter(pl.col(column).is_in(values.implode()))
        return (rows if columns is None else rows.select(columns)).collect()

    def probe(self, name: str, column: str, values: pl.Series, held: pl.DataFrame | None = None) -> pl.DataFrame:
        if not self.files(name) or values.len() == 0:
            return empty(name).select(read_back(name))
        key = KEYS[name]
        if key is None:
            hits = self._read_where(name, column, values, [*read_back(name), "_batch"])
            return hits.sort("_batch", maintain_order=True).select(read_back(name))
        if column in key:  # every row of a matching key matches: one pass
            hits = self._read_where(name, column, values)
        else:  # a secondary column: the keys that ever had the value, then their newest rows
            index = INDEX_OF.get((name, column))
            if index is not None and index in self.head.versions:
                keys = self.probe(index, column, values).select(key).unique()
            else:  # no index (a store older than it, until compaction): scan the column
                keys = self._read_where(name, column, values).select(key).unique()
            if held is not None and held.height:  # the caller has their rows: not read again
                keys = keys.join(held, on=list(key), how="anti")
            lead = SORT_BY.get(name, key[0])
            hits = self._read_where(name, lead, keys[lead]).join(keys, on=list(key), how="semi")
        current = newest(name, hits.sort("_batch", maintain_order=True)).filter(~pl.col("_deleted"))
        if column not in key:
            current = current.filter(pl.col(column).is_in(values.implode()))
        return current.select(list(SCHEMAS[name]))

    def key_ranges(self, name: str, rows: int) -> list[tuple[str, str | None]]:
        """Ranges [low, high) of `name`'s sort column, about `rows` stored rows each (the last
        up to half as many more), that together cover every value (the last has no end)."""
        column = SORT_BY[name]
        cuts = range_bounds(self.files(name), column, rows, self.store.footers)
        lows = ["", *cuts]
        return list(zip(lows, [*cuts, None], strict=True))

    def in_range(self, name: str, low: str, high: str | None) -> pl.DataFrame:
        """Current rows of `name` whose sort column lies in [low, high)."""
        key = KEYS[name]
        assert key is not None and SORT_BY[name] in key, "ranges are of keyed, sorted tables"
        if not self.files(name):
            return empty(name)
        hits = read_range(self.files(name), SORT_BY[name], low, high, self.store.footers, stored_schema(name))
        return (
            newest(name, hits.sort("_batch", maintain_order=True))
            .filter(~pl.col("_deleted"))
            .select(list(SCHEMAS[name]))
        )

    def current(self, name: str) -> pl.LazyFrame:
        """What readers see of `name`: current rows, and for the event and purchase logs the
        history of merged profiles moved to the survivor (deleted profiles' history dropped)."""
        rows = self.scan(name)
        if name not in HISTORY:
            return rows
        redirects = self.scan("redirects").select("service_id", "into", _redirected=pl.lit(True))
        return (
            rows.join(redirects, on="service_id", how="left", maintain_order="left")
            .filter(pl.col("_redirected").is_null() | pl.col("into").is_not_null())
            .with_columns(service_id=pl.coalesce("into", "service_id"))
            .drop("into", "_redirected")
        )

    def duckdb(self, con: duckdb.DuckDBPyConnection, tables: tuple[str, ...] = TABLES) -> duckdb.DuckDBPyConnection:
        """Views of every table's current rows (or those of `tables`; a history log's needs
        `redirects`) in `con`, read by DuckDB's own Parquet reader (it streams, prunes and
        spills within the connection's memory_limit)."""
        for name in sorted(tables, key=lambda n: n in HISTORY):  # history views read redirects
            files = self.files(name)
            if not files:
                con.register(f"_empty_{name}", empty(name).to_arrow())
                con.execute(f'CREATE OR REPLACE VIEW "{name}" AS SELECT * FROM "_empty_{name}"')
                continue
            columns = ", ".join(f'"{c}"' for c in SCHEMAS[name])
            raw = files_source(con, name, files, arrow_schema(name), partial=name in PARTIAL, local=self.store.local)
            key = KEYS[name]
            if key is None:
                body = f"SELECT {columns} FROM {raw} ORDER BY _batch"
            else:
                fold = self.store.holds_partial_rows(name, self.head.versions.get(name))
                newest_rows = merging.newest_sql(name, list(stored_schema(name)), key, f"SELECT * FROM {raw}",
                                                 fold=fold)
                body = f"SELECT {columns} FROM ({newest_rows}) WHERE NOT _deleted"
            if name in HISTORY:
                con.execute(f'CREATE OR REPLACE VIEW "_stored_{name}" AS {body}')
                body = (f'SELECT h.* REPLACE (coalesce(r."into", h.service_id) AS service_id) '
                        f'FROM "_stored_{name}" h LEFT JOIN redirects r USING (service_id) '
                        f'WHERE r.service_id IS NULL OR r."into" IS NOT NULL')
            con.execute(f'CREATE OR REPLACE VIEW "{name}" AS {body}')
        return con
