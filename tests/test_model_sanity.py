"""Direct checks of the reference model (tests/model.py) against the documented rules."""

from __future__ import annotations

import copy
import json
from datetime import UTC, datetime

import pytest
from hypothesis import HealthCheck, given, settings
from tests.model import (
    ALIAS_NEW_PATH,
    ALIAS_UPDATE_PATH,
    DELETE_PATH,
    EXPORT_PATH,
    IDENTIFY_PATH,
    IDENTITY_PATHS,
    MERGE_PATH,
    REMOVE_PATH,
    RENAME_PATH,
    TRACK_PATH,
    Model,
    random_bucket_for,
    service_id_for,
)
from tests.test_model_property import request_sequences

from engagelake.rules import messages as m

CLOCK = datetime(2026, 11, 22, tzinfo=UTC)


@pytest.fixture
def model() -> Model:
    return Model(lambda: CLOCK, "s")


def track(model: Model, **body) -> tuple[int, dict]:
    return model.call("POST", TRACK_PATH, body)


def export(model: Model, **body) -> tuple[int, dict]:
    return model.call("POST", EXPORT_PATH, body)


def user(model: Model, external_id: str) -> dict:
    return next(u for u in model.export_users() if u.get("external_id") == external_id)


def custom(model: Model, external_id: str) -> dict:
    return user(model, external_id).get("custom_attributes", {})


# --- dispatch --------------------------------------------------------------------------------
def test_unknown_path_and_wrong_method(model: Model) -> None:
    status, body = model.call("POST", "/users/nope", {})
    assert status == 404
    assert body == {"message": m.NOT_FOUND.format(method="POST", path="/users/nope")}
    status, body = model.call("GET", TRACK_PATH)
    assert status == 405
    assert body == {
        "message": m.METHOD_NOT_ALLOWED.format(method="GET", path=TRACK_PATH, allowed="POST")
    }
    assert model.call("POST", TRACK_PATH, "{not json") == (400, {"message": m.BAD_JSON})


# --- fatal checks ----------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("body", "message"),
    [
        ([], m.FATAL_BODY_NOT_OBJECT),
        ({}, m.FATAL_NO_ARRAYS),
        ({"attributes": None}, m.FATAL_NOT_ARRAY.format(array="attributes")),
        ({"attributes": [{}] * 76}, m.FATAL_TOO_MANY.format(array="attributes")),
        (
            {"attributes": [], "events": [{}, 3]},
            m.FATAL_ELEMENT_NOT_OBJECT.format(array="events", index=1),
        ),
        # per array: not-array, too many, element; attributes before events
        (
            {"attributes": [1], "events": "x"},
            m.FATAL_ELEMENT_NOT_OBJECT.format(array="attributes", index=0),
        ),
        ({"events": [{"external_id": " Guest ", "name": "x"}]}, m.FATAL_BLOCKED_EXTERNAL_ID),
        (
            {"attributes": [{"push_token_import": True, "external_id": "NULL"}]},
            m.FATAL_BLOCKED_EXTERNAL_ID,
        ),
    ],
)
def test_fatal(model: Model, body, message: str) -> None:
    assert model.call("POST", TRACK_PATH, body) == (400, {"message": message, "errors": [message]})
    assert model.export_users() == []


def test_fatal_applies_nothing(model: Model) -> None:
    status, _ = track(model, attributes=[{"external_id": "u1"}, {"external_id": "none"}])
    assert status == 400
    assert model.export_users() == []


# --- non-fatal checks ------------------------------------------------------------------------
def test_non_fatal_errors_in_input_order(model: Model) -> None:
    status, body = track(
        model,
        attributes=[
            {"external_id": "u1", "user_alias": {"alias_name": "a", "alias_label": "b"}},
            {"external_id": "u1", "gender": "x", "dob": "1990-02-30"},  # dob checked before gender
            {"external_id": "u1", "score": 1},
        ],
        events=[{"external_id": "u1", "name": "e", "time": "yesterday"}],
        purchases=[{"email": "bad", "product_id": "p"}],
    )
    assert status == 201
    assert body == {
        "message": "success",
        "attributes_processed": 1,
        "events_processed": 0,
        "purchases_processed": 0,
        "errors": [
            {"type": m.ERR_MULTIPLE_IDENTIFIERS, "input_array": "attributes", "index": 0},
            {"type": m.ERR_DOB, "input_array": "attributes", "index": 1},
            {"type": m.ERR_TIME, "input_array": "events", "index": 0},
            {"type": m.ERR_EMAIL, "input_array": "purchases", "index": 0},
        ],
    }


def test_check_order_identifier_before_fields(model: Model) -> None:
    _, body = track(model, attributes=[{"_update_existing_only": "x", "external_id": 5}])
    assert body["errors"][0]["type"] == m.ERR_UPDATE_EXISTING_ONLY
    _, body = track(model, attributes=[{"external_id": 5, "gender": "x"}])
    assert body["errors"][0]["type"] == m.ERR_EXTERNAL_ID
    _, body = track(model, attributes=[{"first_name": "x"}])
    assert body["errors"][0]["type"] == m.ERR_MISSING_IDENTIFIER
    # email identifies (and must be valid) even when a valid phone is there
    _, body = track(model, attributes=[{"email": "bad", "phone": "+14155550100"}])
    assert body["errors"][0]["type"] == m.ERR_EMAIL
    # email identifies, phone is a field and is checked
    _, body = track(model, attributes=[{"email": "a@b.co", "phone": "12"}])
    assert body["errors"][0]["type"] == m.ERR_PHONE


def test_custom_attribute_checks_in_key_order(model: Model) -> None:
    _, body = track(model, attributes=[{"external_id": "u1", "b": {"inc": 1.5}, "$a": 1}])
    assert body["errors"][0]["type"] == m.ERR_INC_VALUE
    _, body = track(model, attributes=[{"external_id": "u1", "$a": 1, "b": {"inc": 1.5}}])
    assert body["errors"][0]["type"] == m.ERR_ATTRIBUTE_NAME
    _, body = track(model, attributes=[{"external_id": "u1", "a": "x" * 256}])
    assert body["errors"][0]["type"] == m.ERR_ATTRIBUTE_STRING
    _, body = track(model, attributes=[{"external_id": "u1", "a": {"add": "x"}}])
    assert body["errors"][0]["type"] == m.ERR_ADD_REMOVE_VALUE
    deep: dict = {}
    for _ in range(51):
        deep = {"k": deep}
    _, body = track(model, attributes=[{"external_id": "u1", "a": deep}])
    assert body["errors"][0]["type"] == m.ERR_ATTRIBUTE_DEPTH
    assert model.export_users() == []


def test_inc_on_string_is_an_error_and_applies_nothing(model: Model) -> None:
    track(model, attributes=[{"external_id": "u1", "nick": "bo", "n": 1}])
    _, body = track(model, attributes=[{"external_id": "u1", "n": 5, "nick": {"inc": 1}}])
    assert body["errors"] == [
        {"type": m.ERR_INC_NOT_NUMERIC, "input_array": "attributes", "index": 0}
    ]
    assert body["attributes_processed"] == 0
    assert custom(model, "u1") == {"nick": "bo", "n": 1}


