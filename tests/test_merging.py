"""Merging sorted runs (`store/merging.py`): the policy, and stores that merge read exactly like
stores that never do."""

from __future__ import annotations

import shutil
import signal
from dataclasses import replace
from pathlib import Path

import polars as pl
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable, write_deltalake
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from polars.testing import assert_frame_equal
from tests.crash_worker import run_worker
from tests.helpers import open_ws, state_snapshot, track_ok
from tests.test_model_property import population, requests

from engagelake import Workspace
from engagelake.errors import StaleStoreError
from engagelake.store.merging import Run, plan, runs_of
from engagelake.store.runs import SORT_BY, FooterCache
from engagelake.tables.changes import Changes
from engagelake.tables.schema import INDEXES

NEVER = 10**9


def _run(first: int, last: int, rows: int) -> Run:
    return Run(first, last, rows, (f"f{first}",))


def test_no_merge_until_the_trigger() -> None:
    runs = [_run(4, 4, 10), _run(3, 3, 10), _run(2, 2, 10), _run(1, 1, 10)]
    assert plan(runs, 10, trigger=4) == []
    assert plan(runs, 10, trigger=3) == runs  # equal sizes merge all the way down


def test_a_small_batch_merges_only_with_small_runs() -> None:
    """Size ratio 2: the batch takes each next older run while it is at most twice the rows
    gathered so far, so the big bottom run waits until as many rows piled up above it."""
    runs = [_run(9, 9, 10), _run(8, 8, 15), _run(5, 7, 100), _run(1, 4, 10_000)]
    assert plan(runs, 10, trigger=2) == runs[:2]  # 15 <= 2*20, then 100 > 2*35
    assert plan(runs, 1, trigger=2) == []  # 10 > 2*1: nothing to merge yet
    assert plan(runs, 6_000, trigger=2) == runs  # the batch is big enough to rewrite the bottom


def test_runs_stay_few_as_equal_batches_pile_up() -> None:
    """Simulate 500 batches of 1,000 rows: the number of runs grows like log2 of the batches,
    and each row is rewritten about as often."""
    runs: list[Run] = []
    written = 0
    for batch in range(1, 501):
        merged = plan(runs, 1_000, trigger=4)
        rows = 1_000 + sum(r.rows for r in merged)
        written += rows
        first = merged[-1].first if merged else batch
        runs = [Run(first, batch, rows, ()), *runs[len(merged):]]
        assert len(runs) <= 4 + 1 + 9  # trigger, the batch's own, log2(500)
    assert written / 500_000 <= 10  # rows written per row ingested


def test_runs_of_groups_files_whose_batches_overlap() -> None:
    actions = pl.DataFrame({
        "path": ["a", "b", "c", "d"], "num_records": [5, 6, 7, 8],
        "min._batch": [1, 3, 3, 6], "max._batch": [2, 5, 4, 6],
    })
    runs = runs_of(actions, "/t")
    assert [(r.first, r.last, r.rows) for r in runs] == [(6, 6, 8), (3, 5, 13), (1, 2, 5)]
    assert runs[1].files == ("/t/b", "/t/c")
    assert runs_of(actions.with_columns(pl.lit(None, pl.Int64).alias("min._batch")), "/t") == []


def _fenced(ws: Workspace) -> None:
    """Every file of every sorted table can be probed by its fences."""
    footers = FooterCache()
    for name, column in SORT_BY.items():
        for path in ws.store.files(name, ws.store.head.versions.get(name)):
            assert footers.fences(path, column).starts is not None, (name, path)


def _pair(root: Path) -> tuple[Workspace, Workspace]:
    merged, plain = open_ws(root, "merged"), open_ws(root, "plain")
    merged.store.merge_trigger, plain.store.merge_trigger = 0, NEVER
    return merged, plain


@pytest.mark.slow  # a property: each example writes two stores batch by batch
@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(first=population(), batches=st.lists(st.lists(requests, min_size=1, max_size=3), min_size=3, max_size=6))
def test_a_store_that_merges_answers_like_one_that_never_does(tmp_path_factory, first, batches) -> None:
    """Random batches of every endpoint into a store that merges whenever the size ratio lets
    it and into one that never merges: same responses, same current rows, same exports."""
    merged, plain = _pair(tmp_path_factory.mktemp("merging"))
    for batch in [first, *batches]:
        assert merged.apply(batch) == plain.apply(batch)
    assert state_snapshot(merged) == state_snapshot(plain)
    _fenced(merged)


