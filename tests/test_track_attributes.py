"""/users/track attributes: custom attribute operations, limits and profile fields."""

from __future__ import annotations

from typing import Any

import pytest
from tests.helpers import (
    NOW,
    TRACK,
    Clock,
    custom_attributes,
    err,
    errors,
    exists,
    export_one,
    field,
    only_error,
    open_ws,
    track,
    track_ok,
    ts,
)

from engagelake.rules.messages import (
    ERR_ADD_REMOVE_VALUE,
    ERR_ARRAY_OP_NOT_ARRAY,
    ERR_ATTRIBUTE_DEPTH,
    ERR_ATTRIBUTE_NAME,
    ERR_ATTRIBUTE_STRING,
    ERR_COORDINATES,
    ERR_COUNTRY,
    ERR_DOB,
    ERR_FIELD_STRING,
    ERR_GENDER,
    ERR_INC_NOT_NUMERIC,
    ERR_INC_VALUE,
    ERR_LANGUAGE,
    ERR_SUBSCRIBE,
    ERR_TIME_ZONE,
    STRING_FIELDS,
)


def put(ws, **values: Any) -> None:
    """Set attributes on user u1, asserting success."""
    track_ok(ws, attributes=[{"external_id": "u1", **values}])


def attempt(ws, **values: Any):
    return track(ws, attributes=[{"external_id": "u1", **values}])


# A parametrized case of its own per value would cost a store and a commit each: the cases below
# go as the objects of one request, each for a user of its own ("e0", "e1", ...), and each
# object is checked on its own (errors name the object's index).


def put_each(ws, objects: list[dict[str, Any]]) -> list[str]:
    """Track one object per new user, in one request, asserting success; returns the users."""
    users = [f"e{i}" for i in range(len(objects))]
    track_ok(ws, attributes=[{"external_id": user, **o} for user, o in zip(users, objects, strict=True)])
    return users


def refuse_each(ws, objects: list[dict[str, Any]], messages: str | list[str]) -> list[str]:
    """Track one object per user ("e0", ...) in one request; assert that each object, and only it,
    is refused with its message. Returns the users."""
    users = [f"e{i}" for i in range(len(objects))]
    if isinstance(messages, str):
        messages = [messages] * len(objects)
    r = track(ws, attributes=[{"external_id": user, **o} for user, o in zip(users, objects, strict=True)])
    assert errors(r) == [err(m, "attributes", i) for i, m in enumerate(messages)], r.body
    assert r.body["attributes_processed"] == 0
    return users


def assert_none_exists(ws, users: list[str]) -> None:
    assert [user for user in users if exists(ws, user)] == []


# --- set and remove -------------------------------------------------------------------------------


ANY_VALUES = ["gold", "", 3, -2, 2.5, 0, True, False, {"a": 1, "b": [1, "x"]}, [1, "two", 3.0, None, True]]


def test_set_any_value(ws):
    users = put_each(ws, [{"v": value} for value in ANY_VALUES])
    for user, value in zip(users, ANY_VALUES, strict=True):
        stored = custom_attributes(ws, user)
        assert stored == {"v": value}, value
        assert type(stored["v"]) is type(value), value


def test_set_overwrites(ws):
    put(ws, v="a", w=1)
    put(ws, v=["b"])
    assert custom_attributes(ws, "u1") == {"v": ["b"], "w": 1}


def test_null_removes_the_attribute(ws):
    put(ws, a=1, b="x", c=[1])
    put(ws, a=None)
    assert custom_attributes(ws, "u1") == {"b": "x", "c": [1]}
    put(ws, b=None, c=None, never_set=None)
    assert "custom_attributes" not in export_one(ws, "u1", ["external_id", "custom_attributes"])


def test_reserved_names_are_not_custom_attributes(ws):
    put(ws, first_name="Ann", email_subscribe="subscribed", home_city="Oslo", tier="gold")
    assert custom_attributes(ws, "u1") == {"tier": "gold"}
    assert field(ws, "u1", "first_name") == "Ann"


# --- inc ------------------------------------------------------------------------------------------


def test_inc_on_missing_attribute_starts_from_zero(ws):
    put(ws, n={"inc": 3})
    assert custom_attributes(ws, "u1") == {"n": 3}
    put(ws, n={"inc": -5})
    assert custom_attributes(ws, "u1") == {"n": -2}


