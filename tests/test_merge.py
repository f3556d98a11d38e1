"""POST /users/merge end to end: identifiers, prioritization, skips, the field rules, history,
push tokens, deletion of the merged profile, chains, time (docs/identity.md)."""

from __future__ import annotations

from collections.abc import Callable
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
    copy_store,
    errors,
    event,
    export,
    export_users,
    group_states,
    open_ws,
    post,
    profile_row,
    purchase,
    service_id,
    state_snapshot,
    track,
    track_ok,
    ts,
)

from engagelake import Workspace
from engagelake.rules.messages import (
    BODY_NOT_OBJECT,
    ERR_EMAIL,
    ERR_EXTERNAL_ID,
    ERR_PHONE,
    ERR_SERVICE_ID,
    ERR_UNKNOWN_SERVICE_ID,
    ERR_USER_ALIAS,
    IDENTIFIER_INVALID,
    IDENTIFIER_ONE_OF,
    ITEM_NOT_OBJECT,
    LIST_EMPTY,
    LIST_NOT_ARRAY,
    LIST_TOO_MANY,
    MERGE_SIDES,
    PRIORITIZATION,
    PRIORITIZATION_BOTH,
)

MERGE = "/users/merge"
RENAME = "/users/external_ids/rename"
E = "shared@example.com"
P = "+15550100000"
# the ten profile fields a merge copies where the target has no value
COPIED = {
    "first_name": "Ann", "last_name": "Lee", "email": "ann@example.com", "gender": "F",
    "dob": "1990-01-02", "phone": "+15550100001", "time_zone": "Europe/Paris", "home_city": "Paris",
    "country": "FR", "language": "fr",
}
TARGETS = {
    "first_name": "Bob", "last_name": "Ray", "email": "bob@example.com", "gender": "M",
    "dob": "1985-05-06", "phone": "+15550100009", "time_zone": "America/New_York",
    "home_city": "Boston", "country": "US", "language": "en",
}


# --- helpers -------------------------------------------------------------------------------------


def ext(x: str) -> dict[str, Any]:
    return {"external_id": x}


def sid_of(n: int) -> dict[str, Any]:
    return {"service_id": service_id(n)}


def by(kind: str, value: str, *prioritization: str) -> dict[str, Any]:
    return {kind: value, "prioritization": list(prioritization)}


def upd(source: dict[str, Any], target: dict[str, Any]) -> dict[str, Any]:
    return {"identifier_to_merge": source, "identifier_to_keep": target}


def post_merge(*updates: dict[str, Any]) -> dict[str, Any]:
    return {"method": "POST", "path": MERGE, "body": {"merge_updates": list(updates)}}


def merge(ws: Workspace, *updates: dict[str, Any]) -> None:
    r = ws.call("POST", MERGE, {"merge_updates": list(updates)})
    assert (r.status, r.body) == (202, {"message": "success"})




def one(ws: Workspace, **identifiers: Any) -> dict[str, Any]:
    users = export_users(ws, ALL_FIELDS, **identifiers)
    assert len(users) == 1, users
    return users[0]






def rows_of(ws: Workspace, table: str, n: int) -> list[dict[str, Any]]:
    df = ws.table(table).collect()
    return df.filter(df["service_id"] == service_id(n)).to_dicts()



Build = Callable[[Workspace, Clock], None]


@pytest.fixture(scope="module")
def templates(tmp_path_factory):
    """Stores built once per module and copied per test (a commit costs far more than a copy)."""
    return {}


@pytest.fixture
def clone(templates, tmp_path_factory, tmp_path):
    def make(name: str, build: Build) -> Workspace:
        if name not in templates:
            root = tmp_path_factory.mktemp(f"template-{name}")
            clock = Clock()
            build(open_ws(root, clock=clock), clock)
            templates[name] = root / "store"
        copy_store(templates[name], tmp_path / "store")
        return open_ws(tmp_path)
    return make


def two_users(ws: Workspace) -> None:
    """a = profile 0, b = profile 1."""
    track_ok(ws, attributes=[{"external_id": "a"}, {"external_id": "b"}])


# --- request-level validation (400, nothing applied) ----------------------------------------------


@pytest.fixture(scope="module")
def shared_ws(tmp_path_factory):
    ws = open_ws(tmp_path_factory.mktemp("merge400"))
    two_users(ws)
    return ws


def _where(i: int, side: str) -> str:
    return f"merge_updates[{i}].{side}"


