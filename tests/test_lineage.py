"""The `merges` lineage table: one row per item of every identity request, applied or skipped,
with kind, outcome, reason, identifiers as sent, batch, request, item, seq and time
(docs/identity.md "Lineage")."""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

import pytest
from tests.helpers import NOW, TRACK, Clock, alias, open_ws, post, service_id, track_ok

from engagelake import Workspace
from engagelake.rules.messages import REMOVE_PRIMARY, RENAME_UNKNOWN

MERGE = "/users/merge"
IDENTIFY = "/users/identify"
RENAME = "/users/external_ids/rename"
REMOVE = "/users/external_ids/remove"
ALIAS_NEW = "/users/alias/new"
ALIAS_UPDATE = "/users/alias/update"
DELETE = "/users/delete"
E = "shared@example.com"


def ext(x: str) -> dict[str, Any]:
    return {"external_id": x}


def upd(source: dict[str, Any], target: dict[str, Any]) -> dict[str, Any]:
    return {"identifier_to_merge": source, "identifier_to_keep": target}




def lineage(ws: Workspace) -> list[dict[str, Any]]:
    """The merges table in write order (by seq)."""
    return ws.table("merges").collect().sort("seq").to_dicts()


def pick(rows: list[dict[str, Any]], *columns: str) -> list[tuple[Any, ...]]:
    return [tuple(r[c] for c in columns) for r in rows]



# --- merge ------------------------------------------------------------------------------------------


AMBIGUOUS = {"email": E, "prioritization": ["identified"]}
MERGE_UPDATES = [
    (upd(ext("a"), ext("b")), "applied", None),
    (upd(ext("ghost"), ext("b")), "skipped", "unresolvable: identifier_to_merge"),
    (upd(ext("b"), ext("ghost")), "skipped", "unresolvable: identifier_to_keep"),
    (upd(AMBIGUOUS, ext("b")), "skipped", "ambiguous: identifier_to_merge"),
    (upd(ext("b"), AMBIGUOUS), "skipped", "ambiguous: identifier_to_keep"),
    (upd(ext("b"), {"service_id": service_id(1)}), "skipped", "same user"),
    (upd(ext("a"), ext("c")), "skipped", "unresolvable: identifier_to_merge"),  # a is merged already
    (upd(ext("ghost"), AMBIGUOUS), "skipped", "unresolvable: identifier_to_merge"),  # merge side first
    (upd(AMBIGUOUS, ext("ghost")), "skipped", "ambiguous: identifier_to_merge"),
    (upd({"service_id": service_id(1)}, {"email": E, "prioritization": ["identified", "least_recently_updated"]}),
     "applied", None),
]


def test_every_merge_update_writes_one_row_with_its_outcome_and_reason(tmp_path):
    clock = Clock()
    ws = open_ws(tmp_path, clock=clock)
    track_ok(ws, attributes=[{"external_id": "a"}, {"external_id": "b"},
                             {"external_id": "c", "email": E}, {"external_id": "d", "email": E}])
    clock.advance(minutes=5)
    seq = ws.state.next_update_seq
    r = ws.call("POST", MERGE, {"merge_updates": [u for u, _, _ in MERGE_UPDATES]})
    assert r.status == 202
    rows = lineage(ws)
    assert pick(rows, "kind", "outcome", "reason", "request", "item", "seq", "at") == [
        ("merge", outcome, reason, 0, i, seq + i, NOW + timedelta(minutes=5))
        for i, (_, outcome, reason) in enumerate(MERGE_UPDATES)]
    assert [(json.loads(r["source"]), json.loads(r["target"])) for r in rows] == [
        (u["identifier_to_merge"], u["identifier_to_keep"]) for u, _, _ in MERGE_UPDATES]
    assert len({r["batch"] for r in rows}) == 1 and rows[0]["batch"]
    applied = [r for r in rows if r["outcome"] == "applied"]
    assert pick(applied, "source_sid", "target_sid") == [(service_id(0), service_id(1)),
                                                         (service_id(1), service_id(2))]
    assert all(isinstance(r["rule"], str) and r["rule"] for r in applied)


