"""/users/track: email subscription and groups (same-email propagation), push tokens, push import."""

from __future__ import annotations

import pytest
from tests.helpers import (
    Clock,
    alias,
    exists,
    export_alias,
    export_one,
    export_users,
    field,
    group_states,
    only_error,
    open_ws,
    profile_count,
    service_id,
    track,
    track_ok,
)

from engagelake.rules.messages import (
    ERR_MISSING_IDENTIFIER,
    ERR_PUSH_TOKEN_IMPORT,
    ERR_PUSH_TOKENS,
    ERR_SUBSCRIPTION_GROUPS,
)

E = "same@example.com"
OTHER = "other@example.com"



def token(tok: str, device: str | None = None, app: str = "app") -> dict[str, str]:
    return {"app_id": app, "token": tok, **({"device_id": device} if device else {})}


def exported(tok: str, device: str | None = None, app: str = "app") -> dict[str, object]:
    return {"app": app, "token": tok, **({"device_id": device} if device else {}), "notifications_enabled": True}


def group(gid: str, state: str) -> dict[str, str]:
    return {"subscription_group_id": gid, "subscription_state": state}


def same_email_profiles(ws) -> None:
    """x1 (sid 0), x2 (sid 1) and alias a1 (sid 2) share E; y (sid 3) has another email."""
    track_ok(
        ws,
        attributes=[
            {"external_id": "x1", "email": E},
            {"external_id": "x2", "email": "Same@Example.com"},
            {"user_alias": alias("a1"), "_update_existing_only": False, "email": E},
            {"external_id": "y", "email": OTHER},
        ],
    )


def email_states(ws) -> dict[str, str | None]:
    states = {x: field(ws, x, "email_subscribe") for x in ("x1", "x2", "y")}
    states["a1"] = export_alias(ws, alias("a1"), ["email_subscribe"]).get("email_subscribe")
    return states


# --- email_subscribe ------------------------------------------------------------------------------


def test_email_subscribe_by_external_id_reaches_every_profile_with_the_email(ws):
    same_email_profiles(ws)
    track_ok(ws, attributes=[{"external_id": "x1", "email_subscribe": "opted_in"}])
    assert email_states(ws) == {"x1": "opted_in", "x2": "opted_in", "a1": "opted_in", "y": None}
    track_ok(ws, attributes=[{"external_id": "x2", "email_subscribe": "unsubscribed"}])
    assert email_states(ws) == {
        "x1": "unsubscribed", "x2": "unsubscribed", "a1": "unsubscribed", "y": None,
    }


def test_email_subscribe_by_alias_changes_only_that_profile(ws):
    same_email_profiles(ws)
    track_ok(ws, attributes=[{"user_alias": alias("a1"), "email_subscribe": "unsubscribed"}])
    assert email_states(ws) == {"x1": None, "x2": None, "a1": "unsubscribed", "y": None}


def test_email_subscribe_by_email_changes_only_the_chosen_profile(tmp_path):
    clock = Clock()
    ws = open_ws(tmp_path, clock=clock)
    same_email_profiles(ws)
    clock.advance(minutes=1)
    track_ok(ws, attributes=[{"external_id": "x1", "touch": 1}])
    clock.advance(minutes=1)
    track_ok(ws, attributes=[{"email": E, "email_subscribe": "unsubscribed"}])
    assert email_states(ws) == {"x1": "unsubscribed", "x2": None, "a1": None, "y": None}


def test_email_subscribe_by_service_id_does_not_propagate(ws):
    same_email_profiles(ws)
    track_ok(ws, attributes=[{"service_id": service_id(1), "email_subscribe": "unsubscribed"}])
    assert email_states(ws) == {"x1": None, "x2": "unsubscribed", "a1": None, "y": None}


def test_propagation_uses_the_email_set_in_the_same_object(ws):
    same_email_profiles(ws)
    track_ok(
        ws, attributes=[{"external_id": "x1", "email": OTHER, "email_subscribe": "unsubscribed"}]
    )
    assert email_states(ws) == {"x1": "unsubscribed", "x2": None, "a1": None, "y": "unsubscribed"}
    assert field(ws, "x1", "email") == OTHER


def test_propagation_without_email_changes_only_the_user(ws):
    track_ok(ws, attributes=[{"external_id": "x1"}, {"external_id": "x2"}])
    track_ok(ws, attributes=[{"external_id": "x1", "email_subscribe": "opted_in"}])
    assert field(ws, "x1", "email_subscribe") == "opted_in"
    assert field(ws, "x2", "email_subscribe") is None


def test_propagation_reaches_profiles_created_earlier_in_the_same_request(ws):
    track_ok(
        ws,
        attributes=[
            {"email": E, "first_name": "Only email"},
            {"external_id": "x1", "email": E, "email_subscribe": "unsubscribed"},
        ],
    )
    assert export_users(ws, ["external_id", "email_subscribe"], email_address=E) == [
        {"email_subscribe": "unsubscribed"},
        {"external_id": "x1", "email_subscribe": "unsubscribed"},
    ]


# --- subscription groups ----------------------------------------------------------------------------