OK = upd(ext("a"), ext("b"))
KEEP0 = _where(0, "identifier_to_keep")
MERGE0 = _where(0, "identifier_to_merge")
BAD_BODIES = [
    pytest.param([], BODY_NOT_OBJECT, id="body-array"),
    pytest.param(5, BODY_NOT_OBJECT, id="body-number"),
    pytest.param(None, BODY_NOT_OBJECT, id="body-null"),
    pytest.param({}, LIST_NOT_ARRAY.format(field="merge_updates"), id="list-missing"),
    pytest.param({"merge_updates": {"a": 1}}, LIST_NOT_ARRAY.format(field="merge_updates"), id="list-object"),
    pytest.param({"merge_updates": "x"}, LIST_NOT_ARRAY.format(field="merge_updates"), id="list-string"),
    pytest.param({"merge_updates": []}, LIST_EMPTY.format(field="merge_updates"), id="list-empty"),
    pytest.param({"merge_updates": [OK] * 51}, LIST_TOO_MANY.format(field="merge_updates"), id="list-51"),
    pytest.param({"merge_updates": [OK, 7]}, ITEM_NOT_OBJECT.format(field="merge_updates", index=1),
                 id="item-not-object"),
    pytest.param({"merge_updates": [{"identifier_to_merge": ext("a")}]}, MERGE_SIDES.format(index=0),
                 id="keep-missing"),
    pytest.param({"merge_updates": [OK, {"identifier_to_keep": ext("a")}]}, MERGE_SIDES.format(index=1),
                 id="merge-missing"),
    pytest.param({"merge_updates": [{"identifier_to_merge": "a", "identifier_to_keep": ext("b")}]},
                 MERGE_SIDES.format(index=0), id="side-not-object"),
    pytest.param({"merge_updates": [upd({}, ext("b"))]}, IDENTIFIER_ONE_OF.format(where=MERGE0),
                 id="no-identifier"),
    pytest.param({"merge_updates": [upd(ext("a"), {"external_id": "b", "service_id": "x"})]},
                 IDENTIFIER_ONE_OF.format(where=KEEP0), id="two-identifiers"),
    pytest.param({"merge_updates": [upd(ext("a"), {"external_id": "b", "email": E, "prioritization": ["identified"]})]},
                 IDENTIFIER_ONE_OF.format(where=KEEP0), id="external-id-and-email"),
    pytest.param({"merge_updates": [upd(ext("a"), {"first_name": "b"})]},
                 IDENTIFIER_ONE_OF.format(where=KEEP0), id="unknown-key-only"),
    pytest.param({"merge_updates": [upd(ext(""), ext("b"))]},
                 IDENTIFIER_INVALID.format(where=MERGE0, error=ERR_EXTERNAL_ID), id="external-id-empty"),
    pytest.param({"merge_updates": [upd(ext("a"), {"external_id": 5})]},
                 IDENTIFIER_INVALID.format(where=KEEP0, error=ERR_EXTERNAL_ID), id="external-id-number"),
    pytest.param({"merge_updates": [upd({"user_alias": {"alias_name": "x"}}, ext("b"))]},
                 IDENTIFIER_INVALID.format(where=MERGE0, error=ERR_USER_ALIAS), id="alias-no-label"),
    pytest.param({"merge_updates": [upd({"user_alias": alias("")}, ext("b"))]},
                 IDENTIFIER_INVALID.format(where=MERGE0, error=ERR_USER_ALIAS), id="alias-empty-name"),
    pytest.param({"merge_updates": [upd({"user_alias": "x"}, ext("b"))]},
                 IDENTIFIER_INVALID.format(where=MERGE0, error=ERR_USER_ALIAS), id="alias-string"),
    pytest.param({"merge_updates": [upd({"service_id": ""}, ext("b"))]},
                 IDENTIFIER_INVALID.format(where=MERGE0, error=ERR_SERVICE_ID), id="service-id-empty"),
    pytest.param({"merge_updates": [upd({"service_id": 3}, ext("b"))]},
                 IDENTIFIER_INVALID.format(where=MERGE0, error=ERR_SERVICE_ID), id="service-id-number"),
    pytest.param({"merge_updates": [upd(by("email", "not-an-email", "identified"), ext("b"))]},
                 IDENTIFIER_INVALID.format(where=MERGE0, error=ERR_EMAIL), id="email-invalid"),
    pytest.param({"merge_updates": [upd(ext("a"), by("phone", "12", "identified"))]},
                 IDENTIFIER_INVALID.format(where=KEEP0, error=ERR_PHONE), id="phone-invalid"),
    pytest.param({"merge_updates": [upd({"email": E}, ext("b"))]},
                 PRIORITIZATION.format(where=MERGE0), id="prioritization-missing"),
    pytest.param({"merge_updates": [upd(by("email", E), ext("b"))]},
                 PRIORITIZATION.format(where=MERGE0), id="prioritization-empty"),
    pytest.param({"merge_updates": [upd({"email": E, "prioritization": "identified"}, ext("b"))]},
                 PRIORITIZATION.format(where=MERGE0), id="prioritization-string"),
    pytest.param({"merge_updates": [upd(by("email", E, "newest"), ext("b"))]},
                 PRIORITIZATION.format(where=MERGE0), id="prioritization-unknown-value"),
    pytest.param({"merge_updates": [upd(ext("a"), by("phone", P, "identified", 3))]},
                 PRIORITIZATION.format(where=KEEP0), id="prioritization-number"),
    pytest.param({"merge_updates": [upd(by("email", E, "identified", "unidentified"), ext("b"))]},
                 PRIORITIZATION_BOTH.format(where=MERGE0), id="identified-and-unidentified"),
    pytest.param({"merge_updates": [upd(ext("a"), by("phone", P, "unidentified", "most_recently_updated",
                                                      "identified"))]},
                 PRIORITIZATION_BOTH.format(where=KEEP0), id="identified-and-unidentified-phone"),
    # the first error found is reported: items in array order
    pytest.param({"merge_updates": [OK, upd(ext(""), ext("b")), upd({}, ext("b"))]},
                 IDENTIFIER_INVALID.format(where=_where(1, "identifier_to_merge"), error=ERR_EXTERNAL_ID),
                 id="first-error-wins"),
    pytest.param({"merge_updates": [upd({}, ext(""))]}, IDENTIFIER_ONE_OF.format(where=MERGE0),
                 id="merge-side-checked-first"),
]


