"""Preference centers: create/update/get/list, rendering every template tag for a user, and
submitting the form with a signed, expiring token (end to end through `Workspace.call`)."""

from __future__ import annotations

import base64
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import polars as pl
import pytest
from polars.testing import assert_frame_equal
from tests.helpers import (
    NOW,
    TEST_LINK_KEY,
    Clock,
    copy_of,
    fixed_link_keys,
    group_states,
    open_ws,
    service_id,
    track_ok,
    ts,
)

from engagelake import Workspace
from engagelake.link_keys import LinkKey, millis
from engagelake.resources import preference_centers as P
from engagelake.rules.state import Changes

BASE = "/preference_center/v1"
CENTER_ID = "342203dd-f39a-4b50-82ad-a96db5d6f163"  # the ID of "main" in a store with seed "t"
PAGE = (
    "<html><head></head><body><p>{{${email_address}}}</p>"
    '<form action="{{ preference_center_submit_url }}" method="post">'
    '<input type="checkbox" name="{% form_field_name :subscription_group g1 %}" value="subscribed"'
    '{% if {{subscribed_state.${g1}}} == "subscribed" %} checked{% endif %}>'
    "g1={{subscribed_state.${g1}}} g2={{subscribed_state.${g2}}}"
    " global={{subscribed_state.${email_global}}}"
    '<select name="{% form_field_name :email_global_state %}"></select>'
    '<input name="{% form_field_name :subscription_group g2 %}">'
    "<script>let x = `${y}`;</script></form></body></html>"
)
CONFIRM = "<p>Saved for {{${email_address}}}: {{subscribed_state.${email_global}}}, g1={{subscribed_state.${g1}}}</p>"
HEAD = "<title>Email preferences</title>"


def center_body(name: str = "main", **extra: Any) -> dict[str, Any]:
    return {
        "name": name, "preference_center_title": "Email preferences",
        "preference_center_page_html": PAGE, "confirmation_page_html": CONFIRM, **extra,
    }


def page_for(email: str, url: str, g1: str = "unsubscribed", g2: str = "unsubscribed",
             email_global: str = "subscribed") -> str:
    checked = " checked" if g1 == "subscribed" else ""
    return (
        f"<html><head>{HEAD}</head><body><p>{email}</p>"
        f'<form action="{url}" method="post">'
        f'<input type="checkbox" name="subscription_group:g1" value="subscribed"{checked}>'
        f"g1={g1} g2={g2} global={email_global}"
        '<select name="email_global_state"></select>'
        '<input name="subscription_group:g2">'
        "<script>let x = `${y}`;</script></form></body></html>"
    )


def submit_url_of(page: str) -> str:
    match = re.search(r'action="([^"]+)"', page)
    assert match is not None, page
    return match.group(1)


def token_of(url: str) -> str:
    return parse_qs(urlsplit(url).query)["token"][0]


def with_token(center_id: str, token: str) -> str:
    return f"{BASE}/{center_id}/submit?token={token}"


def b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


@pytest.fixture(scope="module", autouse=True)
def link_keys(tmp_path_factory) -> Iterator[Path]:
    """Every store of this module signs with TEST_LINK_KEY: the tests write the URLs they expect."""
    yield from fixed_link_keys(tmp_path_factory.mktemp("link-keys"))


def expected_url(center_id: str, sid: str, clock_reading=NOW) -> str:
    token = P.sign_token(TEST_LINK_KEY, center_id, sid, clock_reading, clock_reading + P.TOKEN_LIFETIME)
    return with_token(center_id, token)


def create(ws: Workspace, name: str = "main", **extra: Any) -> str:
    r = ws.call("POST", BASE, center_body(name, **extra))
    assert r.status == 200, r
    return r.body["preference_center_api_id"]


def render(ws: Workspace, center_id: str, **query: str) -> Any:
    return ws.call("GET", f"{BASE}/{center_id}/page", query=query)


def email_subscribe(ws: Workspace, external_id: str) -> str | None:
    r = ws.call("POST", "/users/export/ids", {"external_ids": [external_id], "fields_to_export": ["email_subscribe"]})
    assert r.status == 200, r
    return r.body["users"][0].get("email_subscribe")


def snapshot(ws: Workspace) -> dict[str, pl.DataFrame]:
    return {name: ws.table(name).collect() for name in ("profiles", "subscriptions", "preference_centers",
                                              "preference_center_submits")}


