"""A batch reads what it touches: the rows of its users, never the history logs or other users.

`Workspace.last_reads` lists what the last batch read from the store: (table, column, rows),
with column "*" for a whole table. These tests count those rows on a store of many users.
"""

from __future__ import annotations

import gc
import os
import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest
from tests.helpers import EXPORT, NOW, TRACK, built_store, iso

from engagelake import Workspace
from engagelake.tables.schema import KEYS, SCHEMAS

USERS = 300


def _build(tmp_path: Path) -> Path:
    """A store of USERS users, each with an email, two attributes, a token, events, purchases
    (a copy of one built once)."""
    return built_store(tmp_path, _populate, "s")


def _populate(ws: Workspace) -> None:
    attributes = [{"external_id": f"u{i}", "email": f"u{i}@x.io", "plan": "gold", "visits": i,
                   "push_tokens": [{"app_id": "app", "token": f"t{i}"}]} for i in range(USERS)]
    events = [{"external_id": f"u{i}", "name": "open", "time": iso(NOW)} for i in range(USERS)]
    purchases = [{"external_id": f"u{i}", "product_id": "p", "currency": "USD", "price": 1, "time": iso(NOW)}
                 for i in range(USERS)]
    for start in range(0, USERS, 75):  # several batches: several files per table
        r = ws.apply([{"method": "POST", "path": TRACK, "body": {
            "attributes": attributes[start:start + 75],
            "events": events[start:start + 75], "purchases": purchases[start:start + 75]}}])
        assert r[0].status == 201 and "errors" not in r[0].body


def _rows(reads: list[tuple[str, str, int]], table: str) -> int:
    return sum(n for name, _, n in reads if name == table)


def test_opening_a_store_reads_nothing_but_its_head(tmp_path: Path) -> None:
    ws = Workspace.open(_build(tmp_path), clock=lambda: NOW)
    assert ws.last_reads == []
    state = ws.state
    assert state.reads == [] and state.next_profile_n == USERS


def test_a_track_batch_reads_only_its_users_and_never_history(tmp_path: Path) -> None:
    ws = Workspace.open(_build(tmp_path), clock=lambda: NOW)
    r = ws.call("POST", TRACK, {
        "attributes": [{"external_id": "u1", "visits": {"inc": 1}}, {"external_id": "u2", "plan": "silver"},
                       {"external_id": "new", "email": "new@x.io"}],
        "events": [{"external_id": "u3", "name": "open", "time": iso(NOW)}],
        "purchases": [{"external_id": "u1", "product_id": "p", "currency": "USD", "price": 2, "time": iso(NOW)}],
    })
    assert r.status == 201 and "errors" not in r.body
    reads = ws.last_reads
    assert reads, "the batch must read the store"
    assert all(column != "*" for _, column, _ in reads), f"a whole table was read: {reads}"
    assert _rows(reads, "events") == 0 and _rows(reads, "purchases") == 0
    assert not any(name in ("events", "purchases") for name, _, _ in reads)
    # u1, u2 and u3 get partial rows (`tables/partial.py`): their profiles are not read; nothing
    # here propagates by email, so no email holders either
    assert _rows(reads, "profiles") == 0
    assert _rows(reads, "external_ids") == 3
    assert _rows(reads, "attributes") <= 2 * 3  # the attributes of u1 and u2 at most
    assert sum(n for _, _, n in reads) < 30


def test_a_batch_of_new_users_looks_up_no_attributes(tmp_path: Path) -> None:
    """A profile the batch creates has no stored attributes: its custom attributes are written
    without a probe (a batch of new users searched every run of the table for each of them)."""
    ws = Workspace.open(_build(tmp_path), clock=lambda: NOW)
    r = ws.call("POST", TRACK, {"attributes": [
        {"external_id": "fresh1", "plan": "x", "visits": {"inc": 2}},
        {"external_id": "fresh2", "tags": {"add": ["a"]}, "email": "fresh2@x.io"},
        {"external_id": "fresh1", "visits": {"inc": 1}}]})
    assert r.status == 201 and "errors" not in r.body
    assert not any(name == "attributes" for name, _, _ in ws.last_reads), ws.last_reads
    export = ws.call("POST", EXPORT, {"external_ids": ["fresh1", "fresh2"], "fields_to_export": ["custom_attributes"]})
    assert export.body["users"] == [{"custom_attributes": {"plan": "x", "visits": 3}},
                                    {"custom_attributes": {"tags": ["a"]}}]


def test_an_email_batch_reads_the_holders_of_its_emails(tmp_path: Path) -> None:
    ws = Workspace.open(_build(tmp_path), clock=lambda: NOW)
    r = ws.call("POST", TRACK, {"attributes": [
        {"email": "u7@x.io", "first_name": "Seven"}, {"email": "nobody@x.io", "first_name": "N"}]})
    assert r.status == 201 and "errors" not in r.body
    assert _rows(ws.last_reads, "profiles") == 1
    assert all(column != "*" for _, column, _ in ws.last_reads)
    export = ws.call("POST", EXPORT, {"external_ids": ["u7"], "fields_to_export": ["first_name"]})
    assert export.body["users"] == [{"first_name": "Seven"}]


