"""Appends written by engagelake itself (`store/appends.py`): a Parquet file and a Delta log
entry that delta-rs, Polars and DuckDB read as they read delta-rs' own."""

from __future__ import annotations

import os

import duckdb
import orjson
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable, write_deltalake

from engagelake.errors import StoreError
from engagelake.store import appends

ROWS = pl.DataFrame({
    "key": ["b", "a", None, "c" * 70, "é" * 80],
    "n": [3, None, -7, 12, 5],
    "small": pl.Series([1, 2, 3, 4, None], dtype=pl.Int32),
    "when": pl.Series([1, 2, None, 4, 5]).cast(pl.Datetime("us", "UTC")),
    "flag": [True, None, False, True, False],
    "xs": [[1.0], None, [], [2.0, 3.0], [4.0]],
})


def _table(tmp_path, name: str = "t") -> str:
    path = str(tmp_path / name)
    write_deltalake(path, ROWS.clear().to_arrow(), mode="overwrite")  # version 0, empty
    return path


def _append(path: str, data: pa.Table | pa.RecordBatchReader, options: appends.FileOptions | None = None) -> int:
    added = appends.write_file(path, data, ROWS.to_arrow().schema, options or appends.FileOptions())
    assert added is not None
    return appends.commit(path, DeltaTable(path).version() + 1, [added[0]], added[1])


def test_every_reader_reads_an_append_as_written(tmp_path):
    path = _table(tmp_path)
    _append(path, ROWS.to_arrow())
    _append(path, ROWS.head(2).to_arrow())
    expected = pl.concat([ROWS, ROWS.head(2)])
    assert DeltaTable(path).version() == 2
    assert pl.read_delta(path).sort("n", "key", nulls_last=True).equals(expected.sort("n", "key", nulls_last=True))
    seen = pl.from_arrow(DeltaTable(path).to_pyarrow_table())
    assert seen.sort("n", "key", nulls_last=True).equals(expected.sort("n", "key", nulls_last=True))
    with duckdb.connect() as con:  # the files the log names (DuckDB's delta extension needs a download)
        files = ", ".join(f"'{f}'" for f in DeltaTable(path).file_uris())
        rows = con.sql(f"SELECT count(*), sum(n), count(key) FROM read_parquet([{files}])").fetchall()[0]
    assert rows == (7, (3 - 7 + 12 + 5) + 3, 6)


def test_statistics_are_those_delta_rs_writes_for_integers_and_strings(tmp_path):
    ours, theirs = _table(tmp_path, "ours"), str(tmp_path / "theirs")
    _append(ours, ROWS.to_arrow())
    write_deltalake(theirs, ROWS.to_arrow())
    mine = pl.DataFrame(pa.table(DeltaTable(ours).get_add_actions(flatten=True)))
    delta_rs = pl.DataFrame(pa.table(DeltaTable(theirs).get_add_actions(flatten=True)))
    compared = ["num_records", *(f"{stat}.{column}" for stat in ("min", "max") for column in ("key", "n", "small")),
                *(f"null_count.{column}" for column in ("key", "n", "small", "when", "flag"))]
    assert mine.select(compared).to_dicts() == delta_rs.select(compared).to_dicts()
    # a string cut at 64 characters: a prefix below every value, a raised prefix above
    assert mine["min.key"][0] == "a" and len(mine["max.key"][0].encode()) <= appends.STAT_BYTES
    assert mine["max.key"][0] > "é" * 80


def test_the_noted_add_action_equals_what_a_reader_loads(tmp_path):
    path = _table(tmp_path)
    _append(path, ROWS.to_arrow())
    before = pa.table(DeltaTable(path).get_add_actions(flatten=True))
    added = appends.write_file(path, ROWS.tail(2).to_arrow(), ROWS.to_arrow().schema, appends.FileOptions())
    assert added is not None
    appends.commit(path, 2, [added[0]], added[1])
    noted = pl.DataFrame(appends.with_action(before, added[0]))
    loaded = pl.DataFrame(pa.table(DeltaTable(path).get_add_actions(flatten=True)))
    assert noted.select(sorted(loaded.columns)).sort("path").equals(loaded.select(sorted(loaded.columns)).sort("path"))