def assert_unchanged(ws: Workspace, before: dict[str, pl.DataFrame]) -> None:
    for name, frame in before.items():
        assert_frame_equal(ws.table(name).collect(), frame)



@pytest.fixture
def users(tmp_path):
    """u1 (sid 0) and u2 (sid 1) share an email; u3 (sid 2) has its own (a copy of a store built once)."""
    return copy_of(tmp_path, _users)


def _users(ws: Workspace) -> None:
    track_ok(ws, attributes=[
        {"external_id": "u1", "email": "same@x.com"},
        {"external_id": "u2", "email": "same@x.com"},
        {"external_id": "u3", "email": "three@x.com"},
    ])


# --- create, get, list, update ----------------------------------------------------------------


def test_create_get_list_update_shapes(tmp_path):
    clock = Clock()
    ws = open_ws(tmp_path, clock=clock)
    r = ws.call("POST", BASE, center_body())
    assert (r.status, r.body) == (200, {
        "preference_center_api_id": CENTER_ID, "liquid_tag": "{{preference_center.${main}}}",
        "created_at": ts(NOW), "message": "success",
    })
    got = ws.call("GET", f"{BASE}/{CENTER_ID}")
    assert (got.status, got.body) == (200, {
        "name": "main", "preference_center_api_id": CENTER_ID, "created_at": ts(NOW), "updated_at": ts(NOW),
        "preference_center_title": "Email preferences", "preference_center_page_html": PAGE,
        "confirmation_page_html": CONFIRM, "state": "active",
    })
    later = clock.advance(hours=1)
    options = {"meta-viewport-content": "width=device-width",
               "links-tags": [{"rel": "icon", "type": "image/png", "sizes": "32x32", "href": "/i.png"},
                              {"rel": "apple-touch-icon", "type": "mask-icon", "color": "#fff", "href": "/m.svg"}]}
    r = ws.call("PUT", f"{BASE}/{CENTER_ID}", {"name": "renamed", "state": "draft", "options": options})
    assert (r.status, r.body) == (200, {
        "preference_center_api_id": CENTER_ID, "created_at": ts(NOW), "updated_at": ts(later), "message": "success",
    })
    got = ws.call("GET", f"{BASE}/{CENTER_ID}")
    assert got.body == {
        "name": "renamed", "preference_center_api_id": CENTER_ID, "created_at": ts(NOW), "updated_at": ts(later),
        "preference_center_title": "Email preferences", "preference_center_page_html": PAGE,
        "confirmation_page_html": CONFIRM, "state": "draft", "options": options,
    }
    second = create(ws, "second", state="draft")
    listed = ws.call("GET", f"{BASE}/list")
    assert (listed.status, listed.body) == (200, {"message": "success", "preference_centers": [
        {"name": "renamed", "preference_center_api_id": CENTER_ID, "created_at": ts(NOW),
         "updated_at": ts(later), "state": "draft"},
        {"name": "second", "preference_center_api_id": second, "created_at": ts(later),
         "updated_at": ts(later), "state": "draft"},
    ]})


def test_list_is_empty_in_a_new_store(ws):
    r = ws.call("GET", f"{BASE}/list")
    assert (r.status, r.body) == (200, {"message": "success", "preference_centers": []})


def test_ids_are_uuids_from_seed_and_name(tmp_path):
    same = open_ws(tmp_path, "a")
    other_seed = open_ws(tmp_path, "b", seed="other")
    assert create(same, "main") == CENTER_ID
    other = create(other_seed, "main")
    assert other != CENTER_ID and re.fullmatch(r"[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}", other)
    # renaming frees the name; a new center with it gets a fresh ID, not the renamed one's
    assert same.call("PUT", f"{BASE}/{CENTER_ID}", {"name": "old"}).status == 200
    again = create(same, "main")
    assert again != CENTER_ID
    assert same.table("preference_centers").collect().height == 2