@pytest.mark.parametrize(("body", "message"), BAD_BODIES)
def test_request_level_errors_answer_400_with_the_message(shared_ws, body, message):
    r = shared_ws.call("POST", MERGE, body)
    assert (r.status, r.body) == (400, {"message": message})


def test_a_400_applies_nothing_of_the_request(ws):
    two_users(ws)
    before = state_snapshot(ws)
    seq = ws.state.next_update_seq
    r = ws.call("POST", MERGE, {"merge_updates": [OK, upd(ext("a"), {"email": E})]})
    assert (r.status, r.body) == (400, {"message": PRIORITIZATION.format(where=_where(1, "identifier_to_keep"))})
    assert state_snapshot(ws) == before
    assert ws.table("merges").collect().height == 0
    assert ws.state.next_update_seq == seq


def test_fifty_updates_are_accepted(shared_ws):
    r = shared_ws.call("POST", MERGE, {"merge_updates": [upd(ext("ghost"), ext("b"))] * 50})
    assert (r.status, r.body) == (202, {"message": "success"})


def test_prioritization_beside_another_identifier_is_ignored(ws):
    two_users(ws)
    merge(ws, upd({"external_id": "a", "prioritization": "nonsense"},
                  {"external_id": "b", "prioritization": ["identified", "unidentified"]}))
    assert ws.export_users(["external_id"]) == [{"external_id": "b"}]


# --- each identifier kind ----------------------------------------------------------------------


def test_merge_by_external_id_answers_202_and_deletes_the_merged_profile(ws):
    track_ok(ws, attributes=[{"external_id": "a", "first_name": "A", "x": 1}, {"external_id": "b"}])
    merge(ws, upd(ext("a"), ext("b")))
    assert ws.export_users(ALL_FIELDS) == [base(1, "b", first_name="A", custom_attributes={"x": 1})]


def test_merge_by_deprecated_external_id_on_both_sides(ws):
    track_ok(ws, attributes=[{"external_id": "a", "x": 1}, {"external_id": "b"}])
    r = ws.call("POST", RENAME, {"external_id_renames": [
        {"current_external_id": "a", "new_external_id": "a2"},
        {"current_external_id": "b", "new_external_id": "b2"}]})
    assert r.status == 200 and r.body["rename_errors"] == [], r
    merge(ws, upd(ext("a"), ext("b")))  # both deprecated
    assert ws.export_users(["external_id", "custom_attributes", "service_id"]) == [
        {"external_id": "b2", "custom_attributes": {"x": 1}, "service_id": service_id(1)}]


def test_merge_by_user_alias(ws):
    track_ok(ws, attributes=[
        {"user_alias": alias("src"), "_update_existing_only": False, "x": 1},
        {"user_alias": alias("dst", "web"), "_update_existing_only": False, "y": 2},
    ])
    merge(ws, upd({"user_alias": alias("src")}, {"user_alias": alias("dst", "web")}))
    assert ws.export_users(ALL_FIELDS) == [
        base(1, user_aliases=[alias("dst", "web")], custom_attributes={"x": 1, "y": 2})]


def test_merge_by_service_id(ws):
    track_ok(ws, attributes=[{"external_id": "a", "x": 1}, {"user_alias": alias("k"), "_update_existing_only": False}])
    merge(ws, upd(sid_of(0), sid_of(1)))
    assert ws.export_users(ALL_FIELDS) == [base(1, user_aliases=[alias("k")], custom_attributes={"x": 1})]


