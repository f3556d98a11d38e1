"""/users/track: which field identifies the user, lookup by email/phone, and profile creation."""

from __future__ import annotations

import pytest
from tests.helpers import (
    Clock,
    alias,
    copy_of,
    custom_attributes,
    err,
    errors,
    event,
    exists,
    export_alias,
    export_one,
    export_users,
    only_error,
    open_ws,
    profile_count,
    purchase,
    service_id,
    track,
    track_ok,
)

from engagelake.rules.messages import (
    ERR_ATTRIBUTE_NAME,
    ERR_EMAIL,
    ERR_EXTERNAL_ID,
    ERR_MISSING_IDENTIFIER,
    ERR_MULTIPLE_IDENTIFIERS,
    ERR_PHONE,
    ERR_SERVICE_ID,
    ERR_UNKNOWN_SERVICE_ID,
    ERR_UPDATE_EXISTING_ONLY,
    ERR_USER_ALIAS,
)

FIELDS = ["external_id", "user_aliases", "service_id", "email", "phone", "custom_attributes"]


def refuse_each(ws, array: str, objects: list[dict], messages: str | list[str]) -> None:
    """Send `objects` as one request's `array` (one request for the cases of a rule instead of a
    store and a request each); assert that each object, and only it, is refused with its message."""
    if isinstance(messages, str):
        messages = [messages] * len(objects)
    r = track(ws, **{array: objects})
    assert errors(r) == [err(m, array, i) for i, m in enumerate(messages)], r.body
    assert r.body[f"{array}_processed"] == 0


def _u1(ws) -> None:
    track_ok(ws, attributes=[{"external_id": "u1"}])



# --- creation by external_id ---------------------------------------------------------------------


def test_unknown_external_id_creates_a_profile(ws):
    r = track(ws, attributes=[{"external_id": "u1", "first_name": "Ann", "tier": "gold"}])
    assert r.status == 201
    assert r.body == {"message": "success", "attributes_processed": 1}
    assert export_one(ws, "u1", ["external_id", "service_id", "first_name", "custom_attributes"]) == {
        "external_id": "u1",
        "service_id": service_id(0),
        "first_name": "Ann",
        "custom_attributes": {"tier": "gold"},
    }
    track_ok(ws, attributes=[{"external_id": "u2"}])
    assert export_one(ws, "u2", ["service_id"]) == {"service_id": service_id(1)}
    assert profile_count(ws) == 2


def test_known_external_id_updates_the_same_profile(ws):
    track_ok(ws, attributes=[{"external_id": "u1", "a": 1}])
    track_ok(ws, attributes=[{"external_id": "u1", "b": 2}])
    assert profile_count(ws) == 1
    assert custom_attributes(ws, "u1") == {"a": 1, "b": 2}


def test_external_ids_are_case_sensitive(ws):
    track_ok(ws, attributes=[{"external_id": "Abc", "a": 1}, {"external_id": "abc", "a": 2}])
    assert profile_count(ws) == 2
    assert custom_attributes(ws, "Abc") == {"a": 1}
    assert custom_attributes(ws, "abc") == {"a": 2}


@pytest.mark.parametrize("array", ["attributes", "events", "purchases"])
def test_update_existing_only_skips_unknown_external_id_silently(ws, array):
    obj = {"external_id": "ghost", "_update_existing_only": True}
    obj |= {"attributes": {"a": 1}, "events": event(), "purchases": purchase()}[array]
    r = track(ws, **{array: [obj]})
    assert r.body == {"message": "success", f"{array}_processed": 1}
    assert not exists(ws, "ghost")
    assert profile_count(ws) == 0


def test_update_existing_only_updates_known_external_id(ws):
    track_ok(ws, attributes=[{"external_id": "u1", "a": 1}])
    track_ok(
        ws,
        attributes=[{"external_id": "u1", "_update_existing_only": True, "a": 2}],
        events=[event("e", external_id="u1", _update_existing_only=True)],
    )
    assert export_one(ws, "u1", ["custom_attributes", "custom_events"]) == {
        "custom_attributes": {"a": 2},
        "custom_events": [{"name": "e", "first": "2026-11-22T12:00:00.000Z",
                           "last": "2026-11-22T12:00:00.000Z", "count": 1}],
    }