def test_names_are_unique(ws):
    first = create(ws, "main")
    second = create(ws, "other")
    r = ws.call("POST", BASE, center_body("main"))
    taken = P.ERR_NAME_TAKEN.format(name="main", center_id=first)
    assert (r.status, r.body) == (400, {"message": taken})
    r = ws.call("PUT", f"{BASE}/{second}", {"name": "main"})
    assert (r.status, r.body) == (400, {"message": taken})
    # keeping its own name is no conflict
    assert ws.call("PUT", f"{BASE}/{first}", {"name": "main"}).status == 200
    assert ws.table("preference_centers").collect().sort("created_seq")["name"].to_list() == ["main", "other"]


# --- validation (one store; nothing is written) -----------------------------------------------


@pytest.fixture(scope="module")
def shared(tmp_path_factory):
    ws = open_ws(tmp_path_factory.mktemp("pc"))
    track_ok(ws, attributes=[{"external_id": "u1", "email": "same@x.com"}])
    create(ws, "main")
    return ws


def link(**fields: Any) -> dict[str, Any]:
    return {"options": {"links-tags": [{"rel": "icon", "href": "/i.png", **fields}]}}


def without(field: str) -> dict[str, Any]:
    body = center_body("new")
    del body[field]
    return body


INVALID_BODIES = [
    (["not", "an", "object"], P.ERR_BODY_NOT_OBJECT),
    ({**center_body("new"), "color": "red"}, P.ERR_UNKNOWN_FIELD.format(field="color")),
    *[(without(f), P.ERR_MISSING_FIELD.format(field=f)) for f in P.TEXT_FIELDS],
    *[({**center_body("new"), f: 5}, P.ERR_TEXT_FIELD.format(field=f)) for f in P.TEXT_FIELDS],
    *[({**center_body("new"), f: "  "}, P.ERR_TEXT_FIELD.format(field=f)) for f in P.TEXT_FIELDS],
    ({**center_body("new"), "state": "archived"}, P.ERR_STATE),
    ({**center_body("new"), "options": []}, P.ERR_OPTIONS),
    ({**center_body("new"), "options": {"theme": "dark"}}, P.ERR_OPTION_KEY.format(key="theme")),
    ({**center_body("new"), "options": {"meta-viewport-content": 1}}, P.ERR_VIEWPORT),
    ({**center_body("new"), "options": {"links-tags": {"rel": "icon"}}}, P.ERR_LINKS),
    ({**center_body("new"), "options": {"links-tags": ["icon"]}}, P.ERR_LINK.format(i=0)),
    ({**center_body("new"), **link(media="x")}, P.ERR_LINK_KEY.format(i=0, key="media")),
    ({**center_body("new"), "options": {"links-tags": [{"href": "/i.png"}]}}, P.ERR_LINK_REL.format(i=0)),
    ({**center_body("new"), **link(rel="stylesheet")}, P.ERR_LINK_REL.format(i=0)),
    ({**center_body("new"), **link(type="text/css")}, P.ERR_LINK_TYPE.format(i=0)),
    ({**center_body("new"), **link(sizes=32)}, P.ERR_LINK_TEXT.format(i=0, key="sizes")),
    ({**center_body("new"), **link(color=None)}, P.ERR_LINK_TEXT.format(i=0, key="color")),
    ({**center_body("new"), "options": {"links-tags": [{"rel": "icon"}]}}, P.ERR_LINK_HREF.format(i=0)),
    ({**center_body("new"), **link(href="")}, P.ERR_LINK_HREF.format(i=0)),
    ({**center_body("new"), "preference_center_page_html": "<p>\n{% if %}</p>"},
     P.ERR_TEMPLATE.format(field="preference_center_page_html", error="missing expression", line=2)),
    ({**center_body("new"), "confirmation_page_html": "{{ x | shout }}"},
     P.ERR_TEMPLATE.format(field="confirmation_page_html", error="unknown filter 'shout'", line=1)),
    ({**center_body("new"), "preference_center_page_html": "{% nosuch %}"},
     P.ERR_TEMPLATE.format(field="preference_center_page_html", error="unexpected tag 'nosuch'", line=1)),
    ({**center_body("new"), "confirmation_page_html": "a\n\n{% include 'x' %}"},
     P.ERR_TEMPLATE.format(field="confirmation_page_html", error=P.ERR_PARTIAL.format(name="x"), line=3)),
    ({**center_body("new"), "preference_center_page_html": "{% form_field_name :group g1 %}"},
     P.ERR_TEMPLATE.format(field="preference_center_page_html", error=P.ERR_FORM_TAG, line=1)),
    ({**center_body("new"), "preference_center_page_html": "{% form_field_name :subscription_group email_global %}"},
     P.ERR_TEMPLATE.format(field="preference_center_page_html", error=P.ERR_FORM_TAG, line=1)),
]