def test_merge_into_an_alias_only_profile_keeps_the_target_without_external_id(ws):
    track_ok(ws, attributes=[{"external_id": "a", "x": 1}, {"user_alias": alias("k"), "_update_existing_only": False}])
    merge(ws, upd(ext("a"), {"user_alias": alias("k")}))
    assert ws.export_users(ALL_FIELDS) == [base(1, user_aliases=[alias("k")], custom_attributes={"x": 1})]
    r = export(ws, ["external_id"], external_ids=["a"])
    assert r.body == {"message": "success", "users": [], "invalid_user_ids": ["a"]}


# --- email / phone candidates and prioritization --------------------------------------------------


def candidates(ws: Workspace, clock: Clock, kind: str, value: str) -> None:
    """Four profiles sharing `value`, updated an hour apart, oldest first, then the target:
    id-old (identified), anon-old, id-new (identified), anon-new; target `keep` (no email/phone).
    Each carries a custom attribute `who` so the target shows which one was merged."""
    for who in ("id-old", "anon-old", "id-new", "anon-new"):
        ident: dict[str, Any] = ({"external_id": who} if who.startswith("id")
                                 else {"user_alias": alias(who), "_update_existing_only": False})
        track_ok(ws, attributes=[{**ident, kind: value, "who": who}])
        clock.advance(hours=1)
    track_ok(ws, attributes=[{"external_id": "keep"}])


PRIORITIZATION_CASES = [
    (["identified"], None),
    (["unidentified"], None),
    (["identified", "most_recently_updated"], "id-new"),
    (["identified", "least_recently_updated"], "id-old"),
    (["unidentified", "most_recently_updated"], "anon-new"),
    (["unidentified", "least_recently_updated"], "anon-old"),
    (["most_recently_updated"], "anon-new"),
    (["least_recently_updated"], "id-old"),
    # rules apply in the given order: the newest is anonymous, so `identified` then keeps it
    (["most_recently_updated", "identified"], "anon-new"),
    (["least_recently_updated", "unidentified"], "id-old"),
    (["most_recently_updated", "least_recently_updated"], "anon-new"),
]


@pytest.mark.parametrize(("prioritization", "merged"), PRIORITIZATION_CASES,
                         ids=["+".join(p) for p, _ in PRIORITIZATION_CASES])
def test_email_prioritization_picks_the_candidate_or_skips_when_ambiguous(clone, prioritization, merged):
    ws = clone("email", lambda ws, clock: candidates(ws, clock, "email", E))
    merge(ws, upd(by("email", "  Shared@EXAMPLE.com ", *prioritization), ext("keep")))
    keep = one(ws, external_ids=["keep"])
    if merged is None:  # ambiguous: nothing happens
        assert ws.table("profiles").collect().height == 5
        assert "custom_attributes" not in keep and "email" not in keep
    else:
        assert ws.table("profiles").collect().height == 4
        assert keep["custom_attributes"] == {"who": merged}
        assert keep["email"] == E


PHONE_CASES = [
    (["identified"], None),
    (["identified", "most_recently_updated"], "id-new"),
    (["unidentified", "least_recently_updated"], "anon-old"),
]


@pytest.mark.parametrize(("prioritization", "merged"), PHONE_CASES,
                         ids=["+".join(p) for p, _ in PHONE_CASES])
def test_phone_prioritization_picks_the_candidate_or_skips_when_ambiguous(clone, prioritization, merged):
    ws = clone("phone", lambda ws, clock: candidates(ws, clock, "phone", P))
    merge(ws, upd(by("phone", "+1 (555) 010-0000", *prioritization), ext("keep")))
    keep = one(ws, external_ids=["keep"])
    if merged is None:
        assert ws.table("profiles").collect().height == 5
        assert "custom_attributes" not in keep
    else:
        assert keep["custom_attributes"] == {"who": merged}
        assert keep["phone"] == P


def test_identified_with_no_identified_candidate_keeps_them_all(ws):
    track_ok(ws, attributes=[{"user_alias": alias("anon"), "_update_existing_only": False, "email": E, "x": 1},
                             {"external_id": "keep"}])
    merge(ws, upd(by("email", E, "identified"), ext("keep")))
    assert ws.export_users(["external_id", "custom_attributes", "email"]) == [
        {"external_id": "keep", "custom_attributes": {"x": 1}, "email": E}]


def test_unidentified_with_no_unidentified_candidate_keeps_them_all(ws):
    track_ok(ws, attributes=[{"external_id": "a", "phone": P, "x": 1}, {"external_id": "keep"}])
    merge(ws, upd(by("phone", P, "unidentified"), ext("keep")))
    assert ws.export_users(["external_id", "custom_attributes", "phone"]) == [
        {"external_id": "keep", "custom_attributes": {"x": 1}, "phone": P}]


def test_email_or_phone_as_the_side_to_keep(ws):
    track_ok(ws, attributes=[{"external_id": "a", "x": 1}, {"external_id": "b", "email": E}])
    merge(ws, upd(ext("a"), by("email", E, "identified")))
    assert ws.export_users(["external_id", "custom_attributes"]) == [
        {"external_id": "b", "custom_attributes": {"x": 1}}]