def test_merging_down_to_the_bottom_drops_tombstones_and_shadowed_rows(tmp_path: Path) -> None:
    """Unset and deleted keys leave tombstones in the log; a merge above the bottom keeps them
    (they shadow older runs), one that reaches the bottom run drops them with what they shadow."""
    merged, plain = _pair(tmp_path)
    for ws in (merged, plain):
        track_ok(ws, attributes=[{"external_id": f"u{n}", "score": n, "nick": "x"} for n in range(4)])
        track_ok(ws, attributes=[{"external_id": "u1", "score": None}])  # an unset: a tombstone
        ws.call("POST", "/users/delete", {"external_ids": ["u2"]})
        track_ok(ws, attributes=[{"external_id": f"u{n}", "nick": "y"} for n in (0, 1, 3)])
    merged.store.wait_for_merges()
    assert state_snapshot(merged) == state_snapshot(plain)
    files = DeltaTable(f"{merged.store.uri}/attributes").file_uris()
    stored = pl.read_parquet(files)
    assert len(files) == 1 and not stored["_deleted"].any()  # one run, current rows only
    assert stored.height == merged.table("attributes").collect().height == 5  # u0, u1, u3: 2+1+2
    assert len(DeltaTable(f"{plain.store.uri}/attributes").file_uris()) == 4
    _fenced(merged)


def test_a_merge_streams_within_the_memory_budget(tmp_path: Path) -> None:
    """The merge runs in DuckDB under the workspace's memory limit and spills beyond it."""
    ws = open_ws(tmp_path)
    ws.memory_limit = ws.store.memory_limit = "64MB"
    ws.store.merge_trigger = 0
    for start in range(0, 3_000, 1_000):  # 1,000 rows merge with 1,000, then 2,000
        batch = [{"method": "POST", "path": "/users/track", "body": {
            "attributes": [{"external_id": f"u{n:05d}", "n": n} for n in range(first, first + 50)]}}
            for first in range(start, start + 1_000, 50)]
        assert {r.status for r in ws.apply(batch)} == {201}
    ws.store.wait_for_merges()
    ws.store.refresh()
    assert len(ws.store.runs("attributes", ws.store.head.versions["attributes"])) == 1
    assert ws.table("attributes").collect().height == 3_000
    _fenced(ws)


def test_probes_by_a_secondary_column_read_its_index(tmp_path: Path) -> None:
    """Email and phone lookups, and the owner lookups of an export (aliases, push tokens, history
    redirected by a merge), read the index tables, never a whole column; an index keeps stale
    entries (a changed email) that the reader drops."""
    ws = open_ws(tmp_path)
    track_ok(ws, attributes=[
        {"external_id": "a", "email": "a@x.com", "phone": "+14155550100"},
        {"user_alias": {"alias_name": "anon", "alias_label": "web"}, "_update_existing_only": False},
    ])
    ws.call("POST", "/users/merge", {"merge_updates": [{
        "identifier_to_merge": {"user_alias": {"alias_name": "anon", "alias_label": "web"}},
        "identifier_to_keep": {"external_id": "a"}}]})
    track_ok(ws, attributes=[{"external_id": "a", "email": "b@x.com"}])  # a@x.com goes stale
    ws.store.column_scans.clear()
    assert export_one_by(ws, email_address="b@x.com") == ["a"]
    assert export_one_by(ws, email_address="a@x.com") == []
    assert export_one_by(ws, phone="+14155550100") == ["a"]
    track_ok(ws, attributes=[{"email": "b@x.com", "nick": "by email"}])
    assert ws.store.column_scans == []
    index = ws.table("profiles").collect()  # the reader's answer is the index-free answer
    snap = ws.store.snapshot()
    bare = type(snap)(ws.store, replace(snap.head, versions={
        k: v for k, v in snap.head.versions.items() if k not in INDEXES}))
    for column, values in (("email", ["a@x.com", "b@x.com"]), ("phone", ["+14155550100"])):
        wanted = pl.Series(values)
        assert_frame_equal(snap.probe("profiles", column, wanted), bare.probe("profiles", column, wanted),
                           check_row_order=False)
    assert ("profiles", "email") in ws.store.column_scans  # the bare head scanned the column
    assert index.height == 1


