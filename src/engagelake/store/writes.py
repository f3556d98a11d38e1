"""Table writes under the writer lock: a batch's rows of one table appended as a sorted run
(a Parquet file and a log entry of engagelake's own where it can, delta-rs elsewhere), the
appends of one commit side by side, and each table's newest version kept between writes.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from concurrent.futures import FIRST_EXCEPTION, Future, ThreadPoolExecutor
from concurrent.futures import wait as wait_for
from functools import cache

import polars as pl
import pyarrow as pa
from deltalake import CommitProperties, DeltaTable, WriterProperties

from engagelake.errors import StoreError
from engagelake.store import appends, layout, objects
from engagelake.store.layout import (
    CRASH_ENV,
    LEDGER,
    SIDE_BY_SIDE,
    Head,
    OnPlace,
    Place,
    arrow_schema,
    file_options,
    stored_schema,
    writer,
)
from engagelake.store.runs import ROW_GROUP_ROWS, SORT_BY, sort_for_write
from engagelake.store.versions import TableVersions
from engagelake.tables.partial import PARTIAL
from engagelake.tables.schema import KEYS

# A batch's run of at least this many rows gets its footer index and Bloom filter before the
# batch commits, as merged runs do after their merge: a probe of a key the run lacks then skips
# it instead of reading the row group its fences name. Below it, a probe reads a few row groups
# at most, and indexing would cost every small commit (a 1,024-row file: 2.8 ms).
INDEXED_RUN_ROWS = 8 * ROW_GROUP_ROWS


def batch_rows(name: str, ups: pl.DataFrame | None, dels: pl.DataFrame | None, batch_no: int) -> pl.DataFrame:
    """A batch's rows of one table as stored: upserts, then tombstones of deleted keys."""
    parts = []
    if ups is not None:
        parts.append(ups.with_columns(_batch=pl.lit(batch_no, pl.Int64), _deleted=pl.lit(False)))
    if dels is not None:
        parts.append(dels.with_columns(_batch=pl.lit(batch_no, pl.Int64), _deleted=pl.lit(True)))
    return pl.concat(parts, how="diagonal_relaxed").select(
        [pl.col(c).cast(t) if c in parts[0].columns or c in parts[-1].columns else pl.lit(None).cast(t).alias(c)
         for c, t in stored_schema(name).items()])


def columns(rows: pl.DataFrame | None, columns: list[str]) -> pl.DataFrame | None:
    return None if rows is None else rows.select(columns)


WRITE_THREADS = min(2, os.cpu_count() or 1)  # tables a commit writes at once


@cache
def _write_pool() -> ThreadPoolExecutor:
    return ThreadPoolExecutor(max_workers=WRITE_THREADS, thread_name_prefix="engagelake-writes")


class TableWrites:
    """A commit's table appends, run side by side: each encodes its Parquet in one thread
    (pyarrow, without the GIL), and P1's commit wrote five big tables one after another (2.3 s
    of its 3.6 s). The appends are independent Delta commits; the ledger row after them makes
    them visible together, so their order does not matter to a reader, nor to a crash (a table
    ahead of the ledger is rolled back, whichever). Under a crash failpoint they run one by one
    in the fixed order, so that a failpoint names a point between two tables (unless it says
    `SIDE_BY_SIDE`: then the process dies with the other write running)."""

    def __init__(self, writer: TableWriter, versions: dict[str, int]):
        self.writer = writer
        self.versions = versions  # each write sets its own table's entry
        point = os.environ.get(CRASH_ENV)
        self.serial = WRITE_THREADS < 2 or (point is not None and not point.startswith(SIDE_BY_SIDE))
        self.running: list[Future[None]] = []

    def write(self, name: str, rows: Callable[[], pl.DataFrame | pa.RecordBatchReader]) -> None:
        if self.serial:
            self.writer.write_rows(name, rows(), self.versions)
        else:
            self.running.append(_write_pool().submit(lambda: self.writer.write_rows(name, rows(), self.versions)))

    def wait(self) -> None:
        """Wait for every write, then raise the first one's error. Once one failed, the writes
        not started are cancelled."""
        errors = [error for future in self._ended()
                  if not future.cancelled() and (error := future.exception()) is not None]
        if errors:
            raise errors[0]

    def abandon(self) -> None:
        """Cancel the writes not started and wait for the others (the batch failed already:
        their errors go unseen)."""
        for future in self.running:
            future.cancel()
        self._ended()

    def _ended(self) -> list[Future[None]]:
        """The writes, once every one has ended; those not started are cancelled once one failed.
        An interrupt (Ctrl-C) does not cut the wait short, but cancels what has not started and
        is raised after: the writer lock must not be let go while a table is being appended."""
        running, self.running = self.running, []
        pending: set[Future[None]] = set(running)
        interrupt: BaseException | None = None
        while pending:
            try:
                done, pending = wait_for(pending, return_when=FIRST_EXCEPTION)
            except BaseException as error:  # noqa: BLE001 - raised below, once the writes ended
                interrupt, done = interrupt or error, set()
            failed = any(not f.cancelled() and f.exception() is not None for f in done)
            if interrupt is not None or failed:
                for future in pending:
                    future.cancel()
        if interrupt is not None:
            raise interrupt
        return running


