"""POST /users/external_ids/rename and /users/external_ids/remove end to end: per-item errors with
their indexes, request-level errors, deprecated IDs resolving everywhere until removed
(docs/identity.md)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from tests.helpers import (
    ALL_FIELDS,
    EXPORT,
    NOW,
    TRACK,
    Clock,
    apply_and_call,
    base,
    export,
    open_ws,
    post,
    service_id,
    track_ok,
)

from engagelake import Workspace
from engagelake.rules.messages import (
    BODY_NOT_OBJECT,
    IDS_NOT_STRINGS,
    LIST_EMPTY,
    LIST_NOT_ARRAY,
    LIST_TOO_MANY,
    REMOVE_PRIMARY,
    REMOVE_SHAPE,
    REMOVE_UNKNOWN,
    RENAME_BLOCKED,
    RENAME_DEPRECATED,
    RENAME_IN_USE,
    RENAME_SAME,
    RENAME_SHAPE,
    RENAME_UNKNOWN,
)

RENAME = "/users/external_ids/rename"
REMOVE = "/users/external_ids/remove"


def ren(current: Any, new: Any) -> dict[str, Any]:
    return {"current_external_id": current, "new_external_id": new}


def rename(ws: Workspace, *items: Any) -> dict[str, Any]:
    r = ws.call("POST", RENAME, {"external_id_renames": list(items)})
    assert r.status == 200, r
    return r.body


def rename_ok(ws: Workspace, current: str, new: str) -> None:
    assert rename(ws, ren(current, new)) == {"message": "success", "external_ids": [current], "rename_errors": []}


def remove(ws: Workspace, *ids: Any) -> dict[str, Any]:
    r = ws.call("POST", REMOVE, {"external_ids": list(ids)})
    assert r.status == 200, r
    return r.body




def ids_table(ws: Workspace) -> list[tuple[str, str, bool]]:
    return sorted(ws.table("external_ids").collect().select("external_id", "service_id", "primary").rows())


def resolves_to(ws: Workspace, external_id: str) -> list[dict[str, Any]]:
    r = export(ws, ["external_id", "service_id"], external_ids=[external_id])
    assert r.status == 200, r
    return r.body["users"]





# --- request-level validation ---------------------------------------------------------------------



RENAME_400 = [
    pytest.param([], BODY_NOT_OBJECT, id="body-array"),
    pytest.param(3, BODY_NOT_OBJECT, id="body-number"),
    pytest.param({}, LIST_NOT_ARRAY.format(field="external_id_renames"), id="missing"),
    pytest.param({"external_id_renames": ren("a", "b")}, LIST_NOT_ARRAY.format(field="external_id_renames"),
                 id="object"),
    pytest.param({"external_id_renames": []}, LIST_EMPTY.format(field="external_id_renames"), id="empty"),
    pytest.param({"external_id_renames": [ren("x", "y")] * 51}, LIST_TOO_MANY.format(field="external_id_renames"),
                 id="51"),
    pytest.param({"external_id_renames": ["x"] * 51}, LIST_TOO_MANY.format(field="external_id_renames"),
                 id="51-non-objects"),
]


@pytest.mark.parametrize(("body", "message"), RENAME_400)
def test_rename_request_level_errors(shared_ws, body, message):
    r = shared_ws.call("POST", RENAME, body)
    assert (r.status, r.body) == (400, {"message": message})


REMOVE_400 = [
    pytest.param(True, BODY_NOT_OBJECT, id="body-boolean"),
    pytest.param({}, IDS_NOT_STRINGS, id="missing"),
    pytest.param({"external_ids": "a"}, IDS_NOT_STRINGS, id="string"),
    pytest.param({"external_ids": {"a": 1}}, IDS_NOT_STRINGS, id="object"),
    pytest.param({"external_ids": []}, LIST_EMPTY.format(field="external_ids"), id="empty"),
    pytest.param({"external_ids": ["x"] * 51}, LIST_TOO_MANY.format(field="external_ids"), id="51"),
]


@pytest.mark.parametrize(("body", "message"), REMOVE_400)
def test_remove_request_level_errors(shared_ws, body, message):
    r = shared_ws.call("POST", REMOVE, body)
    assert (r.status, r.body) == (400, {"message": message})


def test_fifty_renames_are_accepted(shared_ws):
    body = rename(shared_ws, *[ren("ghost", "g2")] * 50)
    assert body == {"message": "success", "external_ids": [],
                    "rename_errors": [[RENAME_UNKNOWN, i] for i in range(50)]}


# --- rename --------------------------------------------------------------------------------------


def test_rename_makes_the_new_id_primary_and_keeps_the_old_one_resolving(tmp_path):
    clock = Clock()
    ws = open_ws(tmp_path, clock=clock)
    track_ok(ws, attributes=[{"external_id": "a", "x": 1}, {"external_id": "other"}])
    clock.advance(hours=1)
    rename_ok(ws, "a", "a2")
    assert ids_table(ws) == [("a", service_id(0), False), ("a2", service_id(0), True),
                             ("other", service_id(1), True)]
    assert resolves_to(ws, "a") == [{"external_id": "a2", "service_id": service_id(0)}]
    assert resolves_to(ws, "a2") == [{"external_id": "a2", "service_id": service_id(0)}]
    df = ws.table("profiles").collect()
    rows = dict(df.select("service_id", "updated_at").rows())
    assert rows == {service_id(0): NOW + timedelta(hours=1), service_id(1): NOW}
    assert ws.export_users(ALL_FIELDS) == [base(0, "a2", custom_attributes={"x": 1}), base(1, "other")]


def test_rename_item_errors_are_listed_with_their_index(ws):
    track_ok(ws, attributes=[{"external_id": "a"}, {"external_id": "b"}, {"external_id": "c"}, {"external_id": "d"}])
    rename_ok(ws, "d", "d2")  # d is now deprecated
    before = ids_table(ws)
    body = rename(
        ws,
        5,                          # 0 not an object
        ren("a", ""),               # 1 empty new
        {"current_external_id": "a"},  # 2 new missing
        ren(7, "x"),                # 3 current not a string
        ren("a", "a"),              # 4 same
        ren("a", " NULL "),         # 5 blocked (trimmed, case-insensitive)
        ren("ghost", "Guest"),      # 6 blocked before unknown
        ren("d", "d3"),             # 7 deprecated current
        ren("ghost", "g2"),         # 8 unknown
        ren("a", "b"),              # 9 new in use as a primary ID
        ren("a", "d"),              # 10 new in use as a deprecated ID
        ren("d", "b"),              # 11 deprecated is checked before in use
        ren("ghost", "b"),          # 12 unknown is checked before in use
    )
    assert body == {"message": "success", "external_ids": [], "rename_errors": [
        [RENAME_SHAPE, 0], [RENAME_SHAPE, 1], [RENAME_SHAPE, 2], [RENAME_SHAPE, 3], [RENAME_SAME, 4],
        [RENAME_BLOCKED, 5], [RENAME_BLOCKED, 6], [RENAME_DEPRECATED, 7], [RENAME_UNKNOWN, 8],
        [RENAME_IN_USE, 9], [RENAME_IN_USE, 10], [RENAME_DEPRECATED, 11], [RENAME_UNKNOWN, 12],
    ]}
    assert ids_table(ws) == before


def test_successes_and_errors_mix_in_one_request(ws):
    track_ok(ws, attributes=[{"external_id": "a"}, {"external_id": "b"}])
    body = rename(ws, ren("a", "a2"), ren("ghost", "x"), ren("b", "b2"))
    assert body == {"message": "success", "external_ids": ["a", "b"], "rename_errors": [[RENAME_UNKNOWN, 1]]}


def test_later_items_see_earlier_renames(ws):
    track_ok(ws, attributes=[{"external_id": "a"}])
    body = rename(ws, ren("a", "b"), ren("b", "c"), ren("a", "z"))
    assert body == {"message": "success", "external_ids": ["a", "b"], "rename_errors": [[RENAME_DEPRECATED, 2]]}
    assert ids_table(ws) == [("a", service_id(0), False), ("b", service_id(0), False), ("c", service_id(0), True)]
    for old in ("a", "b", "c"):
        assert resolves_to(ws, old) == [{"external_id": "c", "service_id": service_id(0)}]


def test_rename_then_rename_back_fails_because_the_old_id_is_deprecated(ws):
    track_ok(ws, attributes=[{"external_id": "a"}])
    body = rename(ws, ren("a", "b"), ren("b", "a"))
    assert body == {"message": "success", "external_ids": ["a"], "rename_errors": [[RENAME_IN_USE, 1]]}
    assert ids_table(ws) == [("a", service_id(0), False), ("b", service_id(0), True)]


def test_rename_back_succeeds_after_the_old_id_is_removed(ws):
    track_ok(ws, attributes=[{"external_id": "a"}])
    rename_ok(ws, "a", "b")
    assert remove(ws, "a") == {"message": "success", "removed_ids": ["a"], "removal_errors": []}
    rename_ok(ws, "b", "a")
    assert ids_table(ws) == [("a", service_id(0), True), ("b", service_id(0), False)]


def test_batch_rename_then_rename_back_equals_calls(tmp_path):
    requests = [
        post(TRACK, {"attributes": [{"external_id": "a", "x": 1}, {"external_id": "z"}]}),
        post(RENAME, {"external_id_renames": [ren("a", "b")]}),
        post(RENAME, {"external_id_renames": [ren("b", "a"), ren("z", "a")]}),
        post(EXPORT, {"external_ids": ["a", "b"], "fields_to_export": ["external_id"]}),
        post(REMOVE, {"external_ids": ["a"]}),
        post(RENAME, {"external_id_renames": [ren("b", "a"), ren("z", "b")]}),
        post(TRACK, {"attributes": [{"external_id": "b", "y": 2}]}),
        post(EXPORT, {"external_ids": ["a", "b", "z"], "fields_to_export": ["external_id", "custom_attributes"]}),
    ]
    batch, batch_ws = apply_and_call(tmp_path, requests)
    assert [(r.status, r.body) for r in batch[1:3]] == [
        (200, {"message": "success", "external_ids": ["a"], "rename_errors": []}),
        (200, {"message": "success", "external_ids": [], "rename_errors": [[RENAME_IN_USE, 0], [RENAME_IN_USE, 1]]}),
    ]
    assert batch[5].body == {"message": "success", "external_ids": ["b"], "rename_errors": [[RENAME_IN_USE, 1]]}
    # b is a's deprecated ID again: the track updates profile 0
    assert batch_ws.export_users(["external_id", "custom_attributes"]) == [
        {"external_id": "a", "custom_attributes": {"x": 1, "y": 2}}, {"external_id": "z"}]


# --- remove -----------------------------------------------------------------------------------------


def test_remove_frees_the_deprecated_id(ws):
    track_ok(ws, attributes=[{"external_id": "a", "x": 1}])
    rename_ok(ws, "a", "b")
    assert remove(ws, "a") == {"message": "success", "removed_ids": ["a"], "removal_errors": []}
    assert ids_table(ws) == [("b", service_id(0), True)]
    r = export(ws, ["external_id"], external_ids=["a"])
    assert r.body == {"message": "success", "users": [], "invalid_user_ids": ["a"]}
    track_ok(ws, attributes=[{"external_id": "a", "y": 2}])  # a new profile, a new service_id
    assert ws.export_users(ALL_FIELDS) == [base(0, "b", custom_attributes={"x": 1}),
                                           base(1, "a", custom_attributes={"y": 2})]


def test_remove_item_errors_are_listed_with_their_index(ws):
    track_ok(ws, attributes=[{"external_id": "a"}, {"external_id": "c"}])
    rename_ok(ws, "a", "b")
    rename_ok(ws, "c", "d")
    body = remove(ws, 5, "", "b", "ghost", "a", "a", None, "c")
    assert body == {"message": "success", "removed_ids": ["a", "c"], "removal_errors": [
        [REMOVE_SHAPE, 0], [REMOVE_SHAPE, 1], [REMOVE_PRIMARY, 2], [REMOVE_UNKNOWN, 3], [REMOVE_UNKNOWN, 5],
        [REMOVE_SHAPE, 6]]}
    assert ids_table(ws) == [("b", service_id(0), True), ("d", service_id(1), True)]


# --- deprecated IDs resolve everywhere until removed ------------------------------------------------


def test_deprecated_id_resolves_in_track_and_export(ws):
    track_ok(ws, attributes=[{"external_id": "a"}])
    rename_ok(ws, "a", "b")
    track_ok(ws, attributes=[{"external_id": "a", "x": 1}])
    assert ws.table("profiles").collect().height == 1
    assert resolves_to(ws, "a") == [{"external_id": "b", "service_id": service_id(0)}]
    assert ws.export_users(["external_id", "custom_attributes"]) == [{"external_id": "b", "custom_attributes": {"x": 1}}]


def test_deprecated_id_resolves_in_merge(ws):
    track_ok(ws, attributes=[{"external_id": "a", "x": 1}, {"external_id": "k"}])
    rename_ok(ws, "a", "b")
    r = ws.call("POST", "/users/merge", {"merge_updates": [
        {"identifier_to_merge": {"external_id": "a"}, "identifier_to_keep": {"external_id": "k"}}]})
    assert (r.status, r.body) == (202, {"message": "success"})
    assert ws.export_users(["external_id", "custom_attributes"]) == [{"external_id": "k", "custom_attributes": {"x": 1}}]


def test_deprecated_id_resolves_in_delete(ws):
    track_ok(ws, attributes=[{"external_id": "a"}, {"external_id": "k"}])
    rename_ok(ws, "a", "b")
    r = ws.call("POST", "/users/delete", {"external_ids": ["a"]})
    assert (r.status, r.body) == (200, {"deleted": 1, "message": "success"})
    assert ws.export_users(["external_id"]) == [{"external_id": "k"}]
    assert ids_table(ws) == [("k", service_id(1), True)]


def test_removed_id_no_longer_resolves_anywhere(ws):
    track_ok(ws, attributes=[{"external_id": "a"}, {"external_id": "k"}])
    rename_ok(ws, "a", "b")
    remove(ws, "a")
    r = ws.call("POST", "/users/merge", {"merge_updates": [
        {"identifier_to_merge": {"external_id": "a"}, "identifier_to_keep": {"external_id": "k"}}]})
    assert r.status == 202
    r = ws.call("POST", "/users/delete", {"external_ids": ["a"]})
    assert (r.status, r.body) == (200, {"deleted": 0, "message": "success"})
    assert ws.export_users(["external_id"]) == [{"external_id": "b"}, {"external_id": "k"}]