@pytest.mark.parametrize("flag", [False, None])
def test_update_existing_only_false_or_null_creates(ws, flag):
    track_ok(ws, attributes=[{"external_id": "u1", "_update_existing_only": flag, "a": 1}])
    assert custom_attributes(ws, "u1") == {"a": 1}


def test_update_existing_only_must_be_boolean(ws):
    flags = ["true", 1, 0, "false", [], {}]
    refuse_each(ws, "attributes", [{"external_id": f"u{i}", "_update_existing_only": flag, "a": 1}
                                   for i, flag in enumerate(flags)], ERR_UPDATE_EXISTING_ONLY)
    assert [i for i in range(len(flags)) if exists(ws, f"u{i}")] == []


def test_events_and_purchases_create_unknown_external_ids(ws):
    track_ok(ws, events=[event(external_id="e1")], purchases=[purchase(external_id="p1")])
    assert export_one(ws, "e1", ["service_id"]) == {"service_id": service_id(0)}
    assert export_one(ws, "p1", ["service_id"]) == {"service_id": service_id(1)}


# --- identifier selection ------------------------------------------------------------------------


MULTIPLE_IDS = [
    {"external_id": "u1", "user_alias": alias("a1")},
    {"external_id": "u1", "service_id": service_id(0)},
    {"user_alias": alias("a1"), "service_id": service_id(0)},
    {"external_id": "u1", "user_alias": alias("a1"), "service_id": service_id(0)},
]


@pytest.mark.parametrize("array", ["attributes", "events", "purchases"])
def test_multiple_identifiers_is_an_error(tmp_path, array):
    ws = copy_of(tmp_path, _u1)
    obj = {"attributes": {"a": 1}, "events": event(), "purchases": purchase()}[array]
    refuse_each(ws, array, [{**ids, **obj} for ids in MULTIPLE_IDS], ERR_MULTIPLE_IDENTIFIERS)
    assert export_one(ws, "u1", ["custom_attributes", "custom_events", "purchases"]) == {}
    assert profile_count(ws) == 1


def test_null_identifier_counts_as_absent(ws):
    track_ok(ws, attributes=[{"external_id": "u1", "user_alias": None, "service_id": None, "a": 1}])
    assert custom_attributes(ws, "u1") == {"a": 1}
    track_ok(ws, attributes=[{"external_id": None, "email": "n@example.com", "b": 1}])
    assert export_users(ws, ["email", "custom_attributes"], email_address="n@example.com") == [
        {"email": "n@example.com", "custom_attributes": {"b": 1}}
    ]


@pytest.mark.parametrize("array", ["attributes", "events", "purchases"])
def test_missing_identifier_is_an_error(ws, array):
    objs = [{}, {"first_name": "x"}, {"email": None, "phone": None}]
    base = {"attributes": {}, "events": event(), "purchases": purchase()}[array]
    refuse_each(ws, array, [{**base, **obj} for obj in objs], ERR_MISSING_IDENTIFIER)
    assert profile_count(ws) == 0


BAD_IDENTIFIERS = [
        ({"external_id": 5}, ERR_EXTERNAL_ID),
        ({"external_id": ["u1"]}, ERR_EXTERNAL_ID),
        ({"external_id": {"id": "u1"}}, ERR_EXTERNAL_ID),
        ({"user_alias": "a1"}, ERR_USER_ALIAS),
        ({"user_alias": {"alias_name": "a1"}}, ERR_USER_ALIAS),
        ({"user_alias": {"alias_label": "crm"}}, ERR_USER_ALIAS),
        ({"user_alias": {"alias_name": "", "alias_label": "crm"}}, ERR_USER_ALIAS),
        ({"user_alias": {"alias_name": "a1", "alias_label": 3}}, ERR_USER_ALIAS),
        ({"service_id": ""}, ERR_SERVICE_ID),
        ({"service_id": 5}, ERR_SERVICE_ID),
]


def test_identifier_shape(ws):
    refuse_each(ws, "attributes", [{**obj, "_update_existing_only": False, "a": 1} for obj, _ in BAD_IDENTIFIERS],
                [message for _, message in BAD_IDENTIFIERS])
    assert profile_count(ws) == 0


