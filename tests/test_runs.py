"""Fence-pointer reads of sorted runs (`store/runs.py`): exactly the rows a filter would keep."""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tests.helpers import export_users, open_ws, track_ok

from engagelake.store import footers as footers_module
from engagelake.store import membership, records, runs
from engagelake.store.footers import NESTED, held_columns, read_footer
from engagelake.store.runs import FooterCache, files_holding, matching_groups, read_where

SCHEMA = {"k": pl.String(), "v": pl.Int64()}


def test_matching_groups_spans_a_value_split_over_row_groups() -> None:
    starts = np.array(["a", "c", "c", "e"], dtype=str)
    assert matching_groups(starts, np.array(["c"], dtype=str)) == [0, 1, 2]  # "c" may end group 0
    assert matching_groups(starts, np.array(["0"], dtype=str)) == []  # before every group
    assert matching_groups(starts, np.array(["z"], dtype=str)) == [3]
    assert matching_groups(starts, np.array(["b", "d"], dtype=str)) == [0, 2]


def _write(path: Path, keys: list[str], group: int, shuffle: random.Random | None = None) -> str:
    """A sorted file; with `shuffle`, its row groups are written in a random order, as a
    writer that takes its input in parallel does."""
    frame = pl.DataFrame({"k": keys, "v": list(range(len(keys)))}, schema=SCHEMA).sort("k", maintain_order=True)
    chunks = [frame.slice(i, group) for i in range(0, frame.height, group)]
    if shuffle is not None:
        shuffle.shuffle(chunks)
    with pq.ParquetWriter(path, frame.to_arrow().schema) as writer:
        for chunk in chunks:
            writer.write_table(chunk.to_arrow(), row_group_size=group)
    return str(path)


# multi-byte keys too: fences compare raw UTF-8 bytes, the order of the statistics and the sort
KEYS = [*"abcdefghij", "é", "ä", "日", "😀", "ab", "e\u0301"]


@settings(max_examples=60, deadline=None)
@given(
    files=st.lists(st.lists(st.sampled_from(KEYS), min_size=0, max_size=40), min_size=1, max_size=3),
    group=st.integers(1, 7),
    wanted=st.lists(st.sampled_from([*KEYS, "k", "ü"]), min_size=1, max_size=5),
    unsorted=st.booleans(),
    shuffle=st.randoms(use_true_random=False),
    cached=st.booleans(),
    indexed=st.booleans(),
    split=st.booleans(),
)
def test_read_where_equals_a_filter(tmp_path_factory, files, group, wanted, unsorted, shuffle, cached, indexed,
                                    split) -> None:
    folder = tmp_path_factory.mktemp("runs")
    paths, frames = [], []
    for i, keys in enumerate(files):
        if not keys:
            continue
        path = folder / f"f{i}.parquet"
        if unsorted and i == 0:  # a file that is not sorted has no fences: read whole
            frame = pl.DataFrame({"k": keys, "v": list(range(len(keys)))}, schema=SCHEMA)
            pq.write_table(frame.to_arrow(), path, row_group_size=group)
            paths.append(str(path))
        else:
            paths.append(_write(path, keys, group, shuffle))
        frames.append(pl.read_parquet(path))
    values = pl.Series(wanted, dtype=pl.String)
    limit, parts = runs.SIEVE_CACHE_ROWS, runs.SPLIT_READ_GROUPS
    runs.SIEVE_CACHE_ROWS = limit if cached else 0  # sieve a small run from its kept column, or not
    runs.SPLIT_READ_GROUPS = 1 if split else parts  # a file's row groups read in parts side by side, or not
    root = str(folder.parent) if indexed else None  # probed through footer indexes a writer wrote
    if root is not None:
        FooterCache(root=root).index(paths, "k")
    footers = FooterCache(root=root)
    try:
        got = read_where(paths, "k", values, footers, SCHEMA)
        again = read_where(paths, "k", values, footers, SCHEMA)  # a file sieved before: by its key index
        projected = read_where(paths, "k", values, footers, SCHEMA, ["v"])  # the probe column not asked for
    finally:
        runs.SIEVE_CACHE_ROWS, runs.SPLIT_READ_GROUPS = limit, parts
    every = pl.concat(frames) if frames else pl.DataFrame(schema=SCHEMA)
    expected = every.filter(pl.col("k").is_in(values.implode()))
    assert sorted(got.rows()) == sorted(expected.rows())
    assert sorted(again.rows()) == sorted(expected.rows())
    assert projected.columns == ["v"] and sorted(projected["v"]) == sorted(expected["v"])
    if indexed:
        assert footers.footers_parsed == 0