def test_subscription_groups_by_external_id_reach_every_profile_with_the_email(ws):
    same_email_profiles(ws)
    track_ok(
        ws,
        attributes=[
            {"external_id": "x1", "subscription_groups": [group("g1", "subscribed"), group("g2", "unsubscribed")]}
        ],
    )
    same = {service_id(0), service_id(1), service_id(2)}
    assert group_states(ws, "g1") == dict.fromkeys(same, "subscribed")
    assert group_states(ws, "g2") == dict.fromkeys(same, "unsubscribed")
    track_ok(ws, attributes=[{"external_id": "x2", "subscription_groups": [group("g1", "unsubscribed")]}])
    assert group_states(ws, "g1") == dict.fromkeys(same, "unsubscribed")
    assert group_states(ws, "g2") == dict.fromkeys(same, "unsubscribed")


def test_subscription_groups_by_email_or_alias_do_not_propagate(tmp_path):
    clock = Clock()
    ws = open_ws(tmp_path, clock=clock)
    same_email_profiles(ws)
    track_ok(ws, attributes=[{"user_alias": alias("a1"), "subscription_groups": [group("g1", "subscribed")]}])
    assert group_states(ws, "g1") == {service_id(2): "subscribed"}
    clock.advance(minutes=1)
    track_ok(ws, attributes=[{"external_id": "x1", "touch": 1}])
    clock.advance(minutes=1)
    track_ok(ws, attributes=[{"email": E, "subscription_groups": [group("g2", "unsubscribed")]}])
    assert group_states(ws, "g2") == {service_id(0): "unsubscribed"}


@pytest.mark.parametrize(
    "groups",
    [
        "g1",
        {"subscription_group_id": "g1", "subscription_state": "subscribed"},
        [group("g1", "opted_in")],
        [group("g1", "SUBSCRIBED")],
        [group("", "subscribed")],
        [{"subscription_group_id": "g1"}],
        [{"subscription_state": "subscribed"}],
        [group("g1", "subscribed"), "g2"],
        [{"subscription_group_id": 5, "subscription_state": "subscribed"}],
    ],
)
def test_invalid_subscription_groups(ws, groups):
    only_error(
        track(ws, attributes=[{"external_id": "x1", "a": 1, "subscription_groups": groups}]),
        ERR_SUBSCRIPTION_GROUPS,
    )
    assert not exists(ws, "x1")
    assert ws.table("subscriptions").collect().height == 0


# --- push tokens ---------------------------------------------------------------------------------------


def test_push_tokens_are_stored_and_exported(ws):
    track_ok(ws, attributes=[{"external_id": "u1", "push_tokens": [token("T1", "d1"), token("T2")]}])
    assert export_one(ws, "u1", ["push_tokens", "devices"]) == {
        "push_tokens": [exported("T1", "d1"), exported("T2")],
        "devices": [{"device_id": "d1"}],
    }


def test_push_token_upsert_by_app_and_token(ws):
    track_ok(ws, attributes=[{"external_id": "u1", "push_tokens": [token("T1", "d1")]}])
    track_ok(ws, attributes=[{"external_id": "u1", "push_tokens": [token("T1", "d9"), token("T1", app="web")]}])
    assert field(ws, "u1", "push_tokens") == [exported("T1", "d9"), exported("T1", app="web")]
    # the upserted row loses its device_id (absent -> null); the position of a replaced row is
    # not pinned down by the documents, so compare without order
    track_ok(ws, attributes=[{"external_id": "u1", "push_tokens": [token("T1")]}])
    tokens = field(ws, "u1", "push_tokens")
    assert sorted(tokens, key=lambda t: t["app"]) == [exported("T1"), exported("T1", app="web")]
    assert ws.table("push_tokens").collect().height == 2


def test_empty_push_tokens_does_nothing(ws):
    track_ok(ws, attributes=[{"external_id": "u1", "push_tokens": [token("T1", "d1")]}])
    track_ok(ws, attributes=[{"external_id": "u1", "push_tokens": []}])
    assert field(ws, "u1", "push_tokens") == [exported("T1", "d1")]


def test_a_push_token_has_one_owner(ws):
    track_ok(ws, attributes=[{"external_id": "u1", "push_tokens": [token("T1", "d1"), token("T2", "d2")]}])
    track_ok(ws, attributes=[{"external_id": "u2", "push_tokens": [token("T1", "d1")]}])
    assert field(ws, "u1", "push_tokens") == [exported("T2", "d2")]
    assert field(ws, "u2", "push_tokens") == [exported("T1", "d1")]
    assert export_users(ws, ["external_id", "push_tokens"], device_id="d1") == [
        {"external_id": "u2", "push_tokens": [exported("T1", "d1")]}
    ]
    assert ws.table("push_tokens").collect().height == 2


def test_a_token_moving_twice_in_one_request_ends_with_the_last_owner(ws):
    track_ok(
        ws,
        attributes=[
            {"external_id": "u1", "push_tokens": [token("T1", "d1")]},
            {"external_id": "u2", "push_tokens": [token("T1", "d1")]},
            {"external_id": "u3", "push_tokens": [token("T1", "d1")]},
            {"external_id": "u2", "a": 1},
        ],
    )
    assert export_users(ws, ["external_id"], device_id="d1") == [{"external_id": "u3"}]
    assert field(ws, "u1", "push_tokens") is None
    assert field(ws, "u2", "push_tokens") is None