def test_strong_identifier_makes_email_and_phone_field_updates(ws):
    track_ok(ws, attributes=[{"email": "old@example.com", "x": 1}])
    track_ok(
        ws,
        attributes=[
            {"external_id": "u1", "email": "old@example.com", "phone": "+14155550100", "a": 1}
        ],
    )
    # the email did not identify: u1 is a second profile holding the same email
    assert profile_count(ws) == 2
    assert export_one(ws, "u1", FIELDS) == {
        "external_id": "u1",
        "service_id": service_id(1),
        "email": "old@example.com",
        "phone": "+14155550100",
        "custom_attributes": {"a": 1},
    }


def test_email_identifies_when_both_email_and_phone_are_given(ws):
    track_ok(ws, attributes=[{"phone": "+14155550100", "p": 1}])
    track_ok(ws, attributes=[{"email": "a@example.com", "phone": "+14155550100", "e": 1}])
    # the phone profile was not used: the email created its own profile, with the phone as field
    assert profile_count(ws) == 2
    assert export_users(ws, ["email", "phone", "custom_attributes"], email_address="a@example.com") == [
        {"email": "a@example.com", "phone": "+14155550100", "custom_attributes": {"e": 1}}
    ]
    # a second email+phone object updates the email profile, its phone is a field update
    track_ok(ws, attributes=[{"email": "a@example.com", "phone": "+1 415 555 0199"}])
    assert profile_count(ws) == 2
    users = export_users(ws, ["phone", "custom_attributes"], email_address="a@example.com")
    assert users == [{"phone": "+14155550199", "custom_attributes": {"e": 1}}]


def test_phone_identifies_when_email_is_null(ws):
    track_ok(ws, attributes=[{"phone": "+14155550100", "p": 1}])
    track_ok(ws, attributes=[{"email": None, "phone": "+14155550100", "q": 2}])
    assert profile_count(ws) == 1
    assert export_users(ws, ["custom_attributes"], phone="+14155550100") == [
        {"custom_attributes": {"p": 1, "q": 2}}
    ]


def test_invalid_identifying_email_is_an_error_even_with_a_valid_phone(ws):
    r = track(ws, attributes=[{"email": "not-an-email", "phone": "+14155550100", "a": 1}])
    only_error(r, ERR_EMAIL)
    assert profile_count(ws) == 0


# --- email and phone normalization ----------------------------------------------------------------


def test_email_is_trimmed_and_lower_cased(ws):
    track_ok(ws, attributes=[{"email": "  Ann.Lee@Example.COM ", "a": 1}])
    track_ok(ws, attributes=[{"email": "ANN.LEE@example.com", "b": 2}])
    assert profile_count(ws) == 1
    assert export_users(ws, ["email", "custom_attributes"], email_address="ann.lee@example.com") == [
        {"email": "ann.lee@example.com", "custom_attributes": {"a": 1, "b": 2}}
    ]


def test_email_field_is_stored_normalized(ws):
    track_ok(ws, attributes=[{"external_id": "u1", "email": " Bob@Example.Org"}])
    assert export_one(ws, "u1", ["email"]) == {"email": "bob@example.org"}
    track_ok(ws, attributes=[{"email": "bob@EXAMPLE.org", "a": 1}])
    assert profile_count(ws) == 1
    assert custom_attributes(ws, "u1") == {"a": 1}


@pytest.mark.parametrize(
    "raw",
    ["+1 (415) 555-0100", "1.415.555.0100", "+1-415-555-0100", "14155550100", " +14155550100 "],
)
def test_phone_is_normalized_to_e164(ws, raw):
    track_ok(ws, attributes=[{"phone": raw, "a": 1}])
    track_ok(ws, attributes=[{"phone": "+14155550100", "b": 2}])
    assert profile_count(ws) == 1
    assert export_users(ws, ["phone", "custom_attributes"], phone="+14155550100") == [
        {"phone": "+14155550100", "custom_attributes": {"a": 1, "b": 2}}
    ]