@settings(max_examples=60, deadline=None)
@given(
    groups=st.lists(st.lists(st.sampled_from([*KEYS, "k", "ü"]), min_size=1, max_size=6), min_size=1, max_size=6),
    wanted=st.lists(st.sampled_from([*KEYS, "k", "ü", "zz"]), min_size=0, max_size=6),
)
def test_a_key_index_names_the_row_groups_that_hold_a_value(tmp_path_factory, groups, wanted) -> None:
    """Row groups in any order, keys repeated within and across them (a log's user)."""
    path = tmp_path_factory.mktemp("index") / "f.parquet"
    with pq.ParquetWriter(path, pl.DataFrame(schema=SCHEMA).to_arrow().schema) as writer:
        for keys in groups:
            writer.write_table(pl.DataFrame({"k": keys, "v": [0] * len(keys)}, schema=SCHEMA).to_arrow())
    index = runs.KeyIndex.of(pq.read_table(path).column("k"), read_footer(str(path))[0])
    holding = sorted({g for g, keys in enumerate(groups) for k in keys if k in wanted})
    assert index.groups_of(pa.array(wanted, pa.string())) == holding


def test_a_run_sieved_twice_keeps_a_key_index(tmp_path: Path) -> None:
    """A one-off probe sieves a run by its candidate groups' column; a run probed again (a
    server's exports) keeps a key index of it and reads no column to sieve it any more."""
    big = _write(tmp_path / "big.parquet", [f"{n:06d}" for n in range(0, 100_000, 2)], 1000)
    small = _write(tmp_path / "small.parquet", [f"{n:06d}" for n in range(1, 100_000, 10)], 100)  # 10,000 odd keys
    limit, runs.SIEVE_CACHE_ROWS = runs.SIEVE_CACHE_ROWS, 1_000  # the small run is too big to index at once
    try:
        footers = FooterCache()
        for round, first in enumerate([0, 2_000, 4_000]):
            held = [f"{n:06d}" for n in range(first, 100_000, 5_000)] + [f"{first + 11:06d}"]  # one of the small run
            missing = [f"{n + 3:06d}" for n in range(first, 100_000, 5_000)]  # within the small run's groups
            got = read_where([big, small], "k", pl.Series(held + missing), footers, SCHEMA)
            assert sorted(got["k"].to_list()) == sorted(held)
            assert footers.indexes_built == (0 if round == 0 else 1)
    finally:
        runs.SIEVE_CACHE_ROWS = limit


def test_a_point_lookup_reads_few_row_groups(tmp_path: Path) -> None:
    keys = [f"{n:06d}" for n in range(100_000)]
    path = _write(tmp_path / "big.parquet", keys, 1000)
    footers = FooterCache()
    fences = footers.fences(path, "k")
    assert fences.starts is not None and len(fences.starts) == 100
    wanted = np.array([b"000005", b"050500", b"099999"])
    assert matching_groups(fences.starts, wanted) == [0, 50, 99]
    got = read_where([path], "k", pl.Series(["000005", "050500", "099999", "x"]), footers, SCHEMA)
    assert got["k"].to_list() == ["000005", "050500", "099999"]
    read_where([path], "k", pl.Series(["000007"]), footers, SCHEMA)
    assert footers.footers_read == 1  # footers are cached per file