def test_an_export_reads_the_history_of_its_users_only(tmp_path: Path) -> None:
    ws = Workspace.open(_build(tmp_path), clock=lambda: NOW)
    fields = ["external_id", "custom_attributes", "custom_events", "purchases", "push_tokens", "total_revenue"]
    r = ws.call("POST", EXPORT, {"external_ids": ["u4", "u5"], "fields_to_export": fields})
    assert r.status == 200 and len(r.body["users"]) == 2
    assert r.body["users"][0]["custom_events"][0]["count"] == 1
    reads = ws.last_reads
    assert all(column != "*" for _, column, _ in reads), reads
    assert _rows(reads, "events") == 2 and _rows(reads, "purchases") == 2
    assert _rows(reads, "profiles") == 2


def test_history_of_a_merged_user_is_read_through_its_redirect(tmp_path: Path) -> None:
    ws = Workspace.open(_build(tmp_path), clock=lambda: NOW)
    r = ws.call("POST", "/users/merge", {"merge_updates": [
        {"identifier_to_merge": {"external_id": "u8"}, "identifier_to_keep": {"external_id": "u9"}}]})
    assert r.status == 202
    ws = Workspace.open(tmp_path / "s", clock=lambda: NOW)
    r = ws.call("POST", EXPORT, {"external_ids": ["u9"], "fields_to_export": ["custom_events", "purchases"]})
    assert r.body["users"][0]["custom_events"][0]["count"] == 2
    assert r.body["users"][0]["purchases"][0]["count"] == 2
    assert _rows(ws.last_reads, "events") == 2  # u9's own row and u8's, nobody else's


def test_history_read_early_in_a_batch_follows_a_merge_later_in_it(tmp_path: Path) -> None:
    """A batch keeps the log rows it read; a merge after that read brings the merged profile's
    rows in, and each log row is read once."""
    ws = Workspace.open(_build(tmp_path), clock=lambda: NOW)
    export = {"method": "POST", "path": EXPORT,
              "body": {"external_ids": ["u9"], "fields_to_export": ["custom_events", "purchases", "total_revenue"]}}
    merge = {"method": "POST", "path": "/users/merge", "body": {"merge_updates": [
        {"identifier_to_merge": {"external_id": "u8"}, "identifier_to_keep": {"external_id": "u9"}}]}}
    before, merged, after = ws.apply([export, merge, export])
    assert merged.status == 202
    assert before.body["users"][0]["custom_events"][0]["count"] == 1
    assert after.body["users"][0]["custom_events"][0]["count"] == 2
    assert after.body["users"][0]["purchases"][0]["count"] == 2 and after.body["users"][0]["total_revenue"] == 2
    assert _rows(ws.last_reads, "events") == 2  # u9's row, then u8's once merged: each once


def _sorted_rows(frame: pl.DataFrame) -> list[str]:
    return sorted(map(repr, frame.rows()))


def changed_store(tmp_path: Path) -> Workspace:
    """The store of `_build` after updates, an unset, a merge (u8 into u9) and a delete (u3):
    its logs hold every kind of row a reader must not meet."""
    ws = Workspace.open(_build(tmp_path), clock=lambda: NOW)
    ws.call("POST", TRACK, {"attributes": [{"external_id": "u1", "plan": None, "first_name": "One"},
                                           {"external_id": "u2", "plan": "silver"}]})
    ws.call("POST", "/users/merge", {"merge_updates": [
        {"identifier_to_merge": {"external_id": "u8"}, "identifier_to_keep": {"external_id": "u9"}}]})
    ws.call("POST", "/users/delete", {"external_ids": ["u3"]})
    return ws


def test_polars_and_duckdb_readers_see_exactly_the_current_rows(tmp_path: Path) -> None:
    ws = changed_store(tmp_path)
    for name in ws.table_names():
        lazy = ws.table(name)
        assert isinstance(lazy, pl.LazyFrame)
        rows = lazy.collect()
        assert rows.columns == list(SCHEMAS[name])
        key = KEYS[name]
        if key is not None:
            assert rows.select(key).is_duplicated().sum() == 0, f"{name} has duplicate keys"
        assert _sorted_rows(ws.sql(f'select * from "{name}"')) == _sorted_rows(rows), name
    profiles = ws.table("profiles").collect()
    assert profiles.height == USERS - 2  # u8 merged away, u3 deleted
    assert profiles.filter(pl.col("external_id") == "u1")["first_name"].item() == "One"
    attributes = ws.table("attributes").collect()
    sid1 = profiles.filter(pl.col("external_id") == "u1")["service_id"].item()
    assert attributes.filter(pl.col("service_id") == sid1)["name"].to_list() == ["visits"]  # plan unset
    events = ws.table("events").collect()
    sid9 = profiles.filter(pl.col("external_id") == "u9")["service_id"].item()
    assert events.height == USERS - 1 and events.filter(pl.col("service_id") == sid9).height == 2
    assert ws.sql("select count(*) as n from events").item() == USERS - 1


