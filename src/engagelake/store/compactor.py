"""Compaction, the job: every table rewritten as its current rows (erasure included), the old
files and log entries deleted, the new versions published by one ledger row; in parts that
any process writes (`store/compaction.py` holds the plan and the SQL of a part).
"""

from __future__ import annotations

import logging
import shutil
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

import polars as pl
import pyarrow as pa
from deltalake import CommitProperties, DeltaTable
from deltalake.transaction import AddAction

from engagelake.errors import StoreError
from engagelake.store import appends, compaction, layout, merging, objects
from engagelake.store.compaction import Part, Plan, Written
from engagelake.store.footers import prune_indexes
from engagelake.store.layout import (
    COMPACTING,
    LEDGER,
    MERGING,
    Head,
    OnPlace,
    Place,
    Turns,
    arrow_schema,
    stored_schema,
)
from engagelake.store.ledger import RESPONSE_RETENTION, Ledger
from engagelake.store.merger import RunMerger
from engagelake.store.redaction import compact_ledger, identifiers_of, redacted_lineage
from engagelake.store.runs import SORT_BY, sort_order
from engagelake.store.snapshot import Snapshot
from engagelake.store.versions import TableVersions
from engagelake.store.writes import TableWriter
from engagelake.tables.partial import PARTIAL, SET
from engagelake.tables.schema import HISTORY, INDEXES, KEYS, STORED, TABLES

if TYPE_CHECKING:
    import duckdb  # imported where used: a process that only reads never loads it