def test_a_stream_of_small_batches_is_written_in_whole_row_groups(tmp_path):
    path = _table(tmp_path)
    batches = [pa.record_batch(ROWS.to_arrow().slice(i % 5, 1).to_batches()[0]) for i in range(2_500)]
    reader = pa.RecordBatchReader.from_batches(ROWS.to_arrow().schema, iter(batches))
    _append(path, reader, appends.FileOptions(row_group_rows=1024))
    [file] = DeltaTable(path).file_uris()
    groups = [pq.ParquetFile(file).metadata.row_group(g).num_rows for g in range(pq.ParquetFile(file).num_row_groups)]
    assert groups == [1024, 1024, 452]


def test_plain_columns_have_no_dictionary_and_the_others_do(tmp_path):
    path = _table(tmp_path)
    _append(path, ROWS.to_arrow(), appends.FileOptions(plain=("key",)))
    [file] = DeltaTable(path).file_uris()
    group = pq.ParquetFile(file).metadata.row_group(0)
    encodings = {group.column(i).path_in_schema: group.column(i).encodings for i in range(group.num_columns)}
    assert "RLE_DICTIONARY" not in encodings["key"] and "RLE_DICTIONARY" in encodings["n"]


def test_statistics_only_for_the_columns_named(tmp_path):
    path = _table(tmp_path)
    _append(path, ROWS.to_arrow(), appends.FileOptions(statistics=("n",)))
    actions = pl.DataFrame(pa.table(DeltaTable(path).get_add_actions(flatten=True)))
    assert actions["min.n"][0] == -7
    assert "min.key" not in actions.columns or actions["min.key"][0] is None
    [file] = DeltaTable(path).file_uris()
    group = pq.ParquetFile(file).metadata.row_group(0)
    assert not group.column(0).is_stats_set and group.column(1).is_stats_set


def test_an_empty_append_makes_a_version_without_a_file(tmp_path):
    path = _table(tmp_path)
    assert appends.write_file(path, ROWS.clear().to_arrow(), ROWS.to_arrow().schema, appends.FileOptions()) is None
    assert appends.commit(path, 1, [], 0) == 1
    assert DeltaTable(path).version() == 1 and DeltaTable(path).file_uris() == []


def test_an_entry_another_writer_made_is_never_overwritten(tmp_path):
    path = _table(tmp_path)
    _append(path, ROWS.to_arrow())
    added = appends.write_file(path, ROWS.to_arrow(), ROWS.to_arrow().schema, appends.FileOptions())
    assert added is not None
    with pytest.raises(StoreError, match="exists already"):
        appends.commit(path, 1, [added[0]], added[1])
    log = os.listdir(os.path.join(path, "_delta_log"))
    assert sorted(log) == ["00000000000000000000.json", "00000000000000000001.json"]  # no temporary left
    assert pl.read_delta(path).height == ROWS.height


def test_a_checkpoint_every_hundred_versions(tmp_path):
    path = _table(tmp_path)
    for _ in range(appends.CHECKPOINT_INTERVAL):
        appends.commit(path, DeltaTable(path).version() + 1, [], 0)
    log = os.listdir(os.path.join(path, "_delta_log"))
    assert "_last_checkpoint" in log and f"{appends.CHECKPOINT_INTERVAL:020d}.checkpoint.parquet" in log
    assert DeltaTable(path).version() == appends.CHECKPOINT_INTERVAL


def test_raised_prefix_bounds_every_longer_string():
    assert appends._raised_prefix("abc") == "abc"
    long = "x" * 63 + "yz"
    top = appends._raised_prefix(long)
    assert top is not None and len(top) == 64 and top > long and top == "x" * 63 + "z"
    assert appends._prefix("é" * 40) == "é" * 32 and appends._prefix("a" + "é" * 40) == "a" + "é" * 31
    assert appends._raised_prefix("\U0010ffff" * 70) is None