@pytest.mark.parametrize(("body", "message"), INVALID_BODIES)
def test_create_rejects(shared, body, message):
    r = shared.call("POST", BASE, body)
    assert (r.status, r.body) == (400, {"message": message})
    assert shared.table("preference_centers").collect()["name"].to_list() == ["main"]


UPDATE_ONLY_INVALID = [
    (body, message) for body, message in INVALID_BODIES if not message.startswith("missing")
]


@pytest.mark.parametrize(("body", "message"), UPDATE_ONLY_INVALID)
def test_update_rejects(shared, body, message):
    before = shared.call("GET", f"{BASE}/{CENTER_ID}").body
    r = shared.call("PUT", f"{BASE}/{CENTER_ID}", body)
    assert (r.status, r.body) == (400, {"message": message})
    assert shared.call("GET", f"{BASE}/{CENTER_ID}").body == before


@pytest.mark.parametrize(("method", "path", "body"), [
    ("GET", f"{BASE}/nope", None),
    ("PUT", f"{BASE}/nope", {"state": "draft"}),
    ("GET", f"{BASE}/nope/page?external_id=u1", None),
    # a token signed for the unknown center (a bad token is refused first: 403, test_forged_tokens_change_nothing)
    ("POST", f"{BASE}/nope/submit?token={P.sign_token(TEST_LINK_KEY, 'nope', service_id(0), NOW, NOW + P.TOKEN_LIFETIME)}",
     {}),
])
def test_unknown_center_is_404(shared, method, path, body):
    r = shared.call(method, path, body)
    assert (r.status, r.body) == (404, {"message": P.ERR_NOT_FOUND.format(center_id="nope")})


def test_update_with_only_missing_fields_keeps_the_rest(ws):
    center_id = create(ws)
    r = ws.call("PUT", f"{BASE}/{center_id}", {})
    assert r.status == 200
    assert ws.call("GET", f"{BASE}/{center_id}").body["preference_center_page_html"] == PAGE


# --- rendering ----------------------------------------------------------------------------------


def test_render_fills_every_tag(users):
    ws = users
    center_id = create(ws)
    url = expected_url(center_id, service_id(0))
    r = render(ws, center_id, external_id="u1")
    assert (r.status, r.body) == (200, page_for("same@x.com", url))
    track_ok(ws, attributes=[{"external_id": "u1", "email_subscribe": "opted_in", "subscription_groups": [
        {"subscription_group_id": "g1", "subscription_state": "subscribed"},
        {"subscription_group_id": "g2", "subscription_state": "unsubscribed"}]}])
    r = render(ws, center_id, service_id=service_id(0))
    assert r.body == page_for("same@x.com", url, g1="subscribed", email_global="opted_in")
    track_ok(ws, attributes=[{"external_id": "u3", "email_subscribe": "unsubscribed"}])
    assert render(ws, center_id, external_id="u3").body == page_for(
        "three@x.com", expected_url(center_id, service_id(2)), email_global="unsubscribed")


def test_render_a_user_without_email_and_by_deprecated_external_id(ws):
    track_ok(ws, attributes=[{"external_id": "new", "first_name": "N"}])
    center_id = create(ws)

    def add_old_id(ctx):
        changes = Changes()
        changes.upsert("external_ids", pl.DataFrame(
            {"external_id": ["old"], "service_id": [service_id(0)], "primary": [False]}))
        ctx.write(changes)

    ws.write(add_old_id)
    expected = page_for("", expected_url(center_id, service_id(0)))
    assert render(ws, center_id, external_id="new").body == expected
    assert render(ws, center_id, external_id="old").body == expected


def test_render_escapes_user_values(ws):
    track_ok(ws, attributes=[{"external_id": "u1", "email": "<script>alert(1)</script>@x.com"}])
    center_id = create(ws)
    page = render(ws, center_id, external_id="u1").body
    assert "<p>&lt;script&gt;alert(1)&lt;/script&gt;@x.com</p>" in page
    assert "<script>alert" not in page


