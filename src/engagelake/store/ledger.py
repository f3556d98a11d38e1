"""The ledger: the `_ledger` table, one row per committed batch (and per merge or compaction)
naming every table's version, the store's counters, the batch's key, digest and responses.
Its newest row is the store's head, what readers see; appending a row is a commit's last step.
"""

from __future__ import annotations

from contextlib import suppress
from datetime import UTC, datetime, timedelta
from typing import Any

import orjson
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
from deltalake import ColumnProperties, DeltaTable, WriterProperties

from engagelake.errors import StoreError, TurnEndedError
from engagelake.store import appends, objects
from engagelake.store.layout import (
    LEDGER,
    BatchRow,
    Head,
    OnPlace,
    Place,
    StoredBatch,
    file_name,
    paths_by_name,
)
from engagelake.store.writes import TableWriter
from engagelake.tables.schema import UTC_TS

LEDGER_SCHEMA = {
    "batch_no": pl.Int64(),
    "batch_key": pl.String(),
    "committed_at": UTC_TS,
    "versions": pl.String(),  # JSON {table: version}
    "next_profile_n": pl.Int64(),
    "next_update_seq": pl.Int64(),
    "seed": pl.String(),
    "responses": pl.String(),  # JSON [[status, body], ...]
    "kind": pl.String(),  # "batch" (null in stores older than the column), "merge" or "compaction"
    # SHA-256 of a keyed batch's requests (null without a key, and in stores older than the
    # column): a column of its own, kept when the responses go after their retention window
    "digest": pl.String(),
    # a keyed batch's users (service_ids it read or wrote): its responses concern them, and go
    # at the next compaction once one of them is deleted; null when no responses are stored
    "subjects": pl.List(pl.String()),
    # why a keyed batch's responses are gone: "expired" (the retention window) or "erased"
    "responses_dropped": pl.String(),
}
# The ledger's text meant only for replay (response bodies) and its users carry no statistics,
# in the Delta log or in the Parquet footers: statistics would copy values out of the rows.
LEDGER_GROUP_ROWS = 8192
LEDGER_STATS_COLUMNS = ("batch_no", "batch_key", "committed_at", "kind")
LEDGER_PROPERTIES = {"delta.dataSkippingStatsColumns": ",".join(LEDGER_STATS_COLUMNS)}
LEDGER_WRITER = WriterProperties(  # statistics off by default: a nested column takes no other setting
    # a compacted ledger is one file of every batch: opening reads its newest row group only
    max_row_group_size=LEDGER_GROUP_ROWS,
    compression="SNAPPY", default_column_properties=ColumnProperties(statistics_enabled="NONE"),
    column_properties={column: ColumnProperties(statistics_enabled="CHUNK") for column in LEDGER_STATS_COLUMNS})
LEDGER_FILES = appends.FileOptions(statistics=LEDGER_STATS_COLUMNS)
LEDGER_ARROW = pl.DataFrame(schema=LEDGER_SCHEMA).to_arrow().schema
# the ledger's columns as DuckDB types (a column older files lack reads as a null of its type)
DUCK_TYPES = {"batch_no": "BIGINT", "batch_key": "VARCHAR", "committed_at": "TIMESTAMPTZ", "versions": "VARCHAR",
               "next_profile_n": "BIGINT", "next_update_seq": "BIGINT", "seed": "VARCHAR", "responses": "VARCHAR",
               "kind": "VARCHAR", "digest": "VARCHAR", "subjects": "VARCHAR[]", "responses_dropped": "VARCHAR"}
ECHO_ROWS = 64  # ledger rows whose responses are searched at once (one can hold a big batch's)
RESPONSE_RETENTION = timedelta(days=7)  # a keyed batch's responses are kept this long (default)
# ledger rows that move rows between files and change no content: a batch that read the store
# before one of them still holds (it is not stale)
LAYOUT_KINDS = ("merge", "compaction")
_CHANGED_CONTENT = ~pl.col("kind").is_in(LAYOUT_KINDS).fill_null(False)  # a ledger row of a batch