def test_inc_keeps_integers_integers_and_floats_floats(ws):
    put(ws, i=4, f=1.5)
    put(ws, i={"inc": 2}, f={"inc": 2})
    attrs = custom_attributes(ws, "u1")
    assert attrs == {"i": 6, "f": 3.5}
    assert type(attrs["i"]) is int
    assert type(attrs["f"]) is float


def test_inc_twice_in_one_request_adds_both(ws):
    put(ws, n=10)
    track_ok(
        ws,
        attributes=[{"external_id": "u1", "n": {"inc": 1}}, {"external_id": "u1", "n": {"inc": 1}}],
    )
    assert custom_attributes(ws, "u1") == {"n": 12}


def test_inc_twice_on_a_new_user_in_one_request(ws):
    track_ok(
        ws,
        attributes=[{"external_id": "new", "n": {"inc": 2}}, {"external_id": "new", "n": {"inc": 3}}],
    )
    assert custom_attributes(ws, "new") == {"n": 5}


def test_inc_across_requests_of_one_batch(ws):
    body = {"attributes": [{"external_id": "u1", "n": {"inc": 1}}]}
    rs = ws.apply([{"method": "POST", "path": TRACK, "body": body}] * 3)
    assert [r.status for r in rs] == [201, 201, 201]
    assert custom_attributes(ws, "u1") == {"n": 3}


NON_NUMERIC = ["7", "x", [1], {"a": 1}]


def test_inc_on_non_numeric_is_an_error_and_skips_the_whole_object(ws):
    users = put_each(ws, [{"s": base, "first_name": "Before"} for base in NON_NUMERIC])
    refuse_each(ws, [{"keep": "new", "first_name": "After", "s": {"inc": 1}, "later": {"inc": 1}}] * len(users),
                ERR_INC_NOT_NUMERIC)
    for user, base in zip(users, NON_NUMERIC, strict=True):
        assert custom_attributes(ws, user) == {"s": base}
        assert field(ws, user, "first_name") == "Before"


NOT_INTEGERS = [1.5, "1", None, [1], {"n": 1}, True, 1e3]


def test_inc_value_must_be_an_integer(ws):
    users = put_each(ws, [{"n": 1}] * len(NOT_INTEGERS))
    refuse_each(ws, [{"other": "x", "n": {"inc": value}} for value in NOT_INTEGERS], ERR_INC_VALUE)
    assert [custom_attributes(ws, user) for user in users] == [{"n": 1}] * len(users)


def test_object_with_inc_and_other_keys_is_a_plain_value(ws):
    put(ws, n=1)
    put(ws, n={"inc": 1, "note": "x"})
    assert custom_attributes(ws, "u1") == {"n": {"inc": 1, "note": "x"}}


# --- plain arrays ---------------------------------------------------------------------------------


def test_plain_array_replaces(ws):
    put(ws, tags=["a", "b"])
    put(ws, tags=["c"])
    assert custom_attributes(ws, "u1") == {"tags": ["c"]}


def test_plain_array_repeats_keep_their_last_place(ws):
    put(ws, tags=["a", "b", "a", "c", "b"])
    assert custom_attributes(ws, "u1") == {"tags": ["a", "c", "b"]}


def test_plain_array_of_501_keeps_the_newest_500(ws):
    put(ws, nums=list(range(501)))
    assert custom_attributes(ws, "u1") == {"nums": list(range(1, 501))}


def test_array_of_objects(ws):
    stays = [
        {"hotel": "Alpha", "nights": 2, "city": "Oslo"},
        {"hotel": "Beta", "nights": 1, "city": "Rome"},
    ]
    put(ws, stays=stays)
    assert custom_attributes(ws, "u1") == {"stays": stays}
    put(ws, stays={"add": [{"nights": 2, "city": "Oslo", "hotel": "Alpha"}]})
    assert custom_attributes(ws, "u1") == {"stays": [stays[1], stays[0]]}
    put(ws, stays={"remove": [{"city": "Rome", "hotel": "Beta", "nights": 1}]})
    assert custom_attributes(ws, "u1") == {"stays": [stays[0]]}


# --- add / remove -----------------------------------------------------------------------------------