def test_a_small_run_is_sieved_by_its_sort_column(tmp_path: Path) -> None:
    """A small run's row groups each span much of the key space, so its fences admit nearly
    any probe; the sieve reads its sort column once and reads whole only the groups that hold
    a wanted value."""
    big = _write(tmp_path / "big.parquet", [f"{n:06d}" for n in range(0, 100_000, 2)], 1000)
    small = _write(tmp_path / "small.parquet", [f"{n:06d}" for n in range(1, 100_000, 994)], 10)  # 101 odd keys
    footers = FooterCache()
    wanted = [f"{n:06d}" for n in range(0, 100_000, 2_000)]  # 50 values, none in the small run
    got = read_where([big, small], "k", pl.Series(wanted), footers, SCHEMA)
    assert sorted(got["k"].to_list()) == wanted
    assert footers.groups_read == 50  # one group of the big run per value, none of the small run
    values = pl.Series([*wanted[::5], "000995", "099401"])  # spread, and two of the small run
    got = read_where([big, small], "k", values, footers, SCHEMA)
    assert sorted(got["k"].to_list()) == sorted(values.to_list())
    big_alone = FooterCache()
    read_where([big], "k", values, big_alone, SCHEMA)
    assert footers.groups_read == 50 + big_alone.groups_read + 2  # the small run's two groups that hold a value


def test_a_row_group_that_overlaps_others_is_tested_on_its_own(tmp_path: Path) -> None:
    """A writer that reorders its input can cut a row group across two distant stretches of
    keys: that group is tested by its own range, the others still by bisection."""
    keys = ["a", "b", "c", "d", "e", "f", "g", "h"]
    frame = pl.DataFrame({"k": ["a", "b", "c", "y", "d", "e", "f", "g"], "v": list(range(8))}, schema=SCHEMA)
    path = tmp_path / "overlap.parquet"
    pq.write_table(frame.to_arrow(), path, row_group_size=2)  # [a,b] [c,y] [d,e] [f,g]
    footers = FooterCache()
    fences = footers.fences(str(path), "k")
    assert fences.starts is not None and [w[2] for w in fences.wide] == [1]
    assert fences.groups(np.array([b"e"])) == [1, 2]  # [c,y] may hold it too
    assert fences.groups(np.array([b"z"])) == []
    got = read_where([str(path)], "k", pl.Series([*keys, "y"]), footers, SCHEMA)
    assert sorted(got["k"].to_list()) == sorted(frame["k"].to_list())


def test_a_file_whose_row_groups_mostly_overlap_is_read_whole(tmp_path: Path) -> None:
    keys = [f"{n:03d}" for n in range(400)]
    frame = pl.DataFrame({"k": keys[::2] + keys[1::2], "v": list(range(400))}, schema=SCHEMA)
    path = tmp_path / "interleaved.parquet"
    pq.write_table(frame.to_arrow(), path, row_group_size=10)  # every group spans half the keys
    footers = FooterCache()
    assert footers.fences(str(path), "k").starts is None
    got = read_where([str(path)], "k", pl.Series(["007", "300"]), footers, SCHEMA)
    assert sorted(got["k"].to_list()) == ["007", "300"]


def test_keys_with_nul_characters_are_read_exactly(tmp_path: Path) -> None:
    path = _write(tmp_path / "nul.parquet", ["a", "a\x00", "a\x00b", "b"], 1)
    footers = FooterCache()
    assert footers.fences(path, "k").starts is None  # numpy strings would drop the NULs
    assert read_where([path], "k", pl.Series(["a\x00"]), footers, SCHEMA)["k"].to_list() == ["a\x00"]
    plain = _write(tmp_path / "plain.parquet", ["a", "b", "c"], 1)
    assert read_where([plain], "k", pl.Series(["a\x00", "b"]), footers, SCHEMA)["k"].to_list() == ["b"]