def test_compaction_rebuilds_indexes_from_current_rows(tmp_path: Path) -> None:
    ws = open_ws(tmp_path)
    track_ok(ws, attributes=[{"external_id": "a", "email": "a@x.com"}])
    track_ok(ws, attributes=[{"external_id": "a", "email": "b@x.com"}])
    before = pl.read_delta(f"{ws.store.uri}/_index_profiles_email")["email"].sort().to_list()
    assert before == ["a@x.com", "b@x.com"]
    ws.compact()
    after = pl.read_delta(f"{ws.store.uri}/_index_profiles_email")["email"].to_list()
    assert after == ["b@x.com"]
    assert export_one_by(ws, email_address="b@x.com") == ["a"]


def test_compaction_leaves_the_tables_nothing_was_written_to_as_they_are(tmp_path: Path) -> None:
    """A table still as the store's creation made it (and an index of such a table) has
    nothing to rewrite or erase: compaction keeps its version, and rewrites every other."""
    ws = open_ws(tmp_path)
    track_ok(ws, attributes=[{"external_id": "a", "email": "a@x.com"}])
    before = dict(ws.store.head.versions)
    ws.compact()
    after = ws.store.head.versions
    assert after["catalogs"] == before["catalogs"] == 0
    assert after["_index_push_tokens_device_id"] == before["_index_push_tokens_device_id"] == 0
    for name in ("profiles", "external_ids", "_index_profiles_email", "_index_external_ids_service_id",
                 "_index_profiles_phone"):  # written, or an index of a table written
        assert after[name] > before[name], name
    # a table written later is compacted like any other, and every table reads as before
    ws.call("POST", "/catalogs", {"catalogs": [{"name": "shop", "fields": [{"name": "id", "type": "string"}]}]})
    written = ws.store.head.versions["catalogs"]
    ws.compact()
    assert ws.store.head.versions["catalogs"] > written
    assert ws.table("catalogs").collect()["name"].to_list() == ["shop"]
    assert export_one_by(ws, email_address="a@x.com") == ["a"]


def _files_and_writers(ws: Workspace, name: str) -> tuple[int, set[str]]:
    """How many files the table's current version holds, and the Parquet writers that wrote them."""
    files = DeltaTable(f"{ws.store.uri}/{name}").file_uris()
    return len(files), {pq.read_metadata(f).created_by.split(" version")[0] for f in files}


