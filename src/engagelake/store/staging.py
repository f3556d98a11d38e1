"""A big batch's finished passes, staged to local files, so that memory follows the pass.

Held in memory until the commit, a batch's rows fragment the heap: a 1M-object batch into 1M
users held about 95 MiB more live rows per pass of 200k objects, and its process 400-450 MiB
more RSS (`docs/performance.md`). So once a batch holds enough changed rows, the workspace
stages them: each table's rows of the passes so far (the newest per key) go to one Arrow IPC
file of a temporary folder, and the batch state starts again over `StagedSource`, the store
snapshot overlaid with the staged rows. Probes by key take back only the staged rows they
need, by their place in the memory-mapped files. The commit reads every stage back in order,
one table at a time, and writes the batch as one (the store never sees a stage). A process
killed mid-batch leaves only its temporary folder, which the next batch that stages removes.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.ipc

from engagelake.store import scratch
from engagelake.store.runs import SORT_BY, sort_order
from engagelake.tables.changes import Changes
from engagelake.tables.partial import PARTIAL, SET, field_bits, fold_over, fold_pair
from engagelake.tables.schema import KEYS, SCHEMAS, read_back
from engagelake.tables.source import STAGED, RowSource

PREFIX = scratch.prefix("stages")  # then the owner's process ID
STAGE = "_stage"  # the stage a staged row came from: a later stage's row of a key wins
ROW = "_row"  # a staged row's place in its stage's file
POS = "_pos"  # a gathered row's place in the order asked for
STREAM_ROWS = 65_536  # rows per Arrow batch the commit writes


class Stages:
    """The stages of one batch, oldest first, in a temporary folder of their own; or, `in_memory`,
    as frames in memory (the in-memory layer's: `store/layer.py`, small batches whose reads of
    tiny files cost more than the rows they hold)."""

    def __init__(self, *, in_memory: bool = False) -> None:
        self.in_memory = in_memory
        self.folder = Path() if in_memory else scratch.make("stages")
        self._frames: dict[Path, pl.DataFrame] = {}  # in memory: each "file"'s rows
        # in memory: every stage's rows of a table with their stage, one frame of a chunk each
        # (a probe of a layer of many small batches then filters one frame, not a union of many)
        self._rows: dict[str, pl.DataFrame] = {}
        self.count = 0
        self.files: dict[str, list[tuple[int, Path]]] = {}  # per table: (stage, file)
        # keyed tables: each staged key with the stage and place of its newest row (tombstones
        # included); keys only, so they stay small beside the rows
        self.newest: dict[str, pl.DataFrame] = {}
        self._mapped: dict[tuple[str, int], pa.Table] = {}
        self.pairs: dict[str, list[Path]] = {}  # per index: pairs the store holds (see `add`)

    def add(self, changes: Changes, index_entries_stored: dict[str, pl.DataFrame]) -> None:
        """Stage `changes` (conformed rows with `_deleted`, as `Changes` holds them), and the
        index entries of the stored rows read so far (the commit leaves those out)."""
        n = self.count
        self.count += 1
        # unmapped, the pages a pass touched stop counting in the process's memory
        self._mapped.clear()
        for name, frames in changes.parts.items():
            key = KEYS[name]
            rows = pl.concat(frames) if key is None else changes.newest(name)
            if key is not None:
                if name in PARTIAL:
                    rows = self._fold_earlier(name, rows)
                mask = [SET] if name in PARTIAL else []  # probes tell partial rows by it
                staged = rows.select(*key, *mask, pl.lit(n, pl.Int32).alias(STAGE)).with_row_index(ROW)
                old = self.newest.get(name)
                self.newest[name] = staged if old is None else pl.concat(
                    [old.join(staged, on=list(key), how="anti"), staged])
            path = self.folder / f"{n:05d}-{name}.arrow"
            if self.in_memory:
                self._frames[path] = rows
                mine = rows.with_columns(pl.lit(n, pl.Int32).alias(STAGE))
                old_rows = self._rows.get(name)
                self._rows[name] = mine if old_rows is None else pl.concat([old_rows, mine], how="vertical_relaxed",
                                                                          rechunk=False)
            else:  # uncompressed, to be memory-mapped; plain strings, which pyarrow can take rows from
                rows.write_ipc(path, compression="uncompressed", compat_level=pl.CompatLevel.oldest())
            self.files.setdefault(name, []).append((n, path))
        for index, pairs in index_entries_stored.items():
            path = self.folder / f"{n:05d}-{index}.pairs.arrow"
            if self.in_memory:
                self._frames[path] = pairs
            else:
                pairs.write_ipc(path, compression="uncompressed")
            self.pairs.setdefault(index, []).append(path)

    def _scan(self, path: Path) -> pl.LazyFrame:
        frame = self._frames.get(path)
        return pl.scan_ipc(path) if frame is None else frame.lazy()

    def size_of(self, n: int) -> int:
        """About the bytes stage `n` holds."""
        paths = [path for files in self.files.values() for stage, path in files if stage == n]
        if self.in_memory:
            return int(sum(self._frames[path].estimated_size() for path in paths))
        return sum(path.stat().st_size for path in paths)

    def _fold_earlier(self, name: str, rows: pl.DataFrame) -> pl.DataFrame:
        """`rows` (one per key) with each partial row folded over its key's row in an earlier
        stage: a key's newest staged row is everything the batch did to it."""
        old = self.newest.get(name)
        if old is None:
            return rows
        key = list(KEYS[name] or ())
        partial = rows.filter(pl.col(SET).is_not_null())
        earlier = old.join(partial.select(key), on=key, how="semi")
        if earlier.height == 0:
            return rows
        before = self.gather(name, earlier.select(STAGE, ROW)).select(rows.columns)
        folded = fold_pair(name, before, partial)
        return pl.concat([rows.join(folded.select(key), on=key, how="anti"), folded])

    def partial_keys(self, name: str, column: str | None = None) -> pl.DataFrame:
        """The keys whose newest staged row is partial (and leaves `column` alone, if given)."""
        if name not in PARTIAL or name not in self.newest:
            return pl.DataFrame(schema={c: SCHEMAS[name][c] for c in KEYS[name] or ()})
        partial = pl.col(SET).is_not_null()
        if column is not None:
            partial &= (pl.col(SET) & field_bits(name)[column]) == 0
        return self.newest[name].filter(partial).select(KEYS[name] or ())

    def rows(self, name: str) -> pl.LazyFrame | None:
        """Every staged row of `name` with its stage, oldest first (None: nothing staged)."""
        files = self.files.get(name)
        if not files:
            return None
        if self.in_memory:
            return self._rows[name].lazy()
        return pl.concat([self._scan(path).with_columns(pl.lit(n, pl.Int32).alias(STAGE)) for n, path in files])

    def gather(self, name: str, places: pl.DataFrame) -> pl.DataFrame:
        """The staged rows of `name` at `places` (`STAGE`, `ROW`), in the order of `places`,
        from the memory-mapped files: only the rows taken are copied."""
        parts = []
        for (n,), rows in places.with_row_index(POS).group_by(STAGE):
            assert isinstance(n, int)
            taken = pl.from_arrow(self._table(name, n).take(rows[ROW].to_arrow()))
            assert isinstance(taken, pl.DataFrame)
            parts.append(taken.with_columns(rows[POS]))
        if not parts:
            mask = {SET: pl.Int64()} if name in PARTIAL else {}
            return pl.DataFrame(schema={**SCHEMAS[name], "_deleted": pl.Boolean(), **mask})
        return pl.concat(parts, how="vertical_relaxed").sort(POS).drop(POS)

    # --- what the commit takes from the stages ---------------------------------------------------
    def streamed(self) -> set[str]:
        """The staged tables the commit streams in their files' order (the sorted ones); the
        others are small and go through `changes()`."""
        return {name for name in self.files if name in SORT_BY}

    def stream(self, name: str, batch_no: int, schema: pa.Schema) -> pa.RecordBatchReader:
        """The rows the commit writes of a streamed table: for a keyed table each key's newest
        row (tombstones included), for a log every row; sorted as its files keep them, in
        batches of `STREAM_ROWS` rows cast to `schema` (the stored one, with `_batch`). Only
        the places are sorted in memory; each batch's rows are taken from the files as it goes."""
        order = sort_order(name, KEYS[name])
        assert order is not None
        if KEYS[name] is not None:
            places = self.newest[name]
        else:  # a log's rows in stage order: the sort keeps it among equal users and sequences
            places = pl.concat([
                self._scan(path).select(order).with_row_index(ROW).with_columns(pl.lit(n, pl.Int32).alias(STAGE))
                for n, path in self.files[name]]).collect()
        places = places.sort(order, maintain_order=True, nulls_last=True).select(STAGE, ROW)

        def batches() -> Iterator[pa.RecordBatch]:
            # every stage's file as one table (its chunks, not copied): a row is taken by its
            # place in it, in Arrow, already in the written order (through Polars and back, the
            # take cost a third more: 0.73-0.80 against 0.47-0.50 s for 625,000 rows)
            stages = [n for n, _ in self.files[name]]
            tables = [self._table(name, n) for n in stages]
            whole = pa.concat_tables(tables, promote_options="permissive")
            starts = np.zeros(max(stages) + 1, dtype=np.int64)
            starts[stages] = np.cumsum([0, *(t.num_rows for t in tables[:-1])])
            for chunk in places.iter_slices(STREAM_ROWS):
                at = starts[chunk[STAGE].to_numpy()] + chunk[ROW].to_numpy()
                rows = whole.take(pa.array(at))
                stamp = pa.array(np.full(rows.num_rows, batch_no, dtype=np.int64))
                rows = (rows.set_column(rows.column_names.index("_batch"), "_batch", stamp)
                        if "_batch" in rows.column_names else rows.append_column("_batch", stamp))
                yield from rows.select(schema.names).cast(schema).to_batches()
            for n in stages:
                self._mapped.pop((name, n), None)

        return pa.RecordBatchReader.from_batches(schema, batches())

    def _table(self, name: str, n: int) -> pa.Table:
        """Stage `n`'s file of `name`, memory-mapped (kept until the stage is unmapped)."""
        if (name, n) not in self._mapped:
            path = self.folder / f"{n:05d}-{name}.arrow"
            if (frame := self._frames.get(path)) is not None:
                self._mapped[(name, n)] = frame.to_arrow(compat_level=pl.CompatLevel.oldest())
            else:
                self._mapped[(name, n)] = pa.ipc.open_file(pa.memory_map(str(path))).read_all()
        return self._mapped[(name, n)]

    def upserted(self, name: str, columns: list[str]) -> pl.DataFrame:
        """`columns` of the rows the commit writes of a streamed keyed table, tombstones left
        out (for the new index entries)."""
        newest = self.newest[name]
        parts = [self._scan(path).select(*columns, "_deleted").with_row_index(ROW)
                 .join(newest.lazy().filter(pl.col(STAGE) == n).select(ROW), on=ROW, how="semi")
                 .filter(~pl.col("_deleted")).select(columns)
                 for n, path in self.files[name]]
        return pl.concat(parts).collect()

    def changes(self) -> Changes:
        """The staged changes of the tables not streamed, in stage order, read when the commit
        merges their table."""
        streamed = self.streamed()
        return Changes(earlier={name: [self._scan(path) for _, path in files]
                                for name, files in self.files.items() if name not in streamed})

    def index_entries_stored(self) -> dict[str, list[pl.DataFrame]]:
        return {index: [self._frames[path] if self.in_memory else pl.read_ipc(path) for path in paths]
                for index, paths in self.pairs.items()}

    def remove(self) -> None:
        self._mapped.clear()
        if not self.in_memory:  # in memory, the frames go with the last reader still holding them
            shutil.rmtree(self.folder, ignore_errors=True)