BAD_EMAILS = ["", "plain", "no-at.example.com", "a@b", "a@@b.com", "a@b@c.com", "a b@c.com",
              "@example.com", 5, ["a@b.com"], "x" * 250 + "@example.com"]
BAD_PHONES = ["", "abc", "1234567", "+1234567", "+1234567890123456", "+0123456789", "0123456789",
              "+1-415-555-01x0", "++14155550100", "+1/415/555/0100", 14155550100]


def test_invalid_email(ws):
    refuse_each(ws, "attributes", [{"email": bad, "a": 1} for bad in BAD_EMAILS], ERR_EMAIL)
    refuse_each(ws, "events", [event(email=bad) for bad in BAD_EMAILS], ERR_EMAIL)
    # also as a field beside a stronger identifier: the whole object is skipped
    refuse_each(ws, "attributes", [{"external_id": f"u{i}", "email": bad, "a": 1} for i, bad in enumerate(BAD_EMAILS)],
                ERR_EMAIL)
    assert profile_count(ws) == 0


def test_invalid_phone(ws):
    refuse_each(ws, "attributes", [{"phone": bad, "a": 1} for bad in BAD_PHONES], ERR_PHONE)
    refuse_each(ws, "purchases", [purchase(phone=bad) for bad in BAD_PHONES], ERR_PHONE)
    refuse_each(ws, "attributes", [{"external_id": f"u{i}", "phone": bad} for i, bad in enumerate(BAD_PHONES)],
                ERR_PHONE)
    assert profile_count(ws) == 0


@pytest.mark.parametrize("digits", ["12345678", "123456789012345"])
def test_phone_length_bounds_are_accepted(ws, digits):
    track_ok(ws, attributes=[{"phone": digits, "a": 1}])
    assert export_users(ws, ["phone"], phone="+" + digits) == [{"phone": "+" + digits}]


# --- several profiles per email -------------------------------------------------------------------


def alias_profile(name: str, email: str) -> dict:
    return {"user_alias": alias(name), "_update_existing_only": False, "email": email}


def test_email_prefers_the_most_recently_updated_profile_with_an_external_id(tmp_path):
    clock = Clock()
    ws = open_ws(tmp_path, clock=clock)
    e = "shared@example.com"
    track_ok(ws, attributes=[alias_profile("a1", e)])
    clock.advance(minutes=1)
    track_ok(ws, attributes=[{"external_id": "x1", "email": e}])
    clock.advance(minutes=1)
    track_ok(ws, attributes=[{"external_id": "x2", "email": e}])
    clock.advance(minutes=1)
    track_ok(ws, attributes=[alias_profile("a2", e)])  # most recent, but no external_id
    clock.advance(minutes=1)
    track_ok(ws, attributes=[{"email": e, "hit": 1}])
    assert custom_attributes(ws, "x2") == {"hit": 1}
    assert custom_attributes(ws, "x1") == {}
    assert "custom_attributes" not in export_alias(ws, alias("a2"), ["custom_attributes"])

    clock.advance(minutes=1)
    track_ok(ws, attributes=[{"external_id": "x1", "touch": 1}])  # x1 is now the most recent
    clock.advance(minutes=1)
    track_ok(ws, attributes=[{"email": e, "hit2": 1}], events=[event("via_email", email=e)])
    assert custom_attributes(ws, "x1") == {"touch": 1, "hit2": 1}
    assert custom_attributes(ws, "x2") == {"hit": 1}
    assert [ev["name"] for ev in export_one(ws, "x1", ["custom_events"])["custom_events"]] == [
        "via_email"
    ]
    assert profile_count(ws) == 4


def test_email_without_identified_profiles_takes_the_most_recently_updated(tmp_path):
    clock = Clock()
    ws = open_ws(tmp_path, clock=clock)
    e = "anon@example.com"
    track_ok(ws, attributes=[alias_profile("a1", e)])
    clock.advance(seconds=1)
    track_ok(ws, attributes=[alias_profile("a2", e)])
    clock.advance(seconds=1)
    track_ok(ws, attributes=[{"email": e, "hit": 1}])
    assert export_alias(ws, alias("a2"), ["custom_attributes"]) == {"custom_attributes": {"hit": 1}}
    assert export_alias(ws, alias("a1"), ["custom_attributes"]) == {}

    clock.advance(seconds=1)
    track_ok(ws, attributes=[{"user_alias": alias("a1"), "touch": 1}])
    clock.advance(seconds=1)
    track_ok(ws, attributes=[{"email": e, "hit2": 1}])
    assert export_alias(ws, alias("a1"), ["custom_attributes"]) == {
        "custom_attributes": {"touch": 1, "hit2": 1}
    }
    assert profile_count(ws) == 2


