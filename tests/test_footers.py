"""Footers kept as bytes (`store/footers.py`): a read of some row groups through a spliced
footer returns exactly what the whole footer reads."""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
from deltalake import write_deltalake
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engagelake import Workspace
from engagelake.store import layout, records, writes
from engagelake.store.footers import (
    BLOOM_SUFFIX,
    INDEX_FOLDER,
    INDEX_SUFFIX,
    data_file_of,
    read_footer,
)
from engagelake.store.runs import SORT_BY, FooterCache, read_where
from helpers import event, export_one, open_ws, track_ok

# keys with the bytes of the compact protocol's field headers and varints, so that statistics
# can look like the entries the splice searches for ("\x19<&" starts a row group of 3 columns)
KEY_CHARS = st.sampled_from(["a", "z", "<", "&", "\x16", "\x19", "\x80", "\x10", "\x00", "\x7f", "é", "\U0001f600"])
ENTRY_START = "\x19<"


def _expected(path: str, groups: list[int]) -> pa.Table:
    whole = pq.ParquetFile(path)
    return pa.concat_tables([whole.read_row_group(g) for g in groups])


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    keys=st.lists(st.text(KEY_CHARS, min_size=0, max_size=12), min_size=1, max_size=300),
    group_rows=st.integers(1, 40),
    picks=st.lists(st.integers(0, 10_000), min_size=1, max_size=8),
)
def test_a_spliced_footer_reads_what_the_whole_footer_reads(tmp_path_factory, keys, group_rows, picks) -> None:
    path = str(tmp_path_factory.mktemp("footer") / "f.parquet")
    table = pa.table({"k": sorted(keys), "n": list(range(len(keys))), "f": [len(k) * 0.5 for k in keys]})
    pq.write_table(table, path, row_group_size=group_rows)
    footer, metadata = read_footer(path)
    if not any(ENTRY_START in key for key in keys):  # else a statistic may look like an entry's start
        assert footer.parsed is None  # pyarrow's layout is spliced
    assert footer.num_rows == len(keys) and footer.num_row_groups == metadata.num_row_groups
    groups = sorted({p % footer.num_row_groups for p in picks})
    file, local = footer.open(groups)
    assert file.read_row_groups(local).equals(_expected(path, groups))
    if footer.parsed is None:
        assert footer.nbytes < metadata.serialized_size * 2  # bytes, not parsed structures


def test_files_written_by_delta_rs_are_spliced(tmp_path: Path) -> None:
    table = pa.table({"k": [f"user-{n:06d}" for n in range(5_000)], "v": list(range(5_000))})
    write_deltalake(tmp_path, table, writer_properties=None)
    [path] = [str(p) for p in tmp_path.glob("*.parquet")]
    footer, _ = read_footer(path)
    assert footer.parsed is None
    file, local = footer.open([0])
    assert file.read_row_groups(local).equals(_expected(path, [0]))


def test_a_footer_that_cannot_be_spliced_is_kept_parsed(tmp_path: Path) -> None:
    """A row group with `sorting_columns` has a list after its row count: its entry's end is
    not searched for, and the footer is kept whole."""
    path = str(tmp_path / "sorted.parquet")
    table = pa.table({"k": [f"k{n:04d}" for n in range(1_000)]})
    pq.write_table(table, path, row_group_size=100, sorting_columns=[pq.SortingColumn(0)])
    footer, _ = read_footer(path)
    assert footer.parsed is not None
    file, local = footer.open([7, 2])
    assert file.read_row_groups(local).equals(_expected(path, [7, 2]))


def test_a_statistic_that_looks_like_an_entry_is_caught(tmp_path: Path) -> None:
    """Keys holding the bytes an entry starts with (and a file offset's field header), after a
    stop byte: the false start would shift every later entry, the check of the last one sees
    it, and the footer is kept parsed."""
    path = str(tmp_path / "tricky.parquet")
    keys = [f"a{n:03d}" for n in range(40)] + [("\x00" + ENTRY_START + "&") * 2] * 10 + [f"z{n:03d}" for n in range(50)]
    pq.write_table(pa.table({"k": keys, "n": list(range(100)), "f": [0.5] * 100}), path, row_group_size=10)
    footer, _ = read_footer(path)
    assert footer.parsed is not None
    file, local = footer.open([9, 4, 0])
    assert file.read_row_groups(local).equals(_expected(path, [9, 4, 0]))