class Ledger(OnPlace):
    """The store's ledger: its head (`head`, the last committed batch), found again when
    another writer commits (`refresh`), and its rows, appended through the store's writer."""

    def __init__(self, place: Place, writer: TableWriter):
        self.place = place
        self.writer = writer
        self.head: Head  # read by the store once it is open (`read_head`)
        self.table: DeltaTable | None = None  # the ledger's log as `refresh` keeps it
        self.version = -1  # the ledger version `head` was read at
        self._columns: frozenset[str] = frozenset()  # on object storage, once the ledger was loaded
        self._properties_set = False

    def append(self, batch_no: int, key: str | None, versions: dict[str, int], next_n: int,
                       next_seq: int, seed: str, responses: list[Any], *, kind: str, create: bool = False,
                       digest: str | None = None, subjects: pl.Series | None = None,
                       after: int | None = None) -> int | None:
        """Append one ledger row; returns the ledger version it made (None when creating).
        Responses are stored for a keyed batch only (nothing else can ask for them again),
        with the users they concern (`subjects`). `after`: on object storage, the ledger version
        the writer read its head at, under its lease; the row is written only as the version
        right after it (`fenced`)."""
        row = BatchRow(key, responses, digest, None if subjects is None else subjects.to_list())
        return self.append_rows(batch_no, [row], versions, next_n, next_seq, seed, kind=kind, create=create,
                                after=after)

    def append_rows(self, first_no: int, batches: list[BatchRow], versions: dict[str, int], next_n: int,
                    next_seq: int, seed: str, *, kind: str, create: bool = False,
                    after: int | None = None) -> int | None:
        """Append one row per batch of `batches`, numbered from `first_no` on, in one commit:
        a flush of the in-memory layer (`store/layer.py`) commits many batches as one. Every
        row names the same table versions and counters, those after the last batch: the
        batches before it have no cut of their own."""
        if self.place.lease is not None and not create:
            self.place.lease.check()  # a writer whose turn ended must not publish
        now = datetime.now(UTC)
        keyed = [b.key is not None for b in batches]
        row = pl.DataFrame(
            {
                "batch_no": list(range(first_no, first_no + len(batches))),
                "batch_key": [b.key for b in batches],
                "committed_at": [b.committed_at or now for b in batches],
                "versions": [orjson.dumps(versions).decode()] * len(batches),
                "next_profile_n": [next_n] * len(batches), "next_update_seq": [next_seq] * len(batches),
                "seed": [seed] * len(batches),
                "responses": [orjson.dumps(b.responses).decode() if k else None for b, k in zip(batches, keyed, strict=True)],
                "kind": [kind] * len(batches),
                "digest": [b.digest for b in batches],
                "subjects": [(b.subjects or []) if k else None for b, k in zip(batches, keyed, strict=True)],
                "responses_dropped": [None] * len(batches),
            },
            schema=LEDGER_SCHEMA,
        )
        # a ledger written before a column gains it here (older rows: null)
        if create:
            objects.write_delta(self._path(LEDGER), row.to_arrow(), mode="append", schema_mode="merge",
                                writer_properties=LEDGER_WRITER,
                                configuration=LEDGER_PROPERTIES if self.local else {**LEDGER_PROPERTIES, **objects.LOG_PROPERTIES})
            appends.sync_version(self._path(LEDGER), objects.delta_table(self._path(LEDGER)).version())
            return None
        if (not self.local and after is not None and self._properties_set
                and set(LEDGER_ARROW.names) <= self._columns):
            return self.append_remote(row.to_arrow(), after)
        # object storage: the ledger brought up to date once, fenced, then written on that very
        # version (a folder's appends go through `store/appends.py`)
        ledger = None if self.local else self.fenced(after)
        if ledger is not None:
            self._columns = frozenset(field.name for field in ledger.schema().fields)
        if not self._properties_set:  # a ledger made before them gets them (once per process)
            table = ledger or self.writer.latest(LEDGER)
            wanted = LEDGER_PROPERTIES if self.local else {**LEDGER_PROPERTIES, **objects.LOG_PROPERTIES}
            if any(table.metadata().configuration.get(k) != v for k, v in wanted.items()):
                table.alter.set_table_properties(wanted)  # a version of our own: the row follows it
                table.update_incremental()
            self._properties_set = True
        return self.writer.append(LEDGER, row.to_arrow(), LEDGER_ARROW, LEDGER_FILES, LEDGER_WRITER, table=ledger)

    def append_remote(self, data: pa.Table, after: int) -> int:
        """A ledger row on object storage, as a table's append: its file, then its log entry put
        as version `after + 1` only where none is, which is the fence itself: a commit another
        writer made since `after` (the version this writer read its head at) makes the put
        fail. delta-rs' fenced write brought the ledger up to date first and read its new
        entry back after: about 10 requests against 2."""
        added = appends.write_file(self._path(LEDGER), data, LEDGER_ARROW, LEDGER_FILES)
        assert added is not None, "a ledger row"
        try:
            return appends.commit(self._path(LEDGER), after + 1, [added[0]], added[1])
        except StoreError:
            with suppress(Exception):  # the fence's error is the one to tell
                objects.remove(objects.join(self._path(LEDGER), added[0]["path"]))
            raise TurnEndedError(
                f"another writer committed to the store at {self.uri} after ledger version {after}, which this "
                "batch read: this writer's turn had ended; the batch was not committed") from None

    def fenced(self, after: int | None) -> DeltaTable:
        """The ledger at its newest version, for a row written on it with no retry. With `after`
        (the version this writer read its head at, under its lease) it must still be that
        version. The lease alone leaves a gap: a holder paused past its lease (or whose
        renewals failed unseen) passes `Lease.check` just before another writer takes over and
        commits; its row would then land after theirs, naming table versions built on what
        they rolled back. As the row's commit allows no retry, a commit that comes between this
        check and the write fails it too."""
        table = self.writer.latest(LEDGER)
        if after is not None and table.version() != after:
            raise TurnEndedError(f"another writer committed to the store at {self.uri} (ledger version "
                                 f"{table.version()}, this batch read {after}): this writer's turn had ended; "
                                 "the batch was not committed")
        return table

    def rows(self, columns: list[str]) -> pl.DataFrame:
        table = objects.delta_table(self._path(LEDGER))
        present = {field.name for field in table.schema().fields}
        frame = pl.from_arrow(table.to_pyarrow_table(columns=[c for c in columns if c in present]))
        assert isinstance(frame, pl.DataFrame)
        return frame.with_columns(pl.lit(None, LEDGER_SCHEMA[c]).alias(c) for c in columns if c not in present)

    def read_head(self, table: DeltaTable | None = None, *, note: bool = True) -> Head:
        """The ledger's newest row, and its newest row that changed content. Reads the ledger's
        newest files only (one per batch, found by their `batch_no` statistics): a store of
        many batches opens as fast as a new one. `table`: the ledger, already loaded.

        `note`: remember the ledger version read, for `refresh`. Only a caller that makes the
        head it reads `self.head` may note it: a noted version whose head is not `self.head`
        makes `refresh` miss other writers' batches (a run merge that read the head and found
        nothing to merge let the next batch commit over a batch it never read: a lost update)."""
        table = table or objects.delta_table(self._path(LEDGER))
        if note:
            self.table, self.version = table, table.version()
        columns = ["batch_no", "versions", "next_profile_n", "next_update_seq", "seed", "kind"]
        rows = self.head_rows(table, columns)
        if rows.height == 0:
            raise StoreError(f"store at {self.uri} has an empty ledger; it was not created by engagelake")
        r = rows.row(-1, named=True)
        content = rows.filter(_CHANGED_CONTENT)["batch_no"]
        return Head(r["batch_no"], orjson.loads(r["versions"]), r["next_profile_n"], r["next_update_seq"], r["seed"],
                    content_batch=content.max() if content.len() else 0)  # type: ignore[arg-type]

    def head_rows(self, table: DeltaTable, columns: list[str]) -> pl.DataFrame:
        """Ledger rows by `batch_no`: those of the newest files (local stores whose files have
        statistics), enough to hold the newest row and the newest content row; else all."""
        actions = pa.table(table.get_add_actions(flatten=True))
        if "max.batch_no" not in actions.column_names or actions.column("max.batch_no").null_count:
            return self.rows(columns).sort("batch_no")
        uris = paths_by_name(table)
        newest = pl.DataFrame(actions.select(["path", "max.batch_no"])).sort("max.batch_no", descending=True)
        parts: list[pl.DataFrame] = []
        content: int | None = None  # the newest content row's batch found so far
        for path, file_max in newest.iter_rows():  # a few files, a few row groups: the newest content row is near
            if content is not None and file_max <= content:
                break
            file = pq.ParquetFile(objects.open_input(uris[file_name(path)]))
            names = file.schema_arrow.names
            for group, group_max in groups_newest_first(file, "batch_no"):
                if content is not None and group_max is not None and group_max <= content:
                    break
                frame = pl.DataFrame(pl.from_arrow(file.read_row_group(group, columns=[c for c in columns if c in names])))
                parts.append(frame.with_columns(pl.lit(None, LEDGER_SCHEMA[c]).alias(c) for c in columns if c not in names))
                found = parts[-1].filter(_CHANGED_CONTENT).select(pl.col("batch_no").max()).item()
                if found is not None and (content is None or found > content):
                    content = int(found)
        return pl.concat(parts, how="vertical_relaxed").sort("batch_no")

    def refresh(self) -> bool:
        """True when another writer committed since we last looked (then the head is re-read).
        A cheap check: only the ledger's new log entries are read."""
        if self.table is None:
            self.table = objects.delta_table(self._path(LEDGER))
        elif self.local and not self.place.log_entry(LEDGER, self.version + 1).exists():
            return False  # a Delta commit creates its log entry atomically: none, nothing new
        elif not self.local and not objects.entries_after(self._path(LEDGER), self.version):
            return False  # one listing: the loaded ledger is not brought up to date for nothing
        else:
            self.table.update_incremental()
        if self.table.version() == self.version:
            return False
        head = self.read_head(self.table)
        changed = head.batch_no != self.head.batch_no
        self.head = head
        return changed

    def row(self, where: tuple[str, Any], columns: list[str]) -> dict[str, Any] | None:
        """The `columns` (those the ledger has) of its row whose column `where[0]` equals
        `where[1]`, reading only that row's data (the ledger's files hold statistics of both
        columns asked by); None when there is none. Object storage reads the ledger's log as
        `refresh` keeps it; a folder loads it (its own appends do not move the kept one)."""
        if self.local:
            table = objects.delta_table(self._path(LEDGER))
        else:
            self.refresh()
            assert self.table is not None
            table = self.table
        present = {field.name for field in table.schema().fields}
        rows = table.to_pyarrow_table(columns=[c for c in columns if c in present], filters=[(where[0], "=", where[1])])
        return {name: rows.column(name)[0].as_py() for name in rows.column_names} if rows.num_rows else None

    def find_batch(self, key: str) -> StoredBatch | None:
        """The committed batch with this idempotency key, if any: its responses, the digest of
        its requests (None in a ledger written before digests) and its commit time."""
        row = self.row(("batch_key", key), ["responses", "digest", "committed_at", "responses_dropped"])
        if row is None:
            return None
        text = row.get("responses")
        return StoredBatch(None if text is None else orjson.loads(text), row.get("digest"), row["committed_at"],
                           dropped=row.get("responses_dropped") or (None if text is not None else "expired"))

    def batches_after(self, batch_no: int) -> int:
        """How many rows of batches (not merges or compactions) the ledger holds after `batch_no`
        (a write-ahead log's replay asks: `store/wal.py`)."""
        table = objects.delta_table(self._path(LEDGER))
        kinds = "kind" in {field.name for field in table.schema().fields}
        rows = pl.DataFrame(pl.from_arrow(table.to_pyarrow_table(columns=["batch_no", *(["kind"] if kinds else [])],
                                                                  filters=[("batch_no", ">", batch_no)])))
        return rows.filter(_CHANGED_CONTENT).height if kinds else rows.height

    def landed(self, batch_no: int) -> bool:
        """Whether the ledger now holds batch `batch_no` (the writer lock is held: no other
        writer can have written it). Unknown counts as no: the caller then raises."""
        try:
            return self.read_head(note=False).batch_no >= batch_no
        except Exception:  # noqa: BLE001 - an unreadable ledger: the write's own error is the one to raise
            return False