def test_a_big_stream_rolls_over_to_new_files_at_whole_row_groups(tmp_path, monkeypatch):
    path = _table(tmp_path)
    rows = pl.concat([ROWS] * 2_000)  # 10,000 rows
    reader = pa.RecordBatchReader.from_batches(ROWS.to_arrow().schema, rows.to_arrow().to_batches(max_chunksize=700))
    options = appends.FileOptions(row_group_rows=1024)
    monkeypatch.setattr(appends, "STREAM_CHUNK_GROUPS", 2)  # chunks of 2,048 rows: a file each here
    written = appends.write_files(path, reader, ROWS.to_arrow().schema, options, file_bytes=1)
    assert len(written) == 5 and sum(n for _, n in written) == 10_000
    appends.commit(path, 1, [add for add, _ in written], 10_000)
    for file in DeltaTable(path).file_uris():
        meta = pq.ParquetFile(file).metadata
        assert all(meta.row_group(g).num_rows == 1024 for g in range(meta.num_row_groups - 1))
    assert pl.read_delta(path).sort("n", "key", nulls_last=True).equals(rows.sort("n", "key", nulls_last=True))


def test_a_stream_that_fails_midway_leaves_no_file(tmp_path):
    path = _table(tmp_path)

    def batches():
        yield ROWS.to_arrow().to_batches()[0]
        raise OSError("the source went away")

    reader = pa.RecordBatchReader.from_batches(ROWS.to_arrow().schema, batches())
    with pytest.raises(OSError, match="went away"):
        appends.write_files(path, reader, ROWS.to_arrow().schema, appends.FileOptions())
    assert [f for f in os.listdir(path) if f.endswith(".parquet")] == []


def test_a_stream_without_a_row_group_size_writes_a_group_per_batch(tmp_path):
    path = _table(tmp_path)
    reader = pa.RecordBatchReader.from_batches(ROWS.to_arrow().schema, ROWS.to_arrow().to_batches(max_chunksize=2))
    _append(path, reader)
    [file] = DeltaTable(path).file_uris()
    assert pq.ParquetFile(file).num_row_groups == 3


def test_a_string_with_no_short_upper_bound_has_no_bounds():
    stats = appends._Stats()
    stats.add(pa.table({"k": ["\U0010ffff" * 70, "a"]}), ["k"])
    assert orjson.loads(stats.json()) == {"numRecords": 2, "minValues": {}, "maxValues": {}, "nullCount": {"k": 0}}


def test_a_table_created_empty_tells_its_columns_from_its_first_log_entry(tmp_path):
    path = _table(tmp_path)
    assert appends.created_empty(path) == frozenset(f.name for f in DeltaTable(path).schema().fields)
    _append(path, ROWS.to_arrow())  # a later version changes nothing about the first
    assert appends.created_empty(path) == frozenset(ROWS.columns)


def test_a_table_whose_first_version_added_files_or_has_no_log_is_not_created_empty(tmp_path):
    full = str(tmp_path / "full")
    write_deltalake(full, ROWS.to_arrow(), mode="overwrite")  # version 0 holds a file
    assert appends.created_empty(full) is None
    assert appends.created_empty(str(tmp_path / "none")) is None


def test_a_new_stores_tables_answer_without_loading_their_logs(tmp_path, monkeypatch):
    from engagelake import Workspace
    from engagelake.store import objects

    ws = Workspace.open(tmp_path / "store", seed="s")
    loads: list[str] = []
    real = objects.DeltaTable

    def counted(uri: str, *args, **kwargs):
        loads.append(os.path.basename(uri))
        return real(uri, *args, **kwargs)

    monkeypatch.setattr(objects, "DeltaTable", counted)
    fresh = Workspace.open(tmp_path / "store", seed="s")  # a new process's view: nothing cached
    asked = fresh.call("POST", "/users/export/ids", {"external_ids": ["nobody"], "fields_to_export": ["first_name"]})
    assert asked.body["invalid_user_ids"] == ["nobody"]
    assert fresh.call("POST", "/users/track", {"attributes": [{"external_id": "a", "first_name": "A"}]}).status == 201
    assert set(loads) <= {"_ledger"}, loads  # the tables read and written: none loaded
    exported = ws.call("POST", "/users/export/ids", {"external_ids": ["a"], "fields_to_export": ["first_name"]})
    assert exported.body["users"] == [{"first_name": "A"}]


@pytest.mark.parametrize("entry", [b"not json\n", b'{"metaData":{"schemaString":"not json"}}\n',
                                   b'{"metaData":{}}\n{"metaData":{}}\n'])
def test_a_first_log_entry_that_is_not_plain_tells_nothing(tmp_path, entry):
    log = tmp_path / "t" / "_delta_log"
    log.mkdir(parents=True)
    (log / f"{0:020d}.json").write_bytes(entry)
    assert appends.created_empty(str(tmp_path / "t")) is None