def test_inc(model: Model) -> None:
    track(model, attributes=[{"external_id": "u1", "a": {"inc": 2}, "f": 1.5}])
    track(model, attributes=[{"external_id": "u1", "a": {"inc": -5}, "f": {"inc": 1}}])
    c = custom(model, "u1")
    assert c == {"a": -3, "f": 2.5}
    assert isinstance(c["a"], int)
    track(model, attributes=[{"external_id": "u1", "b": True}])
    _, body = track(model, attributes=[{"external_id": "u1", "b": {"inc": 1}}])
    assert body["errors"][0]["type"] == m.ERR_INC_NOT_NUMERIC


def test_array_op_on_non_array(model: Model) -> None:
    track(model, attributes=[{"external_id": "u1", "t": "x"}])
    _, body = track(model, attributes=[{"external_id": "u1", "t": {"remove": ["x"]}}])
    assert body["errors"][0]["type"] == m.ERR_ARRAY_OP_NOT_ARRAY


def test_ordered_set_semantics(model: Model) -> None:
    track(model, attributes=[{"external_id": "u1", "t": ["a", "b", "a", 1, 1.0, True]}])
    assert json.dumps(custom(model, "u1")["t"]) == json.dumps(["b", "a", 1, 1.0, True])
    track(model, attributes=[{"external_id": "u1", "t": {"add": ["b", "c"], "remove": [1, "zz"]}}])
    assert json.dumps(custom(model, "u1")["t"]) == json.dumps(["a", 1.0, True, "b", "c"])
    # add first, then remove
    track(model, attributes=[{"external_id": "u1", "t": {"add": ["d"], "remove": ["d", True]}}])
    assert json.dumps(custom(model, "u1")["t"]) == json.dumps(["a", 1.0, "b", "c"])
    # missing attribute counts as []
    track(
        model,
        attributes=[{"external_id": "u1", "new": {"remove": ["x"]}, "o": {"add": [{"k": 1}]}}],
    )
    assert custom(model, "u1")["new"] == []
    assert custom(model, "u1")["o"] == [{"k": 1}]
    track(model, attributes=[{"external_id": "u1", "o": {"add": [{"k": 1}, {"k": 2}]}}])
    assert custom(model, "u1")["o"] == [{"k": 1}, {"k": 2}]


def test_array_cap_keeps_newest(model: Model) -> None:
    track(model, attributes=[{"external_id": "u1", "t": list(range(505))}])
    assert custom(model, "u1")["t"] == list(range(5, 505))
    track(model, attributes=[{"external_id": "u1", "t": {"add": [1000, 5]}}])
    assert custom(model, "u1")["t"] == [*range(7, 505), 1000, 5]
    # cap applies after remove: adding 3 and removing 2 from 500 leaves 500, nothing dropped
    track(model, attributes=[{"external_id": "u1", "t": {"add": [1, 2, 3], "remove": [1000, 5]}}])
    assert custom(model, "u1")["t"] == [*range(8, 505), 1, 2, 3]


def test_null_removes_and_nested_objects(model: Model) -> None:
    stays = [{"hotel": "h1", "nights": 2}, {"hotel": "h2", "nights": 1}]
    track(model, attributes=[{"external_id": "u1", "a": 1, "s": stays, "o": {"x": {"y": 1}}}])
    track(model, attributes=[{"external_id": "u1", "a": None, "first_name": "Al"}])
    track(model, attributes=[{"external_id": "u1", "first_name": None}])
    u = user(model, "u1")
    assert u["custom_attributes"] == {"s": stays, "o": {"x": {"y": 1}}}
    assert "first_name" not in u


# --- identification and creation -------------------------------------------------------------
def test_creation_rules(model: Model) -> None:
    alias = {"alias_name": "a1", "alias_label": "crm"}
    _, body = track(
        model,
        attributes=[
            {"external_id": "u1", "_update_existing_only": True},  # skipped, counted
            {"user_alias": alias},  # default update-only: skipped
            {"user_alias": alias, "_update_existing_only": True},
            {"email": "new@example.com", "_update_existing_only": True},
            {"service_id": "f" * 24},
        ],
        events=[
            {
                "user_alias": alias,
                "_update_existing_only": False,
                "name": "e",
                "time": "2026-11-21T00:00:00Z",
            },
        ],
    )
    assert body == {
        "message": "success",
        "attributes_processed": 4,
        "events_processed": 1,
        "errors": [{"type": m.ERR_UNKNOWN_SERVICE_ID, "input_array": "attributes", "index": 4}],
    }
    assert model.export_users() == []
    track(
        model,
        attributes=[
            {"user_alias": alias, "_update_existing_only": False, "x": 1},
            {"phone": "+1 (415) 555-0100"},
        ],
        purchases=[
            {
                "email": " New@Example.com",
                "product_id": "p",
                "currency": "USD",
                "price": 2,
                "time": "2026-11-21T00:00:00Z",
            }
        ],
    )
    users = model.export_users()
    assert [u.get("user_aliases") for u in users] == [[alias], None, None]
    assert users[1]["phone"] == "+14155550100"
    assert users[2]["email"] == "new@example.com"
    sid0 = service_id_for("s", 0)
    assert users[0]["service_id"] == sid0
    assert users[0]["random_bucket"] == random_bucket_for(sid0) == int(sid0[:8], 16) % 10000
    # later objects find the profile (no duplicates)
    track(model, attributes=[{"service_id": sid0, "y": 2}, {"user_alias": alias, "z": 3}])
    assert model.export_users()[0]["custom_attributes"] == {"x": 1, "y": 2, "z": 3}


def test_email_resolution_prefers_external_id_profiles(model: Model) -> None:
    track(
        model,
        attributes=[
            {"email": "ann@example.com", "nick": "email-only"},  # profile 0, no external id
            {"external_id": "u1", "email": "ann@example.com"},  # profile 1
            {"external_id": "u2", "email": "ANN@example.com"},  # profile 2 (most recent)
        ],
    )
    track(model, attributes=[{"external_id": "u1", "x": 1}])  # u1 is now the most recent
    track(model, attributes=[{"email": " Ann@Example.com ", "hit": True}])
    assert custom(model, "u1") == {"x": 1, "hit": True}
    assert "hit" not in custom(model, "u2")
    # no profile with an external id: the most recently updated one
    track(
        model,
        attributes=[
            {"email": "bob@example.com", "n": 0},
            {
                "user_alias": {"alias_name": "a", "alias_label": "b"},
                "_update_existing_only": False,
                "email": "bob@example.com",
            },
            {"email": "bob@example.com", "n": 1},
        ],
    )
    users = model.export_users()
    assert users[3]["custom_attributes"] == {"n": 0}
    assert users[4]["custom_attributes"] == {"n": 1}


def test_phone_resolution(model: Model) -> None:
    track(model, attributes=[{"phone": "+1 415 555 0100", "a": 1}])
    track(model, attributes=[{"phone": "1-415-555-0100", "b": 2}])
    assert len(model.export_users()) == 1
    _, body = track(model, attributes=[{"phone": "0415550100"}])
    assert body["errors"][0]["type"] == m.ERR_PHONE