def test_render_adds_page_metadata_escaped(ws):
    track_ok(ws, attributes=[{"external_id": "u1", "email": "a@x.com"}])
    options = {"meta-viewport-content": 'width="x"',
               "links-tags": [{"rel": "icon", "type": "image/png", "sizes": "16x16", "href": "/a.png?x=1&y=2"}]}
    body = {**center_body(preference_center_title="A & B", options=options),
            "preference_center_page_html": "<p>{{${email_address}}}</p>"}
    center_id = ws.call("POST", BASE, body).body["preference_center_api_id"]
    assert render(ws, center_id, external_id="u1").body == (
        '<title>A &amp; B</title><meta name="viewport" content="width=&#34;x&#34;">'
        '<link rel="icon" type="image/png" sizes="16x16" href="/a.png?x=1&amp;y=2"><p>a@x.com</p>')
    # a page with its own title keeps it
    ws.call("PUT", f"{BASE}/{center_id}", {"preference_center_page_html": "<HEAD><title>Mine</title></HEAD>",
                                            "options": {}})
    assert render(ws, center_id, external_id="u1").body == "<HEAD><title>Mine</title></HEAD>"


@pytest.mark.parametrize(("query", "status", "message"), [
    ({}, 400, P.ERR_USER_QUERY),
    ({"external_id": "u1", "service_id": "x"}, 400, P.ERR_USER_QUERY),
    ({"external_id": "ghost"}, 404, P.ERR_USER_NOT_FOUND.format(kind="external_id", value="ghost")),
    ({"service_id": "ghost"}, 404, P.ERR_USER_NOT_FOUND.format(kind="service_id", value="ghost")),
])
def test_render_user_errors(shared, query, status, message):
    r = render(shared, CENTER_ID, **query)
    assert (r.status, r.body) == (status, {"message": message})


def test_render_error_at_render_time_is_422(ws):
    track_ok(ws, attributes=[{"external_id": "u1", "subscription_groups": [
        {"subscription_group_id": "g1", "subscription_state": "subscribed"}]}])
    # the check at save time renders for a user without data, who never reaches the branch
    page = '{% if {{subscribed_state.${g1}}} == "subscribed" %}{{ 1 | divided_by: 0 }}{% endif %}ok'
    center_id = ws.call("POST", BASE, {**center_body(), "preference_center_page_html": page}).body[
        "preference_center_api_id"]
    track_ok(ws, attributes=[{"external_id": "u2"}])
    assert render(ws, center_id, external_id="u2").body == HEAD + "ok"
    r = render(ws, center_id, external_id="u1")
    assert (r.status, r.body) == (422, {"message": P.ERR_RENDER.format(center_id=center_id, error="divided_by: can't divide by 0")})


# --- submit -------------------------------------------------------------------------------------


def test_round_trip_create_render_submit_export(users):
    ws = users
    center_id = create(ws)
    url = submit_url_of(render(ws, center_id, external_id="u3").body)
    r = ws.call("POST", url, {"subscription_group:g1": "subscribed", "subscription_group:g2": "unsubscribed",
                              "email_global_state": "opted_in"})
    assert (r.status, r.body) == (200, HEAD + "<p>Saved for three@x.com: opted_in, g1=subscribed</p>")
    assert email_subscribe(ws, "u3") == "opted_in"
    assert group_states(ws, "g1") == {service_id(2): "subscribed"}
    assert group_states(ws, "g2") == {service_id(2): "unsubscribed"}
    # the page now shows the new states; a second submit changes them again
    assert render(ws, center_id, external_id="u3").body == page_for(
        "three@x.com", url, g1="subscribed", email_global="opted_in")
    r = ws.call("POST", url, {"email_global_state": "unsubscribed"})
    assert r.status == 200
    assert email_subscribe(ws, "u3") == "unsubscribed"
    assert group_states(ws, "g1") == {service_id(2): "subscribed"}
    log = ws.table("preference_center_submits").collect()
    assert log.select("center_id", "service_id", "fields").rows() == [
        (center_id, service_id(2),
         '{"subscription_group:g1":"subscribed","subscription_group:g2":"unsubscribed","email_global_state":"opted_in"}'),
        (center_id, service_id(2), '{"email_global_state":"unsubscribed"}'),
    ]
    assert log["token_expires_at"].to_list() == [NOW + P.TOKEN_LIFETIME] * 2


