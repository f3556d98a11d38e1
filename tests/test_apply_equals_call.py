"""`Workspace.apply(batch)` answers and ends exactly like calling the requests one by one."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from tests.helpers import (
    ALL_FIELDS,
    EXPORT,
    NOW,
    TRACK,
    alias,
    err,
    event,
    export,
    open_ws,
    purchase,
    service_id,
    ts,
)

from engagelake.rules.messages import (
    ERR_DOB,
    ERR_EVENT_NAME,
    ERR_INC_NOT_NUMERIC,
    FATAL_BLOCKED_EXTERNAL_ID,
)

TABLES = (
    "profiles", "attributes", "events", "purchases", "aliases", "push_tokens", "subscriptions",
    "external_ids",
)
E = "shared@example.com"


def post_track(**arrays: Any) -> dict[str, Any]:
    return {"method": "POST", "path": TRACK, "body": arrays}


def post_export(fields: list[str] = ALL_FIELDS, **ids: Any) -> dict[str, Any]:
    return {"method": "POST", "path": EXPORT, "body": {**ids, "fields_to_export": fields}}


def token(tok: str, device: str, app: str = "app") -> dict[str, str]:
    return {"app_id": app, "token": tok, "device_id": device}


IDENTITIES_AND_ATTRIBUTES = [
    post_track(attributes=[{"external_id": "u1", "email": E, "a": 1, "tags": ["x", "y"]}]),
    post_track(events=[event("opened", external_id="u1"), event("opened", email="new@example.com")]),
    post_export(external_ids=["u1", "ghost"]),
    post_track(
        attributes=[
            {"external_id": "u1", "a": {"inc": 2}, "tags": {"add": ["z", "x"], "remove": ["y"]}},
            {"external_id": "u2", "email": "SHARED@example.com", "first_name": "Two"},
            {"user_alias": alias("al"), "_update_existing_only": False, "email": E, "b": 1},
            {"user_alias": alias("nobody"), "c": 1},
        ]
    ),
    {"method": "POST", "path": TRACK, "body": "{not json"},
    post_track(
        attributes=[{"email": E, "via_email": 1}, {"external_id": "u1", "dob": "2023-02-30"}],
        events=[event("", external_id="u1"), event("clicked", email=E)],
    ),
    post_track(attributes=[{"external_id": "u3"}], events=[event(external_id="guest")]),
    {"method": "POST", "path": "/users/nowhere", "body": {}},
    {"method": "GET", "path": TRACK},
    post_export(["external_id", "custom_attributes"], email_address=E),
    post_track(
        attributes=[
            {"external_id": "u1", "a": {"inc": 1}},
            {"external_id": "u3", "_update_existing_only": True, "d": 1},
            {"phone": "+1 415 555 0100", "e": 1},
        ]
    ),
    post_track(attributes=[{"phone": "14155550100", "e": {"inc": 1}}, {"external_id": "u1", "a": "text"}]),
    post_track(attributes=[{"external_id": "u1", "a": {"inc": 1}}]),
    post_export(["external_id", "custom_attributes", "custom_events"], external_ids=["u1", "u2", "u3"]),
]

PUSH_AND_SUBSCRIPTIONS = [
    post_track(attributes=[{"external_id": "u1", "email": E, "push_tokens": [token("T1", "d1")]}]),
    post_track(attributes=[{"push_token_import": True, "push_tokens": [token("T1", "d1"), token("T2", "d2")]}]),
    post_export(["external_id", "service_id", "push_tokens"], device_id="d2"),
    post_track(attributes=[{"external_id": "u2", "email": E, "push_tokens": [token("T2", "d2")]}]),
    post_track(
        attributes=[
            {"external_id": "u1", "email_subscribe": "unsubscribed"},
            {
                "external_id": "u2",
                "subscription_groups": [
                    {"subscription_group_id": "g1", "subscription_state": "subscribed"}
                ],
            },
            {"service_id": service_id(2), "email_subscribe": "opted_in"},
        ]
    ),
    post_track(attributes=[{"push_token_import": True, "push_tokens": [token("T2", "d2"), token("T3", "d3")]}]),
    post_track(attributes=[{"external_id": "u3", "push_tokens": [token("T1", "d1"), token("T3", "d3")]}]),
    post_export(["external_id", "push_tokens", "email_subscribe"], device_id="d1"),
    post_export(["external_id", "push_tokens", "email_subscribe"], email_address=E),
]

EVENTS_AND_PURCHASES = [
    post_track(
        events=[event("e", NOW - timedelta(days=90), external_id="u1"), event("e", external_id="u1")],
        purchases=[purchase("p", 2.5, quantity=2, external_id="u1")],
    ),
    post_track(events=[event("e", NOW - timedelta(days=91), external_id="u1")]),
    post_track(purchases=[purchase("p", 1.0, NOW + timedelta(days=1), external_id="u1")]),
    post_export(["custom_events", "purchases", "total_revenue"], external_ids=["u1"]),
    post_track(
        events=[event("e", external_id="n"), event("e", email="n@example.com")],
        purchases=[purchase("q", 1.0, external_id="n"), purchase("q", 1.0, phone="+442079460958")],
    ),
    post_track(attributes=[{"external_id": "n", "email": "N@example.com"}], events=[event("f", email="n@example.com")]),
    post_track(
        events=[event("e", external_id="u1"), event("e", external_id="u1", time="2026-11-22T12:00:00")],
        purchases=[purchase("p", 3.0, external_id="u1", currency="usd")],
    ),
    post_track(events=[event("e", external_id="u1")] * 3),
    post_export(["custom_events", "purchases", "total_revenue"], external_ids=["u1", "n"]),
    post_export(["service_id", "custom_events"], email_address="n@example.com"),
]


def final_state(ws) -> tuple[Any, ...]:
    profiles = ws.table("profiles").collect().height
    by_sid = [export(ws, ALL_FIELDS, service_id=service_id(i)).body for i in range(profiles + 2)]
    by_email = export(ws, ALL_FIELDS, email_address=E).body
    heights = {t: ws.table(t).collect().height for t in TABLES}
    groups = sorted(ws.table("subscriptions").collect().select("service_id", "group_id", "state").rows())
    return by_sid, by_email, heights, groups


@pytest.mark.parametrize(
    ("batch", "statuses"),
    [
        (
            IDENTITIES_AND_ATTRIBUTES,
            [201, 201, 200, 201, 400, 201, 400, 404, 405, 200, 201, 201, 201, 200],
        ),
        (PUSH_AND_SUBSCRIPTIONS, [201, 201, 200, 201, 201, 201, 201, 200, 200]),
        (EVENTS_AND_PURCHASES, [201, 201, 201, 200, 201, 201, 201, 201, 200, 200]),
    ],
    ids=["identities-attributes", "push-subscriptions", "events-purchases"],
)
def test_apply_equals_calls_one_by_one(tmp_path, batch, statuses):
    batched = open_ws(tmp_path, "batched")
    sequential = open_ws(tmp_path, "sequential")

    applied = batched.apply(batch)
    called = [
        sequential.call(req["method"], req["path"], body=req.get("body")) for req in batch
    ]

    assert [r.status for r in called] == statuses
    assert applied == called
    state = final_state(batched)
    assert state == final_state(sequential)
    assert state[2]["profiles"] > 0


def test_apply_in_two_batches_equals_one_batch(tmp_path):
    whole = open_ws(tmp_path, "whole")
    halves = open_ws(tmp_path, "halves")
    batch = IDENTITIES_AND_ATTRIBUTES + EVENTS_AND_PURCHASES
    middle = len(batch) // 2
    assert whole.apply(batch) == halves.apply(batch[:middle]) + halves.apply(batch[middle:])
    assert final_state(whole) == final_state(halves)


def test_mid_batch_exports_see_the_state_at_that_point(tmp_path):
    ws = open_ws(tmp_path)
    rs = ws.apply(IDENTITIES_AND_ATTRIBUTES)
    assert rs[2].body["users"] == [
        {
            "external_id": "u1",
            "service_id": service_id(0),
            "created_at": "2026-11-22T12:00:00.000Z",
            "random_bucket": int(service_id(0)[:8], 16) % 10000,
            "email": E,
            "custom_attributes": {"a": 1, "tags": ["x", "y"]},
            "custom_events": [
                {"name": "opened", "first": "2026-11-22T12:00:00.000Z",
                 "last": "2026-11-22T12:00:00.000Z", "count": 1}
            ],
        }
    ]
    assert rs[2].body["invalid_user_ids"] == ["ghost"]
    assert rs[5].body["errors"] == [
        err(ERR_DOB, "attributes", 1),
        err(ERR_EVENT_NAME, "events", 0),
    ]
    assert rs[6].body == {"message": FATAL_BLOCKED_EXTERNAL_ID, "errors": [FATAL_BLOCKED_EXTERNAL_ID]}
    # u2 was updated after u1 in request 3, so the email lookups of request 5 land on u2
    assert rs[9].body["users"] == [
        {"external_id": "u1", "custom_attributes": {"a": 3, "tags": ["z", "x"]}},
        {"external_id": "u2", "custom_attributes": {"via_email": 1}},
        {"custom_attributes": {"b": 1}},
    ]
    assert rs[12].body["errors"] == [err(ERR_INC_NOT_NUMERIC, "attributes", 0)]
    opened = {"name": "opened", "first": ts(NOW), "last": ts(NOW), "count": 1}
    assert rs[13].body == {
        "message": "success",
        "users": [
            {
                "external_id": "u1",
                "custom_attributes": {"a": "text", "tags": ["z", "x"]},
                "custom_events": [opened],
            },
            {
                "external_id": "u2",
                "custom_attributes": {"via_email": 1},
                "custom_events": [{**opened, "name": "clicked"}],
            },
        ],
        "invalid_user_ids": ["u3"],
    }
    assert rs[10].body == {"message": "success", "attributes_processed": 3}