# --- profile fields --------------------------------------------------------------------------
def test_profile_fields_normalized(model: Model) -> None:
    _, body = track(
        model,
        attributes=[
            {
                "external_id": "u1",
                "country": "fr",
                "language": "EN",
                "dob": "2000-02-29",
                "gender": "F",
                "time_zone": "Europe/Paris",
                "last_coordinates": [2, 48.5],
                "email": " A@B.CO ",
                "phone": "+44 7700-900-123",
                "home_city": "Paris",
            }
        ],
    )
    assert "errors" not in body
    u = user(model, "u1")
    assert (u["country"], u["language"], u["email"], u["phone"]) == (
        "FR",
        "en",
        "a@b.co",
        "+447700900123",
    )
    assert json.dumps(u["last_coordinates"]) == "[2.0, 48.5]"
    for field, value, err in [
        ("dob", "1990-02-30", m.ERR_DOB),
        ("gender", "m", m.ERR_GENDER),
        ("country", "XX", m.ERR_COUNTRY),
        ("language", "zz", m.ERR_LANGUAGE),
        ("time_zone", "Mars/Base", m.ERR_TIME_ZONE),
        ("push_subscribe", "maybe", m.ERR_SUBSCRIBE.format(field="push_subscribe")),
        ("last_coordinates", [200, 0], m.ERR_COORDINATES),
        ("first_name", 7, m.ERR_FIELD_STRING.format(field="first_name")),
    ]:
        _, body = track(model, attributes=[{"external_id": "u1", field: value}])
        assert body["errors"][0]["type"] == err, field


def test_push_opted_in_at(model: Model) -> None:
    times = iter(
        [
            CLOCK,
            datetime(2026, 11, 23, tzinfo=UTC),
            datetime(2026, 11, 24, tzinfo=UTC),
            datetime(2026, 11, 25, tzinfo=UTC),
        ]
    )
    model = Model(lambda: next(times), "s")
    track(model, attributes=[{"external_id": "u1", "push_subscribe": "opted_in"}])
    track(model, attributes=[{"external_id": "u1", "push_subscribe": "opted_in"}])
    track(model, attributes=[{"external_id": "u1", "push_subscribe": "unsubscribed"}])
    u = user(model, "u1")
    assert u["push_opted_in_at"] == "2026-11-22T00:00:00.000Z"
    assert u["push_subscribe"] == "unsubscribed"


def test_same_email_propagation(model: Model) -> None:
    track(
        model,
        attributes=[
            {"email": "ann@example.com"},
            {"external_id": "u2", "email": "ann@example.com"},
            {"external_id": "u1", "email": "ANN@example.com", "email_subscribe": "opted_in"},
            {"external_id": "u3", "email": "bob@example.com"},
        ],
    )
    states = [u.get("email_subscribe") for u in model.export_users()]
    assert states == ["opted_in", "opted_in", "opted_in", None]
    # identified by email: no propagation
    track(model, attributes=[{"email": "ann@example.com", "email_subscribe": "unsubscribed"}])
    states = [u.get("email_subscribe") for u in model.export_users()]
    assert states.count("unsubscribed") == 1


def test_propagation_bumps_recency(model: Model) -> None:
    track(
        model,
        attributes=[
            {"external_id": "u1", "email": "ann@example.com"},
            {"external_id": "u2", "email": "ann@example.com"},
            {"external_id": "u3", "email": "bob@example.com"},
        ],
    )
    # u2 is the most recent holder of ann@; u3 takes bob@ -> its propagation touches nobody
    # u1 sets a group state: u1 and u2 touched by the same object; tie broken by creation (u2)
    track(
        model,
        attributes=[
            {
                "external_id": "u1",
                "subscription_groups": [
                    {"subscription_group_id": "g1", "subscription_state": "subscribed"}
                ],
            }
        ],
    )
    track(model, attributes=[{"email": "ann@example.com", "hit": 1}])
    assert custom(model, "u2") == {"hit": 1}


def test_push_tokens_single_owner(model: Model) -> None:
    tok = {"app_id": "app1", "token": "t1", "device_id": "d1"}
    track(
        model,
        attributes=[
            {"external_id": "u1", "email": "ann@example.com", "push_tokens": [tok]},
            {"external_id": "u2", "email": "ann@example.com"},
        ],
    )
    # u2 now most recent; moving the token away from u1 bumps u1
    track(
        model,
        attributes=[{"external_id": "u3", "push_tokens": [{"app_id": "app1", "token": "t1"}]}],
    )
    assert "push_tokens" not in user(model, "u1")
    assert user(model, "u3")["push_tokens"] == [{"app": "app1", "token": "t1", "notifications_enabled": True}]
    assert "devices" not in user(model, "u3")
    track(model, attributes=[{"email": "ann@example.com", "hit": 1}])
    assert custom(model, "u1") == {"hit": 1}


def test_push_token_upsert_moves_to_end(model: Model) -> None:
    a = {"app_id": "app1", "token": "t1", "device_id": "d1"}
    b = {"app_id": "app1", "token": "t2", "device_id": "d2"}
    track(model, attributes=[{"external_id": "u1", "push_tokens": [a, b]}])
    track(
        model,
        attributes=[{"external_id": "u1", "push_tokens": [{"app_id": "app1", "token": "t1"}]}],
    )
    u = user(model, "u1")
    assert u["push_tokens"] == [
        {"app": "app1", "token": "t2", "device_id": "d2", "notifications_enabled": True},
        {"app": "app1", "token": "t1", "notifications_enabled": True},
    ]
    assert u["devices"] == [{"device_id": "d2"}]


def test_push_token_import(model: Model) -> None:
    t1 = {"app_id": "app1", "token": "t1"}
    t2 = {"app_id": "app1", "token": "t2", "device_id": "d2"}
    track(model, attributes=[{"external_id": "u1", "push_tokens": [t1]}])
    _, body = track(
        model,
        attributes=[
            {"push_token_import": True, "external_id": "u9", "push_tokens": [t1, t2, t2], "x": "y"},
            {"push_token_import": True, "push_tokens": "bad", "_update_existing_only": "bad"},
            {"push_token_import": "yes", "external_id": "u1"},
        ],
    )
    assert body["attributes_processed"] == 1
    assert [e["type"] for e in body["errors"]] == [m.ERR_PUSH_TOKENS, m.ERR_PUSH_TOKEN_IMPORT]
    users = model.export_users()
    assert len(users) == 2
    assert "external_id" not in users[1]
    assert users[1]["push_tokens"] == [{"app": "app1", "token": "t2", "device_id": "d2", "notifications_enabled": True}]
    assert "custom_attributes" not in users[1]