class Compactor(OnPlace):
    """A store's compactions, and the roll-forward of one that died (`settle`)."""

    def __init__(self, place: Place, versions: TableVersions, writer: TableWriter, ledger: Ledger,
                 merger: RunMerger, turns: Turns):
        self.place, self.versions, self.writer, self.ledger = place, versions, writer, ledger
        self.merger, self.turns = merger, turns
        self.retention = RESPONSE_RETENTION  # a keyed batch's responses are kept this long (a workspace setting)

    def compact(self, *, on_table: Callable[[str, int, int], None] | None = None) -> dict[str, int]:
        """Rewrite every table as its current rows (newest row per key, no tombstones, history
        moved to surviving profiles, lineage of deleted profiles redacted), delete every file
        and log entry the new versions do not need, then commit the new versions. Readers
        opened before must reopen. Returns the rows kept per table. `on_table(name, done,
        total)` is called before each table is rewritten (for progress displays).

        The sorted tables stream through DuckDB within the memory budget, so compaction holds
        no table in memory; the small unsorted ones (resources, lineage) keep their order.
        Compaction changes no logical content, so a crash midway rolls forward: the marker file
        tells the next writer to publish the tables' current versions instead of restoring."""
        with self.compaction() as job:
            return job.finish([], on_table=on_table)

    @contextmanager
    def compaction(self, parts: int = 1, min_part_rows: int = compaction.MIN_PART_ROWS) -> Iterator[Compaction]:
        """A compaction whose big sorted tables are cut into about `parts` key ranges each, of
        `min_part_rows` stored rows at least (`store/compaction.py`): the parts of `job.plan`
        are written by `compact_part`, in this process or any other, then `job.finish(written)`
        commits them and compacts the rest as `compact` does. The writer lock is held
        throughout. Leaving the block before `finish` commits anything changes nothing (the
        parts' files are left for the next compaction's vacuum); leaving it after `finish`
        failed midway raises, and the next writer rolls the compaction forward."""
        self.merger.wait()
        with self.turns.writer_lock():
            self.ledger.head = self.ledger.read_head()
            self.turns.recover()
            marker = self.marker()
            objects.touch(marker)
            job: Compaction | None = None
            try:
                job = Compaction(self, Snapshot(self.versions, self.ledger.head), parts, min_part_rows)
                yield job
            finally:
                if job is None or not job.committed:  # nothing changed yet: no compaction to roll forward
                    objects.remove(marker)
            if job.committed and job.kept is None:  # `finish` failed, and the block went on: the
                # lease must not be given back as clean, or no writer would roll it forward
                raise StoreError(f"the compaction of {self.uri} stopped midway (its `finish` failed); the next "
                                 "writer rolls it forward")
        if job.kept is not None:
            if self.local:
                prune_indexes(self.uri)
            for name in SORT_BY:  # the files of the versions just published (no head read again per table)
                self.merger.index_footers(name, self.versions.files(name, self.ledger.head.versions.get(name)))

    def compact_part(self, plan: Plan, part: Part) -> Written:
        """Write `part` of the compaction `plan` as files of its table, not committed (in any
        process: the planning compaction holds the writer lock and commits them)."""
        name = part.table
        snap = Snapshot(self.versions, plan.head)  # the planner commits nothing before its parts are in
        schema = arrow_schema(name)
        with merging.connection(self.turns.memory_limit) as con:
            base = INDEXES[name][0] if name in INDEXES else name  # an index is drawn from its table
            snap.duckdb(con, ("redirects", base) if base in HISTORY else (base,))
            rows = merging.stream(con, compaction.rows_sql(name, plan.batch_no, part), schema)
            written = appends.write_files(self._path(name), rows, schema, layout.file_options(name),
                                          file_bytes=layout.MERGED_FILE_BYTES)
        return Written(part, plan.batch_no, [add for add, _ in written], sum(n for _, n in written))

    def commit_written(self, name: str, table: DeltaTable, written: list[Written]) -> None:
        """One version of `name` made of the parts' files, in their order, replacing every
        file it had."""
        adds = [add for part in written for add in part.adds]
        rows = sum(part.rows for part in written)
        if self.local:
            current = pa.table(table.get_add_actions(flatten=True)).select(["path", "size_bytes"])
            appends.commit(self._path(name), table.version() + 1, adds, rows,
                           list(zip(current.column("path").to_pylist(), current.column("size_bytes").to_pylist(),
                                    strict=True)))
            return
        table.create_write_transaction(
            [AddAction(add["path"], add["size"], {}, add["modificationTime"], True, add["stats"]) for add in adds],
            mode="overwrite", schema=arrow_schema(name), post_commithook_properties=objects.COMMIT_HOOKS,
            commit_properties=CommitProperties(max_commit_retries=0))  # no other writer may come between

    def overwrite_with_files(self, name: str, table: DeltaTable, rows: pa.RecordBatchReader | pa.Table) -> bool:
        """Replace every file of `name` by `rows`, written by pyarrow as they stream in, a file
        per `layout.MERGED_FILE_BYTES`, and one log entry; False (nothing written) when the table lacks
        a column of its schema: delta-rs then writes it and evolves the schema. delta-rs holds a
        file in memory until it is whole: at 1 GiB files a 10M-user compaction peaked at 4.56
        GB against 3.32 at its 100 MiB files; this writer holds a chunk of row groups."""
        schema = arrow_schema(name)
        if not self.local or not set(schema.names) <= {f.name for f in table.schema().fields}:
            return False  # (engagelake writes the files and the log entry itself on a folder only)
        current = pa.table(table.get_add_actions(flatten=True)).select(["path", "size_bytes"])
        written = appends.write_files(self._path(name), rows, schema, layout.file_options(name), file_bytes=layout.MERGED_FILE_BYTES)
        appends.commit(self._path(name), table.version() + 1, [add for add, _ in written], sum(n for _, n in written),
                       list(zip(current.column("path").to_pylist(), current.column("size_bytes").to_pylist(), strict=True)))
        return True

    def compacted(self, con: duckdb.DuckDBPyConnection, snap: Snapshot, name: str, batch_no: int,
                   gone: pl.Series, held: pl.DataFrame) -> pa.RecordBatchReader | pa.Table:
        """The rows a compaction writes for `name`, stamped with the compaction's batch."""
        stamp = {"_batch": pl.lit(batch_no, pl.Int64), "_deleted": pl.lit(False)}
        if name in PARTIAL:
            stamp[SET] = pl.lit(None, pl.Int64)
        order = sort_order(name, KEYS[name])
        if order is None:  # small or order-keeping tables: read in commit order, in memory
            rows = snap.scan(name).collect()
            if name == "preference_center_submits":  # a deleted user's submits go with the user
                rows = rows.filter(~pl.col("service_id").is_in(gone.implode()))
            if name == "merges":
                rows = redacted_lineage(rows, gone, held)
            return rows.with_columns(**stamp).select(list(stored_schema(name))).to_arrow()
        return merging.stream(con, compaction.rows_sql(name, batch_no), arrow_schema(name))

    def never_written(self) -> set[str]:
        """The tables still as the store's creation made them (empty, at their first version;
        an index only while its table is so too): a compaction has nothing to rewrite or erase
        there. A small store leaves most of its tables so (resources, lineage, indexes)."""
        empty = {name for name in STORED if self.ledger.head.versions.get(name) == 0 and not self.versions.files(name, 0)}
        return {name for name in empty if name not in INDEXES or INDEXES[name][0] in empty}

    def finish_compaction(self, batch_no: int, tables: list[str], same: dict[str, int] | None = None) -> dict[str, int]:
        """Drop the files and log entries the compacted versions no longer need, then publish
        `tables`, and the versions of tables left `same`; returns the rows of each."""
        kept, versions = dict.fromkeys(same or {}, 0), dict(same or {})
        if self.local:  # merged runs a killed merge never published (object storage merges in memory)
            shutil.rmtree(Path(self.uri) / MERGING, ignore_errors=True)
        self.vacuum(LEDGER)  # its old files held the responses it dropped
        for name in tables:
            if not objects.is_delta_table(self._path(name)):
                continue
            table = self.vacuum(name)
            kept[name] = sum(pa.table(table.get_add_actions(flatten=True)).column("num_records").to_pylist())
            versions[name] = table.version()
            with self.versions.lock:  # the reads and footer indexes that follow need not load it again
                self.versions.note_files(name, versions[name], table)
        self.publish_current(batch_no, versions)
        if self.place.lease is not None:  # no commit cleans up a log (`objects.COMMIT_HOOKS`): the lease's here
            try:
                self.place.lease.tidy()
            except Exception as error:  # noqa: BLE001 - housekeeping: the compaction is done, the next one tidies
                logging.getLogger("engagelake").warning("the writers' lease log was not tidied: %s", error)
        return kept

    def vacuum(self, name: str) -> DeltaTable:
        """Delete the files and log entries that `name`'s current version does not need."""
        table = objects.delta_table(self._path(name))
        # `full`: every file no version names goes too, not only those a version removed: the
        # files of a compaction's parts never committed, of a writer that died before its commit
        # (under the writer lock no other writer has files in flight here)
        table.vacuum(retention_hours=0, enforce_retention_duration=False, dry_run=False, full=True)
        table.update_incremental()  # the vacuum's own log entries (loading the log again cost 3 ms a table)
        table.create_checkpoint()
        table.cleanup_metadata()
        # a writer killed between writing a log entry and linking it in left its temporary file
        # (`store/appends.py`; delta-rs names its own so too): it holds statistics of values
        for left in (Path(self._path(name)) / "_delta_log").glob("_commit_*.json.tmp") if self.local else ():
            left.unlink(missing_ok=True)
        return table

    def marker(self) -> str:
        return self.place.path(COMPACTING)

    def settle(self) -> None:
        """Old table versions go during a compaction: wait for a live one (it holds the writer
        lock), or roll a dead one forward, before reading."""
        if self.place.compacting():
            with self.turns.writer_lock():
                self.ledger.head = self.ledger.read_head()
                self.turns.recover()

    def publish_current(self, batch_no: int, versions: dict[str, int]) -> None:
        """A ledger row naming the current `versions` of tables (the end of a compaction)."""
        self.ledger.append(batch_no, None, versions, self.ledger.head.next_profile_n, self.ledger.head.next_update_seq,
                            self.ledger.head.seed, [], kind="compaction")
        self.ledger.head = Head(batch_no, versions, self.ledger.head.next_profile_n, self.ledger.head.next_update_seq, self.ledger.head.seed,
                         content_batch=self.ledger.head.content_batch)

    def compact_ledger(self, gone: pl.Series, identifiers: pl.DataFrame) -> None:
        """The ledger without the responses nobody may read again (`redaction.compact_ledger`)."""
        compact_ledger(self.place, self.turns.memory_limit, self.retention, gone, identifiers)