def test_row_groups_written_out_of_order_still_prune(tmp_path: Path) -> None:
    """delta-rs writes streamed input in parallel, so a sorted file's row groups may come in
    any order: fences sort them, and a probe still reads one row group per key."""
    keys = [f"{n:05d}" for n in range(10_000)]
    path = _write(tmp_path / "shuffled.parquet", keys, 100, random.Random(7))
    footers = FooterCache()
    fences = footers.fences(path, "k")
    assert fences.starts is not None and fences.ends is not None and fences.order is not None
    assert sorted(fences.order.tolist()) != fences.order.tolist()  # really out of order
    wanted = np.array([b"00042", b"05000", b"09999"])
    positions = matching_groups(fences.starts, wanted, fences.ends)
    assert positions == [0, 50, 99]
    got = read_where([path], "k", pl.Series(["00042", "05000", "09999", "x"]), footers, SCHEMA)
    assert sorted(got["k"].to_list()) == ["00042", "05000", "09999"]


def test_values_outside_a_file_read_nothing_of_it(tmp_path: Path) -> None:
    """A key beyond a file's last row group, or in a gap between ranges, reads no row group."""
    starts = np.array(["b", "f"], dtype=str)
    ends = np.array(["d", "h"], dtype=str)
    assert matching_groups(starts, np.array(["a", "e", "z"], dtype=str), ends) == []
    assert matching_groups(starts, np.array(["d", "f"], dtype=str), ends) == [0, 1]


# --- files by the Delta log's statistics ---------------------------------------------------------
def test_files_whose_ranges_exclude_every_value_are_dropped() -> None:
    ranges = {"a": ("b", "d"), "b": ("e", "g"), "c": (None, None), "d": ("x" * 64, "y" * 64)}
    paths = ["a", "b", "c", "d", "e"]  # "c" has no statistics, "d" truncated ones, "e" none at all
    assert files_holding(paths, ranges, pl.Series(["d"])) == ["a", "c", "d", "e"]
    assert files_holding(paths, ranges, pl.Series(["a", "h"])) == ["c", "d", "e"]
    assert files_holding(paths, ranges, pl.Series(["c", "f"])) == paths
    assert files_holding(paths, ranges, pl.Series(["b\x00"])) == ["a", "c", "d", "e"]  # exact, NULs and all


@settings(max_examples=50, deadline=None)
@given(st.lists(st.tuples(st.text(max_size=3), st.text(max_size=3)), max_size=6),
       st.lists(st.text(max_size=3), min_size=1, max_size=5))
def test_a_dropped_file_holds_none_of_the_values(bounds: list[tuple[str, str]], values: list[str]) -> None:
    ranges = {str(n): (min(pair), max(pair)) for n, pair in enumerate(bounds)}
    kept = files_holding(list(ranges), ranges, pl.Series(values, dtype=pl.String))
    for path, (low, high) in ranges.items():
        assert (path in kept) == any(low <= v <= high for v in values)


@pytest.mark.parametrize("name", ["store", "a store 100%"])  # file URIs come percent-encoded
def test_a_point_probe_opens_only_the_files_that_can_hold_its_key(tmp_path: Path, name: str) -> None:
    """With a run per batch, exporting one user reads the footer of one external-ID file, not
    of every run's."""
    ws = open_ws(tmp_path, name)
    ws.store.merge_trigger = 10**9
    for batch in range(4):
        track_ok(ws, attributes=[{"external_id": f"b{batch}-u{n}"} for n in range(3)])
    ws = open_ws(tmp_path, name)  # a fresh process: no footer cached
    files = ws.store.files("external_ids", ws.store.head.versions["external_ids"])
    assert len(files) == 4
    assert [u["external_id"] for u in export_users(ws, ["external_id"], external_ids=["b2-u1"])] == ["b2-u1"]
    read = [path for (path, column) in ws.store.footers._fences if column == "external_id"]
    assert len(read) == 1 and "b2-u1" in pl.read_parquet(read[0])["external_id"].to_list()