# --- events, purchases, export ---------------------------------------------------------------
def test_events_purchases_and_summaries(model: Model) -> None:
    _, body = track(
        model,
        events=[
            {"external_id": "u1", "name": "open", "time": "2026-11-21T10:00:00.123456+02:00"},
            {"external_id": "u1", "name": "open", "time": "2026-08-24T00:00:00Z"},  # edge: in
            {"external_id": "u1", "name": "open", "time": "2026-08-23T23:59:59.999Z"},  # out
            {"external_id": "u1", "name": "buy", "time": "2026-11-23T00:00:00Z"},  # future: out
            {"external_id": "u1", "name": "app", "time": "2026-11-01T00:00:00:250-0530"},
            {
                "external_id": "u1",
                "name": "x",
                "time": "2026-11-01T00:00:00Z",
                "properties": {"$p": 1},
            },
        ],
        purchases=[
            {
                "external_id": "u1",
                "product_id": "p",
                "currency": "USD",
                "price": 0.1,
                "quantity": 3,
                "time": "2026-11-01T00:00:00Z",
            },
            {
                "external_id": "u1",
                "product_id": "p",
                "currency": "USD",
                "price": 0.2,
                "time": "2020-01-01T00:00:00Z",
            },
            {
                "external_id": "u1",
                "product_id": "q",
                "currency": "usd",
                "price": 1,
                "time": "2026-11-01T00:00:00Z",
            },
        ],
    )
    assert body["events_processed"] == 5
    assert body["purchases_processed"] == 2
    assert [e["type"] for e in body["errors"]] == [m.ERR_PROPERTY_NAME, m.ERR_CURRENCY]
    u = user(model, "u1")
    assert u["custom_events"] == [
        {
            "name": "app",
            "first": "2026-11-01T05:30:00.250Z",
            "last": "2026-11-01T05:30:00.250Z",
            "count": 1,
        },
        {
            "name": "open",
            "first": "2026-08-24T00:00:00.000Z",
            "last": "2026-11-21T08:00:00.123Z",
            "count": 2,
        },
    ]
    assert u["purchases"] == [
        {
            "name": "p",
            "first": "2026-11-01T00:00:00.000Z",
            "last": "2026-11-01T00:00:00.000Z",
            "count": 1,
        }
    ]
    assert u["total_revenue"] == 0.5


def test_export_ids(model: Model) -> None:
    alias = {"alias_name": "a1", "alias_label": "crm"}
    track(
        model,
        attributes=[
            {"external_id": "u1", "email": "ann@example.com", "first_name": "Ann"},
            {"user_alias": alias, "_update_existing_only": False, "email": "ann@example.com"},
            {"external_id": "u2", "push_tokens": [{"app_id": "a", "token": "t", "device_id": "d"}]},
        ],
    )
    status, body = export(
        model,
        external_ids=["u2", "zz", "u1"],
        user_aliases=[alias],
        email_address="ANN@example.com ",
        fields_to_export=["external_id"],
    )
    assert status == 200
    assert body == {
        "message": "success",
        "users": [{"external_id": "u2"}, {"external_id": "u1"}, {}],
        "invalid_user_ids": ["zz"],
    }
    _, body = export(model, device_id="d", phone=None, fields_to_export=["devices", "email"])
    assert body == {"message": "success", "users": [{"devices": [{"device_id": "d"}]}]}
    _, body = export(model, email_address="bad", fields_to_export=["email"])
    assert body == {"message": "success", "users": [], "invalid_user_ids": ["bad"]}
    # each unmatched identifier once, in request order
    _, body = export(
        model,
        external_ids=["x", "u1", "x"],
        user_aliases=[{"alias_name": "x", "alias_label": "crm"}],
        phone="+1 415",
        fields_to_export=[],
    )
    assert body == {"message": "success", "users": [{}], "invalid_user_ids": ["x", "+1 415"]}


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ([1], m.EXPORT_BODY_NOT_OBJECT),
        ("null", m.EXPORT_BODY_NOT_OBJECT),
        ("{bad", m.BAD_JSON),
        ({"external_ids": "u1"}, m.EXPORT_EXTERNAL_IDS),
        ({"external_ids": ["u1"], "user_aliases": [{"alias_name": "a"}]}, m.EXPORT_USER_ALIASES),
        ({"service_id": 5}, m.EXPORT_STRING_FIELD.format(field="service_id")),
        ({"external_ids": ["u"] * 51, "phone": 5}, m.EXPORT_STRING_FIELD.format(field="phone")),
        ({"external_ids": ["u"] * 51, "phone": "1", "email_address": "a"}, m.EXPORT_TOO_MANY),
        ({"phone": "1", "email_address": "a"}, m.EXPORT_ONE_OF),
        ({"external_ids": [], "fields_to_export": ["email"]}, m.EXPORT_NO_IDENTIFIER),
        ({"external_ids": ["u1"]}, m.EXPORT_FIELDS_REQUIRED),
        ({"external_ids": ["u1"], "fields_to_export": "email"}, m.EXPORT_FIELDS_SHAPE),
        (
            {"external_ids": ["u1"], "fields_to_export": ["email", "b", "a", "b"]},
            m.EXPORT_UNKNOWN_FIELDS.format(names="b, a"),
        ),
    ],
)
def test_export_validation(model: Model, body, message: str) -> None:
    assert model.call("POST", EXPORT_PATH, body) == (400, {"message": message})


def test_export_full_shape(model: Model) -> None:
    track(
        model,
        attributes=[
            {
                "external_id": "u1",
                "user_alias": None,
                "push_subscribe": "opted_in",
                "email_subscribe": "subscribed",
                "c": 1,
            }
        ],
    )
    u = model.export_users()[0]
    assert set(u) == {
        "created_at",
        "service_id",
        "random_bucket",
        "external_id",
        "push_subscribe",
        "push_opted_in_at",
        "email_subscribe",
        "custom_attributes",
    }
    assert u["created_at"] == "2026-11-22T00:00:00.000Z"
    assert set(u) <= set(m.EXPORT_FIELDS)


# --- the model never crashes on what the property tests generate -----------------------------
@pytest.mark.slow  # a property: 150 generated request sequences through the model
@settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(reqs=request_sequences)
def test_model_total_on_generated_requests(reqs: list[dict]) -> None:
    model = Model(lambda: CLOCK, "s")
    for r in reqs:
        status, body = model.call(r["method"], r["path"], r["body"])
        assert status in (200, 201, 202, 400, 404, 405)
        json.dumps(body)
        if status == 201:
            for e in body.get("errors", []):
                assert set(e) == {"type", "input_array", "index"}
    users = model.export_users()
    json.dumps(users)
    # live profiles in creation order; deleted ones leave gaps, service_ids are never reused
    created = [service_id_for("s", n) for n in range(model.created)]
    sids = [u["service_id"] for u in users]
    assert sids == [sid for sid in created if sid in sids]
    ids = [x for p in model.profiles for x in [p["external_id"], *p["deprecated"]] if x]
    assert len(ids) == len(set(ids))  # an external ID names one profile
    aliases = [a for p in model.profiles for a in p["aliases"]]
    assert len(aliases) == len(set(aliases))  # an alias names one profile
    for p in model.profiles:  # one alias per label
        labels = [label for _, label in p["aliases"]]
        assert len(labels) == len(set(labels))


# --- identity endpoints (docs/identity.md) ---------------------------------------------------
ALIAS = {"alias_name": "a1", "alias_label": "crm"}
T1 = "2026-11-20T00:00:00Z"
T2 = "2026-11-21T00:00:00Z"


def post(model: Model, path: str, **body) -> tuple[int, dict]:
    return model.call("POST", path, body)


def merge(model: Model, *pairs: tuple[dict, dict]) -> tuple[int, dict]:
    updates = [{"identifier_to_merge": a, "identifier_to_keep": b} for a, b in pairs]
    return post(model, MERGE_PATH, merge_updates=updates)


def ext(v: str) -> dict:
    return {"external_id": v}


def by_sid(model: Model, n: int) -> dict | None:
    sid = service_id_for("s", n)
    return next((u for u in model.export_users() if u["service_id"] == sid), None)