class Compaction:
    """A compaction under way (`Compactor.compaction`): its plan of parts, then `finish`."""

    def __init__(self, store: Compactor, snap: Snapshot, parts: int, min_part_rows: int):
        self.store, self.snap = store, snap
        self.batch_no = snap.head.batch_no + 1
        self.untouched = store.never_written()
        self.committed = False  # a table written: from then on a crash rolls the compaction forward
        self.kept: dict[str, int] | None = None
        self.ledger_version = store.ledger.version  # as read under the writer lock
        self.plan = Plan(store.uri, snap.head, self.batch_no, tuple(self._parts(parts, min_part_rows)))

    def _parts(self, parts: int, min_part_rows: int) -> Iterator[Part]:
        """Each big sorted table's key ranges of about 1/`parts` of its stored rows (and at
        least `min_part_rows`: a smaller table is one part); each index, whole."""
        if parts <= 1:
            return
        for name in STORED:
            if name in self.untouched or name not in SORT_BY or not self.snap.holds(name):
                continue
            table = objects.delta_table(self.store.place.path(name))
            if not set(arrow_schema(name).names) <= {f.name for f in table.schema().fields}:
                continue  # delta-rs writes it whole, evolving its schema
            if not compaction.splits(name):
                yield Part(name, None, None)
                continue
            per_part = max(min_part_rows, -(-self.snap.rows(name) // parts))
            # a loop over a table's few ranges (about `parts`), not its rows: planning, run once
            for low, high in self.snap.key_ranges(name, per_part):
                yield Part(name, low or None, high)

    def finish(self, written: list[Written], *,
               on_table: Callable[[str, int, int], None] | None = None) -> dict[str, int]:
        """Commit the parts' files (`written`: one for each part of the plan), compact every
        other table, the ledger, and publish the new versions; returns the rows kept per table."""
        store, snap = self.store, self.snap
        if self.kept is not None:
            raise StoreError("this compaction is finished already")
        by_table = self._by_table(written)
        self._check_turn()  # the parts may have taken long: a lease that lapsed meanwhile ends here
        with merging.connection(store.turns.memory_limit) as con:
            snap.duckdb(con)  # current rows, over the old files: they stay until every table is written
            gone = con.sql('SELECT service_id FROM redirects WHERE "into" IS NULL').pl()["service_id"]
            held = identifiers_of(snap, gone)  # every identifier a deleted profile held
            for done, name in enumerate(STORED):
                if on_table is not None:
                    on_table(name, done, len(STORED))
                if name in self.untouched:
                    continue
                self.committed = True
                if not objects.is_delta_table(store.place.path(name)):
                    store.writer.create_table(name)
                # old log entries hold column statistics of old files: let cleanup drop them
                table = objects.delta_table(store.place.path(name))  # one load of its log for both
                table.alter.set_table_properties({"delta.logRetentionDuration": "interval 0 days"})
                if name in by_table:
                    store.commit_written(name, table, by_table[name])
                else:
                    rows = store.compacted(con, snap, name, self.batch_no, gone, held)
                    if not store.overwrite_with_files(name, table, rows):
                        objects.write_delta(table, rows, mode="overwrite", writer_properties=layout.writer(name),
                                            schema_mode="overwrite" if name in PARTIAL else None)
                        # synced before the vacuum deletes the files it replaced
                        appends.sync_version(store.place.path(name), table.version())
                layout.failpoint(f"compact:{name}")
        self._check_turn()  # before the ledger is rewritten and old files deleted
        store.compact_ledger(gone, held)
        layout.failpoint("compact:_ledger")
        kept = store.finish_compaction(self.batch_no, [name for name in STORED if name not in self.untouched],
                                        {name: snap.head.versions[name] for name in self.untouched})
        objects.remove(store.marker())
        self.kept = {name: kept[name] for name in TABLES}
        return self.kept

    def _check_turn(self) -> None:
        """On object storage: raise TurnEndedError when this writer's lease has ended, or
        another writer committed since the plan (a folder's lock file cannot lapse)."""
        if self.store.place.lease is not None:
            self.store.place.lease.check()
            self.store.ledger.fenced(self.ledger_version)

    def _by_table(self, written: list[Written]) -> dict[str, list[Written]]:
        """The parts' files by table, each table's in the order of its ranges."""
        order = {part: n for n, part in enumerate(self.plan.parts)}
        if any(w.batch_no != self.batch_no for w in written):
            raise StoreError(f"a part written for another compaction (batch {written[0].batch_no}) was given to "
                             f"compaction {self.batch_no}")
        if len(written) != len(order) or {w.part for w in written} != set(order):
            missing = [p for p in self.plan.parts if p not in {w.part for w in written}]
            raise StoreError(f"a compaction needs each of its {len(order)} parts written once; got {len(written)}"
                             + (f", missing {missing[0]}" if missing else ""))
        tables: dict[str, list[Written]] = {}
        for w in sorted(written, key=lambda w: order[w.part]):
            tables.setdefault(w.part.table, []).append(w)
        return tables