def test_submit_propagates_to_profiles_with_the_same_email(users):
    ws = users
    center_id = create(ws)
    url = submit_url_of(render(ws, center_id, external_id="u1").body)
    r = ws.call("POST", url, {"subscription_group:g1": "subscribed", "email_global_state": "unsubscribed"})
    assert r.status == 200
    assert [email_subscribe(ws, u) for u in ("u1", "u2", "u3")] == ["unsubscribed", "unsubscribed", None]
    assert group_states(ws, "g1") == {service_id(0): "subscribed", service_id(1): "subscribed"}


def test_submit_for_a_user_without_external_id_goes_by_service_id(users):
    ws = users
    track_ok(ws, attributes=[{"email": "same@x.com"}])  # matches u1/u2: no new profile
    track_ok(ws, attributes=[{"email": "solo@x.com"}])  # email-only profile, sid 3
    center_id = create(ws)
    url = submit_url_of(render(ws, center_id, service_id=service_id(3)).body)
    assert url == expected_url(center_id, service_id(3))
    assert ws.call("POST", url, {"email_global_state": "opted_in"}).status == 200
    states = dict(ws.table("profiles").collect().select("service_id", "email_subscribe").rows())
    assert states == {service_id(0): None, service_id(1): None, service_id(2): None, service_id(3): "opted_in"}


def test_empty_submit_changes_nothing_and_confirms(users):
    ws = users
    center_id = create(ws)
    before = snapshot(ws)
    r = ws.call("POST", expected_url(center_id, service_id(0)), {})
    assert (r.status, r.body) == (200, HEAD + "<p>Saved for same@x.com: subscribed, g1=unsubscribed</p>")
    assert_unchanged(ws, before)


def forged_tokens(center_id: str) -> list[str]:
    good = token_of(expected_url(center_id, service_id(0)))
    payload, signature = good.split(".")
    key, issued, expires = TEST_LINK_KEY.id, millis(NOW), int((NOW + P.TOKEN_LIFETIME).timestamp())
    other_user = b64(f"{key}|{center_id}|{service_id(2)}|{issued}|{expires}".encode())
    later = b64(f"{key}|{center_id}|{service_id(0)}|{issued}|{expires * 10}".encode())
    another_secret = LinkKey(TEST_LINK_KEY.id, bytes(32), NOW)
    unknown_key = LinkKey("nokey000", TEST_LINK_KEY.secret, NOW)
    return [
        "", "abc", "a.b.c", "!!!.???", payload + "." + signature[:-2] + "AA",
        other_user + "." + signature,  # replay the signature for another user
        later + "." + signature,  # stretch the expiry
        P.sign_token(another_secret, center_id, service_id(0), NOW, NOW + P.TOKEN_LIFETIME),
        P.sign_token(unknown_key, center_id, service_id(0), NOW, NOW + P.TOKEN_LIFETIME),
        b64(b"\xff|a|b|1|2") + "." + signature,  # not text
    ]


def test_forged_tokens_change_nothing(users):
    ws = users
    center_id = create(ws)
    before = snapshot(ws)
    for token in forged_tokens(center_id):
        r = ws.call("POST", f"{BASE}/{center_id}/submit", {"email_global_state": "unsubscribed"}, {"token": token})
        assert (r.status, r.body) == (403, {"message": P.ERR_TOKEN}), token
    r = ws.call("POST", f"{BASE}/{center_id}/submit", {"email_global_state": "unsubscribed"})
    assert (r.status, r.body) == (403, {"message": P.ERR_TOKEN})
    # the token is checked before the center: an unknown center's submit with a bad token is 403 too
    r = ws.call("POST", f"{BASE}/nope/submit", {"email_global_state": "unsubscribed"}, {"token": "forged"})
    assert (r.status, r.body) == (403, {"message": P.ERR_TOKEN})
    assert_unchanged(ws, before)


def test_a_token_works_only_for_its_user_and_center(users):
    ws = users
    first = create(ws, "first")
    second = create(ws, "second")
    token = token_of(submit_url_of(render(ws, first, external_id="u3").body))
    before = snapshot(ws)
    r = ws.call("POST", with_token(second, token), {"email_global_state": "unsubscribed"})
    assert (r.status, r.body) == (403, {"message": P.ERR_TOKEN_CENTER})
    assert_unchanged(ws, before)
    # whoever holds u3's link changes u3 only, whatever else the request names
    r = ws.call("POST", with_token(first, token) + "&external_id=u1", {"email_global_state": "unsubscribed"})
    assert r.status == 200
    assert [email_subscribe(ws, u) for u in ("u1", "u2", "u3")] == [None, None, "unsubscribed"]