def test_merge_fills_only_missing_fields_and_moves_history(model: Model) -> None:
    t1 = {"app_id": "app1", "token": "t1", "device_id": "d1"}
    t2 = {"app_id": "app1", "token": "t2"}
    track(
        model,
        attributes=[
            {
                "external_id": "src",
                "first_name": "Src",
                "last_name": "Source",
                "email": "src@example.com",
                "phone": "+14155550100",
                "dob": "1990-01-01",
                "gender": "F",
                "time_zone": "Europe/Paris",
                "home_city": "Paris",
                "country": "fr",
                "language": "fr",
                "email_subscribe": "opted_in",
                "push_subscribe": "opted_in",
                "last_coordinates": [1, 2],
                "attributed_campaign": "spring",
                "nick": "s",
                "only_src": [1, 2],
                "push_tokens": [t1],
            },
            {"external_id": "dst", "first_name": "Dst", "nick": "d", "push_tokens": [t2]},
        ],
        events=[
            {"external_id": "src", "name": "open", "time": T1},
            {"external_id": "dst", "name": "open", "time": T2},
            {"external_id": "src", "name": "buy", "time": T2},
        ],
        purchases=[
            {"external_id": "src", "product_id": "p", "currency": "USD", "price": 2, "time": T2},
            {
                "external_id": "dst",
                "product_id": "p",
                "currency": "EUR",
                "price": 1.5,
                "quantity": 2,
                "time": T1,
            },
        ],
    )
    assert merge(model, (ext("src"), ext("dst"))) == (202, {"message": "success"})
    users = model.export_users()
    assert len(users) == 1
    u = users[0]
    assert u["service_id"] == service_id_for("s", 1)
    assert u["external_id"] == "dst"
    assert (u["first_name"], u["last_name"], u["email"], u["phone"]) == (
        "Dst",
        "Source",
        "src@example.com",
        "+14155550100",
    )
    assert (u["dob"], u["gender"], u["time_zone"], u["home_city"], u["country"]) == (
        "1990-01-01",
        "F",
        "Europe/Paris",
        "Paris",
        "FR",
    )
    assert u["language"] == "fr"
    for field in (
        "email_subscribe",
        "push_subscribe",
        "push_opted_in_at",
        "last_coordinates",
        "attributed_campaign",
    ):
        assert field not in u, field  # not merge fields: the target's (none) stay
    assert u["custom_attributes"] == {"nick": "d", "only_src": [1, 2]}
    assert u["custom_events"] == [
        {
            "name": "buy",
            "first": "2026-11-21T00:00:00.000Z",
            "last": "2026-11-21T00:00:00.000Z",
            "count": 1,
        },
        {
            "name": "open",
            "first": "2026-11-20T00:00:00.000Z",
            "last": "2026-11-21T00:00:00.000Z",
            "count": 2,
        },
    ]
    assert u["purchases"][0]["count"] == 2
    assert u["total_revenue"] == 5.0
    # tokens keep the order received: t1 (src) came before t2 (dst)
    assert u["push_tokens"] == [
        {"app": "app1", "token": "t1", "device_id": "d1", "notifications_enabled": True},
        {"app": "app1", "token": "t2", "notifications_enabled": True},
    ]
    # the merged profile is gone with its identifiers: its external ID creates anew
    _, body = track(model, attributes=[{"service_id": service_id_for("s", 0), "x": 1}])
    assert body["errors"][0]["type"] == m.ERR_UNKNOWN_SERVICE_ID
    track(model, attributes=[{"external_id": "src", "x": 1}])
    assert user(model, "src")["service_id"] == service_id_for("s", 2)


def test_merge_prioritization(model: Model) -> None:
    track(
        model,
        attributes=[
            {"email": "ann@example.com", "nick": "anon-old"},  # 0
            {"external_id": "u1", "email": "ann@example.com"},  # 1
            {"external_id": "u2", "email": "ann@example.com"},  # 2
            {"service_id": service_id_for("s", 0), "nick": "anon-new"},  # 0 touched last
            {"external_id": "k"},  # 3: the target
        ],
    )

    def merged_from(rules: list[str]) -> set[str]:
        trial = copy.deepcopy(model)
        merge(trial, ({"email": " ANN@example.com", "prioritization": rules}, ext("k")))
        left = {p["n"] for p in trial.profiles}
        return {str(n) for n in range(4) if n not in left}

    # most recently updated among identified: u2 (profile 2); the email-only profile 0 was
    # touched last overall, u1 (profile 1) is the least recently updated
    assert merged_from(["identified", "most_recently_updated"]) == {"2"}
    assert merged_from(["identified", "least_recently_updated"]) == {"1"}
    assert merged_from(["most_recently_updated"]) == {"0"}
    assert merged_from(["least_recently_updated"]) == {"1"}
    assert merged_from(["unidentified", "least_recently_updated"]) == {"0"}
    assert merged_from(["unidentified"]) == {"0"}  # a single unidentified candidate
    assert merged_from(["identified"]) == set()  # two identified: ambiguous, no merge
    assert merged_from(["most_recently_updated", "identified"]) == {"0"}
    # no candidate left after identified (none identified): all kept, then the rest decides
    merge(model, ({"email": "nobody@example.com", "prioritization": ["identified"]}, ext("k")))
    assert len(model.profiles) == 4


def test_least_recently_updated_uses_update_order(model: Model) -> None:
    track(model, attributes=[{"phone": "+14155550100", "external_id": "a"}])
    track(model, attributes=[{"phone": "+14155550100", "external_id": "b"}])
    track(model, attributes=[{"external_id": "a", "x": 1}])  # a is now the most recent
    track(model, attributes=[{"external_id": "k"}])
    merge(
        model,
        ({"phone": "+1 415 555 0100", "prioritization": ["least_recently_updated"]}, ext("k")),
    )
    assert [p["external_id"] for p in model.profiles] == ["a", "k"]


def test_merge_skips(model: Model) -> None:
    track(model, attributes=[{"external_id": "u1", "nick": "one"}])
    post(model, ALIAS_NEW_PATH, user_aliases=[{**ALIAS, "external_id": "u1"}])
    before = model.export_users()
    status, body = merge(
        model,
        (ext("u1"), {"user_alias": ALIAS}),  # same user
        (ext("u9"), ext("u1")),  # unresolvable merge side
        (ext("u1"), ext("u9")),  # unresolvable keep side
        ({"service_id": "f" * 24}, ext("u1")),
        ({"email": "a@b.co", "prioritization": ["identified"]}, ext("u1")),
    )
    assert (status, body) == (202, {"message": "success"})
    assert model.export_users() == before


def test_merge_chain_field_order(model: Model) -> None:
    track(
        model,
        attributes=[
            {"external_id": "a", "first_name": "A", "home_city": "Acity", "n": "a", "m": "a"},
            {"external_id": "b", "home_city": "Bcity", "n": "b"},
            {"external_id": "c", "last_name": "C"},
            {"external_id": "d", "first_name": "D", "dob": "2000-01-01"},
        ],
    )
    # a -> b, b -> c, then d -> c: c takes from itself, then b (with what it gathered from a),
    # then d; an already merged profile (a) is unresolvable
    merge(
        model,
        (ext("a"), ext("b")),
        (ext("b"), ext("c")),
        (ext("d"), ext("c")),
        (ext("a"), ext("c")),
    )
    [u] = model.export_users()
    assert u["external_id"] == "c"
    assert (u["first_name"], u["last_name"], u["home_city"], u["dob"]) == (
        "A",
        "C",
        "Bcity",
        "2000-01-01",
    )
    assert u["custom_attributes"] == {"n": "b", "m": "a"}