def test_add_to_missing_attribute_starts_from_empty(ws):
    put(ws, tags={"add": ["a", "b"]})
    assert custom_attributes(ws, "u1") == {"tags": ["a", "b"]}


def test_add_appends_and_moves_present_values_to_the_end(ws):
    put(ws, tags=["a", "b", "c"])
    put(ws, tags={"add": ["a", "d"]})
    assert custom_attributes(ws, "u1") == {"tags": ["b", "c", "a", "d"]}


def test_add_with_repeats_adds_each_value_once(ws):
    put(ws, tags=["a"])
    put(ws, tags={"add": ["x", "y", "x"]})
    assert custom_attributes(ws, "u1") == {"tags": ["a", "y", "x"]}


def test_remove_deletes_every_equal_value(ws):
    put(ws, tags=["a", "b", "c"])
    put(ws, tags={"remove": ["b", "zzz"]})
    assert custom_attributes(ws, "u1") == {"tags": ["a", "c"]}


def test_array_equality_is_by_canonical_json(ws):
    put(ws, vals=[1])
    put(ws, vals={"add": [1.0, True, "1"]})
    vals = custom_attributes(ws, "u1")["vals"]
    assert [type(v) for v in vals] == [int, float, bool, str]
    put(ws, vals={"remove": [1.0]})
    assert [type(v) for v in custom_attributes(ws, "u1")["vals"]] == [int, bool, str]


def test_add_and_remove_in_one_object_apply_add_first(ws):
    put(ws, tags=["a", "b"])
    put(ws, tags={"add": ["c", "x"], "remove": ["a", "x"]})
    assert custom_attributes(ws, "u1") == {"tags": ["b", "c"]}
    put(ws, tags={"remove": ["b"], "add": ["b"]})
    assert custom_attributes(ws, "u1") == {"tags": ["c"]}


def test_add_beyond_500_drops_the_oldest(ws):
    put(ws, nums=list(range(500)))
    put(ws, nums={"add": [1000, 1001, 1002]})
    assert custom_attributes(ws, "u1")["nums"] == [*range(3, 500), 1000, 1001, 1002]


def test_add_of_a_present_value_at_the_cap_drops_nothing(ws):
    put(ws, nums=list(range(500)))
    put(ws, nums={"add": [0]})
    assert custom_attributes(ws, "u1")["nums"] == [*range(1, 500), 0]


def test_cap_applies_after_remove(ws):
    put(ws, nums=list(range(499)))
    put(ws, nums={"add": [1000, 1001], "remove": [1001]})
    assert custom_attributes(ws, "u1")["nums"] == [*range(499), 1000]


NON_ARRAY_CASES = [(op, base) for op in ({"add": ["x"]}, {"remove": ["x"]}, {"add": [], "remove": []})
                   for base in ("x", 5, {"k": "x"})]


def test_add_remove_on_non_array_is_an_error_and_skips_the_object(ws):
    users = put_each(ws, [{"tags": base} for _, base in NON_ARRAY_CASES])
    refuse_each(ws, [{"other": 1, "tags": op} for op, _ in NON_ARRAY_CASES], ERR_ARRAY_OP_NOT_ARRAY)
    for user, (_, base) in zip(users, NON_ARRAY_CASES, strict=True):
        assert custom_attributes(ws, user) == {"tags": base}


NOT_ARRAY_OPS = [{"add": "x"}, {"remove": 5}, {"add": ["x"], "remove": {"a": 1}}, {"add": None}]


def test_add_remove_values_must_be_arrays(ws):
    users = put_each(ws, [{"tags": ["a"]}] * len(NOT_ARRAY_OPS))
    refuse_each(ws, [{"other": 1, "tags": op} for op in NOT_ARRAY_OPS], ERR_ADD_REMOVE_VALUE)
    assert [custom_attributes(ws, user) for user in users] == [{"tags": ["a"]}] * len(users)


def test_object_with_add_and_other_keys_is_a_plain_value(ws):
    put(ws, tags=["a"])
    put(ws, tags={"add": ["b"], "note": 1})
    assert custom_attributes(ws, "u1") == {"tags": {"add": ["b"], "note": 1}}


# --- nesting and limits -------------------------------------------------------------------------------