def test_most_recently_updated_ties_on_the_clock_break_by_update_order(ws):
    # same clock: the later object of the request is the more recently updated
    track_ok(ws, attributes=[
        {"user_alias": alias("first"), "_update_existing_only": False, "email": E, "who": "first"},
        {"user_alias": alias("second"), "_update_existing_only": False, "email": E, "who": "second"},
        {"external_id": "k1"}, {"external_id": "k2"},
    ])
    merge(ws, upd(by("email", E, "most_recently_updated"), ext("k1")))
    merge(ws, upd(by("email", E, "least_recently_updated"), ext("k2")))
    assert ws.export_users(["external_id", "custom_attributes"]) == [
        {"external_id": "k1", "custom_attributes": {"who": "second"}},
        {"external_id": "k2", "custom_attributes": {"who": "first"}},
    ]


def test_most_recently_updated_compares_updated_at_before_update_order(tmp_path):
    clock = Clock()
    ws = open_ws(tmp_path, clock=clock)
    track_ok(ws, attributes=[{"user_alias": alias("late"), "_update_existing_only": False, "email": E, "who": "late"},
                             {"external_id": "keep"}])
    clock.advance(hours=-1)  # a later request, an earlier clock
    track_ok(ws, attributes=[{"user_alias": alias("early"), "_update_existing_only": False, "email": E, "who": "early"}])
    merge(ws, upd(by("email", E, "most_recently_updated"), ext("keep")))
    assert one(ws, external_ids=["keep"])["custom_attributes"] == {"who": "late"}


def test_a_merge_makes_its_target_the_most_recently_updated(ws):
    track_ok(ws, attributes=[{"external_id": "x", "email": E, "who": "x"}, {"external_id": "y", "email": E, "who": "y"},
                             {"external_id": "z"}, {"external_id": "keep"}])
    merge(ws, upd(ext("z"), ext("x")))  # same clock, later update sequence: x is now the newest
    merge(ws, upd(by("email", E, "most_recently_updated"), ext("keep")))
    assert one(ws, external_ids=["keep"])["custom_attributes"] == {"who": "x"}
    assert [u["external_id"] for u in ws.export_users(["external_id"])] == ["y", "keep"]


# --- skipped updates: nothing happens -------------------------------------------------------------


SKIPS = [
    pytest.param(upd(ext("ghost"), ext("b")), id="unresolvable-merge-side"),
    pytest.param(upd(ext("a"), ext("ghost")), id="unresolvable-keep-side"),
    pytest.param(upd({"service_id": "ffffffffffffffffffffffff"}, ext("b")), id="unknown-service-id"),
    pytest.param(upd({"user_alias": alias("nobody")}, ext("b")), id="unknown-alias"),
    pytest.param(upd(by("email", "nobody@example.com", "identified"), ext("b")), id="no-email-candidate"),
    pytest.param(upd(ext("a"), by("phone", "+15559999999", "unidentified")), id="no-phone-candidate"),
    pytest.param(upd(ext("a"), sid_of(0)), id="same-user-external-id-and-service-id"),
    pytest.param(upd({"user_alias": alias("al")}, ext("a")), id="same-user-alias-and-external-id"),
    pytest.param(upd(ext("a"), ext("a")), id="same-identifier"),
    pytest.param(upd(by("email", E, "most_recently_updated"), ext("a")), id="same-user-email"),
    pytest.param(upd(by("email", E, "identified"), ext("a")), id="ambiguous-email"),
]


def skip_users(ws: Workspace, clock: Clock) -> None:
    track_ok(ws, attributes=[
        {"external_id": "a", "email": E, "first_name": "A", "x": 1, "push_tokens": [{"app_id": "app", "token": "ta"}]},
        {"external_id": "b", "email": E, "y": 2},
    ], events=[event(external_id="a")], purchases=[purchase(external_id="a")])
    r = ws.call("POST", "/users/alias/new", {"user_aliases": [{**alias("al"), "external_id": "a"}]})
    assert r.status == 200, r


def test_a_skipped_update_changes_nothing(clone):
    # each update a request of its own, the requests one batch (one commit, as calls one by one)
    ws = clone("skips", skip_users)
    before = state_snapshot(ws)
    rs = ws.apply([post_merge(update.values[0]) for update in SKIPS])
    assert [(r.status, r.body) for r in rs] == [(202, {"message": "success"})] * len(SKIPS)
    assert state_snapshot(ws) == before


def test_a_skipped_update_still_takes_its_update_sequence_number(ws):
    two_users(ws)
    seq = ws.state.next_update_seq
    merge(ws, upd(ext("ghost"), ext("b")), upd(ext("a"), ext("b")))
    assert profile_row(ws, 1)["update_seq"] == seq + 1
    assert ws.state.next_update_seq == seq + 2


