"""Current rows published as plain Delta tables, for readers outside the library.

The store's tables are logs: every batch appends the versions it wrote, with `_batch` and
`_deleted` (see `docs/reading.md`). Spark, DuckDB's `delta_scan` or `pl.read_delta` read them as
they are, duplicates and tombstones included. `publish` writes each table's current rows, as
`Workspace.table` gives them, to `<out>/<table>`: one Delta overwrite per table, streamed
through DuckDB within the memory budget, so a table of any size passes in bounded memory.

A publication is one table at a time, so a reader may meet some tables already at the new
batch and others not yet. The marker `<out>/_published.json`, written last and atomically,
names the batch and each table's Delta version: a reader that needs one cut across tables reads
those versions. Files an overwrite replaced stay `KEEP_HOURS` for readers still on an older
version, then the next publication vacuums them.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import polars as pl
import pyarrow as pa
from deltalake import CommitProperties

from engagelake.store import merging, objects
from engagelake.store.layout import writer
from engagelake.store.snapshot import Snapshot
from engagelake.tables.schema import SCHEMAS

MARKER = "_published.json"
KEEP_HOURS = 1
BATCH_KEY = "engagelake.batch"  # commit metadata of each published version: the batch it shows


def publish(snapshot: Snapshot, out: str | Path, tables: list[str], memory_limit: str | None, *,
            erase_old: bool = False) -> dict[str, int]:
    """Write the current rows of `tables` at `snapshot` under `out`; returns the rows per table.
    `erase_old` (after a compaction): the replaced files and the old log entries, whose
    statistics name values, go at once instead of after `KEEP_HOURS`."""
    folder = str(out)
    if not objects.is_remote(folder):
        Path(folder).mkdir(parents=True, exist_ok=True)
    batch = snapshot.head.batch_no
    rows: dict[str, int] = {}
    versions: dict[str, int] = {}
    with merging.connection(memory_limit) as con:
        snapshot.duckdb(con)
        for name in tables:
            counted = _Counted(merging.stream(con, f'SELECT * FROM "{name}"', _schema(name)))
            target = objects.join(folder, name)
            # one load of the table's log for the write and what follows it (a load is a few ms)
            table = objects.delta_table(target) if objects.is_delta_table(target) else None
            objects.write_delta(table or target, counted.reader(), mode="overwrite", schema_mode="overwrite",
                                writer_properties=writer(name),
                                commit_properties=CommitProperties(custom_metadata={BATCH_KEY: str(batch)}))
            table = table or objects.delta_table(target)
            if erase_old:
                table.alter.set_table_properties({"delta.logRetentionDuration": "interval 0 days"})
            table.vacuum(retention_hours=0 if erase_old else KEEP_HOURS, enforce_retention_duration=False,
                         dry_run=False)
            if erase_old:
                table.update_incremental()  # the vacuum's own log entries
                table.create_checkpoint()
                table.cleanup_metadata()
            rows[name], versions[name] = counted.rows, table.version()
    _write_marker(folder, {
        "batch": batch,
        "published_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "tables": {name: {"version": versions[name], "rows": rows[name]} for name in tables},
    })
    return rows


def published(out: str | Path) -> dict[str, object] | None:
    """The marker of the last complete publication under `out`, if any."""
    text = objects.read_whole(objects.join(str(out), MARKER))
    return None if text is None else json.loads(text)


def _schema(name: str) -> pa.Schema:
    return pl.DataFrame(schema=SCHEMAS[name]).to_arrow().schema


class _Counted:
    """A stream of batches that counts the rows passing through."""

    def __init__(self, source: pa.RecordBatchReader):
        self.source = source
        self.rows = 0

    def reader(self) -> pa.RecordBatchReader:
        def batches() -> Iterator[pa.RecordBatch]:
            for batch in self.source:
                self.rows += batch.num_rows
                yield batch

        return pa.RecordBatchReader.from_batches(self.source.schema, batches())


def _write_marker(folder: str, content: dict[str, object]) -> None:
    # readers see the old marker or the new one, whole
    objects.write_whole(objects.join(folder, MARKER), (json.dumps(content, indent=2) + "\n").encode())