def groups_newest_first(file: pq.ParquetFile, column: str) -> list[tuple[int, int | None]]:
    """A file's row groups with their greatest `column` (None: no statistics, read first),
    greatest first: a compacted ledger holds every batch in one file."""
    at = file.schema.names.index(column)  # a leaf column's place (`column` is a flat one)
    groups = []
    for group in range(file.metadata.num_row_groups):
        stats = file.metadata.row_group(group).column(at).statistics
        groups.append((group, stats.max if stats is not None and stats.has_min_max else None))
    return sorted(groups, key=lambda g: (g[1] is not None, -(g[1] or 0)))


def ledger_files(table: DeltaTable) -> tuple[list[str], bool]:
    """The ledger's files, by their first batch; and whether their batches follow one another
    in that order (each file's after the last of the file before, by their statistics): then
    reading them in that order reads the rows in batch order."""
    actions = pl.DataFrame(pa.table(table.get_add_actions(flatten=True)))
    uris = paths_by_name(table)
    if "min.batch_no" not in actions.columns or actions["min.batch_no"].null_count():
        return list(uris.values()), False
    ordered = actions.sort("min.batch_no")
    files = [uris[file_name(path)] for path in ordered["path"].to_list()]
    following = (ordered["min.batch_no"].slice(1) > ordered["max.batch_no"].slice(0, ordered.height - 1)).all()
    return files, bool(following)