def test_rows_carry_the_request_index_within_the_batch_and_one_batch_id_per_apply(ws):
    track_ok(ws, attributes=[{"external_id": "a"}, {"external_id": "b"}, {"external_id": "c"}])
    rs = ws.apply([
        post(TRACK, {"attributes": [{"external_id": "x"}]}),
        post(MERGE, {"merge_updates": [upd(ext("a"), ext("b"))]}),
        post(RENAME, {"external_id_renames": [{"current_external_id": "b", "new_external_id": "b2"},
                                              {"current_external_id": "ghost", "new_external_id": "g"}]}),
    ])
    assert [r.status for r in rs] == [201, 202, 200]
    r = ws.call("POST", DELETE, {"external_ids": ["c"]})
    assert r.body == {"deleted": 1, "message": "success"}
    rows = lineage(ws)
    assert pick(rows, "kind", "outcome", "request", "item") == [
        ("merge", "applied", 1, 0), ("rename", "applied", 2, 0), ("rename", "skipped", 2, 1),
        ("delete", "applied", 0, 0)]
    assert rows[0]["batch"] == rows[1]["batch"] == rows[2]["batch"] != rows[3]["batch"]
    assert [r["seq"] for r in rows] == sorted({r["seq"] for r in rows})


# --- identify -----------------------------------------------------------------------------------------


def test_identify_rows(ws):
    track_ok(ws, attributes=[
        {"external_id": "u"},
        {"user_alias": alias("p1"), "_update_existing_only": False},  # gets a new external ID
        {"user_alias": alias("p2"), "_update_existing_only": False},  # goes into u
        {"user_alias": alias("p3"), "_update_existing_only": False},  # u holds a crm alias by then
        {"external_id": "w"},
    ])
    r = ws.call("POST", ALIAS_NEW, {"user_aliases": [{**alias("wa"), "external_id": "w"}]})
    assert r.status == 200
    before = ws.table("merges").collect().height
    r = ws.call("POST", IDENTIFY, {"aliases_to_identify": [
        {"external_id": "new", "user_alias": alias("p1")},
        {"external_id": "u", "user_alias": alias("p2")},
        {"external_id": "u", "user_alias": alias("p3")},
        {"external_id": "x", "user_alias": alias("wa")},
    ]})
    assert (r.status, r.body) == (200, {"aliases_processed": 4, "message": "success"})
    rows = lineage(ws)[before:]
    assert pick(rows, "kind", "outcome", "reason", "item") == [
        ("identify", "applied", None, 0),
        ("identify", "applied", None, 1),
        ("identify", "skipped", "alias label taken", 2),
        ("identify", "skipped", "already identified", 3),
    ]


# --- external IDs -----------------------------------------------------------------------------------


def test_rename_and_remove_rows(ws):
    track_ok(ws, attributes=[{"external_id": "a"}])
    ws.call("POST", RENAME, {"external_id_renames": [{"current_external_id": "a", "new_external_id": "b"},
                                                     {"current_external_id": "a", "new_external_id": "c"}]})
    ws.call("POST", REMOVE, {"external_ids": ["a", "b", "zz"]})
    assert pick(lineage(ws), "kind", "outcome", "request", "item") == [
        ("rename", "applied", 0, 0), ("rename", "skipped", 0, 1),
        ("remove", "applied", 0, 0), ("remove", "skipped", 0, 1), ("remove", "skipped", 0, 2)]


# --- aliases ----------------------------------------------------------------------------------------


