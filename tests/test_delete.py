"""POST /users/delete end to end: every identifier kind, the deleted count, every table emptied
for the user, delete then track (docs/identity.md)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import polars as pl
import pytest
from tests.helpers import (
    ALL_FIELDS,
    EXPORT,
    NOW,
    TRACK,
    USER_STATE_TABLES,
    alias,
    apply_and_call,
    base,
    copy_store,
    event,
    export,
    open_ws,
    post,
    purchase,
    service_id,
    track_ok,
    ts,
)

from engagelake import Workspace
from engagelake.rules.messages import (
    BODY_NOT_OBJECT,
    DELETE_ALIASES,
    DELETE_NO_IDS,
    DELETE_STRINGS,
    DELETE_TOO_MANY,
)

DELETE = "/users/delete"
USER_TABLES = USER_STATE_TABLES


def delete(ws: Workspace, deleted: int, **ids: Any) -> None:
    r = ws.call("POST", DELETE, ids)
    assert (r.status, r.body) == (200, {"deleted": deleted, "message": "success"})




def rows_of(ws: Workspace, table: str, n: int) -> list[dict[str, Any]]:
    df = ws.table(table).collect()
    return df.filter(df["service_id"] == service_id(n)).to_dicts()


def user_rows(ws: Workspace, n: int) -> dict[str, list[str]]:
    return {t: sorted(map(repr, rows_of(ws, t, n))) for t in USER_TABLES}


def full_users(ws: Workspace) -> None:
    """Profiles 0 and 1, external IDs a and b (deprecated a-old, b-old), aliases crm:ann and
    crm:bob, each with a row in every table; one batch, one commit."""
    requests = []
    for external_id, name, token in (("a", "ann", "ta"), ("b", "bob", "tb")):
        old = f"{external_id}-old"
        requests += [
            post(TRACK, {"attributes": [{
                "external_id": old, "first_name": name, "email": f"{name}@example.com", "x": 1,
                "push_tokens": [{"app_id": "app", "token": token, "device_id": f"d-{token}"}],
                "subscription_groups": [{"subscription_group_id": "g", "subscription_state": "subscribed"}],
            }], "events": [event(external_id=old)], "purchases": [purchase(external_id=old)]}),
            post("/users/external_ids/rename", {"external_id_renames": [
                {"current_external_id": old, "new_external_id": external_id}]}),
            post("/users/alias/new", {"user_aliases": [{**alias(name), "external_id": external_id}]}),
        ]
    rs = ws.apply(requests)
    assert [r.status for r in rs] == [201, 200, 200] * 2, rs
    assert rs[1].body["rename_errors"] == [] and rs[4].body["rename_errors"] == [], rs





@pytest.fixture(scope="module")
def template(tmp_path_factory):
    root = tmp_path_factory.mktemp("delete-template")
    full_users(open_ws(root))
    return root / "store"


@pytest.fixture
def two(template, tmp_path):
    """a = profile 0 (alias crm:ann), b = profile 1 (alias crm:bob), both with every table;
    a copy of a store built once (a copy costs far less than the commits)."""
    copy_store(template, tmp_path / "store")
    return open_ws(tmp_path)


# --- request-level validation -----------------------------------------------------------------------



DELETE_400 = [
    pytest.param([], BODY_NOT_OBJECT, id="body-array"),
    pytest.param(1, BODY_NOT_OBJECT, id="body-number"),
    pytest.param({}, DELETE_NO_IDS, id="none"),
    pytest.param({"other": ["a"]}, DELETE_NO_IDS, id="unknown-key-only"),
    pytest.param({"external_ids": "a"}, DELETE_STRINGS.format(field="external_ids"), id="external-ids-string"),
    pytest.param({"external_ids": ["a", ""]}, DELETE_STRINGS.format(field="external_ids"), id="external-ids-empty-string"),
    pytest.param({"external_ids": ["a", 5]}, DELETE_STRINGS.format(field="external_ids"), id="external-ids-number"),
    pytest.param({"service_ids": {"a": 1}}, DELETE_STRINGS.format(field="service_ids"), id="service-ids-object"),
    pytest.param({"service_ids": [None]}, DELETE_STRINGS.format(field="service_ids"), id="service-ids-null"),
    pytest.param({"user_aliases": alias("x")}, DELETE_ALIASES, id="aliases-object"),
    pytest.param({"user_aliases": [alias("x"), "y"]}, DELETE_ALIASES, id="aliases-string-item"),
    pytest.param({"user_aliases": [{"alias_name": "x"}]}, DELETE_ALIASES, id="aliases-no-label"),
    pytest.param({"user_aliases": [alias("")]}, DELETE_ALIASES, id="aliases-empty-name"),
    pytest.param({"external_ids": ["a"] * 51}, DELETE_TOO_MANY, id="51-external-ids"),
    pytest.param({"external_ids": ["a"] * 20, "user_aliases": [alias("x")] * 20, "service_ids": ["s"] * 11},
                 DELETE_TOO_MANY, id="51-together"),
]


@pytest.mark.parametrize(("body", "message"), DELETE_400)
def test_request_level_errors(shared_ws, body, message):
    r = shared_ws.call("POST", DELETE, body)
    assert (r.status, r.body) == (400, {"message": message})


def test_fifty_identifiers_together_are_accepted(shared_ws):
    r = shared_ws.call("POST", DELETE, {"external_ids": ["ghost"] * 20, "user_aliases": [alias("x")] * 20,
                                        "service_ids": ["s"] * 10})
    assert (r.status, r.body) == (200, {"deleted": 0, "message": "success"})


def test_a_400_applies_nothing_of_the_request(two):
    before = (user_rows(two, 0), user_rows(two, 1))
    r = two.call("POST", DELETE, {"external_ids": ["a"], "service_ids": [""]})
    assert (r.status, r.body) == (400, {"message": DELETE_STRINGS.format(field="service_ids")})
    assert (user_rows(two, 0), user_rows(two, 1)) == before


# --- what a delete removes ------------------------------------------------------------------------------


@pytest.mark.parametrize("ids", [
    pytest.param({"external_ids": ["a"]}, id="external-id"),
    pytest.param({"external_ids": ["a-old"]}, id="deprecated-external-id"),
    pytest.param({"user_aliases": [alias("ann")]}, id="user-alias"),
    pytest.param({"service_ids": [service_id(0)]}, id="service-id"),
])
def test_delete_removes_every_row_of_the_user_in_every_table(two, ids):
    assert all(user_rows(two, 0)[t] for t in USER_TABLES)  # the user has a row in every table
    other = user_rows(two, 1)
    delete(two, 1, **ids)
    assert user_rows(two, 0) == {t: [] for t in USER_TABLES}
    assert user_rows(two, 1) == other
    # the redirects table marks the profile deleted: its history leaves the view at once
    assert two.table("redirects").collect().select("service_id", "into").to_dicts() == [{"service_id": service_id(0), "into": None}]
    for found in (dict(external_ids=["a"]), dict(external_ids=["a-old"]), dict(user_aliases=[alias("ann")]),
                  dict(service_id=service_id(0))):
        r = export(two, ["external_id"], **found)
        assert r.status == 200 and r.body["users"] == [], (found, r)
    assert [u["external_id"] for u in two.export_users(["external_id"])] == ["b"]


def test_the_deleted_count_counts_distinct_profiles(two):
    delete(two, 1, external_ids=["a", "a-old"], user_aliases=[alias("ann")], service_ids=[service_id(0)])
    delete(two, 0, external_ids=["a", "ghost"], user_aliases=[alias("nobody")], service_ids=["f" * 24])
    assert two.table("profiles").collect()["service_id"].to_list() == [service_id(1)]


def test_several_users_in_one_request(two):
    track_ok(two, attributes=[{"user_alias": alias("c"), "_update_existing_only": False}])
    delete(two, 3, external_ids=["a"], user_aliases=[alias("c")], service_ids=[service_id(1)])
    assert {t: two.table(t).collect().height for t in USER_TABLES} == {t: 0 for t in USER_TABLES}


def test_delete_then_track_creates_a_new_profile_with_a_new_service_id(two):
    delete(two, 1, external_ids=["a"])
    track_ok(two, attributes=[{"external_id": "a", "y": 2}])
    track_ok(two, attributes=[{"external_id": "a-old", "z": 3}])  # the deprecated ID went too
    assert two.export_users(["external_id", "service_id", "custom_attributes", "custom_events", "email"]) == [
        {"external_id": "b", "service_id": service_id(1), "custom_attributes": {"x": 1}, "email": "bob@example.com",
         "custom_events": [{"name": "played", "first": ts(NOW), "last": ts(NOW), "count": 1}]},
        {"external_id": "a", "service_id": service_id(2), "custom_attributes": {"y": 2}},
        {"external_id": "a-old", "service_id": service_id(3), "custom_attributes": {"z": 3}},
    ]


def test_the_freed_alias_and_push_token_can_be_used_again(two):
    delete(two, 1, external_ids=["a"])
    r = two.call("POST", "/users/alias/new", {"user_aliases": [alias("ann")]})
    assert (r.status, r.body) == (200, {"aliases_processed": 1, "message": "success"})
    track_ok(two, attributes=[{"external_id": "b", "push_tokens": [{"app_id": "app", "token": "ta"}]}])
    r = export(two, ["service_id", "push_tokens"], user_aliases=[alias("ann")], external_ids=["b"])
    assert sorted(r.body["users"], key=lambda u: u["service_id"]) == sorted([
        {"service_id": service_id(2)},
        {"service_id": service_id(1), "push_tokens": [{"app": "app", "token": "tb", "device_id": "d-tb", "notifications_enabled": True},
                                                      {"app": "app", "token": "ta", "notifications_enabled": True}]},
    ], key=lambda u: u["service_id"])


def test_a_deleted_service_id_does_not_come_back(two):
    delete(two, 1, service_ids=[service_id(0)])
    delete(two, 0, service_ids=[service_id(0)])
    r = export(two, ["external_id"], service_id=service_id(0))
    assert r.body == {"message": "success", "users": [], "invalid_user_ids": [service_id(0)]}


# --- batch-exact ------------------------------------------------------------------------------------


def test_batch_delete_then_track_equals_calls(tmp_path):
    requests = [
        post(TRACK, {"attributes": [{"external_id": "a", "x": 1, "email": "a@example.com"}, {"external_id": "b"}],
                     "events": [event(external_id="a")]}),
        post(DELETE, {"external_ids": ["a"]}),
        post(TRACK, {"attributes": [{"external_id": "a", "y": 2}, {"email": "a@example.com", "z": 3}]}),
        post(EXPORT, {"external_ids": ["a", "b"], "fields_to_export": ALL_FIELDS}),
        post(DELETE, {"external_ids": ["a", "b"], "service_ids": [service_id(0), service_id(3)]}),
        post(TRACK, {"events": [event(external_id="b")]}),
    ]
    batch, batch_ws = apply_and_call(tmp_path, requests)
    assert [(r.status, r.body.get("deleted")) for r in batch] == [
        (201, None), (200, 1), (201, None), (200, None), (200, 3), (201, None)]
    assert batch_ws.export_users(ALL_FIELDS) == [base(
        4, "b", custom_events=[{"name": "played", "first": ts(NOW), "last": ts(NOW), "count": 1}])]


# --- compaction --------------------------------------------------------------------------------------


def store_text(root: Path) -> str:
    """Everything readable from the store's files: raw bytes of every file plus the decoded rows
    of every Parquet file (so compression cannot hide a value)."""
    parts = []
    for f in sorted(root.rglob("*")):
        if f.is_file():
            parts.append(f.read_bytes().decode("latin-1"))
            if f.suffix == ".parquet":
                parts.append(repr(pl.read_parquet(f).to_dicts()))
    return "\n".join(parts)


def test_compaction_removes_the_deleted_users_data_from_the_files(tmp_path):
    ws = open_ws(tmp_path)
    track_ok(ws, attributes=[
        {"external_id": "gone-user", "secret": "gone-secret", "email": "gone@example.com",
         "push_tokens": [{"app_id": "app", "token": "gone-token"}],
         "subscription_groups": [{"subscription_group_id": "gone-group", "subscription_state": "subscribed"}]},
        {"external_id": "kept-user", "secret": "kept-secret"},
    ], events=[event("gone-event", external_id="gone-user")], purchases=[purchase("gone-sku", external_id="gone-user")])
    r = ws.call("POST", "/users/alias/new", {"user_aliases": [{**alias("gone-alias"), "external_id": "gone-user"}]})
    assert r.status == 200
    data = ("gone-secret", "gone@example.com", "gone-token", "gone-group", "gone-event", "gone-sku", "gone-alias")
    assert all(d in store_text(tmp_path / "store") for d in data)  # present before
    delete(ws, 1, external_ids=["gone-user"])
    ws.compact()
    text = store_text(tmp_path / "store")
    assert [d for d in data if d in text] == []
    assert "kept-secret" in text
    ws = open_ws(tmp_path)  # the compacted store reads back the same
    assert ws.export_users(["external_id", "custom_attributes"]) == [
        {"external_id": "kept-user", "custom_attributes": {"secret": "kept-secret"}}]
