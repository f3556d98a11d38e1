"""/users/export/ids: identifier kinds, validation, invalid_user_ids, fields, summaries, formats."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

import pytest
from tests.helpers import (
    ALL_FIELDS,
    NOW,
    Clock,
    alias,
    copy_of,
    event,
    export,
    export_one,
    export_users,
    iso,
    open_ws,
    purchase,
    random_bucket,
    service_id,
    track_ok,
    ts,
)

from engagelake import Response
from engagelake.rules.messages import (
    EXPORT_BODY_NOT_OBJECT,
    EXPORT_EXTERNAL_IDS,
    EXPORT_FIELDS_REQUIRED,
    EXPORT_FIELDS_SHAPE,
    EXPORT_NO_IDENTIFIER,
    EXPORT_ONE_OF,
    EXPORT_STRING_FIELD,
    EXPORT_TOO_MANY,
    EXPORT_UNKNOWN_FIELDS,
    EXPORT_USER_ALIASES,
)

ANN = "ann@example.com"
PHONE = "+14155550100"
TIMESTAMP = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$")



@pytest.fixture
def people(tmp_path):
    """u1 (sid 0), u2 (sid 1) share ANN; alias-only a3 (sid 2); email-only solo (sid 3): a copy
    of a store built once."""
    return copy_of(tmp_path, _people)


def _people(ws):
    track_ok(
        ws,
        attributes=[
            {
                "external_id": "u1",
                "email": ANN,
                "phone": PHONE,
                "first_name": "Ann",
                "push_tokens": [{"app_id": "app", "token": "T1", "device_id": "d1"}],
            },
            {"external_id": "u2", "email": ANN, "first_name": "Bo"},
            {"user_alias": alias("a3"), "_update_existing_only": False, "first_name": "Al"},
            {"email": "solo@example.com", "first_name": "Solo"},
        ],
    )


def names(users):
    return [u.get("first_name") for u in users]


def bad(message: str) -> Response:
    return Response(400, {"message": message})


# --- each identifier kind ----------------------------------------------------------------------------


def test_by_external_ids_in_request_order(people):
    r = export(people, ["external_id", "first_name"], external_ids=["u2", "u1"])
    assert r == Response(
        200,
        {
            "message": "success",
            "users": [{"external_id": "u2", "first_name": "Bo"}, {"external_id": "u1", "first_name": "Ann"}],
        },
    )


def test_by_user_aliases(people):
    assert export_users(people, ["first_name", "user_aliases", "external_id"], user_aliases=[alias("a3")]) == [
        {"first_name": "Al", "user_aliases": [alias("a3")]}
    ]


def test_by_service_id(people):
    assert export_users(people, ["first_name", "service_id"], service_id=service_id(2)) == [
        {"first_name": "Al", "service_id": service_id(2)}
    ]
    assert names(export_users(people, ["first_name"], service_id=service_id(3))) == ["Solo"]


def test_by_device_id(people):
    assert export_users(people, ["external_id", "devices"], device_id="d1") == [
        {"external_id": "u1", "devices": [{"device_id": "d1"}]}
    ]


def test_device_id_matches_every_holder_in_creation_order(people):
    track_ok(
        people,
        attributes=[
            {"external_id": "u2", "push_tokens": [{"app_id": "web", "token": "W1", "device_id": "shared"}]},
            {"external_id": "u1", "push_tokens": [{"app_id": "app", "token": "T9", "device_id": "shared"}]},
        ],
    )
    assert names(export_users(people, ["first_name"], device_id="shared")) == ["Ann", "Bo"]


@pytest.mark.parametrize("given", [ANN, "  Ann@Example.COM "])
def test_by_email_address_returns_every_holder_in_creation_order(people, given):
    assert export_users(people, ["external_id", "email"], email_address=given) == [
        {"external_id": "u1", "email": ANN},
        {"external_id": "u2", "email": ANN},
    ]


def test_by_email_address_of_an_email_only_profile(people):
    assert export_users(people, ["external_id", "email", "service_id"], email_address="solo@example.com") == [
        {"email": "solo@example.com", "service_id": service_id(3)}
    ]


@pytest.mark.parametrize("given", [PHONE, "+1 (415) 555-0100", "1.415.555.0100"])
def test_by_phone(people, given):
    assert export_users(people, ["external_id", "phone"], phone=given) == [
        {"external_id": "u1", "phone": PHONE}
    ]


def test_a_user_matched_twice_is_returned_once(people):
    users = export_users(
        people,
        ["external_id"],
        external_ids=["u1", "u1"],
        service_id=service_id(0),
        email_address=ANN,
    )
    assert users == [{"external_id": "u1"}, {"external_id": "u2"}]


def test_users_are_ordered_by_the_first_identifier_that_matched(people):
    users = export_users(
        people,
        ["first_name"],
        service_id=service_id(0),
        user_aliases=[alias("a3")],
        external_ids=["u2"],
    )
    assert names(users) == ["Bo", "Al", "Ann"]


def test_up_to_50_ids_and_aliases(people):
    ids = ["u1", *[f"nobody{i}" for i in range(24)]]
    aliases = [alias("a3"), *[alias(f"none{i}") for i in range(24)]]
    r = export(people, ["first_name"], external_ids=ids, user_aliases=aliases)
    assert r.status == 200
    assert names(r.body["users"]) == ["Ann", "Al"]
    assert len(r.body["invalid_user_ids"]) == 48


# --- validation ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("body", [None, [], ["u1"], 5, True])
def test_body_not_an_object(ws, body):
    assert ws.call("POST", "/users/export/ids", body=body) == bad(EXPORT_BODY_NOT_OBJECT)


def test_no_identifier(people):
    assert export(people, ["email"]) == bad(EXPORT_NO_IDENTIFIER)
    assert export(people, ["email"], fields_to_export_typo=["u1"]) == bad(EXPORT_NO_IDENTIFIER)


@pytest.mark.parametrize("value", ["u1", [1], ["u1", None], [["u1"]], {"u1": 1}])
def test_external_ids_shape(people, value):
    assert export(people, ["email"], external_ids=value) == bad(EXPORT_EXTERNAL_IDS)


@pytest.mark.parametrize(
    "value",
    [
        alias("a3"),
        ["a3"],
        [{"alias_name": "a3"}],
        [{"alias_label": "crm"}],
        [{"alias_name": 3, "alias_label": "crm"}],
        [alias("a3"), None],
    ],
)
def test_user_aliases_shape(people, value):
    assert export(people, ["email"], user_aliases=value) == bad(EXPORT_USER_ALIASES)


@pytest.mark.parametrize("name", ["service_id", "device_id", "email_address", "phone"])
@pytest.mark.parametrize("value", [5, ["x"], {"a": 1}, True])
def test_single_identifiers_must_be_strings(people, name, value):
    assert export(people, ["email"], **{name: value}) == bad(EXPORT_STRING_FIELD.format(field=name))


@pytest.mark.parametrize(("n_ids", "n_aliases"), [(51, 0), (0, 51), (30, 21), (26, 25)])
def test_more_than_50_ids_and_aliases(people, n_ids, n_aliases):
    r = export(
        people,
        ["email"],
        external_ids=[f"u{i}" for i in range(n_ids)],
        user_aliases=[alias(f"a{i}") for i in range(n_aliases)],
    )
    assert r == bad(EXPORT_TOO_MANY)


@pytest.mark.parametrize(
    "ids",
    [
        {"device_id": "d1", "email_address": ANN},
        {"device_id": "d1", "phone": PHONE},
        {"email_address": ANN, "phone": PHONE},
        {"device_id": "d1", "email_address": ANN, "phone": PHONE, "external_ids": ["u1"]},
    ],
)
def test_only_one_of_device_email_phone(people, ids):
    assert export(people, ["email"], **ids) == bad(EXPORT_ONE_OF)


def test_fields_to_export_is_required(people):
    assert export(people, None, external_ids=["u1"]) == bad(EXPORT_FIELDS_REQUIRED)


@pytest.mark.parametrize("fields", ["email", [1], ["email", None], {"email": True}, [["email"]]])
def test_fields_to_export_shape(people, fields):
    assert export(people, fields, external_ids=["u1"]) == bad(EXPORT_FIELDS_SHAPE)


@pytest.mark.parametrize("unknown", [["bogus"], ["bogus", "nope"], ["Email"], ["updated_at"]])
def test_unknown_fields_are_named(people, unknown):
    r = export(people, ["email", *unknown, "first_name"], external_ids=["u1"])
    assert r.status == 400
    assert set(r.body) == {"message"}
    prefix = EXPORT_UNKNOWN_FIELDS.split("{names}")[0]
    assert r.body["message"].startswith(prefix)
    named = r.body["message"][len(prefix):]
    for name in unknown:
        assert name in named
    assert "first_name" not in named


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"external_ids": "u1", "user_aliases": "a"}, EXPORT_EXTERNAL_IDS),
        ({"user_aliases": "a", "service_id": 5}, EXPORT_USER_ALIASES),
        ({"service_id": 5, "external_ids": [f"u{i}" for i in range(60)]}, EXPORT_STRING_FIELD.format(field="service_id")),
        (
            {"external_ids": [f"u{i}" for i in range(60)], "device_id": "d", "phone": PHONE},
            EXPORT_TOO_MANY,
        ),
        ({"device_id": "d", "phone": PHONE}, EXPORT_ONE_OF),
        ({"fields_to_export": ["bogus"]}, EXPORT_NO_IDENTIFIER),
        ({"fields_to_export": "bogus", "external_ids": [f"u{i}" for i in range(60)]}, EXPORT_TOO_MANY),
        ({"external_ids": ["u1"], "fields_to_export": "email"}, EXPORT_FIELDS_SHAPE),
    ],
)
def test_validation_order(people, body, message):
    assert people.call("POST", "/users/export/ids", body=body) == bad(message)


# --- invalid_user_ids ------------------------------------------------------------------------------------------


def test_invalid_user_ids_lists_unmatched_identifiers(people):
    r = export(
        people,
        ["external_id", "first_name"],
        external_ids=["u1", "ghost1", "ghost2"],
        user_aliases=[alias("a3"), alias("nobody")],
        service_id=service_id(9),
        device_id="no-device",
    )
    assert r.status == 200
    assert r.body["users"] == [{"external_id": "u1", "first_name": "Ann"}, {"first_name": "Al"}]
    assert sorted(r.body["invalid_user_ids"]) == sorted(
        ["ghost1", "ghost2", "nobody", service_id(9), "no-device"]
    )


@pytest.mark.parametrize(
    ("ids", "unmatched"),
    [
        ({"email_address": "nobody@example.com"}, "nobody@example.com"),
        ({"phone": "+14155559999"}, "+14155559999"),
        ({"device_id": "d404"}, "d404"),
        ({"service_id": "0123456789abcdef01234567"}, "0123456789abcdef01234567"),
        ({"user_aliases": [alias("a3", "other-label")]}, "a3"),
    ],
)
def test_invalid_user_ids_for_each_kind(people, ids, unmatched):
    r = export(people, ["external_id"], **ids)
    assert r.status == 200
    assert r.body["users"] == []
    assert r.body["invalid_user_ids"] == [unmatched]


def test_invalid_user_ids_absent_when_everything_matched(people):
    r = export(people, ["external_id"], external_ids=["u1", "u2"], email_address=ANN)
    assert r.body == {"message": "success", "users": [{"external_id": "u1"}, {"external_id": "u2"}]}


# --- fields: only those asked, only with a value ---------------------------------------------------------------


def test_bare_profile_exports_only_what_it_has(ws):
    track_ok(ws, attributes=[{"external_id": "bare"}])
    assert export_one(ws, "bare", ALL_FIELDS) == {
        "external_id": "bare",
        "service_id": service_id(0),
        "created_at": ts(NOW),
        "random_bucket": random_bucket(service_id(0)),
    }
    others = [f for f in ALL_FIELDS if f not in ("external_id", "service_id", "created_at", "random_bucket")]
    assert export_users(ws, others, external_ids=["bare"]) == [{}]


def test_only_requested_fields_appear(people):
    assert export_one(people, "u1", ["first_name"]) == {"first_name": "Ann"}
    assert export_one(people, "u1", ["phone", "email"]) == {"phone": PHONE, "email": ANN}


def test_full_profile_export(ws):
    track_ok(
        ws,
        attributes=[
            {
                "external_id": "full",
                "first_name": "Fay",
                "last_name": "Full",
                "email": "Fay@Example.com",
                "phone": "+33 6 12 34 56 78",
                "dob": "1991-03-04",
                "gender": "F",
                "country": "fr",
                "language": "FR",
                "home_city": "Lyon",
                "time_zone": "Europe/Paris",
                "email_subscribe": "opted_in",
                "push_subscribe": "opted_in",
                "last_coordinates": [4.83, 45.76],
                "attributed_campaign": "camp",
                "attributed_source": "src",
                "attributed_adgroup": "grp",
                "attributed_ad": "ad",
                "score": 7,
                "tags": ["a", "b"],
                "push_tokens": [
                    {"app_id": "app", "token": "T1", "device_id": "d2"},
                    {"app_id": "app", "token": "T2", "device_id": "d1"},
                    {"app_id": "web", "token": "T3", "device_id": "d2"},
                    {"app_id": "web", "token": "T4"},
                ],
            }
        ],
        events=[event("zeta", external_id="full"), event("alpha", NOW - timedelta(days=2), external_id="full")],
        purchases=[purchase("sku2", 2.5, quantity=2, external_id="full"), purchase("sku1", 1.0, external_id="full")],
    )
    sid = service_id(0)
    assert export_one(ws, "full", ALL_FIELDS) == {
        "external_id": "full",
        "service_id": sid,
        "created_at": ts(NOW),
        "random_bucket": random_bucket(sid),
        "first_name": "Fay",
        "last_name": "Full",
        "email": "fay@example.com",
        "phone": "+33612345678",
        "dob": "1991-03-04",
        "gender": "F",
        "country": "FR",
        "language": "fr",
        "home_city": "Lyon",
        "time_zone": "Europe/Paris",
        "email_subscribe": "opted_in",
        "push_subscribe": "opted_in",
        "push_opted_in_at": ts(NOW),
        "last_coordinates": [4.83, 45.76],
        "attributed_campaign": "camp",
        "attributed_source": "src",
        "attributed_adgroup": "grp",
        "attributed_ad": "ad",
        "custom_attributes": {"score": 7, "tags": ["a", "b"]},
        "push_tokens": [
            {"app": "app", "token": "T1", "device_id": "d2", "notifications_enabled": True},
            {"app": "app", "token": "T2", "device_id": "d1", "notifications_enabled": True},
            {"app": "web", "token": "T3", "device_id": "d2", "notifications_enabled": True},
            {"app": "web", "token": "T4", "notifications_enabled": True},
        ],
        "devices": [{"device_id": "d2"}, {"device_id": "d1"}],
        "custom_events": [
            {"name": "alpha", "first": ts(NOW - timedelta(days=2)), "last": ts(NOW - timedelta(days=2)), "count": 1},
            {"name": "zeta", "first": ts(NOW), "last": ts(NOW), "count": 1},
        ],
        "purchases": [
            {"name": "sku1", "first": ts(NOW), "last": ts(NOW), "count": 1},
            {"name": "sku2", "first": ts(NOW), "last": ts(NOW), "count": 1},
        ],
        "total_revenue": 6.0,
    }


def test_push_tokens_and_devices_keep_the_order_received(ws):
    received = [
        {"app_id": "web", "token": "Z9", "device_id": "dz"},
        {"app_id": "app", "token": "B2", "device_id": "da"},
        {"app_id": "app", "token": "A1", "device_id": "dz"},
    ]
    track_ok(ws, attributes=[{"external_id": "u1", "push_tokens": received[:2]}])
    track_ok(ws, attributes=[{"external_id": "u1", "push_tokens": received[2:]}])
    assert export_one(ws, "u1", ["push_tokens", "devices"]) == {
        "push_tokens": [
            {"app": "web", "token": "Z9", "device_id": "dz", "notifications_enabled": True},
            {"app": "app", "token": "B2", "device_id": "da", "notifications_enabled": True},
            {"app": "app", "token": "A1", "device_id": "dz", "notifications_enabled": True},
        ],
        "devices": [{"device_id": "dz"}, {"device_id": "da"}],
    }


APNS = "ab" * 32
FCM = "fGx1_-:APA91bHk_z"
WEB_PUSH = "https://push.example.com/s/1"


def test_push_tokens_name_the_platform_their_shape_shows(ws):
    tokens = [{"app_id": "ios", "token": APNS}, {"app_id": "android", "token": FCM},
              {"app_id": "web", "token": WEB_PUSH}, {"app_id": "ios", "token": APNS[:-2]},
              {"app_id": "x", "token": "plain"}]
    track_ok(ws, attributes=[{"external_id": "u1", "push_tokens": tokens}])
    assert export_one(ws, "u1", ["push_tokens"])["push_tokens"] == [
        {"app": "ios", "platform": "iOS", "token": APNS, "notifications_enabled": True},
        {"app": "android", "platform": "Android", "token": FCM, "notifications_enabled": True},
        {"app": "web", "platform": "Web", "token": WEB_PUSH, "notifications_enabled": True},
        # 31 bytes of hex and an unknown shape: no platform
        {"app": "ios", "token": APNS[:-2], "notifications_enabled": True},
        {"app": "x", "token": "plain", "notifications_enabled": True},
    ]


@pytest.mark.parametrize(("state", "enabled"), [
    (None, True), ("subscribed", True), ("opted_in", True), ("unsubscribed", False)])
def test_notifications_are_enabled_unless_push_was_unsubscribed(ws, state, enabled):
    track_ok(ws, attributes=[{"external_id": "u1", "push_subscribe": state,
                              "push_tokens": [{"app_id": "ios", "token": APNS}]}])
    assert export_one(ws, "u1", ["push_tokens"])["push_tokens"] == [
        {"app": "ios", "platform": "iOS", "token": APNS, "notifications_enabled": enabled}]


def test_notifications_follow_the_latest_push_subscription(ws):
    track_ok(ws, attributes=[{"external_id": "u1", "push_subscribe": "unsubscribed",
                              "push_tokens": [{"app_id": "web", "token": WEB_PUSH}]}])
    track_ok(ws, attributes=[{"external_id": "u1", "push_subscribe": "opted_in"}])
    assert export_one(ws, "u1", ["push_tokens"])["push_tokens"][0]["notifications_enabled"] is True
    track_ok(ws, attributes=[{"external_id": "u1", "push_subscribe": "unsubscribed"}])
    assert export_one(ws, "u1", ["push_tokens"])["push_tokens"][0]["notifications_enabled"] is False


def test_random_bucket_follows_the_service_id(ws):
    track_ok(ws, attributes=[{"external_id": f"r{i}"} for i in range(5)])
    users = export_users(ws, ["service_id", "random_bucket"], external_ids=[f"r{i}" for i in range(5)])
    assert [u["service_id"] for u in users] == [service_id(i) for i in range(5)]
    for u in users:
        assert u["random_bucket"] == random_bucket(u["service_id"])
        assert 0 <= u["random_bucket"] < 10000


# --- custom_events / purchases summaries and total_revenue ----------------------------------------------------


WINDOW_START = NOW - timedelta(days=90)


def test_custom_events_cover_the_last_90_days_both_ends_included(ws):
    times = [
        WINDOW_START - timedelta(seconds=1),  # just outside
        WINDOW_START,  # first moment inside
        NOW - timedelta(days=30),
        NOW,  # last moment inside
        NOW + timedelta(seconds=1),  # future: excluded
    ]
    track_ok(
        ws,
        events=[
            *[event("e", t, external_id="u1") for t in times],
            event("old", WINDOW_START - timedelta(days=1), external_id="u1"),
            event("future", NOW + timedelta(days=1), external_id="u1"),
        ],
    )
    assert export_one(ws, "u1", ["custom_events"]) == {
        "custom_events": [{"name": "e", "first": ts(WINDOW_START), "last": ts(NOW), "count": 3}]
    }
    assert ts(WINDOW_START) == "2026-08-24T12:00:00.000Z"


def test_only_old_events_give_no_custom_events(ws):
    track_ok(ws, events=[event("old", NOW - timedelta(days=120), external_id="u1")])
    assert export_one(ws, "u1", ["external_id", "custom_events"]) == {"external_id": "u1"}


def test_purchase_summaries_cover_the_same_window(ws):
    track_ok(
        ws,
        purchases=[
            purchase("p", 1.0, WINDOW_START - timedelta(seconds=1), external_id="u1"),
            purchase("p", 2.0, WINDOW_START, external_id="u1"),
            purchase("p", 4.0, NOW, quantity=3, external_id="u1"),
            purchase("p", 8.0, NOW + timedelta(seconds=1), external_id="u1"),
            purchase("old", 16.0, NOW - timedelta(days=200), external_id="u1"),
        ],
    )
    user = export_one(ws, "u1", ["purchases", "total_revenue"])
    assert user["purchases"] == [{"name": "p", "first": ts(WINDOW_START), "last": ts(NOW), "count": 2}]
    # total_revenue is over every purchase of the user, window or not
    assert user["total_revenue"] == 1.0 + 2.0 + 12.0 + 8.0 + 16.0


def test_window_moves_with_the_clock(tmp_path):
    clock = Clock()
    ws = open_ws(tmp_path, clock=clock)
    track_ok(ws, events=[event("e", NOW - timedelta(days=89), external_id="u1")])
    assert export_one(ws, "u1", ["custom_events"])["custom_events"][0]["count"] == 1
    clock.advance(days=2)
    assert export_one(ws, "u1", ["external_id", "custom_events"]) == {"external_id": "u1"}


def test_total_revenue_is_absent_without_purchases(ws):
    track_ok(ws, attributes=[{"external_id": "u1"}], events=[event(external_id="u1")])
    assert export_one(ws, "u1", ["external_id", "total_revenue", "purchases"]) == {"external_id": "u1"}


def test_total_revenue_is_rounded_to_6_decimals(ws):
    track_ok(ws, purchases=[purchase("a", 0.1, external_id="u1"), purchase("b", 0.2, external_id="u1")])
    assert 0.1 + 0.2 != 0.3
    assert export_one(ws, "u1", ["total_revenue"]) == {"total_revenue": 0.3}


def test_total_revenue_sums_price_times_quantity_across_currencies(ws):
    track_ok(
        ws,
        purchases=[
            purchase("a", 3.25, quantity=4, external_id="u1"),
            {**purchase("b", 100.0, external_id="u1"), "currency": "JPY"},
        ],
    )
    assert export_one(ws, "u1", ["total_revenue"]) == {"total_revenue": 113.0}


# --- timestamp formats -------------------------------------------------------------------------------------------


def test_timestamps_are_utc_with_milliseconds(tmp_path):
    midnight = datetime(2026, 11, 22, 0, 0, tzinfo=UTC)
    ws = open_ws(tmp_path, clock=lambda: midnight)
    track_ok(
        ws,
        attributes=[{"external_id": "u1", "push_subscribe": "opted_in"}],
        events=[
            {"external_id": "u1", "name": "e", "time": "2026-11-21T20:15:30.5-02:00"},
            {"external_id": "u1", "name": "e", "time": "2026-10-01T08:00:00:042+0000"},
        ],
    )
    user = export_one(ws, "u1", ["created_at", "push_opted_in_at", "custom_events"])
    assert user == {
        "created_at": "2026-11-22T00:00:00.000Z",
        "push_opted_in_at": "2026-11-22T00:00:00.000Z",
        "custom_events": [
            {"name": "e", "first": "2026-10-01T08:00:00.042Z", "last": "2026-11-21T22:15:30.500Z", "count": 2}
        ],
    }
    for value in (user["created_at"], user["custom_events"][0]["first"]):
        assert TIMESTAMP.match(value)


def test_created_at_is_the_clock_of_the_creating_request(tmp_path):
    clock = Clock()
    ws = open_ws(tmp_path, clock=clock)
    track_ok(ws, attributes=[{"external_id": "u1"}])
    later = clock.advance(days=1, milliseconds=7)
    track_ok(ws, attributes=[{"external_id": "u1", "a": 1}, {"external_id": "u2"}])
    users = export_users(ws, ["created_at"], external_ids=["u1", "u2"])
    assert users == [{"created_at": ts(NOW)}, {"created_at": ts(later)}]
    assert ts(later) == "2026-11-23T12:00:00.007Z"


def test_event_time_iso_helper_matches_the_accepted_format(ws):
    # guards the helpers: iso() output is a `time` the engine accepts
    assert iso(NOW) == "2026-11-22T12:00:00Z"
    track_ok(ws, events=[event("e", NOW, external_id="u1")])