class StagedSource:
    """`base` (the store snapshot) with the staged rows over it: a staged key's newest staged
    row replaces its stored rows (a staged tombstone hides them), staged log rows follow the
    stored ones. Rows carry `STAGED`, so the batch state tells them from stored rows (the
    store's indexes hold only the latter). Implements `RowSource`."""

    def __init__(self, base: RowSource, stages: Stages):
        self.base = base
        self.stages = stages

    def _current(self, name: str, rows: pl.LazyFrame) -> pl.LazyFrame:
        """The staged rows that are their key's newest, deleted ones dropped."""
        key = KEYS[name]
        if key is None:  # a log: every row, in stage order
            return rows.sort(STAGE, maintain_order=True).drop(STAGE, "_deleted")
        newest = self.stages.newest[name].lazy().drop(ROW)
        return (rows.join(newest, on=[*key, STAGE], how="semi")
                .filter(~pl.col("_deleted")).drop(STAGE, "_deleted"))

    def _stored(self, name: str, stored: pl.LazyFrame) -> pl.LazyFrame:
        """Stored rows, less those of keys the batch staged."""
        key = KEYS[name]
        if key is None or name not in self.stages.newest:
            return stored
        return stored.join(self.stages.newest[name].select(key).lazy(), on=list(key), how="anti")

    def holds(self, name: str) -> bool:
        return self.base.holds(name) or bool(self.stages.files.get(name))

    def rows(self, name: str) -> int:
        return self.base.rows(name)

    def probe(self, name: str, column: str, values: pl.Series, held: pl.DataFrame | None = None) -> pl.DataFrame:
        staged = self.stages.rows(name)
        if staged is None:
            return self.base.probe(name, column, values, held)
        key = KEYS[name]
        if key is not None and column not in key:
            # a secondary probe need not read the stored rows of keys whose staged row
            # decides the column (whole rows, and partial ones that set it)
            keys = self.stages.newest[name].select(key).join(
                self.stages.partial_keys(name, column), on=list(key), how="anti")
            held = keys if held is None else pl.concat([held.select(key), keys])
        found = self.base.probe(name, column, values, held)
        stored = self._stored(name, found.lazy()).collect()
        if key is not None and column in key:  # the newest staged rows by their places
            places = self.stages.newest[name].filter(pl.col(column).is_in(values.implode()))
            mine = self.stages.gather(name, places).filter(~pl.col("_deleted")).drop("_deleted")
        else:
            mine = self._current(name, staged.filter(pl.col(column).is_in(values.implode()))).collect()
            if key is not None and name in PARTIAL:
                # stored rows found whose staged row is partial and leaves the column alone
                under = found.join(self.stages.partial_keys(name, column), on=list(key), how="semi")
                if under.height:
                    places = self.stages.newest[name].join(under.select(key), on=list(key), how="semi")
                    mine = pl.concat([mine, self.stages.gather(name, places).drop("_deleted")])
        if name in PARTIAL:
            mine = self._fold_partial(name, mine, found)
        return pl.concat([stored.with_columns(pl.lit(False).alias(STAGED)),
                          mine.select(read_back(name)).with_columns(pl.lit(True).alias(STAGED))],
                         how="vertical_relaxed")

    def _fold_partial(self, name: str, mine: pl.DataFrame, found: pl.DataFrame) -> pl.DataFrame:
        """Staged rows with their partial rows folded over the stored rows of their keys
        (`found`: stored rows the probe read; the others are read by key now)."""
        partial = mine.filter(pl.col(SET).is_not_null())
        if partial.height == 0:
            return mine
        key = list(KEYS[name] or ())
        under = found.join(partial.select(key), on=key, how="semi")
        missing = partial.join(under.select(key), on=key, how="anti")
        if missing.height:
            under = pl.concat([under, self.base.probe(name, key[0], missing[key[0]])], how="vertical_relaxed")
        return pl.concat([mine.filter(pl.col(SET).is_null()).drop(SET), fold_over(name, under, partial)],
                         how="vertical_relaxed")

    def scan(self, name: str) -> pl.LazyFrame:
        staged = self.stages.rows(name)
        if staged is None:
            return self.base.scan(name)
        stored = self._stored(name, self.base.scan(name))
        mine = self._current(name, staged)
        if name in PARTIAL:  # partial staged rows fold over their stored rows
            key = list(KEYS[name] or ())
            partial = mine.filter(pl.col(SET).is_not_null())
            under = self.base.scan(name).join(partial.select(key), on=key, how="semi")
            mine = pl.concat([mine.filter(pl.col(SET).is_null()).drop(SET), fold_over(name, under, partial)],
                             how="vertical_relaxed")
        return pl.concat([stored.with_columns(pl.lit(False).alias(STAGED)),
                          mine.select(list(SCHEMAS[name])).with_columns(pl.lit(True).alias(STAGED))],
                         how="vertical_relaxed")
