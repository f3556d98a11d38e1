"""POST /users/identify end to end: aliases, emails and phones; external ID unheld or held;
merge_behavior none vs merge; one alias per label; already identified; counts; 400s
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
    alias,
    apply_and_call,
    base,
    event,
    export,
    export_users,
    open_ws,
    post,
    profile_row,
    purchase,
    service_id,
    state_snapshot,
    track_ok,
    ts,
)

from engagelake import Workspace
from engagelake.rules.messages import (
    BODY_NOT_OBJECT,
    ERR_EMAIL,
    ERR_PHONE,
    ERR_USER_ALIAS,
    IDENTIFIER_INVALID,
    IDENTIFY_BLOCKED,
    IDENTIFY_EXTERNAL_ID,
    IDENTIFY_MERGE_BEHAVIOR,
    IDENTIFY_NO_ARRAYS,
    IDENTIFY_TOO_MANY,
    ITEM_NOT_OBJECT,
    LIST_NOT_ARRAY,
    PRIORITIZATION,
    PRIORITIZATION_BOTH,
)

IDENTIFY = "/users/identify"
MERGE = "/users/merge"
E = "anon@example.com"
PH = "+15550100000"
TOKEN = {"app_id": "app", "token": "tp", "device_id": "dp"}
EXPORTED_TOKEN = {"app": "app", "token": "tp", "device_id": "dp", "notifications_enabled": True}
# the profile fields identify with merge_behavior "merge" copies (email is not one of them)
MERGED = {
    "first_name": "Ann", "last_name": "Lee", "gender": "F", "dob": "1990-01-02", "phone": "+15550100001",
    "time_zone": "Europe/Paris", "home_city": "Paris", "country": "FR", "language": "fr",
}


# --- helpers -------------------------------------------------------------------------------------


def by_alias(external_id: Any, name: str, label: str = "crm") -> dict[str, Any]:
    return {"external_id": external_id, "user_alias": alias(name, label)}


def by_email(external_id: Any, email: Any, *prioritization: str) -> dict[str, Any]:
    return {"external_id": external_id, "email": email, "prioritization": list(prioritization)}


def by_phone(external_id: Any, phone: Any, *prioritization: str) -> dict[str, Any]:
    return {"external_id": external_id, "phone": phone, "prioritization": list(prioritization)}


def identify(ws: Workspace, body: dict[str, Any]) -> None:
    """Identify and assert the 200 body, aliases_processed = every element sent."""
    n = sum(len(body.get(k, [])) for k in ("aliases_to_identify", "emails_to_identify", "phone_numbers_to_identify"))
    r = ws.call("POST", IDENTIFY, body)
    assert (r.status, r.body) == (200, {"aliases_processed": n, "message": "success"})




def anon(name: str, label: str = "crm", **attrs: Any) -> dict[str, Any]:
    """Attributes object creating an alias-only profile."""
    return {"user_alias": alias(name, label), "_update_existing_only": False, **attrs}






def add_alias(ws: Workspace, external_id: str, name: str, label: str = "crm") -> None:
    r = ws.call("POST", "/users/alias/new", {"user_aliases": [{**alias(name, label), "external_id": external_id}]})
    assert (r.status, r.body) == (200, {"aliases_processed": 1, "message": "success"})



# --- request-level validation ------------------------------------------------------------------


@pytest.fixture(scope="module")
def shared_ws(tmp_path_factory):
    ws = open_ws(tmp_path_factory.mktemp("identify400"))
    track_ok(ws, attributes=[anon("p")])
    return ws


GOOD = by_alias("u", "p")
A0 = "aliases_to_identify[0]"
E0 = "emails_to_identify[0]"
P0 = "phone_numbers_to_identify[0]"
BAD_BODIES = [
    pytest.param([], BODY_NOT_OBJECT, id="body-array"),
    pytest.param(True, BODY_NOT_OBJECT, id="body-boolean"),
    pytest.param({}, IDENTIFY_NO_ARRAYS, id="no-arrays"),
    pytest.param({"merge_behavior": "none"}, IDENTIFY_NO_ARRAYS, id="only-merge-behavior"),
    pytest.param({"aliases_to_identify": "x"}, LIST_NOT_ARRAY.format(field="aliases_to_identify"), id="aliases-string"),
    pytest.param({"emails_to_identify": {}}, LIST_NOT_ARRAY.format(field="emails_to_identify"), id="emails-object"),
    pytest.param({"phone_numbers_to_identify": 5}, LIST_NOT_ARRAY.format(field="phone_numbers_to_identify"),
                 id="phones-number"),
    pytest.param({"aliases_to_identify": [GOOD, "x"]}, ITEM_NOT_OBJECT.format(field="aliases_to_identify", index=1),
                 id="alias-item-not-object"),
    pytest.param({"emails_to_identify": [[]]}, ITEM_NOT_OBJECT.format(field="emails_to_identify", index=0),
                 id="email-item-not-object"),
    pytest.param({"aliases_to_identify": [GOOD] * 26, "emails_to_identify": [by_email("u", E, "identified")] * 25},
                 IDENTIFY_TOO_MANY, id="51-together"),
    pytest.param({"aliases_to_identify": [GOOD] * 20, "emails_to_identify": [by_email("u", E, "identified")] * 20,
                  "phone_numbers_to_identify": [by_phone("u", PH, "identified")] * 11},
                 IDENTIFY_TOO_MANY, id="51-in-three-arrays"),
    pytest.param({"aliases_to_identify": [GOOD] * 51}, IDENTIFY_TOO_MANY, id="51-aliases"),
    pytest.param({"aliases_to_identify": [GOOD], "merge_behavior": "all"}, IDENTIFY_MERGE_BEHAVIOR, id="merge-behavior"),
    pytest.param({"aliases_to_identify": [GOOD], "merge_behavior": 1}, IDENTIFY_MERGE_BEHAVIOR,
                 id="merge-behavior-number"),
    pytest.param({"aliases_to_identify": [{"user_alias": alias("p")}]}, IDENTIFY_EXTERNAL_ID.format(where=A0),
                 id="external-id-missing"),
    pytest.param({"aliases_to_identify": [by_alias("", "p")]}, IDENTIFY_EXTERNAL_ID.format(where=A0),
                 id="external-id-empty"),
    pytest.param({"emails_to_identify": [by_email(7, E, "identified")]}, IDENTIFY_EXTERNAL_ID.format(where=E0),
                 id="external-id-number"),
    pytest.param({"aliases_to_identify": [by_alias(" Guest ", "p")]}, IDENTIFY_BLOCKED.format(where=A0),
                 id="external-id-blocked"),
    pytest.param({"phone_numbers_to_identify": [by_phone("null", PH, "identified")]}, IDENTIFY_BLOCKED.format(where=P0),
                 id="external-id-blocked-phone"),
    pytest.param({"aliases_to_identify": [{"external_id": "u", "user_alias": {"alias_name": "p"}}]},
                 IDENTIFIER_INVALID.format(where=A0, error=ERR_USER_ALIAS), id="alias-invalid"),
    pytest.param({"emails_to_identify": [by_email("u", "nope", "identified")]},
                 IDENTIFIER_INVALID.format(where=E0, error=ERR_EMAIL), id="email-invalid"),
    pytest.param({"phone_numbers_to_identify": [by_phone("u", "123", "identified")]},
                 IDENTIFIER_INVALID.format(where=P0, error=ERR_PHONE), id="phone-invalid"),
    pytest.param({"emails_to_identify": [{"external_id": "u", "email": E}]}, PRIORITIZATION.format(where=E0),
                 id="prioritization-missing"),
    pytest.param({"phone_numbers_to_identify": [by_phone("u", PH, "first")]}, PRIORITIZATION.format(where=P0),
                 id="prioritization-unknown"),
    pytest.param({"emails_to_identify": [by_email("u", E, "unidentified", "identified")]},
                 PRIORITIZATION_BOTH.format(where=E0), id="prioritization-both"),
    # arrays are checked in the order aliases, emails, phones, whatever the key order
    pytest.param({"emails_to_identify": [by_email("", E, "identified")], "aliases_to_identify": [GOOD, by_alias("", "p")]},
                 IDENTIFY_EXTERNAL_ID.format(where="aliases_to_identify[1]"), id="aliases-checked-first"),
]


@pytest.mark.parametrize(("body", "message"), BAD_BODIES)
def test_request_level_errors_answer_400_with_the_message(shared_ws, body, message):
    r = shared_ws.call("POST", IDENTIFY, body)
    assert (r.status, r.body) == (400, {"message": message})


def test_a_400_applies_nothing_of_the_request(ws):
    track_ok(ws, attributes=[anon("p")])
    before = state_snapshot(ws)
    r = ws.call("POST", IDENTIFY, {"aliases_to_identify": [by_alias("u", "p"), by_alias("test", "p")]})
    assert (r.status, r.body) == (400, {"message": IDENTIFY_BLOCKED.format(where="aliases_to_identify[1]")})
    assert state_snapshot(ws) == before
    assert ws.table("merges").collect().height == 0


# --- no user holds the external ID -----------------------------------------------------------------


def test_alias_with_an_unheld_external_id_gets_it_as_primary_id(tmp_path):
    clock = Clock()
    ws = open_ws(tmp_path, clock=clock)
    track_ok(ws, attributes=[anon("p", first_name="P", x=1, push_tokens=[TOKEN])],
             events=[event(user_alias=alias("p"))])
    clock.advance(hours=1)
    identify(ws, {"aliases_to_identify": [by_alias("u", "p")]})
    assert ws.export_users(ALL_FIELDS) == [base(
        0, "u", first_name="P", user_aliases=[alias("p")], custom_attributes={"x": 1},
        custom_events=[{"name": "played", "first": ts(NOW), "last": ts(NOW), "count": 1}],
        push_tokens=[EXPORTED_TOKEN], devices=[{"device_id": "dp"}])]
    assert profile_row(ws, 0)["updated_at"] == NOW + timedelta(hours=1)
    assert ws.table("external_ids").collect().to_dicts() == [{"external_id": "u", "service_id": service_id(0), "primary": True}]


def test_email_with_an_unheld_external_id_gets_it(ws):
    track_ok(ws, attributes=[{"email": E, "x": 1}])
    identify(ws, {"emails_to_identify": [by_email("u", "  ANON@example.com ", "unidentified")]})
    assert ws.export_users(ALL_FIELDS) == [base(0, "u", email=E, custom_attributes={"x": 1})]


def test_phone_with_an_unheld_external_id_gets_it(ws):
    track_ok(ws, attributes=[{"phone": PH, "x": 1}])
    identify(ws, {"phone_numbers_to_identify": [by_phone("u", "+1 555.010.0000", "most_recently_updated")]})
    assert ws.export_users(ALL_FIELDS) == [base(0, "u", phone=PH, custom_attributes={"x": 1})]


# --- a user holds the external ID ---------------------------------------------------------------------


def held_setup(ws: Workspace) -> None:
    """U = profile 0 (external ID u), P = profile 1 (alias crm:p) with everything."""
    track_ok(ws, attributes=[
        {"external_id": "u", "first_name": "U", "shared": "from-u"},
        anon("p", email=E, **MERGED, shared="from-p", only_p=[1], push_tokens=[TOKEN]),
    ], events=[event("e", external_id="u"), event("e", NOW - timedelta(days=1), user_alias=alias("p")),
               event("only_p", user_alias=alias("p"))],
        purchases=[purchase("sku", 4.0, user_alias=alias("p"))])


@pytest.mark.parametrize("behavior", [None, "none"])
def test_held_external_id_without_merge_drops_the_anonymous_profiles_data(tmp_path, behavior):
    clock = Clock()
    ws = open_ws(tmp_path, clock=clock)
    held_setup(ws)
    clock.advance(hours=1)
    body: dict[str, Any] = {"aliases_to_identify": [by_alias("u", "p")]}
    if behavior is not None:
        body["merge_behavior"] = behavior
    identify(ws, body)
    # P is gone; its push token and the identified alias moved; its attributes, events, purchases dropped
    assert ws.export_users(ALL_FIELDS) == [base(
        0, "u", first_name="U", custom_attributes={"shared": "from-u"}, user_aliases=[alias("p")],
        custom_events=[{"name": "e", "first": ts(NOW), "last": ts(NOW), "count": 1}],
        push_tokens=[EXPORTED_TOKEN], devices=[{"device_id": "dp"}])]
    assert set(ws.table("events").collect()["service_id"]) == {service_id(0)}
    assert ws.table("purchases").collect().height == 0
    assert ws.table("profiles").collect()["service_id"].to_list() == [service_id(0)]
    assert profile_row(ws, 0)["updated_at"] == NOW + timedelta(hours=1)


def test_held_external_id_with_merge_copies_the_identify_fields_but_not_email(tmp_path):
    clock = Clock()
    ws = open_ws(tmp_path, clock=clock)
    held_setup(ws)
    clock.advance(hours=1)
    identify(ws, {"aliases_to_identify": [by_alias("u", "p")], "merge_behavior": "merge"})
    assert ws.export_users(ALL_FIELDS) == [base(
        0, "u", **{**MERGED, "first_name": "U"},
        custom_attributes={"shared": "from-u", "only_p": [1]}, user_aliases=[alias("p")],
        custom_events=[{"name": "e", "first": ts(NOW - timedelta(days=1)), "last": ts(NOW), "count": 2},
                       {"name": "only_p", "first": ts(NOW), "last": ts(NOW), "count": 1}],
        purchases=[{"name": "sku", "first": ts(NOW), "last": ts(NOW), "count": 1}], total_revenue=4.0,
        push_tokens=[EXPORTED_TOKEN], devices=[{"device_id": "dp"}])]
    assert ws.table("profiles").collect()["service_id"].to_list() == [service_id(0)]
    assert profile_row(ws, 0)["language_explicit"] is True
    assert profile_row(ws, 0)["updated_at"] == NOW + timedelta(hours=1)


def test_held_external_id_by_email_deletes_the_anonymous_profile_with_its_other_aliases(ws):
    track_ok(ws, attributes=[{"external_id": "u"}, anon("other", email=E, x=1, push_tokens=[TOKEN])])
    identify(ws, {"emails_to_identify": [by_email("u", E, "unidentified")]})
    assert ws.export_users(ALL_FIELDS) == [base(0, "u", push_tokens=[EXPORTED_TOKEN], devices=[{"device_id": "dp"}])]
    r = export(ws, ["external_id"], user_aliases=[alias("other")])
    assert r.body == {"message": "success", "users": [], "invalid_user_ids": ["other"]}


def test_held_external_id_by_phone_with_merge(ws):
    track_ok(ws, attributes=[{"external_id": "u"}, {"phone": PH, "home_city": "Oslo", "x": 1}])
    identify(ws, {"phone_numbers_to_identify": [by_phone("u", PH, "unidentified")], "merge_behavior": "merge"})
    assert ws.export_users(ALL_FIELDS) == [base(0, "u", phone=PH, home_city="Oslo", custom_attributes={"x": 1})]


def test_a_deprecated_external_id_identifies_its_user(ws):
    track_ok(ws, attributes=[{"external_id": "u"}, anon("p")])
    r = ws.call("POST", "/users/external_ids/rename",
                {"external_id_renames": [{"current_external_id": "u", "new_external_id": "u2"}]})
    assert r.status == 200, r
    identify(ws, {"aliases_to_identify": [by_alias("u", "p")]})
    assert ws.export_users(ALL_FIELDS) == [base(0, "u2", user_aliases=[alias("p")])]


def test_one_alias_per_label_leaves_both_profiles_as_they_are(ws):
    track_ok(ws, attributes=[{"external_id": "u"}, anon("p", x=1, push_tokens=[TOKEN])])
    add_alias(ws, "u", "mine")  # u already holds a crm alias
    before = state_snapshot(ws)
    identify(ws, {"aliases_to_identify": [by_alias("u", "p")], "merge_behavior": "merge"})
    assert state_snapshot(ws) == before


def test_an_alias_of_another_label_moves_to_the_user(ws):
    track_ok(ws, attributes=[{"external_id": "u"}, anon("p")])
    add_alias(ws, "u", "mine", "web")
    identify(ws, {"aliases_to_identify": [by_alias("u", "p")]})
    assert ws.export_users(ALL_FIELDS) == [base(0, "u", user_aliases=[alias("p"), alias("mine", "web")])]


@pytest.mark.parametrize("other_exists", [False, True])
def test_an_alias_of_an_identified_user_is_a_no_op(ws, other_exists):
    track_ok(ws, attributes=[{"external_id": "a", "x": 1}, *([{"external_id": "b"}] if other_exists else [])])
    add_alias(ws, "a", "al")
    before = state_snapshot(ws)
    identify(ws, {"aliases_to_identify": [by_alias("b", "al")], "merge_behavior": "merge"})
    assert state_snapshot(ws) == before


def test_an_email_that_picks_an_identified_profile_is_a_no_op(ws):
    track_ok(ws, attributes=[{"external_id": "a", "email": E}, anon("p", email=E)])
    before = state_snapshot(ws)
    identify(ws, {"emails_to_identify": [by_email("u", E, "identified")]})
    assert state_snapshot(ws) == before


@pytest.mark.parametrize(("prioritization", "picked"), [
    (["unidentified"], None),
    (["most_recently_updated"], 1),
    (["least_recently_updated"], 0),
    (["unidentified", "most_recently_updated"], 1),
])
def test_email_candidates_are_picked_by_prioritization(ws, prioritization, picked):
    track_ok(ws, attributes=[anon("p0", email=E), anon("p1", email=E)])
    before = state_snapshot(ws)
    identify(ws, {"emails_to_identify": [by_email("u", E, *prioritization)]})
    if picked is None:
        assert state_snapshot(ws) == before
    else:
        assert export_users(ws, ["service_id"], external_ids=["u"]) == [{"service_id": service_id(picked)}]


def test_no_candidate_or_unknown_alias_is_a_no_op_and_still_counted(ws):
    track_ok(ws, attributes=[{"external_id": "a"}])
    before = state_snapshot(ws)
    identify(ws, {"aliases_to_identify": [by_alias("u", "ghost"), by_alias("v", "ghost", "web")],
                  "emails_to_identify": [by_email("u", "nobody@example.com", "identified")],
                  "phone_numbers_to_identify": [by_phone("u", "+15559999999", "unidentified")]})
    assert state_snapshot(ws) == before


def test_elements_apply_aliases_then_emails_then_phones(ws):
    track_ok(ws, attributes=[anon("p", email=E, phone=PH)])
    identify(ws, {"phone_numbers_to_identify": [by_phone("z", PH, "unidentified")],
                  "emails_to_identify": [by_email("y", E, "unidentified")],
                  "aliases_to_identify": [by_alias("x", "p")]})
    assert ws.export_users(["external_id", "service_id"]) == [{"external_id": "x", "service_id": service_id(0)}]


def test_a_later_element_finds_the_external_id_an_earlier_one_assigned(ws):
    track_ok(ws, attributes=[anon("p1", x=1), anon("p2", label="web", y=2, push_tokens=[TOKEN])])
    identify(ws, {"aliases_to_identify": [by_alias("u", "p1"), by_alias("u", "p2", "web")]})
    assert ws.export_users(ALL_FIELDS) == [base(
        0, "u", custom_attributes={"x": 1}, user_aliases=[alias("p1"), alias("p2", "web")],
        push_tokens=[EXPORTED_TOKEN], devices=[{"device_id": "dp"}])]


# --- batch-exact ------------------------------------------------------------------------------------




def test_batch_identify_then_merge_equals_calls(tmp_path):
    requests = [
        post(TRACK, {"attributes": [anon("p", email=E, x=1), {"external_id": "k"}, anon("q", label="web", z=3)]}),
        post(IDENTIFY, {"aliases_to_identify": [by_alias("u", "p")]}),
        post(MERGE, {"merge_updates": [{"identifier_to_merge": {"external_id": "u"},
                                        "identifier_to_keep": {"external_id": "k"}}]}),
        post(EXPORT, {"external_ids": ["u", "k"], "fields_to_export": ALL_FIELDS}),
        post(IDENTIFY, {"aliases_to_identify": [by_alias("k", "q", "web")], "merge_behavior": "merge"}),
        post(IDENTIFY, {"emails_to_identify": [by_email("k", E, "identified")]}),
        post(EXPORT, {"external_ids": ["u", "k"], "fields_to_export": ALL_FIELDS}),
    ]
    batch, batch_ws = apply_and_call(tmp_path, requests)
    assert [r.status for r in batch] == [201, 200, 202, 200, 200, 200, 200]
    # p got u, went into k (email and alias gone with it), q's data merged into k
    assert batch[6].body == {"message": "success", "users": [base(
        1, "k", email=E, custom_attributes={"x": 1, "z": 3}, user_aliases=[alias("q", "web")])],
        "invalid_user_ids": ["u"]}