def nest(levels: int) -> dict[str, Any]:
    value: Any = "leaf"
    for _ in range(levels):
        value = {"k": value}
    return value


def test_nested_objects_up_to_50_levels(ws):
    put(ws, deep=nest(50), wide={"a": {"b": [1, {"c": "x" * 300}]}})
    assert custom_attributes(ws, "u1") == {"deep": nest(50), "wide": {"a": {"b": [1, {"c": "x" * 300}]}}}


def test_nesting_beyond_50_levels_is_an_error(ws):
    r = attempt(ws, ok=1, deep=nest(51))
    only_error(r, ERR_ATTRIBUTE_DEPTH)
    assert not exists(ws, "u1")


def test_arrays_do_not_count_as_nesting_levels(ws):
    value = [[nest(50)]]
    put(ws, deep=value)
    assert custom_attributes(ws, "u1") == {"deep": value}


def test_invalid_attribute_names(ws):
    assert_none_exists(ws, refuse_each(ws, [{"ok": 1, name: 1} for name in ("$price", "$", "")], ERR_ATTRIBUTE_NAME))


def test_attribute_name_length(ws):
    put(ws, **{"n" * 255: 1, "dollar$inside": 2})
    assert custom_attributes(ws, "u1") == {"n" * 255: 1, "dollar$inside": 2}
    r = attempt(ws, **{"m" * 256: 1})
    only_error(r, ERR_ATTRIBUTE_NAME)
    assert "m" * 256 not in custom_attributes(ws, "u1")


def test_string_value_length(ws):
    put(ws, s="x" * 255)
    assert custom_attributes(ws, "u1") == {"s": "x" * 255}
    r = attempt(ws, s="y" * 256, other=1)
    only_error(r, ERR_ATTRIBUTE_STRING)
    assert custom_attributes(ws, "u1") == {"s": "x" * 255}


def test_strings_inside_arrays_are_not_length_checked(ws):
    put(ws, arr=["z" * 1000])
    assert custom_attributes(ws, "u1") == {"arr": ["z" * 1000]}


def test_custom_attributes_are_checked_in_key_order(ws):
    only_error(attempt(ws, **{"$x": "y" * 300, "s": "y" * 300}), ERR_ATTRIBUTE_NAME)
    only_error(attempt(ws, **{"s": "y" * 300, "$x": 1}), ERR_ATTRIBUTE_STRING)
    only_error(attempt(ws, **{"d": nest(51), "$x": 1}), ERR_ATTRIBUTE_DEPTH)


def test_static_checks_come_before_state_checks(ws):
    put(ws, s="text")
    only_error(attempt(ws, s={"inc": 1}, **{"$x": 1}), ERR_ATTRIBUTE_NAME)
    only_error(attempt(ws, s={"inc": 1}, t={"inc": "1"}), ERR_INC_VALUE)


def test_profile_field_errors_come_before_custom_attribute_errors(ws):
    only_error(attempt(ws, **{"$x": 1}, dob="bad"), ERR_DOB)


# --- several objects for one user, in order ------------------------------------------------------


def test_several_objects_apply_in_order(ws):
    r = track(
        ws,
        attributes=[
            {"external_id": "u1", "a": 1, "tags": ["x"]},
            {"external_id": "u2", "a": 100},
            {"external_id": "u1", "a": 2, "tags": {"add": ["y"]}},
            {"external_id": "u1", "a": "$bad", "$bad": 1},
            {"external_id": "u1", "a": {"inc": 5}, "tags": {"remove": ["x"]}},
            {"external_id": "u1", "tags": {"add": ["x"]}},
        ],
    )
    assert errors(r) == [err(ERR_ATTRIBUTE_NAME, "attributes", 3)]
    assert r.body["attributes_processed"] == 5
    assert custom_attributes(ws, "u1") == {"a": 7, "tags": ["y", "x"]}
    assert custom_attributes(ws, "u2") == {"a": 100}


def test_set_then_remove_then_inc_in_one_request(ws):
    track_ok(
        ws,
        attributes=[
            {"external_id": "u1", "n": "text"},
            {"external_id": "u1", "n": None},
            {"external_id": "u1", "n": {"inc": 4}},
        ],
    )
    assert custom_attributes(ws, "u1") == {"n": 4}