def test_merge_bumps_the_target(model: Model) -> None:
    track(
        model,
        attributes=[
            {"external_id": "u1", "email": "ann@example.com"},
            {"external_id": "u2", "email": "ann@example.com"},
            {"external_id": "src"},
        ],
    )
    merge(model, (ext("src"), ext("u1")))  # u1 is now the most recently updated
    track(model, attributes=[{"email": "ann@example.com", "hit": 1}])
    assert custom(model, "u1") == {"hit": 1}


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ([], m.BODY_NOT_OBJECT),
        ({}, m.LIST_NOT_ARRAY.format(field="merge_updates")),
        ({"merge_updates": {}}, m.LIST_NOT_ARRAY.format(field="merge_updates")),
        ({"merge_updates": []}, m.LIST_EMPTY.format(field="merge_updates")),
        ({"merge_updates": [{}] * 51}, m.LIST_TOO_MANY.format(field="merge_updates")),
        ({"merge_updates": [{}, 3]}, m.ITEM_NOT_OBJECT.format(field="merge_updates", index=1)),
        (
            {"merge_updates": [{"identifier_to_merge": {"external_id": "a"}}]},
            m.MERGE_SIDES.format(index=0),
        ),
        (
            {"merge_updates": [{"identifier_to_merge": ext("a"), "identifier_to_keep": {}}]},
            m.IDENTIFIER_ONE_OF.format(where="merge_updates[0].identifier_to_keep"),
        ),
        (
            {
                "merge_updates": [
                    {"identifier_to_merge": ext("a"), "identifier_to_keep": ext("b")},
                    {
                        "identifier_to_merge": {
                            "email": "a@b.co",
                            "phone": "+14155550100",
                            "prioritization": ["identified"],
                        },
                        "identifier_to_keep": ext("b"),
                    },
                ]
            },
            m.IDENTIFIER_ONE_OF.format(where="merge_updates[1].identifier_to_merge"),
        ),
        (
            {
                "merge_updates": [
                    {"identifier_to_merge": {"external_id": ""}, "identifier_to_keep": ext("b")}
                ]
            },
            m.IDENTIFIER_INVALID.format(
                where="merge_updates[0].identifier_to_merge", error=m.ERR_EXTERNAL_ID
            ),
        ),
        (
            {
                "merge_updates": [
                    {
                        "identifier_to_merge": ext("a"),
                        "identifier_to_keep": {"user_alias": {"alias_name": "x"}},
                    }
                ]
            },
            m.IDENTIFIER_INVALID.format(
                where="merge_updates[0].identifier_to_keep", error=m.ERR_USER_ALIAS
            ),
        ),
        (
            {
                "merge_updates": [
                    {
                        "identifier_to_merge": {"phone": "12", "prioritization": []},
                        "identifier_to_keep": ext("b"),
                    }
                ]
            },
            m.IDENTIFIER_INVALID.format(
                where="merge_updates[0].identifier_to_merge", error=m.ERR_PHONE
            ),
        ),
        (
            {
                "merge_updates": [
                    {"identifier_to_merge": {"email": "a@b.co"}, "identifier_to_keep": ext("b")}
                ]
            },
            m.PRIORITIZATION.format(where="merge_updates[0].identifier_to_merge"),
        ),
        (
            {
                "merge_updates": [
                    {
                        "identifier_to_merge": ext("a"),
                        "identifier_to_keep": {"email": "a@b.co", "prioritization": ["newest"]},
                    }
                ]
            },
            m.PRIORITIZATION.format(where="merge_updates[0].identifier_to_keep"),
        ),
        (
            {
                "merge_updates": [
                    {
                        "identifier_to_merge": {
                            "email": "a@b.co",
                            "prioritization": ["unidentified", "identified"],
                        },
                        "identifier_to_keep": ext("b"),
                    }
                ]
            },
            m.PRIORITIZATION_BOTH.format(where="merge_updates[0].identifier_to_merge"),
        ),
    ],
)
def test_merge_validation(model: Model, body, message: str) -> None:
    track(model, attributes=[ext("a"), ext("b")])
    assert model.call("POST", MERGE_PATH, body) == (400, {"message": message})
    assert len(model.profiles) == 2


def test_merge_ignores_prioritization_beside_a_strong_identifier(model: Model) -> None:
    track(model, attributes=[ext("a"), ext("b")])
    status, _ = merge(model, ({"external_id": "a", "prioritization": "junk"}, ext("b")))
    assert status == 202
    assert [p["external_id"] for p in model.profiles] == ["b"]


# --- identify --------------------------------------------------------------------------------
def test_identify_assigns_external_id_when_nobody_holds_it(model: Model) -> None:
    track(
        model,
        attributes=[
            {"user_alias": ALIAS, "_update_existing_only": False, "x": 1},
            {"email": "ann@example.com", "y": 2},
        ],
    )
    status, body = post(
        model,
        IDENTIFY_PATH,
        aliases_to_identify=[{"external_id": "u1", "user_alias": ALIAS}],
        emails_to_identify=[
            {"external_id": "u2", "email": "ANN@example.com", "prioritization": ["unidentified"]}
        ],
    )
    assert (status, body) == (200, {"aliases_processed": 2, "message": "success"})
    assert custom(model, "u1") == {"x": 1}
    assert user(model, "u1")["user_aliases"] == [ALIAS]
    assert custom(model, "u2") == {"y": 2}


def test_identify_into_existing_user_none_and_merge(model: Model) -> None:
    tok = {"app_id": "app1", "token": "t1"}
    anon = {
        "user_alias": ALIAS,
        "_update_existing_only": False,
        "first_name": "Anon",
        "email": "anon@example.com",
        "phone": "+14155550100",
        "x": 1,
        "push_tokens": [tok],
    }
    other = {"alias_name": "o", "alias_label": "other"}
    for behavior, expect in [
        ("none", {"custom_attributes": {"y": 2}}),
        (
            "merge",
            {
                "custom_attributes": {"x": 1, "y": 2},
                "first_name": "Anon",
                "phone": "+14155550100",
                "custom_events": 1,
            },
        ),
    ]:
        model = Model(lambda: CLOCK, "s")
        track(
            model,
            attributes=[{"external_id": "u1", "y": 2}, anon],
            events=[{"user_alias": ALIAS, "name": "e", "time": T1}],
        )
        post(model, ALIAS_NEW_PATH, user_aliases=[{**other}])  # another alias-only profile
        # and a second alias on the anonymous profile goes with it
        model.profiles[1]["aliases"].append(("second", "web"))
        status, body = post(
            model,
            IDENTIFY_PATH,
            merge_behavior=behavior,
            aliases_to_identify=[{"external_id": "u1", "user_alias": ALIAS}],
        )
        assert (status, body) == (200, {"aliases_processed": 1, "message": "success"})
        users = model.export_users()
        assert len(users) == 2, behavior
        u = users[0]
        assert u["user_aliases"] == [ALIAS]
        assert u["push_tokens"] == [{"app": "app1", "token": "t1", "notifications_enabled": True}]
        assert "email" not in u  # never copied by identify
        assert u["custom_attributes"] == expect["custom_attributes"]
        assert u.get("first_name") == expect.get("first_name")
        assert u.get("phone") == expect.get("phone")
        assert len(u.get("custom_events", [])) == expect.get("custom_events", 0)
        assert users[1]["user_aliases"] == [other]