def test_recency_ties_in_one_request_follow_object_order(ws):
    e = "tie@example.com"
    track_ok(
        ws,
        attributes=[alias_profile("a1", e), alias_profile("a2", e), {"email": e, "hit": 1}],
    )
    assert export_alias(ws, alias("a2"), ["custom_attributes"]) == {"custom_attributes": {"hit": 1}}
    assert export_alias(ws, alias("a1"), ["custom_attributes"]) == {}
    track_ok(ws, attributes=[{"user_alias": alias("a1"), "touch": 1}, {"email": e, "hit2": 1}])
    assert export_alias(ws, alias("a1"), ["custom_attributes"]) == {
        "custom_attributes": {"touch": 1, "hit2": 1}
    }


def test_phone_prefers_the_profile_with_an_external_id(tmp_path):
    clock = Clock()
    ws = open_ws(tmp_path, clock=clock)
    track_ok(ws, attributes=[{"external_id": "x1", "phone": "+33612345678"}])
    clock.advance(seconds=1)
    track_ok(
        ws,
        attributes=[{"user_alias": alias("a1"), "_update_existing_only": False, "phone": "+33612345678"}],
    )
    clock.advance(seconds=1)
    track_ok(ws, attributes=[{"phone": "+33 6 12 34 56 78", "hit": 1}])
    assert custom_attributes(ws, "x1") == {"hit": 1}


# --- user aliases ----------------------------------------------------------------------------------


@pytest.mark.parametrize("flag", [{}, {"_update_existing_only": True}])
def test_unknown_alias_does_not_create_without_update_existing_only_false(ws, flag):
    r = track(ws, attributes=[{"user_alias": alias("a1"), **flag, "a": 1}])
    assert r.body == {"message": "success", "attributes_processed": 1}
    assert profile_count(ws) == 0
    assert export_alias(ws, alias("a1"), ["user_aliases"]) is None


def test_alias_with_update_existing_only_false_creates_an_alias_only_profile(ws):
    r = track(ws, attributes=[{"user_alias": alias("a1"), "_update_existing_only": False, "a": 1}])
    assert r.body == {"message": "success", "attributes_processed": 1}
    assert export_alias(ws, alias("a1"), FIELDS) == {
        "user_aliases": [alias("a1")],
        "service_id": service_id(0),
        "custom_attributes": {"a": 1},
    }
    # later objects by the alias update the same profile (update-only is the default)
    track_ok(ws, attributes=[{"user_alias": alias("a1"), "b": 2}])
    assert export_alias(ws, alias("a1"), ["custom_attributes"]) == {
        "custom_attributes": {"a": 1, "b": 2}
    }
    assert profile_count(ws) == 1


def test_alias_label_is_part_of_the_alias(ws):
    track_ok(ws, attributes=[{"user_alias": alias("a1", "crm"), "_update_existing_only": False}])
    track_ok(ws, attributes=[{"user_alias": alias("a1", "shop"), "x": 1}])
    assert profile_count(ws) == 1
    assert export_alias(ws, alias("a1", "crm"), ["custom_attributes"]) == {}


@pytest.mark.parametrize("array", ["events", "purchases"])
@pytest.mark.parametrize("flag", [{}, {"_update_existing_only": False}, {"_update_existing_only": True}])
def test_alias_never_creates_for_events_and_purchases(ws, array, flag):
    obj = {**(event() if array == "events" else purchase()), "user_alias": alias("a1"), **flag}
    r = track(ws, **{array: [obj]})
    assert r.body == {"message": "success", f"{array}_processed": 1}
    assert profile_count(ws) == 0
    assert ws.table(array).collect().height == 0