# --- what a merge copies ------------------------------------------------------------------------


def field_pairs(ws: Workspace, clock: Clock) -> None:
    """For each copied field: a-<field> (profile 2i) holding it, b-<field> (profile 2i+1) empty."""
    objects: list[dict[str, Any]] = []
    for name, value in COPIED.items():
        objects += [{"external_id": f"a-{name}", name: value}, {"external_id": f"b-{name}"}]
    track_ok(ws, attributes=objects)


def test_each_listed_profile_field_is_copied_when_the_target_has_none(clone):
    # one merge per field, each its own request, the requests one batch (one commit)
    ws = clone("fields", field_pairs)
    rs = ws.apply([post_merge(upd(ext(f"a-{name}"), ext(f"b-{name}"))) for name in COPIED])
    assert [(r.status, r.body) for r in rs] == [(202, {"message": "success"})] * len(COPIED)
    for i, name in enumerate(COPIED):
        assert one(ws, external_ids=[f"b-{name}"]) == base(2 * i + 1, f"b-{name}", **{name: COPIED[name]})
        r = export(ws, ["external_id"], external_ids=[f"a-{name}"])
        assert r.body == {"message": "success", "users": [], "invalid_user_ids": [f"a-{name}"]}
    assert ws.table("profiles").collect().height == len(COPIED)
    assert profile_row(ws, 2 * list(COPIED).index("language") + 1)["language_explicit"] is True  # its mark


def test_all_ten_fields_are_copied_at_once(ws):
    track_ok(ws, attributes=[{"external_id": "a", **COPIED}, {"external_id": "b"}])
    merge(ws, upd(ext("a"), ext("b")))
    assert ws.export_users(ALL_FIELDS) == [base(1, "b", **COPIED)]


def test_the_target_keeps_its_own_values(ws):
    track_ok(ws, attributes=[{"external_id": "a", **COPIED}, {"external_id": "b", **TARGETS}])
    merge(ws, upd(ext("a"), ext("b")))
    assert ws.export_users(ALL_FIELDS) == [base(1, "b", **TARGETS)]


NOT_COPIED = {
    "email_subscribe": "opted_in", "push_subscribe": "subscribed", "attributed_campaign": "camp",
    "attributed_source": "src", "attributed_adgroup": "grp", "attributed_ad": "ad",
    "last_coordinates": [2.35, 48.85],
}


def test_fields_outside_the_list_are_not_copied(ws):
    track_ok(ws, attributes=[{"external_id": "a", **NOT_COPIED}, {"external_id": "b"}])
    merge(ws, upd(ext("a"), ext("b")))
    assert ws.export_users(ALL_FIELDS) == [base(1, "b")]


def test_fields_outside_the_list_stay_the_targets(ws):
    mine = {"email_subscribe": "unsubscribed", "push_subscribe": "unsubscribed", "attributed_campaign": "mine",
            "last_coordinates": [10.0, 20.0]}
    track_ok(ws, attributes=[{"external_id": "a", **NOT_COPIED}, {"external_id": "b", **mine}])
    merge(ws, upd(ext("a"), ext("b")))
    assert ws.export_users(ALL_FIELDS) == [base(1, "b", **mine)]


def test_custom_attributes_the_target_lacks_are_copied(ws):
    track_ok(ws, attributes=[
        {"external_id": "a", "shared": "from-a", "only_a": [1, 2], "obj": {"k": True}},
        {"external_id": "b", "shared": "from-b", "only_b": 3},
    ])
    merge(ws, upd(ext("a"), ext("b")))
    assert one(ws, external_ids=["b"])["custom_attributes"] == {
        "shared": "from-b", "only_a": [1, 2], "obj": {"k": True}, "only_b": 3}


def test_events_and_purchases_move_with_summed_summaries(ws):
    d = timedelta(days=1)
    track_ok(ws, attributes=[{"external_id": "a"}, {"external_id": "b"}],
             events=[event("played", NOW - 3 * d, external_id="a"), event("played", NOW - d, external_id="a"),
                     event("opened", NOW - 2 * d, external_id="a"),
                     event("played", NOW - 2 * d, external_id="b"), event("played", NOW, external_id="b")],
             purchases=[purchase("sku", 10.0, NOW - 5 * d, external_id="a", quantity=2),
                        purchase("gem", 1.5, NOW, external_id="a"),
                        purchase("sku", 5.0, NOW - d, external_id="b")])
    merge(ws, upd(ext("a"), ext("b")))
    assert one(ws, external_ids=["b"]) == base(
        1, "b",
        custom_events=[
            {"name": "opened", "first": ts(NOW - 2 * d), "last": ts(NOW - 2 * d), "count": 1},
            {"name": "played", "first": ts(NOW - 3 * d), "last": ts(NOW), "count": 4},
        ],
        purchases=[
            {"name": "gem", "first": ts(NOW), "last": ts(NOW), "count": 1},
            {"name": "sku", "first": ts(NOW - 5 * d), "last": ts(NOW - d), "count": 2},
        ],
        total_revenue=26.5,
    )
    assert set(ws.table("events").collect()["service_id"]) == {service_id(1)}
    assert set(ws.table("purchases").collect()["service_id"]) == {service_id(1)}
    redirects = ws.table("redirects").collect().select("service_id", "into").to_dicts()
    assert redirects == [{"service_id": service_id(0), "into": service_id(1)}]