def test_state_error_uses_the_state_left_by_earlier_objects(ws):
    r = track(
        ws,
        attributes=[
            {"external_id": "u1", "n": "text"},
            {"external_id": "u1", "n": {"inc": 1}},
            {"external_id": "u1", "n": 3},
            {"external_id": "u1", "n": {"inc": 1}},
        ],
    )
    assert errors(r) == [err(ERR_INC_NOT_NUMERIC, "attributes", 1)]
    assert custom_attributes(ws, "u1") == {"n": 4}


# --- profile fields -----------------------------------------------------------------------------------


def test_string_profile_fields(ws):
    users = put_each(ws, [{name: "v" * 255} for name in STRING_FIELDS])
    assert [field(ws, user, name) for user, name in zip(users, STRING_FIELDS, strict=True)] == ["v" * 255] * len(users)
    bad_values = ("w" * 256, 5, ["x"], {"a": "b"}, True)
    r = track(ws, attributes=[{"external_id": user, name: bad} for user, name in zip(users, STRING_FIELDS, strict=True)
                              for bad in bad_values])
    assert errors(r) == [err(ERR_FIELD_STRING.format(field=name), "attributes", i)
                         for i, name in enumerate(name for name in STRING_FIELDS for _ in bad_values)]
    assert [field(ws, user, name) for user, name in zip(users, STRING_FIELDS, strict=True)] == ["v" * 255] * len(users)


# (name, value given, value stored): one request stores them all, each on a user of its own
VALID_FIELDS = [
    *(("dob", dob, dob) for dob in ("1990-05-17", "2024-02-29", "2000-12-31")),
    *(("gender", gender, gender) for gender in ("M", "F", "O", "N", "P")),
    *(("country", given, stored) for given, stored in (("US", "US"), ("us", "US"), ("Fr", "FR"), ("de", "DE"))),
    *(("language", given, stored) for given, stored in (("en", "en"), ("EN", "en"), ("Fr", "fr"))),
    *(("time_zone", zone, zone) for zone in ("Europe/Paris", "America/New_York", "UTC", "Asia/Kolkata")),
    *((name, state, state) for state in ("subscribed", "unsubscribed", "opted_in")
      for name in ("email_subscribe", "push_subscribe")),
    *(("last_coordinates", coords, coords) for coords in ([2.35, 48.85], [-180, -90], [180, 90], [0, 0])),
]


def test_valid_profile_fields_are_stored_normalized(ws):
    """Dates of birth, genders, countries (any case, stored upper), languages (any case, stored
    lower), time zones, subscription states and coordinates."""
    users = put_each(ws, [{name: given} for name, given, _ in VALID_FIELDS])
    stored = [field(ws, user, name) for user, (name, _, _) in zip(users, VALID_FIELDS, strict=True)]
    assert stored == [value for _, _, value in VALID_FIELDS]


INVALID_FIELDS = {
    ERR_DOB: ("dob", ["2023-02-30", "2023-02-29", "1990-13-01", "1990-00-10", "1990-04-31", "1990-5-17",
                      "17-05-1990", "1990/05/17", "19900517", "1990-05-17T00:00:00", "", "soon", 19900517,
                      ["1990-05-17"]]),
    ERR_GENDER: ("gender", ["X", "male", "", "MF", 1, "m", "f"]),
    ERR_COUNTRY: ("country", ["USA", "XX", "zz", "U", "", "United States", 1]),
    ERR_LANGUAGE: ("language", ["eng", "english", "xx", "e", "", "en-US", 5]),
    ERR_TIME_ZONE: ("time_zone", ["Mars/Olympus", "Paris", "", "+02:00", 2]),
    ERR_COORDINATES: ("last_coordinates", [[180.5, 0], [0, 90.1], [-181, 0], [0, -91], [1], [1, 2, 3], [],
                                           "2.35,48.85", [1, "2"], {"lon": 1, "lat": 2}, [None, 1]]),
    **{ERR_SUBSCRIBE.format(field=name): (name, ["SUBSCRIBED", "yes", "opted-in", "", True])
       for name in ("email_subscribe", "push_subscribe")},
}


@pytest.mark.parametrize("message", list(INVALID_FIELDS), ids=[name for name, _ in INVALID_FIELDS.values()])
def test_invalid_profile_field_values(ws, message):
    name, values = INVALID_FIELDS[message]
    extra = {"first_name": "Ann", "other": 1} if name == "dob" else {}
    assert_none_exists(ws, refuse_each(ws, [{name: value, **extra} for value in values], message))