def test_footers_are_kept_within_their_budget(tmp_path: Path) -> None:
    """The cache keeps the most recently used footers within its budget and reads an evicted
    one again when a probe needs it."""
    paths = [_write(tmp_path / f"f{i}.parquet", [f"{i}-{n:04d}" for n in range(2_000)], 100) for i in range(3)]
    cost = FooterCache().fences(paths[0], "k").nbytes + read_footer(paths[0])[0].nbytes
    footers = FooterCache(budget=2 * cost + cost // 2)  # room for two
    for path in paths:
        footers.fences(path, "k")
    assert footers.footers_read == 3 and footers.held <= footers.budget
    footers.fences(paths[2], "k")  # kept: no parse
    assert footers.footers_read == 3
    got = read_where(paths, "k", pl.Series(["0-0001", "1-0002", "2-0003"]), footers, SCHEMA)
    assert sorted(got["k"].to_list()) == ["0-0001", "1-0002", "2-0003"]  # right, though evicted
    assert footers.footers_read == 4 and footers.held <= footers.budget  # the first parsed again


def test_the_footer_budget_is_half_the_memory_budget() -> None:
    assert runs.footer_budget("2GB") == 1_000_000_000
    assert runs.footer_budget("512MiB") == 256 * 2**20
    assert runs.footer_budget(None) == runs.footer_budget("lots") == runs.FOOTER_CACHE_BYTES


def test_a_point_read_decodes_only_the_columns_asked_for(tmp_path, monkeypatch) -> None:
    """The log reads of an export skip the properties (`HISTORY_READ`): pyarrow is asked for the
    probe column and the columns wanted, nothing else."""
    path = tmp_path / "f.parquet"
    frame = pl.DataFrame({"k": [f"{i:04d}" for i in range(4_000)], "v": range(4_000), "big": ["x" * 50] * 4_000})
    frame.write_parquet(path, row_group_size=100)
    asked = []
    read = footers_module.Footer.read

    def spy(self, *args, **kwargs):  # what pyarrow's reader decoded, watched
        rows = read(self, *args, **kwargs)
        asked.append(rows.column_names)
        return rows

    monkeypatch.setattr(footers_module.Footer, "read", spy)
    schema = {"k": pl.String(), "v": pl.Int64(), "big": pl.String()}
    got = read_where([str(path)], "k", pl.Series(["0007", "3999"]), FooterCache(), schema, ["v"])
    assert got.to_dict(as_series=False) == {"v": [7, 3_999]}
    assert asked == [["k", "v"]]


def test_a_bloom_filter_skips_the_files_that_hold_none_of_the_keys(tmp_path) -> None:
    """Keys a big run lacks (users who live in newer runs) still name its row groups by their
    fences; an indexed file's Bloom filter rules them out, so no row group is read."""
    folder = tmp_path / "profiles"
    folder.mkdir()
    keys = [f"{i:06d}" for i in range(0, 200_000, 2)]  # the even keys; the odd ones are absent
    path = _write(folder / "f.parquet", keys, 1_000)
    absent = pl.Series([f"{i:06d}" for i in range(1, 200_000, 500)])  # 400 odd keys over the whole range
    plain = FooterCache()
    assert read_where([path], "k", absent, plain, SCHEMA).height == 0
    assert plain.groups_read > 0  # fences alone: every absent key names a row group
    FooterCache(root=str(tmp_path)).index([path], "k")
    indexed = FooterCache(root=str(tmp_path))
    assert read_where([path], "k", absent, indexed, SCHEMA).height == 0
    assert indexed.groups_read * 10 < plain.groups_read  # a false positive reads a row group
    few = FooterCache(root=str(tmp_path))
    assert read_where([path], "k", absent[:20], few, SCHEMA).height == 0 and few.groups_read <= 2
    some = pl.concat([absent, pl.Series(["000002", "199998"])])
    assert read_where([path], "k", some, indexed, SCHEMA).sort("k")["k"].to_list() == ["000002", "199998"]


SPARSE = {"k": pl.String(), "s": pl.String(), "n": pl.Int64(), "l": pl.List(pl.Float64())}
LISTS = st.sampled_from([None, [], [1.5], [0.0, -2.0]])


@settings(max_examples=60, deadline=None)
@given(
    rows=st.lists(st.tuples(st.sampled_from(KEYS), st.sampled_from([None, None, "x", "é"]),
                            st.sampled_from([None, None, None, 7]), LISTS), min_size=1, max_size=40),
    group=st.integers(1, 6),
    wanted=st.lists(st.sampled_from([*KEYS, "ü"]), min_size=1, max_size=6),
    asked=st.sampled_from([None, ["s"], ["n", "l"], ["k", "s", "n", "l"]]),
)
def test_a_point_read_skips_null_column_chunks_and_returns_what_a_filter_returns(
        tmp_path_factory, rows, group, wanted, asked) -> None:
    """Columns whose chunks hold only nulls in the row groups read are left out of the read and
    come back null; a list column is always read (an empty list is a null to the statistics)."""
    path = tmp_path_factory.mktemp("sparse") / "f.parquet"
    frame = pl.DataFrame(rows, schema=SPARSE, orient="row").sort("k", maintain_order=True)
    pq.write_table(frame.to_arrow(), path, row_group_size=group)
    values = pl.Series(wanted, dtype=pl.String)
    share, per_group = runs.WHOLE_FILE_SHARE, runs.WHOLE_FILE_KEYS_PER_GROUP
    runs.WHOLE_FILE_SHARE, runs.WHOLE_FILE_KEYS_PER_GROUP = 0, 1 << 30  # row groups, never the whole file
    try:
        got = read_where([str(path)], "k", values, FooterCache(), SPARSE, asked)
    finally:
        runs.WHOLE_FILE_SHARE, runs.WHOLE_FILE_KEYS_PER_GROUP = share, per_group
    expected = frame.filter(pl.col("k").is_in(values.implode())).select(asked or list(SPARSE))
    assert got.schema == expected.schema
    assert sorted(map(repr, got.rows())) == sorted(map(repr, expected.rows()))


def test_held_columns_leave_out_only_columns_null_in_every_group_read(tmp_path: Path) -> None:
    path = tmp_path / "f.parquet"
    frame = pl.DataFrame({"k": ["a", "b", "c", "d"], "s": [None, None, "x", None],
                          "n": [None, None, None, None], "l": [None, None, None, None]},
                         schema=SPARSE)
    pq.write_table(frame.to_arrow(), path, row_group_size=2)
    footer, metadata = read_footer(str(path))
    leaves = footer.leaves(metadata)
    assert leaves == {"k": (0,), "s": (1,), "n": (2,), "l": (3, NESTED)}  # a list: one leaf
    wanted = ["k", "s", "n", "l"]
    assert held_columns(metadata, [0], wanted, "k", leaves) == ["k", "l"]
    assert held_columns(metadata, [0, 1], wanted, "k", leaves) == ["k", "s", "l"]
    assert held_columns(metadata, [1], ["s", "n"], "k", leaves) == ["s"]
    # a read leaves out the null columns only; the list and the key always come back
    assert footer.read([1], wanted, "k").column_names == ["k", "s", "l"]
    assert footer.read([0], None, "k").column_names == ["k", "l"]
    assert footer.read([0, 1], None, "k").to_pydict()["s"] == [None, None, "x", None]


@settings(max_examples=60, deadline=None)
@given(
    files=st.lists(st.lists(st.sampled_from(KEYS), min_size=0, max_size=40), min_size=1, max_size=3),
    group=st.integers(1, 7),
    batch=st.integers(1, 9),
    wanted=st.lists(st.sampled_from([*KEYS, "k", "ü"]), min_size=1, max_size=5),
    share=st.sampled_from([0, 8, 1 << 20]),
    fence=st.sampled_from([1, 2, 3, 256]),
    preads=st.booleans(),
)
def test_rows_taken_from_row_addressable_copies_equal_a_filter(tmp_path_factory, files, group, batch, wanted,
                                                                share, fence, preads) -> None:
    """A file of a table in `records.TABLES` indexed by a writer has a row-addressable copy: a
    probe of few values takes its rows there (every row of a key, however the copy's batches
    cut them), a bigger one reads the file as before; both return what a filter returns."""
    root = tmp_path_factory.mktemp("store")
    folder = root / "external_ids"
    folder.mkdir()
    paths, frames = [], []
    for i, keys in enumerate(files):
        if keys:
            paths.append(_write(folder / f"f{i}.parquet", keys, group))
            frames.append(pl.read_parquet(paths[-1]))
    values = pl.Series(wanted, dtype=pl.String)
    saved = records.BATCH_ROWS, runs.RECORDS_SHARE, records.FENCE_EVERY, records.PREAD_KEYS
    # a small probe's keys read by `pread` between fences (every `fence`-th hash), or searched in the map
    records.BATCH_ROWS, runs.RECORDS_SHARE, records.FENCE_EVERY = batch, share, fence
    records.PREAD_KEYS = 1024 if preads else 0
    try:
        FooterCache(root=str(root)).index(paths, "k")
        footers = FooterCache(root=str(root))
        got = read_where(paths, "k", values, footers, SCHEMA)
        projected = read_where(paths, "k", values, footers, SCHEMA, ["v"])
    finally:
        records.BATCH_ROWS, runs.RECORDS_SHARE, records.FENCE_EVERY, records.PREAD_KEYS = saved
    every = pl.concat(frames) if frames else pl.DataFrame(schema=SCHEMA)
    expected = every.filter(pl.col("k").is_in(values.implode()))
    assert sorted(got.rows()) == sorted(expected.rows())
    assert sorted(projected.rows()) == sorted(expected.select("v").rows())
    if share == 0 and paths:
        assert footers.groups_read == 0  # every file probed through its copy
        assert footers.rows_taken >= expected.height


def test_a_copy_held_by_a_reader_still_answers_once_its_files_are_removed(tmp_path: Path) -> None:
    """A run merge removes the copies of the files it replaced while a reader may still hold
    them: the held copy still takes rows, its keys read with `pread` from the file it keeps open."""
    folder = tmp_path / "external_ids"
    folder.mkdir()
    path = _write(folder / "f.parquet", [f"k{n:04d}" for n in range(3_000)], 100)
    FooterCache(root=str(tmp_path)).index([path], "k")
    index = footers_module.index_path(str(tmp_path), path)
    held = records.load(index)
    assert held is not None and held.keys_file is not None
    records.remove(index)
    assert not any(Path(p).exists() for p in records.paths(index))
    taken = held.take(membership.hashes(pl.Series(["k0007", "k2999", "absent"])))
    assert sorted(taken.column("v").to_pylist()) == [7, 2_999]


def test_a_copy_is_found_only_whole_and_pruned_with_its_file(tmp_path: Path) -> None:
    folder = tmp_path / "external_ids"
    folder.mkdir()
    path = _write(folder / "f.parquet", [f"k{n:03d}" for n in range(300)], 50)
    FooterCache(root=str(tmp_path)).index([path], "k")
    index = footers_module.index_path(str(tmp_path), path)
    copy, keys, fence = records.paths(index)
    found = records.load(index)
    assert found is not None and found.fence is not None
    assert found.take(membership.hashes(pl.Series(["k007"]))).column("v").to_pylist() == [7]
    Path(fence).unlink()  # a copy written before fences: its keys are searched through the map
    older = records.load(index)
    assert older is not None and older.fence is None
    assert older.take(membership.hashes(pl.Series(["k007", "k299"]))).column("v").to_pylist() == [7, 299]
    Path(keys).write_bytes(b"cut short")
    assert records.load(index) is None  # a copy without its whole keys is not used
    Path(keys).unlink()  # a file indexed before its table kept copies: the next index() writes one
    assert FooterCache(root=str(tmp_path)).index([path], "k") == 1 and records.load(index) is not None
    Path(path).unlink()
    assert footers_module.prune_indexes(str(tmp_path)) == 5  # the index, the filter, the copy, its keys, fences
    assert not Path(copy).exists() and not Path(keys).exists() and not Path(fence).exists()