def test_push_tokens_move_and_subscription_groups_of_the_merged_profile_are_dropped(ws):
    track_ok(ws, attributes=[
        {"external_id": "a", "push_tokens": [{"app_id": "app", "token": "ta", "device_id": "da"}],
         "subscription_groups": [{"subscription_group_id": "g1", "subscription_state": "subscribed"}]},
        {"external_id": "b", "push_tokens": [{"app_id": "app", "token": "tb", "device_id": "db"}],
         "subscription_groups": [{"subscription_group_id": "g2", "subscription_state": "unsubscribed"}]},
    ])
    merge(ws, upd(ext("a"), ext("b")))
    b = one(ws, external_ids=["b"])
    assert sorted(b["push_tokens"], key=lambda t: t["token"]) == [
        {"app": "app", "token": "ta", "device_id": "da", "notifications_enabled": True}, {"app": "app", "token": "tb", "device_id": "db", "notifications_enabled": True}]
    assert sorted(d["device_id"] for d in b["devices"]) == ["da", "db"]
    assert ws.table("push_tokens").collect()["service_id"].to_list() == [service_id(1)] * 2
    assert group_states(ws, "g1") == {}
    assert group_states(ws, "g2") == {service_id(1): "unsubscribed"}


# --- the merged profile is gone ----------------------------------------------------------------------


def test_the_merged_profile_goes_with_its_external_ids_and_aliases(ws):
    track_ok(ws, attributes=[
        {"external_id": "a", "x": 1, "subscription_groups": [{"subscription_group_id": "g", "subscription_state": "subscribed"}]},
        {"external_id": "b"}])
    r = ws.call("POST", RENAME, {"external_id_renames": [{"current_external_id": "a", "new_external_id": "a2"}]})
    assert r.status == 200, r
    r = ws.call("POST", "/users/alias/new", {"user_aliases": [{**alias("al"), "external_id": "a2"}]})
    assert r.status == 200, r
    merge(ws, upd(ext("a2"), ext("b")))
    for ids, invalid in ((dict(external_ids=["a"]), "a"), (dict(external_ids=["a2"]), "a2"),
                         (dict(user_aliases=[alias("al")]), "al"), (dict(service_id=service_id(0)), service_id(0))):
        r = export(ws, ["external_id"], **ids)
        assert r.body == {"message": "success", "users": [], "invalid_user_ids": [invalid]}, ids
    for table in ("profiles", "external_ids", "aliases", "attributes", "subscriptions"):
        assert rows_of(ws, table, 0) == [], table
    assert ws.export_users(ALL_FIELDS) == [base(1, "b", custom_attributes={"x": 1})]


def test_the_merged_service_id_never_resolves_again(ws):
    two_users(ws)
    merge(ws, upd(ext("a"), ext("b")))
    r = track(ws, attributes=[{"service_id": service_id(0), "x": 1}])
    assert errors(r) == [{"type": ERR_UNKNOWN_SERVICE_ID, "input_array": "attributes", "index": 0}]
    merge(ws, upd(sid_of(0), ext("b")))  # unresolvable: skipped
    assert ws.export_users(["external_id", "custom_attributes"]) == [{"external_id": "b"}]


def test_track_to_the_merged_external_id_creates_a_new_profile_with_a_new_service_id(ws):
    track_ok(ws, attributes=[{"external_id": "a", "x": 1}, {"external_id": "b"}])
    merge(ws, upd(ext("a"), ext("b")))
    track_ok(ws, attributes=[{"external_id": "a", "y": 2}])
    assert ws.export_users(ALL_FIELDS) == [
        base(1, "b", custom_attributes={"x": 1}),
        base(2, "a", custom_attributes={"y": 2}),
    ]


# --- chains -------------------------------------------------------------------------------------------


def chain_users(ws: Workspace) -> None:
    track_ok(ws, attributes=[
        {"external_id": "a", "first_name": "A", "last_name": "LA", "who": "a", "only_a": 1},
        {"external_id": "b", "first_name": "B", "who": "b"},
        {"external_id": "c", "home_city": "C-town"},
    ], events=[event("e", external_id="a"), event("e", external_id="b"), event("e", external_id="c")])