def test_identify_skips(model: Model) -> None:
    crm2 = {"alias_name": "a2", "alias_label": "crm"}
    track(
        model,
        attributes=[
            {"external_id": "u1"},
            {"user_alias": ALIAS, "_update_existing_only": False},
            {"user_alias": crm2, "_update_existing_only": False},
            {"email": "ann@example.com", "external_id": "u2"},
            {"email": "bob@example.com"},
            {"phone": "+14155550100", "external_id": "u3"},
            {"phone": "+14155550100"},
        ],
    )
    post(model, IDENTIFY_PATH, aliases_to_identify=[{"external_id": "u1", "user_alias": ALIAS}])
    before = model.export_users()
    status, body = post(
        model,
        IDENTIFY_PATH,
        aliases_to_identify=[
            {"external_id": "u1", "user_alias": crm2},  # u1 already has a crm alias
            {"external_id": "u2", "user_alias": ALIAS},  # alias on an identified user
            {"external_id": "u2", "user_alias": {"alias_name": "zz", "alias_label": "x"}},
        ],
        emails_to_identify=[
            {"external_id": "u4", "email": "ann@example.com", "prioritization": ["identified"]},
            {"external_id": "u4", "email": "cy@example.com", "prioritization": ["identified"]},
        ],
        phone_numbers_to_identify=[  # two candidates left: ambiguous
            {
                "external_id": "u4",
                "phone": "+14155550100",
                "prioritization": ["least_recently_updated", "identified"],
            },
        ],
    )
    assert (status, body) == (200, {"aliases_processed": 6, "message": "success"})
    assert model.export_users() == before


def test_identify_order_aliases_emails_phones(model: Model) -> None:
    # the phone element (last) finds the profile the alias element (first) already identified
    track(
        model,
        attributes=[{"user_alias": ALIAS, "_update_existing_only": False, "phone": "+14155550100"}],
    )
    post(
        model,
        IDENTIFY_PATH,
        phone_numbers_to_identify=[
            {
                "external_id": "p",
                "phone": "+14155550100",
                "prioritization": ["most_recently_updated"],
            }
        ],
        aliases_to_identify=[{"external_id": "a", "user_alias": ALIAS}],
    )
    assert [p["external_id"] for p in model.profiles] == ["a"]


def test_identify_with_a_deprecated_external_id(model: Model) -> None:
    track(model, attributes=[ext("old"), {"user_alias": ALIAS, "_update_existing_only": False}])
    post(
        model,
        RENAME_PATH,
        external_id_renames=[{"current_external_id": "old", "new_external_id": "new"}],
    )
    post(model, IDENTIFY_PATH, aliases_to_identify=[{"external_id": "old", "user_alias": ALIAS}])
    [u] = model.export_users()
    assert (u["external_id"], u["user_aliases"]) == ("new", [ALIAS])


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ("[1]", m.BODY_NOT_OBJECT),
        ({"merge_behavior": "merge"}, m.IDENTIFY_NO_ARRAYS),
        ({"aliases_to_identify": {}}, m.LIST_NOT_ARRAY.format(field="aliases_to_identify")),
        (
            {
                "aliases_to_identify": [{"external_id": "u", "user_alias": ALIAS}],
                "emails_to_identify": [1],
            },
            m.ITEM_NOT_OBJECT.format(field="emails_to_identify", index=0),
        ),
        (
            {
                "aliases_to_identify": [{"external_id": "u", "user_alias": ALIAS}] * 30,
                "phone_numbers_to_identify": [
                    {"external_id": "u", "phone": "+14155550100", "prioritization": ["identified"]}
                ]
                * 21,
            },
            m.IDENTIFY_TOO_MANY,
        ),
        (
            {
                "aliases_to_identify": [{"external_id": "u", "user_alias": ALIAS}],
                "merge_behavior": "all",
            },
            m.IDENTIFY_MERGE_BEHAVIOR,
        ),
        (
            {
                "aliases_to_identify": [
                    {"external_id": "u", "user_alias": ALIAS},
                    {"user_alias": ALIAS},
                ]
            },
            m.IDENTIFY_EXTERNAL_ID.format(where="aliases_to_identify[1]"),
        ),
        (
            {
                "emails_to_identify": [
                    {"external_id": " Guest ", "email": "a@b.co", "prioritization": ["identified"]}
                ]
            },
            m.IDENTIFY_BLOCKED.format(where="emails_to_identify[0]"),
        ),
    ],
)
def test_identify_validation(model: Model, body, message: str) -> None:
    assert model.call("POST", IDENTIFY_PATH, body) == (400, {"message": message})


# --- rename and remove -----------------------------------------------------------------------
def test_rename_and_its_errors(model: Model) -> None:
    track(model, attributes=[ext("u1"), ext("u2")])
    status, body = post(
        model,
        RENAME_PATH,
        external_id_renames=[
            "u1",
            {"current_external_id": "u1"},
            {"current_external_id": "u1", "new_external_id": "u1"},
            {"current_external_id": "u1", "new_external_id": " NULL "},
            {"current_external_id": "u9", "new_external_id": "u5"},
            {"current_external_id": "u1", "new_external_id": "u2"},
            {"current_external_id": "u1", "new_external_id": "u5"},
            {"current_external_id": "u5", "new_external_id": "u1"},  # rename back: u1 deprecated
            {"current_external_id": "u1", "new_external_id": "u6"},  # u1 is deprecated
            {"current_external_id": "u2", "new_external_id": "u1"},  # used as deprecated
        ],
    )
    assert status == 200
    assert body == {
        "message": "success",
        "external_ids": ["u1"],
        "rename_errors": [
            [m.RENAME_SHAPE, 0],
            [m.RENAME_SHAPE, 1],
            [m.RENAME_SAME, 2],
            [m.RENAME_BLOCKED, 3],
            [m.RENAME_UNKNOWN, 4],
            [m.RENAME_IN_USE, 5],
            [m.RENAME_IN_USE, 7],
            [m.RENAME_DEPRECATED, 8],
            [m.RENAME_IN_USE, 9],
        ],
    }
    # the old ID resolves in track and export, to the renamed user
    track(model, attributes=[{"external_id": "u1", "via_old": True}])
    assert custom(model, "u5") == {"via_old": True}
    _, body = export(model, external_ids=["u1", "u5"], fields_to_export=["external_id"])
    assert body == {"message": "success", "users": [{"external_id": "u5"}]}
    # removed: u1 is free again
    status, body = post(model, REMOVE_PATH, external_ids=["u5", "u1", "u1", 3, ""])
    assert (status, body) == (
        200,
        {
            "message": "success",
            "removed_ids": ["u1"],
            "removal_errors": [
                [m.REMOVE_PRIMARY, 0],
                [m.REMOVE_UNKNOWN, 2],
                [m.REMOVE_SHAPE, 3],
                [m.REMOVE_SHAPE, 4],
            ],
        },
    )
    track(model, attributes=[{"external_id": "u1", "fresh": True}])
    assert custom(model, "u1") == {"fresh": True}
    assert len(model.export_users()) == 3