class TableWriter(OnPlace):
    """Appends to a store's tables, each at the version after its newest (only a writer holding
    the store's lock calls it); notes what it wrote in `versions` for the next reads."""

    def __init__(self, place: Place, versions: TableVersions, head: Callable[[], Head]):
        self.place = place
        self.versions = versions
        self._head = head  # the store's current head: the versions the ledger names
        self._written: dict[str, DeltaTable] = {}  # each table at its newest version, for writes (`latest`)
        self._heads: dict[str, tuple[int, frozenset[str]]] = {}  # each table's newest version and columns (`newest`)
        self.runs_to_index: list[tuple[str, str]] = []  # (table, file) of the batch being written

    def forget(self, name: str) -> None:
        """Forget the newest version kept of `name`: a roll-back took it."""
        self._heads.pop(name, None)
        self._written.pop(name, None)

    def forget_newest(self, name: str) -> None:
        """Forget the newest version and columns kept of `name` (another write moved it)."""
        self._heads.pop(name, None)

    def keep_newest(self, name: str, version: int, columns: frozenset[str]) -> None:
        """`name` is at `version`, with `columns`, by a write of this process."""
        self._heads[name] = (version, columns)

    def keep_table(self, name: str, table: DeltaTable) -> None:
        """`table` is `name` at its newest version, written by this process (`latest`)."""
        self._written[name] = table

    def latest(self, name: str) -> DeltaTable:
        """A table at its newest version, for a write under the writer lock: kept from the last
        write and loaded again when a version came since. A local store tells by its log: the
        kept version's entry is there and the next one is not (a compaction deletes the entries
        before its own). Loading a table's log cost a small batch's commit about 7 ms a table."""
        table = self._written.get(name)
        if table is None and not self.local:
            table = self._written[name] = objects.delta_table(self._path(name))
            if name != LEDGER and any(table.metadata().configuration.get(k) != v
                                      for k, v in objects.LOG_PROPERTIES.items()):
                table.alter.set_table_properties(objects.LOG_PROPERTIES)  # a table made before them
                # (the ledger gets them with its own properties, after the fence: `Ledger.append`)
        elif table is not None and not self.local:
            # object storage: the versions since, read from the log (a list and a get each),
            # not the whole log again (a get per entry since the last checkpoint, for each
            # table a batch writes: 988 requests in the 40th call of a new store)
            table.update_incremental()
        elif (table is None or not self.local or not self.place.log_entry(name, table.version()).exists()
                or self.place.log_entry(name, table.version() + 1).exists()):
            table = self._written[name] = objects.delta_table(self._path(name))
        return table

    def at_named(self, name: str, named: int | None) -> DeltaTable:
        """`latest(name)` on object storage, rolled back first to `named` (the version the
        ledger names) when it holds versions beyond it. No ledger row names them: a writer
        whose turn ended mid-commit wrote them (`_fenced_ledger` then refused its row), possibly after
        the next holder gave the lease back clean, so that `DeltaStore.recover` was skipped. A write
        built on them would publish their rows."""
        table = self.latest(name)
        if named is not None and table.version() > named:
            table.restore(named)
            table.update_incremental()  # the restore's own version, which the write follows
        return table

    def create_table(self, name: str) -> int:
        """An empty table at its first version (also for tables added after the store was made)."""
        if self.local and not os.path.exists(os.path.join(self._path(name), "_delta_log")):
            return appends.create(self._path(name), pl.DataFrame(schema=stored_schema(name)).to_arrow().schema)
        objects.write_delta(self._path(name), pl.DataFrame(schema=stored_schema(name)).to_arrow(), mode="overwrite",
                            configuration=None if self.local else objects.LOG_PROPERTIES)
        version = objects.delta_table(self._path(name)).version()
        appends.sync_version(self._path(name), version)  # delta-rs wrote it: synced here (a folder's)
        return version

    def append(self, name: str, data: pa.Table | pa.RecordBatchReader, schema: pa.Schema,
                options: appends.FileOptions, properties: WriterProperties, *, table: DeltaTable | None = None) -> int:
        """Append `data` to table `name` under the writer lock; returns the new version and
        notes its files and statistics for the next batch's reads. A local table that has the
        columns of `schema` takes a file and a log entry of our own (`store/appends.py`); a table
        gaining columns (written before them) and object storage go through delta-rs."""
        if self.local:
            version, columns = self.newest(name)
            if set(schema.names) <= columns:
                added = appends.write_file(self._path(name), data, schema, options)
                if added is not None and name in SORT_BY and added[1] >= INDEXED_RUN_ROWS:
                    # appended by the table's own write (`TableWrites`): a list append is atomic
                    self.runs_to_index.append((name, os.path.join(self._path(name), added[0]["path"])))
                mine = appends.commit(self._path(name), version + 1, [added[0]] if added else [],
                                      added[1] if added else 0)
                self._heads[name] = (mine, columns)
                with self.versions.lock:  # the next batch's reads take files and statistics without loading the log
                    self.versions.note_append(name, mine, None if added is None else added[0])
                return mine
        elif table is None and name != LEDGER and (appended := self.append_remote(name, data, schema, options)) is not None:
            return appended
        # the write moves it to its new version; the ledger comes positioned (`_fenced_ledger`)
        table = table or self.at_named(name, self._head().versions.get(name))
        objects.write_delta(table, data, mode="append", writer_properties=properties,
                            schema_mode="merge" if name in PARTIAL or name == LEDGER else None,
                            commit_properties=CommitProperties(max_commit_retries=0) if name == LEDGER else None)
        appends.sync_version(self._path(name), table.version())  # delta-rs wrote it: synced here (a folder's)
        self._heads.pop(name, None)
        if name != LEDGER:
            with self.versions.lock:
                self.versions.note_files(name, table.version(), table)
                if name in SORT_BY:  # the tables probed by file statistics and merged by runs
                    self.versions.note_actions(name, table.version(), table)
        return table.version()

    def append_remote(self, name: str, data: pa.Table | pa.RecordBatchReader, schema: pa.Schema,
                       options: appends.FileOptions) -> int | None:
        """On object storage, as on a folder: the file, then the log entry of our own, put only
        where none is (S3's conditional put): 2 requests where delta-rs' write made 8 (its log
        listed before, to check and after the commit, the new entry read back twice). The
        version is the one after the version the ledger names: this process's last write when
        that is it, else the table loaded and its stray versions rolled back (`at_named`);
        when another version came since (another writer's), the entry is refused, the file
        removed, and None says to write through delta-rs. None also for a table gaining
        columns."""
        version, columns = self.remote_base(name, self._head().versions.get(name))
        if not set(schema.names) <= columns:
            return None
        added = appends.write_file(self._path(name), data, schema, options)
        try:
            mine = appends.commit(self._path(name), version + 1, [added[0]] if added else [],
                                  added[1] if added else 0)
        except StoreError:
            self._heads.pop(name, None)
            if added is not None:
                objects.remove(objects.join(self._path(name), added[0]["path"]))
            return None
        self._heads[name] = (mine, columns)
        with self.versions.lock:
            self.versions.note_append(name, mine, None if added is None else added[0])
        return mine

    def remote_base(self, name: str, named: int | None) -> tuple[int, frozenset[str]]:
        """On object storage, the version a write of our own follows, and its columns: the
        version the ledger names (`named`). Only that one: this process's last write may be one
        no ledger row named (its batch failed, or its lease ended), and a compaction since may
        have deleted the entries after it, so that a put there would be taken."""
        kept = self._heads.get(name)
        if kept is None and named is not None:  # a fresh process: the log read as a checkpoint
            # is, and one listing to tell no version came after the named one
            with self.versions.lock:
                read = self.versions.remote_files(name, named)
            if read is not None and read.columns is not None and not objects.entries_after(self._path(name), named):
                kept = self._heads[name] = (named, read.columns)
        if kept is None or kept[0] != named:
            table = self.at_named(name, named)
            kept = (table.version(), frozenset(field.name for field in table.schema().fields))
        return kept

    def newest(self, name: str) -> tuple[int, frozenset[str]]:
        """A table's newest version and its columns, for an append under the writer lock: kept
        from this process's last write while the log holds no entry after it (`latest`)."""
        kept = self._heads.get(name)
        if kept is None and self._head().versions.get(name) == 0 and (columns := self.versions.as_created(name)) is not None:
            kept = (0, columns)  # a table no batch wrote yet
        if (kept is None or not self.place.log_entry(name, kept[0]).exists()
                or self.place.log_entry(name, kept[0] + 1).exists()):
            table = self.latest(name)
            kept = self._heads[name] = (table.version(), frozenset(f.name for f in table.schema().fields))
        return kept

    def write_rows(self, name: str, rows: pl.DataFrame | pa.RecordBatchReader, versions: dict[str, int]) -> None:
        """Append a batch's rows of one table as a sorted run (a reader's rows come sorted);
        note the table's new version."""
        if name not in versions and not objects.is_delta_table(self._path(name)):
            self.create_table(name)
        data = sort_for_write(name, rows, KEYS[name]).to_arrow() if isinstance(rows, pl.DataFrame) else rows
        # a store written before partial rows gains their mask column with its first batch
        versions[name] = self.append(name, data, arrow_schema(name), file_options(name), writer(name))
        layout.failpoint(f"after_table:{name}")

    def index_runs(self) -> None:
        """Write the footer indexes and Bloom filters of the batch's big runs, before the
        ledger row makes them visible: no reader meets them unindexed. A crash before the
        ledger row leaves indexes of files no version holds (`prune_indexes` removes them)."""
        written, self.runs_to_index = self.runs_to_index, []
        by_column: dict[str, list[str]] = {}
        for name, path in written:
            by_column.setdefault(SORT_BY[name], []).append(path)
        for column, paths in by_column.items():
            self.versions.footers.index(paths, column)
