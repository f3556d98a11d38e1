"""POST /users/alias/new and /users/alias/update end to end (docs/identity.md)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from tests.helpers import (
    ALL_FIELDS,
    NOW,
    Clock,
    alias,
    base,
    export,
    open_ws,
    service_id,
    state_snapshot,
    track_ok,
)

from engagelake import Workspace
from engagelake.rules.messages import (
    ALIAS_EXTERNAL_ID,
    ALIAS_SHAPE,
    ALIAS_UPDATE_SHAPE,
    BODY_NOT_OBJECT,
    ITEM_NOT_OBJECT,
    LIST_EMPTY,
    LIST_NOT_ARRAY,
    LIST_TOO_MANY,
)

NEW = "/users/alias/new"
UPDATE = "/users/alias/update"
STATE_TABLES = ("profiles", "external_ids", "aliases", "attributes")


def new_item(name: Any, label: Any = "crm", external_id: Any = None) -> dict[str, Any]:
    item = {"alias_name": name, "alias_label": label}
    if external_id is not None:
        item["external_id"] = external_id
    return item


def upd(label: Any, old: Any, new: Any) -> dict[str, Any]:
    return {"alias_label": label, "old_alias_name": old, "new_alias_name": new}


def alias_new(ws: Workspace, *items: Any) -> None:
    r = ws.call("POST", NEW, {"user_aliases": list(items)})
    assert (r.status, r.body) == (200, {"aliases_processed": len(items), "message": "success"})


def alias_update(ws: Workspace, *items: Any) -> None:
    r = ws.call("POST", UPDATE, {"alias_updates": list(items)})
    assert (r.status, r.body) == (200, {"message": "success"})




def aliases_table(ws: Workspace) -> list[tuple[str, str, str]]:
    return sorted(ws.table("aliases").collect().select("alias_label", "alias_name", "service_id").rows())





# --- request-level validation -------------------------------------------------------------------



NEW_400 = [
    pytest.param([], BODY_NOT_OBJECT, id="body-array"),
    pytest.param({}, LIST_NOT_ARRAY.format(field="user_aliases"), id="missing"),
    pytest.param({"user_aliases": new_item("x")}, LIST_NOT_ARRAY.format(field="user_aliases"), id="object"),
    pytest.param({"user_aliases": []}, LIST_EMPTY.format(field="user_aliases"), id="empty"),
    pytest.param({"user_aliases": [new_item("x")] * 51}, LIST_TOO_MANY.format(field="user_aliases"), id="51"),
    pytest.param({"user_aliases": [new_item("x"), "y"]}, ITEM_NOT_OBJECT.format(field="user_aliases", index=1),
                 id="item-not-object"),
    pytest.param({"user_aliases": [{"alias_label": "crm"}]}, ALIAS_SHAPE.format(where="user_aliases[0]"),
                 id="name-missing"),
    pytest.param({"user_aliases": [new_item("x"), new_item("")]}, ALIAS_SHAPE.format(where="user_aliases[1]"),
                 id="name-empty"),
    pytest.param({"user_aliases": [new_item("x", 5)]}, ALIAS_SHAPE.format(where="user_aliases[0]"),
                 id="label-number"),
    pytest.param({"user_aliases": [{"alias_name": "x", "alias_label": "crm", "external_id": ""}]},
                 ALIAS_EXTERNAL_ID.format(where="user_aliases[0]"), id="external-id-empty"),
    pytest.param({"user_aliases": [new_item("x", external_id=5)]}, ALIAS_EXTERNAL_ID.format(where="user_aliases[0]"),
                 id="external-id-number"),
]


@pytest.mark.parametrize(("body", "message"), NEW_400)
def test_alias_new_request_level_errors(shared_ws, body, message):
    r = shared_ws.call("POST", NEW, body)
    assert (r.status, r.body) == (400, {"message": message})


UPDATE_400 = [
    pytest.param(None, BODY_NOT_OBJECT, id="body-null"),
    pytest.param({}, LIST_NOT_ARRAY.format(field="alias_updates"), id="missing"),
    pytest.param({"alias_updates": "x"}, LIST_NOT_ARRAY.format(field="alias_updates"), id="string"),
    pytest.param({"alias_updates": []}, LIST_EMPTY.format(field="alias_updates"), id="empty"),
    pytest.param({"alias_updates": [upd("crm", "a", "b")] * 51}, LIST_TOO_MANY.format(field="alias_updates"), id="51"),
    pytest.param({"alias_updates": [7]}, ITEM_NOT_OBJECT.format(field="alias_updates", index=0), id="item-not-object"),
    pytest.param({"alias_updates": [{"alias_label": "crm", "old_alias_name": "a"}]},
                 ALIAS_UPDATE_SHAPE.format(where="alias_updates[0]"), id="new-missing"),
    pytest.param({"alias_updates": [upd("crm", "a", "b"), upd("", "a", "b")]},
                 ALIAS_UPDATE_SHAPE.format(where="alias_updates[1]"), id="label-empty"),
    pytest.param({"alias_updates": [upd("crm", ["a"], "b")]}, ALIAS_UPDATE_SHAPE.format(where="alias_updates[0]"),
                 id="old-not-string"),
]


@pytest.mark.parametrize(("body", "message"), UPDATE_400)
def test_alias_update_request_level_errors(shared_ws, body, message):
    r = shared_ws.call("POST", UPDATE, body)
    assert (r.status, r.body) == (400, {"message": message})


def test_a_400_applies_nothing_of_the_request(ws):
    track_ok(ws, attributes=[{"external_id": "a"}])
    r = ws.call("POST", NEW, {"user_aliases": [new_item("x", external_id="a"), new_item("y"), {"alias_name": "z"}]})
    assert (r.status, r.body) == (400, {"message": ALIAS_SHAPE.format(where="user_aliases[2]")})
    assert aliases_table(ws) == []
    assert ws.table("profiles").collect().height == 1
    alias_new(ws, new_item("x", external_id="a"))
    r = ws.call("POST", UPDATE, {"alias_updates": [upd("crm", "x", "y"), upd("crm", "y", None)]})
    assert (r.status, r.body) == (400, {"message": ALIAS_UPDATE_SHAPE.format(where="alias_updates[1]")})
    assert aliases_table(ws) == [("crm", "x", service_id(0))]
    assert ws.table("merges").collect().filter(ws.table("merges").collect()["outcome"] == "applied").height == 1


# --- alias/new ------------------------------------------------------------------------------------


def test_new_alias_with_external_id_is_added_to_that_user(tmp_path):
    clock = Clock()
    ws = open_ws(tmp_path, clock=clock)
    track_ok(ws, attributes=[{"external_id": "a", "x": 1}, {"external_id": "b"}])
    clock.advance(hours=1)
    alias_new(ws, new_item("x1", external_id="a"), new_item("x2", "web", external_id="a"))
    assert ws.export_users(ALL_FIELDS) == [
        base(0, "a", custom_attributes={"x": 1}, user_aliases=[alias("x1"), alias("x2", "web")]), base(1, "b")]
    rows = dict(ws.table("profiles").collect().select("service_id", "updated_at").rows())
    assert rows == {service_id(0): NOW + timedelta(hours=1), service_id(1): NOW}
    r = export(ws, ["external_id"], user_aliases=[alias("x2", "web")])
    assert r.body == {"message": "success", "users": [{"external_id": "a"}]}


def test_new_alias_with_a_deprecated_external_id_goes_to_its_user(ws):
    track_ok(ws, attributes=[{"external_id": "a"}])
    r = ws.call("POST", "/users/external_ids/rename",
                {"external_id_renames": [{"current_external_id": "a", "new_external_id": "a2"}]})
    assert r.status == 200, r
    alias_new(ws, new_item("x", external_id="a"))
    assert aliases_table(ws) == [("crm", "x", service_id(0))]


def test_new_alias_without_external_id_creates_an_alias_only_profile(ws):
    track_ok(ws, attributes=[{"external_id": "a"}])
    alias_new(ws, new_item("x"), new_item("y", "web"))
    assert ws.export_users(ALL_FIELDS) == [
        base(0, "a"), base(1, user_aliases=[alias("x")]), base(2, user_aliases=[alias("y", "web")])]
    track_ok(ws, attributes=[{"user_alias": alias("x"), "k": 1}])  # the alias resolves in track
    r = export(ws, ["service_id", "custom_attributes"], user_aliases=[alias("x")])
    assert r.body == {"message": "success", "users": [{"service_id": service_id(1), "custom_attributes": {"k": 1}}]}


def test_new_alias_with_an_unknown_external_id_is_skipped(ws):
    track_ok(ws, attributes=[{"external_id": "a"}])
    alias_new(ws, new_item("x", external_id="ghost"))
    assert ws.export_users(ALL_FIELDS) == [base(0, "a")]
    assert aliases_table(ws) == []


def test_an_alias_that_exists_is_skipped(ws):
    track_ok(ws, attributes=[{"external_id": "a"}, {"external_id": "b"}])
    alias_new(ws, new_item("x", external_id="a"))
    before = state_snapshot(ws, STATE_TABLES)
    alias_new(ws, new_item("x", external_id="b"), new_item("x"), new_item("x", external_id="a"))
    assert state_snapshot(ws, STATE_TABLES) == before


def test_a_user_with_an_alias_of_that_label_is_skipped(ws):
    track_ok(ws, attributes=[{"external_id": "a"}])
    alias_new(ws, new_item("x", external_id="a"), new_item("y", external_id="a"))
    assert aliases_table(ws) == [("crm", "x", service_id(0))]


def test_the_same_alias_twice_in_one_request_creates_one_profile(ws):
    alias_new(ws, new_item("x"), new_item("x"))
    assert ws.export_users(ALL_FIELDS) == [base(0, user_aliases=[alias("x")])]


def test_an_alias_name_may_repeat_under_another_label(ws):
    track_ok(ws, attributes=[{"external_id": "a"}, {"external_id": "b"}])
    alias_new(ws, new_item("x", "crm", "a"), new_item("x", "web", "b"))
    assert aliases_table(ws) == [("crm", "x", service_id(0)), ("web", "x", service_id(1))]


# --- alias/update ----------------------------------------------------------------------------------


def test_update_renames_the_alias_on_the_same_user(tmp_path):
    clock = Clock()
    ws = open_ws(tmp_path, clock=clock)
    track_ok(ws, attributes=[{"external_id": "a"}])
    alias_new(ws, new_item("old", external_id="a"))
    clock.advance(hours=1)
    alias_update(ws, upd("crm", "old", "new"))
    assert aliases_table(ws) == [("crm", "new", service_id(0))]
    assert ws.table("profiles").collect()["updated_at"].to_list() == [NOW + timedelta(hours=1)]
    r = export(ws, ["external_id"], user_aliases=[alias("old")])
    assert r.body == {"message": "success", "users": [], "invalid_user_ids": ["old"]}
    r = export(ws, ["external_id"], user_aliases=[alias("new")])
    assert r.body == {"message": "success", "users": [{"external_id": "a"}]}


def test_update_of_an_alias_only_profile(ws):
    alias_new(ws, new_item("old"))
    alias_update(ws, upd("crm", "old", "new"))
    assert ws.export_users(ALL_FIELDS) == [base(0, user_aliases=[alias("new")])]


@pytest.mark.parametrize("update", [
    pytest.param(upd("crm", "ghost", "z"), id="old-unknown"),
    pytest.param(upd("web", "x", "z"), id="old-under-another-label"),
    pytest.param(upd("crm", "x", "y"), id="new-exists"),
    pytest.param(upd("crm", "x", "x"), id="old-equals-new"),
])
def test_update_skips(ws, update):
    track_ok(ws, attributes=[{"external_id": "a"}, {"external_id": "b"}])
    alias_new(ws, new_item("x", external_id="a"), new_item("y", external_id="b"))
    before = state_snapshot(ws, STATE_TABLES)
    alias_update(ws, update)
    assert state_snapshot(ws, STATE_TABLES) == before


def test_updates_in_one_request_apply_in_order(ws):
    track_ok(ws, attributes=[{"external_id": "a"}, {"external_id": "b"}])
    alias_new(ws, new_item("x", external_id="a"), new_item("y", external_id="b"))
    # y frees its name, then x may take it; x then no longer exists
    alias_update(ws, upd("crm", "y", "w"), upd("crm", "x", "y"), upd("crm", "x", "v"))
    assert aliases_table(ws) == [("crm", "w", service_id(1)), ("crm", "y", service_id(0))]


def test_update_then_new_with_the_freed_name(ws):
    track_ok(ws, attributes=[{"external_id": "a"}, {"external_id": "b"}])
    alias_new(ws, new_item("x", external_id="a"))
    alias_update(ws, upd("crm", "x", "x2"))
    alias_new(ws, new_item("x", external_id="b"))
    assert aliases_table(ws) == [("crm", "x", service_id(1)), ("crm", "x2", service_id(0))]