def test_a_statistic_that_looks_like_an_entry_is_passed_over(tmp_path: Path) -> None:
    """Without a stop byte before them, those bytes are not taken for an entry's start."""
    path = str(tmp_path / "tricky.parquet")
    keys = [f"a{n:03d}" for n in range(40)] + [ENTRY_START * 2] * 10 + [f"z{n:03d}" for n in range(50)]
    pq.write_table(pa.table({"k": keys, "n": list(range(100)), "f": [0.5] * 100}), path, row_group_size=10)
    footer, _ = read_footer(path)
    assert footer.parsed is None
    file, local = footer.open([9, 4, 0])
    assert file.read_row_groups(local).equals(_expected(path, [9, 4, 0]))


def _indexes(store: Path) -> set[str]:
    return {p.name.removesuffix(INDEX_SUFFIX) for p in (store / INDEX_FOLDER).rglob(f"*{INDEX_SUFFIX}")}


def _blooms(store: Path) -> set[str]:
    """The data files that have a Bloom filter (`store/membership.py`)."""
    return {p.name.split(".parquet.")[0] + ".parquet" for p in (store / INDEX_FOLDER).rglob(f"*{BLOOM_SUFFIX}")}


def _copies(store: Path) -> set[str]:
    """The data files that have a row-addressable copy (`store/records.py`)."""
    return {p.name.split(".parquet.")[0] + ".parquet" for p in (store / INDEX_FOLDER).rglob(f"*{records.KEYS_SUFFIX}")}


def _sorted_files(ws: Workspace) -> set[str]:
    head = ws.store.ledger.read_head()
    return {Path(f).name for name in SORT_BY for f in ws.store.files(name, head.versions.get(name))}


def test_run_merges_and_compaction_index_their_files_and_a_fresh_reader_parses_no_footer(tmp_path: Path) -> None:
    ws = open_ws(tmp_path)
    ws.store.background_merges = False
    ws.store.merge_trigger = 2
    for batch in range(4):
        track_ok(ws, attributes=[{"external_id": f"b{batch}-u{n}", "plan": "pro"} for n in range(5)],
                 events=[event(external_id=f"b{batch}-u0")])
    assert ws.store.merges  # runs were merged: their new files are indexed
    merged = _indexes(tmp_path / "store")
    assert merged and merged <= _sorted_files(ws)
    assert _blooms(tmp_path / "store") == merged  # each indexed file has its keys' filter
    ext_ids = {Path(f).name for f in ws.store.files("external_ids", ws.store.ledger.read_head().versions["external_ids"])}
    assert _copies(tmp_path / "store") == merged & ext_ids  # and the identity table's a row-addressable copy
    track_ok(ws, attributes=[{"external_id": "b0-u1", "_update_existing_only": True, "plan": "free"}])
    delete = ws.call("POST", "/users/delete", {"external_ids": ["b3-u4"]})
    assert delete.status == 200, delete
    ws.compact()
    assert _indexes(tmp_path / "store") == _sorted_files(ws)  # the vacuumed files' indexes are gone
    assert _blooms(tmp_path / "store") == _sorted_files(ws)  # and their filters
    assert _copies(tmp_path / "store") == _sorted_files(ws) & {
        Path(f).name for f in ws.store.files("external_ids", ws.store.ledger.read_head().versions["external_ids"])}
    text = "".join(p.read_bytes().decode("latin-1") for p in (tmp_path / "store" / INDEX_FOLDER).rglob("*") if p.is_file())
    assert "b3-u4" not in text  # an erased user's key is in no index

    fresh = open_ws(tmp_path)
    assert export_one(fresh, "b0-u1", ["custom_attributes"]) == {"custom_attributes": {"plan": "free"}}
    assert fresh.store.footers.footers_read > 0 and fresh.store.footers.footers_parsed == 0
    assert export_one(fresh, "b0-u2", ["custom_attributes"]) == {"custom_attributes": {"plan": "pro"}}
    assert export_one(fresh, "nobody", ["custom_attributes"]) is None  # absent keys: ruled out by the filters