def test_alias_new_and_update_rows(ws):
    track_ok(ws, attributes=[{"external_id": "a"}, {"external_id": "b"}])
    ws.call("POST", ALIAS_NEW, {"user_aliases": [
        {**alias("x"), "external_id": "a"},
        {**alias("y"), "external_id": "ghost"},
        {**alias("x"), "external_id": "b"},
        {**alias("z"), "external_id": "a"},
        alias("free"),
    ]})
    ws.call("POST", ALIAS_UPDATE, {"alias_updates": [
        {"alias_label": "crm", "old_alias_name": "x", "new_alias_name": "x2"},
        {"alias_label": "crm", "old_alias_name": "x", "new_alias_name": "x3"},
        {"alias_label": "crm", "old_alias_name": "free", "new_alias_name": "x2"},
    ]})
    assert pick(lineage(ws), "kind", "outcome", "reason", "item") == [
        ("alias_new", "applied", None, 0),
        ("alias_new", "skipped", "no such user", 1),
        ("alias_new", "skipped", "alias exists", 2),
        ("alias_new", "skipped", "alias label taken", 3),
        ("alias_new", "applied", None, 4),
        ("alias_update", "applied", None, 0),
        ("alias_update", "skipped", "no such user", 1),
        ("alias_update", "skipped", "alias exists", 2),
    ]


# --- delete -----------------------------------------------------------------------------------------


def test_delete_rows_one_per_identifier(ws):
    track_ok(ws, attributes=[{"external_id": "a"}, {"user_alias": alias("b"), "_update_existing_only": False}])
    r = ws.call("POST", DELETE, {"external_ids": ["a", "ghost"], "user_aliases": [alias("b")],
                                 "service_ids": [service_id(0)]})
    assert r.body == {"deleted": 2, "message": "success"}
    rows = lineage(ws)
    assert all(r["kind"] == "delete" and r["request"] == 0 for r in rows)
    assert sorted(pick(rows, "outcome", "reason"), key=repr) == sorted(
        [("applied", None), ("applied", None), ("skipped", "no such user"), ("skipped", "no such user")], key=repr)


# --- requests answered 400 write nothing ---------------------------------------------------------------


@pytest.mark.parametrize(("path", "body"), [
    (MERGE, {"merge_updates": []}),
    (IDENTIFY, {}),
    (RENAME, {"external_id_renames": []}),
    (REMOVE, {"external_ids": []}),
    (ALIAS_NEW, {"user_aliases": []}),
    (ALIAS_UPDATE, {"alias_updates": []}),
    (DELETE, {}),
])
def test_a_400_writes_no_lineage(ws, path, body):
    assert ws.call("POST", path, body).status == 400
    assert ws.table("merges").collect().height == 0


def test_rename_and_remove_errors_are_the_skip_reasons(ws):
    # beyond docs/identity.md, which lists the merge/identify/alias/delete reasons only
    track_ok(ws, attributes=[{"external_id": "a"}])
    ws.call("POST", RENAME, {"external_id_renames": [{"current_external_id": "zz", "new_external_id": "q"}]})
    ws.call("POST", REMOVE, {"external_ids": ["a"]})
    assert pick(lineage(ws), "kind", "outcome", "reason") == [
        ("rename", "skipped", RENAME_UNKNOWN), ("remove", "skipped", REMOVE_PRIMARY)]


# --- a user's history ------------------------------------------------------------------------------


def test_workspace_lineage_follows_a_chain_of_merges(ws):
    track_ok(ws, attributes=[{"external_id": "a"}, {"external_id": "b"}, {"external_id": "c"}, {"external_id": "z"}])
    ws.call("POST", MERGE, {"merge_updates": [upd(ext("a"), ext("b")), upd(ext("z"), ext("ghost"))]})
    ws.call("POST", MERGE, {"merge_updates": [upd(ext("b"), ext("c"))]})
    for who in ("a", "b", "c"):
        rows = ws.lineage(who).to_dicts()
        assert pick(rows, "kind", "outcome", "source_sid", "target_sid") == [
            ("merge", "applied", service_id(0), service_id(1)),
            ("merge", "applied", service_id(1), service_id(2))], who


# --- update sequence numbers ------------------------------------------------------------------------


