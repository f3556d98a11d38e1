"""Partial rows (`tables/partial.py`): a track object that only sets fields of an existing user
writes those fields, unread, and every reader folds them into the user's row.

The fold is checked against a small model in Polars (frames and lazy frames) and in DuckDB
(views, run merges); the workspace tests check what a batch reads and writes, and that runs
merged, a compaction, stages and a store written before partial rows all give the same users.
"""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Any

import duckdb
import polars as pl
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tests.helpers import NOW, SEED, TRACK, Clock, export_one, iso, open_ws, ts
from tests.test_apply_equals_call import final_state, post_export, post_track

import engagelake.batch as batch_module
import engagelake.store.writes as writes
from engagelake import Workspace
from engagelake.store import merging
from engagelake.tables.partial import SET, field_bits, fold_over, fold_pair, mask_of, newest
from engagelake.tables.schema import SCHEMAS

FIELDS = ["first_name", "email", "update_seq"]  # the fields the model varies
PROFILE_FIELDS = ["external_id", "email", "first_name", "last_name", "push_subscribe", "push_opted_in_at",
                  "custom_attributes"]


# --- the fold, against a model ---------------------------------------------------------------
row_kinds = st.sampled_from(["whole", "partial", "partial", "tombstone"])
field_values = st.one_of(st.none(), st.sampled_from(["a", "b", "é"]))


@st.composite
def histories(draw: st.DrawFn) -> list[dict[str, Any]]:
    """Rows of a few keys, one per key and batch, oldest first: whole rows, partial rows with
    random masks (a null value in a set field is an unset), tombstones."""
    rows = []
    for batch in range(draw(st.integers(1, 8))):
        for key in draw(st.lists(st.sampled_from(["k1", "k2", "k3"]), unique=True, max_size=3)):
            kind = draw(row_kinds)
            values = {f: draw(field_values) for f in FIELDS[:2]} | {"update_seq": batch}
            if kind == "partial":
                chosen = draw(st.lists(st.sampled_from(FIELDS), unique=True))
                rows.append({"service_id": key, **{f: values[f] if f in chosen else None for f in FIELDS},
                             "_batch": batch, "_deleted": False, SET: mask_of("profiles", chosen)})
            else:
                dead = kind == "tombstone"
                rows.append({"service_id": key, **{f: None if dead else values[f] for f in FIELDS},
                             "_batch": batch, "_deleted": dead, SET: None})
    return rows