@pytest.mark.parametrize("array", ["events", "purchases"])
def test_events_and_purchases_reach_an_existing_alias(ws, array):
    track_ok(ws, attributes=[{"user_alias": alias("a1"), "_update_existing_only": False}])
    obj = {**(event("e") if array == "events" else purchase("e")), "user_alias": alias("a1")}
    track_ok(ws, **{array: [obj]})
    field_name = "custom_events" if array == "events" else "purchases"
    user = export_alias(ws, alias("a1"), [field_name])
    assert [x["name"] for x in user[field_name]] == ["e"]


# --- email-only and phone-only profiles ------------------------------------------------------------


def test_email_only_profile(ws):
    r = track(ws, attributes=[{"email": "solo@example.com", "first_name": "Solo"}])
    assert r.body == {"message": "success", "attributes_processed": 1}
    assert export_users(ws, [*FIELDS, "first_name"], email_address="solo@example.com") == [
        {"service_id": service_id(0), "email": "solo@example.com", "first_name": "Solo"}
    ]


def test_phone_only_profile(ws):
    track_ok(ws, attributes=[{"phone": "+44 20 7946 0958", "first_name": "Pho"}])
    assert export_users(ws, [*FIELDS, "first_name"], phone="+442079460958") == [
        {"service_id": service_id(0), "phone": "+442079460958", "first_name": "Pho"}
    ]


@pytest.mark.parametrize("array", ["events", "purchases"])
def test_events_and_purchases_create_email_and_phone_profiles(ws, array):
    make = event if array == "events" else purchase
    track_ok(ws, **{array: [make(email="ev@example.com"), make(phone="+14155550123")]})
    assert len(export_users(ws, ["email"], email_address="ev@example.com")) == 1
    assert len(export_users(ws, ["phone"], phone="+14155550123")) == 1
    assert profile_count(ws) == 2


@pytest.mark.parametrize("ident", [{"email": "u@example.com"}, {"phone": "+14155550100"}])
def test_update_existing_only_skips_unknown_email_and_phone(ws, ident):
    r = track(ws, attributes=[{**ident, "_update_existing_only": True, "a": 1}])
    assert r.body == {"message": "success", "attributes_processed": 1}
    assert profile_count(ws) == 0


# --- service_id ------------------------------------------------------------------------------------


def test_known_service_id_updates_that_profile(ws):
    track_ok(ws, attributes=[{"external_id": "u1"}])
    track_ok(
        ws,
        attributes=[{"service_id": service_id(0), "a": 1}],
        events=[event("e", service_id=service_id(0))],
    )
    assert profile_count(ws) == 1
    user = export_one(ws, "u1", ["custom_attributes", "custom_events"])
    assert user["custom_attributes"] == {"a": 1}
    assert [x["name"] for x in user["custom_events"]] == ["e"]


@pytest.mark.parametrize("array", ["attributes", "events", "purchases"])
def test_unknown_service_id_is_an_error(ws, array):
    track_ok(ws, attributes=[{"external_id": "u1"}])
    obj = {"attributes": {"a": 1}, "events": event(), "purchases": purchase()}[array]
    r = track(ws, **{array: [{**obj, "service_id": service_id(7)}]})
    only_error(r, ERR_UNKNOWN_SERVICE_ID, array)
    assert r.body[f"{array}_processed"] == 0
    assert profile_count(ws) == 1


def test_unknown_service_id_error_comes_after_static_checks(ws):
    r = track(ws, attributes=[{"service_id": "nope", "$bad": 1}])
    only_error(r, ERR_ATTRIBUTE_NAME)


# --- no duplicates when one request or batch creates the same user many times ------------------


def test_one_request_creates_a_new_external_id_once(ws):
    track_ok(
        ws,
        attributes=[{"external_id": "n", "a": 1}, {"external_id": "n", "b": 2}],
        events=[event("e", external_id="n"), event("e", external_id="n")],
        purchases=[purchase("p", external_id="n")],
    )
    assert profile_count(ws) == 1
    user = export_one(ws, "n", ["service_id", "custom_attributes", "custom_events", "purchases"])
    assert user["service_id"] == service_id(0)
    assert user["custom_attributes"] == {"a": 1, "b": 2}
    assert [(x["name"], x["count"]) for x in user["custom_events"]] == [("e", 2)]
    assert [(x["name"], x["count"]) for x in user["purchases"]] == [("p", 1)]