def test_a_merge_batch_reads_only_the_profiles_it_merges(tmp_path: Path) -> None:
    ws = Workspace.open(_build(tmp_path), clock=lambda: NOW)
    r = ws.call("POST", "/users/merge", {"merge_updates": [
        {"identifier_to_merge": {"external_id": "u8"}, "identifier_to_keep": {"external_id": "u9"}},
        {"identifier_to_merge": {"email": "u10@x.io", "prioritization": ["identified"]}, "identifier_to_keep": {"external_id": "u11"}}]})
    assert r.status == 202
    reads = ws.last_reads
    assert all(column != "*" for _, column, _ in reads), reads
    assert not any(name in ("events", "purchases") for name, _, _ in reads)  # history moves by redirect
    assert _rows(reads, "profiles") <= 2 * 4 and _rows(reads, "attributes") <= 2 * 4
    merged = ws.call("POST", EXPORT, {"external_ids": ["u9", "u11"], "fields_to_export": ["custom_events"]})
    assert [u["custom_events"][0]["count"] for u in merged.body["users"]] == [2, 2]


def test_the_memory_limit_bounds_duckdb(tmp_path: Path, monkeypatch) -> None:
    ws = Workspace.open(tmp_path / "s", memory_limit="300MB")
    con = ws.duckdb()
    assert con.execute("select current_setting('memory_limit')").fetchall()[0][0] in ("286.1 MiB", "300.0 MB")
    monkeypatch.setenv("ENGAGELAKE_MEMORY_LIMIT", "200MB")
    limit = Workspace.open(tmp_path / "s").duckdb().execute("select current_setting('memory_limit')").fetchall()[0][0]
    assert limit in ("190.7 MiB", "200.0 MB")


def test_a_process_that_only_reads_never_loads_duckdb(tmp_path: Path) -> None:
    """Cold start: opening a store and exporting users imports neither DuckDB (it serves
    writes, merges, compaction and SQL) nor the resource handlers' page renderer."""
    store = _build(tmp_path)
    src = str(Path(__file__).resolve().parents[1] / "src")
    script = (
        "import sys; from engagelake import Workspace\n"
        f"r = Workspace.open({str(store)!r}).call('POST', {EXPORT!r}, "
        "{'external_ids': ['u1', 'u7'], 'fields_to_export': ['external_id', 'email']})\n"
        "assert r.status == 200 and len(r.body['users']) == 2, r\n"
        "print(sorted(m for m in ('duckdb', 'liquid') if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True,
                         env={**os.environ, "PYTHONPATH": src})
    assert out.stdout.strip() == "[]", out.stdout + out.stderr


@pytest.mark.parametrize("users_per_chunk", [1, 100, 50_000])
def test_iter_users_streams_every_user_once_by_key_ranges(tmp_path: Path, users_per_chunk: int) -> None:
    ws = Workspace.open(_build(tmp_path), clock=lambda: NOW)
    ws.call("POST", TRACK, {"attributes": [{"external_id": "u1", "plan": None, "first_name": "One"}],
                            "events": [{"external_id": "u8", "name": "late", "time": iso(NOW)}]})
    ws.call("POST", "/users/merge", {"merge_updates": [
        {"identifier_to_merge": {"external_id": "u8"}, "identifier_to_keep": {"external_id": "u9"}}]})
    ws.call("POST", "/users/delete", {"external_ids": ["u3"]})
    ws.store.wait_for_merges()  # the ranges below are those of the layout the chunks were cut by
    ws.store.refresh()
    chunks = list(ws.iter_users(users_per_chunk=users_per_chunk))
    streamed = [user for chunk in chunks for user in chunk]
    ids = [user["service_id"] for user in streamed]
    assert ids == sorted(ids) and len(set(ids)) == len(ids) == USERS - 2  # u8 merged, u3 deleted
    assert streamed == sorted(ws.export_users(), key=lambda user: user["service_id"])
    u9 = next(user for user in streamed if user["external_id"] == "u9")
    assert {e["name"]: e["count"] for e in u9["custom_events"]} == {"open": 2, "late": 1}  # u8's too
    # cut at row-group starts of the runs (how many depends on how the runs were merged): at most
    # one chunk per range, and one range when a chunk may hold the whole store
    ranges = ws.store.snapshot().key_ranges("profiles", users_per_chunk)
    assert 1 <= len(chunks) <= len(ranges)
    if users_per_chunk >= USERS:
        assert len(ranges) == len(chunks) == 1


def test_duckdb_spills_to_a_private_folder_removed_with_the_connection(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)  # DuckDB's own default would be ./.tmp here
    ws = Workspace.open(tmp_path / "s")
    con = ws.duckdb()
    spill = Path(con.execute("select current_setting('temp_directory')").fetchall()[0][0])
    assert spill.name.startswith(f"engagelake-duckdb-{os.getpid()}-") and spill.is_dir()
    con.close()
    del con
    gc.collect()
    assert not spill.exists() and not (tmp_path / ".tmp").exists()