def test_tokens_expire_after_seven_days(tmp_path):
    clock = Clock()
    ws = open_ws(tmp_path, clock=clock)
    track_ok(ws, attributes=[{"external_id": "u1", "email": "a@x.com"}])
    center_id = create(ws)
    url = submit_url_of(render(ws, center_id, external_id="u1").body)
    clock.advance(days=7)
    before = snapshot(ws)
    r = ws.call("POST", url, {"email_global_state": "unsubscribed"})
    expires = ts(NOW + P.TOKEN_LIFETIME)
    assert (r.status, r.body) == (403, {"message": P.ERR_TOKEN_EXPIRED.format(expires=expires)})
    assert_unchanged(ws, before)
    clock.advance(seconds=-1)
    assert ws.call("POST", url, {"email_global_state": "unsubscribed"}).status == 200
    assert email_subscribe(ws, "u1") == "unsubscribed"
    # a page rendered now carries a new link, valid for seven days from now
    fresh = submit_url_of(render(ws, center_id, external_id="u1").body)
    assert fresh == expected_url(center_id, service_id(0), clock.now)


@pytest.mark.parametrize(("fields", "message"), [
    (["email_global_state"], P.ERR_FORM_NOT_OBJECT),
    ({"subscription_group:g9": "subscribed"}, P.ERR_FORM_FIELD.format(
        field="subscription_group:g9", declared="subscription_group:g1, email_global_state, subscription_group:g2")),
    ({"subscription_group:g1": "opted_in"}, P.ERR_FORM_GROUP_VALUE.format(field="subscription_group:g1")),
    ({"email_global_state": "yes"}, P.ERR_FORM_GLOBAL_VALUE.format(field="email_global_state")),
    ({"subscription_group:g1": "subscribed", "email_global_state": None},
     P.ERR_FORM_GLOBAL_VALUE.format(field="email_global_state")),
])
def test_invalid_forms_change_nothing(shared, fields, message):
    ws = shared
    before = snapshot(ws)
    r = ws.call("POST", expected_url(CENTER_ID, service_id(0)), fields)
    assert (r.status, r.body) == (400, {"message": message})
    assert_unchanged(ws, before)


def test_draft_centers_render_but_refuse_submits(users):
    ws = users
    center_id = create(ws, state="draft")
    url = submit_url_of(render(ws, center_id, external_id="u1").body)
    before = snapshot(ws)
    r = ws.call("POST", url, {"email_global_state": "unsubscribed"})
    assert (r.status, r.body) == (409, {"message": P.ERR_DRAFT.format(center_id=center_id)})
    assert_unchanged(ws, before)
    ws.call("PUT", f"{BASE}/{center_id}", {"state": "active"})
    assert ws.call("POST", url, {"email_global_state": "unsubscribed"}).status == 200


def test_submit_for_a_deleted_user_is_404(users):
    ws = users
    center_id = create(ws)
    url = expected_url(center_id, service_id(2))
    assert ws.call("POST", "/users/delete", {"external_ids": ["u3"]}).body == {"deleted": 1, "message": "success"}
    before = snapshot(ws)
    r = ws.call("POST", url, {"email_global_state": "unsubscribed"})
    assert (r.status, r.body) == (404, {"message": P.ERR_TOKEN_USER_GONE})
    assert_unchanged(ws, before)


def test_submit_for_a_user_merged_away_updates_the_surviving_profile(users):
    """The page was rendered for u3, then u3 was merged into u1: the submit changes u1 (and, by
    same-email propagation, u2), as the user's data now lives there."""
    ws = users
    center_id = create(ws)
    url = submit_url_of(render(ws, center_id, external_id="u3").body)
    merge = {"merge_updates": [{"identifier_to_merge": {"external_id": "u3"},
                                "identifier_to_keep": {"external_id": "u1"}}]}
    assert ws.call("POST", "/users/merge", merge).status == 202
    r = ws.call("POST", url, {"email_global_state": "unsubscribed"})
    assert r.status == 200
    states = ws.call("POST", "/users/export/ids", {"external_ids": ["u1", "u2", "u3"],
                                                   "fields_to_export": ["external_id", "email_subscribe"]}).body
    assert states["users"] == [{"external_id": "u1", "email_subscribe": "unsubscribed"},
                               {"external_id": "u2", "email_subscribe": "unsubscribed"}]
    assert states["invalid_user_ids"] == ["u3"]