def test_a_batchs_big_runs_are_indexed_before_its_ledger_row(tmp_path: Path, monkeypatch) -> None:
    """A commit indexes the runs it writes of at least INDEXED_RUN_ROWS rows, before its ledger
    row: a fresh reader probes them by their index and Bloom filter, never their footers, and a
    key they lack reads none of their row groups."""
    monkeypatch.setattr(writes, "INDEXED_RUN_ROWS", 40)
    ws = open_ws(tmp_path)
    ws.store.background_merges = False
    store = tmp_path / "store"
    seen: list[set[str]] = []

    def at(name: str) -> None:
        if name == "before_ledger":
            seen.append(_blooms(store))

    monkeypatch.setattr(layout, "failpoint", at)
    track_ok(ws, attributes=[{"external_id": f"u{n}", "plan": "pro"} for n in range(50)])
    track_ok(ws, attributes=[{"external_id": "u0", "plan": "free"}])  # a small run: not indexed
    monkeypatch.undo()
    indexed = _indexes(store)
    assert indexed == _blooms(store) == seen[0]  # indexed before the first batch's ledger row
    assert seen[1] == seen[0]
    big = {Path(f).name for name in ("profiles", "attributes", "external_ids")
           for f in ws.store.files(name, ws.store.head.versions[name])[:1]}
    small = {Path(f).name for f in ws.store.files("attributes", ws.store.head.versions["attributes"])[1:]}
    assert big <= indexed and not small & indexed

    copies = {p.name.split(".parquet.")[0] + ".parquet" for p in (store / INDEX_FOLDER / "external_ids").glob(
        f"*{records.KEYS_SUFFIX}")}
    assert copies == {Path(f).name for f in ws.store.files("external_ids", ws.store.head.versions["external_ids"])[:1]}

    fresh = open_ws(tmp_path)
    assert export_one(fresh, "nobody", ["custom_attributes"]) is None
    assert fresh.store.footers.groups_read == 0  # ruled out by the filters: no row group read
    assert export_one(fresh, "u7", ["custom_attributes"]) == {"custom_attributes": {"plan": "pro"}}
    assert fresh.store.footers.rows_taken == 1  # u7's external ID, taken from the run's copy
    assert export_one(fresh, "u0", ["custom_attributes"]) == {"custom_attributes": {"plan": "free"}}


def test_a_merged_away_files_copy_goes_at_once_and_the_file_still_reads(tmp_path: Path, monkeypatch) -> None:
    """Copies are the biggest caches: a run merge removes those of the files it replaced, not
    compaction. A reader still at the head before the merge (a batch under way) reads those
    files' row groups."""
    monkeypatch.setattr(writes, "INDEXED_RUN_ROWS", 1)  # every run indexed, copies included
    ws = open_ws(tmp_path)
    ws.store.background_merges = False
    ws.store.merge_trigger = 2
    store = tmp_path / "store"
    track_ok(ws, attributes=[{"external_id": f"b0-u{n}", "plan": "pro"} for n in range(5)])
    first = ws.store.files("external_ids", ws.store.ledger.read_head().versions["external_ids"])
    for batch in range(1, 5):
        track_ok(ws, attributes=[{"external_id": f"b{batch}-u{n}", "plan": "pro"} for n in range(5)])
    assert ws.store.merges
    current = {Path(f).name for f in ws.store.files("external_ids", ws.store.ledger.read_head().versions["external_ids"])}
    assert not {Path(f).name for f in first} & current  # the first run was merged away
    assert _copies(store) == current  # every current file has its copy, no replaced one has
    assert _indexes(store) > _sorted_files(ws)  # the replaced files' indexes stay until compaction
    footers = FooterCache(root=str(store))
    rows = read_where(first, "external_id", pl.Series(["b0-u2"]), footers, layout.stored_schema("external_ids"))
    assert rows["external_id"].to_list() == ["b0-u2"]
    assert footers.rows_taken == 0 and footers.groups_read == 1


def _caches_note(ws: Workspace) -> str:
    notes = [n for n in Workspace.check(ws.store.uri).notes if n.startswith("read caches")]
    assert len(notes) == 1, notes
    return notes[0]


def test_check_counts_the_read_caches_and_those_of_merged_away_files(tmp_path: Path) -> None:
    """`engagelake check` says what `_footers/` holds, and how much of it serves data files the
    ledger's versions no longer use (merged away, until a compaction vacuums them)."""
    ws = open_ws(tmp_path)
    ws.store.background_merges = False
    ws.store.merge_trigger = 2
    for batch in range(10):  # merged runs are indexed, and merged again
        track_ok(ws, attributes=[{"external_id": f"b{batch}-u{n}", "plan": "pro"} for n in range(5)])
    folder = tmp_path / "store" / INDEX_FOLDER
    files = [p for p in folder.rglob("*") if p.is_file()]
    stale = [p for p in files if data_file_of(p.name) not in _sorted_files(ws)]
    assert stale, "the merges left caches of the files they replaced"
    note = _caches_note(ws)
    assert f": {len(files):,} files, " in note and f"; {len(stale):,} of them (" in note, note
    ws.compact()
    kept = [p for p in folder.rglob("*") if p.is_file()]
    assert _caches_note(ws).endswith(f": {len(kept):,} files, {sum(p.stat().st_size for p in kept) / 2**20:,.1f} MiB")