def test_invalid_profile_field_skips_the_whole_object(ws):
    put(ws, first_name="Ann", a=1)
    r = attempt(ws, first_name="Bob", a=2, b=3, country="US", gender="Q")
    only_error(r, ERR_GENDER)
    assert export_one(ws, "u1", ["first_name", "country", "custom_attributes"]) == {
        "first_name": "Ann",
        "custom_attributes": {"a": 1},
    }


def test_profile_fields_are_checked_in_order(ws):
    # dob comes before gender, gender before country, time_zone before email_subscribe
    only_error(attempt(ws, gender="Q", dob="bad"), ERR_DOB)
    only_error(attempt(ws, country="XX", gender="Q"), ERR_GENDER)
    only_error(attempt(ws, email_subscribe="no", time_zone="Nowhere"), ERR_TIME_ZONE)
    only_error(
        attempt(ws, last_coordinates=[999, 0], first_name="x" * 300),
        ERR_FIELD_STRING.format(field="first_name"),
    )


CLEARABLE = [
    ("first_name", "Ann"), ("last_name", "Lee"), ("dob", "1990-01-02"), ("gender", "F"),
    ("country", "NO"), ("language", "nb"), ("home_city", "Oslo"), ("time_zone", "Europe/Oslo"),
    ("email_subscribe", "opted_in"), ("push_subscribe", "subscribed"),
    ("last_coordinates", [10.75, 59.91]), ("email", "ann@example.com"),
    ("phone", "+4712345678"), ("attributed_source", "ads"),
]


def test_null_clears_a_profile_field(ws):
    users = put_each(ws, [{name: value, "first_name_guard": "keep"} for name, value in CLEARABLE])
    assert [field(ws, user, name) for user, (name, _) in zip(users, CLEARABLE, strict=True)] == [
        value for _, value in CLEARABLE]
    track_ok(ws, attributes=[{"external_id": user, name: None} for user, (name, _) in zip(users, CLEARABLE, strict=True)])
    for user, (name, _) in zip(users, CLEARABLE, strict=True):
        assert export_one(ws, user, ["external_id", name]) == {"external_id": user}, name
        assert custom_attributes(ws, user) == {"first_name_guard": "keep"}


def test_push_opted_in_at_is_set_when_push_becomes_opted_in(tmp_path):
    clock = Clock()
    ws = open_ws(tmp_path, clock=clock)
    track_ok(ws, attributes=[{"external_id": "u1", "push_subscribe": "subscribed"}])
    assert field(ws, "u1", "push_opted_in_at") is None
    t1 = clock.advance(hours=1)
    track_ok(ws, attributes=[{"external_id": "u1", "push_subscribe": "opted_in"}])
    assert field(ws, "u1", "push_opted_in_at") == ts(t1)
    clock.advance(hours=1)
    track_ok(ws, attributes=[{"external_id": "u1", "push_subscribe": "opted_in"}])
    assert field(ws, "u1", "push_opted_in_at") == ts(t1)
    clock.advance(hours=1)
    track_ok(ws, attributes=[{"external_id": "u1", "push_subscribe": "unsubscribed"}])
    assert field(ws, "u1", "push_opted_in_at") == ts(t1)
    t4 = clock.advance(hours=1)
    track_ok(ws, attributes=[{"external_id": "u1", "push_subscribe": "opted_in"}])
    assert field(ws, "u1", "push_opted_in_at") == ts(t4)
    assert ts(t4) == "2026-11-22T16:00:00.000Z"


def test_push_opted_in_at_on_a_new_profile(ws):
    put(ws, push_subscribe="opted_in")
    assert field(ws, "u1", "push_opted_in_at") == ts(NOW)


def test_profile_fields_in_one_request_apply_in_order(ws):
    track_ok(
        ws,
        attributes=[
            {"external_id": "u1", "first_name": "A", "country": "us"},
            {"external_id": "u1", "first_name": "B"},
            {"external_id": "u1", "country": None},
        ],
    )
    assert export_one(ws, "u1", ["first_name", "country"]) == {"first_name": "B"}