def model(rows: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Each key's newest values: a whole row replaces everything, a partial row its fields."""
    out: dict[str, dict[str, Any]] = {}
    bits = field_bits("profiles")
    for row in rows:
        key = row["service_id"]
        if row[SET] is None:
            out[key] = {f: row[f] for f in (*FIELDS, "_deleted")} | {"whole": True}
        else:
            cur = out.setdefault(key, {f: None for f in FIELDS} | {"_deleted": False, "whole": False})
            cur.update({f: row[f] for f in FIELDS if row[SET] & bits[f]})
    return out


def _frame(rows: list[dict[str, Any]]) -> pl.DataFrame:
    schema = {"service_id": pl.String(), **{f: SCHEMAS["profiles"][f] for f in FIELDS},
              "_batch": pl.Int64(), "_deleted": pl.Boolean(), SET: pl.Int64()}
    return pl.DataFrame(rows, schema=schema, orient="row")


def _as_model(frame: pl.DataFrame) -> dict[str, dict[str, Any]]:
    return {row["service_id"]: {f: row[f] for f in (*FIELDS, "_deleted")} | {"whole": row[SET] is None}
            for row in frame.iter_rows(named=True)}


@pytest.mark.slow  # a property: 150 histories, each folded in Polars and in DuckDB
@settings(max_examples=150, deadline=None)
@given(histories())
def test_the_fold_matches_the_model_in_polars_and_duckdb(rows: list[dict[str, Any]]) -> None:
    frame = _frame(rows)
    want = model(rows)
    assert _as_model(newest("profiles", frame)) == want
    assert _as_model(newest("profiles", frame.lazy()).collect()) == want
    con = duckdb.connect()
    con.register("raw", frame.to_arrow())
    sql = merging.newest_sql("profiles", frame.columns, ("service_id",), "SELECT * FROM raw")
    assert _as_model(con.sql(sql).pl()) == want


@pytest.mark.slow  # a property: 100 histories (2 s)
@settings(max_examples=100, deadline=None)
@given(histories(), st.data())
def test_folding_partial_rows_over_whole_rows_equals_the_fold(rows: list[dict[str, Any]], data: st.DataObject) -> None:
    """`fold_over` (a join, column by column) equals `newest` over the same rows: whole rows of
    some keys, then one partial row for some of those keys and for others."""
    base = newest("profiles", _frame([r | {SET: None, "_deleted": False} for r in rows]))
    keys = data.draw(st.lists(st.sampled_from(["k1", "k2", "k3", "k4"]), unique=True))
    chosen = data.draw(st.lists(st.sampled_from(FIELDS), unique=True))
    partial = _frame([{"service_id": k, **{f: f"p-{k}" if f != "update_seq" else 99 for f in FIELDS},
                       "_batch": 100, "_deleted": False, SET: mask_of("profiles", chosen)} for k in keys])
    want = newest("profiles", pl.concat([base, partial])).filter(
        pl.col("service_id").is_in(base["service_id"].implode())).drop("_batch", "_deleted", SET)
    got = fold_over("profiles", base.drop("_batch", "_deleted", SET), partial.drop("_batch", "_deleted"))
    assert got.sort("service_id").equals(want.sort("service_id"))


@pytest.mark.slow  # a property: 100 histories (2 s)
@settings(max_examples=100, deadline=None)
@given(histories(), st.data())
def test_folding_a_partial_row_over_any_older_row_equals_the_fold(rows: list[dict[str, Any]],
                                                                  data: st.DataObject) -> None:
    """`fold_pair` (the stages' fold of a pass over an earlier stage) equals `newest`: each key's
    older row is whole, partial or a tombstone, its newer row partial."""
    older = newest("profiles", _frame(rows))
    chosen = data.draw(st.lists(st.sampled_from(FIELDS), unique=True))
    newer = _frame([{"service_id": k, **{f: None if f in ("email",) else f"n-{k}" if f != "update_seq" else 7
                                        for f in FIELDS}, "_batch": 100, "_deleted": False,
                     SET: mask_of("profiles", chosen)} for k in older["service_id"]])
    want = newest("profiles", pl.concat([older, newer])).drop("_batch")
    got = fold_pair("profiles", older.drop("_batch"), newer.drop("_batch"))
    assert got.sort("service_id").equals(want.sort("service_id"))


def test_keys_without_partial_rows_keep_the_order_of_their_newest_row() -> None:
    rows = [{"service_id": k, "first_name": v, "email": None, "update_seq": 0, "_batch": b, "_deleted": False,
             SET: m} for k, v, b, m in [("a", "1", 1, None), ("b", "2", 1, None), ("a", "3", 2, None),
                                         ("c", "4", 2, None), ("b", None, 3, mask_of("profiles", ["email"]))]]
    got = newest("profiles", _frame(rows))
    assert got["service_id"].to_list() == ["a", "c", "b"]
    assert got.row(2, named=True)["first_name"] == "2" and got.row(2, named=True)[SET] is None


# --- what a batch reads and writes -----------------------------------------------------------
def _store(tmp_path: Path, users: int = 6, *, template: bool = True) -> Workspace:
    ws = open_ws(tmp_path, clock=Clock(), template=template)
    r = ws.call("POST", TRACK, {"attributes": [
        {"external_id": f"u{i}", "email": f"u{i}@x.io", "first_name": f"F{i}", "last_name": "L",
         "push_subscribe": "subscribed", "n": i} for i in range(users)]})
    assert r.status == 201 and "errors" not in r.body
    return ws


def _stored_profiles(ws: Workspace) -> pl.DataFrame:
    """Every stored profile row, as written (partial rows and their masks included)."""
    return pl.read_delta(str(Path(ws.store.uri) / "profiles")).sort("_batch")


def test_field_sets_on_existing_users_write_partial_rows_without_reading_them(tmp_path: Path) -> None:
    ws = _store(tmp_path)
    r = ws.call("POST", TRACK, {
        "attributes": [{"external_id": "u1", "first_name": "Ann"}, {"external_id": "u2", "first_name": None}],
        "events": [{"external_id": "u3", "name": "open", "time": iso(NOW)}]})
    assert r.status == 201 and "errors" not in r.body
    assert sum(n for name, _, n in ws.last_reads if name == "profiles") == 0
    last = _stored_profiles(ws).filter(pl.col("_batch") == pl.col("_batch").max())
    assert last.height == 3 and last[SET].null_count() == 0  # three partial rows
    u1 = export_one(ws, "u1", PROFILE_FIELDS)
    assert u1 is not None and u1["first_name"] == "Ann" and u1["email"] == "u1@x.io" and u1["last_name"] == "L"
    u2 = export_one(ws, "u2", PROFILE_FIELDS)
    assert u2 is not None and "first_name" not in u2 and u2["email"] == "u2@x.io"  # a partial row can unset
    # every reader folds: the Polars table, DuckDB's view
    table = ws.table("profiles").collect().filter(pl.col("external_id") == "u2")
    assert table.height == 1 and table["first_name"][0] is None and table["last_name"][0] == "L"
    sql = ws.sql("SELECT first_name, email FROM profiles WHERE external_id = 'u1'")
    assert sql.rows() == [("Ann", "u1@x.io")]
    assert ws.table("profiles").collect().height == 6


def test_push_opt_in_reads_the_stored_row_it_compares_with(tmp_path: Path) -> None:
    clock = Clock()
    ws = open_ws(tmp_path, clock=clock)
    ws.call("POST", TRACK, {"attributes": [{"external_id": "p1", "push_subscribe": "opted_in"},
                                           {"external_id": "p2", "push_subscribe": "subscribed"}]})
    first = export_one(ws, "p1", ["push_opted_in_at"])
    clock.advance(hours=1)
    ws.call("POST", TRACK, {"attributes": [{"external_id": "p1", "push_subscribe": "opted_in"},
                                           {"external_id": "p2", "push_subscribe": "opted_in"}]})
    assert sum(n for name, _, n in ws.last_reads if name == "profiles") == 2
    assert export_one(ws, "p1", ["push_opted_in_at"]) == first  # already opted in: unchanged
    p2 = export_one(ws, "p2", ["push_opted_in_at"])
    assert p2 is not None and p2["push_opted_in_at"] == ts(NOW + timedelta(hours=1))


def test_partial_rows_fold_through_run_merges_and_compaction(tmp_path: Path) -> None:
    ws = _store(tmp_path, users=4)
    ws.store.background_merges = False

    def holds_partial_rows() -> bool:  # by the files' statistics: merges and views fold only then
        return ws.store.holds_partial_rows("profiles", ws.store.head.versions["profiles"])

    assert not holds_partial_rows()
    want = {f"u{i}": export_one(ws, f"u{i}", PROFILE_FIELDS) for i in range(4)}
    for n in range(9):  # enough batches for the runs to merge, some reaching the bottom run
        user = f"u{n % 4}"
        body: dict[str, Any] = {"external_id": user, "first_name": f"N{n}"} if n % 3 else {
            "external_id": user, "last_name": None, "m": n}
        assert ws.call("POST", TRACK, {"attributes": [body]}).status == 201
        want[user] = export_one(ws, user, PROFILE_FIELDS)
    assert ws.store.merges, "the runs merged"
    assert holds_partial_rows()
    assert {u: export_one(ws, u, PROFILE_FIELDS) for u in want} == want
    again = Workspace.open(ws.store.uri)  # read cold, from the merged runs
    assert {u: export_one(again, u, PROFILE_FIELDS) for u in want} == want
    ws.compact()
    stored = _stored_profiles(ws)
    assert stored.height == 4 and stored[SET].null_count() == 4  # whole rows only
    assert not holds_partial_rows()
    assert {u: export_one(Workspace.open(ws.store.uri), u, PROFILE_FIELDS) for u in want} == want


# committed users, updated by a batch that stages between its passes
UPDATES_BETWEEN_PASSES = [
    post_track(attributes=[{"external_id": "u1", "first_name": "A"}, {"external_id": "u2", "last_name": None}]),
    post_export(external_ids=["u1", "u2"]),
    post_track(attributes=[{"external_id": "u1", "email": "new@x.io"}],
               events=[{"external_id": "u3", "name": "e", "time": "2026-11-20T00:00:00Z"}]),
    post_export(email_address="new@x.io"),
    post_export(email_address="u1@x.io"),
    post_track(attributes=[{"external_id": "u3", "push_subscribe": "opted_in", "first_name": "C"}]),
    {"method": "POST", "path": "/users/merge", "body": {"merge_updates": [
        {"identifier_to_merge": {"external_id": "u2"}, "identifier_to_keep": {"external_id": "u1"}}]}},
    post_export(external_ids=["u1", "u2", "u3"]),
]


def _staged_and_held(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, batch: list[dict[str, Any]]) -> list[Any]:
    """`batch` applied to a store with a stage after every request, and to a twin store that
    holds every pass in memory: equal responses and equal final states. Returns the former."""
    monkeypatch.setattr(batch_module, "STAGE_ROWS", 1)
    monkeypatch.setattr(batch_module, "TRACK_RUN_MAX", 1)
    staged_ws = _store(tmp_path / "staged")
    staged = staged_ws.apply(batch)
    with pytest.MonkeyPatch.context() as held_mode:
        held_mode.setattr(batch_module, "STAGE_ROWS", 10**9)
        held_ws = _store(tmp_path / "held")
        held = held_ws.apply(batch)
    assert staged == held
    assert final_state(staged_ws) == final_state(held_ws)
    return staged


@pytest.mark.slow  # an equivalence: the batch applied twice, staged and held (2 s)
def test_a_staged_batch_of_updates_equals_a_held_one(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    staged = _staged_and_held(tmp_path, monkeypatch, UPDATES_BETWEEN_PASSES)
    assert staged[3].body["users"][0]["external_id"] == "u1" and staged[4].body["users"] == []


# partial rows of committed users that a batch stages: folded across stages, and under probes
# by key (export by ID), by a column they set (the new email) or leave alone (u2's email)
PARTIAL_ACROSS_STAGES = [
    post_track(attributes=[{"external_id": "u1", "first_name": "A"}, {"external_id": "u2", "last_name": "M"}]),
    post_track(attributes=[{"external_id": "u1", "email": "new@x.io"}]),
    post_track(attributes=[{"external_id": "u1", "last_name": None}, {"external_id": "u4", "first_name": "D"}]),
    post_export(email_address="u2@x.io"),
    post_export(email_address="new@x.io"),
    post_export(email_address="u1@x.io"),
    post_track(attributes=[{"external_id": "u2", "email": "u1@x.io"}]),
    post_export(email_address="u1@x.io"),
    post_export(external_ids=["u1", "u2", "u4"]),
]


def test_staged_partial_rows_stay_partial_and_fold_when_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    staged = _staged_and_held(tmp_path, monkeypatch, PARTIAL_ACROSS_STAGES)
    [u2] = staged[3].body["users"]
    assert (u2["external_id"], u2["last_name"], u2["first_name"]) == ("u2", "M", "F2")
    [u1] = staged[4].body["users"]
    assert (u1["external_id"], u1["first_name"], "last_name" in u1) == ("u1", "A", False)
    assert staged[5].body["users"] == []
    assert [u["external_id"] for u in staged[7].body["users"]] == ["u2"]


def test_a_staged_batch_of_field_sets_reads_no_profile(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(batch_module, "STAGE_ROWS", 1)
    monkeypatch.setattr(batch_module, "TRACK_RUN_MAX", 1)
    ws = _store(tmp_path)
    got = ws.apply([post_track(attributes=[{"external_id": f"u{n % 3}", "first_name": f"N{n}"}]) for n in range(5)])
    assert all(r.status == 201 for r in got)
    assert sum(n for name, _, n in ws.last_reads if name == "profiles") == 0
    last = _stored_profiles(ws).filter(pl.col("_batch") == pl.col("_batch").max())
    assert last.height == 3 and last[SET].null_count() == 0  # each user's passes folded: one partial row
    assert {u: export_one(ws, u, ["first_name", "email"]) for u in ("u0", "u1", "u2")} == {
        "u0": {"first_name": "N3", "email": "u0@x.io"}, "u1": {"first_name": "N4", "email": "u1@x.io"},
        "u2": {"first_name": "N2", "email": "u2@x.io"}}


def test_a_store_written_before_partial_rows_keeps_working(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    old_schema = writes.stored_schema
    with monkeypatch.context() as before:  # the previous version: no mask column
        before.setattr(writes, "stored_schema", lambda name: {
            c: t for c, t in old_schema(name).items() if c != SET})
        ws = _store(tmp_path, template=False)  # created under the old schema, not copied
    assert SET not in pl.read_delta(str(Path(ws.store.uri) / "profiles")).columns
    ws = Workspace.open(ws.store.uri, clock=lambda: NOW, seed=SEED)
    ws.store.background_merges = False
    for n in range(7):
        assert ws.call("POST", TRACK, {"attributes": [{"external_id": f"u{n % 3}", "first_name": f"N{n}"}]}).status == 201
    u0 = export_one(ws, "u0", PROFILE_FIELDS)
    assert u0 is not None and u0["first_name"] == "N6" and u0["email"] == "u0@x.io"
    assert ws.sql("SELECT count(*) FROM profiles").rows() == [(6,)]
    ws.compact()
    again = Workspace.open(ws.store.uri)
    assert export_one(again, "u0", PROFILE_FIELDS) == u0
    assert export_one(again, "u5", ["first_name"]) == {"first_name": "F5"}