@pytest.mark.parametrize(
    "tokens",
    [
        "T1",
        token("T1"),
        [{"token": "T1"}],
        [{"app_id": "app"}],
        [{"app_id": "", "token": "T1"}],
        [{"app_id": "app", "token": ""}],
        [{"app_id": "app", "token": 5}],
        [{"app_id": "app", "token": "T1", "device_id": 5}],
        [token("T2"), "T1"],
    ],
)
def test_invalid_push_tokens(ws, tokens):
    only_error(track(ws, attributes=[{"external_id": "u1", "a": 1, "push_tokens": tokens}]), ERR_PUSH_TOKENS)
    assert not exists(ws, "u1")
    assert ws.table("push_tokens").collect().height == 0


# --- push_token_import -----------------------------------------------------------------------------


def import_tokens(*tokens: dict[str, str], **extra) -> dict:
    return {"push_token_import": True, "push_tokens": list(tokens), **extra}


def test_push_token_import_creates_one_anonymous_profile_per_new_token(ws):
    r = track(ws, attributes=[import_tokens(token("T1", "d1"), token("T2", "d2"))])
    assert r.body == {"message": "success", "attributes_processed": 1}
    assert profile_count(ws) == 2
    fields = ["external_id", "user_aliases", "service_id", "push_tokens", "email"]
    assert export_users(ws, fields, device_id="d1") == [
        {"service_id": service_id(0), "push_tokens": [exported("T1", "d1")]}
    ]
    assert export_users(ws, fields, device_id="d2") == [
        {"service_id": service_id(1), "push_tokens": [exported("T2", "d2")]}
    ]


def test_push_token_import_ignores_known_tokens(ws):
    track_ok(ws, attributes=[import_tokens(token("T1", "d1"))])
    track_ok(ws, attributes=[{"external_id": "u1", "push_tokens": [token("T2", "d2")]}])
    r = track(ws, attributes=[import_tokens(token("T1", "d1"), token("T2", "d2"), token("T3", "d3"))])
    assert r.body == {"message": "success", "attributes_processed": 1}
    assert profile_count(ws) == 3
    assert export_users(ws, ["service_id", "external_id"], device_id="d1") == [{"service_id": service_id(0)}]
    assert export_users(ws, ["service_id", "external_id"], device_id="d2") == [
        {"service_id": service_id(1), "external_id": "u1"}
    ]
    assert export_users(ws, ["service_id"], device_id="d3") == [{"service_id": service_id(2)}]


def test_push_token_import_same_token_twice_in_one_object_creates_once(ws):
    track_ok(ws, attributes=[import_tokens(token("T1", "d1"), token("T1", "d1"))])
    assert profile_count(ws) == 1


def test_push_token_import_ignores_identifiers_and_attributes(ws):
    r = track(
        ws,
        attributes=[
            import_tokens(
                token("T1", "d1"),
                external_id="imported",
                email="imp@example.com",
                first_name="Imp",
                score=3,
                dob="not a date",
            )
        ],
    )
    assert r.body == {"message": "success", "attributes_processed": 1}
    assert not exists(ws, "imported")
    assert export_users(ws, ["external_id", "email", "first_name", "custom_attributes", "dob"],
                        device_id="d1") == [{}]


def test_push_token_import_needs_no_identifier_but_valid_tokens(ws):
    only_error(track(ws, attributes=[import_tokens(token("T1"), {"token": "T2"})]), ERR_PUSH_TOKENS)
    assert profile_count(ws) == 0


@pytest.mark.parametrize("flag", ["true", 1, 0, [True]])
def test_push_token_import_must_be_boolean(ws, flag):
    r = track(
        ws,
        attributes=[{"push_token_import": flag, "external_id": "u1", "push_tokens": [token("T1", "d1")]}],
    )
    only_error(r, ERR_PUSH_TOKEN_IMPORT)
    assert profile_count(ws) == 0


def test_push_token_import_false_is_a_normal_object(ws):
    r = track(ws, attributes=[{"push_token_import": False, "push_tokens": [token("T1", "d1")]}])
    only_error(r, ERR_MISSING_IDENTIFIER)
    track_ok(ws, attributes=[{"push_token_import": False, "external_id": "u1", "push_tokens": [token("T1", "d1")]}])
    assert export_users(ws, ["external_id"], device_id="d1") == [{"external_id": "u1"}]
    assert profile_count(ws) == 1


def test_imported_token_later_given_to_a_user_moves(ws):
    track_ok(ws, attributes=[import_tokens(token("T1", "d1"))])
    track_ok(ws, attributes=[{"external_id": "u1", "push_tokens": [token("T1", "d1")]}])
    assert export_users(ws, ["external_id", "push_tokens"], device_id="d1") == [
        {"external_id": "u1", "push_tokens": [exported("T1", "d1")]}
    ]