@pytest.mark.parametrize(("path", "body", "items"), [
    (MERGE, {"merge_updates": [upd(ext("a"), ext("b")), upd(ext("ghost"), ext("b")), upd(ext("b"), ext("b"))]}, 3),
    (IDENTIFY, {"aliases_to_identify": [{"external_id": "n", "user_alias": alias("p")}],
                "emails_to_identify": [{"external_id": "n", "email": E, "prioritization": ["identified"]}],
                "phone_numbers_to_identify": [{"external_id": "n", "phone": "+15550100000",
                                               "prioritization": ["identified"]}]}, 3),
    (RENAME, {"external_id_renames": [{"current_external_id": "a", "new_external_id": "a2"},
                                      {"current_external_id": "a", "new_external_id": "a3"},
                                      {"current_external_id": "ghost", "new_external_id": "g"}]}, 3),
    (ALIAS_NEW, {"user_aliases": [{**alias("x"), "external_id": "a"}, alias("p"), alias("y")]}, 3),
    (DELETE, {"external_ids": ["a", "ghost"], "service_ids": [service_id(1)]}, 3),
])
def test_each_item_takes_the_next_update_sequence_number_applied_or_skipped(ws, path, body, items):
    track_ok(ws, attributes=[{"external_id": "a"}, {"external_id": "b"},
                             {"user_alias": alias("p"), "_update_existing_only": False}])
    seq = ws.state.next_update_seq
    assert ws.call("POST", path, body).status in (200, 202)
    assert sorted(r["seq"] for r in lineage(ws)) == list(range(seq, seq + items))
    assert ws.state.next_update_seq == seq + items


# --- batch-exact lineage -------------------------------------------------------------------------------


def test_a_batch_of_every_endpoint_writes_the_same_lineage_as_calls(tmp_path):
    requests = [
        post(TRACK, {"attributes": [{"external_id": "a", "email": E}, {"external_id": "b"},
                                    {"user_alias": alias("p"), "_update_existing_only": False}]}),
        post(ALIAS_NEW, {"user_aliases": [{**alias("q", "web"), "external_id": "a"}, alias("r")]}),
        post(ALIAS_UPDATE, {"alias_updates": [{"alias_label": "crm", "old_alias_name": "r", "new_alias_name": "r2"}]}),
        post(IDENTIFY, {"aliases_to_identify": [{"external_id": "b", "user_alias": alias("p")},
                                                {"external_id": "c", "user_alias": alias("r2")}]}),
        post(MERGE, {"merge_updates": [upd(ext("c"), ext("a")), upd({"email": E, "prioritization": ["identified"]},
                                                                     ext("b"))]}),
        post(RENAME, {"external_id_renames": [{"current_external_id": "b", "new_external_id": "b2"}]}),
        post(REMOVE, {"external_ids": ["b", "a"]}),
        post(TRACK, {"attributes": [{"external_id": "b", "x": 1}]}),
        post(DELETE, {"external_ids": ["b2", "b"], "user_aliases": [alias("p")]}),
        post(MERGE, {"merge_updates": [upd(ext("b"), ext("b2"))]}),
    ]
    batch_ws = open_ws(tmp_path, "batch")
    batch = batch_ws.apply(requests)
    calls_ws = open_ws(tmp_path, "calls")
    calls = [calls_ws.call(r["method"], r["path"], r["body"]) for r in requests]
    assert batch == calls
    fields = ["external_id", "user_aliases", "email", "custom_attributes", "service_id"]
    assert batch_ws.export_users(fields) == calls_ws.export_users(fields)

    def rows(ws: Workspace) -> list[dict[str, Any]]:
        return ws.table("merges").collect().sort("seq").drop("batch", "request").to_dicts()

    assert rows(batch_ws) == rows(calls_ws)
    assert [r["request"] for r in lineage(batch_ws)] == [1, 1, 2, 3, 3, 4, 4, 5, 6, 6, 8, 8, 8, 9]
    assert len({r["batch"] for r in lineage(calls_ws)}) == 8  # one per identity request
