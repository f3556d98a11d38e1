"""Direct checks of the reference model (tests/model.py) against the documented rules."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest
from hypothesis import HealthCheck, given, settings
from tests.model import EXPORT_PATH, TRACK_PATH, Model, random_bucket_for, service_id_for
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
    assert user(model, "u3")["push_tokens"] == [{"app": "app1", "token": "t1"}]
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
        {"app": "app1", "token": "t2", "device_id": "d2"},
        {"app": "app1", "token": "t1"},
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
    assert users[1]["push_tokens"] == [{"app": "app1", "token": "t2", "device_id": "d2"}]
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
@settings(
    max_examples=300,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(reqs=request_sequences)
def test_model_total_on_generated_requests(reqs: list[dict]) -> None:
    model = Model(lambda: CLOCK, "s")
    for r in reqs:
        status, body = model.call(r["method"], r["path"], r["body"])
        assert status in (200, 201, 400, 404, 405)
        json.dumps(body)
        if status == 201:
            for e in body.get("errors", []):
                assert set(e) == {"type", "input_array", "index"}
    users = model.export_users()
    json.dumps(users)
    assert [u["service_id"] for u in users] == [service_id_for("s", n) for n in range(len(users))]