# --- batches, reopening, the library ----------------------------------------------------------


def requests_of_a_session(center_id: str) -> list[dict[str, Any]]:
    url = expected_url(center_id, service_id(0))
    return [
        {"method": "POST", "path": "/users/track", "body": {"attributes": [
            {"external_id": "u1", "email": "same@x.com"}, {"external_id": "u2", "email": "same@x.com"}]}},
        {"method": "POST", "path": BASE, "body": center_body()},
        {"method": "POST", "path": BASE, "body": center_body()},  # name taken
        {"method": "GET", "path": f"{BASE}/{center_id}/page", "query": {"external_id": "u1"}},
        {"method": "POST", "path": url, "body": {"subscription_group:g1": "subscribed", "email_global_state": "opted_in"}},
        {"method": "POST", "path": "/users/export/ids",
         "body": {"external_ids": ["u1", "u2"], "fields_to_export": ["external_id", "email_subscribe"]}},
        {"method": "PUT", "path": f"{BASE}/{center_id}", "body": {"state": "draft"}},
        {"method": "POST", "path": url, "body": {"email_global_state": "unsubscribed"}},
        {"method": "GET", "path": f"{BASE}/list"},
    ]


def test_apply_equals_call(tmp_path):
    batch, single = open_ws(tmp_path, "batch"), open_ws(tmp_path, "single")
    requests = requests_of_a_session(CENTER_ID)
    applied = batch.apply(requests)
    called = [single.call(r["method"], r["path"], r.get("body"), r.get("query")) for r in requests]
    assert applied == called
    assert [r.status for r in applied] == [201, 200, 400, 200, 200, 200, 200, 409, 200]
    assert applied[5].body["users"] == [{"external_id": "u1", "email_subscribe": "opted_in"},
                                        {"external_id": "u2", "email_subscribe": "opted_in"}]
    for name in ("profiles", "subscriptions", "preference_centers", "preference_center_submits"):
        # row order inside a table is the engine's business; the rows must be equal
        assert_frame_equal(batch.table(name).collect(), single.table(name).collect(), check_row_order=False)


def test_reopen_sees_centers_and_submits(tmp_path):
    ws = open_ws(tmp_path)
    ws.apply(requests_of_a_session(CENTER_ID))
    got = ws.call("GET", f"{BASE}/{CENTER_ID}").body
    again = Workspace.open(tmp_path / "store", clock=lambda: NOW)
    assert again.call("GET", f"{BASE}/{CENTER_ID}").body == got
    assert again.table("preference_center_submits").collect().height == 1
    assert render(again, CENTER_ID, external_id="u2").body == page_for(
        "same@x.com", expected_url(CENTER_ID, service_id(1)), g1="subscribed", email_global="opted_in")


def test_library_methods(users):
    centers = users.preference_centers
    made = centers.create("main", "Email preferences", PAGE, CONFIRM)
    assert made["preference_center_api_id"] == CENTER_ID
    assert centers.update(CENTER_ID, preference_center_title="New")["updated_at"] == ts(NOW)
    assert centers.get(CENTER_ID)["preference_center_title"] == "New"
    assert [c["name"] for c in centers.list_all()] == ["main"]
    page = centers.render(CENTER_ID, "u3")
    assert page == centers.render(CENTER_ID, service_id(2))
    confirmation = centers.submit(submit_url_of(page), {"email_global_state": "opted_in"})
    assert confirmation == "<title>New</title><p>Saved for three@x.com: opted_in, g1=unsubscribed</p>"
    with pytest.raises(P.PreferenceCenterError) as caught:
        centers.create("main", "t", "p", "c")
    assert (caught.value.status, caught.value.body) == (
        400, {"message": P.ERR_NAME_TAKEN.format(name="main", center_id=CENTER_ID)})
    with pytest.raises(P.PreferenceCenterError) as caught:
        centers.render(CENTER_ID, "ghost")
    assert caught.value.status == 404