@pytest.mark.parametrize("cap", [None, 1])
def test_compaction_streams_each_table_into_files_of_at_most_the_cap(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cap: int | None) -> None:
    """Compaction writes a table's current rows through engagelake's own writer, a new file
    once one holds `MERGED_FILE_BYTES` (at a row group's end): one file a table by default,
    a file per streamed chunk (here one 1,024-row group) with a 1-byte cap; the rows read back
    the same either way."""
    from engagelake.store import appends, layout, merging
    if cap is not None:
        monkeypatch.setattr(layout, "MERGED_FILE_BYTES", cap)
        monkeypatch.setattr(appends, "STREAM_CHUNK_GROUPS", 1)
        monkeypatch.setattr(merging, "STREAM_ROWS", 1_024)
    ws = open_ws(tmp_path)
    users = [{"external_id": f"u{i:05d}", "first_name": f"n{i}", "visits": i} for i in range(2_500)]
    requests = [{"method": "POST", "path": "/users/track", "body": {"attributes": users[i:i + 75]}}
                for i in range(0, 2_500, 75)]
    assert {r.status for r in ws.apply(requests)} == {201}
    track_ok(ws, attributes=[{"external_id": "u00007", "first_name": "again"}])  # a second run
    before = state_snapshot(ws)
    ws.compact()
    ws = open_ws(tmp_path)
    for name in ("profiles", "attributes", "external_ids"):
        files, writers = _files_and_writers(ws, name)
        rows = ws.table(name).collect().height
        assert files == (1 if cap is None else -(-rows // 1_024)), (name, files, rows)
        assert writers == {"parquet-cpp-arrow"}, writers  # pyarrow's, streamed; delta-rs' is parquet-rs
    assert state_snapshot(ws) == before


def test_a_batch_writes_index_entries_only_for_new_values(tmp_path: Path) -> None:
    ws = open_ws(tmp_path)
    track_ok(ws, attributes=[{"external_id": "a", "email": "a@x.com"}, {"external_id": "b", "email": "b@x.com"}])

    def entries() -> list[tuple[str, str]]:
        index = pl.read_delta(f"{ws.store.uri}/_index_profiles_email")
        return sorted(zip(index["email"].to_list(), index["service_id"].to_list(), strict=True))

    before = entries()
    assert len(before) == 2
    # the stored rows were read and rewritten with the same emails: their entries exist
    track_ok(ws, attributes=[{"external_id": "a", "first_name": "A"}, {"external_id": "b", "email": "b@x.com"}])
    assert entries() == before
    track_ok(ws, attributes=[{"external_id": "a", "email": "c@x.com"}])
    assert len(entries()) == 3
    assert export_one_by(ws, email_address="c@x.com") == ["a"]
    assert export_one_by(ws, email_address="a@x.com") == []
    assert export_one_by(ws, email_address="b@x.com") == ["b"]


def export_one_by(ws: Workspace, **identifier: str) -> list[str]:
    (kind, value), = identifier.items()
    fields = ["external_id", "user_aliases", "push_tokens", "custom_events"]
    r = ws.call("POST", "/users/export/ids", {kind: value, "fields_to_export": fields})
    assert r.status == 200, r
    return [u["external_id"] for u in r.body["users"]]


def _without_indexes(root: Path) -> Workspace:
    """A store as one made before the index tables: its ledger names none of them."""
    ws = open_ws(root)
    track_ok(ws, attributes=[{"external_id": "a", "email": "a@x.com"}])
    head = ws.store.head
    for index in INDEXES:
        shutil.rmtree(root / "store" / index)
    ws.store.ledger.append(head.batch_no + 1, None, {k: v for k, v in head.versions.items() if k not in INDEXES},
                            head.next_profile_n, head.next_update_seq, head.seed, [], kind="compaction")
    return open_ws(root)


def test_a_store_older_than_its_indexes_scans_until_compaction_builds_them(tmp_path: Path) -> None:
    ws = _without_indexes(tmp_path)
    track_ok(ws, attributes=[{"external_id": "b", "email": "b@x.com"}])
    assert not (tmp_path / "store" / "_index_profiles_email").exists()  # a batch never starts one
    assert export_one_by(ws, email_address="a@x.com") == ["a"]
    assert ("profiles", "email") in ws.store.column_scans
    ws.compact()
    ws = open_ws(tmp_path)
    assert set(INDEXES) <= set(ws.store.head.versions)
    assert export_one_by(ws, email_address="b@x.com") == ["b"]
    assert ws.store.column_scans == []


@pytest.mark.slow  # a crash test: a compaction process killed while it builds an index (1.5 s)
def test_an_index_a_dead_compaction_was_building_stays_unpublished(tmp_path: Path) -> None:
    """Killed while building the indexes of an older store, compaction rolls forward without
    them (they may be half built), and the next compaction builds them whole."""
    _without_indexes(tmp_path)
    proc = run_worker(tmp_path / "store", "compact:_index_profiles_email")
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-3000:]
    ws = open_ws(tmp_path)
    track_ok(ws, attributes=[{"external_id": "b", "email": "b@x.com"}])  # rolls the compaction forward
    assert not (set(INDEXES) & set(ws.store.head.versions))
    assert export_one_by(ws, email_address="a@x.com") == ["a"]
    assert export_one_by(ws, email_address="b@x.com") == ["b"]
    ws.compact()
    assert set(INDEXES) <= set(ws.store.head.versions)
    assert export_one_by(ws, email_address="b@x.com") == ["b"]


# --- merging after the commit ------------------------------------------------------------------
def _runs(ws: Workspace, name: str) -> int:
    ws.store.refresh()
    return len(ws.store.runs(name, ws.store.head.versions[name]))


def test_runs_merge_after_the_commit_in_a_ledger_row_of_their_own(tmp_path: Path) -> None:
    """A batch appends its run and commits; the merge pass that follows publishes the merged
    runs in a ledger row of kind "merge", which changes no content."""
    ws = open_ws(tmp_path)
    ws.store.merge_trigger = 1
    for n in range(3):
        track_ok(ws, attributes=[{"external_id": f"u{n}", "n": n}])
    ws.store.wait_for_merges()
    assert _runs(ws, "attributes") == 1  # 3 runs > trigger + 1, and equal runs merge all the way
    kinds = pl.from_arrow(DeltaTable(f"{ws.store.uri}/_ledger").to_pyarrow_table(columns=["batch_no", "kind"]))
    assert isinstance(kinds, pl.DataFrame)
    assert kinds.sort("batch_no")["kind"].to_list() == ["batch", "batch", "batch", "batch", "merge"]
    assert ws.store.head.content_batch == 3 and ws.store.head.batch_no == 4
    assert sorted(ws.table("attributes").collect()["value"].to_list()) == ["0", "1", "2"]


def test_runs_kept_across_appends_equal_those_drawn_from_the_log(tmp_path: Path, monkeypatch) -> None:
    """A writer adds each appended file to the runs it knows (`_note_append`) instead of
    drawing them from every file's statistics again: through appends and merges, they equal
    what a fresh process draws from the table's log."""
    import engagelake.store.versions as versions

    drawn: list[int] = []  # the files each drawing of runs reads
    monkeypatch.setattr(versions.merging, "runs_of", lambda actions, root: drawn.append(actions.height) or runs_of(actions, root))
    ws = open_ws(tmp_path)
    for n in range(8):
        ws.store.merge_trigger = 2 if n < 4 else NEVER  # merges, then appends only
        drawn.clear()
        track_ok(ws, attributes=[{"external_id": f"u{n % 4}", "n": n}],
                 events=[{"external_id": f"u{n % 3}", "name": "e", "time": "2026-01-15T11:00:00Z"}])
        if n >= 5:  # the runs of the version before are known: the new file's run comes from its add action
            assert drawn == [], drawn
        ws.store.wait_for_merges()
        fresh = Workspace.open(ws.store.uri, create=False)
        for name in ("attributes", "events", "profiles", "external_ids"):
            version = ws.store.head.versions.get(name)
            assert fresh.store.runs(name, version) == ws.store.runs(name, version), (n, name)


def test_a_commit_makes_its_tables_due_for_merging_only_once_its_ledger_row_is_written(
        tmp_path: Path, monkeypatch) -> None:
    """A merge pass that took a table as due before the batch's ledger row was written read a
    head without the batch's run, found nothing to merge, and left the runs unmerged until the
    next commit (seen: two runs where one was due, under load)."""
    from engagelake.store.ledger import Ledger

    ws = open_ws(tmp_path)
    ws.store.merge_trigger = 0
    before_ledger: list[tuple[set[str], set[str]]] = []  # (due, due once the row is written)
    append_ledger = Ledger.append_rows  # a batch's ledger rows

    def spy(self, batch_no, *args, **kwargs):
        if kwargs.get("kind") == "batch":
            before_ledger.append((set(ws.store.merger._due), set(ws.store.merger._due_pending)))
        return append_ledger(self, batch_no, *args, **kwargs)

    monkeypatch.setattr(Ledger, "append_rows", spy)
    for n in range(3):
        track_ok(ws, attributes=[{"external_id": f"u{n}", "n": n}])
        ws.store.wait_for_merges()
    assert any("attributes" in pending for _, pending in before_ledger)
    assert all(not due for due, _ in before_ledger)  # no merge pass could take them early
    assert _runs(ws, "attributes") == 1


def test_a_merge_since_a_batch_read_the_store_does_not_make_it_stale(tmp_path: Path) -> None:
    """A batch commits over merges and compactions that landed since it read the store (they
    moved rows, not content), but not over another batch."""
    ws = open_ws(tmp_path)
    for n in range(3):
        track_ok(ws, attributes=[{"external_id": f"u{n}", "n": n}])
    other = open_ws(tmp_path)
    other.store.merge_trigger = 0
    assert other.store.merge_runs()  # another writer's merge pass, after `ws` read the head
    base = ws.store.head
    ws.store.commit(Changes(), key=None, responses=[], next_profile_n=base.next_profile_n,
                    next_update_seq=base.next_update_seq)
    track_ok(other, attributes=[{"external_id": "u9"}])  # a batch: content changed
    ws.store.head = base
    with pytest.raises(StaleStoreError):
        ws.store.commit(Changes(), key=None, responses=[], next_profile_n=base.next_profile_n,
                        next_update_seq=base.next_update_seq)


def test_a_ledger_older_than_its_kind_column_gains_it(tmp_path: Path) -> None:
    """Stores written before ledger rows had a kind read every row as a batch."""
    ws = open_ws(tmp_path)
    track_ok(ws, attributes=[{"external_id": "a"}])
    ledger = f"{ws.store.uri}/_ledger"
    old = DeltaTable(ledger).to_pyarrow_table().drop_columns(["kind"])
    write_deltalake(ledger, old, mode="overwrite", schema_mode="overwrite")
    ws = open_ws(tmp_path)
    assert ws.store.head.content_batch == ws.store.head.batch_no == 1
    ws.store.merge_trigger = 0
    track_ok(ws, attributes=[{"external_id": "b"}])
    ws.store.wait_for_merges()
    kinds = DeltaTable(ledger).to_pyarrow_table(columns=["batch_no", "kind"]).sort_by("batch_no")
    assert kinds.column("kind").to_pylist() == [None, None, "batch", "merge"]
    assert sorted(ws.table("external_ids").collect()["external_id"].to_list()) == ["a", "b"]


def test_a_merge_pass_leaves_a_dead_compaction_to_the_next_writer(tmp_path: Path) -> None:
    """A merge thread that finds another process's dead compaction does not roll it forward
    (it holds no fresh head to publish with); the next batch does, then merges."""
    ws = open_ws(tmp_path)
    ws.store.merge_trigger = 0
    ws.store.background_merges = False
    for n in range(2):
        track_ok(ws, attributes=[{"external_id": f"u{n}"}])
    ledger_rows = DeltaTable(f"{ws.store.uri}/_ledger").to_pyarrow_table(columns=["batch_no"]).num_rows
    Path(ws.store.compactor.marker()).touch()  # as a compaction killed before its ledger row leaves it
    assert ws.store.merge_runs() == []
    assert DeltaTable(f"{ws.store.uri}/_ledger").to_pyarrow_table(columns=["batch_no"]).num_rows == ledger_rows
    track_ok(ws, attributes=[{"external_id": "u9"}])  # rolls the compaction forward, then merges
    assert not Path(ws.store.compactor.marker()).exists()
    assert sorted(ws.table("external_ids").collect()["external_id"].to_list()) == ["u0", "u1", "u9"]
    assert ws.store.merge_errors == []


def test_the_pass_under_the_lock_merges_like_the_one_that_publishes_under_it(tmp_path: Path) -> None:
    """Object storage keeps the merge pass that holds the writer lock throughout and rewrites
    each table with delta-rs (`_merge_runs_locked`); on the same runs it leaves what the local
    pass (merged files written outside the lock, published under it) leaves."""
    stores = [open_ws(tmp_path, name) for name in ("local", "locked")]
    for ws in stores:
        ws.store.merge_trigger = NEVER
        track_ok(ws, attributes=[{"external_id": f"u{n}", "score": n, "nick": "x"} for n in range(6)])
        track_ok(ws, attributes=[{"external_id": "u1", "score": None}], events=[{"external_id": "u2", "name": "e",
                                                                                  "time": "2026-11-22T11:00:00Z"}])
        ws.call("POST", "/users/delete", {"external_ids": ["u3"]})
        ws.store.merge_trigger = 0
    local, locked = stores
    assert set(local.store.merge_runs()) == set(locked.store.merger.merge_runs_locked(None)) >= {"profiles", "attributes"}
    layouts = []
    for ws in stores:
        ws.store.refresh()
        layouts.append({name: [run.rows for run in ws.store.runs(name, ws.store.head.versions.get(name))]
                        for name in SORT_BY})
    assert layouts[0] == layouts[1] and len(layouts[0]["profiles"]) == 1
    assert state_snapshot(local) == state_snapshot(locked)
    assert not (Path(local.store.uri) / "_merging").exists() or not any((Path(local.store.uri) / "_merging").iterdir())


def test_run_merges_keep_one_duckdb_connection_per_thread_left_clean(tmp_path: Path, monkeypatch) -> None:
    """A store's merge passes run in one kept thread, on one kept DuckDB connection (opening a
    database cost a small batch's merge 24-27 ms): six merges, one connection; the store reads
    as one that merged nothing."""
    import threading

    from engagelake.store import merging

    made: list[str] = []
    connect = merging._connect
    monkeypatch.setattr(merging, "_connect", lambda limit, spill: made.append(threading.current_thread().name)
                        or connect(limit, spill))
    merged, plain = open_ws(tmp_path / "merged"), open_ws(tmp_path / "plain")
    merged.store.merge_trigger, plain.store.merge_trigger = 0, NEVER
    for n in range(6):
        for ws in (merged, plain):
            track_ok(ws, attributes=[{"external_id": f"u{n % 4}", "n": n}])
        merged.store.wait_for_merges()
    assert len(merged.store.merges) >= 6, merged.store.merges
    assert len(made) == 1 and made[0].startswith("engagelake-merge-runs"), made
    assert state_snapshot(merged) == state_snapshot(plain)