def test_rename_bumps_recency(model: Model) -> None:
    track(
        model,
        attributes=[
            {"external_id": "u1", "email": "a@b.co"},
            {"external_id": "u2", "email": "a@b.co"},
        ],
    )
    post(
        model,
        RENAME_PATH,
        external_id_renames=[{"current_external_id": "u1", "new_external_id": "u3"}],
    )
    track(model, attributes=[{"email": "a@b.co", "hit": 1}])
    assert custom(model, "u3") == {"hit": 1}


@pytest.mark.parametrize(
    ("path", "body", "message"),
    [
        (RENAME_PATH, [], m.BODY_NOT_OBJECT),
        (RENAME_PATH, {}, m.LIST_NOT_ARRAY.format(field="external_id_renames")),
        (
            RENAME_PATH,
            {"external_id_renames": []},
            m.LIST_EMPTY.format(field="external_id_renames"),
        ),
        (
            RENAME_PATH,
            {"external_id_renames": [{}] * 51},
            m.LIST_TOO_MANY.format(field="external_id_renames"),
        ),
        (REMOVE_PATH, {"external_ids": "u1"}, m.IDS_NOT_STRINGS),
        (REMOVE_PATH, {}, m.IDS_NOT_STRINGS),
        (REMOVE_PATH, {"external_ids": []}, m.LIST_EMPTY.format(field="external_ids")),
        (REMOVE_PATH, {"external_ids": ["x"] * 51}, m.LIST_TOO_MANY.format(field="external_ids")),
    ],
)
def test_rename_remove_validation(model: Model, path: str, body, message: str) -> None:
    assert model.call("POST", path, body) == (400, {"message": message})


# --- aliases ---------------------------------------------------------------------------------
def test_alias_new_and_update(model: Model) -> None:
    track(model, attributes=[ext("u1")])
    post(
        model,
        RENAME_PATH,
        external_id_renames=[{"current_external_id": "u1", "new_external_id": "v1"}],
    )
    web = {"alias_name": "w", "alias_label": "web"}
    status, body = post(
        model,
        ALIAS_NEW_PATH,
        user_aliases=[
            {**ALIAS, "external_id": "u1"},  # deprecated ID resolves
            {"alias_name": "a2", "alias_label": "crm", "external_id": "v1"},  # label taken
            {**ALIAS},  # exists
            {**web, "external_id": "nobody"},  # no such user
            {**web},  # alias-only profile
        ],
    )
    assert (status, body) == (200, {"aliases_processed": 5, "message": "success"})
    users = model.export_users()
    assert [u.get("user_aliases") for u in users] == [[ALIAS], [web]]
    assert "external_id" not in users[1]
    assert post(
        model,
        ALIAS_UPDATE_PATH,
        alias_updates=[
            {"alias_label": "crm", "old_alias_name": "a1", "new_alias_name": "a1"},  # exists
            {"alias_label": "web", "old_alias_name": "x", "new_alias_name": "y"},  # unknown
            {"alias_label": "crm", "old_alias_name": "a1", "new_alias_name": "b1"},
            {"alias_label": "web", "old_alias_name": "w", "new_alias_name": "b1"},
        ],
    ) == (200, {"message": "success"})
    users = model.export_users()
    assert [u["user_aliases"] for u in users] == [
        [{"alias_name": "b1", "alias_label": "crm"}],
        [{"alias_name": "b1", "alias_label": "web"}],
    ]
    track(model, attributes=[{"user_alias": {"alias_name": "a1", "alias_label": "crm"}, "z": 1}])
    assert "custom_attributes" not in model.export_users()[0]


@pytest.mark.parametrize(
    ("path", "body", "message"),
    [
        (ALIAS_NEW_PATH, {"user_aliases": []}, m.LIST_EMPTY.format(field="user_aliases")),
        (
            ALIAS_NEW_PATH,
            {"user_aliases": [ALIAS, {"alias_name": "a"}]},
            m.ALIAS_SHAPE.format(where="user_aliases[1]"),
        ),
        (
            ALIAS_NEW_PATH,
            {"user_aliases": [{**ALIAS, "external_id": ""}]},
            m.ALIAS_EXTERNAL_ID.format(where="user_aliases[0]"),
        ),
        (ALIAS_UPDATE_PATH, {"alias_updates": "x"}, m.LIST_NOT_ARRAY.format(field="alias_updates")),
        (
            ALIAS_UPDATE_PATH,
            {
                "alias_updates": [
                    {"alias_label": "crm", "old_alias_name": "a", "new_alias_name": ""}
                ]
            },
            m.ALIAS_UPDATE_SHAPE.format(where="alias_updates[0]"),
        ),
    ],
)
def test_alias_validation_applies_nothing(model: Model, path: str, body, message: str) -> None:
    assert model.call("POST", path, body) == (400, {"message": message})
    assert model.export_users() == []


# --- delete ----------------------------------------------------------------------------------
def test_delete_then_track_creates_anew(model: Model) -> None:
    tok = {"app_id": "app1", "token": "t1", "device_id": "d1"}
    track(
        model,
        attributes=[
            {"external_id": "u1", "email": "ann@example.com", "push_tokens": [tok], "x": 1},
            {"user_alias": ALIAS, "_update_existing_only": False},
            ext("u2"),
        ],
        events=[{"external_id": "u1", "name": "e", "time": T1}],
    )
    post(
        model,
        RENAME_PATH,
        external_id_renames=[{"current_external_id": "u2", "new_external_id": "v2"}],
    )
    status, body = post(
        model,
        DELETE_PATH,
        external_ids=["u1", "u2", "nobody"],  # u2 is deprecated: resolves
        user_aliases=[ALIAS],
        service_ids=[service_id_for("s", 0), service_id_for("s", 1)],  # already deleted
    )
    assert (status, body) == (200, {"deleted": 3, "message": "success"})
    assert model.export_users() == []
    _, body = export(model, device_id="d1", fields_to_export=["external_id"])
    assert body["users"] == []
    track(model, attributes=[{"external_id": "u1"}, {"email": "ann@example.com"}])
    users = model.export_users()
    assert [u["service_id"] for u in users] == [service_id_for("s", 3), service_id_for("s", 4)]
    assert set(users[0]) == {"created_at", "service_id", "random_bucket", "external_id"}
    # the deleted user's deprecated ID was freed too
    assert post(
        model,
        RENAME_PATH,
        external_id_renames=[{"current_external_id": "u1", "new_external_id": "u2"}],
    )[1]["external_ids"] == ["u1"]


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({}, m.DELETE_NO_IDS),
        ({"external_ids": ["u1", ""]}, m.DELETE_STRINGS.format(field="external_ids")),
        ({"service_ids": "s"}, m.DELETE_STRINGS.format(field="service_ids")),
        ({"user_aliases": [{"alias_name": "a1"}]}, m.DELETE_ALIASES),
        ({"external_ids": ["u1"] * 50, "user_aliases": [ALIAS]}, m.DELETE_TOO_MANY),
    ],
)
def test_delete_validation(model: Model, body, message: str) -> None:
    track(model, attributes=[ext("u1")])
    assert model.call("POST", DELETE_PATH, body) == (400, {"message": message})
    assert len(model.export_users()) == 1


def test_identity_endpoints_are_post_only(model: Model) -> None:
    for path in IDENTITY_PATHS:
        status, body = model.call("GET", path)
        assert (status, body) == (
            405,
            {"message": m.METHOD_NOT_ALLOWED.format(method="GET", path=path, allowed="POST")},
        )