CHAINED_C = base(
    2, "c", first_name="B", last_name="LA", home_city="C-town",
    custom_attributes={"who": "b", "only_a": 1},
    custom_events=[{"name": "e", "first": ts(NOW), "last": ts(NOW), "count": 3}],
)


def test_chain_in_one_request_gathers_everything_into_the_last_target(ws):
    chain_users(ws)
    merge(ws, upd(ext("a"), ext("b")), upd(ext("b"), ext("c")))
    assert ws.export_users(ALL_FIELDS) == [CHAINED_C]


def test_chain_across_requests_of_one_batch(ws):
    chain_users(ws)
    rs = ws.apply([post_merge(upd(ext("a"), ext("b"))), post_merge(upd(ext("b"), ext("c")))])
    assert [(r.status, r.body) for r in rs] == [(202, {"message": "success"})] * 2
    assert ws.export_users(ALL_FIELDS) == [CHAINED_C]


def test_chain_across_calls(ws):
    chain_users(ws)
    merge(ws, upd(ext("a"), ext("b")))
    merge(ws, upd(ext("b"), ext("c")))
    assert ws.export_users(ALL_FIELDS) == [CHAINED_C]


def test_a_field_comes_from_the_first_profile_in_merge_order(ws):
    track_ok(ws, attributes=[
        {"external_id": "x", "last_name": "X", "who": "x"},
        {"external_id": "a", "last_name": "A", "first_name": "A", "who": "a"},
        {"external_id": "b"},
        {"external_id": "c"},
    ])
    # x into c first, then a into b, then b (carrying a's values) into c: x's values win
    merge(ws, upd(ext("x"), ext("c")), upd(ext("a"), ext("b")), upd(ext("b"), ext("c")))
    assert ws.export_users(ALL_FIELDS) == [
        base(3, "c", last_name="X", first_name="A", custom_attributes={"who": "x"})]


def test_an_identifier_of_an_already_merged_profile_is_unresolvable(ws):
    track_ok(ws, attributes=[{"external_id": "a", "x": 1}, {"external_id": "b"}, {"external_id": "c"}])
    merge(ws, upd(ext("a"), ext("b")), upd(ext("a"), ext("c")), upd(ext("c"), sid_of(0)))
    assert ws.export_users(["external_id", "custom_attributes"]) == [
        {"external_id": "b", "custom_attributes": {"x": 1}}, {"external_id": "c"}]


# --- time -----------------------------------------------------------------------------------------------


def test_the_target_takes_the_clock_and_the_updates_sequence_number(tmp_path):
    clock = Clock()
    ws = open_ws(tmp_path, clock=clock)
    track_ok(ws, attributes=[{"external_id": "a"}, {"external_id": "b"}, {"external_id": "c"}])
    clock.advance(hours=2)
    seq = ws.state.next_update_seq
    merge(ws, upd(ext("a"), ext("b")))
    row = profile_row(ws, 1)
    assert (row["updated_at"], row["update_seq"]) == (NOW + timedelta(hours=2), seq)
    assert row["created_at"] == NOW
    untouched = profile_row(ws, 2)
    assert untouched["updated_at"] == NOW


# --- batch-exact ---------------------------------------------------------------------------------------


def assert_batch_equals_calls(tmp_path, requests: list[dict[str, Any]]) -> tuple[list[Any], Workspace]:
    """Apply `requests` as one batch and one by one on fresh stores; both must agree."""
    batch, batch_ws = apply_and_call(tmp_path, requests)
    return batch, batch_ws




def test_batch_merge_then_track_to_the_merged_id_equals_calls(tmp_path):
    exp = post(EXPORT, {"external_ids": ["a", "b", "c"], "fields_to_export": ALL_FIELDS})
    rs, ws = assert_batch_equals_calls(tmp_path, [
        post(TRACK, {"attributes": [{"external_id": "a", "x": 1, "email": E}, {"external_id": "b"},
                                    {"external_id": "c"}]}),
        # a into b gives b the email; the email then resolves to b, which goes into c
        post_merge(upd(ext("a"), ext("b")), upd(by("email", E, "identified"), ext("c"))),
        post(TRACK, {"attributes": [{"external_id": "a", "y": 2}], "events": [event(external_id="a")]}),
        exp,
        post_merge(upd(ext("a"), ext("c")), upd(ext("b"), ext("c"))),
        exp,
    ])
    assert [r.status for r in rs] == [201, 202, 201, 200, 202, 200]
    assert rs[5].body == {"message": "success", "users": [base(
        2, "c", email=E, custom_attributes={"x": 1, "y": 2},
        custom_events=[{"name": "played", "first": ts(NOW), "last": ts(NOW), "count": 1}])],
        "invalid_user_ids": ["a", "b"]}
    assert ws.export_users(["external_id", "service_id"]) == [{"external_id": "c", "service_id": service_id(2)}]