def test_one_request_creates_a_new_email_and_phone_once(ws):
    track_ok(
        ws,
        attributes=[{"email": "N@example.com", "a": 1}, {"email": "n@example.com", "b": 2},
                    {"phone": "+1 415 555 0100", "c": 3}],
        events=[event(email="n@EXAMPLE.com"), event(phone="14155550100")],
        purchases=[purchase(email=" n@example.com")],
    )
    assert profile_count(ws) == 2
    by_email = export_users(ws, ["service_id", "custom_attributes", "custom_events", "purchases"],
                            email_address="n@example.com")
    assert len(by_email) == 1
    assert by_email[0]["service_id"] == service_id(0)
    assert by_email[0]["custom_attributes"] == {"a": 1, "b": 2}
    assert by_email[0]["custom_events"][0]["count"] == 1
    assert by_email[0]["purchases"][0]["count"] == 1
    by_phone = export_users(ws, ["service_id", "custom_attributes", "custom_events"],
                            phone="+14155550100")
    assert by_phone == [
        {
            "service_id": service_id(1),
            "custom_attributes": {"c": 3},
            "custom_events": [{"name": "played", "first": "2026-11-22T12:00:00.000Z",
                               "last": "2026-11-22T12:00:00.000Z", "count": 1}],
        }
    ]


def test_email_set_by_an_earlier_object_identifies_later_ones(ws):
    track_ok(
        ws,
        attributes=[{"external_id": "x", "email": "x@example.com"}, {"email": "x@example.com", "a": 1}],
    )
    assert profile_count(ws) == 1
    assert custom_attributes(ws, "x") == {"a": 1}


def test_one_batch_creates_a_new_user_once(ws):
    rs = ws.apply(
        [
            {"method": "POST", "path": "/users/track", "body": {"attributes": [{"external_id": "n", "a": 1}]}},
            {"method": "POST", "path": "/users/track", "body": {"events": [event(external_id="n")]}},
            {"method": "POST", "path": "/users/track", "body": {"attributes": [{"email": "b@example.com"}]}},
            {"method": "POST", "path": "/users/track", "body": {"attributes": [{"external_id": "n", "b": 2}]}},
            {"method": "POST", "path": "/users/track", "body": {"purchases": [purchase(email="B@example.com")]}},
        ]
    )
    assert [r.status for r in rs] == [201] * 5
    assert profile_count(ws) == 2
    assert export_one(ws, "n", ["service_id", "custom_attributes"]) == {
        "service_id": service_id(0), "custom_attributes": {"a": 1, "b": 2}
    }
    assert export_users(ws, ["service_id"], email_address="b@example.com") == [
        {"service_id": service_id(1)}
    ]


def test_attributes_run_before_events_inside_one_request(ws):
    # the update-only attributes object comes first, when "n" does not exist yet
    track_ok(
        ws,
        events=[event(external_id="n")],
        attributes=[{"external_id": "n", "_update_existing_only": True, "a": 1}],
    )
    assert exists(ws, "n")
    assert custom_attributes(ws, "n") == {}


def test_errors_do_not_stop_other_objects(ws):
    r = track(
        ws,
        attributes=[{"external_id": "ok1"}, {"email": "bad"}, {"external_id": "ok2"}],
        events=[event(), event(external_id="ok3")],
    )
    assert errors(r) == [
        err(ERR_EMAIL, "attributes", 1),
        err(ERR_MISSING_IDENTIFIER, "events", 0),
    ]
    assert r.body["attributes_processed"] == 2
    assert r.body["events_processed"] == 1
    assert all(exists(ws, x) for x in ("ok1", "ok2", "ok3"))


def test_event_email_beside_external_id_is_ignored(ws):
    track_ok(ws, events=[event(external_id="u1", email="e@example.com", phone="+14155550100")])
    assert export_one(ws, "u1", ["external_id", "email", "phone"]) == {"external_id": "u1"}
    assert export_users(ws, ["external_id"], email_address="e@example.com") == []
